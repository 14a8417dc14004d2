//! Runnable Tessera examples; see `examples/` and the README.
//!
//! What the example programs share: their admission settings come from
//! the `TESSERA_CLAIM_*` environment variables.
//!
//! ```
//! // Unset variables keep the defaults.
//! let config = tessera_examples::admission_from_env("example");
//! assert!(config.validate().is_ok());
//! ```

use tessera_admission::AdmissionConfig;

/// The admission settings from the `TESSERA_CLAIM_*` environment variables
/// ([`AdmissionConfig::from_env`]). An invalid value stops the program: its
/// message, naming the variable, goes to stderr after `program`, and the
/// exit status is 2.
pub fn admission_from_env(program: &str) -> AdmissionConfig {
    AdmissionConfig::from_env().unwrap_or_else(|error| {
        eprintln!("{program}: {error}");
        std::process::exit(2)
    })
}
