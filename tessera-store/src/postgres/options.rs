//! The settings of a PostgreSQL store.

use std::fmt;
use std::time::Duration;

use crate::error::Error;

/// Where a PostgreSQL store lives and the settings only PostgreSQL has.
///
/// ```
/// use std::time::Duration;
/// use tessera_store::postgres::PostgresOptions;
///
/// let options = PostgresOptions::new("postgres://tessera:secret@db.internal/tessera")
///     .with_schema("renders")
///     .with_pool_size(32)
///     .with_poll_interval(Duration::from_secs(5));
/// assert_eq!(options.pool_size(), 32);
/// // The password never reaches a log.
/// assert!(!format!("{options:?}").contains("secret"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    pub(super) url: String,
    pub(super) schema: Option<String>,
    pub(super) pool_size: u32,
    pub(super) connect_timeout: Duration,
    pub(super) pool_timeout: Duration,
    pub(super) statement_timeout: Duration,
    pub(super) poll_interval: Duration,
    pub(super) retries: u32,
    pub(super) listen: bool,
}

impl PostgresOptions {
    /// A database at `url` (`postgres://user:password@host:port/database`,
    /// or the `key=value` form), checked when the store opens.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: None,
            pool_size: 16,
            connect_timeout: Duration::from_secs(5),
            pool_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
            poll_interval: Duration::from_secs(2),
            retries: 3,
            listen: true,
        }
    }

    /// Keeps the store's tables in this schema (created if missing), so
    /// several stores can share one database. Default: the connection's
    /// own search path (`public`). Lowercase letters, digits and `_`,
    /// starting with a letter, at most 48 bytes.
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// The most connections the pool holds (default 16, at least 1); the
    /// listening connection is one more.
    ///
    /// Each busy connection is a server process, and a server does the
    /// most work with about twice as many busy connections as it has
    /// cores: past that, its processes take turns on the cores and each
    /// statement costs more CPU. On a 2-core server, 8 worker threads of
    /// one store processed 1,800–2,400 jobs a second through 8
    /// connections and 2,750–3,150 through 4 (`docs/performance-peers.md`).
    /// Size the pool for the server, counting every process's pool.
    pub fn with_pool_size(mut self, size: u32) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How long opening a connection may take (default 5 s).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long an operation waits for a pooled connection (default 5 s);
    /// past it, a retryable storage error.
    pub fn with_pool_timeout(mut self, timeout: Duration) -> Self {
        self.pool_timeout = timeout;
        self
    }

    /// How long one statement may run (default 30 s, the server's
    /// `statement_timeout`); past it, a retryable storage error.
    pub fn with_statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// How often a long-poll reads its queue while signals may be missed
    /// (default 2 s).
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How many times a transaction that lost a serialization race or a
    /// deadlock, or whose connection broke before its commit, runs again
    /// (default 3).
    pub fn with_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// Whether the store listens for other processes' enqueues (default
    /// `true`). Off behind a pooler that cannot hold a `LISTEN`
    /// (transaction mode): long-polls then poll.
    pub fn with_listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }

    /// The schema, if one is set.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The pool size.
    pub fn pool_size(&self) -> u32 {
        self.pool_size
    }

    /// The polling interval.
    pub fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// Checks the settings: a URL the client accepts, a valid schema name
    /// and timeouts of at least a millisecond. An invalid setting is
    /// `400 invalid_input` naming it.
    pub fn validate(&self) -> Result<(), Error> {
        self.config().map(drop)
    }

    pub(super) fn config(&self) -> Result<postgres::Config, Error> {
        let invalid = |reason: String| Error::InvalidInput { reason };
        let mut config: postgres::Config = self
            .url
            .parse()
            .map_err(|_| invalid("postgres url is not a connection string".to_owned()))?;
        if let Some(schema) = &self.schema {
            let valid = schema.len() <= 48
                && schema.starts_with(|c: char| c.is_ascii_lowercase())
                && schema
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !valid {
                return Err(invalid(format!(
                    "postgres schema must be lowercase letters, digits and _, got {schema:?}"
                )));
            }
        }
        for (name, timeout) in [
            ("connect timeout", self.connect_timeout),
            ("pool timeout", self.pool_timeout),
            ("statement timeout", self.statement_timeout),
            ("poll interval", self.poll_interval),
        ] {
            if timeout < Duration::from_millis(1) {
                return Err(invalid(format!(
                    "postgres {name} must be at least 1 ms, got {timeout:?}"
                )));
            }
        }
        // Every statement is prepared once per connection and its plan
        // kept: the server would otherwise plan a statement that takes
        // arrays (a batch's `unnest`) anew on every call, which costs more
        // than running it. A kept plan is made at a statement's first
        // call, often while the tables are still small, and lasts until
        // the next `ANALYZE`: with sequential scans priced out, it is the
        // index plan a large table needs (a hash join over a scan of
        // `attempts` costs a scan of the whole table on every call as it
        // grows), and the plan the statement tests check.
        let mut session = format!(
            "-c statement_timeout={} -c plan_cache_mode=force_generic_plan -c enable_seqscan=off",
            self.statement_timeout.as_millis()
        );
        if let Some(schema) = &self.schema {
            session.push_str(&format!(" -c search_path={schema}"));
        }
        config
            .application_name(&format!(
                "tessera {}",
                self.schema.as_deref().unwrap_or("public")
            ))
            .connect_timeout(self.connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30))
            .options(&session);
        Ok(config)
    }

    /// The channel enqueues are announced on: one per schema.
    pub(super) fn channel(&self) -> String {
        format!("tessera_{}", self.schema.as_deref().unwrap_or("public"))
    }
}

impl fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = self
            .url
            .parse::<postgres::Config>()
            .map(|config| {
                format!(
                    "{:?}/{}",
                    config.get_hosts(),
                    config.get_dbname().unwrap_or("")
                )
            })
            .unwrap_or_else(|_| "<unparsed>".to_owned());
        f.debug_struct("PostgresOptions")
            .field("target", &target)
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("pool_timeout", &self.pool_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field("poll_interval", &self.poll_interval)
            .field("retries", &self.retries)
            .field("listen", &self.listen)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_and_never_show_the_password() {
        let options = PostgresOptions::new("postgres://tessera:hunter22@localhost/db");
        assert!(options.validate().is_ok());
        assert!(!format!("{options:?}").contains("hunter22"));
        let bad = PostgresOptions::new("postgres://localhost/db").with_schema("Bad-Name");
        assert_eq!(bad.validate().unwrap_err().code(), "invalid_input");
        let bad = PostgresOptions::new("not a url at all ://");
        assert_eq!(bad.validate().unwrap_err().code(), "invalid_input");
        let bad =
            PostgresOptions::new("postgres://localhost/db").with_poll_interval(Duration::ZERO);
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("poll interval")
        );
    }
}
