//! MCP at `/mcp`: JSON-RPC 2.0 over the streamable HTTP transport.
//!
//! A small implementation of the transport's stateless form, rather than
//! a crate: a `POST` carries one message or a batch and is answered with
//! `application/json` (no session, no server-sent stream, so `GET` and
//! `DELETE` are `405` as the transport allows). Batches are kept because
//! clients still send them, and the 2025-06-18 revision that dropped them
//! is what the SDK crates follow.
//!
//! - Every message needs a working key (`401` with `WWW-Authenticate`
//!   otherwise); `initialize`, `ping`, `tools/list` and notifications read
//!   only that key. A browser `Origin` other than this server is `403`.
//! - Each tool is one store operation, the same an HTTP route calls, and
//!   authenticates the request's bearer key itself, so every call of a
//!   batch (run one at a time, in order) passes authentication and claim
//!   admission as a single request does.
//! - A handled error is [`Error::tool_error`]'s envelope (`isError: true`,
//!   the status, `retry_after` and `reset_at` as structured content). An
//!   empty claim is no error: `lease: null` beside `retry_after`.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::header::{HOST, ORIGIN, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use serde_json::{Value, json};
use tessera_store::admission::retry_after_seconds;
use tessera_store::{
    AuditQuery, ClaimOutcome, Error, FencingToken, IdempotencyKey, Namespace, Output, QueueName,
    Submitted, TaskQuery,
};

use crate::auth::bearer_key;
use crate::errors::{ApiError, invalid};
use crate::limits::{self, AUDIT_LIMIT, TASKS_LIMIT, TOKEN};
use crate::routes::{AppState, shutting_down, task_ref, with_task_ref};

/// The protocol revisions this endpoint speaks, newest first.
const PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// JSON-RPC's codes for a request that is not one.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;

/// A tool as `tools/list` shows it: `properties` are its arguments, of
/// which `required` must be given, and no other is taken.
pub(crate) fn tool_listing(
    name: &str,
    description: &str,
    properties: Value,
    required: &[&str],
) -> Value {
    json!({
        "name": name,
        "description": description,
        "inputSchema": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        },
    })
}

/// The tools, with their input schemas (the same limits as the routes),
/// made once.
pub(crate) fn tools() -> &'static [Value] {
    static TOOLS: std::sync::OnceLock<Vec<Value>> = std::sync::OnceLock::new();
    TOOLS.get_or_init(make_tools)
}

