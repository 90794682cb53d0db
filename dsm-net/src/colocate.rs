//! Which pairs of ranks talk through shared memory: decided pair by pair once the TCP mesh
//! is up, before any protocol message.
//!
//! "On one host" has to mean "can map the same memory", not "has the same IP address":
//! tests put hosts in network namespaces of one kernel, and a cluster node may run ranks in
//! containers. So the pair proves it by doing it. For a pair `lo < hi`, on their
//! authenticated TCP connection:
//!
//! 1. `hi` sends a [`ShmHello`]: its kernel boot id (the cheap filter: other machines stop
//!    here), the name of an abstract unix socket it listens on, and a fresh nonce. An
//!    abstract socket is reachable only inside its network namespace, which is what keeps
//!    ranks of different (simulated) hosts on TCP.
//! 2. `lo`, if the boot ids match and it may use shared memory, creates a sealed region
//!    ([`crate::ring::Region`]) whose header carries the nonce, and four eventfd bells,
//!    connects to the socket and hands them over (`SCM_RIGHTS`); it answers [`ShmOffer`].
//! 3. `hi` accepts on its socket (ignoring anything that does not carry its nonce: another
//!    process on the host could connect too), checks and maps the region, and answers
//!    [`ShmVerdict`].
//!
//! With `DSM_TRANSPORT=auto`, every rank makes one empty memfd, the file its host's memory
//! would live in, and hands the one it holds to each higher co-located peer in the same
//! message; a rank keeps the file of its lowest co-located peer (the first pair it walks
//! with one), so the ranks of a host end up holding its lowest rank's file. Whether the
//! job maps it, as one common segment (every rank on one host) or one memory per host,
//! is decided once every rank's links are known ([`crate::agree_segment_base`];
//! dsm-core sizes and maps it).
//!
//! Any failure along the way (no such socket, no memfd, a refused region) leaves the pair
//! on TCP with a debug line; only a broken TCP connection is an error. Every rank walks its
//! pairs in the same (lexicographic) order, which cannot deadlock: the smallest pair not
//! yet done always has both ranks waiting on it.

use crate::framing::{read_frame, write_frame, WireError};
use crate::handshake::MAX_HANDSHAKE;
use crate::mesh::{BootstrapError, Mesh};
use crate::ring::{self, Direction, Region, DEFAULT_RING_BYTES};
use dsm_proto::{JobConfig, ShmHello, ShmOffer, ShmVerdict, TransportChoice};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::debug;

/// How long the higher rank waits on its unix socket for the region the lower one said
/// it sent: both are on one host, so this only covers scheduling delays.
const ACCEPT_WAIT: Duration = Duration::from_secs(5);

/// How long one connection to the socket may take to deliver its offer.
const OFFER_WAIT: Duration = Duration::from_millis(500);

/// What the region's creator writes in the descriptor message, so a stray message is not
/// mistaken for one.
const OFFER_TAG: &[u8] = b"dsm-ring-offer";

pub use crate::ring::ShmLink;

/// The kernel's boot id: equal for processes on one running kernel.
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn bell() -> io::Result<OwnedFd> {
    Ok(EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?.into())
}

