//! The handshake that opens every connection of a job, and the admission of incoming
//! connections.
//!
//! Authentication is mutual and sends no secret: the connector's [`Hello`] carries a fresh
//! nonce; the acceptor answers with its own nonce and an HMAC-SHA256, keyed by the job
//! secret, over both nonces, both ranks and the job size; the connector checks it and
//! answers with its own MAC ([`HelloProof`]). A passive observer learns only MACs over
//! nonces it cannot choose, and a recorded proof is useless on another connection because
//! the other side's nonce is new. The acceptor refuses a wrong proof with a reason it logs;
//! the connector refuses to go on with an acceptor that cannot prove it knows the secret
//! (another job, or a stranger who took the port).
//!
//! Admission (`Admission`) handshakes incoming connections concurrently, each on its own
//! short-lived thread with a short deadline, and keeps at most [`MAX_UNAUTHENTICATED`] of
//! them: when a new connection arrives at the cap, the oldest unauthenticated one is
//! dropped. Idle or garbage connections from strangers therefore cannot delay a legitimate
//! rank, which sends its hello at once and completes in a few round trips.

use crate::framing::{read_frame, write_frame, WireError};
use dsm_proto::{Hello, HelloProof, HelloReply, NodeId, HELLO_MAGIC, PROTOCOL_VERSION};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Handshake frames are small; anything bigger is not a dsm peer.
pub(crate) const MAX_HANDSHAKE: usize = 64 << 10;

/// How long an accepted connection has to complete the handshake. A dsm rank sends its
/// hello as soon as it is connected, so this only needs to cover scheduling delays.
pub const HANDSHAKE_WAIT: Duration = Duration::from_secs(3);

/// Most connections being handshaken at once; beyond it the oldest is dropped.
pub const MAX_UNAUTHENTICATED: usize = 64;

/// How a refusal reason starts when the connection never sent a readable hello: port
/// scanners and strangers' idle connections, worth a debug line, not a warning each.
const NO_HELLO: &str = "no hello: ";

/// Stack of a handshake thread: it only parses small frames.
const HANDSHAKE_STACK: usize = 64 << 10;

type HmacSha256 = Hmac<Sha256>;

/// What one side knows about itself and its job, shared by handshake threads.
#[derive(Clone)]
pub(crate) struct Local {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) secret: Arc<[u8]>,
}

/// Which side of the handshake a MAC proves.
#[derive(Clone, Copy)]
pub(crate) enum Role {
    Acceptor,
    Connector,
}

/// What both proofs of one handshake cover: both sides' nonces, both ranks and the job
/// size. Each side's MAC is keyed by the job secret and also covers its role, so neither
/// proof can be reflected back as the other.
#[derive(Clone, Copy)]
pub(crate) struct Transcript<'a> {
    pub(crate) connector_nonce: &'a [u8; 32],
    pub(crate) acceptor_nonce: &'a [u8; 32],
    pub(crate) connector: usize,
    pub(crate) acceptor: usize,
    pub(crate) size: usize,
}

impl Transcript<'_> {
    fn mac(&self, secret: &[u8], role: Role) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
        mac.update(match role {
            Role::Acceptor => b"dsm-handshake-v1 acceptor ",
            Role::Connector => b"dsm-handshake-v1 connector",
        });
        mac.update(self.connector_nonce);
        mac.update(self.acceptor_nonce);
        for v in [self.connector, self.acceptor, self.size] {
            mac.update(&(v as u64).to_le_bytes());
        }
        mac
    }

    /// The proof the side in `role` sends.
    pub(crate) fn proof(&self, secret: &[u8], role: Role) -> [u8; 32] {
        self.mac(secret, role).finalize().into_bytes().into()
    }

    /// Checks a claimed proof in constant time (the `hmac` crate's verification).
    fn verifies(&self, secret: &[u8], role: Role, claimed: &[u8; 32]) -> bool {
        self.mac(secret, role).verify_slice(claimed).is_ok()
    }
}

