//! The waiting room: who waits, in which order, and who holds the most.
//!
//! Every structure is an index-linked list over two slabs (waiters and
//! principals), so that every operation is O(1) apart from one hash lookup of
//! the principal:
//!
//! - `arrival`: all waiters, oldest first. Every waiter gets the same
//!   `max_wait`, so this is also deadline order.
//! - per principal: its waiters, oldest first (FIFO within a principal).
//! - `rotation`: principals with waiters, next to be served first
//!   (round-robin between principals).
//! - `buckets[n]`: principals holding exactly `n` waiters, and `largest`, the
//!   highest non-empty bucket (the count-bucket scheme of O(1) LFU caches), so
//!   the largest holder is found without a scan.
//!
//! Removal is exact, not lazy, so memory is bounded by the waiters present.
//! Arrival times are nanoseconds on the controller's clock.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::Hash;

/// A queued claim. Copy it freely; it names one claim of one
/// [`Admission`](crate::Admission) and ends exactly once: granted, rejected or
/// cancelled.
///
/// Tickets order by arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket {
    sequence: u64,
    slot: u32,
}

impl Ticket {
    /// A number unique within the controller that issued the ticket,
    /// increasing with arrival; handy for logs and maps.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
}

impl Link {
    const DETACHED: Self = Self {
        prev: NIL,
        next: NIL,
    };
}

/// A doubly linked list threaded through a slab by one of its [`Link`]s.
#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
    len: usize,
}

impl List {
    const EMPTY: Self = Self {
        head: NIL,
        tail: NIL,
        len: 0,
    };

    fn push_back<T>(&mut self, slab: &mut [T], index: u32, link: fn(&mut T) -> &mut Link) {
        *link(&mut slab[index as usize]) = Link {
            prev: self.tail,
            next: NIL,
        };
        match self.tail {
            NIL => self.head = index,
            tail => link(&mut slab[tail as usize]).next = index,
        }
        self.tail = index;
        self.len += 1;
    }

    fn unlink<T>(&mut self, slab: &mut [T], index: u32, link: fn(&mut T) -> &mut Link) {
        let Link { prev, next } = *link(&mut slab[index as usize]);
        match prev {
            NIL => self.head = next,
            prev => link(&mut slab[prev as usize]).next = next,
        }
        match next {
            NIL => self.tail = prev,
            next => link(&mut slab[next as usize]).prev = prev,
        }
        *link(&mut slab[index as usize]) = Link::DETACHED;
        self.len -= 1;
    }
}

#[derive(Debug)]
struct Waiter {
    /// 0 while the slot is free; tickets start at 1.
    sequence: u64,
    principal: u32,
    /// Nanoseconds on the controller's clock.
    arrived: u64,
    by_arrival: Link,
    by_principal: Link,
}

fn by_arrival(waiter: &mut Waiter) -> &mut Link {
    &mut waiter.by_arrival
}

fn by_principal(waiter: &mut Waiter) -> &mut Link {
    &mut waiter.by_principal
}

#[derive(Debug)]
struct Principal<P> {
    /// `None` while the slot is free.
    key: Option<P>,
    waiters: List,
    in_rotation: Link,
    in_bucket: Link,
}

fn in_rotation<P>(principal: &mut Principal<P>) -> &mut Link {
    &mut principal.in_rotation
}

fn in_bucket<P>(principal: &mut Principal<P>) -> &mut Link {
    &mut principal.in_bucket
}

/// Stores `value` in a free slot of `slab`, or a new one, and returns its
/// index. Slots stay below `u32::MAX` (`NIL`): the configuration caps
/// `max_pending` at 2³¹, and no more principals than waiters are kept.
fn allocate<T>(slab: &mut Vec<T>, free: &mut Vec<u32>, value: T) -> u32 {
    match free.pop() {
        Some(index) => {
            slab[index as usize] = value;
            index
        }
        None => {
            slab.push(value);
            (slab.len() - 1) as u32
        }
    }
}

/// Waiting claims of all principals. A principal is known here only while it
/// has waiters.
#[derive(Debug)]
pub(crate) struct WaitQueue<P> {
    index: HashMap<P, u32>,
    principals: Vec<Principal<P>>,
    free_principals: Vec<u32>,
    waiters: Vec<Waiter>,
    free_waiters: Vec<u32>,
    arrival: List,
    rotation: List,
    buckets: Vec<List>,
    largest: usize,
    next_sequence: u64,
}

impl<P: Hash + Eq + Clone> WaitQueue<P> {
    pub(crate) fn new() -> Self {
        Self {
            index: HashMap::new(),
            principals: Vec::new(),
            free_principals: Vec::new(),
            waiters: Vec::new(),
            free_waiters: Vec::new(),
            arrival: List::EMPTY,
            rotation: List::EMPTY,
            buckets: Vec::new(),
            largest: 0,
            next_sequence: 1,
        }
    }

    /// Waiters of all principals.
    pub(crate) fn len(&self) -> usize {
        self.arrival.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.arrival.len == 0
    }

    /// Principals with at least one waiter.
    pub(crate) fn principals(&self) -> usize {
        self.rotation.len
    }

