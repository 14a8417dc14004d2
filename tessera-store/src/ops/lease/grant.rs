//! The grant: the general lease transaction, partitions and concurrency
//! limits, and the lapses a full queue records.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tessera_audit::{Outcome, Resource};
use tessera_lease::{
    ConcurrencyLimit, Held, Lease, Namespace, PartitionKey, Principal, QueueName, Task, TaskState,
};

use crate::backend::rows::{AttemptRow, claimable_column};
use crate::backend::{QuickClaim, QuickGrant, TaskHandle};
use crate::error::Error;
use crate::model::access::{Caller, PrincipalKind};
use crate::model::audit::{ActionScope, Trail};
use crate::model::claim::EmptyReason;
use crate::model::queue::QueueSettings;
use crate::model::task::{Brief, TaskRef};
use crate::ops::dependency;
use crate::ops::lease::complete::AckWrites;
use crate::ops::task::apply;
use crate::state::waiting::{ClaimRequest, QueueKey};
use crate::store::Store;

use super::fast::{SKIPPED_RETRIES, skipped_pause};
use super::{LeaseGrant, MAX_LAPSES_RECORDED, MAX_PICKS, Placed};

impl Store {
    /// The lease transaction: the first claimable tasks of the queue, up
    /// to the request's count, each leased under the task's next token and
    /// with its audit row; none (counted) when nothing is claimable.
    pub(super) fn lease(
        &self,
        scope: &ActionScope,
        caller: &Caller,
        request: &ClaimRequest,
        idle_queue: &QueueKey,
        now: DateTime<Utc>,
    ) -> Result<(Vec<LeaseGrant>, EmptyReason), Error> {
        let (namespace, queue) = (&request.namespace, &request.queue);
        let session = caller.kind() == PrincipalKind::Anonymous;
        // A key that found this queue empty, with no grant or enqueue
        // since, likely finds it empty again: that claim is answered from a
        // read connection, with no write lock and nothing written, as is
        // every claim while writes are refused. Any other claim goes
        // straight to the lease transaction, which finds the queue's first
        // claimable task (or none, writing nothing) on pages it reads
        // anyway. A session's first use goes on to create its namespace.
        if self.is_refusing_writes() || self.gate.found_empty(&caller.principal(), idle_queue) {
            let (claimable, opened, paused) = self
                .read(|reader| {
                    let claimable = reader.has_claimable(namespace, queue, now)?;
                    let opened = !session || reader.namespace_exists(namespace)?;
                    let paused = reader
                        .queue_settings(namespace, queue)?
                        .is_some_and(|settings| settings.is_paused());
                    Ok((claimable, opened, paused))
                })
                .inspect_err(|error| self.count(scope, error.outcome()))?;
            if opened && (paused || !claimable) {
                self.count(scope, Outcome::Empty);
                let reason = if paused {
                    EmptyReason::Paused
                } else {
                    EmptyReason::Empty
                };
                return Ok((Vec::new(), reason));
            }
        }
        self.lease_written(scope, caller, request, now)
    }

    /// The claim's writing part: one task for a keyed caller in one
    /// statement where the backend makes it
    /// ([`lease_quick`](Self::lease_quick)), else the general lease
    /// transaction ([`lease_general`](Self::lease_general)).
    pub(super) fn lease_written(
        &self,
        scope: &ActionScope,
        caller: &Caller,
        request: &ClaimRequest,
        now: DateTime<Utc>,
    ) -> Result<(Vec<LeaseGrant>, EmptyReason), Error> {
        if request.count == 1 && caller.kind() != PrincipalKind::Anonymous {
            let holder = caller.lease_principal();
            let duration = self.config.lease_duration();
            if let Some(result) = self.lease_quick(
                scope,
                &request.namespace,
                &request.queue,
                &holder,
                duration,
                now,
            ) {
                return result;
            }
        }
        self.lease_general(scope, caller, request, now)
    }

