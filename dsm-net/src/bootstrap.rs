//! Setting up the full TCP mesh between the nodes of a job, before the async transport
//! starts. Rank 0 listens at the rendezvous address; every other rank connects there with a
//! [`dsm_proto::Hello`] carrying the protocol version and the address where it accepts
//! connections from higher ranks. When all ranks have joined, rank 0 answers each with the
//! address table; then every rank connects to the lower ranks it has no link to yet. Every
//! connection starts with the same versioned, mutually authenticated handshake
//! ([`crate::handshake`]): a peer with the wrong secret or version is refused with a reason
//! and never becomes part of the job, and strangers' connections are handshaken
//! concurrently and evicted, so they cannot delay the ranks. All waits are bounded by the
//! connect timeout, so a rank that never shows up is an error naming it.

use crate::framing::{read_frame, write_frame, WireError};
use crate::handshake::{self, Admission, ConnectFailure, Local};
pub use crate::mesh::{BootstrapError, Mesh};
use dsm_proto::segment_base::{SegmentChoice, SegmentProbe};
use dsm_proto::HelloReply;
use dsm_proto::JobConfig;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::thread;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Connects this node to every other node of the job described by `env`.
///
/// Blocks until the whole mesh is up (every pair of ranks connected and handshaken) or
/// `env.connect_timeout` has passed. A single-node job returns at once with no
/// connections. Fails with a [`BootstrapError`] naming the rank that could not be reached,
/// refused this node or broke the handshake.
pub fn connect_mesh(env: &JobConfig) -> Result<Mesh, BootstrapError> {
    connect_mesh_with(env, None)
}

/// [`connect_mesh`] for rank 0 with its rendezvous socket already bound and listening
/// (inherited from the launcher, `DSM_COORD_FD`) instead of binding `env.coord` itself.
pub fn connect_mesh_with(
    env: &JobConfig,
    rendezvous: Option<TcpListener>,
) -> Result<Mesh, BootstrapError> {
    if env.size == 1 {
        return Ok(Mesh {
            rank: 0,
            size: 1,
            streams: vec![None],
            shm: vec![None],
            segment_file: None,
        });
    }
    let coord = env
        .coord
        .expect("JobConfig guarantees a rendezvous address for multi-node jobs");
    let deadline = Instant::now() + env.connect_timeout;
    let mut mesh = if env.rank == 0 {
        rendezvous_as_rank0(env, coord, rendezvous, deadline)?
    } else {
        join_as_peer(env, coord, deadline)?
    };
    for s in mesh.streams.iter_mut().flatten() {
        s.set_nodelay(true)?;
        s.set_read_timeout(None)?;
        s.set_write_timeout(None)?;
    }
    mesh.rank = env.rank;
    // Every rank is up: the pairs' shared-memory offers get a fresh allowance.
    crate::colocate::colocate(env, &mut mesh, Instant::now() + env.connect_timeout)?;
    Ok(mesh)
}

fn local(env: &JobConfig) -> Local {
    Local {
        rank: env.rank,
        size: env.size,
        secret: env.secret.as_bytes().into(),
    }
}

fn missing(taken: &[bool], range: std::ops::Range<usize>) -> Vec<usize> {
    range.filter(|&r| !taken[r]).collect()
}

