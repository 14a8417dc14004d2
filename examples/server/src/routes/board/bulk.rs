//! Bulk retry and cancel by filter from the board, confirmed first.
//!
//! The task list offers both for its filters. `GET /board/bulk/retry` (or
//! `cancel`) counts the tasks the filter matches, from the store's
//! listing of the state (audited pages of up to
//! [`MAX_TASKS_LISTED`](tessera_store::limits::MAX_TASKS_LISTED), at most
//! [`COUNT_PAGES`] of them), and shows the count beside the button that
//! posts the action; the post calls `retry_tasks` or `cancel_tasks` with
//! the same filter and answers `303` back to the list. The confirmation
//! pins the filter's `before` to the time of its count (when the filter
//! had none), so a task that reaches the state afterwards is not acted
//! on; the action itself requires its state.

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use axum::routing::{get, post};
use tessera_store::limits::MAX_TASKS_LISTED;
use tessera_store::{BulkFilter, Caller, Namespace, TaskQuery};

use super::super::{AppState, Route};
use super::html::{escape, page, query_value};
use super::key::{caller, form_caller, see_other};
use super::tasks::{Filters, ListFields, filters, narrowing};
use super::{ask_for_key, namespace_of};
use crate::errors::{ApiError, path, query};
use crate::openapi::Doc;

/// The most listing pages a confirmation reads to count.
const COUNT_PAGES: usize = 10;

pub(super) fn routes() -> Vec<Route> {
    let ns = crate::limits::Input {
        name: "ns",
        ..crate::limits::NAMESPACE
    };
    let confirm = |id: &str, summary: &str| {
        filters(Doc::new(id, summary))
            .key_optional()
            .query(ns, "ns")
            .answers("200", "an HTML page", None)
    };
    let act = |id: &str, summary: &str| {
        // A bulk action names its state: no default picks one for it.
        narrowing(Doc::new(id, summary).parameter_required(crate::limits::STATE, "state"))
            .path(crate::limits::NAMESPACE, "renders")
            .key_optional()
            .answers("303", "done: back to the task list", None)
    };
    vec![
        Route::new(
            Method::GET,
            "/board/bulk/retry",
            Some("list_tasks"),
            confirm(
                "board_confirm_retry_tasks",
                "the board's confirmation of a bulk retry: how many tasks the filter matches, and the button that retries them; HTML, with the board's key",
            ),
            get(confirm_retry),
        ),
        Route::new(
            Method::GET,
            "/board/bulk/cancel",
            Some("list_tasks"),
            confirm(
                "board_confirm_cancel_tasks",
                "the board's confirmation of a bulk cancel: how many tasks the filter matches, and the button that cancels them; HTML, with the board's key",
            ),
            get(confirm_cancel),
        ),
        Route::new(
            Method::POST,
            "/board/ns/{ns}/bulk/retry",
            Some("retry_tasks"),
            act(
                "board_retry_tasks",
                "the board's bulk retry: every task the filter matches, as retry_tasks",
            ),
            post(retry),
        ),
        Route::new(
            Method::POST,
            "/board/ns/{ns}/bulk/cancel",
            Some("cancel_tasks"),
            act(
                "board_cancel_tasks",
                "the board's bulk cancel: every task the filter matches, as cancel_tasks",
            ),
            post(cancel),
        ),
    ]
}

/// The task list's offer of both actions for its filters.
pub(super) fn offer(namespace: &Namespace, filters: &Filters) -> String {
    let query = escape(&format!(
        "ns={}&{}",
        query_value(namespace.as_str()),
        filters.query()
    ));
    format!(
        "<p class=\"bulk\">Every task these filters match: <a href=\"/board/bulk/retry?{query}\" id=\"bulk-retry\">retry…</a> · <a href=\"/board/bulk/cancel?{query}\" id=\"bulk-cancel\">cancel…</a> (a count is shown first)</p>"
    )
}

/// The store's filter of `filters`.
fn bulk_filter(filters: &Filters) -> BulkFilter {
    BulkFilter {
        queue: filters.queue.clone(),
        state: Some(filters.state),
        partition_key: filters.partition_key.clone(),
        changed_since: filters.since,
        changed_before: filters.before,
    }
}