/// How the connecting side's handshake can fail.
#[derive(Debug)]
pub(crate) enum ConnectFailure {
    /// The acceptor refused, with its reason.
    Refused(String),
    /// The acceptor could not prove it knows the job secret.
    Impostor,
    /// The connection broke or carried garbage before the handshake completed; worth
    /// retrying (a stranger's flood may have evicted it).
    Broken(WireError),
}

/// The connecting side: hello, check the acceptor's proof, send ours, read the verdict
/// (waiting until `deadline`: rank 0 answers only once every rank has joined).
pub(crate) fn connect(
    s: &mut TcpStream,
    local: &Local,
    acceptor: usize,
    listen: String,
    deadline: Instant,
) -> Result<HelloReply, ConnectFailure> {
    let nonce: [u8; 32] = rand::random();
    let hello = Hello {
        magic: HELLO_MAGIC,
        version: PROTOCOL_VERSION,
        rank: local.rank as NodeId,
        size: local.size as u16,
        listen,
        nonce,
    };
    let wait = |s: &mut TcpStream| {
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
    };
    write_frame(s, &hello).map_err(ConnectFailure::Broken)?;
    wait(s).map_err(|e| ConnectFailure::Broken(e.into()))?;
    let (their_nonce, their_proof) = match read_frame::<_, HelloReply>(s, MAX_HANDSHAKE) {
        Ok(HelloReply::Challenge { nonce, proof }) => (nonce, proof),
        Ok(HelloReply::Refused { reason }) => return Err(ConnectFailure::Refused(reason)),
        Ok(other) => {
            return Err(ConnectFailure::Refused(format!(
                "answered the hello with {other:?} instead of a challenge"
            )))
        }
        Err(e) => return Err(ConnectFailure::Broken(e)),
    };
    let transcript = Transcript {
        connector_nonce: &nonce,
        acceptor_nonce: &their_nonce,
        connector: local.rank,
        acceptor,
        size: local.size,
    };
    let genuine = transcript.verifies(&local.secret, Role::Acceptor, &their_proof);
    // Our proof goes out either way, so that a peer of another job logs why it refused us.
    let ours = transcript.proof(&local.secret, Role::Connector);
    write_frame(s, &HelloProof { proof: ours }).map_err(ConnectFailure::Broken)?;
    if !genuine {
        return Err(ConnectFailure::Impostor);
    }
    wait(s).map_err(|e| ConnectFailure::Broken(e.into()))?;
    match read_frame::<_, HelloReply>(s, MAX_HANDSHAKE) {
        Ok(HelloReply::Refused { reason }) => Err(ConnectFailure::Refused(reason)),
        Ok(reply) => Ok(reply),
        Err(e) => Err(ConnectFailure::Broken(e)),
    }
}

/// The accepting side, up to the point where the connector is authenticated: returns its
/// hello, or the reason it was refused (already sent to it when it could be).
fn accept(s: &mut TcpStream, local: &Local, lowest: usize) -> Result<Hello, String> {
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(HANDSHAKE_WAIT))
        .map_err(|e| e.to_string())?;
    let hello: Hello = read_frame(s, MAX_HANDSHAKE).map_err(|e| format!("{NO_HELLO}{e}"))?;
    let refuse = |s: &mut TcpStream, reason: String| {
        let _ = write_frame(
            s,
            &HelloReply::Refused {
                reason: reason.clone(),
            },
        );
        reason
    };
    if hello.magic != HELLO_MAGIC {
        return Err(refuse(s, "not a dsm peer (bad magic)".into()));
    }
    if hello.version != PROTOCOL_VERSION {
        return Err(refuse(
            s,
            format!(
                "protocol version mismatch: peer speaks v{}, this node v{PROTOCOL_VERSION}",
                hello.version
            ),
        ));
    }
    if hello.size as usize != local.size {
        return Err(refuse(
            s,
            format!(
                "job size mismatch: peer thinks {} nodes, this node {}",
                hello.size, local.size
            ),
        ));
    }
    let r = hello.rank as usize;
    if r < lowest || r >= local.size || r == local.rank {
        return Err(refuse(s, format!("unexpected rank {r}")));
    }
    let nonce: [u8; 32] = rand::random();
    let transcript = Transcript {
        connector_nonce: &hello.nonce,
        acceptor_nonce: &nonce,
        connector: r,
        acceptor: local.rank,
        size: local.size,
    };
    let ours = transcript.proof(&local.secret, Role::Acceptor);
    write_frame(s, &HelloReply::Challenge { nonce, proof: ours }).map_err(|e| e.to_string())?;
    let theirs: HelloProof = read_frame(s, MAX_HANDSHAKE).map_err(|e| e.to_string())?;
    if !transcript.verifies(&local.secret, Role::Connector, &theirs.proof) {
        return Err(refuse(s, "wrong job secret".into()));
    }
    Ok(hello)
}

