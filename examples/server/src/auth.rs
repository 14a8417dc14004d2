//! Authentication: the caller of a request, from `Authorization: Bearer`.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use tessera_store::Caller;

use crate::errors::ApiError;
use crate::routes::AppState;

/// The caller of a request, from `Authorization: Bearer <key>`; a missing
/// or unknown key is `401` before anything else runs.
#[derive(Debug)]
pub(crate) struct Authenticated(pub(crate) Caller);

impl FromRequestParts<Arc<AppState>> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        let key = bearer_key(&parts.headers).map(str::to_owned);
        let caller = state
            .call(move |store| store.authenticate(key.as_deref()))
            .await?;
        Ok(Self(caller))
    }
}

/// The key of `Authorization: Bearer <key>`, if the header is that.
pub(crate) fn bearer_key(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}