/// Sets up shared memory with every peer that can map the same memory (see the module
/// documentation), filling `mesh.shm`. With `DSM_TRANSPORT=tcp` this rank still answers its
/// peers (declining), so both ends of every pair agree.
pub(crate) fn colocate(
    env: &JobConfig,
    mesh: &mut Mesh,
    deadline: Instant,
) -> Result<(), BootstrapError> {
    let me = env.rank;
    let wants = env.transport.rings_allowed();
    if env.transport == TransportChoice::Auto {
        match segment_file() {
            Ok(f) => mesh.segment_file = Some(f),
            Err(e) => debug!("rank {me}: no file for its host's memory ({e}); pages travel"),
        }
    }
    // Whether `mesh.segment_file` came from a lower co-located peer yet.
    let mut host_file_received = false;
    let host = if wants { boot_id() } else { None };
    // Our socket for the regions of lower ranks (only rank 0 has none).
    let listener = match (&host, me) {
        (Some(_), 1..) => match listen(me) {
            Ok(l) => Some(l),
            Err(e) => {
                debug!("rank {me}: no unix socket for shared memory ({e}); TCP only");
                None
            }
        },
        _ => None,
    };
    for peer in 0..mesh.size {
        if peer == me {
            continue;
        }
        let stream = mesh.streams[peer]
            .as_mut()
            .expect("a complete mesh links every pair");
        let left = deadline.saturating_duration_since(Instant::now());
        stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        let broke = |source: WireError| BootstrapError::Handshake { peer, source };
        let link = if peer < me {
            let nonce: [u8; 32] = rand::random();
            let hello = ShmHello {
                host: listener.as_ref().and(host.clone()),
                listen: listener
                    .as_ref()
                    .map(|(_, n)| n.clone())
                    .unwrap_or_default(),
                nonce,
            };
            write_frame(stream, &hello).map_err(broke)?;
            let offer: ShmOffer = read_frame(stream, MAX_HANDSHAKE).map_err(broke)?;
            if offer.offered {
                let (l, _) = listener.as_ref().expect("offers come only after our hello");
                let result = accept_region(l, &nonce);
                let verdict = ShmVerdict {
                    refused: result.as_ref().err().map(|e| e.to_string()),
                };
                write_frame(stream, &verdict).map_err(broke)?;
                match result {
                    Ok((link, file)) => {
                        if !host_file_received {
                            // This host's lowest rank: its file is the host's.
                            mesh.segment_file = file;
                            host_file_received = true;
                        }
                        Some(link)
                    }
                    Err(e) => {
                        debug!("rank {me}: refused rank {peer}'s shared memory: {e}");
                        None
                    }
                }
            } else {
                None
            }
        } else {
            let hello: ShmHello = read_frame(stream, MAX_HANDSHAKE).map_err(broke)?;
            let offered = match (&host, &hello.host) {
                (Some(ours), Some(theirs)) if ours == theirs => {
                    // The host's file: every lower co-located peer has been walked.
                    let file = mesh.segment_file.as_ref().map(|f| f.as_fd());
                    match offer_region(&hello.listen, hello.nonce, ring_bytes(mesh.size), file) {
                        Ok(link) => Some(link),
                        Err(e) => {
                            debug!("rank {me}: no shared memory with rank {peer}: {e}");
                            None
                        }
                    }
                }
                _ => None,
            };
            write_frame(
                stream,
                &ShmOffer {
                    offered: offered.is_some(),
                },
            )
            .map_err(broke)?;
            match offered {
                Some(link) => {
                    let verdict: ShmVerdict = read_frame(stream, MAX_HANDSHAKE).map_err(broke)?;
                    match verdict.refused {
                        None => Some(link),
                        Some(reason) => {
                            debug!("rank {peer} refused our shared memory: {reason}");
                            None
                        }
                    }
                }
                None => None,
            }
        };
        stream.set_read_timeout(None)?;
        mesh.shm[peer] = link;
    }
    let shm: Vec<usize> = (0..mesh.size).filter(|&p| mesh.shm[p].is_some()).collect();
    tracing::info!("rank {me}: shared memory with ranks {shm:?}, TCP with the others");
    Ok(())
}

/// Bytes of each ring of a pair in a job of `size` ranks: [`DEFAULT_RING_BYTES`] up to 8
/// ranks, then less, so that a rank's rings (two per co-located peer) stay within about
/// 4 MiB however many ranks share its host (64 KiB per ring at least; larger messages
/// still pass, in pieces).
fn ring_bytes(size: usize) -> usize {
    let share = (4 << 20) / size.max(1) / 2;
    let pow2 = if share.is_power_of_two() {
        share
    } else {
        share.next_power_of_two() / 2
    };
    pow2.clamp(64 << 10, DEFAULT_RING_BYTES)
}

/// An abstract unix socket with an unguessable name.
fn listen(me: usize) -> io::Result<(UnixListener, String)> {
    let name = format!(
        "dsm-shm-{}-{me}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    );
    let l = UnixListener::bind_addr(&UnixAddr::from_abstract_name(name.as_bytes())?)?;
    l.set_nonblocking(true)?;
    Ok((l, name))
}

/// The empty memfd a rank offers as the file of its host's memory.
fn segment_file() -> io::Result<OwnedFd> {
    Ok(memfd_create(
        c"dsm-common-segment",
        MemFdCreateFlag::MFD_CLOEXEC,
    )?)
}

/// The lower rank's side: a new region and bells (and the host memory's file), handed
/// over on the peer's socket.
fn offer_region(
    listen: &str,
    nonce: [u8; 32],
    ring_bytes: usize,
    segment_file: Option<BorrowedFd<'_>>,
) -> io::Result<ShmLink> {
    let sock = UnixStream::connect_addr(&UnixAddr::from_abstract_name(listen.as_bytes())?)?;
    let region = Region::create(ring_bytes, nonce).map_err(io::Error::other)?;
    // Forward ring: us -> peer. Its data bell wakes the peer, its space bell us.
    let (fwd_data, fwd_space, back_data, back_space) = (bell()?, bell()?, bell()?, bell()?);
    let mut fds = vec![
        region.fd().as_fd(),
        fwd_data.as_fd(),
        fwd_space.as_fd(),
        back_data.as_fd(),
        back_space.as_fd(),
    ];
    fds.extend(segment_file);
    ring::send_fds(&sock, OFFER_TAG, &fds)?;
    Ok(ShmLink {
        region: Arc::new(region),
        send: Direction::Forward,
        our_data_bell: back_data,
        our_space_bell: fwd_space,
        peer_data_bell: fwd_data,
        peer_space_bell: back_space,
    })
}

/// The higher rank's side: the first message on its socket that carries a region with our
/// nonce, within [`ACCEPT_WAIT`], and the host memory's file if it came along.
fn accept_region(
    listener: &UnixListener,
    nonce: &[u8; 32],
) -> io::Result<(ShmLink, Option<OwnedFd>)> {
    let until = Instant::now() + ACCEPT_WAIT;
    loop {
        let sock = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= until {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the region never arrived on the unix socket",
                    ));
                }
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            Err(e) => return Err(e),
        };
        match receive_region(&sock, nonce, until) {
            Ok(link) => return Ok(link),
            Err(e) => debug!("ignored a connection to the shared-memory socket: {e}"),
        }
    }
}

