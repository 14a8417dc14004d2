//! The command line: every flag also from an environment variable, in
//! the usual conventions (`--port=8080` or `--port 8080`, `--help`,
//! `--version`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use tessera_store::Namespace;

use crate::logs::LogFormat;

/// The program's name in its messages.
pub(crate) const PROGRAM: &str = "tessera-server";

/// Tessera over HTTP: every store operation a route, with its OpenAPI
/// document, MCP at /mcp and a board at /board.
#[derive(Debug, Clone, Parser)]
#[command(
    name = PROGRAM,
    version,
    after_help = "Admission settings come from TESSERA_CLAIM_* (see AdmissionConfig::from_env). \
                  SIGTERM or Ctrl-C shuts down gracefully and exits 0."
)]
pub(crate) struct Args {
    /// The port to listen on (0 picks a free one).
    #[arg(long, env = "TESSERA_PORT", default_value_t = 8080)]
    pub(crate) port: u16,
    /// The address or host name to listen on.
    #[arg(long, env = "TESSERA_BIND", default_value = "127.0.0.1")]
    pub(crate) bind: String,
    /// The SQLite file.
    #[arg(long, env = "TESSERA_DB", default_value = "tessera.db")]
    pub(crate) db: PathBuf,
    /// Serve from PostgreSQL instead (a URL or key=value words).
    #[arg(long, env = "TESSERA_POSTGRES_URL", hide_env_values = true)]
    pub(crate) postgres: Option<String>,
    /// A file holding the PostgreSQL password, so it shows neither in the
    /// URL nor in `ps`.
    #[arg(long, env = "TESSERA_POSTGRES_PASSWORD_FILE")]
    pub(crate) postgres_password_file: Option<PathBuf>,
    /// The PostgreSQL schema of the store's tables.
    #[arg(long, env = "TESSERA_SCHEMA")]
    pub(crate) schema: Option<String>,
    /// A namespace whose health anyone may read (repeatable; comma-separated
    /// in the environment).
    #[arg(long, env = "TESSERA_PUBLIC", value_delimiter = ',', value_parser = namespace)]
    pub(crate) public: Vec<Namespace>,
    /// Refuse writes (503) past N rows written a day.
    #[arg(long, env = "TESSERA_DAILY_ROWS")]
    pub(crate) daily_rows: Option<u64>,
    /// Refuse writes (503) past N pages of the SQLite file.
    #[arg(long, env = "TESSERA_PAGE_CAP")]
    pub(crate) page_cap: Option<u64>,
    /// Where the admin key is kept: made and printed once, then kept while
    /// it works.
    #[arg(
        long,
        env = "TESSERA_ADMIN_KEY_FILE",
        default_value = "tessera-admin.key"
    )]
    pub(crate) admin_key_file: PathBuf,
    /// Make and print another admin key, and revoke the one the file held.
    #[arg(long, env = "TESSERA_NEW_ADMIN_KEY")]
    pub(crate) new_admin_key: bool,
    /// The longest a long-poll waits here, in seconds (at most the store's
    /// limit).
    #[arg(long = "long-poll-max", env = "TESSERA_LONG_POLL_MAX", value_name = "SECS",
          default_value = "30", value_parser = long_poll)]
    pub(crate) max_long_poll: Duration,
    /// Run no scheduler here: periodic schedules fire only from other
    /// processes' schedulers or POST /v1/schedules/fire.
    #[arg(long, env = "TESSERA_NO_SCHEDULER")]
    pub(crate) no_scheduler: bool,
    /// The longest a client may take to send a request's headers, and a
    /// kept-alive connection may sit idle, in seconds.
    #[arg(long, env = "TESSERA_HEADER_TIMEOUT", value_name = "SECS", default_value = "10",
          value_parser = seconds)]
    pub(crate) header_timeout: Duration,
    /// The longest a client may take to send a request's body, in seconds
    /// (past it: 408 request_timeout).
    #[arg(long, env = "TESSERA_BODY_TIMEOUT", value_name = "SECS", default_value = "30",
          value_parser = seconds)]
    pub(crate) body_timeout: Duration,
    /// Log lines as text, or one JSON object a line; RUST_LOG filters them
    /// (default info).
    #[arg(long, env = "TESSERA_LOG_FORMAT", default_value = "text", value_parser = log_format)]
    pub(crate) log_format: LogFormat,
    /// Mint no anonymous sessions (POST /v1/sessions is 404).
    #[arg(long, env = "TESSERA_NO_SESSIONS")]
    pub(crate) no_sessions: bool,
    /// A browser origin (scheme://host[:port]) that may call /mcp besides
    /// the loopback ones; repeat it for several (the environment variable
    /// takes them comma-separated).
    #[arg(long, env = "TESSERA_ALLOWED_ORIGINS", value_name = "ORIGIN",
          value_delimiter = ',', value_parser = origin)]
    pub(crate) allowed_origin: Vec<String>,
}

