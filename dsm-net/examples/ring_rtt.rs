//! The floor of a shared-memory round trip: two threads ping-pong one byte through a
//! region's two rings, sleeping on their eventfds between messages exactly as the
//! transport's reader tasks do (flag, re-check, block), against the same ping-pong over a
//! loopback TCP connection. Prints medians in microseconds.
//!
//! `cargo run --release -p dsm-net --example ring_rtt [REPS]`

use dsm_net::ring::{Direction, Region, RingReader, RingWriter, DEFAULT_RING_BYTES};
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

/// One side of the ring ping-pong: its writer and the bell that wakes the peer, its
/// reader and the bell the peer rings.
struct End {
    writer: RingWriter,
    peer_bell: Arc<EventFd>,
    reader: RingReader,
    bell: Arc<EventFd>,
}

impl End {
    fn send(&mut self) {
        assert_eq!(self.writer.write(&[1]).unwrap(), 1);
        if self.writer.reader_needs_wake() {
            self.peer_bell.write(1).unwrap();
        }
    }

    fn receive(&mut self, buf: &mut Vec<u8>) {
        buf.clear();
        loop {
            if self.reader.read_into(buf, 1).unwrap() == 1 {
                return;
            }
            if !self.reader.prepare_wait().unwrap() {
                // Blocking read: the counter was reset by the last wake-up.
                let _ = self.bell.read();
            }
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let region = Arc::new(Region::create(DEFAULT_RING_BYTES, [0; 32]).unwrap());
    let bell = || Arc::new(EventFd::from_flags(EfdFlags::EFD_CLOEXEC).unwrap());
    let (bell_a, bell_b) = (bell(), bell());
    let mut a = End {
        writer: RingWriter::new(region.clone(), Direction::Forward),
        peer_bell: bell_b.clone(),
        reader: RingReader::new(region.clone(), Direction::Backward),
        bell: bell_a.clone(),
    };
    let mut b = End {
        writer: RingWriter::new(region.clone(), Direction::Backward),
        peer_bell: bell_a,
        reader: RingReader::new(region, Direction::Forward),
        bell: bell_b,
    };
    let echo = std::thread::spawn(move || {
        let mut buf = Vec::new();
        for _ in 0..reps {
            b.receive(&mut buf);
            b.send();
        }
    });
    let mut buf = Vec::new();
    let mut ring = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        a.send();
        a.receive(&mut buf);
        ring.push(t.elapsed().as_secs_f64() * 1e6);
    }
    echo.join().unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut byte = [0u8; 1];
        for _ in 0..reps {
            s.read_exact(&mut byte).unwrap();
            s.write_all(&byte).unwrap();
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut byte = [0u8; 1];
    let mut tcp = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        s.write_all(&byte).unwrap();
        s.read_exact(&mut byte).unwrap();
        tcp.push(t.elapsed().as_secs_f64() * 1e6);
    }
    echo.join().unwrap();
    println!(
        "round trip, median of {reps}: shared-memory ring {:.2} us, loopback TCP {:.2} us",
        median(ring),
        median(tcp)
    );
}
