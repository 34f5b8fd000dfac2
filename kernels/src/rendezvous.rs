//! Hands rank 0's NVSHMEM unique id to the other ranks over TCP.
//!
//! Rank 0 listens; every other rank connects (retrying until rank 0 is up), sends
//! `MAGIC, rank, world` and receives `MAGIC, length, id`. Every wait has a deadline,
//! and every failure says which address, peer and rank it concerns.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// First bytes of every message; the trailing digits are the protocol version.
pub const MAGIC: [u8; 8] = *b"CSRDZV01";
/// Length of the payload (an `nvshmemx_uniqueid_t`).
pub const ID_BYTES: usize = 128;

/// Longest single blocking read or write while talking to one peer.
const IO_STEP: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error(
        "rendezvous at {addr}: timed out after {waited:?} waiting for rank(s) {missing:?} of \
         {world} (did they start, with the same rendezvous address?)"
    )]
    Timeout {
        addr: String,
        waited: Duration,
        missing: Vec<usize>,
        world: usize,
    },
    #[error(
        "rendezvous at {addr}: rank 0 not reachable within {waited:?}; last error: {last_error}"
    )]
    Unreachable {
        addr: String,
        waited: Duration,
        last_error: String,
    },
    #[error(
        "rendezvous at {addr}: {peer} sent {got:02x?} where the magic {MAGIC:02x?} belongs: \
         not a commstack-selftest rendezvous peer, or another protocol version"
    )]
    BadMagic {
        addr: String,
        peer: String,
        got: [u8; 8],
    },
    #[error("rendezvous at {addr}: {peer} has WORLD_SIZE={theirs}, this rank has {ours}")]
    WorldMismatch {
        addr: String,
        peer: String,
        theirs: usize,
        ours: usize,
    },
    #[error("rendezvous at {addr}: {peer} claims rank {rank}, which is not in 1..{world}")]
    BadRank {
        addr: String,
        peer: String,
        rank: usize,
        world: usize,
    },
    #[error("rendezvous at {addr}: rank {rank} connected twice (second time from {peer})")]
    DuplicateRank {
        addr: String,
        peer: String,
        rank: usize,
    },
    #[error("rendezvous at {addr}: rank 0 announced a {len}-byte id, expected {ID_BYTES}")]
    BadLength { addr: String, len: usize },
    #[error("rendezvous at {addr}: {what}: {source}")]
    Io {
        addr: String,
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(addr: &str, what: impl Into<String>) -> impl FnOnce(io::Error) -> RendezvousError {
    let (addr, what) = (addr.to_string(), what.into());
    move |source| RendezvousError::Io { addr, what, source }
}

/// Rank 0: binds `addr` and serves `id` to ranks 1..world.
pub fn serve(
    addr: &str,
    world: usize,
    id: &[u8; ID_BYTES],
    timeout: Duration,
) -> Result<(), RendezvousError> {
    let listener =
        TcpListener::bind(addr).map_err(io_err(addr, "binding the rendezvous port (in use?)"))?;
    serve_on(listener, world, id, timeout)
}

/// Rank 0 with a bound listener: returns once every other rank has received `id`.
pub fn serve_on(
    listener: TcpListener,
    world: usize,
    id: &[u8; ID_BYTES],
    timeout: Duration,
) -> Result<(), RendezvousError> {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "<unknown>".to_string());
    let start = Instant::now();
    let deadline = start + timeout;
    listener
        .set_nonblocking(true)
        .map_err(io_err(&addr, "setting the listener non-blocking"))?;
    let mut served = vec![false; world];
    if let Some(first) = served.first_mut() {
        *first = true;
    }
    while served.iter().any(|s| !s) {
        match listener.accept() {
            Ok((mut stream, peer)) => {
                let rank = read_hello(&addr, &mut stream, peer, world, deadline)?;
                if std::mem::replace(&mut served[rank], true) {
                    return Err(RendezvousError::DuplicateRank {
                        addr,
                        peer: peer.to_string(),
                        rank,
                    });
                }
                send_id(&addr, &mut stream, peer, rank, id)?;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing = served
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| !**s)
                        .map(|(r, _)| r)
                        .collect();
                    return Err(RendezvousError::Timeout {
                        addr,
                        waited: start.elapsed(),
                        missing,
                        world,
                    });
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(&addr, "accepting a connection")(e)),
        }
    }
    Ok(())
}