    /// The general lease transaction. Where claims pass over tasks other
    /// transactions hold ([`Capabilities::skips_locked`]), one that found
    /// nothing while the queue still has a claimable task (one that
    /// another claim of this process, say, held locked and then released
    /// or has yet to commit) runs again, up to [`SKIPPED_RETRIES`] times,
    /// so it answers empty only when nothing claimable is left.
    ///
    /// [`Capabilities::skips_locked`]: crate::backend::Capabilities
    pub(super) fn lease_general(
        &self,
        scope: &ActionScope,
        caller: &Caller,
        request: &ClaimRequest,
        now: DateTime<Utc>,
    ) -> Result<(Vec<LeaseGrant>, EmptyReason), Error> {
        let skips_locked = self.backend().capabilities().skips_locked;
        let mut skipped = 0;
        loop {
            let result = self.perform_or_count(scope, now, |writer| {
                // The clock again, now the transaction has begun: a claim
                // that waited for a connection or the writer would
                // otherwise stamp its lease with the time it began waiting,
                // before the end of a lease whose lapse another process
                // recorded meanwhile.
                let now = self.now_utc().max(now);
                self.lease_in(writer, scope, caller, request, None, now)
            })?;
            let passed_over = skips_locked
                && skipped < SKIPPED_RETRIES
                && result.0.is_empty()
                && result.1 == EmptyReason::Empty
                && self.read(|reader| {
                    Ok(reader.has_claimable(
                        &request.namespace,
                        &request.queue,
                        self.now_utc().max(now),
                    )?)
                })?;
            if !passed_over {
                return Ok(result);
            }
            skipped_pause(skipped);
            skipped += 1;
        }
    }

    /// The lease transaction's work, in `writer`: see [`lease`](Self::lease).
    /// Its trail is the last grant's audit row, or the empty claim's count.
    /// The `carried` writes of acknowledgements decided earlier in the
    /// transaction are made with the grants' where the claim leases
    /// set-based, and first otherwise.
    pub(super) fn lease_in(
        &self,
        writer: &dyn crate::backend::WriteTransaction,
        scope: &ActionScope,
        caller: &Caller,
        request: &ClaimRequest,
        mut carried: Option<AckWrites<'_>>,
        now: DateTime<Utc>,
    ) -> Result<((Vec<LeaseGrant>, EmptyReason), Trail), Error> {
        let (namespace, queue) = (&request.namespace, &request.queue);
        let session = caller.kind() == PrincipalKind::Anonymous;
        let holder = caller.lease_principal();
        let terms = LeaseTerms {
            holder: &holder,
            duration: self.config.lease_duration(),
            now,
        };
        let mut audited = 0;
        if session {
            self.open_namespace(writer, caller, namespace, now)?;
        }
        // A queue without a settings row (running, no limit): its
        // claimable tasks locked in one statement, where the backend can,
        // which also tells that the queue has no settings. Otherwise the
        // settings are read, and the claim takes its tasks one at a time.
        let mut locked = writer.lock_claimable(namespace, queue, now, request.count)?;
        if let (Some(writes), Some(tasks)) = (&carried, &locked)
            && tasks.iter().any(|task| writes.changes_task(task.handle))
        {
            // The claim found a task the carried writes change: they are
            // made first, and the claim looks again at the tasks as they
            // now are.
            writes.write_with(writer, &[], &[])?;
            carried = None;
            locked = writer.lock_claimable(namespace, queue, now, request.count)?;
        }
        if locked.is_none()
            && let Some(writes) = carried.take()
        {
            writes.write_with(writer, &[], &[])?;
        }
        let settings = match locked {
            Some(_) => None,
            None => writer.queue_settings(namespace, queue)?,
        };
        if settings.as_ref().is_some_and(QueueSettings::is_paused) {
            return Ok((
                (Vec::new(), EmptyReason::Paused),
                Trail::Count(Outcome::Empty),
            ));
        }
        let limit = settings.map_or(ConcurrencyLimit::NONE, |settings| settings.limit);
        let (granted, reason) = if limit.per_partition.is_some() {
            let wanted = Wanted {
                count: request.count,
                limit,
                terms,
            };
            grant_by_partition(writer, namespace, queue, &wanted)?
        } else {
            let mut reason = EmptyReason::Empty;
            let mut lapses_recorded = false;
            let mut granted: Vec<Placed> = Vec::new();
            let mut stale = 0;
            let mut exhausted = false;
            if let Some(locked) = locked {
                // Plain tasks, leased set-based.
                let found = locked.len();
                granted = grant_locked(writer, scope, namespace, locked, &terms, carried.as_ref())?;
                audited = granted.len();
                exhausted = granted.len() == found && found < request.count;
            }
            while !exhausted && granted.len() < request.count && stale < MAX_PICKS {
                let Some(loaded) = writer.next_claimable(namespace, queue, now)? else {
                    break;
                };
                if granted.iter().any(|(handle, ..)| *handle == loaded.handle) {
                    // Another attempt of a task this batch leased: no worker
                    // holds two competing attempts of one brief at once.
                    break;
                }
                let mut rules = Task::restore(loaded.record)?;
                if rules.next_claimable_at(now) != Some(now) {
                    // A lease lapsed on its last try: discard its attempt
                    // and look again (each pass takes one lapse out of the
                    // index, so this ends). Otherwise the stored claim
                    // times were stale: correct them and look again.
                    if apply(
                        writer,
                        loaded.handle,
                        loaded.unique_held,
                        &mut rules,
                        now,
                        |rules| Ok(rules.expire(now)),
                    )?
                    .is_empty()
                    {
                        writer.resync_task(loaded.handle, rules.record())?;
                        stale += 1;
                    }
                    continue;
                }
                if limit.is_limited() {
                    let held = held_slots(writer, namespace, queue, &rules, None, &holder, now)?;
                    if !limit.admits(held) {
                        if !lapses_recorded {
                            // The queue is full: record the lapses of its
                            // expired leases, which frees their slots, and
                            // look again.
                            lapses_recorded = true;
                            record_lapses(writer, namespace, queue, now)?;
                            continue;
                        }
                        reason = EmptyReason::Limited;
                        break;
                    }
                }
                let lease = apply(
                    writer,
                    loaded.handle,
                    loaded.unique_held,
                    &mut rules,
                    now,
                    |rules| terms.lease(rules),
                )?;
                granted.push(grant(
                    namespace,
                    loaded.handle,
                    &rules,
                    lease,
                    loaded.brief,
                )?);
            }
            (granted, reason)
        };
        // One audit row per lease; the last rides on the trail. The
        // first `audited` were written with their leases.
        let trail = match granted.split_last() {
            None => Trail::Count(Outcome::Empty),
            Some(_) if audited == granted.len() => Trail::Written,
            Some((last, earlier)) => {
                for lease in earlier.get(audited..).unwrap_or_default() {
                    writer.insert_event(&scope.event(now, resource(lease)))?;
                }
                Trail::Row(resource(last))
            }
        };
        let granted = granted
            .into_iter()
            .map(|(_, task, lease, brief)| (task, lease, brief))
            .collect();
        Ok(((granted, reason), trail))
    }
}

