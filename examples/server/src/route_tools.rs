//! MCP tools that are HTTP routes: an operator's and an agent's
//! operations beyond the worker's own (`mcp`'s hand-made tools), each the
//! route of the same operation id, called in the process.
//!
//! A tool's input schema is the route's document: its path and query
//! parameters as arguments, and its JSON body, if it takes one, as the
//! argument `body`. A call builds that request, with the MCP request's
//! key, and runs it through the server's own router, its layers
//! included: the same checks, limits, store call and answer as over HTTP.
//! A 2xx answer is the tool's result (`{}` for one without a body); any
//! other is the tool-error envelope, built from the route's error body.

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::body::Body;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use axum::http::{Method, Request};
use serde_json::{Map, Value, json};
use tower::ServiceExt;

use crate::errors::{ApiError, invalid};
use crate::routes::{AppState, routes};

/// The routes offered as tools, by operation id: a task's detail and its
/// alternatives, an operator's retry, bulk cancel and retry by filter, a
/// batch enqueue, a queue's pause, resume, limits and settings, and
/// schedules.
pub(crate) const ROUTE_TOOLS: &[&str] = &[
    "read_task",
    "alternatives",
    "retry_task",
    "cancel_tasks",
    "retry_tasks",
    "enqueue_batch",
    "pause_queue",
    "resume_queue",
    "set_queue_limits",
    "queue_settings",
    "put_schedule",
    "read_schedule",
    "list_schedules",
    "pause_schedule",
    "resume_schedule",
    "delete_schedule",
];

/// The most bytes of a route's answer a tool call reads: past every
/// answer the routes give (a task's alternatives, at most
/// `MAX_ALTERNATIVES` outputs of up to 1 MiB each, are the largest).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// The most bytes of a `body` a route tool sends: the `/mcp` message it
/// came in was at most [`MAX_BODY_BYTES`](crate::errors::MAX_BODY_BYTES),
/// and writing its JSON again may lengthen it (a number as `1e15` is
/// written `1000000000000000.0`), so a body `/mcp` took is never refused
/// for its length here.
const MAX_REWRITTEN_BODY_BYTES: usize = 5 * crate::errors::MAX_BODY_BYTES;

/// One route as a tool.
#[derive(Debug, Clone)]
pub(crate) struct RouteTool {
    /// The tool as `tools/list` shows it.
    pub(crate) listing: Value,
    method: Method,
    path: &'static str,
    /// The query parameters, by name.
    query_parameters: Vec<String>,
    takes_body: bool,
}

/// Every route tool, in [`ROUTE_TOOLS`]' order, made once.
pub(crate) fn route_tools() -> &'static [RouteTool] {
    static TOOLS: OnceLock<Vec<RouteTool>> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let routes = routes();
        ROUTE_TOOLS
            .iter()
            .map(|id| {
                let route = routes
                    .iter()
                    .find(|route| route.doc.operation()["operationId"] == *id)
                    .unwrap_or_else(|| panic!("no route has the operation id {id}"));
                tool_of(id, route.method.clone(), route.path, route.doc.operation())
            })
            .collect()
    })
}

/// The tool of route `path` by `method`, from its document.
fn tool_of(id: &str, method: Method, path: &'static str, doc: &Map<String, Value>) -> RouteTool {
    let mut properties = Map::new();
    let mut required = Vec::new();
    let mut query_parameters = Vec::new();
    for parameter in doc["parameters"].as_array().into_iter().flatten() {
        let name = parameter["name"].as_str().unwrap_or_default().to_owned();
        match parameter["in"].as_str() {
            Some("path") => {}
            Some("query") => query_parameters.push(name.clone()),
            // Headers (an idempotency key) are not offered here.
            _ => continue,
        }
        properties.insert(name.clone(), parameter["schema"].clone());
        if parameter["required"] == true {
            required.push(name);
        }
    }
    let body = &doc
        .get("requestBody")
        .map(|body| body["content"]["application/json"]["schema"].clone());
    if let Some(schema) = body {
        properties.insert("body".to_owned(), schema.clone());
        required.push("body".to_owned());
    }
    let summary = doc["summary"].as_str().unwrap_or_default();
    let description = match body {
        Some(_) => format!("{summary} (the route {method} {path}; its JSON body as `body`)"),
        None => format!("{summary} (the route {method} {path})"),
    };
    let required: Vec<&str> = required.iter().map(String::as_str).collect();
    RouteTool {
        listing: crate::mcp::tool_listing(id, &description, Value::Object(properties), &required),
        method,
        path,
        query_parameters,
        takes_body: body.is_some(),
    }
}

/// The route tool named `name`, if there is one.
pub(crate) fn route_tool(name: &str) -> Option<&'static RouteTool> {
    route_tools()
        .iter()
        .find(|tool| tool.listing["name"] == name)
}

