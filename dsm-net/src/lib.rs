//! Transport and bootstrap for dsm: the framing of [`dsm_proto`] messages on a TCP stream,
//! how the mesh of connections between all nodes is set up (with the job secret keeping
//! strangers out), and the asynchronous transport the comm thread uses once the mesh is up.
//! The messages themselves and the job configuration are [`dsm_proto`]'s.
#![warn(missing_docs)]

pub mod bootstrap;
pub mod colocate;
pub mod framing;
pub mod handshake;
pub mod mesh;
#[allow(unsafe_code)]
pub mod ring;
pub mod transport;
pub mod user_key;

pub use bootstrap::{agree_segment_base, connect_mesh, connect_mesh_with, BootstrapError, Mesh};
pub use framing::{decode, encode, WireError, MAX_FRAME};
pub use transport::{DirectSend, DirectSender, DirectTake, Outbox, PeerEvent, Transport};
