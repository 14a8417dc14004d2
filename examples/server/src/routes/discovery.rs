//! Discovery: `/`, `/llms.txt`, `/robots.txt` and the agent card.
//!
//! Each answer depends only on the server's configuration (its version,
//! its public namespaces, the MCP tools): no storage call, so they cost 0
//! rows and answer whatever the store does.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::{AppState, Route};
use crate::openapi::Doc;

const VERSION: &str = env!("CARGO_PKG_VERSION");

pub(super) fn routes() -> Vec<Route> {
    let text = |id: &str, summary: &str| {
        Doc::new(id, summary).answers("200", "plain text; no storage call", None)
    };
    vec![
        Route::new(
            Method::GET,
            "/",
            None,
            Doc::new("index", "what this server is and where to go next; no storage call")
                .answers("200", "links", Some(json!({ "type": "object" }))),
            get(index),
        ),
        Route::new(
            Method::GET,
            "/llms.txt",
            None,
            text("llms_txt", "how an agent uses this server"),
            get(llms_txt),
        ),
        Route::new(
            Method::GET,
            "/robots.txt",
            None,
            text("robots_txt", "crawlers may read the public pages only"),
            get(robots_txt),
        ),
        Route::new(
            Method::GET,
            "/.well-known/agent-card.json",
            None,
            Doc::new(
                "agent_card",
                "the agent card: the MCP endpoint and its skills; no storage call",
            )
            .answers("200", "the agent card", Some(json!({ "type": "object" }))),
            get(agent_card),
        ),
        Route::new(
            Method::POST,
            "/mcp",
            None,
            Doc::new(
                "mcp",
                "MCP over streamable HTTP: JSON-RPC, one message or a batch of at most 32 run one call at a time; every message needs a key (`Authorization: Bearer`), 401 with WWW-Authenticate otherwise; a browser Origin other than a loopback one or one of --allowed-origin is 403; a body is application/json, each object naming its members once",
            )
            .keyed()
            // One JSON-RPC message or a batch: any JSON text, answered in
            // JSON-RPC's own terms when it is not a request.
            .body(json!({}))
            .answers("200", "the JSON-RPC answer", Some(json!({})))
            .answers("202", "notifications only: accepted", None),
            crate::mcp::handler(),
        ),
        Route::new(
            Method::GET,
            "/.well-known/oauth-protected-resource",
            None,
            Doc::new(
                "protected_resource",
                "OAuth protected-resource metadata (RFC 9728) for /mcp: a bearer key in the Authorization header, made by an operator (POST /v1/keys); no authorization server; no storage call",
            )
            .answers("200", "the metadata", Some(json!({ "type": "object", "required": ["resource"] }))),
            get(protected_resource),
        ),
        Route::new(
            Method::GET,
            "/.well-known/oauth-protected-resource/mcp",
            None,
            Doc::new(
                "protected_resource_mcp",
                "the same metadata, at the path RFC 9728 derives from /mcp",
            )
            .answers("200", "the metadata", Some(json!({ "type": "object", "required": ["resource"] }))),
            get(protected_resource),
        ),
    ]
}

fn public_names(state: &AppState) -> Vec<String> {
    state
        .public
        .namespaces
        .iter()
        .map(|namespace| namespace.as_str().to_owned())
        .collect()
}

async fn index(State(state): State<Arc<AppState>>) -> Response {
    Json(json!({
        "name": "tessera-server",
        "version": VERSION,
        "description": "Tessera: hand out work under leases, with fair claim admission",
        "public_namespaces": public_names(&state),
        "links": {
            "openapi": "/v1/openapi.json",
            "llms": "/llms.txt",
            "agent_card": "/.well-known/agent-card.json",
            "mcp": "/mcp",
            "board": "/board",
            "health": "/v1/health",
            "activity": "/v1/public/activity",
        },
    }))
    .into_response()
}

/// The protected-resource metadata of `/mcp` (RFC 9728).
async fn protected_resource(headers: HeaderMap) -> Response {
    let base = crate::mcp::base_url(&headers);
    Json(json!({
        "resource": format!("{base}/mcp"),
        "resource_name": "Tessera",
        "bearer_methods_supported": ["header"],
        "authorization_servers": [],
        "resource_documentation": format!("{base}/llms.txt"),
    }))
    .into_response()
}

