//! Tasks: enqueue (one or a batch), list by state, read, receipts,
//! alternatives, and an operator's cancel and retry, of one task or of
//! every task a filter matches.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;
use tessera_store::lease::AttemptNumber;

use tessera_store::limits::MAX_PARENTS;
use tessera_store::{
    Brief, BriefVersion, BulkFilter, EnqueueOptions, Namespace, PartitionKey, QueueName, TaskId,
    TaskQuery, TaskRef, UniqueKey, Uniqueness,
};

use super::{AppState, Route, object, queue_doc, queue_names, task_doc, task_ref};
use crate::auth::Authenticated;
use crate::errors::{ApiError, JsonBody, path, query};
use crate::limits::{
    self, ALTERNATIVES, ATTEMPT, DEBOUNCE_MS, ENQUEUE_BATCH, LEASE_MS, MAX_DEBOUNCE_MS,
    MAX_TRIES_INPUT, NAMESPACE, ORDER, PARTITION_KEY, PRIORITY, QUEUE, RUN_AFTER, STATE,
    TASK_CURSOR, TASK_ID, TASK_TIMEOUT_MS, TASKS_LIMIT, TIME, UNIQUE_KEY, UNIQUE_MODE,
    UNIQUE_WINDOW_MS, VERSION, any_value,
};
use crate::openapi::Doc;
use tessera_client::wire::{self, NewTask, NewTasks, Unique};

/// A new task's schema.
fn new_task() -> Value {
    object(
        json!({
            "brief": any_value(),
            "id": TASK_ID.schema(),
            "version": VERSION.schema(),
            "alternatives": ALTERNATIVES.schema(),
            "priority": PRIORITY.schema(),
            "max_tries": MAX_TRIES_INPUT.schema(),
            "not_before": TIME.schema(),
            "lease_ms": LEASE_MS.schema(),
            "deadline": TIME.schema(),
            "timeout_ms": TASK_TIMEOUT_MS.schema(),
            "partition_key": PARTITION_KEY.schema(),
            "unique": unique_schema(),
            "after": parents_schema(),
            "run_after": RUN_AFTER.schema(),
        }),
        &["brief"],
    )
}

/// A new task's parents: each its id and version (default 1).
pub(crate) fn parents_schema() -> Value {
    json!({
        "type": "array",
        "maxItems": MAX_PARENTS,
        "items": object(
            json!({ "id": TASK_ID.schema(), "version": VERSION.schema() }),
            &["id"],
        ),
    })
}

/// A unique enqueue's schema: the key, a window, the states in which a
/// duplicate counts, and what a duplicate does.
pub(crate) fn unique_schema() -> Value {
    object(
        json!({
            "key": UNIQUE_KEY.schema(),
            "window_ms": UNIQUE_WINDOW_MS.schema(),
            "states": { "type": "array", "items": STATE.schema(), "maxItems": 8 },
            "mode": UNIQUE_MODE.schema(),
            "delay_ms": DEBOUNCE_MS.schema(),
            "max_delay_ms": MAX_DEBOUNCE_MS.schema(),
        }),
        &["key"],
    )
}

/// The task reference every route answers with.
fn task_ref_schema() -> Value {
    json!({ "type": "object", "required": ["namespace", "id", "version", "created"] })
}

/// A bulk action's filter: every condition optional.
fn filter_schema() -> Value {
    object(
        json!({
            "queue": QUEUE.schema(),
            "state": STATE.schema(),
            "partition_key": PARTITION_KEY.schema(),
            "changed_since": TIME.schema(),
            "changed_before": TIME.schema(),
        }),
        &[],
    )
}

/// What a bulk action answers: how many tasks it changed.
fn changed_schema() -> Value {
    json!({ "type": "object", "required": ["changed"] })
}

/// A version in a query, for reads of one task.
fn version_query(doc: Doc) -> Doc {
    doc.query(VERSION, "version")
}