fn make_tools() -> Vec<Value> {
    let ns = json!({ "type": "string", "description": "the namespace" });
    let queue = json!({ "type": "string", "description": "the queue" });
    let task = json!({ "type": "string", "description": "the task id" });
    let version = limits::VERSION.schema();
    let token = TOKEN.schema();
    let tool = tool_listing;
    vec![
        tool(
            "enqueue",
            "enqueue a task: a JSON brief, optionally its id, version, competing attempts (alternatives), priority, tries, start (not_before, RFC 3339), partition key, uniqueness (unique: key, window_ms, states, mode keep, replace or debounce with delay_ms and max_delay_ms), its own lease length (lease_ms), a deadline (deadline, RFC 3339, or timeout_ms from now) after which what is not done ends discarded, and the tasks it runs after (after: [{id, version}], each stored already; it waits until they end, and run_after all_done cancels it if one ends without being done, any_outcome runs it anyway)",
            json!({ "namespace": ns, "queue": queue, "brief": {},
                "id": limits::TASK_ID.schema(), "version": limits::VERSION.schema(),
                "alternatives": limits::ALTERNATIVES.schema(),
                "priority": limits::PRIORITY.schema(),
                "max_tries": limits::MAX_TRIES_INPUT.schema(),
                "not_before": limits::TIME.schema(),
                "lease_ms": limits::LEASE_MS.schema(), "deadline": limits::TIME.schema(),
                "timeout_ms": limits::TASK_TIMEOUT_MS.schema(),
                "partition_key": limits::PARTITION_KEY.schema(),
                "unique": crate::routes::tasks::unique_schema(),
                "after": crate::routes::tasks::parents_schema(),
                "run_after": limits::RUN_AFTER.schema() }),
            &["namespace", "queue", "brief"],
        ),
        tool(
            "claim",
            "claim the next task under a lease, through claim admission; with wait_seconds, long-poll an empty queue first. An empty queue gives lease: null and retry_after",
            json!({ "namespace": ns, "queue": queue,
                "wait_seconds": limits::WAIT_SECONDS.schema() }),
            &["namespace", "queue"],
        ),
        tool(
            "heartbeat",
            "extend a lease: the fencing token from the claim",
            json!({ "namespace": ns, "task": task, "version": version, "token": token }),
            &["namespace", "task", "token"],
        ),
        tool(
            "submit",
            "submit a result once: the fencing token and an idempotency key",
            json!({ "namespace": ns, "task": task, "version": version, "token": token,
                "output": {}, "idempotency_key": limits::IDEMPOTENCY_KEY.schema() }),
            &["namespace", "task", "token", "output", "idempotency_key"],
        ),
        tool(
            "snooze",
            "hand a leased task back to its queue, claimable again after delay_ms, without spending its try: for work that cannot run now",
            json!({ "namespace": ns, "task": task, "version": version, "token": token,
                "delay_ms": limits::SNOOZE_MS.schema() }),
            &["namespace", "task", "token", "delay_ms"],
        ),
        tool(
            "cancel",
            "an operator's cancel: every attempt of the task not yet final",
            json!({ "namespace": ns, "task": task, "version": version }),
            &["namespace", "task"],
        ),
        tool(
            "list_tasks",
            "a namespace's attempts in one state (ready, scheduled, leased, done, failed, backoff, discarded, cancelled, waiting)",
            json!({ "namespace": ns, "state": limits::STATE.schema(),
                "limit": TASKS_LIMIT.schema() }),
            &["namespace", "state"],
        ),
        tool(
            "health",
            "a namespace's attempts per state and lapsed leases, from the health snapshot",
            json!({ "namespace": ns }),
            &["namespace"],
        ),
        tool(
            "audit",
            "the newest audit events and counters: the caller's own, or everyone's for an admin",
            json!({ "limit": AUDIT_LIMIT.schema() }),
            &[],
        ),
    ]
    .into_iter()
    .chain(
        crate::route_tools::route_tools()
            .iter()
            .map(|tool| tool.listing.clone()),
    )
    .map(json_schema)
    .collect()
}

/// The tools' names.
pub(crate) fn tool_names() -> impl Iterator<Item = String> {
    tools()
        .iter()
        .filter_map(|tool| tool["name"].as_str().map(str::to_owned))
}

/// `/mcp`'s handler: `POST` only.
pub(crate) fn handler() -> MethodRouter<Arc<AppState>> {
    post(endpoint)
}

/// The most calls one JSON-RPC batch may carry: each runs in turn, so a
/// longer one would hold its connection for as long as the client likes.
pub(crate) const MAX_BATCH: usize = 32;

/// The most bytes of a result also given as text: past it, the text is a
/// note pointing to the structured content.
const MAX_TEXT_COPY: usize = 64 * 1024;

/// The most bytes a batch's answers may hold: a call whose answer would
/// pass it is answered with an error instead (JSON-RPC `-32603`), and
/// is not run, so a small request cannot make the server hold gigabytes.
pub(crate) const MAX_BATCH_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// The base URL a client reached this server at, from its `Host` header
/// (and `X-Forwarded-Proto` behind a proxy that ends TLS).
pub(crate) fn base_url(headers: &HeaderMap) -> String {
    let host = headers
        .get(HOST)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("localhost");
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|value| value.to_str().ok())
        .filter(|scheme| *scheme == "https")
        .unwrap_or("http");
    format!("{scheme}://{host}")
}

/// Whether a browser's `Origin` (if the request has one) may call `/mcp`:
/// a loopback origin (`localhost`, `127.0.0.1`, `[::1]`, any port), or one
/// of `allowed` (`--allowed-origin`). A page elsewhere is refused, and so
/// is a name rebound to this address, whatever `Host` it sends (the
/// transport's guard against DNS rebinding). Clients that are not
/// browsers send no `Origin`.
fn origin_allowed(headers: &HeaderMap, allowed: &[String]) -> bool {
    let Some(origin) = headers.get(ORIGIN) else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    let origin = origin.trim_end_matches('/').to_ascii_lowercase();
    if allowed.contains(&origin) {
        return true;
    }
    let Some(authority) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once(']').map(|(host, _)| host),
        None => authority.split(':').next(),
    };
    matches!(host, Some("localhost" | "127.0.0.1" | "::1"))
}

