//! Audit operations: maintenance (counter flushes and retention) and the
//! audit read.

use chrono::{DateTime, Utc};
use tessera_audit::{Action, CounterBatch, Minute, RetentionRun, RetentionStep, visible_since};

use crate::backend::Purge;
use crate::error::Error;
use crate::model::access::Caller;
use crate::model::audit::{ActionScope, AuditPage, AuditQuery, MAX_AUDIT_ROWS, Maintenance};
use crate::store::Store;

impl Store {
    /// Does what is due now: writes counters whose minute has passed (or all,
    /// once 1,024 distinct counters wait) and runs retention if the
    /// retention interval ([`StoreConfig::with_retention_interval`](crate::StoreConfig::with_retention_interval),
    /// five minutes by default) has passed since the last run. The store calls it after every
    /// successful write; a request that writes nothing (a denial, an empty
    /// claim, a replay) never does, so a host runs it at
    /// [`next_maintenance`](Self::next_maintenance) for counters to reach
    /// storage while no write happens. Each batch is its own transaction;
    /// the first failure stops the call.
    pub fn maintain(&self) -> Result<Maintenance, Error> {
        let now = self.now_utc();
        let mut report = Maintenance::default();
        let batch = self.counters.lock().take_due(now);
        if let Some(batch) = batch {
            report.counters_written = self.write_counters(batch, now)?;
        }
        let run = self.retention.lock().start(now);
        if let Some(run) = run {
            report.retention_ran = true;
            report.rows_deleted = self.run_retention(run)?;
            let (tasks, rows) = self.purge_finished(&run)?;
            report.tasks_purged = tasks;
            report.rows_deleted += rows;
            report.rows_deleted += self.purge_ended_slots(&run)?;
            #[cfg(feature = "schedule")]
            {
                report.rows_deleted += self.trim_schedule_fires(&run)?;
            }
            crate::observe::retention_ran(report.rows_deleted, report.tasks_purged);
            *self.last_retention.lock() = Some(crate::model::audit::RetentionSummary {
                ran_at: run.started_at(),
                tasks_purged: report.tasks_purged,
                rows_deleted: report.rows_deleted,
            });
        }
        Ok(report)
    }

    /// This store's latest completed retention run (`None` before the
    /// first): when it started, the finished tasks it purged and the rows
    /// it deleted. Each store runs its own; with several processes on one
    /// database, each answers its own runs. Not audited.
    pub fn last_retention(&self) -> Option<crate::model::audit::RetentionSummary> {
        *self.last_retention.lock()
    }

    /// When [`maintain`](Self::maintain) next has something to do without
    /// another request: the earlier of the counter buffer's next due time
    /// and the next retention run.
    ///
    /// A time that has come is answered as the store's now, never a time
    /// in the past, so a host can set its timer on the value as it is.
    /// `None` when nothing will come due without another request.
    pub fn next_maintenance(&self) -> Option<DateTime<Utc>> {
        let counters = self.counters.lock().poll_timeout();
        let retention = self.retention.lock().poll_timeout();
        let next = match (counters, retention) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        next.map(|at| at.max(self.now_utc()))
    }

    /// Writes every waiting counter now, whatever its minute; returns the
    /// rows written.
    pub fn flush_counters(&self) -> Result<u64, Error> {
        let now = self.now_utc();
        let batch = self.counters.lock().take_all();
        match batch {
            Some(batch) => self.write_counters(batch, now),
            None => Ok(0),
        }
    }

    /// Counts waiting in memory, not yet written.
    pub fn pending_counters(&self) -> u64 {
        self.counters.lock().total()
    }

    pub(crate) fn write_counters(
        &self,
        batch: CounterBatch,
        now: DateTime<Utc>,
    ) -> Result<u64, Error> {
        let result = self.write(|writer| {
            for counter in batch.counters() {
                writer.add_counter(counter)?;
            }
            Ok(batch.counters().len() as u64)
        });
        let mut buffer = self.counters.lock();
        match result {
            Ok(rows) => {
                buffer.written(batch);
                drop(buffer);
                crate::observe::counters_flushed(rows);
                Ok(rows)
            }
            Err(error) => {
                buffer.failed(batch, now);
                Err(error)
            }
        }
    }

    fn run_retention(&self, run: RetentionRun) -> Result<u64, Error> {
        let mut deleted = 0;
        for what in Purge::ALL {
            let threshold = match what {
                Purge::Events => run.cutoff(),
                Purge::Counters => run.first_visible_minute().start(),
                Purge::Keys
                | Purge::Principals
                | Purge::Limits
                | Purge::SessionTasks
                | Purge::Namespaces => run.started_at(),
            };
            loop {
                let rows =
                    self.write(|writer| Ok(writer.purge(what, threshold, run.batch_size())?))?;
                deleted += rows as u64;
                if run.after_batch(rows) == RetentionStep::Stop {
                    break;
                }
            }
        }
        Ok(deleted)
    }

    /// Audit events and counters: a caller's own, or (admin) anyone's or
    /// everyone's. Waiting counters are written first so the read sees
    /// them; if storage refuses that write, the read answers without them.
    /// Only rows inside the retention window are returned. Events come a
    /// page at a time, newest first: a full page's
    /// [`next`](AuditPage::next) is the [`before`](AuditQuery::before) of
    /// the page after it, found by a search of the audit table's row ids
    /// (everyone's) or of its principal index (one principal's), however
    /// deep the page. Audited as `read_audit`.
    pub fn audit(&self, caller: &Caller, query: &AuditQuery) -> Result<AuditPage, Error> {
        let scope = ActionScope::of(caller, None, Action::ReadAudit);
        let principal = self.rows_of(
            caller,
            &scope,
            query.principal,
            "only an admin reads another principal's audit",
        )?;
        match self.flush_counters() {
            Ok(_) => {}
            Err(error) if error.is_quota_exhausted() => {}
            Err(error) => {
                self.count(&scope, error.outcome());
                return Err(error);
            }
        }
        let now = self.now_utc();
        let window = visible_since(now);
        let since = query.since.map_or(window, |since| since.max(window));
        let limit = query.limit.clamp(1, MAX_AUDIT_ROWS);
        let name = principal.map(|p| p.to_string());
        self.perform_read(&scope, |reader| {
            let rows = reader.events(name.as_deref(), since, query.before, limit)?;
            let next = (rows.len() == limit)
                .then(|| rows.last().map(|(cursor, _)| *cursor))
                .flatten();
            let events = rows.into_iter().map(|(_, event)| event).collect();
            let counters = match Minute::first_starting_at_or_after(since) {
                Some(minute) if query.before.is_none() => {
                    reader.counters(name.as_deref(), minute.start(), limit)?
                }
                _ => Vec::new(),
            };
            Ok((
                AuditPage {
                    events,
                    counters,
                    next,
                },
                None,
            ))
        })
    }
}