fn receive_region(
    sock: &UnixStream,
    nonce: &[u8; 32],
    until: Instant,
) -> io::Result<(ShmLink, Option<OwnedFd>)> {
    sock.set_nonblocking(false)?;
    // The peer sends its offer as soon as it is connected; a connection that says nothing
    // for a moment (a stranger's) must not keep the peer's waiting behind it.
    let left = until.saturating_duration_since(Instant::now());
    sock.set_read_timeout(Some(left.clamp(Duration::from_millis(1), OFFER_WAIT)))?;
    let mut tag = [0u8; 32];
    let (n, fds) = ring::recv_fds(sock, &mut tag)?;
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_owned());
    if &tag[..n] != OFFER_TAG {
        return Err(bad("not a dsm region offer"));
    }
    let mut fds = fds.into_iter();
    let mut next = || fds.next().ok_or_else(|| bad("wrong number of descriptors"));
    let (region, fwd_data, fwd_space, back_data, back_space) =
        (next()?, next()?, next()?, next()?, next()?);
    let segment_file = fds.next();
    if fds.next().is_some() {
        return Err(bad("wrong number of descriptors"));
    }
    let region = Region::open(region).map_err(io::Error::other)?;
    if &region.nonce() != nonce {
        return Err(bad("the region does not carry our nonce"));
    }
    let link = ShmLink {
        region: Arc::new(region),
        send: Direction::Backward,
        our_data_bell: fwd_data,
        our_space_bell: back_space,
        peer_data_bell: back_data,
        peer_space_bell: fwd_space,
    };
    Ok((link, segment_file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_without_the_nonce_is_ignored() {
        let (l, name) = listen(3).unwrap();
        let nonce = rand::random();
        // A stranger's region first, then the peer's.
        let _stranger = offer_region(&name, rand::random(), 64 << 10, None).unwrap();
        let ours = offer_region(&name, nonce, 64 << 10, None).unwrap();
        let (got, file) = accept_region(&l, &nonce).unwrap();
        assert_eq!(got.region.nonce(), nonce);
        assert_eq!(ours.region.nonce(), nonce);
        assert_eq!(got.send, Direction::Backward);
        assert!(file.is_none());
    }

    #[test]
    fn rank_0s_segment_file_comes_with_its_region() {
        let (l, name) = listen(5).unwrap();
        let nonce = rand::random();
        let file = segment_file().unwrap();
        // Sized by the offerer only to tell it apart: the receiver sees the same file.
        nix::unistd::ftruncate(&file, 3 * 4096).unwrap();
        let stranger_file = segment_file().unwrap();
        let _stranger =
            offer_region(&name, rand::random(), 64 << 10, Some(stranger_file.as_fd())).unwrap();
        let _ours = offer_region(&name, nonce, 64 << 10, Some(file.as_fd())).unwrap();
        let (_, got) = accept_region(&l, &nonce).unwrap();
        let got = std::fs::File::from(got.expect("the segment file came along"));
        assert_eq!(got.metadata().unwrap().len(), 3 * 4096);
    }

    #[test]
    fn a_silent_stranger_does_not_keep_the_peer_waiting() {
        let (l, name) = listen(4).unwrap();
        let nonce = rand::random();
        let _silent =
            UnixStream::connect_addr(&UnixAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        let ours = offer_region(&name, nonce, 64 << 10, None).unwrap();
        let started = Instant::now();
        let (got, _) = accept_region(&l, &nonce).unwrap();
        assert_eq!(got.region.nonce(), ours.region.nonce());
        assert!(
            started.elapsed() < ACCEPT_WAIT / 2,
            "took {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn rings_shrink_as_jobs_grow() {
        assert_eq!(ring_bytes(2), DEFAULT_RING_BYTES);
        assert_eq!(ring_bytes(8), DEFAULT_RING_BYTES);
        assert_eq!(ring_bytes(12), 128 << 10);
        assert_eq!(ring_bytes(16), 128 << 10);
        assert_eq!(ring_bytes(32), 64 << 10);
        assert_eq!(ring_bytes(1024), 64 << 10);
        for n in 1..2000 {
            assert!(ring_bytes(n).is_power_of_two());
        }
    }

    #[test]
    fn a_missing_socket_is_an_error_not_a_hang() {
        let err = offer_region("dsm-shm-nobody-listens-here", [0; 32], 64 << 10, None)
            .err()
            .expect("nobody listens");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
    }
}
