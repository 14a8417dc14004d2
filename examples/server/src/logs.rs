//! Log lines on standard error: the store's spans and events and one
//! access line per request, filtered by `RUST_LOG` (default `info`), as
//! text or as one JSON object a line.

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum LogFormat {
    /// Human-readable text (the default).
    #[default]
    Text,
    /// One JSON object a line, for a log pipeline.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!("a log format is text or json, not {other:?}")),
        }
    }
}

/// Installs the subscriber for the process (once; a second call does
/// nothing). `RUST_LOG` filters by target and level, as `env_logger`
/// reads it; without it, `info` and above.
pub(crate) fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
