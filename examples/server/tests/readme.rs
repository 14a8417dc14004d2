//! The READMEs' tables held to what they describe: the route table to the
//! server's routes and its document, the flag table to the program's
//! `--help`, and the workspace README's crate table to the workspace's
//! members and bench programs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

const README: &str = include_str!("../README.md");
const WORKSPACE_README: &str = include_str!("../../../README.md");
const WORKSPACE_MANIFEST: &str = include_str!("../../../Cargo.toml");

/// The rows of the Markdown table under the header row `header`, each as
/// its cells, trimmed.
fn table(text: &str, header: &str) -> Vec<Vec<String>> {
    let mut lines = text.lines().skip_while(|line| line.trim() != header);
    assert!(lines.next().is_some(), "no table headed {header:?}");
    assert!(
        lines.next().is_some_and(|line| line.starts_with("| ---")),
        "the table headed {header:?} has no separator row"
    );
    let rows: Vec<_> = lines
        .take_while(|line| line.starts_with('|'))
        .map(cells)
        .collect();
    assert!(!rows.is_empty(), "the table headed {header:?} has no rows");
    rows
}

/// A row's cells: split at each `|` that is not escaped as `\|`.
fn cells(line: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut characters = line.trim().chars().peekable();
    while let Some(character) = characters.next() {
        match character {
            '\\' if characters.peek() == Some(&'|') => {
                characters.next();
                cells.last_mut().expect("a cell").push('|');
            }
            '|' => cells.push(String::new()),
            _ => cells.last_mut().expect("a cell").push(character),
        }
    }
    // The empty cells before the first `|` and after the last.
    cells.remove(0);
    cells.pop();
    cells.iter().map(|cell| cell.trim().to_owned()).collect()
}

/// The text of a cell that is one code span: `` `text` ``.
fn code(cell: &str) -> &str {
    cell.strip_prefix('`')
        .and_then(|cell| cell.strip_suffix('`'))
        .unwrap_or_else(|| panic!("{cell:?} is not one code span"))
}

/// One row of the route table: `METHOD path?query&names`.
#[derive(Debug)]
struct RouteRow {
    method: String,
    path: String,
    query: BTreeSet<String>,
    operation: String,
}

fn route_rows() -> Vec<RouteRow> {
    table(README, "| route | store operation |")
        .into_iter()
        .map(|row| {
            assert_eq!(row.len(), 2, "a route row has two cells: {row:?}");
            let route = code(&row[0]);
            let (method, target) = route
                .split_once(' ')
                .unwrap_or_else(|| panic!("{route:?} is not `METHOD path`"));
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            RouteRow {
                method: method.to_owned(),
                path: path.to_owned(),
                query: query
                    .split('&')
                    .filter(|name| !name.is_empty())
                    .map(str::to_owned)
                    .collect(),
                operation: row[1].clone(),
            }
        })
        .collect()
}

/// Every route the server serves, as `METHOD path`.
fn served() -> BTreeSet<String> {
    tessera_server::routes()
        .iter()
        .map(|route| format!("{} {}", route.method, route.path))
        .collect()
}

/// Every route the README's table names, as `METHOD path`.
fn documented() -> Vec<String> {
    route_rows()
        .iter()
        .map(|row| format!("{} {}", row.method, row.path))
        .collect()
}

#[test]
fn every_route_is_in_the_route_table() {
    let documented: BTreeSet<_> = documented().into_iter().collect();
    let missing: Vec<_> = served().difference(&documented).cloned().collect();
    assert!(
        missing.is_empty(),
        "routes the README's route table lacks: {missing:#?}"
    );
}

#[test]
fn every_route_table_row_is_a_route_named_once() {
    let served = served();
    let documented = documented();
    let unknown: Vec<_> = (documented.iter())
        .filter(|route| !served.contains(*route))
        .collect();
    assert!(
        unknown.is_empty(),
        "rows of the README's route table the server does not serve: {unknown:#?}"
    );
    let mut seen = BTreeSet::new();
    let twice: Vec<_> = (documented.iter())
        .filter(|route| !seen.insert(*route))
        .collect();
    assert!(twice.is_empty(), "routes named twice: {twice:#?}");
}

#[test]
fn each_route_row_names_its_store_operation() {
    let rows = route_rows();
    for route in tessera_server::routes() {
        let Some(operation) = route.operation else {
            continue;
        };
        let Some(row) =
            (rows.iter()).find(|row| row.method == route.method.as_str() && row.path == route.path)
        else {
            continue; // every_route_is_in_the_route_table names it
        };
        assert!(
            row.operation.starts_with(&format!("`{operation}`")),
            "the row of {} {} begins with {:?}, not `{operation}`",
            route.method,
            route.path,
            row.operation,
        );
    }
}

#[test]
fn each_route_row_lists_its_query_parameters() {
    let document = tessera_server::document();
    for row in route_rows() {
        let Some(operation) = document["paths"][&row.path].get(row.method.to_lowercase()) else {
            continue; // every_route_table_row_is_a_route_named_once names it
        };
        let query: BTreeSet<String> = (operation["parameters"].as_array().into_iter().flatten())
            .filter(|parameter| parameter["in"] == "query")
            .map(|parameter| parameter["name"].as_str().expect("a name").to_owned())
            .collect();
        assert_eq!(
            row.query, query,
            "the query of {} {} in the README, and in the document",
            row.method, row.path
        );
    }
}