pub(super) fn routes() -> Vec<Route> {
    let to_task = json!({
        "ns": "$request.path.ns",
        "task": "$response.body#/id",
        "version": "$response.body#/version",
    });
    vec![
        Route::at(
            wire::ENQUEUE,
            Some("enqueue"),
            queue_doc(Doc::new("enqueue", "enqueue a task: a JSON brief, and optionally its id, version, competing attempts, priority, tries, start, partition key and uniqueness; a unique task's duplicate answers 200 with the task already there, created false; a unique mode of keep or replace takes no delays, and debounce needs delay_ms at most max_delay_ms (400 invalid_input otherwise)"))
                .keyed()
                .body(new_task())
                .answers("201", "the task's reference, created true", Some(task_ref_schema()))
                .answers("200", "a unique task's duplicate: the task that holds its slot, created false", Some(task_ref_schema()))
                .link("201", "read", "read_task", to_task.clone(), None)
                .link(
                    "201",
                    "claim",
                    "claim",
                    json!({ "ns": "$request.path.ns", "queue": "$request.path.queue" }),
                    None,
                ),
            post(enqueue),
        ),
        Route::at(
            wire::ENQUEUE_BATCH,
            Some("enqueue_batch"),
            queue_doc(Doc::new("enqueue_batch", "enqueue tasks at once, each created or found already there (uniqueness as for enqueue: keep or replace take no delays, debounce needs delay_ms at most max_delay_ms); one bad task enqueues none"))
                .keyed()
                .body(object(
                    json!({ "tasks": {
                        "type": "array", "items": new_task(), "minItems": 1,
                        "maxItems": tessera_store::limits::MAX_ENQUEUE_BATCH,
                    } }),
                    &["tasks"],
                ))
                .answers(
                    "201",
                    "each task's reference and whether it was created, in order",
                    Some(json!({ "type": "array", "items": { "type": "object", "required": ["task", "created"] } })),
                ),
            post(enqueue_batch),
        ),
        Route::new(
            Method::GET,
            "/v1/ns/{ns}/tasks",
            Some("list_tasks"),
            Doc::new("list_tasks", "a namespace's attempts in one state, a page at a time")
                .keyed()
                .path(NAMESPACE, "renders")
                .parameter_required(STATE, "state")
                .query(ORDER, "order")
                .query(TASK_CURSOR, "after")
                .query(TASKS_LIMIT, "limit")
                .answers(
                    "200",
                    "the attempts, and `next`: the `after` of the page after",
                    Some(json!({ "type": "object", "required": ["tasks"] })),
                ),
            get(list_tasks),
        ),
        Route::new(
            Method::GET,
            "/v1/ns/{ns}/tasks/{task}",
            Some("read_task"),
            version_query(task_doc(Doc::new("read_task", "a task: its brief, queue, attempts and leases")))
                .keyed()
                .answers("200", "the task", Some(json!({ "type": "object", "required": ["task"] }))),
            get(read_task),
        ),
        Route::new(
            Method::GET,
            "/v1/ns/{ns}/tasks/{task}/alternatives",
            Some("alternatives"),
            version_query(task_doc(Doc::new("alternatives", "the finished alternatives of a task: one receipt per done attempt, with outputs")))
                .keyed()
                .answers("200", "the receipts, in attempt order", Some(json!({ "type": "array" }))),
            get(alternatives),
        ),
        Route::new(
            Method::GET,
            "/v1/ns/{ns}/tasks/{task}/parents",
            Some("parent_alternatives"),
            version_query(task_doc(Doc::new("parent_alternatives", "what a task enqueued after others consumes: each parent, in the order stored, with its finished alternatives (one receipt per done attempt, with outputs)")))
                .keyed()
                .answers("200", "each parent with its receipts", Some(json!({ "type": "array" }))),
            get(parent_alternatives),
        ),
        Route::new(
            Method::GET,
            "/v1/ns/{ns}/tasks/{task}/attempts/{attempt}/receipt",
            Some("read_receipt"),
            version_query(
                task_doc(Doc::new("read_receipt", "the receipt of one attempt, with its output"))
                    .path(ATTEMPT, "1"),
            )
            .keyed()
            .answers("200", "the receipt", Some(json!({ "type": "object", "required": ["receipt"] }))),
            get(read_receipt),
        ),
        Route::new(
            Method::POST,
            "/v1/ns/{ns}/tasks/{task}/cancel",
            Some("cancel_task"),
            task_doc(Doc::new("cancel_task", "an operator's cancel: every attempt not yet final; its holder learns it at its next heartbeat or submit"))
                .keyed()
                .body(object(json!({ "version": VERSION.schema() }), &["version"]))
                .answers("200", "the attempts cancelled", Some(json!({ "type": "array", "items": { "type": "integer" } }))),
            post(cancel_task),
        ),
        Route::new(
            Method::POST,
            "/v1/ns/{ns}/tasks/{task}/retry",
            Some("retry_task"),
            task_doc(Doc::new("retry_task", "an operator's retry: every failed, discarded or cancelled attempt becomes ready again"))
                .keyed()
                .body(object(json!({ "version": VERSION.schema() }), &["version"]))
                .answers("200", "the attempts retried", Some(json!({ "type": "array", "items": { "type": "integer" } }))),
            post(retry_task),
        ),
        Route::new(
            Method::POST,
            "/v1/ns/{ns}/bulk/cancel",
            Some("cancel_tasks"),
            Doc::new("cancel_tasks", "an operator's cancel of every task with an attempt that matches a filter (queue, state, partition key, a range of when its state last changed: since inclusive, before exclusive, so a range that ends before it starts matches nothing), in batches of 200 tasks, each batch one audit row; a leased attempt's holder learns it at its next heartbeat or submit")
                .keyed()
                .path(NAMESPACE, "renders")
                .body(filter_schema())
                .answers("200", "how many tasks it cancelled", Some(changed_schema())),
            post(cancel_tasks),
        ),
        Route::new(
            Method::POST,
            "/v1/ns/{ns}/bulk/retry",
            Some("retry_tasks"),
            Doc::new("retry_tasks", "an operator's retry of every task with an attempt that matches a filter (queue, state, partition key, a range of when its state last changed: since inclusive, before exclusive, so a range that ends before it starts matches nothing), in batches of 200 tasks, each batch one audit row")
                .keyed()
                .path(NAMESPACE, "renders")
                .body(filter_schema())
                .answers("200", "how many tasks it retried", Some(changed_schema())),
            post(retry_tasks),
        ),
    ]
}

