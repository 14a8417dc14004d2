//! Per-process history files: each process appends one JSON line per
//! record and hands it to the kernel at once, so every line written
//! survives the process being killed; the run merges the files.

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use tessera_check::{Completion, Event, Operation, OperationId, Record};

use crate::clock::monotonic_nanos;

/// Appends one process's records to its own file in a run's directory.
///
/// Each record is one `write` of one whole line to a file opened for
/// appending, with no buffer in this process: once `invoke` or `complete`
/// returns, the line is the kernel's, and a SIGKILL a moment later loses
/// none of it. A kill during the write can leave a last line cut short,
/// which [`read_history`] drops.
#[derive(Debug)]
pub struct Recorder {
    process: u32,
    next: AtomicU64,
    file: Mutex<File>,
}

/// Why a run's history files could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What went wrong.
        source: io::Error,
    },
    /// A whole line that is not a record.
    #[error("{path} line {line}: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// Why it does not parse.
        source: serde_json::Error,
    },
}

impl Recorder {
    /// The file of `process` in `dir` (`p<process>.jsonl`), appended to
    /// if it exists: a process started again under the same number goes on
    /// numbering its operations after the last one the file holds.
    pub fn open(dir: &Path, process: u32) -> io::Result<Self> {
        let path = Self::path(dir, process);
        let next = match read_file(&path) {
            Ok(records) => records.iter().map(|r| r.id.sequence + 1).max().unwrap_or(0),
            Err(_) => 0,
        };
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            process,
            next: AtomicU64::new(next),
            file: Mutex::new(file),
        })
    }

    /// Where `process` of a run in `dir` keeps its records.
    pub fn path(dir: &Path, process: u32) -> PathBuf {
        dir.join(format!("p{process}.jsonl"))
    }

    /// Its process number.
    pub fn process(&self) -> u32 {
        self.process
    }

    /// Records that `operation` is invoked now (`wall` by the process's
    /// clock) and returns its id, for [`complete`](Self::complete).
    pub fn invoke(&self, wall: DateTime<Utc>, operation: Operation) -> io::Result<OperationId> {
        let id = OperationId {
            process: self.process,
            sequence: self.next.fetch_add(1, Ordering::Relaxed),
        };
        self.append(id, wall, Event::Invoke { operation })?;
        Ok(id)
    }

    /// Records how operation `id` ended.
    pub fn complete(
        &self,
        id: OperationId,
        wall: DateTime<Utc>,
        completion: Completion,
    ) -> io::Result<()> {
        self.append(id, wall, Event::Complete { completion })
    }

    fn append(&self, id: OperationId, wall: DateTime<Utc>, event: Event) -> io::Result<()> {
        let mut file = self.file.lock();
        // Read under the lock, so one file's lines are in monotonic order.
        let record = Record {
            id,
            wall,
            monotonic: monotonic_nanos(),
            event,
        };
        let mut line = serde_json::to_vec(&record).map_err(io::Error::other)?;
        line.push(b'\n');
        file.write_all(&line)
    }
}

/// Every record of every process file (`*.jsonl`) in `dir`, merged: a
/// last line cut short by a kill is dropped; any other bad line is an
/// error.
pub fn read_history(dir: &Path) -> Result<Vec<Record>, ReadError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| ReadError::Io { path, source }
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    paths.sort();
    let mut records = Vec::new();
    for path in paths {
        records.extend(read_file(&path)?);
    }
    records.sort_by_key(|record| record.monotonic);
    Ok(records)
}

fn read_file(path: &Path) -> Result<Vec<Record>, ReadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReadError::Io {
        path: path.to_owned(),
        source,
    })?;
    let mut records = Vec::new();
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        let last = n + 1 == lines.len();
        match serde_json::from_str::<Record>(line) {
            Ok(record) => records.push(record),
            // Cut short by a kill mid-write.
            Err(_) if last && !complete => {}
            Err(source) => {
                return Err(ReadError::Corrupt {
                    path: path.to_owned(),
                    line: n + 1,
                    source,
                });
            }
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_check::{History, Outcome};

    fn claim() -> Operation {
        Operation::Claim {
            queue: "frames".to_owned(),
        }
    }

    #[test]
    fn processes_append_their_own_files_and_the_run_merges_them() {
        let dir = tempfile::tempdir().unwrap();
        let now = Utc::now();
        let one = Recorder::open(dir.path(), 1).unwrap();
        let two = Recorder::open(dir.path(), 2).unwrap();
        let a = one.invoke(now, claim()).unwrap();
        let b = two.invoke(now, claim()).unwrap();
        let empty = Completion::Ok {
            outcome: Outcome::Empty,
        };
        one.complete(a, now, empty.clone()).unwrap();
        drop(two);
        // Started again: numbering goes on.
        let again = Recorder::open(dir.path(), 2).unwrap();
        let c = again.invoke(now, claim()).unwrap();
        assert_eq!(c.sequence, b.sequence + 1);

        let records = read_history(dir.path()).unwrap();
        assert_eq!(records.len(), 4);
        assert!(records.windows(2).all(|w| w[0].monotonic <= w[1].monotonic));
        let history = History::from_records(records).unwrap();
        assert_eq!(history.len(), 3);
        assert_eq!(history.steps()[0].completion, empty);
    }

    #[test]
    fn a_line_cut_short_at_the_end_is_dropped_and_one_in_the_middle_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let one = Recorder::open(dir.path(), 1).unwrap();
        one.invoke(Utc::now(), claim()).unwrap();
        let path = Recorder::path(dir.path(), 1);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"{\"id\":{\"proc").unwrap();
        assert_eq!(read_history(dir.path()).unwrap().len(), 1);
        file.write_all(b"\n").unwrap();
        one.invoke(Utc::now(), claim()).unwrap();
        let error = read_history(dir.path()).unwrap_err();
        assert!(
            matches!(error, ReadError::Corrupt { line: 2, .. }),
            "{error}"
        );
    }
}