/// How many tasks `filters` matches, and whether the count stopped at its
/// bound.
fn count(
    store: &tessera_store::Store,
    caller: &Caller,
    namespace: &Namespace,
    filters: &Filters,
) -> Result<(usize, bool), tessera_store::Error> {
    let mut query = TaskQuery::new(filters.state);
    query.limit = MAX_TASKS_LISTED;
    let mut tasks = HashSet::new();
    for _ in 0..COUNT_PAGES {
        let page = store.list_tasks(caller, namespace, &query)?;
        tasks.extend(
            page.tasks
                .into_iter()
                .filter(|task| filters.keeps(task))
                .map(|task| task.task),
        );
        match page.next {
            Some(next) => query.after = Some(next),
            None => return Ok((tasks.len(), false)),
        }
    }
    Ok((tasks.len(), true))
}

async fn confirm_retry(
    state: State<Arc<AppState>>,
    headers: HeaderMap,
    fields: Result<Query<ListFields>, QueryRejection>,
) -> Result<Response, ApiError> {
    confirm(state, headers, fields, "retry").await
}

async fn confirm_cancel(
    state: State<Arc<AppState>>,
    headers: HeaderMap,
    fields: Result<Query<ListFields>, QueryRejection>,
) -> Result<Response, ApiError> {
    confirm(state, headers, fields, "cancel").await
}

async fn confirm(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    fields: Result<Query<ListFields>, QueryRejection>,
    action: &'static str,
) -> Result<Response, ApiError> {
    let fields = query(fields)?;
    let now = state.store.clock().now_utc();
    let mut filters = Filters::of(&fields, now)?;
    // Pinned to what is counted now: a task that reaches the state after
    // the count is not acted on by its confirmation.
    if filters.before.is_none() {
        filters.before = Some(now + chrono::TimeDelta::milliseconds(1));
    }
    let Some(caller) = caller(&state, &headers).await? else {
        return ask_for_key(&state, action, fields.ns.as_deref());
    };
    let Some(namespace) = namespace_of(&state, &caller, fields.ns.as_deref())? else {
        return Ok(page(
            action,
            None,
            true,
            "<p class=\"note\">Add <code>?ns=NAME</code>.</p>",
        ));
    };
    let (ns, counted) = (namespace.clone(), filters.clone());
    let (matched, bounded) = state
        .call(move |store| count(store, &caller, &ns, &counted))
        .await?;
    let shown = if bounded {
        format!("at least {matched}")
    } else {
        matched.to_string()
    };
    let query = escape(&filters.query());
    let ns_query = query_value(namespace.as_str());
    let passed = if action == "retry" {
        "Those with nothing to retry (not failed, discarded or cancelled) are passed over."
    } else {
        "Those with nothing left to cancel (every attempt final) are passed over."
    };
    let body = format!(
        r#"<section class="wide">
<h2>{action} every task these filters match?</h2>
<p><code>{filter}</code></p>
<p class="confirm"><b id="match-count">{shown}</b> tasks match now. {passed}</p>
<form method="post" action="/board/ns/{ns_query}/bulk/{action}?{query}"><button data-action="{action}">{action} them</button></form>
<p><a href="/board/tasks?ns={ns_query}&amp;{query}">back to the list</a></p>
</section>"#,
        filter = escape(&filters.query()),
    );
    Ok(page(action, Some(&namespace), true, &body))
}

async fn retry(
    state: State<Arc<AppState>>,
    headers: HeaderMap,
    parts: Result<Path<String>, PathRejection>,
    fields: Result<Query<ListFields>, QueryRejection>,
) -> Result<Response, ApiError> {
    act(state, headers, parts, fields, false).await
}

async fn cancel(
    state: State<Arc<AppState>>,
    headers: HeaderMap,
    parts: Result<Path<String>, PathRejection>,
    fields: Result<Query<ListFields>, QueryRejection>,
) -> Result<Response, ApiError> {
    act(state, headers, parts, fields, true).await
}

async fn act(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    parts: Result<Path<String>, PathRejection>,
    fields: Result<Query<ListFields>, QueryRejection>,
    cancel: bool,
) -> Result<Response, ApiError> {
    let namespace = Namespace::parse(&path(parts)?)?;
    let fields = query(fields)?;
    if fields.state.is_none() {
        return Err(crate::errors::invalid(
            "state is required: a bulk action names the state it acts on",
        ));
    }
    let filters = Filters::of(&fields, state.store.clock().now_utc())?;
    let caller = form_caller(&state, &headers).await?;
    let back = format!(
        "/board/tasks?ns={}&{}",
        query_value(namespace.as_str()),
        filters.query()
    );
    let filter = bulk_filter(&filters);
    state
        .call(move |store| {
            if cancel {
                store.cancel_tasks(&caller, &namespace, &filter)
            } else {
                store.retry_tasks(&caller, &namespace, &filter)
            }
        })
        .await?;
    Ok(see_other(&back))
}