/// Runs `tool` with `arguments` (checked against its schema's names
/// already) and the MCP request's `key`: its result, or the tool-error
/// envelope.
pub(crate) async fn call(
    state: &Arc<AppState>,
    key: Option<&str>,
    tool: &RouteTool,
    arguments: &Value,
) -> Result<Value, Value> {
    let request = request(tool, key, arguments).map_err(crate::mcp::tool_error)?;
    static ROUTED: OnceLock<Router<Arc<AppState>>> = OnceLock::new();
    let router = ROUTED
        .get_or_init(|| {
            crate::routes::routed().layer(axum::extract::DefaultBodyLimit::max(
                MAX_REWRITTEN_BODY_BYTES,
            ))
        })
        .clone()
        .with_state(Arc::clone(state));
    let response = match router.oneshot(request).await {
        Ok(response) => response,
        Err(infallible) => match infallible {},
    };
    let status = response.status();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    let bytes = axum::body::to_bytes(response.into_body(), MAX_ANSWER_BYTES)
        .await
        .map_err(|error| {
            crate::mcp::tool_error(ApiError::http(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "answer_too_large",
                format!("the route's answer could not be read whole: {error}"),
            ))
        })?;
    let body: Value = if bytes.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| json!({}))
    };
    if status.is_success() {
        // A tool's structured content is an object: a list is wrapped.
        return Ok(match body {
            Value::Object(_) => body,
            other => json!({ "items": other }),
        });
    }
    let error = &body["error"];
    let message = error["message"].as_str().unwrap_or("refused").to_owned();
    Err(json!({
        "isError": true,
        "content": [{ "type": "text", "text": message }],
        "structuredContent": {
            "status": status.as_u16(),
            "code": error["code"],
            "message": message,
            "retry_after": retry_after.map(Value::from).unwrap_or(error["retry_after"].clone()),
            "reset_at": error["reset_at"],
        },
    }))
}

/// The HTTP request `tool` makes of `arguments`.
fn request(
    tool: &RouteTool,
    key: Option<&str>,
    arguments: &Value,
) -> Result<Request<Body>, ApiError> {
    let mut target = String::new();
    let mut rest = tool.path;
    while let Some(open) = rest.find('{') {
        let close = rest[open..]
            .find('}')
            .map(|at| open + at)
            .expect("a path parameter is closed");
        target.push_str(&rest[..open]);
        let name = &rest[open + 1..close];
        target.push_str(&encode(
            &scalar(arguments, name)?.ok_or_else(|| invalid(format!("{name} is required")))?,
        ));
        rest = &rest[close + 1..];
    }
    target.push_str(rest);
    let mut separator = '?';
    for name in &tool.query_parameters {
        if let Some(value) = scalar(arguments, name)? {
            target.push(separator);
            target.push_str(&encode(name));
            target.push('=');
            target.push_str(&encode(&value));
            separator = '&';
        }
    }
    let body = if tool.takes_body {
        Body::from(arguments["body"].to_string())
    } else {
        Body::empty()
    };
    let mut request = Request::builder()
        .method(tool.method.clone())
        .uri(target)
        .header(CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        request = request.header(AUTHORIZATION, format!("Bearer {key}"));
    }
    request
        .body(body)
        .map_err(|error| invalid(format!("arguments: {error}")))
}

/// A path or query argument as text: a string, an integer or a boolean;
/// `None` when absent.
fn scalar(arguments: &Value, name: &str) -> Result<Option<String>, ApiError> {
    match &arguments[name] {
        Value::Null => Ok(None),
        Value::String(text) => Ok(Some(text.clone())),
        Value::Number(number) => Ok(Some(number.to_string())),
        Value::Bool(flag) => Ok(Some(flag.to_string())),
        _ => Err(invalid(format!("{name}: a string or a number is required"))),
    }
}

/// `text` percent-encoded for a path segment or a query value: every
/// byte but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_tool_is_a_route_with_its_parameters_and_body() {
        let tools = route_tools();
        assert_eq!(tools.len(), ROUTE_TOOLS.len());
        let limits = route_tool("set_queue_limits").expect("listed");
        let schema = &limits.listing["inputSchema"];
        assert_eq!(schema["required"], json!(["ns", "queue", "body"]));
        assert!(schema["properties"]["body"]["properties"]["per_partition"].is_object());
        let list = route_tool("list_schedules").expect("listed");
        assert_eq!(list.query_parameters, ["after", "limit"]);
        assert!(!list.takes_body);
    }

    #[test]
    fn a_request_carries_its_path_query_body_and_key() {
        let tool = route_tool("list_schedules").unwrap();
        let request = request(
            tool,
            Some("k"),
            &json!({ "ns": "a b", "after": "n/1", "limit": 5 }),
        )
        .unwrap();
        assert_eq!(request.uri(), "/v1/ns/a%20b/schedules?after=n%2F1&limit=5");
        assert_eq!(request.headers()[AUTHORIZATION], "Bearer k");
        let missing = request_error(tool, &json!({}));
        assert!(missing.contains("ns is required"), "{missing}");
        let nested = request_error(tool, &json!({ "ns": { "a": 1 } }));
        assert!(nested.contains("a string or a number"), "{nested}");
    }

    fn request_error(tool: &RouteTool, arguments: &Value) -> String {
        match request(tool, None, arguments) {
            Err(ApiError::Store(error)) => error.to_string(),
            Err(other) => format!("{other:?}"),
            Ok(request) => panic!("built {request:?}"),
        }
    }
}