fn rendezvous_as_rank0(
    env: &JobConfig,
    coord: SocketAddr,
    inherited: Option<TcpListener>,
    deadline: Instant,
) -> Result<Mesh, BootstrapError> {
    let listener = match inherited {
        Some(l) => l,
        None => TcpListener::bind(coord).map_err(|source| BootstrapError::Listen {
            addr: coord.to_string(),
            source,
        })?,
    };
    listener.set_nonblocking(true)?;
    let mut streams: Vec<Option<TcpStream>> = (0..env.size).map(|_| None).collect();
    let mut taken = vec![false; env.size];
    taken[0] = true;
    let mut listen = vec![String::new(); env.size];
    listen[0] = coord.to_string();
    let mut joined = 1;
    let mut admission = Admission::new(local(env), 1);
    while joined < env.size {
        for mut a in admission.poll(&listener)? {
            let r = a.hello.rank as usize;
            if taken[r] {
                // Authenticated again (the challenge proves the job secret): a rank whose
                // handshake broke on its side (a reply lost under load, a timeout) dials
                // again and must be able to finish. Its old connection is closed then; a
                // second live connection for the rank is a duplicate process.
                if streams[r].as_ref().is_some_and(peer_closed) {
                    debug!("rank 0: rank {r} joined again from {}", a.from);
                    listen[r] = a.hello.listen;
                    streams[r] = Some(a.stream);
                    continue;
                }
                let reason = format!("rank {r} has already joined");
                warn!("rank 0: refused connection from {}: {reason}", a.from);
                let _ = write_frame(&mut a.stream, &HelloReply::Refused { reason });
                continue;
            }
            debug!("rank 0: rank {r} joined from {}", a.from);
            taken[r] = true;
            listen[r] = a.hello.listen;
            streams[r] = Some(a.stream);
            joined += 1;
        }
        if joined < env.size && Instant::now() >= deadline {
            let lost = missing(&taken, 1..env.size);
            let reason = format!("job start timed out; ranks {lost:?} never connected");
            for s in streams.iter_mut().flatten() {
                let _ = write_frame(
                    s,
                    &HelloReply::Refused {
                        reason: reason.clone(),
                    },
                );
            }
            return Err(BootstrapError::Timeout {
                rank: 0,
                secs: env.connect_timeout.as_secs_f64(),
                what: format!("ranks {lost:?} to connect to {coord}"),
            });
        }
    }
    admission.close();
    for (r, s) in streams.iter_mut().enumerate() {
        if let Some(s) = s {
            write_frame(
                s,
                &HelloReply::Welcome {
                    listen: listen.clone(),
                },
            )
            .map_err(|source| BootstrapError::Handshake { peer: r, source })?;
        }
    }
    Ok(Mesh {
        rank: 0,
        size: env.size,
        streams,
        shm: (0..env.size).map(|_| None).collect(),
        segment_file: None,
    })
}

/// Answers an admitted peer; `false` if its connection broke meanwhile (under a flood of
/// strangers its handshake may have been evicted as it finished): the peer dials again.
fn welcome_peer(env: &JobConfig, peer: usize, stream: &mut TcpStream) -> bool {
    match write_frame(stream, &HelloReply::Welcome { listen: vec![] }) {
        Ok(()) => true,
        Err(e) => {
            debug!(
                "rank {}: welcome to rank {peer} failed ({e}); it dials again",
                env.rank
            );
            false
        }
    }
}

/// Whether the peer has closed (or reset) this connection: a read would return end of
/// file or an error now, rather than block. Nothing is consumed.
fn peer_closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut byte = [0u8; 1];
    let closed = match stream.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    };
    let _ = stream.set_nonblocking(false);
    closed
}