/// An origin as a browser sends it: `http` or `https`, a host, perhaps a
/// port, and nothing else; kept in lower case.
fn origin(text: &str) -> Result<String, String> {
    let lower = text.trim_end_matches('/').to_ascii_lowercase();
    let authority = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"))
        .ok_or("an origin starts with http:// or https://")?;
    if authority.is_empty()
        || authority
            .chars()
            .any(|c| !(c.is_ascii_alphanumeric() || "-.:[]".contains(c)))
    {
        return Err(format!("{text:?} is not scheme://host[:port]"));
    }
    Ok(lower)
}

impl Args {
    /// The address to listen on: `--bind` resolved (a host name too) with
    /// `--port`.
    pub(crate) fn address(&self) -> Result<SocketAddr, String> {
        use std::net::ToSocketAddrs;
        (self.bind.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|error| format!("--bind {:?}: {error}", self.bind))?
            .next()
            .ok_or_else(|| format!("--bind {:?}: no address", self.bind))
    }

    /// The PostgreSQL connection string, with the password from
    /// `--postgres-password-file` if one is given.
    pub(crate) fn postgres_url(&self) -> Result<Option<String>, String> {
        let Some(url) = &self.postgres else {
            return Ok(None);
        };
        let Some(file) = &self.postgres_password_file else {
            return Ok(Some(url.clone()));
        };
        let password = std::fs::read_to_string(file)
            .map_err(|error| format!("--postgres-password-file {}: {error}", file.display()))?;
        let password = password.trim_end_matches(['\n', '\r']);
        Ok(Some(with_password(url, password)))
    }
}

/// `url` with `password`: a URL gets it in its authority (encoded), a
/// `key=value` string a `password=` word.
fn with_password(url: &str, password: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let encoded: String = password
            .bytes()
            .map(|byte| match byte {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    char::from(byte).to_string()
                }
                _ => format!("%{byte:02X}"),
            })
            .collect();
        let (authority, tail) = match rest.find(['/', '?']) {
            Some(end) => rest.split_at(end),
            None => (rest, ""),
        };
        let (user, host) = match authority.rsplit_once('@') {
            Some((user, host)) => (user.split(':').next().unwrap_or_default(), host),
            None => ("", authority),
        };
        return format!("{scheme}://{user}:{encoded}@{host}{tail}");
    }
    let quoted = password.replace('\\', "\\\\").replace('\'', "\\'");
    format!("{url} password='{quoted}'")
}

fn namespace(text: &str) -> Result<Namespace, String> {
    Namespace::parse(text).map_err(|error| error.to_string())
}

fn seconds(text: &str) -> Result<Duration, String> {
    match text.parse::<u64>() {
        Ok(0) => Err("at least 1 second".to_owned()),
        Ok(seconds) => Ok(Duration::from_secs(seconds)),
        Err(_) => Err(format!("{text:?} is not a whole number of seconds")),
    }
}

fn long_poll(text: &str) -> Result<Duration, String> {
    let seconds: u64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number of seconds"))?;
    Ok(Duration::from_secs(seconds).min(tessera_store::limits::MAX_LONG_POLL))
}

fn log_format(text: &str) -> Result<LogFormat, String> {
    text.parse()
}

#[cfg(test)]
mod tests {
    use super::{Args, with_password};
    use clap::Parser;

    #[test]
    fn flags_take_the_usual_forms() {
        let args =
            Args::try_parse_from(["tessera-server", "--port=9090", "--bind", "localhost"]).unwrap();
        assert_eq!(args.port, 9090);
        assert!(args.address().unwrap().ip().is_loopback());
        let args = Args::try_parse_from(["tessera-server", "--public", "a", "--public=b"]).unwrap();
        assert_eq!(args.public.len(), 2);
        assert!(Args::try_parse_from(["tessera-server", "--port", "many"]).is_err());
        assert!(Args::try_parse_from(["tessera-server", "--header-timeout", "0"]).is_err());
    }

    #[test]
    fn a_password_from_a_file_joins_the_url() {
        assert_eq!(
            with_password("postgres://u@h:5432/d?sslmode=require", "p@ss word"),
            "postgres://u:p%40ss%20word@h:5432/d?sslmode=require"
        );
        assert_eq!(
            with_password("postgres://u:old@h/d", "new"),
            "postgres://u:new@h/d"
        );
        assert_eq!(
            with_password("host=h user=u", "it's"),
            "host=h user=u password='it\\'s'"
        );
    }
}