/// `401` for a request without a working key: the `WWW-Authenticate`
/// header names the protected-resource metadata, as MCP's authorization
/// asks, so a client knows to ask its user for a key.
fn unauthorized(headers: &HeaderMap) -> Response {
    let mut response = ApiError::Store(Error::Unauthorized).into_response();
    let challenge = format!(
        "Bearer realm=\"tessera\", resource_metadata=\"{}/.well-known/oauth-protected-resource\"",
        base_url(headers)
    );
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(WWW_AUTHENTICATE, value);
    }
    response
}

async fn endpoint(State(state): State<Arc<AppState>>, request: axum::extract::Request) -> Response {
    let headers = request.headers().clone();
    if !origin_allowed(&headers, &state.allowed_origins) {
        return ApiError::http(
            StatusCode::FORBIDDEN,
            "origin_refused",
            "a browser page of this origin may not call /mcp (see --allowed-origin)",
        )
        .into_response();
    }
    if let Some(asked) = headers.get("mcp-protocol-version") {
        let known = asked
            .to_str()
            .is_ok_and(|asked| PROTOCOL_VERSIONS.contains(&asked));
        if !known {
            return ApiError::http(
                StatusCode::BAD_REQUEST,
                "unsupported_protocol_version",
                format!(
                    "the MCP-Protocol-Version header must be one of {}",
                    PROTOCOL_VERSIONS.join(", ")
                ),
            )
            .into_response();
        }
    }
    let key = bearer_key(&headers).map(str::to_owned);
    // Every message needs a working key, `initialize` included, so a
    // client learns at once that it must ask for one.
    let Some(presented) = key.clone() else {
        return unauthorized(&headers);
    };
    match state
        .call(move |store| store.authenticate(Some(&presented)))
        .await
    {
        Ok(_) => {}
        Err(ApiError::Store(Error::Unauthorized)) => return unauthorized(&headers),
        Err(error) => return error.into_response(),
    }
    if !crate::errors::is_json(&headers) {
        return ApiError::http(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "a message to /mcp must be application/json",
        )
        .into_response();
    }
    let body = match crate::errors::read_body(request, &state).await {
        Ok(body) => body,
        Err(error) => return error.into_response(),
    };
    // A member named twice is a parse error: the call that runs is the
    // call that was read, whichever member a reader takes.
    let message: Value = match crate::objects::value_from_slice(&body) {
        Ok(message) => message,
        Err(error) => {
            return Json(rpc_error(Value::Null, PARSE_ERROR, &error.to_string())).into_response();
        }
    };
    let answer = match message {
        Value::Array(calls) if calls.is_empty() => {
            Some(rpc_error(Value::Null, INVALID_REQUEST, "an empty batch"))
        }
        Value::Array(calls) if calls.len() > MAX_BATCH => Some(rpc_error(
            Value::Null,
            INVALID_REQUEST,
            &format!("a batch of {} calls; at most {MAX_BATCH}", calls.len()),
        )),
        // One call at a time, in order: each passes authentication and
        // admission on its own, and a batch never fans out.
        Value::Array(calls) => {
            let mut answers = Vec::new();
            let mut held = 0;
            for call in calls {
                if held > MAX_BATCH_ANSWER_BYTES {
                    let id = call.get("id").cloned().unwrap_or(Value::Null);
                    answers.push(rpc_error(
                        id,
                        INTERNAL_ERROR,
                        &format!(
                            "the batch's answers passed {MAX_BATCH_ANSWER_BYTES} bytes; \
                             send this call again on its own"
                        ),
                    ));
                    continue;
                }
                if let Some(answer) = handle(&state, key.as_deref(), call).await {
                    held += answer.to_string().len();
                    answers.push(answer);
                }
            }
            (!answers.is_empty()).then_some(Value::Array(answers))
        }
        call => handle(&state, key.as_deref(), call).await,
    };
    match answer {
        Some(answer) => Json(answer).into_response(),
        // Only notifications and responses: accepted, nothing to say.
        None => StatusCode::ACCEPTED.into_response(),
    }
}