    /// Waiters of `principal`.
    pub(crate) fn held_by(&self, principal: &P) -> usize {
        self.index
            .get(principal)
            .map_or(0, |&slot| self.principals[slot as usize].waiters.len)
    }

    /// Queues a claim of `principal` behind its own earlier claims.
    pub(crate) fn push(&mut self, principal: P, now: u64) -> Ticket {
        let slot = match self.index.entry(principal) {
            Entry::Occupied(entry) => *entry.get(),
            Entry::Vacant(entry) => {
                let fresh = Principal {
                    key: Some(entry.key().clone()),
                    waiters: List::EMPTY,
                    in_rotation: Link::DETACHED,
                    in_bucket: Link::DETACHED,
                };
                *entry.insert(allocate(
                    &mut self.principals,
                    &mut self.free_principals,
                    fresh,
                ))
            }
        };
        let held = self.principals[slot as usize].waiters.len;
        if held == 0 {
            self.rotation
                .push_back(&mut self.principals, slot, in_rotation);
        }
        self.move_bucket(slot, held, held + 1);

        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let waiter = Waiter {
            sequence,
            principal: slot,
            arrived: now,
            by_arrival: Link::DETACHED,
            by_principal: Link::DETACHED,
        };
        let index = allocate(&mut self.waiters, &mut self.free_waiters, waiter);
        self.arrival.push_back(&mut self.waiters, index, by_arrival);
        self.principals[slot as usize]
            .waiters
            .push_back(&mut self.waiters, index, by_principal);
        Ticket {
            sequence,
            slot: index,
        }
    }

    /// The oldest waiter of all, and when it arrived.
    pub(crate) fn oldest(&self) -> Option<(Ticket, u64)> {
        self.ticket_at(self.arrival.head)
    }

    /// The oldest waiter of the principal whose turn it is; that principal
    /// then goes to the back of the rotation.
    pub(crate) fn pop_next(&mut self) -> Option<(Ticket, u64)> {
        let slot = self.rotation.head;
        if slot == NIL {
            return None;
        }
        let found = self.ticket_at(self.principals[slot as usize].waiters.head)?;
        // Removing its last waiter takes the principal out of the rotation.
        self.rotation
            .unlink(&mut self.principals, slot, in_rotation);
        self.rotation
            .push_back(&mut self.principals, slot, in_rotation);
        self.remove(found.0);
        Some(found)
    }

    /// The newest waiter of the principal holding the most waiters, and how
    /// many it holds.
    pub(crate) fn largest(&self) -> Option<(Ticket, usize)> {
        let slot = self.buckets.get(self.largest)?.head;
        if slot == NIL {
            return None;
        }
        let (ticket, _) = self.ticket_at(self.principals[slot as usize].waiters.tail)?;
        Some((ticket, self.largest))
    }

    /// Takes `ticket` out of the queue, returning when it arrived, or `None`
    /// if it is not waiting (any more).
    pub(crate) fn remove(&mut self, ticket: Ticket) -> Option<u64> {
        let waiter = self.waiters.get(ticket.slot as usize)?;
        if waiter.sequence != ticket.sequence {
            return None;
        }
        let (slot, arrived) = (waiter.principal, waiter.arrived);
        self.arrival
            .unlink(&mut self.waiters, ticket.slot, by_arrival);
        let principal = &mut self.principals[slot as usize];
        principal
            .waiters
            .unlink(&mut self.waiters, ticket.slot, by_principal);
        let held = principal.waiters.len;
        self.move_bucket(slot, held + 1, held);
        if held == 0 {
            self.rotation
                .unlink(&mut self.principals, slot, in_rotation);
            if let Some(key) = self.principals[slot as usize].key.take() {
                self.index.remove(&key);
            }
            self.free_principals.push(slot);
        }
        self.waiters[ticket.slot as usize].sequence = 0;
        self.free_waiters.push(ticket.slot);
        Some(arrived)
    }

    fn ticket_at(&self, index: u32) -> Option<(Ticket, u64)> {
        let waiter = self.waiters.get(index as usize)?;
        Some((
            Ticket {
                sequence: waiter.sequence,
                slot: index,
            },
            waiter.arrived,
        ))
    }

