//! Faults on PostgreSQL. Workers log in as a role of the run's own, with
//! a connection limit, so the run can terminate their connections and
//! exhaust their connection slots without touching anyone else's.

use std::net::{SocketAddr, ToSocketAddrs as _};
use std::process::Command;

use postgres::{Client, NoTls};
use tessera_chaos::pause;

use crate::harness::TestDb;

/// The run's role on the test server, dropped with it.
pub(crate) struct PostgresFaults {
    /// The server as the test reaches it (a superuser).
    admin_url: String,
    schema: String,
    role: String,
    limit: usize,
}

const PASSWORD: &str = "chaos";

/// `url` with `user:password@address` in place of its own.
fn with_login(url: &str, login: &str, address: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let after_login = rest.rsplit_once('@').map_or(rest, |(_, after)| after);
    let path = after_login.find('/').map_or("", |at| &after_login[at..]);
    format!("{scheme}://{login}@{address}{path}")
}

/// The `host:port` of `url`.
fn address_of(url: &str) -> String {
    let rest = url.split_once("://").expect("a postgres:// URL").1;
    let after_login = rest.rsplit_once('@').map_or(rest, |(_, after)| after);
    let address = after_login.split('/').next().unwrap();
    if address.contains(':') {
        address.to_owned()
    } else {
        format!("{address}:5432")
    }
}

impl PostgresFaults {
    /// Creates the role `processes` workers log in as, allowed their
    /// pools' and listeners' connections with some room, and grants it
    /// the database's schema (which must exist).
    pub(crate) fn new(db: &TestDb, processes: usize) -> Self {
        let (url, schema) = db.postgres_place();
        let role = format!("chaos_{schema}");
        // Two pooled connections and a listener per worker, and room for
        // a worker started again before its predecessor's are gone.
        let limit = processes * 4 + 4;
        let faults = Self {
            admin_url: url.to_owned(),
            schema: schema.to_owned(),
            role,
            limit,
        };
        faults
            .admin()
            .batch_execute(&format!(
                "CREATE ROLE \"{role}\" LOGIN PASSWORD '{PASSWORD}' CONNECTION LIMIT {limit};
             GRANT USAGE, CREATE ON SCHEMA \"{schema}\" TO \"{role}\";
             GRANT ALL ON ALL TABLES IN SCHEMA \"{schema}\" TO \"{role}\";
             GRANT ALL ON ALL SEQUENCES IN SCHEMA \"{schema}\" TO \"{role}\";",
                role = faults.role,
            ))
            .unwrap();
        faults
    }

    fn admin(&self) -> Client {
        Client::connect(&self.admin_url, NoTls).unwrap()
    }

    /// The server's address.
    pub(crate) fn server_address(&self) -> SocketAddr {
        address_of(&self.admin_url)
            .to_socket_addrs()
            .unwrap()
            .next()
            .unwrap()
    }

    /// The locator workers open the database by: the role's login, at
    /// `through` (a proxy) or the server itself.
    pub(crate) fn worker_locator(&self, through: Option<SocketAddr>) -> String {
        let address = through.map_or_else(|| address_of(&self.admin_url), |a| a.to_string());
        let url = with_login(
            &self.admin_url,
            &format!("{}:{PASSWORD}", self.role),
            &address,
        );
        format!("{}\t{url}", self.schema)
    }

    /// Terminates every connection of the workers' role but `keep`.
    fn terminate(&self, keep: &[i32]) -> u64 {
        self.admin()
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE usename = $1 AND NOT pid = ANY($2)",
                &[&self.role, &keep],
            )
            .map_or(0, |row| row.get::<_, i64>(0) as u64)
    }

    /// `pg_terminate_backend` of every worker connection; returns how
    /// many it terminated.
    pub(crate) fn terminate_backends(&self) -> u64 {
        self.terminate(&[])
    }

    /// Takes every connection slot of the workers' role (terminating
    /// theirs, so their pools must connect again and cannot), holds them
    /// `hold` ms, and lets them go.
    pub(crate) fn exhaust_pool(&self, hold: u64) {
        let role_url = with_login(
            &self.admin_url,
            &format!("{}:{PASSWORD}", self.role),
            &address_of(&self.admin_url),
        );
        let mut held: Vec<Client> = Vec::new();
        let mut pids: Vec<i32> = Vec::new();
        for round in 0..3 {
            while held.len() < self.limit {
                let Ok(mut client) = Client::connect(&role_url, NoTls) else {
                    break;
                };
                pids.push(
                    client
                        .query_one("SELECT pg_backend_pid()", &[])
                        .unwrap()
                        .get(0),
                );
                held.push(client);
            }
            if round < 2 {
                self.terminate(&pids);
                pause(20);
            }
        }
        pause(hold);
        drop(held);
    }

    /// Stops the server at once (`-m immediate`) and starts it `hold` ms
    /// later: the cluster `TESSERA_TEST_POSTGRES_CLUSTER` names, which
    /// must be the server `TESSERA_TEST_POSTGRES_URL` names.
    pub(crate) fn restart_server(&self, hold: u64) {
        let cluster = std::env::var("TESSERA_TEST_POSTGRES_CLUSTER")
            .expect("TESSERA_TEST_POSTGRES_CLUSTER names the cluster to restart");
        let mut words = cluster.split_whitespace();
        let (version, name) = (words.next().unwrap(), words.next().unwrap());
        let control = |action: &str| {
            let mut command = Command::new("pg_ctlcluster");
            command.args([version, name, action]);
            if action == "stop" {
                command.args(["-m", "immediate"]);
            }
            let status = command.status().unwrap();
            assert!(status.success(), "pg_ctlcluster {cluster} {action}");
        };
        control("stop");
        pause(hold);
        control("start");
    }
}

impl Drop for PostgresFaults {
    fn drop(&mut self) {
        // The server may be down if a restart failed half-way.
        let Ok(mut admin) = Client::connect(&self.admin_url, NoTls) else {
            return;
        };
        let _ = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
            &[&self.role],
        );
        let _ = admin.batch_execute(&format!(
            "DROP OWNED BY \"{role}\"; DROP ROLE IF EXISTS \"{role}\";",
            role = self.role
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_take_another_login_and_address() {
        let url = "postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable";
        assert_eq!(address_of(url), "127.0.0.1:5432");
        assert_eq!(address_of("postgres://localhost/db"), "localhost:5432");
        assert_eq!(
            with_login(url, "r:p", "127.0.0.1:7000"),
            "postgres://r:p@127.0.0.1:7000/postgres?sslmode=disable"
        );
    }
}
