//! The one place an error becomes a response, and the request parts
//! (JSON bodies, paths, queries) that refuse in the same shape.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, Path, Query, Request};
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::json;
use tessera_store::admission::retry_after_seconds;
use tessera_store::{Error, LeaseError};

/// An error as an HTTP response: the store's JSON body
/// (`{"error": {"code", "message", "retry_after", "reset_at"}}`) with its
/// status, `Retry-After` (whole seconds, rounded up) when it has one, and
/// `WWW-Authenticate: Bearer` on `401`. The HTTP layer's own refusals (a
/// bad path, a wrong method, a body too large or not JSON, a server going
/// down) take the same shape.
#[derive(Debug)]
pub enum ApiError {
    /// The store's.
    Store(Error),
    /// The HTTP layer's.
    Http {
        /// Its status.
        status: StatusCode,
        /// Its stable code.
        code: &'static str,
        /// What went wrong.
        message: String,
        /// How long to wait before trying again.
        retry_after: Option<std::time::Duration>,
    },
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        Self::Store(error)
    }
}

impl From<LeaseError> for ApiError {
    fn from(error: LeaseError) -> Self {
        Self::Store(error.into())
    }
}

impl ApiError {
    /// A refusal of the HTTP layer's own.
    pub(crate) fn http(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self::Http {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }
}

/// The store's `400` with `reason`.
pub(crate) fn invalid(reason: impl std::fmt::Display) -> ApiError {
    ApiError::Store(Error::InvalidInput {
        reason: reason.to_string(),
    })
}

/// Every message starts in lowercase, whoever wrote it (axum's own
/// rejections begin with a capital).
pub(crate) fn lowercase(message: &str) -> String {
    let mut chars = message.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The `Retry-After` header for `wait`: whole seconds, rounded up, at
/// least 1, as admission rounds them.
pub(crate) fn retry_after_header(wait: std::time::Duration) -> HeaderValue {
    HeaderValue::from(retry_after_seconds(wait))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Self::Store(Error::Storage(storage)) = &self {
            // The body says only "storage error"; the operator's log says
            // what the database said.
            tracing::error!(
                kind = ?storage.kind(),
                code = storage.code().unwrap_or("-"),
                message = storage.message(),
                "storage failure"
            );
        }
        let (status, mut body, retry_after) = match self {
            Self::Store(error) => (
                StatusCode::from_u16(error.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                serde_json::to_value(error.body()).expect("an error body serializes"),
                error.retry_after(),
            ),
            Self::Http {
                status,
                code,
                message,
                retry_after,
            } => (
                status,
                json!({ "error": { "code": code, "message": message,
                    "retry_after": retry_after.map(retry_after_seconds), "reset_at": null } }),
                retry_after,
            ),
        };
        if let Some(message) = body["error"]["message"].as_str() {
            body["error"]["message"] = json!(lowercase(message));
        }
        let mut response = (status, Json(body)).into_response();
        let headers = response.headers_mut();
        if let Some(wait) = retry_after {
            headers.insert(RETRY_AFTER, retry_after_header(wait));
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// A rejection of axum's own (a path that does not parse, a body over the
/// limit) in the store's JSON shape.
pub(crate) fn rejected(rejection: impl IntoResponse + std::fmt::Display) -> ApiError {
    let message = rejection.to_string();
    let status = rejection.into_response().status();
    let code = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        _ => "invalid_input",
    };
    let status = match code {
        "invalid_input" => StatusCode::BAD_REQUEST,
        _ => status,
    };
    ApiError::http(status, code, message)
}

/// Whether a request says its body is JSON, once: one `Content-Type` of
/// `application/json` or an `application/…+json` type, in UTF-8 (no other
/// `charset`), and no `Content-Encoding` but `identity`.
pub(crate) fn is_json(headers: &axum::http::HeaderMap) -> bool {
    let mut types = headers.get_all(CONTENT_TYPE).iter();
    let (Some(content_type), None) = (types.next(), types.next()) else {
        return false;
    };
    let Ok(content_type) = content_type.to_str() else {
        return false;
    };
    let mut parts = content_type.split(';');
    let essence = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
    let json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    let utf8 = parts.all(|parameter| match parameter.split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
            value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        _ => true,
    });
    let plain = headers
        .get_all(axum::http::header::CONTENT_ENCODING)
        .iter()
        .all(|encoding| encoding.as_bytes().eq_ignore_ascii_case(b"identity"));
    json && utf8 && plain
}

/// A JSON request body: `415` unless it is `application/json`, `413` over
/// the limit, the store's `400` for a malformed one, one that is not a
/// JSON object, or one with a field the route does not know.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let is_json = is_json(request.headers());
        if !is_json {
            return Err(ApiError::http(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the body must be application/json in UTF-8, once, and not encoded",
            ));
        }
        let body = read_body(request, state).await?;
        // Every body is an object, and so is every struct inside it:
        // serde would read an array as a struct's fields by position.
        if body.iter().find(|byte| !byte.is_ascii_whitespace()) != Some(&b'{') {
            return Err(invalid(
                "request body: a JSON object is expected".to_owned(),
            ));
        }
        crate::objects::from_slice(&body)
            .map(Self)
            .map_err(|error| {
                // A field's own parse error already reads "invalid input: …".
                let error = error.to_string();
                let error = error.strip_prefix("invalid input: ").unwrap_or(&error);
                invalid(format!("request body: {error}"))
            })
    }
}

/// The path's parts, or the store's `400` for a path that does not decode.
pub(crate) fn path<T>(path: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    path.map(|Path(parts)| parts).map_err(rejected)
}

/// The query's fields, or the store's `400`.
pub(crate) fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query.map(|Query(fields)| fields).map_err(rejected)
}

/// The largest body a route reads (axum's default limit, which
/// [`read_body`] applies as it reads).
pub(crate) const MAX_BODY_BYTES: usize = tessera_client::wire::MAX_BODY_BYTES;

/// A request's whole body, within the server's body timeout
/// ([`BodyTimeout`](crate::routes::BodyTimeout)): `408 request_timeout`
/// for a client that sends it too slowly, `413` past the size limit.
pub(crate) async fn read_body<S: Send + Sync>(
    request: Request,
    state: &S,
) -> Result<Bytes, ApiError> {
    // A declared length over the limit is refused before any of it is
    // waited for.
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    if declared.is_some_and(|length| length > MAX_BODY_BYTES) {
        return Err(ApiError::http(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the body is over {MAX_BODY_BYTES} bytes"),
        ));
    }
    let limit = request
        .extensions()
        .get::<crate::routes::BodyTimeout>()
        .map_or(std::time::Duration::from_secs(30), |timeout| timeout.0);
    match tokio::time::timeout(limit, Bytes::from_request(request, state)).await {
        Ok(body) => body.map_err(rejected),
        Err(_) => Err(ApiError::http(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            "the request's body did not arrive in time",
        )),
    }
}
