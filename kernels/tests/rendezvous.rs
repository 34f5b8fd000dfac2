//! The unique-id and seed rendezvous over real loopback sockets.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use commstack_kernels::rendezvous::{self, Agreed, HELLO_BYTES, ID_BYTES, MAGIC, RendezvousError};

fn id() -> [u8; ID_BYTES] {
    std::array::from_fn(|i| (i as u8).wrapping_mul(37).wrapping_add(1))
}

const SEED: u64 = 4242;

fn agreed() -> Agreed {
    Agreed {
        id: id(),
        seed: SEED,
    }
}

fn listener() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    (l, addr)
}

#[test]
fn every_rank_receives_rank_zeros_id() {
    let world = 6;
    let (l, addr) = listener();
    let server =
        thread::spawn(move || rendezvous::serve_on(l, world, &id(), SEED, Duration::from_secs(20)));
    let clients: Vec<_> = (1..world)
        .map(|rank| {
            let addr = addr.clone();
            thread::spawn(move || {
                rendezvous::join(&addr, rank, world, None, Duration::from_secs(20))
            })
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap().unwrap(), agreed());
    }
    server.join().unwrap().unwrap();
}

#[test]
fn ranks_may_start_before_rank_zero_listens() {
    // Reserve a port, release it, and start rank 0 only after the others try.
    let (l, addr) = listener();
    drop(l);
    let clients: Vec<_> = (1..3)
        .map(|rank| {
            let addr = addr.clone();
            thread::spawn(move || rendezvous::join(&addr, rank, 3, None, Duration::from_secs(20)))
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    rendezvous::serve(&addr, 3, &id(), SEED, Duration::from_secs(20)).unwrap();
    for c in clients {
        assert_eq!(c.join().unwrap().unwrap(), agreed());
    }
}

#[test]
fn a_rank_that_never_comes_times_out_naming_it() {
    let (l, addr) = listener();
    let started = Instant::now();
    let server =
        thread::spawn(move || rendezvous::serve_on(l, 3, &id(), SEED, Duration::from_millis(600)));
    // Rank 1 came: it waits for rank 0's decision, and is told why there is none.
    let told = rendezvous::join(&addr, 1, 3, None, Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(&told, RendezvousError::Refused { reason, .. } if reason.contains("[2]")),
        "{told:?}"
    );
    let err = server.join().unwrap().unwrap_err();
    match &err {
        RendezvousError::Timeout { missing, world, .. } => {
            assert_eq!((missing.as_slice(), *world), (&[2][..], 3))
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(err.to_string().contains("[2]"), "{err}");
}

#[test]
fn joining_without_rank_zero_times_out() {
    let (l, addr) = listener();
    drop(l);
    let started = Instant::now();
    let err = rendezvous::join(&addr, 1, 2, None, Duration::from_millis(500)).unwrap_err();
    assert!(
        matches!(err, RendezvousError::Unreachable { .. }),
        "{err:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(500)
            && started.elapsed() < Duration::from_secs(5)
    );
}

#[test]
fn rank_zero_rejects_a_peer_with_the_wrong_magic() {
    let (l, addr) = listener();
    let server =
        thread::spawn(move || rendezvous::serve_on(l, 2, &id(), SEED, Duration::from_secs(10)));
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    let err = server.join().unwrap().unwrap_err();
    assert!(
        matches!(&err, RendezvousError::BadMagic { got, .. } if got == b"GET / HT"),
        "{err:?}"
    );
    // The peer learns nothing: the connection closes without an id.
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert!(buf.is_empty());
}

#[test]
fn a_rank_rejects_an_answer_with_the_wrong_magic() {
    let (l, addr) = listener();
    let fake = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut hello = [0u8; HELLO_BYTES];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..8], &MAGIC);
        s.write_all(b"NOTMAGIC\x80\0\0\0").unwrap();
        s.write_all(&[0u8; ID_BYTES]).unwrap();
    });
    let err = rendezvous::join(&addr, 1, 2, None, Duration::from_secs(10)).unwrap_err();
    fake.join().unwrap();
    assert!(
        matches!(&err, RendezvousError::BadMagic { got, .. } if got == b"NOTMAGIC"),
        "{err:?}"
    );
}

#[test]
fn mismatched_world_sizes_and_duplicate_ranks_are_errors() {
    let (l, addr) = listener();
    let server =
        thread::spawn(move || rendezvous::serve_on(l, 3, &id(), SEED, Duration::from_secs(10)));
    let err = rendezvous::join(&addr, 1, 4, None, Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(err, RendezvousError::Io { .. }),
        "the rejected rank sees a closed connection: {err:?}"
    );
    let err = server.join().unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            RendezvousError::WorldMismatch {
                theirs: 4,
                ours: 3,
                ..
            }
        ),
        "{err:?}"
    );

    let (l, addr) = listener();
    let server =
        thread::spawn(move || rendezvous::serve_on(l, 3, &id(), SEED, Duration::from_secs(10)));
    let first = {
        let addr = addr.clone();
        thread::spawn(move || rendezvous::join(&addr, 1, 3, None, Duration::from_secs(5)))
    };
    thread::sleep(Duration::from_millis(200));
    let dup = rendezvous::join(&addr, 1, 3, None, Duration::from_secs(5));
    assert!(dup.is_err(), "a duplicate rank must not receive the id");
    let first = first.join().unwrap().unwrap_err();
    assert!(
        matches!(&first, RendezvousError::Refused { reason, .. } if reason.contains("connected twice")),
        "the waiting rank is told: {first:?}"
    );
    let err = server.join().unwrap().unwrap_err();
    assert!(
        matches!(err, RendezvousError::DuplicateRank { rank: 1, .. }),
        "{err:?}"
    );
}