/// The store's brief and options of a new task, each field checked
/// against its limit.
fn unique_of(unique: Unique) -> Result<Uniqueness, ApiError> {
    let mut uniqueness = Uniqueness::new(UniqueKey::parse(&unique.key)?);
    if let Some(window) = unique.window_ms {
        uniqueness.window = Some(Duration::from_millis(
            UNIQUE_WINDOW_MS.integer(window)? as u64
        ));
    }
    if let Some(states) = unique.states {
        let states = limits::at_most("states", states, 8)?;
        uniqueness.states = states
            .iter()
            .map(|state| limits::state(state))
            .collect::<Result<Vec<_>, _>>()?
            .into();
    }
    let mode = unique.mode.as_deref().unwrap_or("keep");
    uniqueness.mode = limits::unique_mode(mode, unique.delay_ms, unique.max_delay_ms)?;
    Ok(uniqueness)
}

/// A new task of `namespace` as the store's brief and options, each
/// field checked against its limit.
pub(crate) fn task_parts(
    namespace: &Namespace,
    task: NewTask,
) -> Result<(Brief, EnqueueOptions), ApiError> {
    let mut options = EnqueueOptions::default();
    if let Some(id) = &task.id {
        options = options.with_task_id(TaskId::parse(id)?);
    }
    if let Some(version) = task.version {
        options = options.with_version(BriefVersion::new(VERSION.integer(version)? as u32)?);
    }
    if let Some(alternatives) = task.alternatives {
        options = options.with_alternatives(ALTERNATIVES.integer(alternatives)? as u16);
    }
    if let Some(priority) = task.priority {
        options = options.with_priority(PRIORITY.integer(priority)? as u8);
    }
    if let Some(tries) = task.max_tries {
        options = options.with_max_tries(MAX_TRIES_INPUT.integer(tries)? as u32);
    }
    if let Some(at) = task.not_before {
        options = options.with_not_before(at);
    }
    if let Some(ms) = task.lease_ms {
        options = options.with_lease_duration(Duration::from_millis(LEASE_MS.integer(ms)? as u64));
    }
    if let Some(at) = task.deadline {
        options = options.with_deadline(at);
    }
    if let Some(ms) = task.timeout_ms {
        options = options.with_timeout(Duration::from_millis(TASK_TIMEOUT_MS.integer(ms)? as u64));
    }
    if let Some(key) = &task.partition_key {
        options = options.with_partition_key(PartitionKey::parse(key)?);
    }
    if let Some(unique) = task.unique {
        options = options.with_unique(unique_of(unique)?);
    }
    let parents = limits::at_most("after", task.after.unwrap_or_default(), MAX_PARENTS)?
        .into_iter()
        .map(|parent| {
            let version = match parent.version {
                Some(version) => BriefVersion::new(VERSION.integer(version)? as u32)?,
                None => BriefVersion::FIRST,
            };
            Ok(TaskRef::new(
                namespace.clone(),
                TaskId::parse(&parent.id)?,
                version,
            ))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    options = options.after(parents);
    if let Some(rule) = &task.run_after {
        options = options.with_run_after(limits::run_after(rule)?);
    }
    Ok((Brief::Json(task.brief), options))
}

async fn enqueue(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
    JsonBody(request): JsonBody<NewTask>,
) -> Result<Response, ApiError> {
    let (ns, queue) = path(parts)?;
    let (ns, queue) = queue_names(&ns, &queue)?;
    let (brief, options) = task_parts(&ns, request)?;
    let enqueued = state
        .call(move |store| store.enqueue_one(&caller, &ns, &queue, &brief, &options))
        .await?;
    // The task's reference, and whether it was created: a unique task's
    // duplicate answers 200 with the task already there.
    let status = if enqueued.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let task = enqueued.task;
    let body = wire::EnqueuedTask {
        namespace: task.namespace,
        id: task.id,
        version: task.version,
        created: enqueued.created,
    };
    Ok((status, Json(body)).into_response())
}

async fn enqueue_batch(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
    JsonBody(request): JsonBody<NewTasks>,
) -> Result<Response, ApiError> {
    let (ns, queue) = path(parts)?;
    let (ns, queue) = queue_names(&ns, &queue)?;
    ENQUEUE_BATCH.integer(request.tasks.len() as i64)?;
    let tasks = (request.tasks.into_iter())
        .map(|task| task_parts(&ns, task))
        .collect::<Result<Vec<_>, _>>()?;
    let enqueued = state
        .call(move |store| store.enqueue_batch(&caller, &ns, &queue, &tasks))
        .await?;
    Ok((StatusCode::CREATED, Json(enqueued)).into_response())
}

/// `GET .../tasks`'s query.
#[derive(Deserialize)]
// Unknown query parameters are ignored: a cache-busting `_=…` or a
// tracking parameter changes nothing a route reads.
struct ListFields {
    state: String,
    order: Option<String>,
    after: Option<String>,
    limit: Option<i64>,
}

async fn list_tasks(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    ns: Result<Path<String>, PathRejection>,
    fields: Result<Query<ListFields>, QueryRejection>,
) -> Result<Response, ApiError> {
    let ns = Namespace::parse(&path(ns)?)?;
    let fields = query(fields)?;
    let mut listing = TaskQuery::new(limits::state(&fields.state)?);
    if let Some(order) = &fields.order {
        listing.order = limits::order(order)?;
    }
    if let Some(after) = &fields.after {
        listing.after = Some(TASK_CURSOR.cursor(after)?.parse()?);
    }
    if let Some(limit) = fields.limit {
        listing.limit = TASKS_LIMIT.integer(limit)? as usize;
    }
    let page = state
        .call(move |store| store.list_tasks(&caller, &ns, &listing))
        .await?;
    let next = page.next.map(|cursor| cursor.to_string());
    Ok(Json(json!({ "tasks": page.tasks, "next": next })).into_response())
}

/// A version in a query: the first when absent.
#[derive(Deserialize)]
// Unknown query parameters are ignored: a cache-busting `_=…` or a
// tracking parameter changes nothing a route reads.
struct VersionField {
    version: Option<i64>,
}

async fn read_task(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    task: Result<Path<(String, String)>, PathRejection>,
    fields: Result<Query<VersionField>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (ns, task) = path(task)?;
    let task = task_ref(&ns, &task, query(fields)?.version.unwrap_or(1))?;
    let view = state
        .call(move |store| store.read_task(&caller, &task))
        .await?;
    Ok(Json(view).into_response())
}

async fn alternatives(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    task: Result<Path<(String, String)>, PathRejection>,
    fields: Result<Query<VersionField>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (ns, task) = path(task)?;
    let task = task_ref(&ns, &task, query(fields)?.version.unwrap_or(1))?;
    let receipts = state
        .call(move |store| store.alternatives(&caller, &task))
        .await?;
    let receipts: Vec<Value> = receipts.iter().map(receipt_json).collect();
    Ok(Json(receipts).into_response())
}

async fn parent_alternatives(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    task: Result<Path<(String, String)>, PathRejection>,
    fields: Result<Query<VersionField>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (ns, task) = path(task)?;
    let task = task_ref(&ns, &task, query(fields)?.version.unwrap_or(1))?;
    let parents = state
        .call(move |store| store.parent_alternatives(&caller, &task))
        .await?;
    let parents: Vec<Value> = parents
        .iter()
        .map(|parent| {
            json!({
                "parent": parent.parent,
                "receipts": parent.receipts.iter().map(receipt_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(Json(parents).into_response())
}

/// A stored receipt as the routes answer it: its output as the JSON it
/// was submitted as (every submission over HTTP or MCP is JSON); output
/// bytes that are not JSON (a library's `Output::bytes`) as
/// `output_base64`, with `output` null.
pub(crate) fn receipt_json(stored: &tessera_store::StoredReceipt) -> Value {
    use base64::Engine;
    let mut value = json!({ "receipt": stored.receipt, "output": null });
    if let Some(bytes) = &stored.output {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(output) => value["output"] = output,
            Err(_) => {
                value["output_base64"] =
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes));
            }
        }
    }
    value
}

async fn read_receipt(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String, i64)>, PathRejection>,
    fields: Result<Query<VersionField>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (ns, task, attempt) = path(parts)?;
    let task = task_ref(&ns, &task, query(fields)?.version.unwrap_or(1))?;
    let attempt = AttemptNumber::new(ATTEMPT.integer(attempt)? as u16)?;
    let receipt = state
        .call(move |store| store.read_receipt(&caller, &task, attempt))
        .await?;
    Ok(Json(receipt_json(&receipt)).into_response())
}

/// The body of an operator's cancel or retry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VersionBody {
    version: i64,
}

async fn cancel_task(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    task: Result<Path<(String, String)>, PathRejection>,
    JsonBody(request): JsonBody<VersionBody>,
) -> Result<Response, ApiError> {
    let (ns, task) = path(task)?;
    let task = task_ref(&ns, &task, request.version)?;
    let cancelled = state
        .call(move |store| store.cancel_task(&caller, &task))
        .await?;
    Ok(Json(cancelled).into_response())
}

async fn retry_task(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    task: Result<Path<(String, String)>, PathRejection>,
    JsonBody(request): JsonBody<VersionBody>,
) -> Result<Response, ApiError> {
    let (ns, task) = path(task)?;
    let task = task_ref(&ns, &task, request.version)?;
    let retried = state
        .call(move |store| store.retry_task(&caller, &task))
        .await?;
    Ok(Json(retried).into_response())
}

/// A bulk action's filter, as its schema says.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterBody {
    queue: Option<String>,
    state: Option<String>,
    partition_key: Option<String>,
    changed_since: Option<DateTime<Utc>>,
    changed_before: Option<DateTime<Utc>>,
}

impl FilterBody {
    fn filter(self) -> Result<BulkFilter, ApiError> {
        let mut filter = BulkFilter::default();
        if let Some(queue) = &self.queue {
            filter = filter.with_queue(QueueName::parse(queue)?);
        }
        if let Some(state) = &self.state {
            filter = filter.with_state(limits::state(state)?);
        }
        if let Some(key) = &self.partition_key {
            filter = filter.with_partition_key(PartitionKey::parse(key)?);
        }
        filter.changed_since = self.changed_since;
        filter.changed_before = self.changed_before;
        Ok(filter)
    }
}

async fn cancel_tasks(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    ns: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<FilterBody>,
) -> Result<Response, ApiError> {
    let ns = Namespace::parse(&path(ns)?)?;
    let filter = request.filter()?;
    let changed = state
        .call(move |store| store.cancel_tasks(&caller, &ns, &filter))
        .await?;
    Ok(Json(json!({ "changed": changed })).into_response())
}

async fn retry_tasks(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    ns: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<FilterBody>,
) -> Result<Response, ApiError> {
    let ns = Namespace::parse(&path(ns)?)?;
    let filter = request.filter()?;
    let changed = state
        .call(move |store| store.retry_tasks(&caller, &ns, &filter))
        .await?;
    Ok(Json(json!({ "changed": changed })).into_response())
}
