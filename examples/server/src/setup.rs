//! Start-up and shut-down: the store opened off the runtime, the admin
//! key, the start-up line, the maintenance timer, the signals, and the
//! store closed off the runtime again.

use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tessera_store::postgres::PostgresOptions;
use tessera_store::sqlite::SqliteOptions;
use tessera_store::{AdmissionConfig, IssuedKey, Store, StoreConfig};
use tokio::net::TcpListener;

use crate::cli::{Args, PROGRAM};
use crate::routes::{ServeOptions, serve_until};

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The program: parses the command line, serves until SIGTERM or SIGINT,
/// and exits 0 after a graceful shutdown (2 for a bad command line or
/// setting, 1 when the server cannot start or fails).
pub fn main() -> ExitCode {
    let args = match <Args as clap::Parser>::try_parse() {
        Ok(args) => args,
        Err(error) => {
            // `--help` and `--version` print and exit 0; a bad command
            // line prints what was wrong and exits 2.
            let _ = error.print();
            return match error.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(2),
            };
        }
    };
    let address = match args.address() {
        Ok(address) => address,
        Err(problem) => {
            eprintln!("{PROGRAM}: {problem}");
            return ExitCode::from(2);
        }
    };
    let admission = match AdmissionConfig::from_env() {
        Ok(config) => config,
        Err(problem) => {
            eprintln!("{PROGRAM}: {problem}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(problem) => {
            eprintln!("{PROGRAM}: {problem}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(args, address, admission));
    // A long-poll the shutdown answered may still hold a blocking thread
    // until its timeout; its store handle is dropped there, off the
    // runtime's workers.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("{PROGRAM}: {problem}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args, address: SocketAddr, admission: AdmissionConfig) -> Result<(), Failure> {
    crate::logs::init(args.log_format);
    crate::metrics::prometheus();
    let options = ServeOptions {
        max_long_poll: args.max_long_poll,
        public: crate::routes::PublicOptions::new(args.public.clone(), admission.max_pending),
        header_timeout: args.header_timeout,
        body_timeout: args.body_timeout,
        sessions: !args.no_sessions,
        allowed_origins: args.allowed_origin.clone(),
    };
    // Opening and key making are blocking store calls: off the runtime's
    // threads, as every store call is.
    let opened = {
        let args = args.clone();
        tokio::task::spawn_blocking(move || open(&args, admission)).await??
    };
    let Opened {
        store,
        database,
        admin,
    } = opened;
    let listener = match TcpListener::bind(address).await {
        Ok(listener) => listener,
        Err(problem) => {
            close(store).await;
            return Err(format!("{address}: {problem}").into());
        }
    };
    let address = listener.local_addr()?;
    let shutdown = shutdown_signal()?;
    println!("{PROGRAM} listening on http://{address}, {database}");
    let key_file = args.admin_key_file.display();
    match admin {
        Some(key) => println!("admin key: {} (kept in {key_file})", key.secret.expose()),
        None => println!("admin key: kept in {key_file}"),
    }
    let maintenance = tokio::spawn(maintain(Arc::clone(&store)));
    // Periodic schedules fire from every server that runs a scheduler;
    // each run-at fires once however many do.
    let scheduler = (!args.no_scheduler).then(|| store.run_scheduler(SCHEDULER_RECHECK));
    let served = serve_until(listener, Arc::clone(&store), options, shutdown).await;
    maintenance.abort();
    let _ = maintenance.await;
    // Stopping it waits for its pass to end: off the runtime's threads.
    let _ = tokio::task::spawn_blocking(move || drop(scheduler)).await;
    close(store).await;
    served?;
    println!("shut down");
    Ok(())
}

/// The longest the scheduler sleeps before it reads the schedules again
/// (schedules put through other servers are seen at the latest then).
const SCHEDULER_RECHECK: Duration = Duration::from_secs(15);

/// Drops the store on a blocking thread: the PostgreSQL pool's clients
/// block on a runtime of their own when they close, which may not start
/// on the runtime's workers.
async fn close(store: Arc<Store>) {
    let _ = tokio::task::spawn_blocking(move || drop(store)).await;
}

/// Runs the store's maintenance (counters whose minute has passed,
/// retention) once a minute, so it happens even when no write does.
async fn maintain(store: Arc<Store>) {
    let mut timer = tokio::time::interval(Duration::from_secs(60));
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        timer.tick().await;
        let store = Arc::clone(&store);
        match tokio::task::spawn_blocking(move || store.maintain()).await {
            Ok(Ok(_)) => {}
            Ok(Err(problem)) => tracing::warn!(%problem, "maintenance failed"),
            Err(_) => return,
        }
    }
}

/// Installs the SIGTERM and SIGINT (Ctrl-C) handlers now, so a signal
/// that comes as soon as the start-up line is out is not the default
/// kill; the future resolves on either.
fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// The store, what its database is for the start-up line, and the admin
/// key if it was made now (to print once).
struct Opened {
    store: Arc<Store>,
    database: String,
    admin: Option<IssuedKey>,
}

fn open(args: &Args, admission: AdmissionConfig) -> Result<Opened, Failure> {
    let config = StoreConfig::default().with_admission(admission);
    let config = (args.public.iter().cloned()).fold(config, StoreConfig::with_public_namespace);
    let config = match args.daily_rows {
        Some(rows) => config.with_daily_rows_written_allowance(rows),
        None => config,
    };
    let (store, database) = match &args.postgres_url()? {
        Some(url) => {
            let mut options = PostgresOptions::new(url.as_str());
            let mut database = format!("PostgreSQL {}", without_password(url));
            if let Some(schema) = &args.schema {
                options = options.with_schema(schema.as_str());
                database.push_str(&format!(", schema {schema}"));
            }
            let store = Store::open_postgres(options, config)
                .map_err(|error| format!("cannot open {database}: {}", with_causes(&error)))?;
            (store, database)
        }
        None => {
            let mut options = SqliteOptions::file(&args.db);
            if let Some(pages) = args.page_cap {
                options = options.with_max_page_count(pages);
            }
            let database = format!("SQLite {}", args.db.display());
            let store = Store::open_sqlite(options, config)
                .map_err(|error| format!("cannot open {database}: {}", with_causes(&error)))?;
            (store, database)
        }
    };
    let admin = admin_key(&store, &args.admin_key_file, args.new_admin_key)?;
    Ok(Opened {
        store: Arc::new(store),
        database,
        admin,
    })
}

/// An error with the causes under it, each after a colon: "storage
/// error" alone never says which file, host or password was wrong.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let said = next.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = next.source();
    }
    text
}

