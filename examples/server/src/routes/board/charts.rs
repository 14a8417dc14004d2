//! The board's charts, `/board/charts`: the last hour, minute by minute,
//! as SVG drawn on the server (no script): done and failed per minute,
//! attempts by state, claim waits (median and 99th percentile) and the
//! concurrency limit.
//!
//! They draw the server's [`History`](crate::history::History), which
//! lives in memory and is fed by what the server sees anyway (claims, the
//! snapshots it serves or finds in the store's cache), so a chart costs no
//! storage read beyond the key's check and the snapshot, and writes
//! nothing. A server restarted an hour ago has an hour; one started a
//! minute ago has a minute.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use axum::routing::get;
use chrono::{DateTime, Utc};

use super::super::{AppState, Route};
use super::html::{escape, page};
use super::key::caller;
use super::{NsQuery, ask_for_key, namespace_of};
use crate::errors::{ApiError, query};
use crate::history::Series;
use crate::openapi::Doc;

pub(super) fn routes() -> Vec<Route> {
    let ns = crate::limits::Input {
        name: "ns",
        ..crate::limits::NAMESPACE
    };
    vec![Route::new(
        Method::GET,
        "/board/charts",
        Some("health"),
        Doc::new(
            "board_charts",
            "the board's charts of the last hour, from the server's memory: done and failed per minute, attempts by state, claim wait p50 and p99, the concurrency limit; SVG in HTML, with the board's key",
        )
        .key_optional()
        .query(ns, "ns")
        .answers("200", "an HTML page", None),
        get(view),
    )]
}

async fn view(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    fields: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let fields = query(fields)?;
    let Some(caller) = caller(&state, &headers).await? else {
        return ask_for_key(&state, "charts", fields.ns.as_deref());
    };
    let Some(namespace) = namespace_of(&state, &caller, fields.ns.as_deref())? else {
        return Ok(page(
            "charts",
            None,
            true,
            "<p class=\"note\">Add <code>?ns=NAME</code>.</p>",
        ));
    };
    // The namespace's snapshot (from the store's cache while fresh): the
    // grant's check, and this minute's counts.
    let ns = namespace.clone();
    let snapshot = state.call(move |store| store.health(&caller, &ns)).await?;
    let mut series = None;
    state.remember(|history, now| {
        history.snapshot(now, &snapshot);
        series = Some(history.series(&namespace, now));
    });
    let series = series.expect("remember runs its record");
    Ok(page("charts", Some(&namespace), true, &render(&series)))
}

/// One line of a chart: its name, colour and values.
struct Line<'a> {
    name: &'a str,
    color: &'a str,
    values: Vec<Option<f64>>,
}

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 150.0;
const LEFT: f64 = 48.0;
const BOTTOM: f64 = 20.0;