/// An authenticated incoming connection.
pub(crate) struct Admitted {
    pub(crate) stream: TcpStream,
    pub(crate) hello: Hello,
    pub(crate) from: SocketAddr,
}

/// Who has decided a pending connection's fate: its handshake thread once the peer is
/// authenticated, or the eviction of the oldest when the pending list is full. Whichever
/// comes first wins, so an authenticated rank is never cut off after being counted, and an
/// evicted connection is never counted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fate {
    Handshaking,
    Admitted,
    Evicted,
}

/// One connection being handshaken.
struct Pending {
    id: u64,
    handle: TcpStream,
    fate: Arc<Mutex<Fate>>,
}

/// Moves `fate` from `Handshaking` to `to`; false if it was already decided.
fn decide(fate: &Mutex<Fate>, to: Fate) -> bool {
    let mut f = fate.lock().unwrap_or_else(|p| p.into_inner());
    if *f != Fate::Handshaking {
        return false;
    }
    *f = to;
    true
}

/// Handshakes incoming connections concurrently, bounded in number and in time.
pub(crate) struct Admission {
    local: Local,
    lowest: usize,
    next_id: u64,
    /// Connections being handshaken, oldest first, with a handle to drop each and the
    /// claim that decides whether it is admitted or evicted.
    pending: VecDeque<Pending>,
    done_tx: Sender<(u64, Option<Admitted>)>,
    done_rx: Receiver<(u64, Option<Admitted>)>,
}

impl Admission {
    /// Admission for connections from ranks `lowest..size`.
    pub(crate) fn new(local: Local, lowest: usize) -> Admission {
        let (done_tx, done_rx) = mpsc::channel();
        Admission {
            local,
            lowest,
            next_id: 0,
            pending: VecDeque::new(),
            done_tx,
            done_rx,
        }
    }

