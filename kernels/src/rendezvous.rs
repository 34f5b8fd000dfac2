//! Hands rank 0's NVSHMEM unique id, and the seed of every random input, to the other
//! ranks over TCP.
//!
//! Rank 0 listens; every other rank connects (retrying until rank 0 is up) and sends
//! `MAGIC, rank, world, has_seed, seed` (its `--seed`, if it was given one). Rank 0 waits
//! until every rank has said hello, then decides for all of them: `MAGIC, ID_BYTES, id,
//! seed` to each (rank 0's seed: ranks started without one take it), or, when a rank was
//! started with another `--seed` than rank 0's (or anything else went wrong: a rank that
//! never came, a duplicate rank, another world size), `MAGIC, 0, length, reason` to each
//! rank that is waiting: every rank refuses to run, none reports wrong bytes. Every wait has
//! a deadline, and every failure says which address, peer and rank it concerns.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// First bytes of every message; the trailing digits are the protocol version.
pub const MAGIC: [u8; 8] = *b"CSRDZV02";
/// Length of the payload (an `nvshmemx_uniqueid_t`).
pub const ID_BYTES: usize = 128;
/// A rank's hello: magic, rank (u32 LE), world (u32 LE), has-seed (u8), seed (u64 LE).
pub const HELLO_BYTES: usize = 8 + 4 + 4 + 1 + 8;
/// Longest refusal reason sent (longer ones are cut).
const REASON_MAX: usize = 4096;

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
    #[error(
        "rendezvous at {addr}: the ranks disagree on the seed of the inputs: rank 0 has {seed}, \
         {}; every rank must generate the same inputs: start them all with the same --seed, \
         or give --seed to none (they then take rank 0's)",
        others.iter().map(|(r, s)| format!("rank {r} was started with --seed {s}")).collect::<Vec<_>>().join(", ")
    )]
    SeedMismatch {
        addr: String,
        seed: u64,
        /// (rank, its --seed) of every rank that disagrees.
        others: Vec<(usize, u64)>,
    },
    #[error("rendezvous at {addr}: rank 0 refused to start the run: {reason}")]
    Refused { addr: String, reason: String },
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

/// What rank 0 hands out: the id and the seed every rank uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreed {
    pub id: [u8; ID_BYTES],
    pub seed: u64,
}

fn io_err(addr: &str, what: impl Into<String>) -> impl FnOnce(io::Error) -> RendezvousError {
    let (addr, what) = (addr.to_string(), what.into());
    move |source| RendezvousError::Io { addr, what, source }
}

/// Rank 0: binds `addr` and serves `id` and `seed` to ranks 1..world.
pub fn serve(
    addr: &str,
    world: usize,
    id: &[u8; ID_BYTES],
    seed: u64,
    timeout: Duration,
) -> Result<(), RendezvousError> {
    let listener =
        TcpListener::bind(addr).map_err(io_err(addr, "binding the rendezvous port (in use?)"))?;
    serve_on(listener, world, id, seed, timeout)
}

/// One rank that said hello and waits for rank 0's decision.
struct Waiting {
    rank: usize,
    peer: SocketAddr,
    seed: Option<u64>,
    stream: TcpStream,
}

/// Rank 0 with a bound listener: waits for every other rank's hello, then gives each the
/// id and `seed`; or, when a rank was started with another seed or anything else failed,
/// tells every waiting rank why it must not run and returns that error.
pub fn serve_on(
    listener: TcpListener,
    world: usize,
    id: &[u8; ID_BYTES],
    seed: u64,
    timeout: Duration,
) -> Result<(), RendezvousError> {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "<unknown>".to_string());
    let mut waiting = Vec::new();
    let gathered = gather(&listener, &addr, world, timeout, &mut waiting).and_then(|()| {
        let mut others: Vec<(usize, u64)> = waiting
            .iter()
            .filter_map(|w| w.seed.filter(|s| *s != seed).map(|s| (w.rank, s)))
            .collect();
        // By rank, not by arrival: the message is the same whichever rank came first.
        others.sort_unstable();
        match others.is_empty() {
            true => Ok(()),
            false => Err(RendezvousError::SeedMismatch {
                addr: addr.clone(),
                seed,
                others,
            }),
        }
    });
    if let Err(e) = gathered {
        for w in &mut waiting {
            // Best effort: the rank learns why; rank 0's own error is what counts.
            let _ = send(&mut w.stream, &refusal(&e.to_string()));
        }
        return Err(e);
    }
    let mut answer = Vec::with_capacity(12 + ID_BYTES + 8);
    answer.extend_from_slice(&MAGIC);
    answer.extend_from_slice(&(ID_BYTES as u32).to_le_bytes());
    answer.extend_from_slice(id);
    answer.extend_from_slice(&seed.to_le_bytes());
    for w in &mut waiting {
        send(&mut w.stream, &answer).map_err(io_err(
            &addr,
            format!("sending the id to rank {} at {}", w.rank, w.peer),
        ))?;
    }
    Ok(())
}

