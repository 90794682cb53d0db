//! What the job start produces, and how it fails: the established connections of a node
//! ([`Mesh`]) and [`BootstrapError`]. Its own module so that the start-up steps
//! (`bootstrap`, `colocate`) build on it without depending on each other both ways.

use crate::framing::WireError;
use crate::ring::ShmLink;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use thiserror::Error;

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
    /// A peer answered the handshake with [`HelloReply::Refused`](dsm_proto::HelloReply::Refused) (wrong secret, version or
    /// job size, duplicate rank, or rank 0 giving up on the start), or rank 0's welcome was
    /// malformed.
    #[error("rank {by} refused this node: {reason}")]
    Refused {
        /// The refusing rank.
        by: usize,
        /// Its reason.
        reason: String,
    },
    /// The peer at this address answered the handshake but could not prove it knows the
    /// job secret.
    #[error("rank {peer} at {addr} could not prove it knows the job secret: a process of another job holds that address, or this rank's DSM_JOB_SECRET is not the job's")]
    Impostor {
        /// The rank this node meant to reach.
        peer: usize,
        /// Where it connected.
        addr: SocketAddr,
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
    /// The shared-memory link to each rank that can map the same memory as this one
    /// ([`crate::colocate`]); its protocol messages travel there, while the TCP
    /// connection stays open to tell whether the peer is still alive.
    pub shm: Vec<Option<ShmLink>>,
    /// The file this host's memory would live in ([`crate::colocate`]): the empty memfd of
    /// the host's lowest rank, which made it and handed it to its co-located peers (rank
    /// 0's when every rank shares one host: the job's common segment). Whether the job
    /// uses it is decided afterwards, with the segment's base
    /// ([`agree_segment_base`](crate::agree_segment_base)); it is only made with `DSM_TRANSPORT=auto`.
    pub segment_file: Option<OwnedFd>,
}