fn rpc_error(id: Value, code: i64, message: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

fn rpc_result(id: Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// One message: its answer, or `None` for a notification or a response.
async fn handle(state: &Arc<AppState>, key: Option<&str>, message: Value) -> Option<Value> {
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        // A response to nothing we asked, or not a message at all.
        let is_response = message.get("result").is_some() || message.get("error").is_some();
        return (!is_response).then(|| {
            rpc_error(
                message.get("id").cloned().unwrap_or(Value::Null),
                INVALID_REQUEST,
                "not a JSON-RPC request",
            )
        });
    };
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some(rpc_error(
            message.get("id").cloned().unwrap_or(Value::Null),
            INVALID_REQUEST,
            "jsonrpc must be \"2.0\"",
        ));
    }
    let id = message.get("id").cloned()?;
    // An id a client can match its answer by: a string, or an integer
    // that reads back as it was sent.
    if !(id.is_string() || id.is_i64() || id.is_u64()) {
        return Some(rpc_error(
            Value::Null,
            INVALID_REQUEST,
            "id must be a string or an integer",
        ));
    }
    let params = message.get("params").cloned().unwrap_or(json!({}));
    Some(match method {
        "initialize" => {
            let asked = params["protocolVersion"].as_str().unwrap_or_default();
            let version = PROTOCOL_VERSIONS
                .iter()
                .find(|known| **known == asked)
                .unwrap_or(&PROTOCOL_VERSIONS[0]);
            rpc_result(
                id,
                json!({
                    "protocolVersion": version,
                    "capabilities": { "tools": { "listChanged": false } },
                    "serverInfo": { "name": "tessera-server", "version": env!("CARGO_PKG_VERSION") },
                    "instructions": "Tessera hands out work under leases: enqueue, claim, heartbeat, submit. \
                        An empty claim gives lease: null and retry_after seconds; honour retry_after on errors too.",
                }),
            )
        }
        "ping" => rpc_result(id, json!({})),
        "tools/list" => rpc_result(id, json!({ "tools": tools() })),
        "tools/call" => {
            if !params.is_object() {
                return Some(rpc_error(id, INVALID_PARAMS, "params must be an object"));
            }
            let Some(name) = params["name"].as_str().map(str::to_owned) else {
                return Some(rpc_error(
                    id,
                    INVALID_PARAMS,
                    "params.name: a tool name is required",
                ));
            };
            let arguments = params.get("arguments").cloned().unwrap_or(json!({}));
            if let Err(message) = check_arguments(&name, &arguments) {
                return Some(rpc_error(id, INVALID_PARAMS, &message));
            }
            let answered = match crate::route_tools::route_tool(&name) {
                Some(tool) => crate::route_tools::call(state, key, tool, &arguments).await,
                None => call(state, key, &name, arguments).await.map_err(tool_error),
            };
            let result = match answered {
                Ok(value) => {
                    let text = value.to_string();
                    // The text copy of a large result is a note, not the
                    // result again: an answer is held whole until it goes.
                    let text = if text.len() > MAX_TEXT_COPY {
                        format!(
                            "the result is the structured content ({} bytes)",
                            text.len()
                        )
                    } else {
                        text
                    };
                    json!({
                        "content": [{ "type": "text", "text": text }],
                        "structuredContent": value,
                        "isError": false,
                    })
                }
                Err(envelope) => envelope,
            };
            rpc_result(id, result)
        }
        other => rpc_error(id, METHOD_NOT_FOUND, &format!("no method {other:?}")),
    })
}

/// Checks a tool call's arguments against the tool's own input schema
/// (the one `tools/list` shows): an object, every required argument
/// there and not null, and no argument the schema does not name. The
/// values' own limits are checked where each is read, by the same
/// definitions as the HTTP routes'.
fn check_arguments(name: &str, arguments: &Value) -> Result<(), String> {
    let Some(tool) = tools().iter().find(|tool| tool["name"] == name) else {
        return Err(format!("unknown tool {name:?}"));
    };
    let Some(given) = arguments.as_object() else {
        return Err("arguments must be an object".to_owned());
    };
    let schema = &tool["inputSchema"];
    let known = schema["properties"].as_object();
    if let Some(unknown) = given
        .keys()
        .find(|key| known.is_none_or(|known| !known.contains_key(*key)))
    {
        return Err(format!("{name}: no argument {unknown:?}"));
    }
    for required in schema["required"].as_array().into_iter().flatten() {
        let required = required.as_str().unwrap_or_default();
        if given.get(required).is_none_or(Value::is_null) {
            return Err(format!("{name}: {required} is required"));
        }
    }
    for (argument, value) in given {
        let expected = &schema["properties"][argument]["type"];
        if !of_type(value, expected) {
            return Err(format!("{name}: {argument} must be of type {expected}"));
        }
    }
    Ok(())
}

