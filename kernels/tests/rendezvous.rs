//! The unique-id rendezvous over real loopback sockets.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use commstack_kernels::rendezvous::{self, ID_BYTES, MAGIC, RendezvousError};

fn id() -> [u8; ID_BYTES] {
    std::array::from_fn(|i| (i as u8).wrapping_mul(37).wrapping_add(1))
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
        thread::spawn(move || rendezvous::serve_on(l, world, &id(), Duration::from_secs(20)));
    let clients: Vec<_> = (1..world)
        .map(|rank| {
            let addr = addr.clone();
            thread::spawn(move || rendezvous::join(&addr, rank, world, Duration::from_secs(20)))
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap().unwrap(), id());
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
            thread::spawn(move || rendezvous::join(&addr, rank, 3, Duration::from_secs(20)))
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    rendezvous::serve(&addr, 3, &id(), Duration::from_secs(20)).unwrap();
    for c in clients {
        assert_eq!(c.join().unwrap().unwrap(), id());
    }
}

#[test]
fn a_rank_that_never_comes_times_out_naming_it() {
    let (l, addr) = listener();
    let server =
        thread::spawn(move || rendezvous::serve_on(l, 3, &id(), Duration::from_millis(600)));
    rendezvous::join(&addr, 1, 3, Duration::from_secs(5)).unwrap();
    let started = Instant::now();
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
    let err = rendezvous::join(&addr, 1, 2, Duration::from_millis(500)).unwrap_err();
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
    let server = thread::spawn(move || rendezvous::serve_on(l, 2, &id(), Duration::from_secs(10)));
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
        let mut hello = [0u8; 16];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..8], &MAGIC);
        s.write_all(b"NOTMAGIC\x80\0\0\0").unwrap();
        s.write_all(&[0u8; ID_BYTES]).unwrap();
    });
    let err = rendezvous::join(&addr, 1, 2, Duration::from_secs(10)).unwrap_err();
    fake.join().unwrap();
    assert!(
        matches!(&err, RendezvousError::BadMagic { got, .. } if got == b"NOTMAGIC"),
        "{err:?}"
    );
}

#[test]
fn mismatched_world_sizes_and_duplicate_ranks_are_errors() {
    let (l, addr) = listener();
    let server = thread::spawn(move || rendezvous::serve_on(l, 3, &id(), Duration::from_secs(10)));
    let err = rendezvous::join(&addr, 1, 4, Duration::from_secs(5)).unwrap_err();
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
    let server = thread::spawn(move || rendezvous::serve_on(l, 3, &id(), Duration::from_secs(10)));
    rendezvous::join(&addr, 1, 3, Duration::from_secs(5)).unwrap();
    let dup = rendezvous::join(&addr, 1, 3, Duration::from_secs(5));
    assert!(dup.is_err(), "a duplicate rank must not receive the id");
    let err = server.join().unwrap().unwrap_err();
    assert!(
        matches!(err, RendezvousError::DuplicateRank { rank: 1, .. }),
        "{err:?}"
    );
}