/// A PostgreSQL connection string as a person may read it: a URL without
/// its password, or `key=value` words without `password=`.
pub(crate) fn without_password(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let (authority, tail) = match rest.find(['/', '?']) {
            Some(end) => rest.split_at(end),
            None => (rest, ""),
        };
        let authority = match authority.rsplit_once('@') {
            Some((user, host)) => {
                let user = user.split(':').next().unwrap_or_default();
                format!("{user}@{host}")
            }
            None => authority.to_owned(),
        };
        let tail = match tail.split_once('?') {
            Some((path, query)) => {
                let kept: Vec<&str> = query
                    .split('&')
                    .filter(|pair| !pair.to_ascii_lowercase().starts_with("password="))
                    .collect();
                if kept.is_empty() {
                    path.to_owned()
                } else {
                    format!("{path}?{}", kept.join("&"))
                }
            }
            None => tail.to_owned(),
        };
        return format!("{scheme}://{authority}{tail}");
    }
    url.split_whitespace()
        .filter(|word| !word.to_ascii_lowercase().starts_with("password="))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The key in `file` if it still authenticates and no new one is asked
/// for; otherwise a new admin key, written to `file` (readable by its
/// owner alone) before it is printed. With `new`, the key the file held
/// is revoked once the new one is kept: `--new-admin-key` rotates. The
/// file is opened first, so a path that cannot be written makes no key.
fn admin_key(
    store: &Store,
    file: &std::path::Path,
    new: bool,
) -> Result<Option<IssuedKey>, Failure> {
    let old = std::fs::read_to_string(file)
        .ok()
        .and_then(|secret| store.authenticate(Some(secret.trim())).ok());
    if !new && old.is_some() {
        return Ok(None);
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut kept = options
        .open(file)
        .map_err(|error| format!("admin key file {}: {error}", file.display()))?;
    let key = store.create_admin_key("operator")?;
    kept.set_len(0)
        .and_then(|()| std::io::Write::write_all(&mut kept, key.secret.expose().as_bytes()))
        .map_err(|error| format!("admin key file {}: {error}", file.display()))?;
    if let Some(old) = old {
        let admin = store.authenticate(Some(key.secret.expose()))?;
        store.revoke_key(&admin, old.key_id())?;
    }
    Ok(Some(key))
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn the_start_up_line_never_shows_a_password() {
        for (url, shown) in [
            (
                "postgres://tessera:secret@db.internal:5432/tessera",
                "postgres://tessera@db.internal:5432/tessera",
            ),
            (
                "postgresql://u:p@h/d?sslmode=require&password=x",
                "postgresql://u@h/d?sslmode=require",
            ),
            ("postgres://h/d", "postgres://h/d"),
            (
                "host=h user=u password=secret dbname=d",
                "host=h user=u dbname=d",
            ),
        ] {
            assert_eq!(without_password(url), shown);
            assert!(!without_password(url).contains("secret"));
        }
    }
}