/// The slots [`ConcurrencyLimit::admits`] weighs for granting the next
/// attempt of `rules`: the queue's attempts stored as leased, and those of
/// its `partition` (`None`: not counted), each less the
/// attempt the grant takes over if its lease lapsed (it gives up its own
/// slot as it takes the new one).
pub(super) fn held_slots(
    writer: &dyn crate::backend::WriteTransaction,
    namespace: &Namespace,
    queue: &QueueName,
    rules: &Task,
    partition: Option<&PartitionKey>,
    holder: &Principal,
    now: DateTime<Utc>,
) -> Result<Held, Error> {
    let leased = writer.leased_in_queue(namespace, queue)?;
    let in_partition = match partition {
        Some(key) => Some(writer.leased_in_partition(namespace, queue, key)?),
        None => None,
    };
    // The attempt a grant would take, found by the rule itself on a copy.
    let mut trial = rules.clone();
    let retaken = trial
        .claim(holder, now, Duration::from_secs(1))
        .ok()
        .and_then(|lease| rules.attempt(lease.attempt()))
        .is_some_and(|attempt| attempt.state == TaskState::Leased);
    Ok(Held {
        queue: leased.saturating_sub(u32::from(retaken)),
        partition: in_partition.map(|held| held.saturating_sub(u32::from(retaken))),
    })
}

/// Records the lapses of `queue`'s expired leases, the longest expired
/// first (at most [`MAX_LAPSES_RECORDED`] tasks): each attempt leaves
/// `leased`, which frees its slot, and its old holder's token changes
/// nothing from then on.
pub(super) fn record_lapses(
    writer: &dyn crate::backend::WriteTransaction,
    namespace: &Namespace,
    queue: &QueueName,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    for loaded in writer.lapsed_tasks(namespace, Some(queue), now, MAX_LAPSES_RECORDED)? {
        let mut rules = Task::restore(loaded.record)?;
        apply(
            writer,
            loaded.handle,
            loaded.unique_held,
            &mut rules,
            now,
            |rules| Ok(rules.expire(now)),
        )?;
    }
    Ok(())
}