/// Whether `value` is of the JSON Schema `expected` type (a name, or a
/// list of names); any value when the schema names none.
fn of_type(value: &Value, expected: &Value) -> bool {
    let one = |name: &str| match name {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => true,
    };
    match expected {
        Value::String(name) => one(name),
        Value::Array(names) => names.iter().any(|name| name.as_str().is_some_and(one)),
        _ => true,
    }
}

/// An OpenAPI 3.0 schema as JSON Schema, which MCP's input schemas are: a
/// `nullable` type becomes a list of it and `null`, all the way down.
pub(crate) fn json_schema(schema: Value) -> Value {
    match schema {
        Value::Object(mut fields) => {
            let nullable = fields.remove("nullable") == Some(Value::Bool(true));
            for value in fields.values_mut() {
                *value = json_schema(value.take());
            }
            if nullable {
                if let Some(Value::String(name)) = fields.get("type").cloned() {
                    fields.insert("type".to_owned(), json!([name, "null"]));
                }
            }
            Value::Object(fields)
        }
        Value::Array(items) => Value::Array(items.into_iter().map(json_schema).collect()),
        other => other,
    }
}

/// An error as the tool-error envelope: the store's own, or the same
/// shape for the HTTP layer's.
pub(crate) fn tool_error(error: ApiError) -> Value {
    match error {
        ApiError::Store(error) => json!(error.tool_error()),
        ApiError::Http {
            status,
            code,
            message,
            retry_after,
        } => json!({
            "isError": true,
            "content": [{ "type": "text", "text": message }],
            "structuredContent": {
                "status": status.as_u16(), "code": code, "message": message,
                "retry_after": retry_after.map(retry_after_seconds), "reset_at": null,
            },
        }),
    }
}

/// A required string argument.
fn text<'a>(arguments: &'a Value, name: &str) -> Result<&'a str, ApiError> {
    arguments[name]
        .as_str()
        .ok_or_else(|| invalid(format!("{name}: a string is required")))
}

/// An optional integer argument.
fn integer(arguments: &Value, name: &str) -> Result<Option<i64>, ApiError> {
    match &arguments[name] {
        Value::Null => Ok(None),
        value => value
            .as_i64()
            .map(Some)
            .ok_or_else(|| invalid(format!("{name}: an integer is required"))),
    }
}

