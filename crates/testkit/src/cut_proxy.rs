//! A TCP proxy on 127.0.0.1 that can cut a server off midway: "the registry killed in the
//! middle of a blob", as a client sees it, at a byte count rather than a moment.
//!
//! It forwards bytes both ways untouched (TLS passes through: a certificate for 127.0.0.1
//! is as valid on the proxy's port as on the server's, since TLS does not check ports).
//! [`CutProxy::cut_after`] arms it: once that many more bytes have passed in one
//! direction, every connection is shut down (both sockets, both ways) and the listening
//! port is closed, so that retries are refused as they would be by a dead server.
//! [`CutProxy::heal`] opens the port again. Byte counts, not timers: where the cut lands
//! in a stream does not depend on how fast the machine is.
//!
//! ```no_run
//! use commstack_testkit::{CutProxy, Direction, TestRegistry};
//! let registry = TestRegistry::start();
//! let proxy = CutProxy::start(&registry.host());
//! proxy.cut_after(Direction::ToServer, 16 << 20);
//! // ... push to proxy.host(): fails after 16 MiB more were sent ...
//! assert!(proxy.is_cut());
//! proxy.heal();
//! // ... push again: the rerun ...
//! ```

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Which way bytes go through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Client to server: what a push sends.
    ToServer,
    /// Server to client: what a pull receives.
    ToClient,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::ToServer => 0,
            Direction::ToClient => 1,
        }
    }
}

/// A cutting proxy in front of one server; stops (cutting everything) when dropped.
pub struct CutProxy {
    port: u16,
    shared: Arc<Shared>,
    accepting: Option<JoinHandle<()>>,
}

struct Shared {
    upstream: SocketAddr,
    /// None while cut: connections are refused.
    listener: Mutex<Option<TcpListener>>,
    state: Mutex<State>,
    stop: AtomicBool,
}

#[derive(Default)]
struct State {
    /// The armed direction and the bytes it may still pass before the cut.
    armed: Option<(Direction, u64)>,
    cut: bool,
    /// Bytes forwarded each way since the start ([`Direction::index`]).
    moved: [u64; 2],
    /// Both sockets of each open connection (clones), to shut them down on a cut.
    connections: Vec<(u64, TcpStream, TcpStream)>,
    next_id: u64,
}

impl CutProxy {
    /// Listens on a free 127.0.0.1 port and forwards each connection to `upstream`
    /// (`HOST:PORT`, e.g. [`crate::TestRegistry::host`]).
    pub fn start(upstream: &str) -> CutProxy {
        let upstream: SocketAddr = upstream
            .parse()
            .unwrap_or_else(|e| panic!("{upstream:?} is not an address HOST:PORT: {e}"));
        let listener = listen(0);
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream,
            listener: Mutex::new(Some(listener)),
            state: Mutex::new(State::default()),
            stop: AtomicBool::new(false),
        });
        let accepting = {
            let shared = shared.clone();
            std::thread::spawn(move || accept_loop(&shared))
        };
        CutProxy {
            port,
            shared,
            accepting: Some(accepting),
        }
    }

    /// `127.0.0.1:PORT`: where clients connect instead of the server.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Arms the cut: after `bytes` more bytes have passed `direction` (on all connections
    /// together), the proxy forwards no more, shuts every connection down and refuses new
    /// ones until [`CutProxy::heal`]. `bytes` = 0 cuts at once.
    pub fn cut_after(&self, direction: Direction, bytes: u64) {
        let cut_now = {
            let mut state = self.shared.state();
            state.armed = Some((direction, bytes));
            bytes == 0
        };
        if cut_now {
            self.shared.cut();
        }
    }

    /// Whether the cut happened (and no heal since).
    pub fn is_cut(&self) -> bool {
        self.shared.state().cut
    }

    /// Disarms, and accepts connections again (on the same port).
    pub fn heal(&self) {
        let mut listener = self.shared.listener.lock().unwrap();
        let mut state = self.shared.state();
        state.armed = None;
        state.cut = false;
        if listener.is_none() {
            *listener = Some(listen(self.port));
        }
    }

    /// Bytes forwarded in `direction` since the proxy started: a test takes the
    /// difference over an operation to see what it moved.
    pub fn moved(&self, direction: Direction) -> u64 {
        self.shared.state().moved[direction.index()]
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.cut();
        if let Some(thread) = self.accepting.take() {
            let _ = thread.join();
        }
    }
}

