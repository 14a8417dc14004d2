//! Sans-IO audit rules for Tessera.
