//! Setting up the full TCP mesh between the nodes of a job, before the async transport
//! starts. Rank 0 listens at the rendezvous address; every other rank connects there with a
//! [`Hello`] carrying the protocol version, the job secret and the address where it accepts
//! connections from higher ranks. When all ranks have joined, rank 0 answers each with the
//! address table; then every rank connects to the lower ranks it has no link to yet. Every
//! connection starts with the same versioned, secret-checked handshake: a peer with the wrong
//! secret or version is refused with a reason and never becomes part of the job. All waits
//! are bounded by the connect timeout, so a rank that never shows up is an error naming it.

use crate::framing::{read_frame, write_frame, WireError};
use dsm_proto::JobConfig;
use dsm_proto::{Hello, HelloReply, NodeId, HELLO_MAGIC, PROTOCOL_VERSION};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};
use thiserror::Error;
use tracing::{debug, warn};

/// Handshake frames are small; anything bigger is not a dsm peer.
const MAX_HANDSHAKE: usize = 64 << 10;
/// How long an accepted connection may take to say hello before it is dropped, so a silent
/// stranger cannot stall the job start.
const HELLO_WAIT: Duration = Duration::from_secs(3);

/// Why this node could not join the mesh. Each names the rank involved, so a failed job
/// start says which node is missing or misconfigured.
#[derive(Debug, Error)]
pub enum BootstrapError {
    /// Could not bind a listening socket: rank 0 at the rendezvous address (often: the
    /// port was taken), or another rank on the interface that reaches rank 0.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address it tried to bind.
        addr: String,
        /// The bind error.
        source: io::Error,
    },
    /// The connect timeout expired before the mesh was complete.
    #[error("rank {rank}: timed out after {secs:.0} s waiting for {what}")]
    Timeout {
        /// This node's rank.
        rank: usize,
        /// The connect timeout, in seconds.
        secs: f64,
        /// What never happened, e.g. which ranks never connected.
        what: String,
    },
    /// A peer answered the handshake with [`HelloReply::Refused`] (wrong secret, version or
    /// job size, duplicate rank, or rank 0 giving up on the start), or rank 0's welcome was
    /// malformed.
    #[error("rank {by} refused this node: {reason}")]
    Refused {
        /// The refusing rank.
        by: usize,
        /// Its reason.
        reason: String,
    },
    /// A handshake frame could not be written or read (connection dropped, garbage,
    /// oversized frame).
    #[error("rank {peer} broke the handshake: {source}")]
    Handshake {
        /// The rank at the other end.
        peer: usize,
        /// What went wrong on the wire.
        source: WireError,
    },
    /// Any other socket error while connecting or accepting.
    #[error("i/o error during job start: {0}")]
    Io(#[from] io::Error),
}

/// The established connections: `streams[r]` links to rank `r` (`None` for oneself).
/// The streams are blocking, with `TCP_NODELAY` set and no timeouts; the handshake has
/// been consumed, so the next byte on each is the peer's first [`dsm_proto::Msg`] frame.
pub struct Mesh {
    /// This node's rank.
    pub rank: usize,
    /// Number of nodes in the job; `streams.len()`.
    pub size: usize,
    /// One connection per other rank, indexed by rank.
    pub streams: Vec<Option<TcpStream>>,
}

/// Connects this node to every other node of the job described by `env`.
///
/// Blocks until the whole mesh is up (every pair of ranks connected and handshaken) or
/// `env.connect_timeout` has passed. A single-node job returns at once with no
/// connections. Fails with a [`BootstrapError`] naming the rank that could not be reached,
/// refused this node or broke the handshake.
pub fn connect_mesh(env: &JobConfig) -> Result<Mesh, BootstrapError> {
    if env.size == 1 {
        return Ok(Mesh {
            rank: 0,
            size: 1,
            streams: vec![None],
        });
    }
    let coord = env
        .coord
        .expect("JobConfig guarantees a rendezvous address for multi-node jobs");
    let deadline = Instant::now() + env.connect_timeout;
    let mut mesh = if env.rank == 0 {
        rendezvous_as_rank0(env, coord, deadline)?
    } else {
        join_as_peer(env, coord, deadline)?
    };
    for s in mesh.streams.iter_mut().flatten() {
        s.set_nodelay(true)?;
        s.set_read_timeout(None)?;
        s.set_write_timeout(None)?;
    }
    mesh.rank = env.rank;
    Ok(mesh)
}

