//! Periodic schedules: put (create or replace), read, list, pause, resume
//! and delete one, and an admin's scheduler pass.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use serde::Deserialize;
use serde_json::{Value, json};
use tessera_store::{
    Brief, BriefVersion, Error, Namespace, QueueName, ScheduleName, ScheduleSpec, TaskSpec,
};

use super::{AppState, Route, object};
use crate::auth::Authenticated;
use crate::errors::{ApiError, JsonBody, path, query};
use crate::limits::{
    ALTERNATIVES, CRON, MAX_TRIES_INPUT, NAMESPACE, PRIORITY, QUEUE, SCHEDULE, SCHEDULES_LIMIT,
    VERSION, ZONE, any_value,
};
use crate::openapi::Doc;

/// A route's doc path parameters for a schedule: namespace and name.
fn schedule_doc(doc: Doc) -> Doc {
    doc.path(NAMESPACE, "reports").path(SCHEDULE, "nightly")
}

/// A schedule as the routes answer with it.
fn view_schema() -> Value {
    json!({
        "type": "object",
        "required": ["namespace", "name", "queue", "schedule", "brief", "paused"],
    })
}

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route::new(
            Method::PUT,
            "/v1/ns/{ns}/schedules/{name}",
            Some("put_schedule"),
            schedule_doc(Doc::new(
                "put_schedule",
                "create or replace a periodic schedule: a cron expression in a time zone, the queue and the brief each fire enqueues; a replacement's run-ats count from now; a cron expression croner does not read, or a zone that is not an IANA name, is 400 invalid_input",
            ))
            .keyed()
            .body(object(
                json!({
                    "queue": QUEUE.schema(),
                    "cron": CRON.schema(),
                    "zone": ZONE.schema(),
                    "brief": any_value(),
                    "version": VERSION.schema(),
                    "alternatives": ALTERNATIVES.schema(),
                    "priority": PRIORITY.schema(),
                    "max_tries": MAX_TRIES_INPUT.schema(),
                }),
                &["queue", "cron", "brief"],
            ))
            .answers("201", "the schedule, created", Some(view_schema()))
            .answers("200", "the schedule, replaced", Some(view_schema()))
            .link(
                "201",
                "read",
                "read_schedule",
                json!({ "ns": "$request.path.ns", "name": "$request.path.name" }),
                None,
            ),
            put(put_schedule),
        ),
        Route::new(
            Method::GET,
            "/v1/ns/{ns}/schedules/{name}",
            Some("read_schedule"),
            schedule_doc(Doc::new(
                "read_schedule",
                "a schedule, with its last run-at fired and the next one due",
            ))
            .keyed()
            .answers("200", "the schedule", Some(view_schema())),
            get(read_schedule),
        ),
        Route::new(
            Method::DELETE,
            "/v1/ns/{ns}/schedules/{name}",
            Some("delete_schedule"),
            schedule_doc(Doc::new(
                "delete_schedule",
                "delete a schedule; tasks it fired stay",
            ))
            .keyed()
            .answers("204", "deleted", None),
            delete(delete_schedule),
        ),
        Route::new(
            Method::GET,
            "/v1/ns/{ns}/schedules",
            Some("list_schedules"),
            Doc::new("list_schedules", "a namespace's schedules in name order, a page at a time")
                .keyed()
                .path(NAMESPACE, "reports")
                .query(SCHEDULE, "after")
                .query(SCHEDULES_LIMIT, "limit")
                .answers(
                    "200",
                    "the schedules, and `next`: the `after` of the page after",
                    Some(json!({ "type": "object", "required": ["schedules"] })),
                ),
            get(list_schedules),
        ),
        Route::new(
            Method::POST,
            "/v1/ns/{ns}/schedules/{name}/pause",
            Some("pause_schedule"),
            schedule_doc(Doc::new(
                "pause_schedule",
                "pause a schedule: nothing fires until it is resumed, and the run-ats that pass meanwhile are skipped",
            ))
            .keyed()
            .answers("200", "the schedule, paused", Some(view_schema())),
            post(pause_schedule),
        ),
        Route::new(
            Method::POST,
            "/v1/ns/{ns}/schedules/{name}/resume",
            Some("resume_schedule"),
            schedule_doc(Doc::new(
                "resume_schedule",
                "resume a paused schedule; its run-ats count from now",
            ))
            .keyed()
            .answers("200", "the schedule", Some(view_schema())),
            post(resume_schedule),
        ),
        Route::new(
            Method::POST,
            "/v1/schedules/fire",
            Some("fire_due_schedules"),
            Doc::new(
                "fire_due_schedules",
                "an admin's scheduler pass now: fires every schedule with a run-at due, each once however many schedulers run",
            )
            .keyed()
            .answers(
                "200",
                "the fires this pass made",
                Some(json!({ "type": "array", "items": { "type": "object", "required": ["namespace", "schedule", "run_at", "task"] } })),
            ),
            post(fire_due_schedules),
        ),
    ]
}

