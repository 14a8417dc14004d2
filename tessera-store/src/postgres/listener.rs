//! The listening connection's thread: `LISTEN` on the schema's channel and
//! hand each enqueue to the store's signal sink.

use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use postgres::NoTls;
use postgres::fallible_iterator::FallibleIterator;
use tessera_lease::{Namespace, QueueName};

use crate::backend::{Signal, SignalSink};

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
/// connect again, until the backend closes.
pub(super) fn listen(config: &postgres::Config, channel: &str, state: &ListenerState) {
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
        // Whatever was enqueued while no one listened: look again.
        state.deliver(Signal::Lost);
        // Each call waits up to 200 ms for notifications.
        while !state.stop.load(Ordering::SeqCst) {
            if !hear(&mut client, state) {
                break;
            }
        }
        state.listening.store(false, Ordering::SeqCst);
        state.deliver(Signal::Lost);
    }
}

/// Delivers what arrives on `client` for a moment; `false` once the
/// connection broke.
fn hear(client: &mut postgres::Client, state: &ListenerState) -> bool {
    let broke = {
        let mut notifications = client.notifications();
        let mut heard = notifications.timeout_iter(Duration::from_millis(200));
        loop {
            match heard.next() {
                Ok(Some(notification)) => deliver(state, notification.payload()),
                Ok(None) => break false,
                Err(_) => break true,
            }
        }
    };
    !broke && !client.is_closed()
}

/// Delivers one enqueue's notification (`namespace\nqueue`).
fn deliver(state: &ListenerState, payload: &str) {
    let Some((namespace, queue)) = payload.split_once('\n') else {
        return;
    };
    if let (Ok(namespace), Ok(queue)) = (Namespace::parse(namespace), QueueName::parse(queue)) {
        state.deliver(Signal::Enqueued {
            namespace: &namespace,
            queue: &queue,
        });
    }
}