fn hello(env: &JobConfig, listen: String) -> Hello {
    Hello {
        magic: HELLO_MAGIC,
        version: PROTOCOL_VERSION,
        secret: env.secret.clone(),
        rank: env.rank as NodeId,
        size: env.size as u16,
        listen,
    }
}

/// Constant-time comparison, so the secret cannot be guessed byte by byte from timing.
fn secrets_match(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a hello is refused, or `None` if it is acceptable. `lowest` is the smallest rank this
/// acceptor takes connections from.
fn check_hello(env: &JobConfig, h: &Hello, lowest: usize, taken: &[bool]) -> Option<String> {
    if h.magic != HELLO_MAGIC {
        return Some("not a dsm peer (bad magic)".into());
    }
    if h.version != PROTOCOL_VERSION {
        return Some(format!(
            "protocol version mismatch: peer speaks v{}, this node v{PROTOCOL_VERSION}",
            h.version
        ));
    }
    if !secrets_match(&h.secret, &env.secret) {
        return Some("wrong job secret".into());
    }
    if h.size as usize != env.size {
        return Some(format!(
            "job size mismatch: peer thinks {} nodes, this node {}",
            h.size, env.size
        ));
    }
    let r = h.rank as usize;
    if r < lowest || r >= env.size || r == env.rank {
        return Some(format!("unexpected rank {r}"));
    }
    if taken[r] {
        return Some(format!("rank {r} has already joined"));
    }
    None
}

/// Reads and checks one hello on a freshly accepted connection. Returns the peer's rank and
/// hello if accepted; refusals are answered and logged here.
fn admit(
    env: &JobConfig,
    mut s: TcpStream,
    peer: SocketAddr,
    lowest: usize,
    taken: &[bool],
) -> Option<(TcpStream, Hello)> {
    s.set_nonblocking(false).ok()?;
    s.set_read_timeout(Some(HELLO_WAIT)).ok()?;
    let h: Hello = match read_frame(&mut s, MAX_HANDSHAKE) {
        Ok(h) => h,
        Err(e) => {
            warn!("rank {}: dropped connection from {peer}: {e}", env.rank);
            return None;
        }
    };
    if let Some(reason) = check_hello(env, &h, lowest, taken) {
        warn!(
            "rank {}: refused connection from {peer} (claims rank {}): {reason}",
            env.rank, h.rank
        );
        let _ = write_frame(&mut s, &HelloReply::Refused { reason });
        return None;
    }
    Some((s, h))
}

fn missing(taken: &[bool], range: std::ops::Range<usize>) -> Vec<usize> {
    range.filter(|&r| !taken[r]).collect()
}

fn rendezvous_as_rank0(
    env: &JobConfig,
    coord: SocketAddr,
    deadline: Instant,
) -> Result<Mesh, BootstrapError> {
    let listener = TcpListener::bind(coord).map_err(|source| BootstrapError::Listen {
        addr: coord.to_string(),
        source,
    })?;
    listener.set_nonblocking(true)?;
    let mut streams: Vec<Option<TcpStream>> = (0..env.size).map(|_| None).collect();
    let mut taken = vec![false; env.size];
    taken[0] = true;
    let mut listen = vec![String::new(); env.size];
    listen[0] = coord.to_string();
    let mut joined = 1;
    while joined < env.size {
        match listener.accept() {
            Ok((s, peer)) => {
                if let Some((s, h)) = admit(env, s, peer, 1, &taken) {
                    let r = h.rank as usize;
                    debug!("rank 0: rank {r} joined from {peer}");
                    taken[r] = true;
                    listen[r] = h.listen;
                    streams[r] = Some(s);
                    joined += 1;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
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
                thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e.into()),
        }
    }
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
    })
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
fn greet(
    env: &JobConfig,
    s: &mut TcpStream,
    peer: usize,
    listen: String,
    deadline: Instant,
) -> Result<HelloReply, BootstrapError> {
    write_frame(s, &hello(env, listen))
        .map_err(|source| BootstrapError::Handshake { peer, source })?;
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
    match read_frame::<_, HelloReply>(s, MAX_HANDSHAKE) {
        Ok(HelloReply::Refused { reason }) => Err(BootstrapError::Refused { by: peer, reason }),
        Ok(reply) => Ok(reply),
        Err(WireError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(BootstrapError::Timeout {
                rank: env.rank,
                secs: env.connect_timeout.as_secs_f64(),
                what: if peer == 0 {
                    "rank 0 to admit this node (some other rank has not joined)".into()
                } else {
                    format!("rank {peer} to answer the handshake")
                },
            })
        }
        Err(source) => Err(BootstrapError::Handshake { peer, source }),
    }
}

fn join_as_peer(
    env: &JobConfig,
    coord: SocketAddr,
    deadline: Instant,
) -> Result<Mesh, BootstrapError> {
    let mut to_root = connect_retrying(env, coord, deadline, "rank 0")?;
    // Listen on the interface that reaches rank 0: loopback for local jobs, the right NIC
    // (or namespace veth) for multi-host ones.
    let ip: IpAddr = to_root.local_addr()?.ip();
    let listener = TcpListener::bind((ip, 0)).map_err(|source| BootstrapError::Listen {
        addr: format!("{ip}:0"),
        source,
    })?;
    let my_addr = listener.local_addr()?;
    let table = match greet(env, &mut to_root, 0, my_addr.to_string(), deadline)? {
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
        while got.len() < env.size - env.rank - 1 {
            match listener.accept() {
                Ok((s, peer)) => {
                    if let Some((mut s, h)) = admit(&env, s, peer, env.rank + 1, &taken) {
                        let r = h.rank as usize;
                        write_frame(&mut s, &HelloReply::Welcome { listen: vec![] })
                            .map_err(|source| BootstrapError::Handshake { peer: r, source })?;
                        taken[r] = true;
                        got.push((r, s));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(BootstrapError::Timeout {
                            rank: env.rank,
                            secs: env.connect_timeout.as_secs_f64(),
                            what: format!(
                                "ranks {:?} to connect",
                                missing(&taken, env.rank + 1..env.size)
                            ),
                        });
                    }
                    thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(e.into()),
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
            .and_then(|a| connect_retrying(env, a, deadline, &format!("rank {r}")))
            .and_then(|mut s| {
                greet(env, &mut s, r, my_addr.to_string(), deadline)?;
                Ok(s)
            });
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn job(rank: usize, size: usize, coord: SocketAddr, secret: &str, timeout: f64) -> JobConfig {
        JobConfig {
            rank,
            size,
            launcher: dsm_proto::Launcher::Standalone,
            coord: Some(coord),
            secret: secret.into(),
            connect_timeout: Duration::from_secs_f64(timeout),
            ..JobConfig::single_node()
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
    fn wrong_secret_is_refused_and_job_still_forms() {
        let coord = free_addr();
        let root = thread::spawn(move || connect_mesh(&job(0, 2, coord, "right", 10.0)));
        let intruder = connect_mesh(&job(1, 2, coord, "wrong", 10.0));
        match intruder {
            Err(BootstrapError::Refused { by: 0, reason }) => {
                assert!(reason.contains("wrong job secret"), "{reason}")
            }
            Err(e) => panic!("expected refusal, got {e}"),
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
        let mut h = hello(&env, "127.0.0.1:1".into());
        h.version += 1;
        write_frame(&mut s, &h).unwrap();
        let reply: HelloReply = read_frame(&mut s, MAX_HANDSHAKE).unwrap();
        match reply {
            HelloReply::Refused { reason } => assert!(reason.contains("version"), "{reason}"),
            other => panic!("{other:?}"),
        }
        let err = root.join().unwrap().err().expect("rank 0 must time out");
        assert!(err.to_string().contains("[1]"), "{err}");
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