/// Connects with retries until `deadline`: the peer may not be listening yet.
fn connect_retrying(
    env: &JobConfig,
    addr: SocketAddr,
    deadline: Instant,
    who: &str,
) -> Result<TcpStream, BootstrapError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(BootstrapError::Timeout {
                rank: env.rank,
                secs: env.connect_timeout.as_secs_f64(),
                what: format!("{who} at {addr} to accept a connection"),
            });
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1))) {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::WouldBlock
                ) =>
            {
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Sends our hello on `s` and waits (until `deadline`) for the answer.
/// Connects to rank `peer` at `addr` and completes the handshake, redialling when the
/// connection breaks before it is authenticated (strangers flooding the peer's port may
/// have evicted it), until `deadline`.
fn dial(
    env: &JobConfig,
    addr: SocketAddr,
    peer: usize,
    listen: &str,
    deadline: Instant,
) -> Result<(TcpStream, HelloReply), BootstrapError> {
    let who = if peer == 0 {
        "rank 0".to_string()
    } else {
        format!("rank {peer}")
    };
    let me = local(env);
    loop {
        let mut s = connect_retrying(env, addr, deadline, &who)?;
        match handshake::connect(&mut s, &me, peer, listen.to_string(), deadline) {
            Ok(reply) => return Ok((s, reply)),
            Err(ConnectFailure::Refused(reason)) => {
                return Err(BootstrapError::Refused { by: peer, reason })
            }
            Err(ConnectFailure::Impostor) => return Err(BootstrapError::Impostor { peer, addr }),
            Err(ConnectFailure::Broken(WireError::Io(e)))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(BootstrapError::Timeout {
                    rank: env.rank,
                    secs: env.connect_timeout.as_secs_f64(),
                    what: if peer == 0 {
                        "rank 0 to admit this node (some other rank has not joined)".into()
                    } else {
                        format!("rank {peer} to answer the handshake")
                    },
                });
            }
            Err(ConnectFailure::Broken(source)) => {
                if Instant::now() >= deadline {
                    return Err(BootstrapError::Handshake { peer, source });
                }
                debug!(
                    "rank {}: handshake with {who} broke ({source}); redialling",
                    env.rank
                );
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn join_as_peer(
    env: &JobConfig,
    coord: SocketAddr,
    deadline: Instant,
) -> Result<Mesh, BootstrapError> {
    // Listen on the interface that reaches rank 0: loopback for local jobs, the right NIC
    // (or namespace veth) for multi-host ones. Connecting a UDP socket asks the kernel's
    // routing for it without sending anything.
    let ip: IpAddr = {
        let probe = UdpSocket::bind(SocketAddr::new(
            if coord.is_ipv4() {
                IpAddr::from([0, 0, 0, 0])
            } else {
                IpAddr::from([0u16; 8])
            },
            0,
        ))?;
        probe.connect(coord)?;
        probe.local_addr()?.ip()
    };
    let listener = TcpListener::bind((ip, 0)).map_err(|source| BootstrapError::Listen {
        addr: format!("{ip}:0"),
        source,
    })?;
    let my_addr = listener.local_addr()?;
    let (to_root, reply) = dial(env, coord, 0, &my_addr.to_string(), deadline)?;
    let table = match reply {
        HelloReply::Welcome { listen } if listen.len() == env.size => listen,
        other => {
            return Err(BootstrapError::Refused {
                by: 0,
                reason: format!("malformed welcome: {other:?}"),
            })
        }
    };
    let mut streams: Vec<Option<TcpStream>> = (0..env.size).map(|_| None).collect();
    streams[0] = Some(to_root);

    // Higher ranks connect to us; accept them on a helper thread while we dial lower ones.
    let accept_env = env.clone();
    listener.set_nonblocking(true)?;
    let acceptor = thread::spawn(move || -> Result<Vec<(usize, TcpStream)>, BootstrapError> {
        let env = accept_env;
        let mut taken = vec![false; env.size];
        let mut got = Vec::new();
        let mut admission = Admission::new(local(&env), env.rank + 1);
        while got.len() < env.size - env.rank - 1 {
            for mut a in admission.poll(&listener)? {
                let r = a.hello.rank as usize;
                // As at rank 0: a peer whose handshake broke on its side dials again.
                let gone = got.iter().position(|(p, s)| *p == r && peer_closed(s));
                if let (true, Some(k)) = (taken[r], gone) {
                    if welcome_peer(&env, r, &mut a.stream) {
                        got[k].1 = a.stream;
                    }
                    continue;
                }
                if taken[r] {
                    let reason = format!("rank {r} has already connected");
                    warn!(
                        "rank {}: refused connection from {}: {reason}",
                        env.rank, a.from
                    );
                    let _ = write_frame(&mut a.stream, &HelloReply::Refused { reason });
                    continue;
                }
                if welcome_peer(&env, r, &mut a.stream) {
                    taken[r] = true;
                    got.push((r, a.stream));
                }
            }
            if got.len() < env.size - env.rank - 1 && Instant::now() >= deadline {
                return Err(BootstrapError::Timeout {
                    rank: env.rank,
                    secs: env.connect_timeout.as_secs_f64(),
                    what: format!(
                        "ranks {:?} to connect",
                        missing(&taken, env.rank + 1..env.size)
                    ),
                });
            }
        }
        Ok(got)
    });

    let mut dial_error = None;
    for (r, addr) in table.iter().enumerate().take(env.rank).skip(1) {
        let result = addr
            .parse::<SocketAddr>()
            .map_err(|_| BootstrapError::Refused {
                by: 0,
                reason: format!("bad address {addr:?} for rank {r}"),
            })
            .and_then(|a| dial(env, a, r, &my_addr.to_string(), deadline))
            .map(|(s, _welcome)| s);
        match result {
            Ok(s) => streams[r] = Some(s),
            Err(e) => {
                dial_error = Some(e);
                break;
            }
        }
    }
    if let Some(e) = dial_error {
        return Err(e);
    }
    let accepted = acceptor
        .join()
        .map_err(|_| io::Error::other("acceptor thread panicked"))??;
    for (r, s) in accepted {
        streams[r] = Some(s);
    }
    Ok(Mesh {
        rank: env.rank,
        size: env.size,
        streams,
        shm: (0..env.size).map(|_| None).collect(),
        segment_file: None,
    })
}

/// The segment base agreement ([`dsm_proto::segment_base`]), run on a fresh mesh before
/// any protocol message: every rank sends rank 0 its probe, rank 0 decides with `decide`
/// and sends every rank the choice, which all return. Bounded by `timeout` per read.
pub fn agree_segment_base(
    mesh: &mut Mesh,
    probe: SegmentProbe,
    decide: impl FnOnce(&[SegmentProbe]) -> SegmentChoice,
    timeout: Duration,
) -> Result<SegmentChoice, BootstrapError> {
    const MAX_PROBE: usize = 64 << 10;
    let broken = |peer: usize| move |source: WireError| BootstrapError::Handshake { peer, source };
    for s in mesh.streams.iter_mut().flatten() {
        s.set_read_timeout(Some(timeout))?;
    }
    let choice = if mesh.rank == 0 {
        let mut probes = Vec::with_capacity(mesh.size);
        probes.push(probe);
        for (r, s) in mesh.streams.iter_mut().enumerate().skip(1) {
            let s = s.as_mut().expect("rank 0 is linked to every rank");
            probes.push(read_frame(s, MAX_PROBE).map_err(broken(r))?);
        }
        let choice = decide(&probes);
        for (r, s) in mesh.streams.iter_mut().enumerate().skip(1) {
            let s = s.as_mut().expect("rank 0 is linked to every rank");
            write_frame(s, &choice).map_err(broken(r))?;
        }
        choice
    } else {
        let s = mesh.streams[0]
            .as_mut()
            .expect("every rank is linked to rank 0");
        write_frame(s, &probe).map_err(broken(0))?;
        read_frame(s, MAX_PROBE).map_err(broken(0))?
    };
    for s in mesh.streams.iter_mut().flatten() {
        s.set_read_timeout(None)?;
    }
    Ok(choice)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn job(rank: usize, size: usize, coord: SocketAddr, secret: &str, timeout: f64) -> JobConfig {
        JobConfig {
            connect_timeout: Duration::from_secs_f64(timeout),
            ..JobConfig::standalone(rank, size, coord, secret)
        }
    }

    fn free_addr() -> SocketAddr {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    #[test]
    fn full_mesh_of_four_in_threads() {
        let coord = free_addr();
        let handles: Vec<_> = (0..4)
            .map(|r| thread::spawn(move || connect_mesh(&job(r, 4, coord, "k", 10.0)).unwrap()))
            .collect();
        let meshes: Vec<Mesh> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for m in &meshes {
            for (r, s) in m.streams.iter().enumerate() {
                assert_eq!(s.is_some(), r != m.rank, "rank {} link to {r}", m.rank);
            }
        }
        // Links are really paired: a byte written by 3 to 1 arrives at 1's link to 3.
        let mut meshes = meshes;
        meshes[3].streams[1]
            .as_mut()
            .unwrap()
            .write_all(b"z")
            .unwrap();
        let mut b = [0u8; 1];
        use std::io::Read;
        meshes[1].streams[3]
            .as_mut()
            .unwrap()
            .read_exact(&mut b)
            .unwrap();
        assert_eq!(&b, b"z");
    }

    #[test]
    fn co_located_ranks_share_memory_unless_one_asks_for_tcp() {
        for tcp_rank in [None, Some(2)] {
            let coord = free_addr();
            let handles: Vec<_> = (0..4)
                .map(|r| {
                    thread::spawn(move || {
                        let mut env = job(r, 4, coord, "k", 10.0);
                        if Some(r) == tcp_rank {
                            env.transport = dsm_proto::TransportChoice::Tcp;
                        }
                        connect_mesh(&env).unwrap()
                    })
                })
                .collect();
            let meshes: Vec<Mesh> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            for m in &meshes {
                for (r, link) in m.shm.iter().enumerate() {
                    let expected = r != m.rank && tcp_rank != Some(r) && tcp_rank != Some(m.rank);
                    assert_eq!(
                        link.is_some(),
                        expected,
                        "rank {} shared memory with {r} ({tcp_rank:?} on TCP)",
                        m.rank
                    );
                }
            }
            // Both ends of a pair hold the same region, writing opposite rings.
            let (a, b) = (meshes[0].shm[1].as_ref(), meshes[1].shm[0].as_ref());
            let (a, b) = (a.unwrap(), b.unwrap());
            assert_eq!(a.region.nonce(), b.region.nonce());
            assert_eq!(a.send, b.receive());
        }
    }

    #[test]
    fn wrong_secret_is_refused_and_job_still_forms() {
        let coord = free_addr();
        let root = thread::spawn(move || connect_mesh(&job(0, 2, coord, "right", 10.0)));
        let intruder = connect_mesh(&job(1, 2, coord, "wrong", 10.0));
        match intruder {
            // Rank 0's proof does not check out with the intruder's secret, so the intruder
            // stops first; rank 0 refuses its proof and logs why.
            Err(BootstrapError::Impostor { peer: 0, .. }) => {}
            Err(e) => panic!("expected the secrets to disagree, got {e}"),
            Ok(_) => panic!("intruder was admitted"),
        }
        let legit = connect_mesh(&job(1, 2, coord, "right", 10.0)).unwrap();
        assert!(legit.streams[0].is_some());
        assert!(root.join().unwrap().is_ok());
    }

    #[test]
    fn version_mismatch_is_refused() {
        let coord = free_addr();
        let root = thread::spawn(move || connect_mesh(&job(0, 2, coord, "s", 3.0)));
        let env = job(1, 2, coord, "s", 3.0);
        let mut s =
            connect_retrying(&env, coord, Instant::now() + Duration::from_secs(3), "r0").unwrap();
        let h = dsm_proto::Hello {
            magic: dsm_proto::HELLO_MAGIC,
            version: dsm_proto::PROTOCOL_VERSION + 1,
            rank: 1,
            size: 2,
            listen: "127.0.0.1:1".into(),
            nonce: [0; 32],
        };
        write_frame(&mut s, &h).unwrap();
        let reply: HelloReply =
            crate::framing::read_frame(&mut s, crate::handshake::MAX_HANDSHAKE).unwrap();
        match reply {
            HelloReply::Refused { reason } => assert!(reason.contains("version"), "{reason}"),
            other => panic!("{other:?}"),
        }
        let err = root.join().unwrap().err().expect("rank 0 must time out");
        assert!(err.to_string().contains("[1]"), "{err}");
    }

    /// A stranger records a genuine rank's handshake and plays it back: the acceptor's
    /// fresh nonce makes the recorded proof worthless.
    #[test]
    fn replayed_handshake_is_refused() {
        use crate::framing::read_frame;
        use crate::handshake::MAX_HANDSHAKE;
        use dsm_proto::{Hello, HelloProof, HELLO_MAGIC, PROTOCOL_VERSION};
        let coord = free_addr();
        let root = thread::spawn(move || connect_mesh(&job(0, 2, coord, "k", 5.0)));
        let deadline = Instant::now() + Duration::from_secs(5);
        let env = job(1, 2, coord, "k", 5.0);
        let hello = Hello {
            magic: HELLO_MAGIC,
            version: PROTOCOL_VERSION,
            rank: 1,
            size: 2,
            listen: "127.0.0.1:1".into(),
            nonce: [9; 32],
        };
        // What an eavesdropper saw of a genuine exchange: the hello and the proof.
        let mut first = connect_retrying(&env, coord, deadline, "r0").unwrap();
        write_frame(&mut first, &hello).unwrap();
        let HelloReply::Challenge { nonce, .. } = read_frame(&mut first, MAX_HANDSHAKE).unwrap()
        else {
            panic!("expected a challenge")
        };
        let recorded = HelloProof {
            proof: crate::handshake::Transcript {
                connector_nonce: &hello.nonce,
                acceptor_nonce: &nonce,
                connector: 1,
                acceptor: 0,
                size: 2,
            }
            .proof(b"k", crate::handshake::Role::Connector),
        };
        drop(first);
        // The replay: same hello, same proof, new connection.
        let mut replay = connect_retrying(&env, coord, deadline, "r0").unwrap();
        write_frame(&mut replay, &hello).unwrap();
        let _challenge: HelloReply = read_frame(&mut replay, MAX_HANDSHAKE).unwrap();
        write_frame(&mut replay, &recorded).unwrap();
        match read_frame::<_, HelloReply>(&mut replay, MAX_HANDSHAKE).unwrap() {
            HelloReply::Refused { reason } => {
                assert!(reason.contains("wrong job secret"), "{reason}")
            }
            other => panic!("replay admitted: {other:?}"),
        }
        // The job still forms with the real rank 1.
        let real = connect_mesh(&env).unwrap();
        assert!(real.streams[0].is_some());
        assert!(root.join().unwrap().is_ok());
    }

    /// A rank whose handshake with rank 0 broke on its side after rank 0 had admitted it
    /// (here: it gives up waiting for the welcome, which comes only when every rank has
    /// joined) dials again and joins; a second live connection for a rank is refused.
    #[test]
    fn a_rank_that_dials_again_after_a_broken_handshake_joins() {
        let coord = free_addr();
        let root = thread::spawn(move || connect_mesh(&job(0, 4, coord, "k", 20.0)));
        let soon = || Instant::now() + Duration::from_secs(5);
        let (one, two) = (job(1, 4, coord, "k", 20.0), job(2, 4, coord, "k", 20.0));
        // Rank 1 is admitted, then gives up before the welcome (which comes only when every
        // rank has joined): its reply wait times out and it closes the connection.
        let mut first = connect_retrying(&one, coord, soon(), "r0").unwrap();
        let early = Instant::now() + Duration::from_millis(300);
        let broke = handshake::connect(&mut first, &local(&one), 0, "127.0.0.1:1".into(), early);
        assert!(matches!(broke, Err(ConnectFailure::Broken(_))), "{broke:?}");
        drop(first);
        // A second live connection for a rank is a duplicate process: refused.
        let mut held = connect_retrying(&two, coord, soon(), "r0").unwrap();
        let wait = Instant::now() + Duration::from_millis(300);
        let _ = handshake::connect(&mut held, &local(&two), 0, "127.0.0.1:2".into(), wait);
        let mut dup = connect_retrying(&two, coord, soon(), "r0").unwrap();
        let refused = handshake::connect(&mut dup, &local(&two), 0, "127.0.0.1:2".into(), soon());
        assert!(
            matches!(&refused, Err(ConnectFailure::Refused(r)) if r.contains("already joined")),
            "{refused:?}"
        );
        drop(held);
        // Ranks 1 and 2 dial again and finish joining; rank 3 comes last.
        let ones = thread::spawn(move || connect_mesh(&one));
        let twos = thread::spawn(move || connect_mesh(&two));
        thread::sleep(Duration::from_secs(1));
        let three = connect_mesh(&job(3, 4, coord, "k", 20.0));
        assert!(three.is_ok(), "{:?}", three.err());
        assert!(
            ones.join().unwrap().is_ok(),
            "rank 1 joins after its broken handshake"
        );
        assert!(twos.join().unwrap().is_ok());
        assert!(root.join().unwrap().is_ok());
    }

    /// 200 idle connections and 50 that send garbage, opened before the ranks join, must not
    /// delay the job's start beyond a small margin.
    #[test]
    fn strangers_flooding_the_rendezvous_do_not_delay_the_job() {
        let coord = free_addr();
        let root = thread::spawn(move || connect_mesh(&job(0, 4, coord, "k", 20.0)));
        let deadline = Instant::now() + Duration::from_secs(5);
        let env = job(1, 4, coord, "k", 5.0);
        let mut strangers = Vec::new();
        for i in 0..250 {
            let mut s = connect_retrying(&env, coord, deadline, "r0").unwrap();
            if i % 5 == 0 {
                let _ = s.write_all(&[0xff; 64]);
            }
            strangers.push(s);
        }
        let started = Instant::now();
        let peers: Vec<_> = (1..4)
            .map(|r| thread::spawn(move || connect_mesh(&job(r, 4, coord, "k", 20.0))))
            .collect();
        for p in peers {
            p.join().unwrap().unwrap();
        }
        root.join().unwrap().unwrap();
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "the job took {took:?} to start"
        );
        drop(strangers);
    }

    /// A hundred strangers connect to rank 0's port as the ranks join, and another hundred
    /// as a late rank joins: every start must succeed (evicting strangers must never cut
    /// off a rank that has just authenticated).
    #[test]
    fn a_job_starts_under_a_continuous_flood_of_strangers() {
        for round in 0..5 {
            let coord = free_addr();
            let root = thread::spawn(move || connect_mesh(&job(0, 4, coord, "k", 20.0)));
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let flood = {
                let stop = stop.clone();
                thread::spawn(move || {
                    let env = job(1, 4, coord, "k", 5.0);
                    let mut held = Vec::new();
                    // A burst as the ranks join and another as the late one does.
                    for pause in [0, 450] {
                        thread::sleep(Duration::from_millis(pause));
                        let soon = Instant::now() + Duration::from_millis(200);
                        for _ in 0..100 {
                            if let Ok(s) = connect_retrying(&env, coord, soon, "r0") {
                                held.push(s);
                            }
                        }
                    }
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        thread::sleep(Duration::from_millis(10));
                    }
                })
            };
            let peers: Vec<_> = (1..4)
                .map(|r| {
                    thread::spawn(move || {
                        if r == 3 {
                            thread::sleep(Duration::from_millis(500));
                        }
                        connect_mesh(&job(r, 4, coord, "k", 20.0))
                    })
                })
                .collect();
            for (r, p) in peers.into_iter().enumerate() {
                let got = p.join().unwrap();
                assert!(
                    got.is_ok(),
                    "round {round}, rank {}: {:?}",
                    r + 1,
                    got.err()
                );
            }
            let got = root.join().unwrap();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            flood.join().unwrap();
            assert!(got.is_ok(), "round {round}, rank 0: {:?}", got.err());
        }
    }

    #[test]
    fn missing_rank_times_out_with_its_number() {
        let coord = free_addr();
        let t0 = Instant::now();
        let err = connect_mesh(&job(0, 3, coord, "s", 0.5))
            .err()
            .expect("nobody joins");
        assert!(t0.elapsed() < Duration::from_secs(5));
        let msg = err.to_string();
        assert!(msg.contains("[1, 2]") && msg.contains("timed out"), "{msg}");
    }

    #[test]
    fn peer_without_root_times_out() {
        let coord = free_addr();
        let err = connect_mesh(&job(1, 2, coord, "s", 0.3))
            .err()
            .expect("no rank 0");
        assert!(err.to_string().contains("rank 0"), "{err}");
    }
}