/// Runs one tool: authenticates the key, then the one store operation.
async fn call(
    state: &Arc<AppState>,
    key: Option<&str>,
    name: &str,
    arguments: Value,
) -> Result<Value, ApiError> {
    if !arguments.is_object() {
        return Err(invalid("arguments must be an object"));
    }
    let key = key.map(str::to_owned);
    let caller = state
        .call(move |store| store.authenticate(key.as_deref()))
        .await?;
    let namespace =
        || -> Result<Namespace, ApiError> { Ok(Namespace::parse(text(&arguments, "namespace")?)?) };
    let version = integer(&arguments, "version")?.unwrap_or(1);
    match name {
        "enqueue" => {
            let ns = namespace()?;
            let queue = QueueName::parse(text(&arguments, "queue")?)?;
            let mut fields = json!({ "brief": arguments["brief"].clone() });
            for optional in [
                "id",
                "version",
                "alternatives",
                "priority",
                "max_tries",
                "not_before",
                "lease_ms",
                "deadline",
                "timeout_ms",
                "partition_key",
                "unique",
                "after",
                "run_after",
            ] {
                if !arguments[optional].is_null() {
                    fields[optional] = arguments[optional].clone();
                }
            }
            let task: tessera_client::NewTask = crate::objects::from_value(fields)
                .map_err(|error| invalid(format!("arguments: {error}")))?;
            let (brief, options) = crate::routes::tasks::task_parts(&ns, task)?;
            let enqueued = state
                .call(move |store| store.enqueue_one(&caller, &ns, &queue, &brief, &options))
                .await?;
            // A unique task's duplicate answers the task holding its key,
            // `created` false, as the route's 200 does.
            Ok(json!({ "task": enqueued.task, "created": enqueued.created }))
        }
        "claim" => {
            let ns = namespace()?;
            let queue = QueueName::parse(text(&arguments, "queue")?)?;
            let wait = match integer(&arguments, "wait_seconds")? {
                Some(seconds) => Duration::from_secs(limits::WAIT_SECONDS.integer(seconds)? as u64),
                None => Duration::ZERO,
            };
            claim(state, caller, ns, queue, wait).await
        }
        "heartbeat" => {
            let task = task_ref(namespace()?.as_str(), text(&arguments, "task")?, version)?;
            let token =
                FencingToken::new(TOKEN.integer(integer(&arguments, "token")?.unwrap_or(0))?)?;
            let reference = task.clone();
            let lease = state
                .call(move |store| store.heartbeat(&caller, &task, token))
                .await?;
            Ok(json!({ "lease": with_task_ref(json!(lease), &reference) }))
        }
        "submit" => {
            let task = task_ref(namespace()?.as_str(), text(&arguments, "task")?, version)?;
            let token =
                FencingToken::new(TOKEN.integer(integer(&arguments, "token")?.unwrap_or(0))?)?;
            let idempotency = IdempotencyKey::parse(text(&arguments, "idempotency_key")?)?;
            let output = Output::bytes(arguments["output"].to_string());
            let reference = task.clone();
            let submitted = state
                .call(move |store| store.submit(&caller, &task, token, &idempotency, &output))
                .await?;
            let (receipt, replayed) = match submitted {
                Submitted::Accepted(receipt) => (receipt, false),
                Submitted::Replayed(receipt) => (receipt, true),
            };
            Ok(
                json!({ "receipt": with_task_ref(json!(receipt), &reference), "replayed": replayed }),
            )
        }
        "snooze" => {
            let task = task_ref(namespace()?.as_str(), text(&arguments, "task")?, version)?;
            let token =
                FencingToken::new(TOKEN.integer(integer(&arguments, "token")?.unwrap_or(0))?)?;
            let delay = integer(&arguments, "delay_ms")?
                .ok_or_else(|| invalid("delay_ms: an integer is required"))?;
            let delay = Duration::from_millis(limits::SNOOZE_MS.integer(delay)? as u64);
            let new_state = state
                .call(move |store| store.snooze(&caller, &task, token, delay))
                .await?;
            Ok(json!({ "state": new_state }))
        }
        "cancel" => {
            let task = task_ref(namespace()?.as_str(), text(&arguments, "task")?, version)?;
            let cancelled = state
                .call(move |store| store.cancel_task(&caller, &task))
                .await?;
            Ok(json!({ "cancelled": cancelled }))
        }
        "list_tasks" => {
            let ns = namespace()?;
            let mut listing = TaskQuery::new(limits::state(text(&arguments, "state")?)?);
            if let Some(limit) = integer(&arguments, "limit")? {
                listing.limit = TASKS_LIMIT.integer(limit)? as usize;
            }
            let page = state
                .call(move |store| store.list_tasks(&caller, &ns, &listing))
                .await?;
            let next = page.next.map(|cursor| cursor.to_string());
            Ok(json!({ "tasks": page.tasks, "next": next }))
        }
        "health" => {
            let ns = namespace()?;
            let snapshot = state.call(move |store| store.health(&caller, &ns)).await?;
            Ok(json!(snapshot))
        }
        "audit" => {
            let mut query = AuditQuery::default();
            if let Some(limit) = integer(&arguments, "limit")? {
                query.limit = AUDIT_LIMIT.integer(limit)? as usize;
            }
            let page = state
                .call(move |store| store.audit(&caller, &query))
                .await?;
            Ok(json!(page))
        }
        _ => Err(ApiError::Store(Error::NotFound {
            what: format!("tool {name}"),
        })),
    }
}

