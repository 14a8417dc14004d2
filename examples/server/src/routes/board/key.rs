//! An operator's key on the board's server-rendered views.
//!
//! The views work without JavaScript, so the key cannot only live in the
//! tab's session storage as the live script keeps it. `POST /board/key`
//! (a form) checks the key and keeps it in a cookie scoped to `/board`:
//! `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's
//! page sends it, so another site cannot submit the board's forms), and
//! `Secure` when the request came over HTTPS. `POST /board/forget` drops
//! it. A bearer key in `Authorization` works on every view as well, and
//! wins over the cookie. Every form the board posts is also refused when
//! its `Origin` names another host.

use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, State};
use axum::http::header::{COOKIE, HOST, LOCATION, ORIGIN, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use serde_json::json;
use tessera_store::{Caller, Namespace};

use super::super::{AppState, Route};
use super::html::query_value;
use crate::auth::bearer_key;
use crate::errors::ApiError;
use crate::limits::{BOARD_KEY, NAMESPACE};
use crate::openapi::Doc;

/// The cookie that holds the key.
const COOKIE_NAME: &str = "tessera_board_key";

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route::new(
            Method::POST,
            "/board/key",
            None,
            Doc::new(
                "board_key",
                "keeps an operator's key for the board's views in an HttpOnly, SameSite=Strict cookie scoped to /board, once the store knows it; a form",
            )
            .form(super::super::object(
                json!({ "key": BOARD_KEY.schema(), "ns": NAMESPACE.schema() }),
                &["key"],
            ))
            .answers("303", "the key is kept: on to the queues view", None),
            post(keep),
        ),
        Route::new(
            Method::POST,
            "/board/forget",
            None,
            Doc::new("board_forget", "forgets the board's key: the cookie is dropped")
                .answers("303", "forgotten: back to the board", None),
            post(forget),
        ),
    ]
}

/// The key form.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyForm {
    key: String,
    ns: Option<String>,
}

async fn keep(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    form: Result<Form<KeyForm>, FormRejection>,
) -> Result<Response, ApiError> {
    same_origin(&headers)?;
    let Form(form) = form.map_err(crate::errors::rejected)?;
    let key = BOARD_KEY.text(&form.key)?.to_owned();
    let namespace = form.ns.as_deref().map(Namespace::parse).transpose()?;
    let checked = key.clone();
    state
        .call(move |store| store.authenticate(Some(&checked)))
        .await?;
    // Only a key the store knows reaches here, so it has the issued form
    // (`tsk_<hex>_<hex>`): nothing in it needs quoting in a cookie.
    let secure = if is_https(&headers) { "; Secure" } else { "" };
    let cookie = format!("{COOKIE_NAME}={key}; Path=/board; HttpOnly; SameSite=Strict{secure}");
    let to = match namespace {
        Some(ns) => format!("/board/queues?ns={}", query_value(ns.as_str())),
        None => "/board/queues".to_owned(),
    };
    Ok(see_other_with(&to, Some(cookie)))
}

async fn forget(headers: HeaderMap) -> Result<Response, ApiError> {
    same_origin(&headers)?;
    let cookie = format!("{COOKIE_NAME}=; Path=/board; HttpOnly; SameSite=Strict; Max-Age=0");
    Ok(see_other_with("/board", Some(cookie)))
}

/// `303 See Other` to `to`, the answer to a form the board posts.
pub(super) fn see_other(to: &str) -> Response {
    see_other_with(to, None)
}

fn see_other_with(to: &str, cookie: Option<String>) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    // Every `to` is built here from checked names, each query value encoded.
    if let Ok(location) = HeaderValue::from_str(to) {
        response.headers_mut().insert(LOCATION, location);
    }
    if let Some(cookie) = cookie.and_then(|cookie| HeaderValue::from_str(&cookie).ok()) {
        response.headers_mut().insert(SET_COOKIE, cookie);
    }
    response
}

/// Whether the request came over HTTPS, by the proxy's word.
fn is_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|proto| proto.eq_ignore_ascii_case("https"))
}

/// The key a request presents: its bearer key, else the board's cookie.
pub(super) fn presented(headers: &HeaderMap) -> Option<String> {
    if let Some(key) = bearer_key(headers) {
        return Some(key.to_owned());
    }
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.to_owned())
        .filter(|value| !value.is_empty())
}

/// The caller of a keyed view: `None` when no key is presented (the view
/// then asks for one), `401` for a key the store does not know.
pub(super) async fn caller(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<Caller>, ApiError> {
    let Some(key) = presented(headers) else {
        return Ok(None);
    };
    let caller = state
        .call(move |store| store.authenticate(Some(&key)))
        .await?;
    Ok(Some(caller))
}

/// The caller of a board form: a key is needed (`401` without one), and a
/// form from another site's page is `403 origin_refused`.
pub(super) async fn form_caller(state: &AppState, headers: &HeaderMap) -> Result<Caller, ApiError> {
    same_origin(headers)?;
    let key = presented(headers);
    state
        .call(move |store| store.authenticate(key.as_deref()))
        .await
}

/// Refuses a request whose `Origin` is not this server's own (`Host`).
/// A request without `Origin` (not from a browser's form) is not checked;
/// the cookie's `SameSite=Strict` already keeps other sites' forms keyless.
pub(super) fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(origin) = headers.get(ORIGIN) else {
        return Ok(());
    };
    let host = headers.get(HOST).and_then(|host| host.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|origin| origin.split_once("://"))
        .map(|(_, host)| host);
    match (origin_host, host) {
        (Some(origin), Some(host)) if origin.eq_ignore_ascii_case(host) => Ok(()),
        _ => Err(ApiError::http(
            StatusCode::FORBIDDEN,
            "origin_refused",
            "the board's forms are served to its own pages only",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_key_wins_over_the_cookie() {
        let mut headers = HeaderMap::new();
        headers.insert(
            COOKIE,
            HeaderValue::from_static("a=b; tessera_board_key=tsk_1_2; c=d"),
        );
        assert_eq!(presented(&headers).as_deref(), Some("tsk_1_2"));
        headers.insert("authorization", HeaderValue::from_static("Bearer tsk_3_4"));
        assert_eq!(presented(&headers).as_deref(), Some("tsk_3_4"));
        let mut forgotten = HeaderMap::new();
        forgotten.insert(COOKIE, HeaderValue::from_static("tessera_board_key="));
        assert_eq!(presented(&forgotten), None);
    }

    #[test]
    fn a_form_from_another_host_is_refused() {
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert!(same_origin(&headers).is_ok());
        headers.insert(ORIGIN, HeaderValue::from_static("http://127.0.0.1:8080"));
        assert!(same_origin(&headers).is_ok());
        headers.insert(ORIGIN, HeaderValue::from_static("https://evil.example"));
        assert!(same_origin(&headers).is_err());
        headers.insert(ORIGIN, HeaderValue::from_static("null"));
        assert!(same_origin(&headers).is_err());
    }
}
