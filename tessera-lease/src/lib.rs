//! Sans-IO lease rules for Tessera.