/// A claim through admission, as the HTTP route makes it; with a wait,
/// an empty queue is long-polled once and claimed again.
async fn claim(
    state: &Arc<AppState>,
    caller: tessera_store::Caller,
    ns: Namespace,
    queue: QueueName,
    wait: Duration,
) -> Result<Value, ApiError> {
    let mut outcome = claim_once(state, &caller, &ns, &queue).await?;
    if matches!(outcome, ClaimOutcome::Empty { .. }) && !wait.is_zero() {
        let (waiter, ns_wait, queue_wait) = (caller.clone(), ns.clone(), queue.clone());
        let timeout = wait.min(state.max_long_poll);
        let woken = tokio::select! {
            woken = state.call(move |store| store.wait_for_work(&waiter, &ns_wait, &queue_wait, timeout)) => woken?,
            () = state.closing() => return Err(shutting_down()),
        };
        if woken == tessera_store::WaitOutcome::WorkAvailable {
            outcome = claim_once(state, &caller, &ns, &queue).await?;
        }
    }
    Ok(match &outcome {
        ClaimOutcome::Granted(claimed) => {
            let mut body = crate::routes::claims::claimed_json(claimed);
            body["waited_ms"] = json!(outcome.wait_ms());
            body["concurrency_limit"] = json!(outcome.concurrency_limit());
            body
        }
        ClaimOutcome::Empty { .. } => json!({
            "lease": null,
            "retry_after": outcome.retry_after().map(retry_after_seconds),
            "reason": outcome.empty_reason(),
            "waited_ms": outcome.wait_ms(),
            "concurrency_limit": outcome.concurrency_limit(),
        }),
    })
}

async fn claim_once(
    state: &Arc<AppState>,
    caller: &tessera_store::Caller,
    ns: &Namespace,
    queue: &QueueName,
) -> Result<ClaimOutcome, ApiError> {
    let permit = tokio::select! {
        permit = state.store.claim_permit(caller, ns, queue) => permit?,
        () = state.closing() => return Err(shutting_down()),
    };
    let outcome = state.call(move |store| store.finish_claim(permit)).await?;
    state.remember(|history, now| {
        history.claim(
            now,
            Duration::from_millis(outcome.wait_ms()),
            outcome.concurrency_limit(),
        );
    });
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use axum::http::header::{HOST, ORIGIN};
    use axum::http::{HeaderMap, HeaderValue};

    use super::origin_allowed;

    fn headers(origin: Option<&'static str>, host: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static(host));
        if let Some(origin) = origin {
            headers.insert(ORIGIN, HeaderValue::from_static(origin));
        }
        headers
    }

    #[test]
    fn schemas_are_json_schema_and_arguments_are_checked_by_type() {
        use serde_json::json;

        use super::{json_schema, of_type};
        let schema = json_schema(json!({
            "type": "object",
            "properties": { "limit": { "type": "integer", "nullable": true },
                "tags": { "type": "array", "items": { "type": "string", "nullable": true } } },
        }));
        assert_eq!(
            schema["properties"]["limit"]["type"],
            json!(["integer", "null"])
        );
        assert_eq!(
            schema["properties"]["tags"]["items"]["type"],
            json!(["string", "null"])
        );
        assert!(schema["properties"]["limit"].get("nullable").is_none());
        let nullable = json!(["integer", "null"]);
        for (value, expected, ok) in [
            (json!(5), json!("integer"), true),
            (json!("5"), json!("integer"), false),
            (json!(1.5), json!("integer"), false),
            (json!(null), nullable.clone(), true),
            (json!(true), nullable, false),
            (json!(5), json!("string"), false),
            (json!({ "a": 1 }), json!(null), true),
        ] {
            assert_eq!(of_type(&value, &expected), ok, "{value} as {expected}");
        }
    }

    #[test]
    fn loopback_and_listed_origins_pass_and_a_rebound_name_does_not() {
        let listed = vec!["https://queue.example.com".to_owned()];
        for (origin, host, allowed) in [
            (None, "anything", true),
            (Some("http://localhost:8080"), "localhost:8080", true),
            (Some("http://127.0.0.1:9"), "127.0.0.1:9", true),
            (Some("http://[::1]:9"), "[::1]:9", true),
            (Some("https://queue.example.com"), "queue.example.com", true),
            (
                Some("https://QUEUE.example.com/"),
                "queue.example.com",
                true,
            ),
            // A name rebound to this address: its Host agrees with it.
            (Some("http://evil.example:9"), "evil.example:9", false),
            (Some("http://queue.example.com"), "queue.example.com", false),
            (Some("http://127.0.0.1.evil.example"), "127.0.0.1", false),
            (
                Some("http://localhost.evil.example:9"),
                "localhost:9",
                false,
            ),
            (Some("null"), "localhost", false),
        ] {
            assert_eq!(
                origin_allowed(&headers(origin, host), &listed),
                allowed,
                "{origin:?} to {host}"
            );
        }
    }
}