    /// Moves principal `slot` from the bucket of `from` waiters to that of
    /// `to` (one more or one fewer); bucket 0 is not kept.
    fn move_bucket(&mut self, slot: u32, from: usize, to: usize) {
        if from > 0 {
            self.buckets[from].unlink(&mut self.principals, slot, in_bucket);
        }
        if to > 0 {
            if self.buckets.len() <= to {
                self.buckets.resize(to + 1, List::EMPTY);
            }
            self.buckets[to].push_back(&mut self.principals, slot, in_bucket);
        }
        if to > self.largest {
            self.largest = to;
        } else if from == self.largest && self.buckets[from].len == 0 {
            // Counts move by one, so bucket `from - 1` now holds this
            // principal (or is bucket 0: nobody waits).
            self.largest = from - 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One second on the controller's clock.
    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn rotates_between_principals_and_keeps_each_fifo() {
        let now = 7 * SECOND;
        let mut queue = WaitQueue::new();
        let a1 = queue.push("a", now);
        let a2 = queue.push("a", now);
        let a3 = queue.push("a", now);
        let b1 = queue.push("b", now);
        let c1 = queue.push("c", now);
        let order: Vec<_> = std::iter::from_fn(|| queue.pop_next().map(|(t, _)| t)).collect();
        assert_eq!(order, [a1, b1, c1, a2, a3]);
        assert!(queue.is_empty());
        assert_eq!(queue.principals(), 0);
        assert!(queue.index.is_empty());
    }

    #[test]
    fn tracks_the_largest_holder_through_pushes_and_removals() {
        let now = 7 * SECOND;
        let mut queue = WaitQueue::new();
        assert_eq!(queue.largest(), None);
        let a1 = queue.push("a", now);
        let b1 = queue.push("b", now);
        let b2 = queue.push("b", now);
        assert_eq!(queue.largest(), Some((b2, 2)));
        let a2 = queue.push("a", now);
        let a3 = queue.push("a", now);
        assert_eq!(queue.largest(), Some((a3, 3)));
        assert!(queue.remove(a1).is_some());
        assert!(queue.remove(a3).is_some());
        assert_eq!(queue.largest(), Some((b2, 2)));
        assert!(queue.remove(b1).is_some());
        // a and b both hold 1 now; a got there first.
        assert_eq!(queue.largest(), Some((a2, 1)));
        assert!(queue.remove(a2).is_some());
        assert!(queue.remove(b2).is_some());
        assert_eq!(queue.largest(), None);
        assert_eq!(queue.held_by(&"a"), 0);
    }

    #[test]
    fn a_ticket_is_removed_at_most_once_even_when_its_slot_is_reused() {
        let now = 7 * SECOND;
        let later = now + SECOND;
        let mut queue = WaitQueue::new();
        let first = queue.push(1u32, now);
        assert_eq!(queue.remove(first), Some(now));
        assert_eq!(queue.remove(first), None);
        let second = queue.push(1u32, later);
        assert_eq!(first.slot, second.slot);
        assert_eq!(queue.remove(first), None);
        assert_eq!(queue.oldest(), Some((second, later)));
    }

    proptest::proptest! {
        /// Against a plain list: counts, arrival order, rotation FIFO, and
        /// the largest holder's newest waiter.
        #[test]
        fn agrees_with_a_naive_model(ops in proptest::collection::vec((0u8..3, 0u8..5), 0..300)) {
            let now = 7 * SECOND;
            let mut queue = WaitQueue::new();
            let mut model: Vec<(Ticket, u8)> = Vec::new();
            for (kind, principal) in ops {
                match kind {
                    0 => model.push((queue.push(principal, now), principal)),
                    1 if !model.is_empty() => {
                        let (ticket, _) = model.remove(usize::from(principal) % model.len());
                        proptest::prop_assert_eq!(queue.remove(ticket), Some(now));
                    }
                    _ => {
                        if let Some((ticket, _)) = queue.pop_next() {
                            let at = model.iter().position(|&(t, _)| t == ticket).unwrap();
                            let (_, owner) = model.remove(at);
                            // FIFO within the principal.
                            proptest::prop_assert!(model[..at].iter().all(|&(_, p)| p != owner));
                        }
                    }
                }
                proptest::prop_assert_eq!(queue.len(), model.len());
                proptest::prop_assert_eq!(queue.oldest().map(|(t, _)| t), model.first().map(|&(t, _)| t));
                let count = |p: u8| model.iter().filter(|&&(_, q)| q == p).count();
                let most = (0..5).map(count).max().unwrap_or(0);
                match queue.largest() {
                    None => proptest::prop_assert_eq!(most, 0),
                    Some((ticket, held)) => {
                        proptest::prop_assert_eq!(held, most);
                        let owner = model.iter().find(|&&(t, _)| t == ticket).unwrap().1;
                        proptest::prop_assert_eq!(count(owner), most);
                        let newest = model.iter().rev().find(|&&(_, p)| p == owner).unwrap().0;
                        proptest::prop_assert_eq!(ticket, newest);
                    }
                }
                let waiting = (0..5).filter(|&p| count(p) > 0).count();
                proptest::prop_assert_eq!(queue.principals(), waiting);
                for p in 0..5 {
                    proptest::prop_assert_eq!(queue.held_by(&p), count(p));
                }
            }
        }
    }

    #[test]
    fn removal_from_the_middle_keeps_arrival_order() {
        let now = 7 * SECOND;
        let mut queue = WaitQueue::new();
        let tickets: Vec<_> = (0..5)
            .map(|i| queue.push(i % 2, now + SECOND * i))
            .collect();
        queue.remove(tickets[0]);
        queue.remove(tickets[2]);
        assert_eq!(queue.oldest().map(|(t, _)| t), Some(tickets[1]));
        assert_eq!(queue.len(), 3);
        assert_eq!(queue.held_by(&0), 1);
        assert_eq!(queue.held_by(&1), 2);
    }
}
