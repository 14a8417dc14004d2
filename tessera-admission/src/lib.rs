//! Sans-IO claim admission for Tessera.
