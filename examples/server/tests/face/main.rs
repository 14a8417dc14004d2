//! The public face on a real loopback port: discovery, public reads while
//! writes are refused, the claim-events long-poll, MCP, and the board (in
//! headless Chromium). The backends are named here and only here.

mod board;
mod board_tasks;
mod board_views;
mod discovery;
mod events;
mod mcp;
mod public;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tessera_server::{PublicOptions, ServeOptions};
use tessera_store::{Namespace, Store, StoreConfig};

/// A response: status, content type and body.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) content_type: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    /// A response header's value, by its lowercase name.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| panic!("a JSON body: {self:?}"))
    }
}

/// The server on a loopback port over `store`, with `renders` public.
pub(crate) struct Service {
    pub(crate) address: SocketAddr,
    pub(crate) store: Arc<Store>,
    pub(crate) admin: String,
    runtime: Option<tokio::runtime::Runtime>,
}

/// The namespace the tests mark public.
pub(crate) const PUBLIC: &str = "renders";
pub(crate) const TASKS: &str = "/v1/ns/renders/queues/frames/tasks";

/// A store configuration with `renders` public.
pub(crate) fn config() -> StoreConfig {
    StoreConfig::default().with_public_namespace(Namespace::parse(PUBLIC).unwrap())
}

impl Service {
    /// Over a SQLite database in memory (it meters rows).
    pub(crate) fn sqlite() -> Self {
        Self::over(Store::open_in_memory(config()).expect("store opens"))
    }

    pub(crate) fn over(store: Store) -> Self {
        let store = Arc::new(store);
        let admin = store.create_admin_key("operators").expect("admin key");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .expect("loopback port");
        let address = listener.local_addr().expect("bound address");
        let options = ServeOptions {
            public: PublicOptions::new(vec![Namespace::parse(PUBLIC).unwrap()], 2048),
            ..ServeOptions::default()
        };
        runtime.spawn(tessera_server::serve_until(
            listener,
            Arc::clone(&store),
            options,
            std::future::pending(),
        ));
        Self {
            address,
            store,
            admin: admin.secret.expose().to_owned(),
            runtime: Some(runtime),
        }
    }

    /// One request; a JSON body if given.
    pub(crate) fn send(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&Value>,
    ) -> Reply {
        send(self.address, method, path, key, body)
    }

    /// One request with extra headers.
    pub(crate) fn send_with(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Reply {
        send_headers(self.address, method, path, key, headers, body)
    }

    /// A keyed worker with every scope of a worker in `renders`.
    pub(crate) fn worker(&self) -> String {
        let body = json!({
            "account": "acme",
            "scopes": ["enqueue", "claim", "read"],
            "grants": ["namespace:renders"],
        });
        let reply = self.send("POST", "/v1/keys", Some(&self.admin), Some(&body));
        assert_eq!(reply.status, 201, "{}", reply.text());
        reply.json()["key"].as_str().expect("a key").to_owned()
    }

    pub(crate) fn enqueue(&self, key: &str, brief: Value) -> Reply {
        self.send("POST", TASKS, Some(key), Some(&json!({ "brief": brief })))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // The store is closed off the runtime's threads, as the PostgreSQL
        // client needs.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// A form posted to `address` as a browser posts one, with `headers`;
/// a redirect is answered, not followed.
pub(crate) fn post_form(
    address: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    form: &str,
) -> Reply {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut request = ureq::http::Request::builder()
        .method("POST")
        .uri(format!("http://{address}{path}"))
        .header("content-type", "application/x-www-form-urlencoded");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut response = agent
        .run(request.body(form.as_bytes().to_vec()).expect("a request"))
        .expect("the server answers");
    reply(&mut response)
}

/// A `GET` of `path` with `headers`; a redirect is answered, not
/// followed.
pub(crate) fn get_unfollowed(address: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut request = ureq::http::Request::builder()
        .method("GET")
        .uri(format!("http://{address}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut response = agent
        .run(request.body(Vec::new()).expect("a request"))
        .expect("the server answers");
    reply(&mut response)
}

/// A response as the tests read it.
fn reply(response: &mut ureq::http::Response<ureq::Body>) -> Reply {
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                value.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let body = response.body_mut().read_to_vec().expect("a body");
    Reply {
        status,
        content_type,
        headers,
        body,
    }
}

/// One request to `address`.
pub(crate) fn send(
    address: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> Reply {
    send_headers(address, method, path, key, &[], body)
}

/// One request to `address`, with extra headers.
pub(crate) fn send_headers(
    address: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Reply {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut request = ureq::http::Request::builder()
        .method(method)
        .uri(format!("http://{address}{path}"));
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let bytes = match body {
        Some(body) => {
            request = request.header("content-type", "application/json");
            body.to_string().into_bytes()
        }
        None => Vec::new(),
    };
    let mut response = agent
        .run(request.body(bytes).expect("a request"))
        .expect("the server answers");
    reply(&mut response)
}

/// A PostgreSQL store in a fresh schema of the test server, and the
/// schema's name to drop.
pub(crate) fn postgres_store(name: &str) -> (Store, String, String) {
    let url = std::env::var("TESSERA_TEST_POSTGRES_URL").expect("TESSERA_TEST_POSTGRES_URL");
    let schema = format!("face_{name}_{}", std::process::id());
    let options =
        tessera_store::postgres::PostgresOptions::new(url.as_str()).with_schema(schema.as_str());
    let store = Store::open_postgres(options, config()).expect("PostgreSQL store opens");
    (store, url, schema)
}

/// Runs `test` over a service on a PostgreSQL schema of its own, dropped
/// afterwards however the test ends.
pub(crate) fn on_postgres(name: &str, test: impl FnOnce(&Service)) {
    let (store, url, schema) = postgres_store(name);
    let service = Service::over(store);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(&service)));
    drop(service);
    drop_schema(&url, &schema);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

pub(crate) fn drop_schema(url: &str, schema: &str) {
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .unwrap();
}