/// What a claim of a partition-limited queue asks for.
pub(super) struct Wanted<'a> {
    count: usize,
    limit: ConcurrencyLimit,
    terms: LeaseTerms<'a>,
}

/// The most candidates a claim of a partition-limited queue walks through
/// before it answers `limited`.
pub(super) const MAX_CANDIDATES: usize = 64;

/// The grants of a claim of a queue with a per-partition limit: the lapses
/// of its expired leases recorded first (freeing their slots), then its
/// claimable tasks in claim order, skipping those whose partition is full,
/// each granted while [`ConcurrencyLimit::admits`] the slots held. Empty
/// with [`EmptyReason::Limited`] when it skipped any and granted none.
pub(super) fn grant_by_partition(
    writer: &dyn crate::backend::WriteTransaction,
    namespace: &Namespace,
    queue: &QueueName,
    wanted: &Wanted<'_>,
) -> Result<(Vec<Placed>, EmptyReason), Error> {
    let now = wanted.terms.now;
    record_lapses(writer, namespace, queue, now)?;
    let mut granted: Vec<Placed> = Vec::new();
    let mut full: Vec<PartitionKey> = Vec::new();
    let mut skipped = false;
    for handle in writer.claim_candidates(namespace, queue, now, MAX_CANDIDATES)? {
        if granted.len() >= wanted.count {
            break;
        }
        if granted.iter().any(|(granted, ..)| *granted == handle) {
            continue;
        }
        // Another claim holds it (PostgreSQL), or it is gone.
        let Some(loaded) = writer.task_by_handle(handle)? else {
            continue;
        };
        let partition = loaded.partition_key.clone();
        let unique_held = loaded.unique_held;
        if partition.as_ref().is_some_and(|key| full.contains(key)) {
            skipped = true;
            continue;
        }
        let mut rules = Task::restore(loaded.record)?;
        if rules.next_claimable_at(now) != Some(now) {
            // A lapse on the last try or a passed deadline is recorded;
            // otherwise the stored claim times the rules disagree with
            // are corrected. Either way it is left for a later claim.
            if apply(writer, handle, unique_held, &mut rules, now, |rules| {
                Ok(rules.expire(now))
            })?
            .is_empty()
            {
                writer.resync_task(handle, rules.record())?;
            }
            continue;
        }
        let held = held_slots(
            writer,
            namespace,
            queue,
            &rules,
            partition.as_ref(),
            wanted.terms.holder,
            now,
        )?;
        if !wanted.limit.admits(held) {
            skipped = true;
            let queue_full = ConcurrencyLimit {
                per_partition: None,
                ..wanted.limit
            };
            match partition {
                Some(key) if queue_full.admits(held) => full.push(key),
                // The queue itself is full: nothing else can be granted.
                _ => break,
            }
            continue;
        }
        let lease = apply(writer, handle, unique_held, &mut rules, now, |rules| {
            wanted.terms.lease(rules)
        })?;
        granted.push(grant(namespace, handle, &rules, lease, loaded.brief)?);
    }
    let reason = if skipped {
        EmptyReason::Limited
    } else {
        EmptyReason::Empty
    };
    Ok((granted, reason))
}

/// The grant of a one-statement claim, as the lease rules make it from the
/// task the statement found; the statement's writes must be theirs.
pub(super) fn checked_grant(
    claim: &QuickClaim<'_>,
    duration: Duration,
    quick: QuickGrant,
) -> Result<LeaseGrant, Error> {
    let QuickGrant {
        before,
        after,
        resource,
    } = quick;
    let terms = LeaseTerms {
        holder: claim.holder,
        duration,
        now: claim.now,
    };
    let mut rules = Task::restore(before.record)?;
    let lease = terms.lease(&mut rules)?;
    let (_, task, lease, brief) =
        grant(claim.namespace, before.handle, &rules, lease, before.brief)?;
    let record = rules.record();
    let expected = record
        .attempts
        .iter()
        .find(|attempt| attempt.number == lease.attempt())
        .map(|attempt| AttemptRow::from_record(attempt, record.lapse_backoff));
    let named = task.grant_resource(lease.attempt(), lease.token());
    if lease.expires_at() != claim.expires_at
        || expected.as_ref() != Some(&after)
        || claimable_column(record).is_some()
        || named.as_ref().map(Resource::as_str) != resource.as_deref()
    {
        return Err(crate::error::corrupt(
            "a one-statement claim that differs from the lease rules",
        ));
    }
    Ok((task, lease, brief))
}