/// Accepts until every rank 1..world has said hello (into `waiting`), or fails.
fn gather(
    listener: &TcpListener,
    addr: &str,
    world: usize,
    timeout: Duration,
    waiting: &mut Vec<Waiting>,
) -> Result<(), RendezvousError> {
    let start = Instant::now();
    let deadline = start + timeout;
    listener
        .set_nonblocking(true)
        .map_err(io_err(addr, "setting the listener non-blocking"))?;
    let mut arrived = vec![false; world];
    if let Some(first) = arrived.first_mut() {
        *first = true;
    }
    while arrived.iter().any(|s| !s) {
        match listener.accept() {
            Ok((mut stream, peer)) => {
                let (rank, seed) = read_hello(addr, &mut stream, peer, world, deadline)?;
                if std::mem::replace(&mut arrived[rank], true) {
                    return Err(RendezvousError::DuplicateRank {
                        addr: addr.to_string(),
                        peer: peer.to_string(),
                        rank,
                    });
                }
                waiting.push(Waiting {
                    rank,
                    peer,
                    seed,
                    stream,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing = arrived
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| !**s)
                        .map(|(r, _)| r)
                        .collect();
                    return Err(RendezvousError::Timeout {
                        addr: addr.to_string(),
                        waited: start.elapsed(),
                        missing,
                        world,
                    });
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(addr, "accepting a connection")(e)),
        }
    }
    Ok(())
}

/// Reads one hello and checks it; returns the peer's rank and its `--seed`, if given.
fn read_hello(
    addr: &str,
    stream: &mut TcpStream,
    peer: SocketAddr,
    world: usize,
    deadline: Instant,
) -> Result<(usize, Option<u64>), RendezvousError> {
    let peer_s = peer.to_string();
    stream
        .set_nonblocking(false)
        .map_err(io_err(addr, format!("configuring the socket of {peer}")))?;
    let step = step_timeout(deadline);
    stream
        .set_read_timeout(Some(step))
        .and_then(|()| stream.set_write_timeout(Some(step)))
        .map_err(io_err(addr, format!("setting timeouts for {peer}")))?;
    let mut magic = [0u8; 8];
    stream
        .read_exact(&mut magic)
        .map_err(io_err(addr, format!("reading the hello of {peer}")))?;
    if magic != MAGIC {
        return Err(RendezvousError::BadMagic {
            addr: addr.to_string(),
            peer: peer_s,
            got: magic,
        });
    }
    let mut hello = [0u8; HELLO_BYTES - 8];
    stream
        .read_exact(&mut hello)
        .map_err(io_err(addr, format!("reading the hello of {peer}")))?;
    let rank = u32::from_le_bytes(hello[..4].try_into().expect("4 bytes")) as usize;
    let theirs = u32::from_le_bytes(hello[4..8].try_into().expect("4 bytes")) as usize;
    let seed =
        (hello[8] != 0).then(|| u64::from_le_bytes(hello[9..17].try_into().expect("8 bytes")));
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
    Ok((rank, seed))
}

/// `MAGIC, 0, length, reason`: the run is refused.
fn refusal(reason: &str) -> Vec<u8> {
    let mut cut = reason.len().min(REASON_MAX);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = Vec::with_capacity(16 + cut);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(cut as u32).to_le_bytes());
    out.extend_from_slice(&reason.as_bytes()[..cut]);
    out
}

