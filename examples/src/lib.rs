//! Runnable Tessera examples; see `examples/` and the README.
