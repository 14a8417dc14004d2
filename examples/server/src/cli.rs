//! The command line.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use tessera_store::Namespace;

/// What the command line asks for.
#[derive(Debug, Clone)]
pub(crate) struct Args {
    pub(crate) port: u16,
    pub(crate) bind: IpAddr,
    pub(crate) db: PathBuf,
    /// A PostgreSQL URL; the SQLite file is used without one.
    pub(crate) postgres: Option<String>,
    /// The PostgreSQL schema the store's tables are in.
    pub(crate) schema: Option<String>,
    /// Namespaces whose health anyone may read.
    pub(crate) public: Vec<Namespace>,
    /// The rows-written allowance a day; unlimited without it.
    pub(crate) daily_rows: Option<u64>,
    /// The SQLite file's cap in pages; past it writes are `503`.
    pub(crate) page_cap: Option<u64>,
    /// Where the admin key is kept.
    pub(crate) admin_key_file: PathBuf,
    /// Make another admin key even if the file's still works.
    pub(crate) new_admin_key: bool,
    /// The longest a long-poll waits here.
    pub(crate) max_long_poll: Duration,
    /// Whether this process runs no scheduler of its own.
    pub(crate) no_scheduler: bool,
    /// The longest a client may take over a request's headers, or a
    /// kept-alive connection may sit idle.
    pub(crate) header_timeout: Duration,
    /// The longest a client may take over a request's body.
    pub(crate) body_timeout: Duration,
    /// How log lines are written.
    pub(crate) log_format: crate::logs::LogFormat,
    /// Whether anonymous sessions are off.
    pub(crate) no_sessions: bool,
}

/// The program's name in its messages.
pub(crate) const PROGRAM: &str = "tessera-server";

pub(crate) const USAGE: &str = "\
usage: tessera-server [OPTIONS]

  --port PORT            the port to listen on (default 8080; 0 picks a free one)
  --bind ADDRESS         the address to listen on (default 127.0.0.1)
  --db PATH              the SQLite file (default tessera.db)
  --postgres URL         serve from PostgreSQL instead ($TESSERA_POSTGRES_URL by default)
  --schema NAME          the PostgreSQL schema of the store's tables
  --public NAMESPACE     a namespace whose health anyone may read (repeatable)
  --daily-rows N         refuse writes (503) past N rows written a day
  --page-cap N           refuse writes (503) past N pages of the SQLite file
  --admin-key-file F     where the admin key is kept (default tessera-admin.key):
                         made and printed once, then kept while it works
  --new-admin-key        make and print another admin key (the file gets it)
  --long-poll-max SECS   the longest a long-poll waits here (default 30)
  --header-timeout SECS  the longest a client may take to send a request's headers,
                         and a kept-alive connection may sit idle (default 10)
  --body-timeout SECS    the longest a client may take to send a request's body
                         (default 30; past it 408 request_timeout)
  --log-format FORMAT    text (default) or json: one JSON object a line
                         ($TESSERA_LOG_FORMAT); RUST_LOG filters (default info)
  --no-scheduler         run no scheduler here: periodic schedules fire only from
                         other processes' schedulers or POST /v1/schedules/fire
  --no-sessions          mint no anonymous sessions (POST /v1/sessions is 404)
  --help                 this text

Admission settings come from TESSERA_CLAIM_* (see AdmissionConfig::from_env).
SIGTERM or Ctrl-C shuts down gracefully and exits 0.";

/// What the command line asks for; `Ok(None)` for `--help`.
pub(crate) fn parse_args(words: impl IntoIterator<Item = String>) -> Result<Option<Args>, String> {
    let mut args = Args {
        port: 8080,
        bind: Ipv4Addr::LOCALHOST.into(),
        db: PathBuf::from("tessera.db"),
        postgres: std::env::var("TESSERA_POSTGRES_URL").ok(),
        schema: None,
        public: Vec::new(),
        daily_rows: None,
        page_cap: None,
        admin_key_file: PathBuf::from("tessera-admin.key"),
        new_admin_key: false,
        max_long_poll: Duration::from_secs(30),
        no_scheduler: false,
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(30),
        log_format: match std::env::var("TESSERA_LOG_FORMAT") {
            Ok(text) => text.parse()?,
            Err(_) => crate::logs::LogFormat::Text,
        },
        no_sessions: false,
    };
    let mut words = words.into_iter();
    while let Some(word) = words.next() {
        let mut value = || words.next().ok_or(format!("{word} needs a value"));
        match word.as_str() {
            "--help" | "-h" => return Ok(None),
            "--port" => args.port = number(&word, &value()?)?,
            "--bind" => {
                let text = value()?;
                args.bind = text
                    .parse()
                    .map_err(|_| format!("--bind: {text:?} is not an address"))?;
            }
            "--db" => args.db = PathBuf::from(value()?),
            "--postgres" => args.postgres = Some(value()?),
            "--schema" => args.schema = Some(value()?),
            "--public" => {
                let text = value()?;
                args.public.push(
                    Namespace::parse(&text)
                        .map_err(|error| format!("--public {text:?}: {error}"))?,
                );
            }
            "--daily-rows" => args.daily_rows = Some(number(&word, &value()?)?),
            "--page-cap" => args.page_cap = Some(number(&word, &value()?)?),
            "--admin-key-file" => args.admin_key_file = PathBuf::from(value()?),
            "--new-admin-key" => args.new_admin_key = true,
            "--no-scheduler" => args.no_scheduler = true,
            "--no-sessions" => args.no_sessions = true,
            "--log-format" => args.log_format = value()?.parse()?,
            "--header-timeout" => {
                args.header_timeout = Duration::from_secs(positive(&word, &value()?)?);
            }
            "--body-timeout" => {
                args.body_timeout = Duration::from_secs(positive(&word, &value()?)?);
            }
            "--long-poll-max" => {
                let seconds: u64 = number(&word, &value()?)?;
                args.max_long_poll =
                    Duration::from_secs(seconds).min(tessera_store::limits::MAX_LONG_POLL);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(args))
}

/// A whole number of seconds, at least 1.
fn positive(flag: &str, text: &str) -> Result<u64, String> {
    match number::<u64>(flag, text)? {
        0 => Err(format!("{flag}: at least 1 second")),
        seconds => Ok(seconds),
    }
}

fn number<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{flag}: {text:?} is not a number in range"))
}
