//! Queue settings: pause, resume and concurrency limits, stored so they
//! hold across restarts and processes.

use tessera_audit::{Action, Resource};
use tessera_lease::{ConcurrencyLimit, Namespace, QueueName};

use crate::backend::RowLock;
use crate::error::Error;
use crate::model::access::{Caller, Scope};
use crate::model::queue::QueueSettings;
use crate::store::Store;

/// The audit resource naming a queue.
fn queue_resource(queue: &QueueName) -> Option<Resource> {
    Resource::new(&format!("queue:{queue}")).ok()
}

impl Store {
    /// Pauses `queue` of `namespace` and returns its settings.
    ///
    /// Stored in `queue_settings`, so the pause holds across restarts and
    /// for every process on the database. A paused queue accepts enqueues;
    /// a claim on it is empty with [`EmptyReason::Paused`](crate::EmptyReason::Paused)
    /// and a `Retry-After`; leases already granted heartbeat, submit and
    /// fail as before. Pausing a paused queue keeps its first pause time.
    /// Needs the `enqueue` scope and the namespace grant; audited as
    /// `pause_queue` (resource `queue:<name>`).
    pub fn pause_queue(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<QueueSettings, Error> {
        self.change_queue(
            caller,
            namespace,
            queue,
            Action::PauseQueue,
            |settings, now| {
                settings.paused_at.get_or_insert(now);
            },
        )
    }

    /// Resumes a paused `queue` (a running one stays as it is) and returns
    /// its settings; its long-polls wake and its idle pacing restarts.
    /// Needs the `enqueue` scope; audited as `resume_queue`.
    pub fn resume_queue(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<QueueSettings, Error> {
        self.change_queue(
            caller,
            namespace,
            queue,
            Action::ResumeQueue,
            |settings, _| {
                settings.paused_at = None;
            },
        )
    }

    /// Sets `queue`'s concurrency limits ([`ConcurrencyLimit`]; `None`
    /// removes one) and returns its settings.
    ///
    /// A claim then grants an attempt only while
    /// [`ConcurrencyLimit::admits`] the slots held: the queue's attempts
    /// stored as leased, and those of the candidate's partition key,
    /// counted when it grants (never a counter). A claim skips tasks whose
    /// partition is full and takes the next one; with the queue full it is
    /// empty with [`EmptyReason::Limited`](crate::EmptyReason::Limited).
    /// Lowering a limit below the leases held revokes none of them. Needs
    /// the `enqueue` scope; audited as `set_queue_limits`.
    pub fn set_queue_limits(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        limit: ConcurrencyLimit,
    ) -> Result<QueueSettings, Error> {
        self.change_queue(
            caller,
            namespace,
            queue,
            Action::SetQueueLimits,
            move |settings, _| {
                settings.limit = limit;
            },
        )
    }

    /// `queue`'s settings: paused or not, and its limits (the defaults for
    /// a queue never configured). Needs the `read` scope; audited as
    /// `read_queue_settings`.
    pub fn queue_settings(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<QueueSettings, Error> {
        let scope = self.admit(caller, namespace, Scope::Read, Action::ReadQueueSettings)?;
        self.perform_read(&scope, |reader| {
            let settings = reader
                .queue_settings(namespace, queue)?
                .unwrap_or_else(|| QueueSettings::unset(queue.clone()));
            Ok((settings, queue_resource(queue)))
        })
    }

    /// Reads a queue's settings, changes them and stores them (a row only
    /// while one differs from the default), with the audit row, in one
    /// transaction.
    fn change_queue(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        action: Action,
        change: impl Fn(&mut QueueSettings, chrono::DateTime<chrono::Utc>),
    ) -> Result<QueueSettings, Error> {
        let scope = self.admit(caller, namespace, Scope::Enqueue, action)?;
        let now = self.now_utc();
        let (before, after) = self.perform(&scope, now, |writer| {
            // Changes of one queue take turns, even before its row exists.
            writer.lock_row(RowLock::QueueSettings(namespace, queue))?;
            let before = writer
                .queue_settings(namespace, queue)?
                .unwrap_or_else(|| QueueSettings::unset(queue.clone()));
            let mut after = before.clone();
            change(&mut after, now);
            if after != before {
                writer.put_queue_settings(namespace, &after, now)?;
                if before.is_paused() && !after.is_paused() || before.limit != after.limit {
                    // Other processes' long-polls look again.
                    writer.signal_enqueued(namespace, queue)?;
                }
            }
            Ok(((before, after), queue_resource(queue)))
        })?;
        self.namespace_changed(namespace);
        if before.is_paused() && !after.is_paused() || before.limit != after.limit {
            // Claims that found it paused or full may find work now.
            self.queue_received_work(namespace, queue);
        }
        Ok(after)
    }
}