/// A listener on 127.0.0.1:`port` (0: any), non-blocking so the accept loop can notice a
/// cut or the stop. std sets SO_REUSEADDR: the port is taken again after a cut even with
/// connections in TIME_WAIT.
fn listen(port: u16) -> TcpListener {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("the cut proxy cannot listen on 127.0.0.1:{port}: {e}"));
    listener.set_nonblocking(true).unwrap();
    listener
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// The cut: the port closed (refusing, as a dead server does) and every connection
    /// shut down both ways, so that both ends see it at once.
    fn cut(&self) {
        let mut listener = self.listener.lock().unwrap();
        let mut state = self.state();
        state.cut = true;
        state.armed = None;
        *listener = None;
        for (_, client, server) in &state.connections {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
    }

    /// Of `n` bytes read going `direction`, how many may be forwarded; counts them. The
    /// second value says that they are the last before the cut.
    fn allow(&self, direction: Direction, n: usize) -> (usize, bool) {
        let mut state = self.state();
        if state.cut {
            return (0, false);
        }
        let (allowed, last) = match &mut state.armed {
            Some((armed, left)) if *armed == direction => {
                let allowed = (n as u64).min(*left);
                *left -= allowed;
                (allowed as usize, *left == 0)
            }
            _ => (n, false),
        };
        state.moved[direction.index()] += allowed as u64;
        (allowed, last)
    }
}

fn accept_loop(shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        let accepted = match &*shared.listener.lock().unwrap() {
            Some(listener) => listener.accept().map(|(stream, _)| stream),
            None => Err(ErrorKind::WouldBlock.into()),
        };
        match accepted {
            Ok(client) => {
                let shared = shared.clone();
                std::thread::spawn(move || connection(&shared, client));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Forwards one connection both ways until either side closes or the cut.
fn connection(shared: &Arc<Shared>, client: TcpStream) {
    // The accepted socket inherits non-blocking from the listener on some systems.
    let _ = client.set_nonblocking(false);
    let Ok(server) = TcpStream::connect(shared.upstream) else {
        return; // The server is down: the client sees its connection closed.
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let id = {
        let mut state = shared.state();
        if state.cut {
            return; // Accepted just before the cut.
        }
        let id = state.next_id;
        state.next_id += 1;
        let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) else {
            return;
        };
        state.connections.push((id, c, s));
        id
    };
    let up = {
        let (shared, from, to) = (shared.clone(), client.try_clone(), server.try_clone());
        std::thread::spawn(move || {
            if let (Ok(from), Ok(to)) = (from, to) {
                pump(&shared, from, to, Direction::ToServer);
            }
        })
    };
    pump(shared, server, client, Direction::ToClient);
    let _ = up.join();
    shared.state().connections.retain(|(i, ..)| *i != id);
}

/// Copies `from` to `to` as the proxy allows; passes a clean close on (half-close).
fn pump(shared: &Shared, mut from: TcpStream, mut to: TcpStream, direction: Direction) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => n,
        };
        let (allowed, last) = shared.allow(direction, n);
        if to.write_all(&buf[..allowed]).is_err() {
            return;
        }
        if last {
            // The bytes up to the limit are on their way (queued before the FIN); then
            // nothing more, on any connection.
            shared.cut();
        }
        if allowed < n {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A server that reports, per connection, how many bytes it read before EOF; it
    /// first sends `greeting` bytes.
    fn server(greeting: usize) -> (String, mpsc::Receiver<usize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let (mut stream, tx) = (stream.unwrap(), tx.clone());
                std::thread::spawn(move || {
                    let _ = stream.write_all(&vec![7u8; greeting]);
                    let mut buf = Vec::new();
                    let _ = stream.read_to_end(&mut buf);
                    let _ = tx.send(buf.len());
                });
            }
        });
        (host, rx)
    }

    #[test]
    fn cuts_at_the_byte_refuses_until_healed_then_forwards_again() {
        let (host, received) = server(0);
        let proxy = CutProxy::start(&host);
        proxy.cut_after(Direction::ToServer, 1000);
        let mut client = TcpStream::connect(proxy.host()).unwrap();
        // Sent in pieces: the cut lands inside the third.
        for _ in 0..5 {
            if client.write_all(&[1u8; 400]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let got = received.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(got, 1000, "the server got exactly the bytes before the cut");
        assert!(proxy.is_cut());
        let refused = TcpStream::connect(proxy.host()).unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);

        proxy.heal();
        let before = proxy.moved(Direction::ToServer);
        let mut client = TcpStream::connect(proxy.host()).unwrap();
        client.write_all(&[2u8; 5000]).unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        assert_eq!(received.recv_timeout(Duration::from_secs(5)).unwrap(), 5000);
        assert_eq!(proxy.moved(Direction::ToServer) - before, 5000);
    }

    #[test]
    fn a_cut_toward_the_client_delivers_exactly_the_bytes_before_it() {
        let (host, _received) = server(10_000);
        let proxy = CutProxy::start(&host);
        proxy.cut_after(Direction::ToClient, 3000);
        let mut client = TcpStream::connect(proxy.host()).unwrap();
        let mut got = Vec::new();
        let _ = client.read_to_end(&mut got);
        assert_eq!(got.len(), 3000);
        assert!(proxy.is_cut());
        assert_eq!(proxy.moved(Direction::ToClient), 3000);
    }
}
