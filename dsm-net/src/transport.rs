//! The async transport the comm thread runs on once the mesh is up: one reader task and
//! one writer task per peer on a single-threaded tokio runtime. Incoming frames are decoded
//! and handed to a callback in arrival order; outgoing messages are encoded at once and
//! queued, and the writer batches whatever is queued into as few syscalls as it can.
//! A malformed frame or a lost peer is reported to the callback, never a panic.

use crate::bootstrap::Mesh;
use crate::framing::{codec, decode, encode, WireError};
use crate::wire::Msg;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use std::cell::Cell;
use std::rc::Rc;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};

/// What a reader task reports about its peer.
#[derive(Debug)]
pub enum PeerEvent {
    Message(Msg),
    /// The peer closed the connection (normal at job end, fatal before).
    Closed,
    /// The connection broke or carried a malformed frame.
    Failed(WireError),
}

/// Byte and message counters, for benchmarks and the race-detection statistics.
#[derive(Default, Debug)]
pub struct Traffic {
    pub messages_sent: Cell<u64>,
    pub bytes_sent: Cell<u64>,
    pub messages_received: Cell<u64>,
    pub bytes_received: Cell<u64>,
}

pub struct Transport {
    me: usize,
    outboxes: Vec<Option<mpsc::UnboundedSender<Bytes>>>,
    writers: Vec<tokio::task::JoinHandle<()>>,
    pub traffic: Rc<Traffic>,
}

pub type Handler = Rc<dyn Fn(usize, PeerEvent)>;

impl Transport {
    /// Starts reader and writer tasks for every link of `mesh`. Must run inside a
    /// `tokio::task::LocalSet` on a runtime with I/O enabled.
    pub fn start(mesh: Mesh, handler: Handler) -> std::io::Result<Transport> {
        let traffic = Rc::new(Traffic::default());
        let mut outboxes = Vec::with_capacity(mesh.size);
        let mut writers = Vec::new();
        for (peer, stream) in mesh.streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                outboxes.push(None);
                continue;
            };
            stream.set_nonblocking(true)?;
            let stream = TcpStream::from_std(stream)?;
            let (read_half, write_half) = stream.into_split();
            let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
            outboxes.push(Some(tx));

            let h = handler.clone();
            let t = traffic.clone();
            tokio::task::spawn_local(async move {
                let mut frames = FramedRead::new(read_half, codec());
                loop {
                    match frames.next().await {
                        Some(Ok(frame)) => {
                            t.messages_received.set(t.messages_received.get() + 1);
                            t.bytes_received
                                .set(t.bytes_received.get() + frame.len() as u64 + 4);
                            match decode::<Msg>(&frame) {
                                Ok(msg) => h(peer, PeerEvent::Message(msg)),
                                Err(e) => {
                                    h(peer, PeerEvent::Failed(e));
                                    return;
                                }
                            }
                        }
                        Some(Err(e)) => {
                            let err = if e.kind() == std::io::ErrorKind::InvalidData {
                                WireError::TooLarge {
                                    len: usize::MAX,
                                    max: crate::framing::MAX_FRAME,
                                }
                            } else {
                                WireError::Io(e)
                            };
                            h(peer, PeerEvent::Failed(err));
                            return;
                        }
                        None => {
                            h(peer, PeerEvent::Closed);
                            return;
                        }
                    }
                }
            });

            let h = handler.clone();
            writers.push(tokio::task::spawn_local(async move {
                let mut sink = FramedWrite::new(write_half, codec());
                while let Some(first) = rx.recv().await {
                    let mut result = sink.feed(first).await;
                    while result.is_ok() {
                        match rx.try_recv() {
                            Ok(more) => result = sink.feed(more).await,
                            Err(_) => break,
                        }
                    }
                    if result.is_ok() {
                        result = SinkExt::<Bytes>::flush(&mut sink).await;
                    }
                    if let Err(e) = result {
                        h(peer, PeerEvent::Failed(WireError::Io(e)));
                        return;
                    }
                }
                let _ = SinkExt::<Bytes>::close(&mut sink).await;
            }));
        }
        Ok(Transport {
            me: mesh.rank,
            outboxes,
            writers,
            traffic,
        })
    }

    pub fn rank(&self) -> usize {
        self.me
    }

    /// Encodes and queues `msg` for `to`; returns the encoded size in bytes.
    pub fn send(&self, to: usize, msg: &Msg) -> Result<usize, WireError> {
        let bytes = encode(msg)?;
        let len = bytes.len();
        let outbox = self
            .outboxes
            .get(to)
            .and_then(|o| o.as_ref())
            .ok_or(WireError::Closed)?;
        outbox
            .send(Bytes::from(bytes))
            .map_err(|_| WireError::Closed)?;
        self.traffic
            .messages_sent
            .set(self.traffic.messages_sent.get() + 1);
        self.traffic
            .bytes_sent
            .set(self.traffic.bytes_sent.get() + len as u64 + 4);
        Ok(len)
    }

    /// Stops sending: writers flush what is queued and close their side of each
    /// connection. Waits up to `grace` for that to happen.
    pub async fn shutdown(mut self, grace: std::time::Duration) {
        for o in self.outboxes.iter_mut() {
            o.take();
        }
        let writers = std::mem::take(&mut self.writers);
        let _ = tokio::time::timeout(grace, async move {
            for w in writers {
                let _ = w.await;
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::connect_mesh;
    use crate::env::{JobEnv, Launcher, RaceOptions};
    use std::cell::RefCell;
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::Duration;

    fn job(rank: usize, coord: std::net::SocketAddr) -> JobEnv {
        JobEnv {
            rank,
            size: 2,
            launcher: Launcher::Standalone,
            coord: Some(coord),
            secret: "t".into(),
            connect_timeout: Duration::from_secs(10),
            segment_bytes: None,
            race: RaceOptions::default(),
        }
    }

    fn run_local<F: std::future::Future>(f: F) -> F::Output {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&rt, f)
    }

    #[test]
    fn messages_flow_and_malformed_frames_are_reported() {
        let coord = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let peer = std::thread::spawn(move || connect_mesh(&job(1, coord)).unwrap());
        let mesh0 = connect_mesh(&job(0, coord)).unwrap();
        let mut mesh1 = peer.join().unwrap();
        // Rank 1 speaks raw bytes: one good frame, then garbage.
        let mut raw = mesh1.streams[0].take().unwrap();
        let good = encode(&Msg::Abort {
            reason: "hi".into(),
        })
        .unwrap();
        raw.write_all(&(good.len() as u32).to_be_bytes()).unwrap();
        raw.write_all(&good).unwrap();
        raw.write_all(&[0, 0, 0, 3, 0xff, 0xff, 0xff]).unwrap();

        let events = Rc::new(RefCell::new(Vec::new()));
        let ev = events.clone();
        run_local(async move {
            let _t = Transport::start(
                mesh0,
                Rc::new(move |p, e| ev.borrow_mut().push((p, format!("{e:?}")))),
            )
            .unwrap();
            for _ in 0..200 {
                if events.borrow().len() >= 2 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let got = events.borrow();
            assert_eq!(got.len(), 2, "{got:?}");
            assert!(got[0].1.contains("hi"), "{got:?}");
            assert!(got[1].1.contains("Malformed"), "{got:?}");
        });
    }
}