/// Every long flag `--help` shows but `--help` and `--version`, and
/// whether it takes a value.
fn flags_of_help() -> BTreeMap<String, bool> {
    let output = Command::new(env!("CARGO_BIN_EXE_tessera-server"))
        .arg("--help")
        // A `TESSERA_*` variable of the test's environment would show in
        // the help as a default; none is wanted here.
        .env_clear()
        .output()
        .expect("tessera-server --help runs");
    assert!(output.status.success(), "tessera-server --help fails");
    let help = String::from_utf8(output.stdout).expect("the help is UTF-8");
    let flags: BTreeMap<_, _> = help
        .lines()
        // An option's line is indented less than the text that describes it.
        .filter(|line| line.starts_with("  ") && !line.starts_with("          "))
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("-h, ").unwrap_or(line);
            let line = line.strip_prefix("-V, ").unwrap_or(line);
            let flag = line.split_whitespace().next()?;
            flag.starts_with("--")
                .then(|| (flag.to_owned(), line.contains('<')))
        })
        .filter(|(flag, _)| flag != "--help" && flag != "--version")
        .collect();
    assert!(
        flags.contains_key("--port"),
        "--port is not among the flags read from the help: {flags:?}\n{help}"
    );
    flags
}

/// Every flag of the README's flag table, and whether its row shows a
/// value after it.
fn flags_of_readme() -> Vec<(String, bool)> {
    table(README, "| flag | what |")
        .into_iter()
        .map(|row| {
            assert_eq!(row.len(), 2, "a flag row has two cells: {row:?}");
            let usage = code(&row[0]);
            let mut words = usage.split_whitespace();
            let flag = words.next().expect("a flag");
            assert!(flag.starts_with("--"), "{usage:?} is not a `--flag`");
            (flag.to_owned(), words.next().is_some())
        })
        .collect()
}

#[test]
fn every_flag_is_in_the_flag_table() {
    let documented: BTreeMap<_, _> = flags_of_readme().into_iter().collect();
    for (flag, takes_value) in flags_of_help() {
        let Some(&shows_value) = documented.get(&flag) else {
            panic!("the README's flag table lacks {flag}");
        };
        assert_eq!(
            shows_value, takes_value,
            "{flag}: the README's row shows a value ({shows_value}), the flag takes one ({takes_value})"
        );
    }
}

#[test]
fn every_flag_table_row_is_a_flag_named_once() {
    let accepted = flags_of_help();
    let mut seen = BTreeSet::new();
    for (flag, _) in flags_of_readme() {
        assert!(
            accepted.contains_key(&flag),
            "the README's flag table has {flag}, which tessera-server does not take"
        );
        assert!(seen.insert(flag.clone()), "{flag} is named twice");
    }
}

/// The workspace's members, from its manifest's `members = [...]`.
fn workspace_members() -> Vec<&'static str> {
    let (_, list) = WORKSPACE_MANIFEST
        .split_once("\nmembers = [")
        .expect("the workspace's members");
    let (list, _) = list.split_once(']').expect("the members' end");
    let members: Vec<_> = list
        .split(',')
        .map(|member| member.trim().trim_matches('"'))
        .filter(|member| !member.is_empty())
        .collect();
    assert!(members.contains(&"tessera-store"), "members: {members:?}");
    members
}

fn crate_table() -> Vec<Vec<String>> {
    table(WORKSPACE_README, "| crate | what it is |")
}

#[test]
fn every_workspace_member_is_in_the_crate_table() {
    let rows = crate_table();
    let members = workspace_members();
    for member in &members {
        // A crate in a folder of another (`examples/server`) may be named
        // in its parent's row.
        let named =
            |row: &Vec<String>| row.iter().any(|cell| cell.contains(&format!("`{member}`")));
        assert!(
            rows.iter().any(named),
            "the workspace README's crate table does not name `{member}`"
        );
    }
    for row in &rows {
        let name = code(&row[0]);
        assert!(
            members.contains(&name),
            "the crate table's `{name}` is not a workspace member"
        );
    }
}

#[test]
fn every_bench_program_is_in_the_crate_table() {
    let rows = crate_table();
    let benches = (rows.iter())
        .find(|row| row[0] == "`benches`")
        .expect("the crate table's `benches` row");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches");
    for folder in ["benches", "src/bin", "examples"] {
        let entries = std::fs::read_dir(root.join(folder))
            .unwrap_or_else(|error| panic!("benches/{folder}: {error}"));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.extension().is_none_or(|extension| extension != "rs") {
                continue;
            }
            let name = path.file_stem().expect("a name").to_string_lossy();
            assert!(
                benches[1].contains(&format!("`{name}`")),
                "the crate table's `benches` row does not name benches/{folder}/{name}.rs"
            );
        }
    }
}
