//! The pool's connections, each with the statements prepared on it.

use std::collections::HashMap;

use postgres::NoTls;

use super::transactions::Prepared;

/// A pooled client and the statements prepared on it.
pub(super) struct PgConnection {
    pub(super) client: postgres::Client,
    pub(super) prepared: Prepared,
}

/// Opens pooled connections.
#[derive(Debug)]
pub(super) struct Manager {
    pub(super) config: postgres::Config,
}

impl r2d2::ManageConnection for Manager {
    type Connection = PgConnection;
    type Error = postgres::Error;

    fn connect(&self) -> Result<PgConnection, postgres::Error> {
        Ok(PgConnection {
            client: self.config.connect(NoTls)?,
            prepared: HashMap::new(),
        })
    }

    fn is_valid(&self, connection: &mut PgConnection) -> Result<(), postgres::Error> {
        connection.client.simple_query("").map(drop)
    }

    fn has_broken(&self, connection: &mut PgConnection) -> bool {
        connection.client.is_closed()
    }
}

/// Pool errors are retried by the pool itself; they reach callers as
/// errors, not logs.
#[derive(Debug)]
pub(super) struct QuietErrors;

impl r2d2::HandleError<postgres::Error> for QuietErrors {
    fn handle_error(&self, _error: postgres::Error) {}
}