/// A line chart of `lines` over `minutes`, in SVG: each run of minutes
/// with values a polyline, each value a point carrying its minute and
/// value (`data-series`, `data-minute`, `data-value`) and a tooltip.
fn chart(title: &str, unit: &str, minutes: &[DateTime<Utc>], lines: &[Line<'_>]) -> String {
    let top = lines
        .iter()
        .flat_map(|line| line.values.iter().flatten())
        .fold(0.0_f64, |top, value| top.max(*value))
        .max(1.0);
    let steps = minutes.len().saturating_sub(1).max(1) as f64;
    let x = |index: usize| LEFT + (WIDTH - LEFT - 8.0) * index as f64 / steps;
    let y = |value: f64| 8.0 + (HEIGHT - BOTTOM - 8.0) * (1.0 - value / top);
    let mut svg = format!(
        "<svg class=\"chart\" data-chart=\"{id}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" role=\"img\" aria-label=\"{title}\">\
         <line x1=\"{LEFT}\" y1=\"{base}\" x2=\"{WIDTH}\" y2=\"{base}\" stroke=\"#d8dee4\"/>\
         <text x=\"4\" y=\"14\" font-size=\"11\">{top}{unit}</text><text x=\"4\" y=\"{base}\" font-size=\"11\">0</text>",
        id = escape(title),
        title = escape(title),
        base = HEIGHT - BOTTOM,
        top = format_value(top),
        unit = escape(unit),
    );
    if let (Some(first), Some(last)) = (minutes.first(), minutes.last()) {
        svg.push_str(&format!(
            "<text x=\"{LEFT}\" y=\"{HEIGHT}\" font-size=\"11\">{}</text><text x=\"{}\" y=\"{HEIGHT}\" font-size=\"11\" text-anchor=\"end\">{} UTC</text>",
            first.format("%H:%M"),
            WIDTH - 4.0,
            last.format("%H:%M"),
        ));
    }
    for line in lines {
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        let mut points = String::new();
        for (index, value) in line.values.iter().enumerate() {
            match value {
                Some(value) => {
                    let (px, py) = (x(index), y(*value));
                    runs.last_mut().expect("a run").push((px, py));
                    points.push_str(&format!(
                        "<circle cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"2\" fill=\"{color}\" data-series=\"{name}\" data-minute=\"{minute}\" data-value=\"{value}\"><title>{minute} {name}: {value}{unit}</title></circle>",
                        color = line.color,
                        name = escape(line.name),
                        minute = minutes[index].format("%H:%M"),
                        value = format_value(*value),
                        unit = escape(unit),
                    ));
                }
                None => runs.push(Vec::new()),
            }
        }
        for run in runs.iter().filter(|run| run.len() > 1) {
            let path: Vec<String> = run
                .iter()
                .map(|(px, py)| format!("{px:.1},{py:.1}"))
                .collect();
            svg.push_str(&format!(
                "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>",
                line.color,
                path.join(" ")
            ));
        }
        svg.push_str(&points);
    }
    svg.push_str("</svg>");
    let legend: String = lines
        .iter()
        .map(|line| {
            format!(
                "<span style=\"color:{}\">■</span> {} ",
                line.color,
                escape(line.name)
            )
        })
        .collect();
    format!(
        "<figure><figcaption>{} <span class=\"small\">{legend}</span></figcaption>{svg}</figure>",
        escape(title)
    )
}

/// A value as a chart labels it: whole numbers without a fraction.
fn format_value(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

fn render(series: &Series) -> String {
    let whole = |values: &[Option<u64>]| -> Vec<Option<f64>> {
        values.iter().map(|value| value.map(|v| v as f64)).collect()
    };
    let state = |field: fn(&tessera_store::StateCounts) -> u64| -> Vec<Option<f64>> {
        series
            .counts
            .iter()
            .map(|counts| counts.as_ref().map(|counts| field(counts) as f64))
            .collect()
    };
    let minutes = &series.minutes;
    let throughput = chart(
        "done and failed per minute",
        "",
        minutes,
        &[
            Line {
                name: "done",
                color: "#1a7f37",
                values: whole(&series.done),
            },
            Line {
                name: "failed",
                color: "#cf222e",
                values: whole(&series.failed),
            },
        ],
    );
    let depth = chart(
        "attempts by state",
        "",
        minutes,
        &[
            Line {
                name: "ready",
                color: "#0969da",
                values: state(|counts| counts.ready),
            },
            Line {
                name: "leased",
                color: "#8250df",
                values: state(|counts| counts.leased),
            },
            Line {
                name: "backoff",
                color: "#bf8700",
                values: state(|counts| counts.backoff),
            },
            Line {
                name: "scheduled",
                color: "#57606a",
                values: state(|counts| counts.scheduled),
            },
            Line {
                name: "discarded",
                color: "#cf222e",
                values: state(|counts| counts.discarded),
            },
        ],
    );
    let waits = chart(
        "claim wait for admission",
        " ms",
        minutes,
        &[
            Line {
                name: "p50",
                color: "#0969da",
                values: whole(&series.wait_p50),
            },
            Line {
                name: "p99",
                color: "#cf222e",
                values: whole(&series.wait_p99),
            },
        ],
    );
    let limit = chart(
        "concurrency limit",
        "",
        minutes,
        &[Line {
            name: "limit",
            color: "#1a7f37",
            values: series
                .limit
                .iter()
                .map(|limit| limit.map(f64::from))
                .collect(),
        }],
    );
    format!(
        r#"<section class="wide charts">
<h2>The last hour</h2>
<p class="small">Minute by minute, from this server's memory (nothing is read from storage for them): counts as of each minute's last snapshot seen, done and failed as their change from the minute before, claim waits as the bounds of fixed buckets (1, 2, 5, 10, 20, 50 ms … 60 s). A gap is a minute this server saw nothing of.</p>
{throughput}
{depth}
{waits}
{limit}
</section>"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{History, MINUTES};
    use tessera_store::{HealthSnapshot, Namespace, StateCounts};

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn a_chart_draws_known_data() {
        let mut history = History::default();
        let namespace = Namespace::parse("renders").unwrap();
        for (minute, done, ready) in [("12:00", 10, 7), ("12:01", 14, 5), ("12:02", 20, 2)] {
            let now = at(&format!("2026-12-07T{minute}:30Z"));
            history.snapshot(
                now,
                &HealthSnapshot {
                    namespace: namespace.clone(),
                    taken_at: now,
                    attempts: StateCounts {
                        done,
                        ready,
                        ..StateCounts::default()
                    },
                    expired_leases: 0,
                    queues: Vec::new(),
                    depths: Vec::new(),
                },
            );
            history.claim(now, std::time::Duration::from_millis(4), 32);
        }
        let series = history.series(&namespace, at("2026-12-07T12:02:59Z"));
        assert_eq!(series.minutes.len(), MINUTES);
        let page = render(&series);
        // Four charts, each an SVG.
        assert_eq!(page.matches("<svg class=\"chart\"").count(), 4);
        // Done per minute: 4 then 6; the first minute has none before it.
        assert!(page.contains("data-series=\"done\" data-minute=\"12:01\" data-value=\"4\""));
        assert!(page.contains("data-series=\"done\" data-minute=\"12:02\" data-value=\"6\""));
        assert!(!page.contains("data-series=\"done\" data-minute=\"12:00\""));
        // Ready depth by minute, the wait's bucket, the limit.
        assert!(page.contains("data-series=\"ready\" data-minute=\"12:00\" data-value=\"7\""));
        assert!(page.contains("data-series=\"ready\" data-minute=\"12:02\" data-value=\"2\""));
        assert!(page.contains("data-series=\"p99\" data-minute=\"12:02\" data-value=\"5\""));
        assert!(page.contains("data-series=\"limit\" data-minute=\"12:02\" data-value=\"32\""));
        // The three ready points make one line; a chart's scale tops at
        // its largest value.
        assert_eq!(
            page.matches("<polyline fill=\"none\" stroke=\"#0969da\"")
                .count(),
            2,
            "ready and p50"
        );
        assert!(page.contains(">7</text>"));
        assert!(page.contains(">12:02 UTC</text>"));
    }
}