/// Reads one hello and checks it; returns the peer's rank.
fn read_hello(
    addr: &str,
    stream: &mut TcpStream,
    peer: SocketAddr,
    world: usize,
    deadline: Instant,
) -> Result<usize, RendezvousError> {
    let peer_s = peer.to_string();
    stream
        .set_nonblocking(false)
        .map_err(io_err(addr, format!("configuring the socket of {peer}")))?;
    let step = step_timeout(deadline);
    stream
        .set_read_timeout(Some(step))
        .and_then(|()| stream.set_write_timeout(Some(step)))
        .map_err(io_err(addr, format!("setting timeouts for {peer}")))?;
    let mut hello = [0u8; 16];
    stream
        .read_exact(&mut hello)
        .map_err(io_err(addr, format!("reading the hello of {peer}")))?;
    let got: [u8; 8] = hello[..8].try_into().expect("8 bytes");
    if got != MAGIC {
        return Err(RendezvousError::BadMagic {
            addr: addr.to_string(),
            peer: peer_s,
            got,
        });
    }
    let rank = u32::from_le_bytes(hello[8..12].try_into().expect("4 bytes")) as usize;
    let theirs = u32::from_le_bytes(hello[12..16].try_into().expect("4 bytes")) as usize;
    if theirs != world {
        return Err(RendezvousError::WorldMismatch {
            addr: addr.to_string(),
            peer: peer_s,
            theirs,
            ours: world,
        });
    }
    if rank == 0 || rank >= world {
        return Err(RendezvousError::BadRank {
            addr: addr.to_string(),
            peer: peer_s,
            rank,
            world,
        });
    }
    Ok(rank)
}

fn send_id(
    addr: &str,
    stream: &mut TcpStream,
    peer: SocketAddr,
    rank: usize,
    id: &[u8; ID_BYTES],
) -> Result<(), RendezvousError> {
    let mut reply = Vec::with_capacity(12 + ID_BYTES);
    reply.extend_from_slice(&MAGIC);
    reply.extend_from_slice(&(ID_BYTES as u32).to_le_bytes());
    reply.extend_from_slice(id);
    stream
        .write_all(&reply)
        .and_then(|()| stream.flush())
        .map_err(io_err(
            addr,
            format!("sending the id to rank {rank} at {peer}"),
        ))
}

/// Ranks 1..world: connects to rank 0 at `addr` (retrying until `timeout`) and
/// returns the id it serves.
pub fn join(
    addr: &str,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> Result<[u8; ID_BYTES], RendezvousError> {
    let start = Instant::now();
    let deadline = start + timeout;
    let target: SocketAddr = addr
        .to_socket_addrs()
        .map_err(io_err(addr, "resolving the rendezvous address"))?
        .next()
        .ok_or_else(|| {
            io_err(addr, "resolving the rendezvous address")(io::Error::new(
                io::ErrorKind::NotFound,
                "no address",
            ))
        })?;
    let mut stream = loop {
        let attempt = step_timeout(deadline).min(Duration::from_secs(2));
        match TcpStream::connect_timeout(&target, attempt) {
            Ok(s) => break s,
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(RendezvousError::Unreachable {
                        addr: addr.to_string(),
                        waited: start.elapsed(),
                        last_error: e.to_string(),
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    // Rank 0 answers as soon as it accepts, so one step is enough whatever the deadline.
    stream
        .set_read_timeout(Some(IO_STEP))
        .and_then(|()| stream.set_write_timeout(Some(IO_STEP)))
        .map_err(io_err(addr, "setting socket timeouts"))?;
    let mut hello = Vec::with_capacity(16);
    hello.extend_from_slice(&MAGIC);
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&(world as u32).to_le_bytes());
    stream
        .write_all(&hello)
        .map_err(io_err(addr, "sending the hello to rank 0"))?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).map_err(io_err(
        addr,
        "reading rank 0's answer (it closes the connection when it rejects a rank: see its log)",
    ))?;
    let got: [u8; 8] = head[..8].try_into().expect("8 bytes");
    if got != MAGIC {
        return Err(RendezvousError::BadMagic {
            addr: addr.to_string(),
            peer: format!("rank 0 ({target})"),
            got,
        });
    }
    let len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
    if len != ID_BYTES {
        return Err(RendezvousError::BadLength {
            addr: addr.to_string(),
            len,
        });
    }
    let mut id = [0u8; ID_BYTES];
    stream
        .read_exact(&mut id)
        .map_err(io_err(addr, "reading the id from rank 0"))?;
    Ok(id)
}

/// Time left until `deadline`, capped at [`IO_STEP`] and at least 1 ms (a zero socket
/// timeout means "none").
fn step_timeout(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .clamp(Duration::from_millis(1), IO_STEP)
}