/// A namespace and schedule name from a path.
fn schedule_names(ns: &str, name: &str) -> Result<(Namespace, ScheduleName), ApiError> {
    Ok((Namespace::parse(ns)?, ScheduleName::parse(name)?))
}

/// `PUT /v1/ns/{ns}/schedules/{name}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSchedule {
    queue: String,
    cron: String,
    zone: Option<String>,
    brief: Value,
    version: Option<i64>,
    alternatives: Option<i64>,
    priority: Option<i64>,
    max_tries: Option<i64>,
}

impl NewSchedule {
    fn into_spec(self) -> Result<ScheduleSpec, ApiError> {
        let zone = self.zone.unwrap_or_else(|| "UTC".to_owned());
        let mut spec = TaskSpec::default();
        if let Some(alternatives) = self.alternatives {
            spec.alternatives = ALTERNATIVES.integer(alternatives)? as u16;
        }
        if let Some(priority) = self.priority {
            spec.priority = PRIORITY.integer(priority)? as u8;
        }
        if let Some(tries) = self.max_tries {
            spec.max_tries = MAX_TRIES_INPUT.integer(tries)? as u32;
        }
        let mut schedule = ScheduleSpec::new(
            QueueName::parse(&self.queue)?,
            CRON.text(&self.cron)?,
            ZONE.text(&zone)?,
            Brief::Json(self.brief),
        )
        .with_spec(spec);
        if let Some(version) = self.version {
            schedule = schedule.with_version(BriefVersion::new(VERSION.integer(version)? as u32)?);
        }
        Ok(schedule)
    }
}

async fn put_schedule(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
    JsonBody(request): JsonBody<NewSchedule>,
) -> Result<Response, ApiError> {
    let (ns, name) = path(parts)?;
    let (ns, name) = schedule_names(&ns, &name)?;
    let spec = request.into_spec()?;
    let (view, created) = state
        .call(move |store| store.put_schedule(&caller, &ns, &name, &spec))
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(view)).into_response())
}

async fn read_schedule(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (ns, name) = path(parts)?;
    let (ns, name) = schedule_names(&ns, &name)?;
    let view = state
        .call(move |store| store.read_schedule(&caller, &ns, &name))
        .await?;
    Ok(Json(view).into_response())
}

async fn delete_schedule(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (ns, name) = path(parts)?;
    let (ns, name) = schedule_names(&ns, &name)?;
    state
        .call(move |store| store.delete_schedule(&caller, &ns, &name))
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET .../schedules`'s query.
#[derive(Deserialize)]
// Unknown query parameters are ignored: a cache-busting `_=…` or a
// tracking parameter changes nothing a route reads.
struct ListFields {
    after: Option<String>,
    limit: Option<i64>,
}

async fn list_schedules(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    ns: Result<Path<String>, PathRejection>,
    fields: Result<Query<ListFields>, QueryRejection>,
) -> Result<Response, ApiError> {
    let ns = Namespace::parse(&path(ns)?)?;
    let fields = query(fields)?;
    let after = fields
        .after
        .as_deref()
        .map(ScheduleName::parse)
        .transpose()?;
    let limit = match fields.limit {
        Some(limit) => SCHEDULES_LIMIT.integer(limit)? as usize,
        None => tessera_store::limits::MAX_SCHEDULES_LISTED,
    };
    let page = state
        .call(move |store| store.list_schedules(&caller, &ns, after.as_ref(), limit))
        .await?;
    Ok(Json(page).into_response())
}

async fn pause_schedule(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (ns, name) = path(parts)?;
    let (ns, name) = schedule_names(&ns, &name)?;
    let view = state
        .call(move |store| store.pause_schedule(&caller, &ns, &name))
        .await?;
    Ok(Json(view).into_response())
}

async fn resume_schedule(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (ns, name) = path(parts)?;
    let (ns, name) = schedule_names(&ns, &name)?;
    let view = state
        .call(move |store| store.resume_schedule(&caller, &ns, &name))
        .await?;
    Ok(Json(view).into_response())
}

/// An admin's pass: the server's own scheduler makes them on its timer,
/// and any number may run at once.
async fn fire_due_schedules(
    State(state): State<Arc<AppState>>,
    Authenticated(caller): Authenticated,
) -> Result<Response, ApiError> {
    if !caller.is_admin() {
        return Err(ApiError::Store(Error::Forbidden {
            reason: "a scheduler pass needs an admin key".to_owned(),
        }));
    }
    let fired = state.call(|store| store.fire_due_schedules()).await?;
    Ok(Json(fired).into_response())
}
