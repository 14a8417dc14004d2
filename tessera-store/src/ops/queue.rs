//! Queue settings: pause, resume and concurrency limits, stored so they
//! hold across restarts and processes.

use tessera_audit::{Action, Resource};
use tessera_lease::{ConcurrencyLimit, Namespace, QueueName, Retention};

use crate::backend::RowLock;
use crate::error::Error;
use crate::model::access::{Caller, Scope};
use crate::model::queue::{QueueRetention, QueueSettings};
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

    /// Gives `queue` keep times of its own for finished work, or (`None`)
    /// hands it back to the store's
    /// ([`StoreConfig::with_retention`](crate::StoreConfig::with_retention)),
    /// and returns the keep times now in force for it.
    ///
    /// Retention weighs each finished task by its queue's keep times, from
    /// its next run on: a shorter keep purges the queue's finished work
    /// sooner, a longer one (or [`Retention::FOREVER`]) keeps it although
    /// the store's would purge it. Tasks already purged stay purged. Keep
    /// times above [`Retention::MAX`] are refused
    /// ([`Error::InvalidInput`]). Needs the `enqueue` scope and the
    /// namespace grant; audited as `set_queue_retention` (resource
    /// `queue:<name>`).
    pub fn set_queue_retention(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
        retention: Option<Retention>,
    ) -> Result<QueueRetention, Error> {
        if let Some(retention) = &retention {
            retention.check()?;
        }
        let scope = self.admit(caller, namespace, Scope::Enqueue, Action::SetQueueRetention)?;
        let now = self.now_utc();
        self.perform(&scope, now, |writer| {
            writer.lock_row(RowLock::QueueSettings(namespace, queue))?;
            writer.put_queue_retention(namespace, queue, retention.as_ref(), now)?;
            Ok((
                self.queue_retention_of(queue, retention),
                queue_resource(queue),
            ))
        })
    }

    /// The keep times in force for `queue`'s finished work: its own, or
    /// the store's. Needs the `read` scope; audited as
    /// `read_queue_settings`.
    pub fn queue_retention(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        queue: &QueueName,
    ) -> Result<QueueRetention, Error> {
        let scope = self.admit(caller, namespace, Scope::Read, Action::ReadQueueSettings)?;
        self.perform_read(&scope, |reader| {
            let own = reader.queue_retention(namespace, queue)?;
            Ok((self.queue_retention_of(queue, own), queue_resource(queue)))
        })
    }

    /// What a queue with keep times `own` (or none) keeps.
    fn queue_retention_of(&self, queue: &QueueName, own: Option<Retention>) -> QueueRetention {
        QueueRetention {
            queue: queue.clone(),
            retention: own.unwrap_or_else(|| self.config.retention()),
            own: own.is_some(),
        }
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