    /// Accepts what is waiting on the (non-blocking) listener and starts its handshakes;
    /// returns the connections authenticated since the last call. Sleeps briefly when
    /// nothing happened, so a loop around it does not spin.
    pub(crate) fn poll(&mut self, listener: &TcpListener) -> io::Result<Vec<Admitted>> {
        let mut idle = true;
        let mut admitted = self.finished(&mut idle);
        loop {
            match listener.accept() {
                Ok((stream, from)) => {
                    idle = false;
                    self.start(stream, from);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A connection that died in the backlog (reset before accept) is not ours
                // to worry about.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => return Err(e),
            }
        }
        admitted.extend(self.finished(&mut idle));
        if idle {
            thread::sleep(Duration::from_millis(2));
        }
        Ok(admitted)
    }

    /// The handshakes that finished since the last look, out of the pending list.
    fn finished(&mut self, idle: &mut bool) -> Vec<Admitted> {
        let mut admitted = Vec::new();
        while let Ok((id, result)) = self.done_rx.try_recv() {
            *idle = false;
            self.pending.retain(|p| p.id != id);
            if let Some(a) = result {
                admitted.push(a);
            }
        }
        admitted
    }

    fn start(&mut self, stream: TcpStream, from: SocketAddr) {
        if self.pending.len() >= MAX_UNAUTHENTICATED {
            self.evict_oldest_unauthenticated();
        }
        let Ok(handle) = stream.try_clone() else {
            return;
        };
        let id = self.next_id;
        self.next_id += 1;
        let fate = Arc::new(Mutex::new(Fate::Handshaking));
        self.pending.push_back(Pending {
            id,
            handle,
            fate: fate.clone(),
        });
        let local = self.local.clone();
        let lowest = self.lowest;
        let done = self.done_tx.clone();
        let spawned = thread::Builder::new()
            .name("dsm-handshake".into())
            .stack_size(HANDSHAKE_STACK)
            .spawn(move || {
                let mut stream = stream;
                let result = match accept(&mut stream, &local, lowest) {
                    Ok(hello) if decide(&fate, Fate::Admitted) => Some(Admitted {
                        stream,
                        hello,
                        from,
                    }),
                    Ok(hello) => {
                        debug!(
                            "rank {}: rank {} from {from} authenticated after its \
                             connection was evicted; it dials again",
                            local.rank, hello.rank
                        );
                        None
                    }
                    Err(reason) if reason.starts_with(NO_HELLO) => {
                        debug!(
                            "rank {}: dropped connection from {from}: {reason}",
                            local.rank
                        );
                        None
                    }
                    Err(reason) => {
                        warn!(
                            "rank {}: refused connection from {from}: {reason}",
                            local.rank
                        );
                        None
                    }
                };
                let _ = done.send((id, result));
            });
        if spawned.is_err() {
            // Out of threads: treat it like an evicted stranger.
            if let Some(p) = self.pending.pop_back() {
                let _ = p.handle.shutdown(Shutdown::Both);
            }
        }
    }

    /// Drops the oldest connection whose handshake has not authenticated it. One that has
    /// is left alone: its admission is on its way through the channel, and cutting it here
    /// would count a rank whose connection is dead (issue 34: rank 0 then completed the
    /// job with it and the rank, redialling a closed port, never joined).
    fn evict_oldest_unauthenticated(&mut self) {
        let Some(k) = self
            .pending
            .iter()
            .position(|p| decide(&p.fate, Fate::Evicted))
        else {
            return;
        };
        if let Some(p) = self.pending.remove(k) {
            debug!(
                "rank {}: too many unauthenticated connections; dropping the oldest",
                self.local.rank
            );
            let _ = p.handle.shutdown(Shutdown::Both);
        }
    }

    /// Drops every connection still being handshaken (the job is complete or has failed).
    pub(crate) fn close(&mut self) {
        for p in self.pending.drain(..) {
            let _ = p.handle.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Write;

    /// Sends `bytes` (and, if given, a well-formed hello first) on a new connection to an
    /// acceptor and waits until its handshake thread has given up on it.
    fn hostile_connection(hello_first: bool, bytes: &[u8]) -> usize {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let local = Local {
            rank: 0,
            size: 2,
            secret: b"k".as_slice().into(),
        };
        let mut admission = Admission::new(local, 1);
        let mut s = TcpStream::connect(addr).unwrap();
        if hello_first {
            let hello = Hello {
                magic: HELLO_MAGIC,
                version: PROTOCOL_VERSION,
                rank: 1,
                size: 2,
                listen: "127.0.0.1:1".into(),
                nonce: [3; 32],
            };
            write_frame(&mut s, &hello).unwrap();
        }
        let _ = s.write_all(bytes);
        let _ = s.shutdown(Shutdown::Write);
        let mut admitted = 0;
        let deadline = Instant::now() + HANDSHAKE_WAIT * 2;
        loop {
            admitted += admission.poll(&listener).unwrap().len();
            if admission.next_id > 0 && admission.pending.is_empty() {
                return admitted;
            }
            assert!(Instant::now() < deadline, "the handshake never ended");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

        /// Garbage, or a real hello followed by garbage instead of a proof, is never
        /// admitted, and the acceptor's thread ends at once (the peer closed its side).
        #[test]
        fn garbage_is_never_admitted(
            hello_first in any::<bool>(),
            bytes in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            prop_assert_eq!(hostile_connection(hello_first, &bytes), 0);
        }
    }

    /// A rank that has authenticated but whose admission has not been collected yet is not
    /// the "oldest unauthenticated" connection a flood evicts: it is admitted with a live
    /// connection (before, the eviction shut it and rank 0 counted a dead rank).
    #[test]
    fn a_flood_never_evicts_an_authenticated_rank() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let local = |rank| Local {
            rank,
            size: 2,
            secret: b"k".as_slice().into(),
        };
        let mut admission = Admission::new(local(0), 1);
        let rank1 = thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            let reply = connect(&mut s, &local(1), 0, "127.0.0.1:1".into(), deadline);
            (s, reply.map_err(|e| format!("{e:?}")))
        });
        // Start rank 1's handshake and wait until its thread has authenticated it, without
        // collecting the admission.
        let deadline = Instant::now() + Duration::from_secs(10);
        while admission.pending.is_empty() {
            assert!(admission.finished(&mut true).is_empty());
            if let Ok((s, from)) = listener.accept() {
                admission.start(s, from);
            }
            assert!(Instant::now() < deadline, "rank 1 never connected");
        }
        let fate = admission.pending[0].fate.clone();
        while *fate.lock().unwrap() != Fate::Admitted {
            assert!(Instant::now() < deadline, "rank 1 never authenticated");
            thread::sleep(Duration::from_millis(1));
        }
        // The flood arrives before the next poll collects rank 1's admission.
        let strangers: Vec<_> = (0..MAX_UNAUTHENTICATED + 8)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let mut started = 0;
        while started < strangers.len() {
            if let Ok((s, from)) = listener.accept() {
                admission.start(s, from);
                started += 1;
            }
            assert!(
                Instant::now() < deadline,
                "the strangers were never accepted"
            );
        }
        assert_eq!(admission.pending.len(), MAX_UNAUTHENTICATED);
        let mut admitted = Vec::new();
        while admitted.is_empty() {
            admitted.extend(admission.poll(&listener).unwrap());
            assert!(Instant::now() < deadline, "rank 1 was never admitted");
        }
        assert_eq!(admitted.len(), 1);
        assert_eq!(admitted[0].hello.rank, 1);
        write_frame(
            &mut admitted[0].stream,
            &HelloReply::Welcome { listen: vec![] },
        )
        .unwrap();
        let (_s, reply) = rank1.join().unwrap();
        assert!(
            matches!(reply, Ok(HelloReply::Welcome { .. })),
            "rank 1 got {reply:?}"
        );
        drop(strangers);
    }

    #[test]
    fn proofs_bind_role_nonces_ranks_and_size() {
        let secret = b"k";
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let t = |c, d, connector, size| Transcript {
            connector_nonce: c,
            acceptor_nonce: d,
            connector,
            acceptor: 0,
            size,
        };
        let p = t(&a, &b, 1, 4).proof(secret, Role::Acceptor);
        assert!(t(&a, &b, 1, 4).verifies(secret, Role::Acceptor, &p));
        for (role, (c, d), (connector, _), size, key) in [
            (Role::Connector, (&a, &b), (1, 0), 4, &secret[..]),
            (Role::Acceptor, (&b, &a), (1, 0), 4, &secret[..]),
            (Role::Acceptor, (&a, &b), (2, 0), 4, &secret[..]),
            (Role::Acceptor, (&a, &b), (1, 0), 5, &secret[..]),
            (Role::Acceptor, (&a, &b), (1, 0), 4, &b"other"[..]),
        ] {
            assert!(!t(c, d, connector, size).verifies(key, role, &p));
        }
    }
}
