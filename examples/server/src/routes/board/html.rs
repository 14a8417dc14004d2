//! What every board page shares: escaping, ages, the page's frame and
//! its navigation.

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use tessera_store::Namespace;

/// `text` with HTML's special characters escaped: everything a page shows
/// from the store or a request goes through it.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` made safe for a URL's query value (and then for an attribute).
pub(super) fn query_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(byte));
            }
            byte => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// How long ago `since` was, in an operator's words: `42 s`, `3 min 5 s`,
/// `2 h 10 min`, `4 d 3 h`.
pub(super) fn age(since: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let seconds = (now - since).num_seconds().max(0);
    let (minutes, hours, days) = (seconds / 60, seconds / 3600, seconds / 86_400);
    if seconds < 60 {
        format!("{seconds} s")
    } else if minutes < 60 {
        format!("{minutes} min {} s", seconds % 60)
    } else if hours < 24 {
        format!("{hours} h {} min", minutes % 60)
    } else {
        format!("{days} d {} h", hours % 24)
    }
}

/// A time as the board shows it, with its age: `<time>` in RFC 3339.
pub(super) fn time_with_age(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    format!(
        "<time datetime=\"{at}\" title=\"{at}\">{} ago</time>",
        age(at, now),
        at = at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}

/// A time to come as the board shows it: `in 4 min 10 s`, or its age
/// once it has passed.
pub(super) fn time_to_come(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    if at <= now {
        return time_with_age(at, now);
    }
    format!(
        "<time datetime=\"{at}\" title=\"{at}\">in {}</time>",
        age(now, at),
        at = at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}

/// The keyed views, for the navigation: path and label.
const VIEWS: &[(&str, &str)] = &[
    ("/board", "overview"),
    ("/board/queues", "queues"),
    ("/board/tasks", "tasks"),
    ("/board/schedules", "schedules"),
    ("/board/charts", "charts"),
];

/// The navigation between the board's views of `namespace`, and the key's
/// form or the button that forgets it.
pub(super) fn navigation(namespace: Option<&Namespace>, keyed: bool) -> String {
    let ns = namespace.map(|ns| query_value(ns.as_str()));
    let links: String = VIEWS
        .iter()
        .map(|(path, label)| match &ns {
            Some(ns) => format!("<a href=\"{path}?ns={ns}\">{label}</a> "),
            None => format!("<a href=\"{path}\">{label}</a> "),
        })
        .collect();
    let ns_field = namespace
        .map(|ns| {
            format!(
                "<input type=\"hidden\" name=\"ns\" value=\"{}\">",
                escape(ns.as_str())
            )
        })
        .unwrap_or_default();
    let key = if keyed {
        "<form method=\"post\" action=\"/board/forget\" class=\"inline\"><button>Forget key</button></form>"
            .to_owned()
    } else {
        format!(
            "<form method=\"post\" action=\"/board/key\" class=\"inline\" id=\"key-form\">{ns_field}<label>Key <input type=\"password\" name=\"key\" id=\"key\" autocomplete=\"off\" required></label> <button>Use key</button></form>"
        )
    };
    format!("<nav class=\"views\">{links}{key}</nav>")
}

/// A whole page: its title, the namespace it shows, and its body.
pub(super) fn page(
    title: &str,
    namespace: Option<&Namespace>,
    keyed: bool,
    body: &str,
) -> Response {
    let name = namespace.map(|ns| escape(ns.as_str())).unwrap_or_default();
    let title = escape(title);
    let navigation = navigation(namespace, keyed);
    let text = format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Tessera board · {title} · {name}</title>
<link rel="stylesheet" href="/board/board.css">
</head>
<body data-namespace="{name}" data-view="{title}">
<header>
<h1>Tessera <span class="namespace">{name}</span> · {title}</h1>
{navigation}
</header>
<main class="view">
{body}
</main>
</body>
</html>
"#
    );
    html(text)
}

/// An HTML answer that no cache keeps.
pub(super) fn html(text: String) -> Response {
    (
        [
            (CONTENT_TYPE, "text/html; charset=utf-8"),
            (CACHE_CONTROL, "no-store"),
        ],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            escape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(query_value("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }

    #[test]
    fn ages_read_as_an_operator_says_them() {
        let now = DateTime::parse_from_rfc3339("2026-12-07T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let ago = |seconds| age(now - chrono::TimeDelta::seconds(seconds), now);
        assert_eq!(ago(0), "0 s");
        assert_eq!(ago(59), "59 s");
        assert_eq!(ago(185), "3 min 5 s");
        assert_eq!(ago(2 * 3600 + 600), "2 h 10 min");
        assert_eq!(ago(4 * 86_400 + 3 * 3600), "4 d 3 h");
        // A time ahead of the clock (another server's) is no age at all.
        assert_eq!(ago(-30), "0 s");
    }
}
