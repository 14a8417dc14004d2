//! The listening connection's thread: `LISTEN` on the schema's channel and
//! hand each enqueue another store announced to the store's signal sink.

use std::hash::BuildHasher;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::time::{Duration, SystemTime};

use postgres::NoTls;
use postgres::fallible_iterator::FallibleIterator;
use tessera_lease::{Namespace, QueueName};

use crate::backend::{Signal, SignalSink};

/// How a store announces its enqueues: on the schema's channel, each
/// payload `namespace\nqueue\norigin`, the origin a mark drawn when the
/// store opens. The store's own listener skips the payloads that carry its
/// mark: the store restarted the queue's pacing and woke its long-polls
/// when the enqueue committed, and an echo heard later would restart the
/// pacing a second time, after a claim had already found the queue empty.
#[derive(Debug, Clone)]
pub(super) struct Announcer {
    channel: String,
    origin: String,
}

impl Announcer {
    /// An announcer on `channel` with a fresh mark: 64 bits from the
    /// process's random hash keys, the process id and the time, so stores
    /// of one process, of processes on one host, and of hosts whose
    /// processes share an id mark differently.
    pub(super) fn new(channel: String) -> Self {
        let keys = std::collections::hash_map::RandomState::new();
        let origin = keys.hash_one((std::process::id(), SystemTime::now()));
        Self {
            channel,
            origin: format!("{origin:016x}"),
        }
    }

    /// The channel announcements go on.
    pub(super) fn channel(&self) -> &str {
        &self.channel
    }

    /// The payload announcing an enqueue to `queue`.
    pub(super) fn payload(&self, namespace: &Namespace, queue: &QueueName) -> String {
        format!("{namespace}\n{queue}\n{}", self.origin)
    }

    /// The queue a payload another store sent announces; `None` for one of
    /// this store's own or one that does not parse. A payload without an
    /// origin is another store's.
    fn heard(&self, payload: &str) -> Option<(Namespace, QueueName)> {
        let mut parts = payload.splitn(3, '\n');
        let (namespace, queue) = (parts.next()?, parts.next()?);
        if parts.next() == Some(self.origin.as_str()) {
            return None;
        }
        Some((
            Namespace::parse(namespace).ok()?,
            QueueName::parse(queue).ok()?,
        ))
    }
}

/// The listening connection's thread and what it shares.
#[derive(Default)]
pub(super) struct ListenerState {
    pub(super) stop: AtomicBool,
    pub(super) listening: AtomicBool,
    pub(super) sink: StdMutex<Option<SignalSink>>,
}

impl ListenerState {
    fn deliver(&self, signal: Signal<'_>) {
        let sink = self.sink.lock().ok().and_then(|sink| sink.clone());
        if let Some(sink) = sink {
            sink(signal);
        }
    }
}

/// The listening connection's loop: `LISTEN`, deliver each enqueue, and
/// when the connection breaks, say so (long-polls poll meanwhile) and
/// connect again, until the backend closes. Sends on `ready` each time it
/// starts listening (the first is what opening waits for).
pub(super) fn listen(
    config: &postgres::Config,
    announcer: &Announcer,
    state: &ListenerState,
    ready: &SyncSender<()>,
) {
    let channel = announcer.channel();
    let mut config = config.clone();
    config.application_name(&format!("tessera-listen {channel}"));
    let mut backoff = Duration::from_millis(50);
    while !state.stop.load(Ordering::SeqCst) {
        let mut client = match config.connect(NoTls) {
            Ok(client) => client,
            Err(_) => {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        if client
            .batch_execute(&format!("LISTEN \"{channel}\""))
            .is_err()
        {
            continue;
        }
        backoff = Duration::from_millis(50);
        state.listening.store(true, Ordering::SeqCst);
        let _ = ready.try_send(());
        // Whatever was enqueued while no one listened: look again.
        state.deliver(Signal::Lost);
        // Each call waits up to 200 ms for notifications.
        while !state.stop.load(Ordering::SeqCst) {
            if !hear(&mut client, announcer, state) {
                break;
            }
        }
        state.listening.store(false, Ordering::SeqCst);
        state.deliver(Signal::Lost);
    }
}

/// Delivers what arrives on `client` for a moment; `false` once the
/// connection broke.
fn hear(client: &mut postgres::Client, announcer: &Announcer, state: &ListenerState) -> bool {
    let broke = {
        let mut notifications = client.notifications();
        let mut heard = notifications.timeout_iter(Duration::from_millis(200));
        loop {
            match heard.next() {
                Ok(Some(notification)) => {
                    if let Some((namespace, queue)) = announcer.heard(notification.payload()) {
                        state.deliver(Signal::Enqueued {
                            namespace: &namespace,
                            queue: &queue,
                        });
                    }
                }
                Ok(None) => break false,
                Err(_) => break true,
            }
        }
    };
    !broke && !client.is_closed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_hears_other_stores_but_not_its_own_echo() {
        let (ns, queue) = (
            Namespace::parse("renders").unwrap(),
            QueueName::parse("frames").unwrap(),
        );
        let (mine, theirs) = (Announcer::new("c".into()), Announcer::new("c".into()));
        assert_ne!(mine.origin, theirs.origin);
        assert_eq!(mine.heard(&mine.payload(&ns, &queue)), None);
        let heard = Some((ns.clone(), queue.clone()));
        assert_eq!(mine.heard(&theirs.payload(&ns, &queue)), heard);
        assert_eq!(mine.heard("renders\nframes"), heard);
        assert_eq!(mine.heard("renders"), None);
        assert_eq!(mine.heard("renders\nnot a queue!"), None);
    }
}