/// A grant's audit resource.
pub(super) fn resource(
    (_, task, lease, _): &(TaskHandle, TaskRef, Lease, Brief),
) -> Option<Resource> {
    task.grant_resource(lease.attempt(), lease.token())
}

/// Whom a claim leases to, for how long, and when.
#[derive(Debug, Clone, Copy)]
pub(super) struct LeaseTerms<'a> {
    pub(super) holder: &'a Principal,
    pub(super) duration: Duration,
    pub(super) now: DateTime<Utc>,
}

impl LeaseTerms<'_> {
    /// The lease rules' claim of `rules`' next claimable attempt under
    /// these terms: every claim path leases through it.
    pub(super) fn lease(&self, rules: &mut Task) -> Result<Lease, tessera_lease::LeaseError> {
        rules.claim(self.holder, self.now, self.duration)
    }
}

/// A grant as every claim path answers it: the task at `handle` in
/// `namespace`, as `rules` leave it after they made `lease`, with its
/// `brief` (a task loaded for a claim without one is corrupt).
pub(super) fn grant(
    namespace: &Namespace,
    handle: TaskHandle,
    rules: &Task,
    lease: Lease,
    brief: Option<Brief>,
) -> Result<Placed, Error> {
    let task = TaskRef::new(
        namespace.clone(),
        lease.task().clone(),
        rules.record().version,
    );
    let brief = brief.ok_or_else(|| crate::error::corrupt("task brief"))?;
    Ok((handle, task, lease, brief))
}

/// Leases the tasks [`lock_claimable`](crate::backend::WriteTransaction::lock_claimable)
/// locked, in claim order, each under the lease rules as the one-at-a-time
/// claim leases it, and writes them set-based with their audit rows. It
/// stops before
/// the first task whose stored claim times are stale, which the
/// one-at-a-time claim corrects, and after one with another attempt still
/// claimable. The `carried` writes of acknowledgements are made in the
/// same statement.
pub(super) fn grant_locked(
    writer: &dyn crate::backend::WriteTransaction,
    scope: &ActionScope,
    namespace: &Namespace,
    locked: Vec<crate::backend::LoadedTask>,
    terms: &LeaseTerms<'_>,
    carried: Option<&AckWrites<'_>>,
) -> Result<Vec<Placed>, Error> {
    let now = terms.now;
    let mut leased = Vec::with_capacity(locked.len());
    let mut granted: Vec<Placed> = Vec::with_capacity(locked.len());
    for loaded in locked {
        let mut rules = Task::restore(loaded.record.clone())?;
        if rules.next_claimable_at(now) != Some(now) {
            break;
        }
        let lease = terms.lease(&mut rules)?;
        granted.push(grant(
            namespace,
            loaded.handle,
            &rules,
            lease,
            loaded.brief.clone(),
        )?);
        // A task with another attempt still claimable comes next in claim
        // order, and a batch never takes two attempts of one task: the
        // batch ends with it, as the one-at-a-time claim's does.
        let again = rules.next_claimable_at(now) == Some(now);
        leased.push((loaded, rules));
        if again {
            break;
        }
    }
    let changes: Vec<crate::backend::TaskChange<'_>> = leased
        .iter()
        .map(|(loaded, rules)| crate::backend::TaskChange {
            handle: loaded.handle,
            before: &loaded.record,
            after: rules.record(),
            at: now,
        })
        .collect();
    let events: Vec<_> = granted
        .iter()
        .map(|grant| scope.event(now, resource(grant)))
        .collect();
    match carried {
        Some(writes) => writes.write_with(writer, &changes, &events)?,
        None => {
            writer.write_acknowledged(&changes, &[], &events)?;
            dependency::settle(writer, dependency::ended(&changes), now)?;
        }
    }
    for (loaded, rules) in &leased {
        if rules.record().leaves_unique_slot(loaded.unique_held) {
            writer.release_unique_slot(loaded.handle)?;
        }
    }
    Ok(granted)
}