/// Starts rank 0 (serving `SEED`) and ranks 1..world with the given `--seed`s; returns
/// rank 0's result and each other rank's.
fn run_group(
    seeds: &[Option<u64>],
) -> (
    Result<(), RendezvousError>,
    Vec<Result<Agreed, RendezvousError>>,
) {
    let world = seeds.len() + 1;
    let (l, addr) = listener();
    let server =
        thread::spawn(move || rendezvous::serve_on(l, world, &id(), SEED, Duration::from_secs(20)));
    let ranks: Vec<_> = seeds
        .iter()
        .enumerate()
        .map(|(i, seed)| {
            let (addr, seed) = (addr.clone(), *seed);
            thread::spawn(move || {
                rendezvous::join(&addr, i + 1, world, seed, Duration::from_secs(20))
            })
        })
        .collect();
    let others = ranks.into_iter().map(|r| r.join().unwrap()).collect();
    (server.join().unwrap(), others)
}

#[test]
fn ranks_without_a_seed_take_rank_zeros_and_the_same_seed_agrees() {
    let (zero, others) = run_group(&[None, Some(SEED), None]);
    zero.unwrap();
    for r in others {
        assert_eq!(r.unwrap(), agreed());
    }
}

#[test]
fn a_rank_started_with_another_seed_makes_every_rank_refuse() {
    // Two PEs started by hand with different seeds: before, each drew its own inputs and
    // reported nearly every byte wrong. Now nobody gets the id, so nobody runs.
    let (zero, others) = run_group(&[Some(SEED + 1), None, Some(SEED), Some(7)]);
    let err = zero.unwrap_err();
    match &err {
        RendezvousError::SeedMismatch { seed, others, .. } => {
            assert_eq!(*seed, SEED);
            assert_eq!(others, &[(1, SEED + 1), (4, 7)]);
        }
        other => panic!("expected a seed mismatch, got {other:?}"),
    }
    let said = err.to_string();
    assert!(
        said.contains("rank 1 was started with --seed 4243")
            && said.contains("rank 4 was started with --seed 7")
            && said.contains("the same --seed"),
        "{said}"
    );
    for (i, r) in others.into_iter().enumerate() {
        match r {
            Err(RendezvousError::Refused { reason, .. }) => {
                assert!(
                    reason.contains("rank 0 has 4242"),
                    "rank {}: {reason}",
                    i + 1
                )
            }
            other => panic!("rank {} was not refused: {other:?}", i + 1),
        }
    }
}

/// `agree` as the self-test's two processes call it, over a fresh loopback address: rank 0
/// with `SEED` in a thread, rank 1 with `seed` here (only rank 0 makes the id); `given`:
/// both were started with `--seed`. Returns rank 0's result and rank 1's.
fn agree_two(seed: u64, given: bool) -> (anyhow::Result<Agreed>, anyhow::Result<Agreed>) {
    let (l, addr) = listener();
    drop(l);
    let zero = {
        let addr = addr.clone();
        thread::spawn(move || {
            rendezvous::agree(
                Some(&addr),
                0,
                2,
                SEED,
                given,
                || Ok(id()),
                Duration::from_secs(20),
            )
        })
    };
    let one = rendezvous::agree(
        Some(&addr),
        1,
        2,
        seed,
        given,
        || panic!("only rank 0 makes the id"),
        Duration::from_secs(20),
    );
    (zero.join().unwrap(), one)
}

#[test]
fn agree_serves_rank_zeros_seed_and_id_and_one_rank_needs_no_rendezvous() {
    // One rank: its own id and seed, no address needed.
    let alone =
        rendezvous::agree(None, 0, 1, 9, false, || Ok(id()), Duration::from_secs(1)).unwrap();
    assert_eq!(alone, Agreed { id: id(), seed: 9 });
    // Two ranks: rank 1 drew its own seed (not given) and takes rank 0's.
    let (zero, one) = agree_two(123, false);
    assert_eq!(one.unwrap(), agreed());
    assert_eq!(zero.unwrap(), agreed());
    // Given explicitly and different: refused.
    let (zero, one) = agree_two(123, true);
    assert!(format!("{:#}", one.unwrap_err()).contains("refused"));
    assert!(format!("{:#}", zero.unwrap_err()).contains("rank 1 was started with --seed 123"));
    // More than one rank and no address: said.
    let err =
        rendezvous::agree(None, 1, 2, 1, false, || Ok(id()), Duration::from_secs(1)).unwrap_err();
    assert!(err.to_string().contains("COMMSTACK_RDZV_ADDR"), "{err}");
}
