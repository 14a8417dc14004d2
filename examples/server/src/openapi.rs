//! The OpenAPI document, built from the route table: every route is
//! described by the same entry that routes it, and every input's schema
//! comes from [`limits`](crate::limits).

use axum::Json;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::limits::Input;
use crate::routes::{Route, routes};

/// How one route is described: its operation object, built up.
#[derive(Debug, Clone)]
pub struct Doc {
    operation: Map<String, Value>,
}

/// What a refusal carries: the store's error body.
fn error_body() -> Value {
    json!({ "$ref": "#/components/schemas/Error" })
}

impl Doc {
    /// An operation named `id` (its `operationId`) that does `summary`.
    pub(crate) fn new(id: &str, summary: &str) -> Self {
        let mut operation = Map::new();
        operation.insert("operationId".into(), json!(id));
        operation.insert("summary".into(), json!(summary));
        operation.insert("parameters".into(), json!([]));
        operation.insert("responses".into(), json!({}));
        Self { operation }
    }

    fn parameter(
        mut self,
        location: &str,
        input: Input,
        required: bool,
        example: Option<&str>,
    ) -> Self {
        let mut parameter = json!({
            "name": input.name, "in": location, "required": required, "schema": input.schema(),
        });
        if let Some(example) = example {
            parameter["example"] = json!(example);
        }
        self.operation["parameters"]
            .as_array_mut()
            .expect("parameters are a list")
            .push(parameter);
        self
    }

    /// A path parameter, with an example a client may use.
    pub(crate) fn path(self, input: Input, example: &str) -> Self {
        self.parameter("path", input, true, Some(example))
    }

    /// A query parameter.
    pub(crate) fn query(self, input: Input, name: &'static str) -> Self {
        self.parameter("query", Input { name, ..input }, false, None)
    }

    /// A required query parameter.
    pub(crate) fn parameter_required(self, input: Input, name: &'static str) -> Self {
        self.parameter("query", Input { name, ..input }, true, None)
    }

    /// A required request header.
    pub(crate) fn header(self, input: Input) -> Self {
        self.parameter("header", input, true, None)
    }

    /// The operation object as built.
    pub(crate) fn operation(&self) -> &Map<String, Value> {
        &self.operation
    }

    /// A JSON request body of `schema`.
    pub(crate) fn body(mut self, schema: Value) -> Self {
        self.operation.insert(
            "requestBody".into(),
            json!({ "required": true, "content": { "application/json": { "schema": schema } } }),
        );
        self
    }

    /// A form request body (`application/x-www-form-urlencoded`, as an
    /// HTML form posts it) of `schema`.
    pub(crate) fn form(mut self, schema: Value) -> Self {
        self.operation.insert(
            "requestBody".into(),
            json!({ "required": true, "content": { "application/x-www-form-urlencoded": { "schema": schema } } }),
        );
        self
    }

    /// A response of `status`, with a JSON body of `schema` if it has one.
    pub(crate) fn answers(
        mut self,
        status: &str,
        description: &str,
        schema: Option<Value>,
    ) -> Self {
        let mut response = json!({ "description": description });
        if let Some(schema) = schema {
            response["content"] = json!({ "application/json": { "schema": schema } });
        }
        self.operation["responses"][status] = response;
        self
    }

    /// A link from the `status` response to the operation `to`, with its
    /// parameters and body as runtime expressions.
    pub(crate) fn link(
        mut self,
        status: &str,
        name: &str,
        to: &str,
        parameters: Value,
        body: Option<Value>,
    ) -> Self {
        let mut link = json!({ "operationId": to, "parameters": parameters });
        if let Some(body) = body {
            link["requestBody"] = body;
        }
        self.operation["responses"][status]["links"][name] = link;
        self
    }

    /// Needs a key: bearer security, and the refusals every keyed route
    /// can give.
    pub(crate) fn keyed(mut self) -> Self {
        self.operation
            .insert("security".into(), json!([{ "bearer": [] }]));
        self
    }

    /// A key is optional (public namespaces).
    pub(crate) fn key_optional(mut self) -> Self {
        self.operation
            .insert("security".into(), json!([{}, { "bearer": [] }]));
        self
    }

    /// A call under a fencing token may find its task gone: `410
    /// task_purged`, finished and purged after its retention.
    pub(crate) fn gone(mut self) -> Self {
        self.operation["responses"]["410"] = json!({
            "description": "task_purged: the task is gone, finished and purged after its retention (nothing was done; a replay is never run again)",
            "content": { "application/json": { "schema": error_body() } },
        });
        self
    }

    /// The operation object, with the refusals every route can give.
    fn finish(mut self) -> Value {
        let responses = &mut self.operation["responses"];
        for (status, description) in [
            ("4XX", "refused: the store's error body with its code"),
            (
                "503",
                "storage refused the write, or the server is shutting down; Retry-After",
            ),
        ] {
            if responses.get(status).is_none() {
                responses[status] = json!({
                    "description": description,
                    "content": { "application/json": { "schema": error_body() } },
                });
            }
        }
        Value::Object(self.operation)
    }
}

/// The whole document, from `routes`.
pub(crate) fn document_of(routes: &[Route]) -> Value {
    let mut paths = Map::new();
    for route in routes {
        let methods = paths
            .entry(route.path.to_owned())
            .or_insert_with(|| json!({}));
        methods[route.method.as_str().to_ascii_lowercase()] = route.doc.clone().finish();
    }
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Tessera",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Hand out work under leases: enqueue, claim, heartbeat, submit. \
                Keys go in `Authorization: Bearer <key>`; bodies are JSON.",
        },
        "paths": paths,
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": { "error": {
                        "type": "object",
                        "required": ["code", "message"],
                        "properties": {
                            "code": { "type": "string", "description": "the stable code, e.g. stale_token" },
                            "message": { "type": "string", "description": "a lowercase message" },
                            "retry_after": { "type": "integer", "nullable": true,
                                "description": "seconds to wait, for 429 and 503" },
                            "reset_at": { "type": "string", "format": "date-time", "nullable": true,
                                "description": "when a provider allowance resets, for 503" },
                        },
                    } },
                },
            },
        },
    })
}

/// The document of this server's routes.
pub fn document() -> Value {
    document_of(&routes())
}

/// `GET /v1/openapi.json`: this document.
pub(crate) async fn openapi() -> Response {
    Json(document()).into_response()
}
