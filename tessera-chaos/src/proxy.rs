//! A TCP proxy between the store and its server that a run can cut (drop
//! every connection and refuse new ones) or stall (hold every byte), and
//! then restore: a network fault without touching the server.

use std::io::{self, Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

const OPEN: u8 = 0;
const CUT: u8 = 1;
const STALLED: u8 = 2;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Bytes flow.
    Open,
    /// Every connection is dropped and new ones are refused.
    Cut,
    /// Connections stay open but no byte moves.
    Stalled,
}

#[derive(Debug)]
struct Shared {
    target: SocketAddr,
    link: AtomicU8,
    stopping: AtomicBool,
    /// Both ends of every live connection, to drop them on a cut.
    live: Mutex<Vec<(TcpStream, TcpStream)>>,
}

/// A proxy listening on a local port and forwarding to `target`.
#[derive(Debug)]
pub struct TcpProxy {
    address: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl TcpProxy {
    /// Starts a proxy on a free local port that forwards to `target`.
    pub fn start(target: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target,
            link: AtomicU8::new(OPEN),
            stopping: AtomicBool::new(false),
            live: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || accept(&listener, &shared))
        };
        Ok(Self {
            address,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Sets what the proxy does to traffic from now on; a cut drops every
    /// connection at once.
    pub fn set(&self, link: Link) {
        let value = match link {
            Link::Open => OPEN,
            Link::Cut => CUT,
            Link::Stalled => STALLED,
        };
        self.shared.link.store(value, Ordering::SeqCst);
        if link == Link::Cut {
            for (client, server) in self.shared.live.lock().drain(..) {
                let _ = client.shutdown(Shutdown::Both);
                let _ = server.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.set(Link::Cut);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stopping.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(_) => continue,
        };
        if shared.link.load(Ordering::SeqCst) == CUT {
            drop(client);
            continue;
        }
        let _ = connect(client, shared);
    }
}

fn connect(client: TcpStream, shared: &Arc<Shared>) -> io::Result<()> {
    client.set_nonblocking(false)?;
    let server = TcpStream::connect_timeout(&shared.target, Duration::from_secs(5))?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    shared
        .live
        .lock()
        .push((client.try_clone()?, server.try_clone()?));
    for (from, to) in [(client.try_clone()?, server.try_clone()?), (server, client)] {
        let shared = Arc::clone(shared);
        std::thread::spawn(move || pump(from, to, &shared));
    }
    Ok(())
}

/// Copies bytes one way until either end closes or the link is cut.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buffer = vec![0_u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        while shared.link.load(Ordering::SeqCst) == STALLED {
            std::thread::sleep(Duration::from_millis(5));
        }
        if shared.link.load(Ordering::SeqCst) == CUT || to.write_all(&buffer[..read]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port.
    fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                std::thread::spawn(move || {
                    let mut buffer = [0_u8; 64];
                    while let Ok(read) = stream.read(&mut buffer) {
                        if read == 0 || stream.write_all(&buffer[..read]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        address
    }

    fn round_trip(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
        stream.write_all(b"ping")?;
        let mut answer = [0_u8; 4];
        stream.read_exact(&mut answer)?;
        Ok(answer.to_vec())
    }

    #[test]
    fn forwards_then_cuts_then_forwards_again() {
        let proxy = TcpProxy::start(echo()).unwrap();
        let mut before = TcpStream::connect(proxy.address()).unwrap();
        assert_eq!(round_trip(&mut before).unwrap(), b"ping");
        proxy.set(Link::Cut);
        // The live connection is dropped.
        assert!(round_trip(&mut before).is_err());
        proxy.set(Link::Open);
        let mut after = TcpStream::connect(proxy.address()).unwrap();
        assert_eq!(round_trip(&mut after).unwrap(), b"ping");
    }

    #[test]
    fn a_stall_holds_bytes_until_restored() {
        let proxy = TcpProxy::start(echo()).unwrap();
        let mut stream = TcpStream::connect(proxy.address()).unwrap();
        assert_eq!(round_trip(&mut stream).unwrap(), b"ping");
        proxy.set(Link::Stalled);
        stream
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        assert!(
            round_trip(&mut stream).is_err(),
            "no byte moves while stalled"
        );
        proxy.set(Link::Open);
        stream.set_read_timeout(None).unwrap();
        let mut answer = [0_u8; 4];
        stream.read_exact(&mut answer).unwrap();
        assert_eq!(&answer, b"ping");
    }
}