fn send(stream: &mut TcpStream, bytes: &[u8]) -> io::Result<()> {
    stream.set_write_timeout(Some(IO_STEP))?;
    stream.write_all(bytes).and_then(|()| stream.flush())
}

/// Ranks 1..world: connects to rank 0 at `addr` (retrying until `timeout`), says its
/// `--seed` if it was given one, and returns the id and the seed rank 0 decided; waits for
/// that decision until `timeout` (rank 0 decides once every rank has come).
pub fn join(
    addr: &str,
    rank: usize,
    world: usize,
    seed: Option<u64>,
    timeout: Duration,
) -> Result<Agreed, RendezvousError> {
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
    stream
        .set_write_timeout(Some(IO_STEP))
        .map_err(io_err(addr, "setting socket timeouts"))?;
    let mut hello = Vec::with_capacity(HELLO_BYTES);
    hello.extend_from_slice(&MAGIC);
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&(world as u32).to_le_bytes());
    hello.push(u8::from(seed.is_some()));
    hello.extend_from_slice(&seed.unwrap_or(0).to_le_bytes());
    stream
        .write_all(&hello)
        .map_err(io_err(addr, "sending the hello to rank 0"))?;
    // Rank 0 answers once every rank has come: wait for it until the deadline.
    stream
        .set_read_timeout(Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        ))
        .map_err(io_err(addr, "setting socket timeouts"))?;
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
    if len == 0 {
        return Err(RendezvousError::Refused {
            addr: addr.to_string(),
            reason: read_reason(addr, &mut stream)?,
        });
    }
    if len != ID_BYTES {
        return Err(RendezvousError::BadLength {
            addr: addr.to_string(),
            len,
        });
    }
    let mut id = [0u8; ID_BYTES];
    let mut seed_bytes = [0u8; 8];
    stream
        .read_exact(&mut id)
        .and_then(|()| stream.read_exact(&mut seed_bytes))
        .map_err(io_err(addr, "reading the id and seed from rank 0"))?;
    Ok(Agreed {
        id,
        seed: u64::from_le_bytes(seed_bytes),
    })
}

/// A refusal's reason (after `MAGIC, 0`).
fn read_reason(addr: &str, stream: &mut TcpStream) -> Result<String, RendezvousError> {
    let mut len = [0u8; 4];
    stream
        .read_exact(&mut len)
        .map_err(io_err(addr, "reading rank 0's refusal"))?;
    let len = (u32::from_le_bytes(len) as usize).min(REASON_MAX);
    let mut reason = vec![0u8; len];
    stream
        .read_exact(&mut reason)
        .map_err(io_err(addr, "reading rank 0's refusal"))?;
    Ok(String::from_utf8_lossy(&reason).into_owned())
}

/// One rank's side of the start-up, whoever started it: rank 0 makes the id (`make_id`)
/// and serves it with `seed`; every other rank joins, saying `seed` only when it was
/// given on its command line (`given`), and takes rank 0's. One rank alone needs no
/// rendezvous. Returns the id and the seed every rank of the run uses.
pub fn agree(
    addr: Option<&str>,
    rank: usize,
    world: usize,
    seed: u64,
    given: bool,
    make_id: impl FnOnce() -> anyhow::Result<[u8; ID_BYTES]>,
    timeout: Duration,
) -> anyhow::Result<Agreed> {
    if world == 1 {
        return Ok(Agreed {
            id: make_id()?,
            seed,
        });
    }
    let addr = addr.ok_or_else(|| {
        anyhow::anyhow!(
            "WORLD_SIZE > 1 needs a rendezvous address where rank 0 listens: --rdzv HOST:PORT or COMMSTACK_RDZV_ADDR"
        )
    })?;
    if rank == 0 {
        let id = make_id()?;
        serve(addr, world, &id, seed, timeout)?;
        Ok(Agreed { id, seed })
    } else {
        Ok(join(addr, rank, world, given.then_some(seed), timeout)?)
    }
}

/// Time left until `deadline`, capped at [`IO_STEP`] and at least 1 ms (a zero socket
/// timeout means "none").
fn step_timeout(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .clamp(Duration::from_millis(1), IO_STEP)
}