async fn llms_txt(State(state): State<Arc<AppState>>) -> Response {
    let public = public_names(&state);
    let public = if public.is_empty() {
        "none".to_owned()
    } else {
        public.join(", ")
    };
    let tools: Vec<String> = crate::mcp::tool_names()
        .map(|name| format!("`{name}`"))
        .collect();
    let text = format!(
        "# Tessera {VERSION}\n\n\
         > A work queue with leases: enqueue tasks, claim them under a lease with a fencing \
         token, heartbeat, submit a result once (idempotency keys), with fair claim admission.\n\n\
         Keys go in `Authorization: Bearer <key>`, over HTTP and MCP alike: an operator makes one \
         with `POST /v1/keys` (scopes and grants). An MCP client sends it as that header on every \
         request; without one `/mcp` answers `401` with `WWW-Authenticate` naming \
         `/.well-known/oauth-protected-resource`. Public namespaces (readable without a key): {public}.\n\n\
         ## Routes\n\n\
         - [OpenAPI document](/v1/openapi.json): every route, its inputs and limits\n\
         - [MCP endpoint](/mcp): JSON-RPC over streamable HTTP; tools {tools}\n\
         - [Agent card](/.well-known/agent-card.json)\n\
         - [Board](/board): queues, admission, audit, discarded tasks\n\
         - [Public health](/v1/health) and [activity](/v1/public/activity)\n\n\
         ## Working well\n\n\
         - An empty claim answers `204` (MCP: `lease: null`) with `Retry-After` (`retry_after`): \
         5, 10, 20, 40, then 60 seconds while the queue stays empty. Wait that long, or long-poll.\n\
         - `429 rate_limited` and `503` carry `Retry-After`; honour it and add jitter.\n\
         - `503 storage_quota_exhausted` carries `reset_at` (next 00:00 UTC); keep idempotency keys when retrying.\n\n\
         ## Clients\n\n\
         A worker loop that does all of the above, in Python (`pip install ./clients/python` from \
         the repository):\n\n\
         ```python\n\
         from tessera_client import Client, Worker\n\
         client = Client(base_url, key)  # this server, and a key with the claim scope\n\
         worker = Worker(client, \"renders\", \"frames\", lambda task: {{\"frame\": task.brief}})\n\
         worker.run(threads=4)  # until worker.stop is set\n\
         ```\n\n\
         In Rust (the `tessera-client` crate of the repository):\n\n\
         ```rust\n\
         use serde_json::json;\n\
         use tessera_client::{{Client, Worker}};\n\
         let client = Client::new(base_url, &key)?; // this server, and a key with the claim scope\n\
         let worker = Worker::new(client, \"renders\", \"frames\", |claim| Ok(json!({{ \"frame\": claim.brief_json() }})))?;\n\
         worker.run(4)?; // until worker.stopper().stop()\n\
         ```\n",
        tools = tools.join(", "),
    );
    ([(CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

async fn robots_txt() -> Response {
    let text = "User-agent: *\nAllow: /$\nAllow: /board\nAllow: /llms.txt\nAllow: /v1/openapi.json\nAllow: /.well-known/\nDisallow: /\n";
    ([(CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

/// The agent card (the A2A shape): who this is, where its MCP endpoint
/// is, and one skill per tool. Relative URLs: the card depends on
/// configuration only, never on the request's host.
fn card() -> Value {
    let skills: Vec<Value> = crate::mcp::tools()
        .iter()
        .map(|tool| {
            json!({
                "id": tool["name"],
                "name": tool["name"],
                "description": tool["description"],
                "tags": ["tessera", "work-queue"],
            })
        })
        .collect();
    json!({
        "protocolVersion": "0.3.0",
        "name": "Tessera",
        "description": "A work queue with leases, fencing tokens, idempotent receipts and fair claim admission",
        "url": "/mcp",
        "preferredTransport": "JSONRPC",
        "version": VERSION,
        "documentationUrl": "/llms.txt",
        "capabilities": { "streaming": false, "pushNotifications": false },
        "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
        "security": [{ "bearer": [] }],
        "defaultInputModes": ["application/json"],
        "defaultOutputModes": ["application/json"],
        "skills": skills,
    })
}

async fn agent_card() -> Response {
    Json(card()).into_response()
}
