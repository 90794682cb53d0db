//! Transport and bootstrap for dsm: the message types nodes exchange, their framing on a
//! TCP stream, how a node learns its rank and job from the environment, how the mesh of
//! connections between all nodes is set up (with the job secret keeping strangers out), and
//! the asynchronous transport the comm thread uses once the mesh is up.
#![forbid(unsafe_code)]

pub mod bootstrap;
pub mod env;
pub mod framing;
pub mod launcher;
pub mod transport;
pub mod wire;

pub use bootstrap::{connect_mesh, BootstrapError, Mesh};
pub use env::{EnvError, JobEnv, RaceOptions};
pub use framing::{decode, encode, WireError, MAX_FRAME};
pub use transport::{Outbox, PeerEvent, Transport};
pub use wire::*;
