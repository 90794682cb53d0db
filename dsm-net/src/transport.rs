//! The transport once the mesh is up. Receiving: one reader task per peer on the comm
//! thread's single-threaded tokio runtime decodes frames and hands them to a callback in
//! arrival order. Sending: any thread encodes its message and writes the frame straight
//! to the socket when nothing is queued on that link, so a message leaves without waking
//! another thread; what the socket does not take at once is queued for the link's writer
//! task. A malformed frame or a lost peer is reported to the callback, never a panic. A
//! thread that must not wait or allocate (a fault handler) may write one small frame on a
//! TCP link through a [`DirectSender`], which only tries the link's lock, and take the
//! reply out of the socket itself ([`DirectSender::try_take_frame`]): a link's incoming
//! bytes have one reader at a time, and its reader task holds them only between frames it
//! has not finished delivering, so a frame is always read whole, and in order, by one of
//! the two.
//!
//! Links to co-located peers ([`crate::colocate`]) carry the same frames through a
//! shared-memory ring ([`crate::ring`]) instead of the socket: a sender copies its frame
//! into the ring and rings the peer's eventfd only if its reader sleeps; the reader task
//! waits on its eventfd and on the TCP connection, which stays open and silent so that a
//! peer's death (its socket closes) is noticed; then whatever the peer committed to the ring
//! is delivered first, and a frame it left half-written is reported as a failure, never
//! parsed. All of a pair's messages take the ring, so their order is kept. A thread
//! waiting for a reply may take the rings' frames itself ([`Outbox::poll_rings`]); each
//! ring has one consumer at a time, so frames still arrive whole and in order.
//!
//! Liveness: with a deadline, a keep-alive task on the same runtime sends a
//! [`Msg::Heartbeat`] on every link that carried nothing outgoing during the last
//! [`heartbeat_period`], and reports a peer from which nothing at all arrived for the
//! deadline as [`PeerEvent::Silent`]. Heartbeats are consumed here and never reach the
//! callback. Because the task runs on the comm thread, a program busy computing keeps its
//! links alive; only a process that is stopped, wedged or cut off falls silent.

use crate::framing::{decode, encode_frame, WireError, MAX_FRAME, PAGE_REQUEST_FRAME_MAX};
use crate::mesh::Mesh;
use crate::ring::ShmLink;
use crate::ring::{register_bell, Direction, Lane, LanePosition, Region, RingReader, RingWriter};
use bytes::{Bytes, BytesMut};
use dsm_proto::liveness::heartbeat_period;
use dsm_proto::Msg;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// What a reader task reports about its peer.
#[derive(Debug)]
pub enum PeerEvent {
    /// A whole, well-formed message from the peer.
    Message(Msg),
    /// The peer closed the connection (normal at job end, fatal before).
    Closed,
    /// The connection broke or carried a malformed frame. Nothing more comes from this
    /// peer; its writer task reports a failed send the same way.
    Failed(WireError),
    /// Nothing at all, not even a heartbeat, has arrived from the peer for this long, at
    /// least the liveness deadline given to [`Transport::start`]: the peer is stopped,
    /// wedged or unreachable. Reported once per peer; the connection stays open.
    Silent(Duration),
}

/// Byte and message counters, for benchmarks and the race-detection statistics. Shared by
/// every sender and reader task of a transport and updated with relaxed atomics, so a
/// reading taken while messages flow is approximate. Byte counts include the 4-byte
/// length prefix of each frame.
#[derive(Default, Debug)]
pub struct Traffic {
    /// Messages handed to a link (written or queued), to all peers, heartbeats included.
    pub messages_sent: AtomicU64,
    /// Bytes of those messages' frames.
    pub bytes_sent: AtomicU64,
    /// Frames received from all peers, including any that then failed to decode.
    pub messages_received: AtomicU64,
    /// Bytes of those frames.
    pub bytes_received: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// One link's sending side. A sender writes its frame straight to the socket when
/// nothing is queued before it (no hand-off to another thread: the cheapest way a message
/// leaves), and queues whatever the socket does not take at once for the link's writer task,
/// which finishes it when the socket drains. The queue lock keeps frames whole and in order.
struct Link {
    /// A duplicate of the socket's descriptor, non-blocking, for the direct writes.
    raw: std::net::TcpStream,
    queue: Mutex<LinkQueue>,
    wake: Notify,
    /// Something other than a heartbeat was handed to the link since the keep-alive task
    /// last looked.
    active: AtomicBool,
    /// For a shared-memory link: the ring position after every frame handed to the link
    /// so far, committed or queued (what a request in the page lane must come after; see
    /// [`LaneEnd::sent`]).
    sent: Arc<AtomicU64>,
    /// Who reads the socket's incoming bytes now: nobody ([`INCOMING_FREE`]), the reader
    /// task ([`INCOMING_READER`], from its first read until it holds no partial frame and
    /// has delivered every whole one), or a fault handler taking one frame
    /// ([`INCOMING_HANDLER`], see [`DirectSender::try_take_frame`]). So a frame is read
    /// whole by one of them, and a handler that finds the socket free knows that every
    /// frame before the one it takes has been delivered.
    incoming: AtomicU8,
    /// A fault handler asked over this link and waits for the reply in the socket
    /// ([`DirectSender::await_reply`]): the reader task, at a frame boundary, leaves the
    /// socket's bytes to it for a moment ([`REPLY_LEFT_FOR`] at most).
    reply_awaited: AtomicBool,
}

/// How long the reader task leaves a socket's bytes to a fault handler that waits for its
/// reply there before it reads them itself: the handler takes a reply within a few of its
/// polls, and one that does not (its budget spent, the thread preempted) must not hold
/// the link's other frames up for long.
const REPLY_LEFT_FOR: Duration = Duration::from_micros(100);

const INCOMING_FREE: u8 = 0;
const INCOMING_READER: u8 = 1;
const INCOMING_HANDLER: u8 = 2;
/// The link's incoming bytes are done with: its reader task ended, or a handler's read
/// failed in the middle of a frame (the reader task then reports the link broken).
const INCOMING_CLOSED: u8 = 3;

#[derive(Default)]
struct LinkQueue {
    frames: VecDeque<Bytes>,
    closed: bool,
    /// A frame went into the ring without its bell ([`Outbox::send_quiet`]): the next
    /// look at the ring's reader rings it if the reader sleeps.
    bell_owed: bool,
    /// Over a socket: quiet frames not written yet ([`Outbox::send_quiet`]), only while
    /// `frames` is empty. They go out in one write with the link's next frame, or when the
    /// bell they left owed is rung, so that a program releasing locks in quick
    /// succession sends its diffs a few per system call instead of one each.
    held: Vec<Bytes>,
    /// For a co-located peer: the ring the frames go to instead of the socket.
    ring: Option<RingSink>,
    /// Ring position after every frame handed to the link (mirrored in [`Link::sent`]).
    accepted: u64,
    /// Ring position after the last frame that was neither a page lane's announcement nor
    /// a heartbeat (a lane page's `needs`, see [`crate::ring::Lane::publish`]).
    significant: u64,
    /// The end of a direct frame the socket took only part of ([`DirectSender::try_send`],
    /// which may not allocate), `direct_rest_len` bytes: it goes out before anything else,
    /// as the first queued frame, once a thread that may allocate holds the lock
    /// ([`LinkQueue::queue_direct_rest`]).
    direct_rest: [u8; PAGE_REQUEST_FRAME_MAX],
    direct_rest_len: usize,
}

impl LinkQueue {
    /// Queues the rest of a partly written direct frame, ahead of every other frame.
    /// Returns whether there was one.
    fn queue_direct_rest(&mut self) -> bool {
        if self.direct_rest_len == 0 {
            return false;
        }
        let rest = Bytes::copy_from_slice(&self.direct_rest[..self.direct_rest_len]);
        self.direct_rest_len = 0;
        self.frames.push_front(rest);
        true
    }
}

/// The sending side of a shared-memory link, kept under the link's queue lock (the ring
/// has one writer at a time).
struct RingSink {
    writer: RingWriter,
    /// Rung after a commit when the peer's reader sleeps.
    peer_data_bell: OwnedFd,
}

/// Adds one to an eventfd's counter, which makes it readable for whoever waits on it.
fn ring_bell(bell: &OwnedFd) -> io::Result<()> {
    match nix::unistd::write(bell, &1u64.to_ne_bytes()) {
        // EAGAIN: the counter is saturated, so the bell is rung already.
        Ok(_) | Err(nix::errno::Errno::EAGAIN) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Resets an eventfd's counter after a wake-up.
fn clear_bell(bell: &OwnedFd) {
    let mut count = [0u8; 8];
    let _ = nix::unistd::read(bell.as_raw_fd(), &mut count);
}

impl RingSink {
    /// Copies what fits of `bytes` into the ring; returns how much.
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let n = self.write_quiet(bytes)?;
        if n > 0 {
            self.wake_reader()?;
        }
        Ok(n)
    }

    /// [`RingSink::write`] without waking a sleeping reader.
    fn write_quiet(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.writer.write(bytes).map_err(io::Error::other)
    }

    /// Rings the reader's bell if it sleeps.
    fn wake_reader(&mut self) -> io::Result<()> {
        if self.writer.reader_needs_wake() {
            ring_bell(&self.peer_data_bell)?;
        }
        Ok(())
    }
}

impl Link {
    /// Sends `frame`; with `quiet`, a sleeping reader of a shared-memory link is not woken
    /// for it (the bell is owed until [`Link::ring_owed_bell`] or the next frame).
    /// Returns whether a bell is owed now.
    fn send(&self, frame: Bytes, quiet: bool) -> Result<bool, WireError> {
        let q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.closed {
            return Err(WireError::Closed);
        }
        self.active.store(true, Ordering::Relaxed);
        self.push(q, frame, quiet, true)
    }

    /// Sends `frame` after `publish` has left something in the ring's page lane, given the
    /// lane, the ring position after every frame sent before (they are all in the ring: a
    /// link with queued frames takes no lane) and the position after the last of them that
    /// was not such an announcement. The frame wakes the reader only if no thread of the
    /// peer polls the lane ([`Lane::set_taker_polling`]). Returns `None`, sending nothing,
    /// when the link has no ring or queued frames, or `publish` declined; otherwise
    /// whether a bell is owed (see [`Link::send`]).
    fn send_after_lane(
        &self,
        frame: Bytes,
        publish: impl FnOnce(&Lane<'_>, u64, u64) -> bool,
    ) -> Result<Option<bool>, WireError> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.closed {
            return Err(WireError::Closed);
        }
        let Some(ring) = q.ring.as_ref().filter(|_| q.frames.is_empty()) else {
            return Ok(None);
        };
        if !publish(&ring.writer.lane(), ring.writer.position(), q.significant) {
            return Ok(None);
        }
        self.active.store(true, Ordering::Relaxed);
        let q = &mut *q;
        self.account(q, frame.len(), false);
        let ring = q.ring.as_mut().expect("checked above");
        let n = ring.write_quiet(&frame)?;
        // The commit comes before the look at the poller's flag (both SeqCst).
        if n == frame.len() && ring.writer.lane().taker_polling() {
            q.bell_owed = true;
            return Ok(Some(true));
        }
        ring.wake_reader()?;
        q.bell_owed = false;
        if n < frame.len() {
            q.frames.push_back(frame.slice(n..));
            self.wake.notify_one();
        }
        Ok(Some(false))
    }

    /// Counts a frame of `len` bytes handed to the link (see [`LinkQueue::accepted`]).
    fn account(&self, q: &mut LinkQueue, len: usize, significant: bool) {
        if q.ring.is_some() {
            q.accepted += len as u64;
            if significant {
                q.significant = q.accepted;
            }
            self.sent.store(q.accepted, Ordering::Release);
        }
    }

    /// Rings the bell a quiet frame left owed, if the reader sleeps; over a socket, writes
    /// the quiet frames held back.
    fn ring_owed_bell(&self) -> Result<(), WireError> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if std::mem::take(&mut q.bell_owed) {
            if let Some(ring) = q.ring.as_mut() {
                ring.wake_reader()?;
            } else if !q.held.is_empty() {
                let held = join_frames(std::mem::take(&mut q.held), None);
                return self.write_or_queue(q, held).map(|_| ());
            }
        }
        Ok(())
    }

    /// Writes `frame` straight to the socket when nothing is queued, and queues what the
    /// socket does not take. Returns whether a bell is owed (see [`Link::send`]).
    /// `significant`: the frame is neither a lane page's announcement nor a heartbeat.
    fn push(
        &self,
        mut q: MutexGuard<'_, LinkQueue>,
        frame: Bytes,
        quiet: bool,
        significant: bool,
    ) -> Result<bool, WireError> {
        self.account(&mut q, frame.len(), significant);
        // The rest of a partly written direct frame goes first (the frame then queues
        // behind it, and the writer is woken below).
        q.queue_direct_rest();
        if let (true, Some(ring)) = (q.frames.is_empty(), q.ring.as_mut()) {
            let n = ring.write_quiet(&frame)?;
            if quiet && n == frame.len() {
                q.bell_owed = true;
                return Ok(true);
            }
            // A frame that wants the reader awake, or one that does not fit (a sleeping
            // reader must make room): the bell rings for it and for quiet frames before it.
            ring.wake_reader()?;
            q.bell_owed = false;
            if n == frame.len() {
                return Ok(false);
            }
            q.frames.push_back(frame.slice(n..));
        } else if q.frames.is_empty() {
            if quiet {
                q.held.push(frame);
                q.bell_owed = true;
                return Ok(true);
            }
            q.bell_owed = false;
            let frame = join_frames(std::mem::take(&mut q.held), Some(frame));
            return self.write_or_queue(q, frame);
        } else {
            q.frames.push_back(frame);
        }
        drop(q);
        self.wake.notify_one();
        Ok(false)
    }

    /// Writes `frame` to the socket, nothing being queued before it, and queues what the
    /// socket does not take for the writer task. Returns `false` (no bell owed).
    fn write_or_queue(
        &self,
        mut q: MutexGuard<'_, LinkQueue>,
        frame: Bytes,
    ) -> Result<bool, WireError> {
        match (&self.raw).write(&frame) {
            Ok(n) if n == frame.len() => return Ok(false),
            Ok(n) => q.frames.push_back(frame.slice(n..)),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                q.frames.push_back(frame)
            }
            Err(e) => return Err(WireError::Io(e)),
        }
        drop(q);
        self.wake.notify_one();
        Ok(false)
    }

    /// Sends a heartbeat frame unless something else went out since the last look (or the
    /// link is closed). Returns whether it sent one.
    fn keep_alive(&self, heartbeat: &Bytes) -> Result<bool, WireError> {
        let q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.closed || self.active.swap(false, Ordering::Relaxed) {
            return Ok(false);
        }
        self.push(q, heartbeat.clone(), false, false).map(|_| true)
    }

    fn close(&self) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let held = std::mem::take(&mut q.held);
        q.frames.extend(held);
        q.closed = true;
        drop(q);
        self.wake.notify_one();
    }
}

/// `held` and then `last` as one buffer (no copy for a single frame).
fn join_frames(mut held: Vec<Bytes>, last: Option<Bytes>) -> Bytes {
    if held.is_empty() {
        return last.unwrap_or_default();
    }
    if held.len() == 1 && last.is_none() {
        return held.pop().unwrap_or_default();
    }
    let len = held.iter().chain(&last).map(Bytes::len).sum();
    let mut joined = Vec::with_capacity(len);
    for f in held.iter().chain(&last) {
        joined.extend_from_slice(f);
    }
    Bytes::from(joined)
}

/// The sending side of one TCP link, for a thread that must neither wait for a lock nor
/// allocate: a SIGSEGV handler asking a page's home for the page itself (dsm-core's fault
/// path). [`DirectSender::try_send`] writes one small frame, already encoded, now or not
/// at all.
#[derive(Clone)]
pub struct DirectSender {
    peer: usize,
    link: Arc<Link>,
    traffic: Arc<Traffic>,
    /// Set when a frame was only partly written (see [`Outbox::flush_direct_rests`]).
    rests: Arc<AtomicBool>,
    /// When each peer was last heard from: a frame taken here counts, as one the reader
    /// task takes does.
    hearing: Arc<[Hearing]>,
}

/// What [`DirectSender::try_take_frame`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectTake {
    /// The frame was accepted and taken out of the socket.
    Taken,
    /// Nothing was taken: the reader task holds the socket's bytes, or the next frame is
    /// not whole yet.
    NotThere,
    /// Nothing was taken: the next frame is whole but not the one wanted, or longer than
    /// the buffer.
    Other,
    /// The frame was accepted, but the socket failed while it was read out of it; what
    /// was left of it, the reader task finds and reports as a broken link.
    Broken,
}

/// What [`DirectSender::try_send`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectSend {
    /// The whole frame went to the socket.
    Sent,
    /// Nothing was sent.
    Refused,
    /// The socket took part of the frame; the rest waits in the link, ahead of every later
    /// frame, until a thread that may allocate queues it for the link's writer: another
    /// send on the link, or [`Outbox::flush_direct_rests`], which the caller must have
    /// called soon (the fault handler kicks the comm thread for it).
    Partly,
}

impl DirectSender {
    /// The rank at the other end of the link.
    pub fn peer(&self) -> usize {
        self.peer
    }

    /// Writes `frame` (whole: length prefix and payload, at most
    /// [`PAGE_REQUEST_FRAME_MAX`] bytes, such as a [`crate::framing::page_request_frame`])
    /// to the socket, behind every frame handed to the link before it. Refuses, sending
    /// nothing, when another thread holds the link's lock at this moment (this never
    /// waits for it), when frames are queued on the link (they go first, and the queue is
    /// not this caller's to extend), when the link is closed or goes through shared
    /// memory, or when the socket does not report room (a zero-timeout `poll`) or takes
    /// nothing.
    ///
    /// Nothing here allocates, blocks or waits on another thread: one compare-and-swap on
    /// the link's lock, `poll(2)`, one `send(2)` and atomics, all async-signal-safe. A
    /// socket that reports room takes a frame this small whole; should it take only part,
    /// the rest is kept in the link ([`DirectSend::Partly`]), never dropped and never
    /// waited for here.
    pub fn try_send(&self, frame: &[u8]) -> DirectSend {
        if frame.is_empty() || frame.len() > PAGE_REQUEST_FRAME_MAX {
            return DirectSend::Refused;
        }
        let Ok(mut q) = self.link.queue.try_lock() else {
            return DirectSend::Refused;
        };
        if q.closed
            || q.ring.is_some()
            || !q.frames.is_empty()
            || !q.held.is_empty()
            || q.direct_rest_len > 0
        {
            return DirectSend::Refused;
        }
        let mut room = [PollFd::new(self.link.raw.as_fd(), PollFlags::POLLOUT)];
        let writable = poll(&mut room, PollTimeout::ZERO).is_ok_and(|n| n > 0)
            && room[0]
                .revents()
                .is_some_and(|r| r.contains(PollFlags::POLLOUT));
        if !writable {
            return DirectSend::Refused;
        }
        let took = match (&self.link.raw).write(frame) {
            Ok(n) if n > 0 => n,
            // Nothing went: a full socket, or a broken one, which its reader reports; the
            // caller sends the ordinary way, which meets the same condition.
            _ => return DirectSend::Refused,
        };
        let rest = frame.len() - took;
        if rest > 0 {
            q.direct_rest[..rest].copy_from_slice(&frame[took..]);
            q.direct_rest_len = rest;
            self.rests.store(true, Ordering::Release);
        }
        drop(q);
        self.link.active.store(true, Ordering::Relaxed);
        bump(&self.traffic.messages_sent, 1);
        bump(&self.traffic.bytes_sent, frame.len() as u64);
        if rest > 0 {
            DirectSend::Partly
        } else {
            DirectSend::Sent
        }
    }

    /// Says whether this thread waits for a reply it will take from the socket itself
    /// ([`DirectSender::try_take_frame`]): while it does, the reader task leaves the
    /// socket's bytes alone at a frame boundary, for 100 us at most. Set it before asking,
    /// and clear it once the wait is over or the next frame is not the reply
    /// ([`DirectTake::Other`]). An atomic store.
    pub fn await_reply(&self, waiting: bool) {
        self.link.reply_awaited.store(waiting, Ordering::Release);
    }

    /// Takes the next frame out of the socket if no other reader holds the link's incoming
    /// bytes, the frame is whole in the socket already, fits `buf`, and `accept` says it
    /// is the one wanted. `accept` sees the frame's payload (in `buf`, peeked, not yet
    /// taken); once it returns true the frame is read out of the socket into `buf` (its
    /// payload after the 4-byte length prefix), and `taken` runs with the payload before
    /// the reader task may read again, so whatever `taken` records comes before the next
    /// frame's delivery. Before the take, the reader task delivered every frame it had
    /// read, so the taken frame comes right after the last frame delivered.
    ///
    /// Nothing here allocates, blocks or waits on another thread: compare-and-swaps, one
    /// `recv(2)` with `MSG_PEEK` and one without, and atomics, all async-signal-safe. The
    /// peeked bytes are in the kernel already, so reading them out takes one `recv`;
    /// should it take less, this reads on (yielding between tries) until the frame is out
    /// or the socket fails ([`DirectTake::Broken`], after which the link's bytes are
    /// nobody's and its reader task reports it broken): half a frame is never left for
    /// the reader task to misread as a frame.
    pub fn try_take_frame(
        &self,
        buf: &mut [u8],
        accept: &mut dyn FnMut(&[u8]) -> bool,
        taken: &mut dyn FnMut(&[u8]),
    ) -> DirectTake {
        let incoming = &self.link.incoming;
        if incoming
            .compare_exchange(
                INCOMING_FREE,
                INCOMING_HANDLER,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return DirectTake::NotThere;
        }
        let took = self.take_whole_frame(buf, accept, taken);
        let after = if took == DirectTake::Broken {
            INCOMING_CLOSED
        } else {
            INCOMING_FREE
        };
        incoming.store(after, Ordering::Release);
        if took == DirectTake::Taken {
            self.hearing[self.peer].heard();
        }
        took
    }

    fn take_whole_frame(
        &self,
        buf: &mut [u8],
        accept: &mut dyn FnMut(&[u8]) -> bool,
        taken: &mut dyn FnMut(&[u8]),
    ) -> DirectTake {
        let raw = &self.link.raw;
        // One look at everything the socket holds, up to the buffer's size.
        let seen = match raw.peek(buf) {
            Ok(n) if n >= 4 => n,
            _ => return DirectTake::NotThere,
        };
        let len = 4 + u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len > buf.len() {
            // Longer than anything wanted: the reader task's.
            return DirectTake::Other;
        }
        if seen < len {
            return DirectTake::NotThere;
        }
        if !accept(&buf[4..len]) {
            return DirectTake::Other;
        }
        // What is read lands where the peek put the same bytes, so `buf` holds the frame
        // whatever happens below.
        let (mut got, mut empty_reads) = (0, 0u32);
        let mut took = DirectTake::Taken;
        while got < len {
            match (&*raw).read(&mut buf[got..len]) {
                Ok(n) if n > 0 => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && empty_reads < 10_000 => {
                    empty_reads += 1;
                    std::thread::yield_now();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                _ => {
                    took = DirectTake::Broken;
                    break;
                }
            }
        }
        taken(&buf[4..len]);
        if took == DirectTake::Taken {
            bump(&self.traffic.messages_received, 1);
            bump(&self.traffic.bytes_received, len as u64);
        }
        took
    }
}

/// What the writer found after writing what it could.
enum Drained {
    /// Nothing left: wait for the next backlog.
    Empty,
    /// The socket is full: wait until it drains.
    Blocked,
    /// Closed and flushed: shut the connection's sending side.
    Done,
}

/// Writes queued frames until the queue is empty or the socket is full (no lock is held
/// across an await: the caller waits outside).
fn write_queued(link: &Link, half: &OwnedWriteHalf) -> io::Result<Drained> {
    let mut q = link.queue.lock().unwrap_or_else(|p| p.into_inner());
    q.queue_direct_rest();
    while let Some(front) = q.frames.front_mut() {
        match half.try_write(front) {
            Ok(n) if n == front.len() => {
                q.frames.pop_front();
            }
            Ok(n) => *front = front.slice(n..),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Drained::Blocked),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(if q.closed {
        Drained::Done
    } else {
        Drained::Empty
    })
}

/// [`write_queued`] for a shared-memory link: into the ring until it is full.
fn write_queued_ring(link: &Link) -> io::Result<Drained> {
    let mut q = link.queue.lock().unwrap_or_else(|p| p.into_inner());
    let q = &mut *q;
    let ring = q.ring.as_mut().expect("a shared-memory link has a ring");
    while let Some(front) = q.frames.front_mut() {
        let n = ring.write(front)?;
        if n == front.len() {
            q.frames.pop_front();
        } else if n > 0 {
            *front = front.slice(n..);
        } else if ring.writer.prepare_wait() {
            // Space appeared between the write and the announcement: go on.
        } else {
            return Ok(Drained::Blocked);
        }
    }
    Ok(if q.closed {
        Drained::Done
    } else {
        Drained::Empty
    })
}

/// Writes what senders could not write directly into a shared-memory link's ring, whenever
/// the peer frees space (it rings `space_bell`); at shutdown closes the TCP connection's
/// sending side after the last frame is committed, which tells the peer nothing more comes.
async fn fill_ring(
    link: Arc<Link>,
    space_bell: AsyncFd<OwnedFd>,
    mut half: OwnedWriteHalf,
) -> io::Result<()> {
    loop {
        link.wake.notified().await;
        loop {
            match write_queued_ring(&link)? {
                Drained::Empty => break,
                Drained::Blocked => {
                    let mut ready = space_bell.readable().await?;
                    clear_bell(space_bell.get_ref());
                    ready.clear_ready();
                }
                Drained::Done => {
                    let _ = half.shutdown().await;
                    return Ok(());
                }
            }
        }
    }
}

/// Bytes a ring reader moves out of the ring at a time.
const RING_CHUNK: usize = 256 << 10;

/// The receiving end of a shared-memory link: the ring's reader and the bytes of a frame
/// not yet whole. Shared between the comm thread's reader task and [`Outbox::poll_rings`],
/// which a thread waiting for a reply calls so that it takes its reply itself instead of
/// waiting for the comm thread to be scheduled; the lock keeps one consumer at a time, so
/// frames are delivered whole and in ring order whoever reads them.
struct RingInbox {
    reader: RingReader,
    buf: Vec<u8>,
    /// Rung when the peer's writer waits for space and we freed some.
    peer_space_bell: OwnedFd,
    /// Our own data bell (a duplicate of the one the reader task waits on): a poller
    /// that finds the ring malformed rings it so the reader task wakes and reports it.
    own_data_bell: OwnedFd,
    /// What a poller found wrong, for the reader task to report (the report goes through
    /// the comm thread's handler, which only that thread may call).
    failure: Option<WireError>,
    /// The ring position after the last frame delivered, for the fault handler's page
    /// lane (see [`LaneEnd`]).
    delivered: Arc<AtomicU64>,
}

impl RingInbox {
    /// Delivers every whole frame the ring holds; a failure is kept for the reader task.
    fn drain(&mut self, hearing: &Hearing, traffic: &Traffic, deliver: &mut dyn FnMut(Msg)) {
        if self.failure.is_some() {
            return;
        }
        if let Err(e) = drain_ring(
            &mut self.reader,
            &mut self.buf,
            &self.peer_space_bell,
            hearing,
            traffic,
            &self.delivered,
            deliver,
        ) {
            self.failure = Some(e);
        }
    }
}

fn lock_inbox(inbox: &Mutex<RingInbox>) -> MutexGuard<'_, RingInbox> {
    inbox.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a ring's reader task reads from: the ring (shared with polling threads), the bell
/// the peer rings after committing, and the TCP connection whose end says the peer is gone.
struct RingEnds {
    inbox: Arc<Mutex<RingInbox>>,
    data_bell: AsyncFd<OwnedFd>,
    tcp: OwnedReadHalf,
}

/// Reads a co-located peer's frames from its ring and delivers them, until the peer's TCP
/// connection closes (then what it committed is delivered, and a half-written frame is a
/// failure) or something malformed arrives.
async fn read_ring(
    peer: usize,
    ends: RingEnds,
    handler: Handler,
    traffic: Arc<Traffic>,
    hearing: Arc<[Hearing]>,
    after_frames: AfterRingFrames,
) {
    let RingEnds {
        inbox,
        data_bell,
        mut tcp,
    } = ends;
    let hearing = &hearing[peer];
    let fail = |e: WireError| {
        hearing.end();
        handler(peer, PeerEvent::Failed(e));
    };
    let mut probe = [0u8; 64];
    let deliver = &mut |m| handler(peer, PeerEvent::Message(m));
    loop {
        // Everything committed so far, frame by frame, unless a thread polling the ring
        // holds it: that thread takes what is there and arms the bell again when it stops,
        // so waiting for it here would only cost a wake-up. After frames, the owner's
        // hook decides whether to go on taking them (`Transport::after_ring_frames`):
        // polling every ring after every frame, tried first, made remote faults on this
        // 2-core machine three times slower, the spinning comm threads taking the cores
        // from the threads they wait for.
        let inbox_free = match inbox.try_lock() {
            Ok(ib) => Some(ib),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if let Some(mut ib) = inbox_free {
            let mut delivered = false;
            ib.drain(hearing, &traffic, &mut |m| {
                delivered = true;
                deliver(m)
            });
            if let Some(e) = ib.failure.take() {
                return fail(e);
            }
            if let Some(after) = after_frames.get().filter(|_| delivered) {
                drop(ib);
                after();
                continue;
            }
            match ib.reader.prepare_wait() {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => return fail(WireError::Io(io::Error::other(e))),
            }
        }
        tokio::select! {
            ready = data_bell.readable() => match ready {
                Ok(mut ready) => {
                    clear_bell(data_bell.get_ref());
                    ready.clear_ready();
                }
                Err(e) => return fail(WireError::Io(e)),
            },
            got = tcp.read(&mut probe) => {
                match got {
                    Ok(0) => {
                        // The peer closed its end (it finished, or it died): everything
                        // it committed before is in the ring.
                        let mut ib = lock_inbox(&inbox);
                        ib.drain(hearing, &traffic, deliver);
                        if let Some(e) = ib.failure.take() {
                            return fail(e);
                        }
                        hearing.end();
                        if ib.buf.is_empty() {
                            handler(peer, PeerEvent::Closed);
                        } else {
                            handler(peer, PeerEvent::Failed(WireError::Io(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                format!(
                                    "the connection closed in the middle of a message in shared \
                                     memory ({} bytes of it committed)",
                                    ib.buf.len()
                                ),
                            ))));
                        }
                        return;
                    }
                    Ok(_) => {
                        return fail(WireError::Io(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "bytes on the TCP connection of a shared-memory link",
                        )))
                    }
                    Err(e) => return fail(WireError::Io(e)),
                }
            }
        }
    }
}

/// Moves what the ring holds into `buf` and delivers every whole frame in it; leaves a
/// partial frame in `buf`. Returns how many bytes it moved.
fn drain_ring(
    reader: &mut RingReader,
    buf: &mut Vec<u8>,
    peer_space_bell: &OwnedFd,
    hearing: &Hearing,
    traffic: &Traffic,
    delivered: &AtomicU64,
    deliver: &mut dyn FnMut(Msg),
) -> Result<usize, WireError> {
    let mut moved = 0;
    loop {
        let n = reader
            .read_into(buf, RING_CHUNK)
            .map_err(|e| WireError::Io(io::Error::other(e)))?;
        if n == 0 {
            deliver_lane_request(reader, buf.len(), deliver)?;
            return Ok(moved);
        }
        moved += n;
        hearing.heard();
        if reader.writer_needs_wake() {
            ring_bell(peer_space_bell)?;
        }
        let mut at = 0;
        while buf.len() - at >= 4 {
            let len = u32::from_be_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
            if len > MAX_FRAME {
                return Err(WireError::TooLarge {
                    len,
                    max: MAX_FRAME,
                });
            }
            if buf.len() - at - 4 < len {
                break;
            }
            let frame = &buf[at + 4..at + 4 + len];
            at += 4 + len;
            bump(&traffic.messages_received, 1);
            bump(&traffic.bytes_received, len as u64 + 4);
            match decode::<Msg>(frame)? {
                Msg::Heartbeat => {}
                msg => deliver(msg),
            }
            let unread = (buf.len() - at) as u64;
            delivered.store(reader.position() - unread, Ordering::Release);
        }
        buf.drain(..at);
        // A large message (a barrier arrival with a lock-heavy epoch's intervals) grew the
        // buffer; every peer's would otherwise keep its largest message's room all run.
        if buf.capacity() > 2 * RING_CHUNK && buf.len() <= RING_CHUNK {
            buf.shrink_to(RING_CHUNK);
        }
    }
}

/// Delivers the peer's request in the lane of the ring `reader` reads, as the
/// [`Msg::PageRequest`] it stands for, once every frame the peer sent before it has been
/// delivered (`unread`: bytes read from the ring but not yet delivered). The request
/// carries no requirements: the peer posts one only for a page that needs none.
fn deliver_lane_request(
    reader: &RingReader,
    unread: usize,
    deliver: &mut dyn FnMut(Msg),
) -> Result<(), WireError> {
    let lane = reader.lane();
    let Some((page, after)) = lane.pending_request() else {
        return Ok(());
    };
    if after > reader.position() - unread as u64 {
        return Ok(());
    }
    let Ok(page_no) = dsm_proto::PageNo::try_from(page) else {
        return Err(WireError::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a page request in shared memory for page {page}, beyond any segment"),
        )));
    };
    if lane.take_request(page) {
        deliver(Msg::PageRequest {
            pages: vec![page_no],
            required: Vec::new(),
            lane: true,
        });
    }
    Ok(())
}

/// Writes what senders could not write directly, whenever the socket can take more.
async fn drain_link(link: Arc<Link>, mut half: OwnedWriteHalf) -> io::Result<()> {
    loop {
        link.wake.notified().await;
        loop {
            match write_queued(&link, &half)? {
                Drained::Empty => break,
                Drained::Blocked => half.writable().await?,
                Drained::Done => {
                    let _ = half.shutdown().await;
                    return Ok(());
                }
            }
        }
    }
}

/// `msg` encoded behind its length prefix.
/// The reader task of a TCP link: reads what the socket has, delivers every whole frame
/// in order, and runs the follow hook when it holds no partial frame. It holds the link's
/// incoming bytes ([`Link::incoming`]) from its first read until then (its buffer empty:
/// [`crate::framing::next_frame`] leaves a frame's length prefix in it until the whole
/// frame is there), so a fault handler taking a frame itself
/// ([`DirectSender::try_take_frame`]) never starts in the middle of one, and gives way to
/// such a handler for the microseconds it reads.
async fn read_socket(
    peer: usize,
    half: OwnedReadHalf,
    link: Arc<Link>,
    handler: Handler,
    traffic: Arc<Traffic>,
    hearing: Arc<[Hearing]>,
    after: AfterRingFrames,
) {
    let hearing = &hearing[peer];
    let end = |event: PeerEvent| {
        close_incoming(&link);
        hearing.end();
        handler(peer, event);
    };
    let fail = |e: WireError| end(PeerEvent::Failed(e));
    let mut buf = BytesMut::new();
    let mut left_since: Option<Instant> = None;
    loop {
        if let Err(e) = half.readable().await {
            return fail(WireError::Io(e));
        }
        if buf.is_empty() && link.reply_awaited.load(Ordering::Acquire) {
            // A fault handler polls for its reply in the socket: leave it the bytes.
            let since = *left_since.get_or_insert_with(Instant::now);
            if since.elapsed() < REPLY_LEFT_FOR {
                std::thread::yield_now();
                tokio::task::yield_now().await;
                continue;
            }
        }
        left_since = None;
        if buf.is_empty() && !claim_incoming(&link) {
            return fail(WireError::Io(io::Error::other(
                "a fault handler's read of a frame failed half-way",
            )));
        }
        buf.reserve(READ_CHUNK);
        match half.try_read_buf(&mut buf) {
            Ok(0) if buf.is_empty() => return end(PeerEvent::Closed),
            Ok(0) => {
                return fail(WireError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the connection closed in the middle of a frame",
                )));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if buf.is_empty() {
                    link.incoming.store(INCOMING_FREE, Ordering::Release);
                }
                continue;
            }
            Err(e) => return fail(WireError::Io(e)),
        }
        let mut delivered = false;
        loop {
            let frame = match crate::framing::next_frame(&mut buf) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => return fail(e),
            };
            hearing.heard();
            bump(&traffic.messages_received, 1);
            bump(&traffic.bytes_received, frame.len() as u64 + 4);
            match decode::<Msg>(&frame) {
                Ok(Msg::Heartbeat) => {}
                Ok(msg) => {
                    handler(peer, PeerEvent::Message(msg));
                    delivered = true;
                }
                Err(e) => return fail(e),
            }
        }
        if buf.is_empty() {
            link.incoming.store(INCOMING_FREE, Ordering::Release);
            if delivered {
                if let Some(hook) = after.get() {
                    hook();
                }
            }
        }
    }
}

/// The reader task, about to read with an empty buffer: takes the link's incoming bytes,
/// waiting on the spot while a handler reads a frame (microseconds: the frame is whole in
/// the kernel). False if a handler's read failed half-way and left them to nobody.
fn claim_incoming(link: &Link) -> bool {
    loop {
        match link.incoming.compare_exchange(
            INCOMING_FREE,
            INCOMING_READER,
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            Ok(_) => return true,
            Err(INCOMING_CLOSED) => return false,
            Err(_) => std::thread::yield_now(),
        }
    }
}

/// The reader task, ending: the link's incoming bytes are nobody's any more, so no
/// handler takes a frame after whatever the reader left half-read (it waits out a
/// handler that is reading one).
fn close_incoming(link: &Link) {
    loop {
        match link.incoming.load(Ordering::Acquire) {
            INCOMING_CLOSED => return,
            INCOMING_HANDLER => std::thread::yield_now(),
            seen => {
                if link
                    .incoming
                    .compare_exchange(seen, INCOMING_CLOSED, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
            }
        }
    }
}

/// How much room the reader task makes in its buffer before each read: a page reply and
/// then some, so a run of small frames and a page come in one `read`.
const READ_CHUNK: usize = 16 << 10;

fn frame(msg: &Msg) -> Result<Bytes, WireError> {
    Ok(Bytes::from(encode_frame(msg)?))
}

/// What the keep-alive task knows about one peer's incoming side. Updated by whichever
/// thread reads the peer's frames (the comm thread's reader task, or the app thread
/// polling a shared-memory ring while it waits), hence atomics.
struct Hearing {
    /// The transport's start, from which `last` counts.
    started: Instant,
    /// When the last frame arrived (or the transport started), in nanoseconds since
    /// `started`.
    last: AtomicU64,
    /// The reader ended (the peer closed or failed, which it reports): silence means
    /// nothing for this peer any more.
    ended: AtomicBool,
}

impl Hearing {
    fn new(started: Instant) -> Hearing {
        Hearing {
            started,
            last: AtomicU64::new(0),
            ended: AtomicBool::new(false),
        }
    }

    fn heard_at(&self, when: Instant) {
        let since = when.saturating_duration_since(self.started).as_nanos() as u64;
        self.last.fetch_max(since, Ordering::Relaxed);
    }

    fn heard(&self) {
        self.heard_at(Instant::now());
    }

    fn last(&self) -> Instant {
        self.started + Duration::from_nanos(self.last.load(Ordering::Relaxed))
    }

    fn end(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }

    fn ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }
}

/// Sends heartbeats on idle links and reports peers silent for `deadline`, every
/// [`heartbeat_period`] until the transport shuts down.
async fn keep_alive(
    outbox: Arc<Outbox>,
    hearing: Arc<[Hearing]>,
    deadline: Duration,
    handler: Handler,
) {
    let Ok(heartbeat) = frame(&Msg::Heartbeat) else {
        return;
    };
    let period = heartbeat_period(deadline);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // The first tick is immediate.
    let mut last_look = Instant::now();
    loop {
        ticks.tick().await;
        let now = Instant::now();
        // A late tick means this thread did not run for a while (this process was stopped
        // or starved of CPU): frames may be waiting unread, so silence meanwhile is no
        // evidence against the peers. Their clocks start again.
        let stalled = now.duration_since(last_look) > 2 * period;
        last_look = now;
        for (peer, h) in hearing.iter().enumerate() {
            let Some(link) = outbox.links.get(peer).and_then(Option::as_ref) else {
                continue;
            };
            if let Ok(true) = link.keep_alive(&heartbeat) {
                bump(&outbox.traffic.messages_sent, 1);
                bump(&outbox.traffic.bytes_sent, heartbeat.len() as u64);
            }
            // (A failed heartbeat is the peer's reader's and writer's to report.)
            if h.ended() {
                continue;
            }
            if stalled {
                h.heard_at(now);
                continue;
            }
            let silent = now.duration_since(h.last());
            if silent >= deadline {
                h.end();
                handler(peer, PeerEvent::Silent(silent));
            }
        }
    }
}

/// The sending side of the transport, usable from any thread.
pub struct Outbox {
    me: usize,
    links: Vec<Option<Arc<Link>>>,
    /// The transport's traffic counters (sends are counted here, receipts by the reader
    /// tasks).
    pub traffic: Arc<Traffic>,
    /// The peers reached through shared memory, in rank order.
    shm_peers: Vec<usize>,
    /// The links to the peers reached over TCP, in rank order, with their ranks.
    tcp_links: Vec<(usize, Arc<Link>)>,
    /// Some direct frame was only partly written ([`DirectSend::Partly`]).
    direct_rests: Arc<AtomicBool>,
    /// Their rings' receiving ends, for [`Outbox::poll_rings`].
    inboxes: Vec<(usize, Arc<Mutex<RingInbox>>)>,
    hearing: Arc<[Hearing]>,
    /// Some link may owe its reader a bell ([`Outbox::send_quiet`]).
    bells_owed: AtomicBool,
    /// The page lanes from co-located peers to this node.
    lanes: Vec<LaneEnd>,
}

/// This node's ends of the page lanes shared with a co-located peer (see
/// [`crate::ring::Lane`]), and the rules for using them, kept here with the ring positions
/// they compare: a page in the incoming lane may be used once every frame the peer sent
/// before it that is not the announcement of an earlier lane page has been delivered
/// ([`LaneEnd::holds_current`]); a request for a page goes behind everything this node has
/// handed to the link, and the peer's transport delivers it as a [`Msg::PageRequest`]
/// asking for a lane reply ([`LaneEnd::request_page`]). Every method is atomics and at
/// most one `write(2)`, so the SIGSEGV handler may call them.
#[derive(Clone)]
pub struct LaneEnd {
    /// The peer that publishes into the lane.
    peer: usize,
    /// The shared region holding it.
    region: Arc<Region>,
    /// The direction of the peer's frames (and its lane) towards this node.
    dir: Direction,
    /// Ring position after the last frame delivered from the peer.
    delivered: Arc<AtomicU64>,
    /// The direction of this node's frames (and its request slot) towards the peer.
    to_peer: Direction,
    /// Ring position after every frame this node handed to the link towards the peer.
    sent: Arc<AtomicU64>,
    /// The bell the peer's ring reader waits on.
    peer_bell: Arc<OwnedFd>,
    /// The bell this node's reader of the peer's ring waits on: rung by a thread that
    /// stops polling the lane, so that an announcement the peer left without ringing (see
    /// [`crate::ring::Lane::set_taker_polling`]) is read.
    own_bell: Arc<OwnedFd>,
}

impl LaneEnd {
    /// The co-located peer at the far end.
    pub fn peer(&self) -> usize {
        self.peer
    }

    /// The lane the peer leaves page copies in for this node.
    pub fn incoming(&self) -> Lane<'_> {
        self.region.lane(self.dir)
    }

    /// Ring position after the last frame delivered from the peer.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Acquire)
    }

    /// Whether the incoming lane holds a copy of `page` that may be used now: every frame
    /// the peer sent before it has been delivered, so the copy is no older than what
    /// those frames told this node.
    pub fn holds_current(&self, page: u64) -> bool {
        matches!(self.incoming().full(), Some(at) if at.page == page && self.delivered() >= at.needs)
    }

    /// Tells the peer whether a thread of this node polls the incoming lane (it then
    /// leaves a copy without ringing this node's reader).
    pub fn set_polling(&self, on: bool) {
        self.incoming().set_taker_polling(on);
    }

    /// Asks the peer for `page` through the request slot of this node's lane towards it,
    /// behind every frame this node has handed to the link, and rings the peer's bell if
    /// its reader sleeps. Returns whether it asked (the slot may hold a request still).
    pub fn request_page(&self, page: u64) -> bool {
        let lane = self.region.lane(self.to_peer);
        if !lane.post_request(page, self.sent.load(Ordering::Acquire)) {
            return false;
        }
        if self.region.reader_needs_wake(self.to_peer) {
            // A bell that cannot be rung leaves the request to the peer's next wake-up.
            let _ = ring_bell(&self.peer_bell);
        }
        true
    }

    /// Rings this node's reader of the peer's ring, after a thread stopped polling the
    /// incoming lane: an announcement the peer left without ringing is then read.
    pub fn wake_own_reader(&self) {
        let _ = ring_bell(&self.own_bell);
    }
}

impl Outbox {
    /// This node's rank.
    pub fn rank(&self) -> usize {
        self.me
    }

    /// The peers this node reaches through shared memory (the others over TCP).
    pub fn shm_peers(&self) -> &[usize] {
        &self.shm_peers
    }

    /// The page lanes from co-located peers to this node.
    pub fn lanes(&self) -> &[LaneEnd] {
        &self.lanes
    }

    /// Whether any TCP link has something to read now (a zero-timeout `poll`).
    fn sockets_readable(&self) -> bool {
        let mut fds: Vec<PollFd<'_>> = self
            .tcp_links
            .iter()
            .map(|(_, link)| PollFd::new(link.raw.as_fd(), PollFlags::POLLIN))
            .collect();
        !fds.is_empty() && poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0)
    }

    /// A [`DirectSender`] for each peer reached over TCP, in rank order.
    pub fn direct_senders(&self) -> Vec<DirectSender> {
        self.tcp_links
            .iter()
            .map(|(peer, link)| DirectSender {
                peer: *peer,
                link: link.clone(),
                traffic: self.traffic.clone(),
                rests: self.direct_rests.clone(),
                hearing: self.hearing.clone(),
            })
            .collect()
    }

    /// Queues for their links' writers the rests of direct frames the sockets took only
    /// part of ([`DirectSend::Partly`]); cheap when there are none.
    pub fn flush_direct_rests(&self) {
        if !self.direct_rests.swap(false, Ordering::AcqRel) {
            return;
        }
        for (_, link) in &self.tcp_links {
            let mut q = link.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.queue_direct_rest() {
                drop(q);
                link.wake.notify_one();
            }
        }
    }

    /// Whether a thread following the traffic outside the runtime must return to it: a
    /// TCP link has something to read (a zero-timeout `poll`), or frames queued for its
    /// writer task, which only the runtime runs.
    pub fn sockets_need_runtime(&self) -> bool {
        self.sockets_readable()
            || self.tcp_links.iter().any(|(_, link)| {
                link.queue
                    .try_lock()
                    .is_ok_and(|q| !q.frames.is_empty() || q.direct_rest_len > 0)
            })
    }

    /// Sends `msg` to the co-located peer `to` after leaving `page`'s `data` and `applied`
    /// entries in the page lane towards it (see [`crate::ring::Lane::publish`]). Returns
    /// false, sending nothing, when the lane cannot take it now (no ring to `to`, frames
    /// queued on the link, the lane still full, too many entries); the caller then sends
    /// the page in a frame.
    pub fn send_through_lane(
        &self,
        to: usize,
        msg: &Msg,
        page: u64,
        applied: &[u64],
        data: &[u8],
    ) -> Result<bool, WireError> {
        let frame = frame(msg)?;
        let len = frame.len() - 4;
        let link = self.link_to(to)?;
        let sent = link.send_after_lane(frame, |lane, after, needs| {
            lane.publish(LanePosition { page, after, needs }, applied, data)
        })?;
        let Some(owed) = sent else {
            return Ok(false);
        };
        if owed {
            self.bells_owed.store(true, Ordering::Release);
        }
        bump(&self.traffic.messages_sent, 1);
        bump(&self.traffic.bytes_sent, len as u64 + 4);
        Ok(true)
    }

    /// Encodes and sends (or queues) `msg` for `to`; returns the encoded size in bytes
    /// (payload, without the length prefix). Frames to one peer leave in the order of the
    /// calls. Fails if the message cannot be encoded or is too large, if there is no link
    /// to `to` (itself, or out of range) or it was closed by shutdown
    /// ([`WireError::Closed`]), or if the socket reports an error; a send that was only
    /// queued can still fail later, which the link's writer reports as
    /// [`PeerEvent::Failed`].
    pub fn send(&self, to: usize, msg: &Msg) -> Result<usize, WireError> {
        self.send_frame(to, msg, false)
    }

    /// [`Outbox::send`] for a frame nobody waits for (a diff on its way to the page's
    /// home, say): a co-located peer whose reader sleeps is not woken for it. The bell is
    /// rung by the next [`Outbox::send`] from this node, to any peer, or by
    /// [`Outbox::ring_owed_bells`]: whatever this node sends later, and whatever could
    /// make anyone need the quiet frame, wakes its reader first. Saves the sender the
    /// wake-up (an `eventfd` write, 8-9 us when the reader's core has to be interrupted)
    /// and the reader a trip through its comm thread when the next frame to the same peer
    /// follows soon, as a lock request follows a release.
    pub fn send_quiet(&self, to: usize, msg: &Msg) -> Result<usize, WireError> {
        self.send_frame(to, msg, true)
    }

    /// The link to `to`, for a frame about to go there: the bells quiet frames left owed
    /// on the other links are rung first (the frame to `to` rings its own).
    fn link_to(&self, to: usize) -> Result<&Arc<Link>, WireError> {
        let link = self
            .links
            .get(to)
            .and_then(|o| o.as_ref())
            .ok_or(WireError::Closed)?;
        if self.bells_owed.load(Ordering::Acquire) {
            self.ring_owed_bells_except(to);
        }
        Ok(link)
    }

    fn send_frame(&self, to: usize, msg: &Msg, quiet: bool) -> Result<usize, WireError> {
        let frame = frame(msg)?;
        let len = frame.len() - 4;
        let link = self.link_to(to)?;
        if link.send(frame, quiet)? {
            self.bells_owed.store(true, Ordering::Release);
        }
        bump(&self.traffic.messages_sent, 1);
        bump(&self.traffic.bytes_sent, len as u64 + 4);
        Ok(len)
    }

    /// Rings every bell a quiet frame left owed (see [`Outbox::send_quiet`]). For a
    /// thread about to wait: what it waits for may depend on a quiet frame.
    pub fn ring_owed_bells(&self) {
        if self.bells_owed.load(Ordering::Acquire) {
            self.ring_owed_bells_except(usize::MAX);
        }
    }

    /// Rings the owed bells of every link but `skip`'s (the frame about to go there rings
    /// its own). A bell that cannot be rung belongs to a peer whose end is gone, which
    /// that peer's reader reports; it is not this send's failure.
    fn ring_owed_bells_except(&self, skip: usize) {
        self.bells_owed.store(false, Ordering::Release);
        for (peer, link) in self.links.iter().enumerate() {
            let Some(link) = link else { continue };
            if peer != skip {
                let _ = link.ring_owed_bell();
            }
        }
    }

    /// For a thread waiting for a reply: delivers, on this thread, every whole frame the
    /// shared-memory rings hold right now (`deliver(peer, message)`, in ring order per
    /// peer), and returns how many. A ring the comm thread is reading at this moment is
    /// skipped (it delivers those frames itself). While a thread polls, commits to the
    /// rings it polled stop ringing their bells, so the comm thread is not woken for
    /// frames the poller takes; [`Outbox::end_polling`] must follow before anyone sleeps.
    /// A malformed ring is left for the comm thread to report (its reader task is woken).
    pub fn poll_rings(&self, deliver: &mut dyn FnMut(usize, Msg)) -> usize {
        let mut delivered = 0;
        for (peer, inbox) in &self.inboxes {
            let Ok(mut ib) = inbox.try_lock() else {
                continue;
            };
            if ib.failure.is_some() {
                continue;
            }
            ib.reader.stop_waiting();
            ib.drain(&self.hearing[*peer], &self.traffic, &mut |m| {
                delivered += 1;
                deliver(*peer, m)
            });
            if ib.failure.is_some() {
                let _ = ring_bell(&ib.own_data_bell);
            }
        }
        delivered
    }

    /// Ends a stretch of [`Outbox::poll_rings`]: the rings' bells are armed again for the
    /// comm thread's reader tasks. Frames that arrived meanwhile are delivered here
    /// (`deliver`, as in `poll_rings`) rather than left to wake the comm thread for them;
    /// a malformed ring wakes its reader task, which reports it.
    pub fn end_polling(&self, deliver: &mut dyn FnMut(usize, Msg)) {
        for (peer, inbox) in &self.inboxes {
            let mut ib = lock_inbox(inbox);
            loop {
                match ib.reader.prepare_wait() {
                    Ok(false) => break,
                    Ok(true) if ib.failure.is_none() => {
                        ib.drain(&self.hearing[*peer], &self.traffic, &mut |m| {
                            deliver(*peer, m)
                        });
                    }
                    _ => {
                        let _ = ring_bell(&ib.own_data_bell);
                        break;
                    }
                }
            }
        }
    }

    /// Closes every link for sending; the writers then flush what is queued and stop.
    fn close(&self) {
        self.ring_owed_bells();
        for l in self.links.iter().flatten() {
            l.close();
        }
    }
}

/// What the reader and writer tasks of every peer share, as [`Transport::start`] hands it
/// to them.
struct PeerTasks {
    handler: Handler,
    traffic: Arc<Traffic>,
    hearing: Arc<[Hearing]>,
    after_ring_frames: AfterRingFrames,
    after_socket_frames: AfterRingFrames,
}

impl PeerTasks {
    /// Starts the tasks of a co-located peer's link: a reader of its ring and a writer
    /// into ours; returns the writer.
    fn spawn_ring(
        &self,
        peer: usize,
        ends: RingEnds,
        link: Arc<Link>,
        space_bell: AsyncFd<OwnedFd>,
        write_half: OwnedWriteHalf,
    ) -> tokio::task::JoinHandle<()> {
        tokio::task::spawn_local(read_ring(
            peer,
            ends,
            self.handler.clone(),
            self.traffic.clone(),
            self.hearing.clone(),
            self.after_ring_frames.clone(),
        ));
        let h = self.handler.clone();
        tokio::task::spawn_local(async move {
            if let Err(e) = fill_ring(link, space_bell, write_half).await {
                h(peer, PeerEvent::Failed(WireError::Io(e)));
            }
        })
    }

    /// Starts the tasks of a peer's link over its socket: a reader and a writer; returns
    /// the writer.
    fn spawn_socket(
        &self,
        peer: usize,
        link: Arc<Link>,
        read_half: OwnedReadHalf,
        write_half: OwnedWriteHalf,
    ) -> tokio::task::JoinHandle<()> {
        tokio::task::spawn_local(read_socket(
            peer,
            read_half,
            link.clone(),
            self.handler.clone(),
            self.traffic.clone(),
            self.hearing.clone(),
            self.after_socket_frames.clone(),
        ));
        let h = self.handler.clone();
        tokio::task::spawn_local(async move {
            if let Err(e) = drain_link(link, write_half).await {
                h(peer, PeerEvent::Failed(WireError::Io(e)));
            }
        })
    }
}

/// Both directions of a co-located peer's shared-memory link, set up by
/// [`Transport::start`]: the page lane the peer publishes into, the inbox of its frames,
/// and the bells the link's reader and writer tasks wait on.
struct RingSetup {
    lane: LaneEnd,
    inbox: Arc<Mutex<RingInbox>>,
    data_bell: AsyncFd<OwnedFd>,
    space_bell: AsyncFd<OwnedFd>,
}

impl RingSetup {
    /// Sets up `l`, the link to `peer`: `queue` sends into the ring from its current
    /// position, which `sent` mirrors.
    fn new(
        peer: usize,
        l: ShmLink,
        queue: &mut LinkQueue,
        sent: &Arc<AtomicU64>,
    ) -> io::Result<RingSetup> {
        let receive = l.receive();
        let writer = RingWriter::new(l.region.clone(), l.send);
        (queue.accepted, queue.significant) = (writer.position(), writer.position());
        sent.store(writer.position(), Ordering::Relaxed);
        let peer_bell = Arc::new(l.peer_data_bell.try_clone()?);
        queue.ring = Some(RingSink {
            writer,
            peer_data_bell: l.peer_data_bell,
        });
        let reader = RingReader::new(l.region.clone(), receive);
        let delivered = Arc::new(AtomicU64::new(reader.position()));
        let lane = LaneEnd {
            peer,
            region: l.region.clone(),
            dir: receive,
            delivered: delivered.clone(),
            to_peer: l.send,
            sent: sent.clone(),
            peer_bell,
            own_bell: Arc::new(l.our_data_bell.try_clone()?),
        };
        let inbox = Arc::new(Mutex::new(RingInbox {
            reader,
            buf: Vec::new(),
            peer_space_bell: l.peer_space_bell,
            own_data_bell: l.our_data_bell.try_clone()?,
            failure: None,
            delivered,
        }));
        Ok(RingSetup {
            lane,
            inbox,
            data_bell: register_bell(l.our_data_bell)?,
            space_bell: register_bell(l.our_space_bell)?,
        })
    }
}

/// The running transport of one node: a reader and a writer task per peer on the current
/// `LocalSet`, and the [`Outbox`] through which any thread sends.
pub struct Transport {
    outbox: Arc<Outbox>,
    writers: Vec<tokio::task::JoinHandle<()>>,
    /// The keep-alive task, with a liveness deadline.
    keep_alive: Option<tokio::task::JoinHandle<()>>,
    /// See [`Transport::after_ring_frames`].
    after_ring_frames: AfterRingFrames,
    /// See [`Transport::after_socket_frames`].
    after_socket_frames: AfterRingFrames,
}

/// Called by a ring's reader task each time it has delivered frames and let go of the ring
/// (see [`Transport::after_ring_frames`]).
type AfterRingFrames = Rc<std::cell::OnceCell<Rc<dyn Fn()>>>;

/// Receives everything the reader and writer tasks report: `(peer rank, event)`, in arrival
/// order per peer. Called on the comm thread (the `LocalSet`), never concurrently; after a
/// [`PeerEvent::Closed`] or [`PeerEvent::Failed`] nothing more arrives from that peer's
/// reader.
pub type Handler = Rc<dyn Fn(usize, PeerEvent)>;

impl Transport {
    /// Starts reader and writer tasks for every link of `mesh`, and with a `liveness`
    /// deadline the keep-alive task (heartbeats on idle links, [`PeerEvent::Silent`] for a
    /// peer that sent nothing for the deadline). Must run inside a
    /// `tokio::task::LocalSet` on a runtime with I/O and time enabled. Fails if a socket
    /// cannot be made non-blocking, duplicated or registered with the runtime.
    pub fn start(
        mesh: Mesh,
        handler: Handler,
        liveness: Option<Duration>,
    ) -> std::io::Result<Transport> {
        let mut shm_peers = Vec::new();
        let mut inboxes = Vec::new();
        let mut lanes = Vec::new();
        let mut outboxes = Vec::with_capacity(mesh.size);
        let mut writers = Vec::new();
        let started = Instant::now();
        let tasks = PeerTasks {
            handler,
            traffic: Arc::new(Traffic::default()),
            hearing: (0..mesh.size).map(|_| Hearing::new(started)).collect(),
            after_ring_frames: AfterRingFrames::default(),
            after_socket_frames: AfterRingFrames::default(),
        };
        let mut shm = mesh.shm;
        for (peer, stream) in mesh.streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                outboxes.push(None);
                continue;
            };
            stream.set_nonblocking(true)?;
            let shm_link: Option<ShmLink> = shm.get_mut(peer).and_then(Option::take);
            let mut queue = LinkQueue::default();
            let mut ring_ends = None;
            let sent = Arc::new(AtomicU64::new(0));
            if let Some(l) = shm_link {
                let ring = RingSetup::new(peer, l, &mut queue, &sent)?;
                lanes.push(ring.lane);
                inboxes.push((peer, ring.inbox.clone()));
                ring_ends = Some((ring.inbox, ring.data_bell, ring.space_bell));
            }
            let link = Arc::new(Link {
                raw: stream.try_clone()?,
                queue: Mutex::new(queue),
                wake: Notify::new(),
                active: AtomicBool::new(false),
                sent,
                incoming: AtomicU8::new(INCOMING_FREE),
                reply_awaited: AtomicBool::new(false),
            });
            outboxes.push(Some(link.clone()));
            let stream = TcpStream::from_std(stream)?;
            let (read_half, write_half) = stream.into_split();
            if let Some((inbox, data_bell, space_bell)) = ring_ends {
                shm_peers.push(peer);
                let ends = RingEnds {
                    inbox,
                    data_bell,
                    tcp: read_half,
                };
                writers.push(tasks.spawn_ring(peer, ends, link, space_bell, write_half));
            } else {
                writers.push(tasks.spawn_socket(peer, link, read_half, write_half));
            }
        }
        let tcp_links = outboxes
            .iter()
            .enumerate()
            .filter(|(peer, _)| !shm_peers.contains(peer))
            .filter_map(|(peer, link)| Some((peer, link.as_ref()?.clone())))
            .collect();
        let PeerTasks {
            handler,
            traffic,
            hearing,
            after_ring_frames,
            after_socket_frames,
        } = tasks;
        let outbox = Arc::new(Outbox {
            me: mesh.rank,
            links: outboxes,
            traffic,
            shm_peers,
            tcp_links,
            direct_rests: Arc::default(),
            inboxes,
            hearing: hearing.clone(),
            bells_owed: AtomicBool::new(false),
            lanes,
        });
        let keep_alive = liveness.filter(|_| mesh.size > 1).map(|deadline| {
            tokio::task::spawn_local(keep_alive(outbox.clone(), hearing, deadline, handler))
        });
        Ok(Transport {
            outbox,
            writers,
            keep_alive,
            after_ring_frames,
            after_socket_frames,
        })
    }

    /// Sets what a ring's reader task runs each time it has delivered frames, after it has
    /// let go of the ring and before it looks at the ring again (at most once; later calls
    /// are ignored). For a caller that keeps taking frames for a while when they come in
    /// runs ([`Outbox::poll_rings`], then [`Outbox::end_polling`]): a wake-up of this
    /// thread per frame is what it saves.
    pub fn after_ring_frames(&self, hook: Rc<dyn Fn()>) {
        let _ = self.after_ring_frames.set(hook);
    }

    /// Sets what a TCP link's reader task runs each time it has delivered a message and
    /// holds no more whole or partial frames (at most once; later calls are ignored): the
    /// same hook as [`Transport::after_ring_frames`], for links over sockets, with
    /// [`Outbox::sockets_need_runtime`] telling it when to let the runtime go on.
    pub fn after_socket_frames(&self, hook: Rc<dyn Fn()>) {
        let _ = self.after_socket_frames.set(hook);
    }

    /// The thread-safe sending side.
    pub fn outbox(&self) -> Arc<Outbox> {
        self.outbox.clone()
    }

    /// This node's rank.
    pub fn rank(&self) -> usize {
        self.outbox.me
    }

    /// Encodes and queues `msg` for `to`; returns the encoded size in bytes. The same as
    /// [`Outbox::send`].
    pub fn send(&self, to: usize, msg: &Msg) -> Result<usize, WireError> {
        self.outbox.send(to, msg)
    }

    /// Stops sending: writers flush what is queued and close their side of each
    /// connection. Waits up to `grace` for that to happen.
    pub async fn shutdown(mut self, grace: std::time::Duration) {
        if let Some(k) = self.keep_alive.take() {
            k.abort();
        }
        self.outbox.close();
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
    use dsm_proto::{JobConfig, TransportChoice};
    use std::cell::RefCell;
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    fn job(rank: usize, coord: std::net::SocketAddr) -> JobConfig {
        job_over(rank, coord, TransportChoice::Auto)
    }

    fn job_over(rank: usize, coord: std::net::SocketAddr, transport: TransportChoice) -> JobConfig {
        JobConfig {
            connect_timeout: Duration::from_secs(10),
            transport,
            ..JobConfig::standalone(rank, 2, coord, "t")
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
        // Rank 1 speaks raw bytes: one good frame, then garbage.
        let (mesh0, mut raw) = tcp_pair();
        assert!(mesh0.shm.iter().all(Option::is_none), "TCP was asked for");
        let good = crate::framing::encode(&Msg::Abort {
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
                None,
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

    /// `msg` as the bytes of its frame.
    fn frame_bytes(msg: &Msg) -> Vec<u8> {
        frame(msg).unwrap().to_vec()
    }

    /// A TCP-only pair: rank 0's mesh, and rank 1's raw socket towards rank 0.
    fn tcp_pair() -> (Mesh, std::net::TcpStream) {
        let coord = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let peer = std::thread::spawn(move || {
            connect_mesh(&job_over(1, coord, TransportChoice::Tcp)).unwrap()
        });
        let mesh0 = connect_mesh(&job_over(0, coord, TransportChoice::Tcp)).unwrap();
        let mut mesh1 = peer.join().unwrap();
        (mesh0, mesh1.streams[0].take().unwrap())
    }

    /// Reads frames from `raw` until a page request arrives; returns the `Abort` reasons
    /// before it and the pages asked for.
    fn read_until_page_request(raw: &mut std::net::TcpStream) -> (Vec<String>, Vec<u32>) {
        let mut before = Vec::new();
        loop {
            match crate::framing::read_frame::<_, Msg>(raw, MAX_FRAME).unwrap() {
                Msg::Abort { reason } => before.push(reason),
                Msg::PageRequest {
                    pages,
                    required,
                    lane,
                } => {
                    assert!(required.is_empty() && !lane);
                    return (before, pages);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// Over a TCP pair: rank 0's outbox, its direct sender towards rank 1, and rank 1's raw
    /// socket towards rank 0.
    fn direct_pair() -> (Arc<Outbox>, DirectSender, std::net::TcpStream) {
        let (mesh0, raw) = tcp_pair();
        let outbox = sending_side(mesh0);
        let direct = outbox.direct_senders().remove(0);
        (outbox, direct, raw)
    }

    /// The frame of a request for `page`.
    fn request_frame(page: u32) -> Vec<u8> {
        let mut buf = [0u8; crate::framing::PAGE_REQUEST_FRAME_MAX];
        crate::framing::page_request_frame(page, &mut buf).to_vec()
    }

    /// Tries `frame` every millisecond until it goes whole; fails after 20 s, saying what
    /// never let it.
    fn send_when_room(direct: &DirectSender, frame: &[u8], what: &str) {
        let until = Instant::now() + Duration::from_secs(20);
        while direct.try_send(frame) != DirectSend::Sent {
            assert!(Instant::now() < until, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Over a socket, quiet frames wait for the link's next frame or the owed bell and go
    /// out with it, in order; a direct frame (a fault handler's) is refused meanwhile,
    /// since it would overtake them.
    #[test]
    fn quiet_frames_over_a_socket_go_out_with_the_next_frame() {
        let (outbox, direct, mut raw) = direct_pair();
        raw.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let reason = |raw: &mut std::net::TcpStream| match crate::framing::read_frame::<_, Msg>(
            raw, MAX_FRAME,
        ) {
            Ok(Msg::Abort { reason }) => Some(reason[..reason.find(':').unwrap()].to_string()),
            Ok(other) => panic!("unexpected {other:?}"),
            Err(_) => None,
        };
        outbox.send_quiet(1, &numbered(1, 10)).unwrap();
        outbox.send_quiet(1, &numbered(2, 10)).unwrap();
        assert_eq!(reason(&mut raw), None, "a quiet frame went out alone");
        assert_eq!(direct.try_send(&request_frame(7)), DirectSend::Refused);
        outbox.send(1, &numbered(3, 10)).unwrap();
        raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let got: Vec<_> = (0..3).map(|_| reason(&mut raw)).collect();
        assert_eq!(got, ["1", "2", "3"].map(|r| Some(r.to_string())));

        outbox.send_quiet(1, &numbered(4, 10)).unwrap();
        outbox.ring_owed_bells();
        assert_eq!(reason(&mut raw).as_deref(), Some("4"));
        send_when_room(&direct, &request_frame(8), "the link took no direct frame");
        let (before, pages) = read_until_page_request(&mut raw);
        assert!(before.is_empty() && pages == [8], "{before:?} {pages:?}");
    }

    #[test]
    fn a_direct_frame_leaves_in_order_with_the_link_s_other_frames() {
        let (mesh0, mut raw) = tcp_pair();
        let outbox = sending_side(mesh0);
        let senders = outbox.direct_senders();
        assert_eq!(senders.len(), 1);
        let direct = &senders[0];
        assert_eq!(direct.peer(), 1);
        let sent_before = outbox.traffic.messages_sent.load(Ordering::Relaxed);
        for page in [7u32, 300, 70_000] {
            outbox
                .send(
                    1,
                    &Msg::Abort {
                        reason: format!("before {page}"),
                    },
                )
                .unwrap();
            assert_eq!(
                direct.try_send(&request_frame(page)),
                DirectSend::Sent,
                "an idle link takes a direct frame"
            );
            let (before, pages) = read_until_page_request(&mut raw);
            assert_eq!(before, [format!("before {page}")]);
            assert_eq!(pages, [page]);
        }
        assert_eq!(
            outbox.traffic.messages_sent.load(Ordering::Relaxed) - sent_before,
            6,
            "direct frames are counted as sent"
        );
    }

    #[test]
    fn a_direct_send_never_waits_for_the_link_and_never_jumps_its_queue() {
        let (outbox, direct, mut raw) = direct_pair();
        let frame = request_frame(5);
        // Another thread sending on the link: refused at once, not waited for.
        let held = direct.link.queue.lock().unwrap();
        assert_eq!(
            direct.try_send(&frame),
            DirectSend::Refused,
            "the link's lock is held"
        );
        drop(held);
        // Rank 1 reads nothing, so big frames back up into the link's queue.
        let mut sent = 0;
        while direct.link.queue.lock().unwrap().frames.is_empty() {
            assert!(sent < 512, "the socket never filled");
            outbox.send(1, &numbered(sent, 1 << 20)).unwrap();
            sent += 1;
        }
        assert_eq!(
            direct.try_send(&frame),
            DirectSend::Refused,
            "frames are queued on the link"
        );
        // Once rank 1 reads, the queue drains and the direct frame goes behind it all.
        let reader = std::thread::spawn(move || read_until_page_request(&mut raw));
        send_when_room(&direct, &frame, "the queue never drained");
        let (before, pages) = reader.join().unwrap();
        assert_eq!(pages, [5]);
        assert_eq!(before.len(), sent, "every queued frame came first");
        for (i, reason) in before.iter().enumerate() {
            assert!(
                reason.starts_with(&format!("{i}:")),
                "frame {i} out of order"
            );
        }
        // A closed link takes nothing.
        outbox.close();
        assert_eq!(
            direct.try_send(&frame),
            DirectSend::Refused,
            "the link is closed"
        );
    }

    #[test]
    fn a_direct_send_needs_room_in_the_socket() {
        let (_outbox, direct, mut raw) = direct_pair();
        let frame = request_frame(9);
        // One big frame written straight to the socket, which rank 1 does not read, until
        // the socket takes no more: the link's queue stays empty.
        let big = frame_bytes(&numbered(0, 64 << 20));
        let mut done = 0;
        let full = loop {
            match (&direct.link.raw).write(&big[done..]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break true,
                Err(e) => panic!("{e}"),
            }
            if done == big.len() {
                break false;
            }
        };
        assert!(full, "64 MiB went into the socket");
        assert!(direct.link.queue.lock().unwrap().frames.is_empty());
        assert_eq!(
            direct.try_send(&frame),
            DirectSend::Refused,
            "a full socket takes no direct frame"
        );
        let reader = std::thread::spawn(move || read_until_page_request(&mut raw));
        while done < big.len() {
            match (&direct.link.raw).write(&big[done..]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("{e}"),
            }
        }
        send_when_room(&direct, &frame, "the socket never drained");
        let (before, pages) = reader.join().unwrap();
        assert_eq!((before.len(), pages), (1, vec![9]));
    }

    /// Leaves `frame` written up to `at` and its rest in the link, as
    /// [`DirectSender::try_send`] does when the socket takes only part of it.
    fn write_partly(direct: &DirectSender, frame: &[u8], at: usize) {
        let mut q = direct.link.queue.lock().unwrap();
        (&direct.link.raw).write_all(&frame[..at]).unwrap();
        q.direct_rest[..frame.len() - at].copy_from_slice(&frame[at..]);
        q.direct_rest_len = frame.len() - at;
        direct.rests.store(true, Ordering::Release);
    }

    #[test]
    fn the_rest_of_a_partly_written_direct_frame_goes_before_anything_else() {
        let (outbox, direct, mut raw) = direct_pair();
        // The next send on the link queues the rest ahead of its own frame.
        let frame = request_frame(11);
        write_partly(&direct, &frame, 3);
        assert_eq!(
            direct.try_send(&frame),
            DirectSend::Refused,
            "a rest is waiting"
        );
        outbox
            .send(
                1,
                &Msg::Abort {
                    reason: "after".into(),
                },
            )
            .unwrap();
        let (before, pages) = read_until_page_request(&mut raw);
        assert_eq!((before.len(), pages), (0, vec![11]));
        match crate::framing::read_frame::<_, Msg>(&mut raw, MAX_FRAME).unwrap() {
            Msg::Abort { reason } => assert_eq!(reason, "after"),
            other => panic!("unexpected {other:?}"),
        }
        // With nothing else to send, the comm thread's flush hands it to the writer.
        let frame = request_frame(12);
        write_partly(&direct, &frame, 5);
        outbox.flush_direct_rests();
        let (before, pages) = read_until_page_request(&mut raw);
        assert_eq!((before.len(), pages), (0, vec![12]));
        assert!(direct.link.queue.lock().unwrap().direct_rest_len == 0);
    }

    /// Rank 0's transport over a TCP pair on a thread of its own, recording the kinds of
    /// the messages it delivers; `pause_runtime` stops its runtime (reader task included)
    /// until the sender it returns is dropped, and an `Abort` saying "hold" keeps
    /// the reader inside its delivery until `go` is set.
    #[allow(clippy::type_complexity)]
    fn paused_receiver(
        mesh0: Mesh,
        go: Arc<AtomicBool>,
    ) -> (
        Arc<Outbox>,
        Arc<Mutex<Vec<String>>>,
        std::sync::mpsc::Sender<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>,
    ) {
        let (give, take) = std::sync::mpsc::channel();
        let (pause, paused) = std::sync::mpsc::channel::<(
            std::sync::mpsc::Sender<()>,
            std::sync::mpsc::Receiver<()>,
        )>();
        let kinds = Arc::new(Mutex::new(Vec::new()));
        let k = kinds.clone();
        std::thread::spawn(move || {
            run_local(async move {
                let record: Handler = Rc::new(move |_, e| {
                    if let PeerEvent::Message(m) = e {
                        k.lock().unwrap().push(m.kind().to_string());
                        if matches!(&m, Msg::Abort { reason } if reason == "hold") {
                            while !go.load(Ordering::Acquire) {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                        }
                    }
                });
                let t = Transport::start(mesh0, record, None).unwrap();
                give.send(t.outbox()).unwrap();
                let until = Instant::now() + Duration::from_secs(30);
                while Instant::now() < until {
                    if let Ok((stopped, resume)) = paused.try_recv() {
                        let _ = stopped.send(());
                        let _ = resume.recv();
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        });
        (take.recv().unwrap(), kinds, pause)
    }

    /// Stops the runtime of a [`paused_receiver`] until the returned sender is dropped.
    fn pause_runtime(
        pause: &std::sync::mpsc::Sender<(
            std::sync::mpsc::Sender<()>,
            std::sync::mpsc::Receiver<()>,
        )>,
    ) -> std::sync::mpsc::Sender<()> {
        let (stopped, on_stop) = std::sync::mpsc::channel();
        let (resume, resumed) = std::sync::mpsc::channel();
        pause.send((stopped, resumed)).unwrap();
        on_stop.recv().unwrap();
        resume
    }

    fn page_reply_frame(page: u32) -> Vec<u8> {
        frame_bytes(&Msg::PageReply {
            pages: vec![dsm_proto::PageCopy {
                page,
                data: vec![page as u8; dsm_proto::PAGE_SIZE],
                applied: vec![(1, 9)],
            }],
        })
    }

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < until, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_handler_takes_a_whole_reply_frame_only_when_the_reader_holds_nothing() {
        let (mesh0, mut raw) = tcp_pair();
        let go = Arc::new(AtomicBool::new(false));
        let (outbox, kinds, pause) = paused_receiver(mesh0, go.clone());
        let direct = outbox.direct_senders().remove(0);
        let mut buf = [0u8; crate::framing::PLAIN_REPLY_FRAME_MAX];
        let page_seven = &mut |payload: &[u8]| {
            crate::framing::plain_page_reply(payload).is_some_and(|r| r.page == 7)
        };
        // What a handler records of a taken frame, recorded while it still holds the
        // link's bytes (so before the reader can deliver what follows).
        let takes = std::cell::RefCell::new(Vec::new());
        let incoming = &direct.link.incoming;
        let record = &mut |payload: &[u8]| {
            assert_eq!(incoming.load(Ordering::Acquire), INCOMING_HANDLER);
            let reply = crate::framing::plain_page_reply(payload).unwrap();
            takes
                .borrow_mut()
                .push((reply.page, reply.data[0], reply.applied().to_vec()));
        };
        let reader_holds = || incoming.load(Ordering::Acquire) == INCOMING_READER;

        // With the reader's runtime stopped, writes `bytes` and tries a take while they
        // are in the socket; the runtime goes on when the returned sender is dropped.
        let mut paused_take = |bytes: &[u8], buf: &mut [u8], want: DirectTake| {
            let resume = pause_runtime(&pause);
            (&raw).write_all(bytes).unwrap();
            wait_for("the bytes reached the socket", || outbox.sockets_readable());
            assert_eq!(direct.try_take_frame(buf, page_seven, record), want);
            resume
        };

        // The reader idle and its runtime stopped: the reply is whole in the socket, and
        // the handler takes it, but only the reply it wants.
        drop(paused_take(
            &page_reply_frame(8),
            &mut buf,
            DirectTake::Other,
        ));
        wait_for("the reader delivered page 8's reply", || {
            kinds.lock().unwrap().len() == 1
        });
        let resume = paused_take(&page_reply_frame(7), &mut buf, DirectTake::Taken);
        assert_eq!(*takes.borrow(), [(7, 7, vec![(1, 9)])]);
        assert!(
            !outbox.sockets_readable(),
            "the frame was taken out of the socket"
        );
        drop(resume);

        // Part of a frame read by the reader (past the length prefix, or the prefix
        // alone): the handler stays off the rest.
        for split in [100, 4] {
            let frame = page_reply_frame(7);
            (&raw).write_all(&frame[..split]).unwrap();
            wait_for("the reader read the first part", reader_holds);
            drop(paused_take(&frame[split..], &mut buf, DirectTake::NotThere));
        }
        wait_for("the reader delivered the split page 7 replies", || {
            kinds.lock().unwrap().len() == 3
        });

        // A reader in the middle of delivering what it read: the handler waits for it
        // even with a whole reply in the socket, which may come only after what the
        // reader holds.
        raw.write_all(&frame_bytes(&Msg::Abort {
            reason: "hold".into(),
        }))
        .unwrap();
        wait_for("the reader took the frame in", || {
            kinds.lock().unwrap().len() == 4
        });
        raw.write_all(&page_reply_frame(7)).unwrap();
        wait_for("the reply reached the socket", || outbox.sockets_readable());
        assert_eq!(
            direct.try_take_frame(&mut buf, page_seven, record),
            DirectTake::NotThere
        );
        go.store(true, Ordering::Release);

        // The stream is whole after a take: the reader delivers what follows, in order.
        raw.write_all(&frame_bytes(&Msg::Abort {
            reason: "after".into(),
        }))
        .unwrap();
        wait_for("the reader delivered the rest", || {
            kinds.lock().unwrap().len() == 6
        });
        assert_eq!(
            *kinds.lock().unwrap(),
            [
                "page-reply",
                "page-reply",
                "page-reply",
                "abort",
                "page-reply",
                "abort"
            ],
            "page 8's reply, the two split page 7 replies, the aborts around the last page \
             7 reply (the first page 7 reply was taken)"
        );
        assert_eq!(takes.borrow().len(), 1, "one take recorded");
    }

    #[test]
    fn shared_memory_links_have_no_direct_sender() {
        let (mesh0, _mesh1) = pair();
        assert!(mesh0.shm[1].is_some());
        let outbox = sending_side(mesh0);
        assert!(outbox.direct_senders().is_empty());
    }

    fn pair() -> (Mesh, Mesh) {
        let coord = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let peer = std::thread::spawn(move || connect_mesh(&job(1, coord)).unwrap());
        let mesh0 = connect_mesh(&job(0, coord)).unwrap();
        (mesh0, peer.join().unwrap())
    }

    /// Starts `mesh`'s transport on a thread of its own, kept for 30 s, and returns its
    /// outbox: the sending side of a test whose receiving side it watches.
    fn sending_side(mesh: Mesh) -> Arc<Outbox> {
        let (give, take) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            run_local(async move {
                let t = Transport::start(mesh, Rc::new(|_, _| {}), None).unwrap();
                give.send(t.outbox()).unwrap();
                tokio::time::sleep(Duration::from_secs(30)).await;
            })
        });
        take.recv().unwrap()
    }

    type Events = Rc<RefCell<Vec<(usize, String, Instant)>>>;

    /// A message of about `len` bytes, numbered `i`.
    fn numbered(i: usize, len: usize) -> Msg {
        Msg::Abort {
            reason: format!("{i}:{}", "x".repeat(len)),
        }
    }

    /// Runs rank 1's transport on its own thread until it has seen `want` events (or 20 s),
    /// and returns them.
    fn listen_on_thread(mesh1: Mesh, want: usize) -> std::thread::JoinHandle<Vec<String>> {
        std::thread::spawn(move || {
            let events: Events = Rc::default();
            run_local(async {
                let t = Transport::start(mesh1, recorder(&events), None).unwrap();
                assert_eq!(t.outbox().shm_peers(), &[0]);
                let until = Instant::now() + Duration::from_secs(20);
                while events.borrow().len() < want && Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            });
            let got = events.borrow().iter().map(|(_, e, _)| e.clone()).collect();
            got
        })
    }

    #[test]
    fn a_shared_memory_link_carries_small_and_oversized_frames_in_order() {
        let (mesh0, mesh1) = pair();
        assert!(mesh0.shm[1].is_some() && mesh1.shm[0].is_some());
        // Frames larger than the ring pass in pieces, behind and ahead of small ones.
        let sizes: Vec<usize> = (0..300)
            .map(|i| match i % 50 {
                7 => 5 << 20,
                8 => crate::ring::DEFAULT_RING_BYTES - 3,
                _ => i * 37 % 5000,
            })
            .collect();
        let listener = listen_on_thread(mesh1, sizes.len() + 1);
        run_local(async {
            let t0 = Transport::start(mesh0, Rc::new(|_, _| {}), None).unwrap();
            assert_eq!(t0.outbox().shm_peers(), &[1]);
            for (i, &len) in sizes.iter().enumerate() {
                t0.send(1, &numbered(i, len)).unwrap();
            }
            // A clean shutdown flushes, then closes: rank 1 hears everything, then Closed.
            t0.shutdown(Duration::from_secs(20)).await;
        });
        let got = listener.join().unwrap();
        assert_eq!(got.len(), sizes.len() + 1);
        for (i, &len) in sizes.iter().enumerate() {
            let head = format!("Message(Abort {{ reason: \"{i}:");
            assert!(got[i].starts_with(&head), "event {i}: {:.80}", got[i]);
            assert!(got[i].len() > len, "event {i} was cut short");
        }
        assert_eq!(got.last().unwrap(), "Closed");
    }

    #[test]
    fn a_request_in_the_lane_reaches_the_peer_after_the_frames_sent_before_it() {
        let (mesh0, mesh1) = pair();
        let out0 = sending_side(mesh0);
        let listener = listen_on_thread(mesh1, 4);
        let end = out0.lanes()[0].clone();
        assert_eq!(end.peer, 1);
        out0.send(1, &numbered(1, 3000)).unwrap();
        let lane = end.region.lane(end.to_peer);
        // Posted as the fault handler does, behind everything sent, after the listener has
        // had time to go to sleep on its bell.
        std::thread::sleep(Duration::from_millis(100));
        assert!(lane.post_request(9, end.sent.load(Ordering::Acquire)));
        if end.region.reader_needs_wake(end.to_peer) {
            ring_bell(&end.peer_bell).unwrap();
        }
        // Served: the slot takes the next request, which follows the frame after it.
        for _ in 0..2000 {
            if lane.pending_request().is_none() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        out0.send(1, &numbered(2, 10)).unwrap();
        assert!(lane.post_request(10, end.sent.load(Ordering::Acquire)));
        if end.region.reader_needs_wake(end.to_peer) {
            ring_bell(&end.peer_bell).unwrap();
        }
        let got = listener.join().unwrap();
        assert_eq!(got.len(), 4, "{got:?}");
        assert!(
            got[0].starts_with("Message(Abort { reason: \"1:"),
            "{got:?}"
        );
        assert_eq!(
            got[1],
            "Message(PageRequest { pages: [9], required: [], lane: true })"
        );
        assert!(
            got[2].starts_with("Message(Abort { reason: \"2:"),
            "{got:?}"
        );
        assert_eq!(
            got[3],
            "Message(PageRequest { pages: [10], required: [], lane: true })"
        );
    }

    #[test]
    fn a_page_in_the_lane_is_announced_by_the_frame_right_after_it() {
        let (mesh0, mesh1) = pair();
        let out0 = sending_side(mesh0);
        let page: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        // What rank 1 saw in the lane each time a frame announced a page there: the page
        // and position the lane held, and the position delivered so far (where the
        // announcing frame starts).
        type Seen = Rc<RefCell<Vec<(Option<LanePosition>, u64)>>>;
        let seen: Seen = Rc::default();
        let lanes: Rc<std::cell::OnceCell<Vec<LaneEnd>>> = Rc::default();
        let (s, l) = (seen.clone(), lanes.clone());
        let handler: Handler = Rc::new(move |_, e| {
            if let PeerEvent::Message(Msg::LanePageReply { .. }) = e {
                let end = &l.get().expect("lanes")[0];
                let lane = end.region.lane(end.dir);
                s.borrow_mut()
                    .push((lane.full(), end.delivered.load(Ordering::Acquire)));
                assert!(lane.take());
                lane.release();
            }
        });
        out0.send(1, &numbered(1, 3000)).unwrap();
        let note = Msg::LanePageReply { page: 5 };
        assert!(out0
            .send_through_lane(1, &note, 5, &[3 << 32 | 4], &page)
            .unwrap());
        assert!(
            !out0.send_through_lane(1, &note, 6, &[], &page).unwrap(),
            "the lane holds one page until the receiver takes it"
        );
        run_local(async {
            let t1 = Transport::start(mesh1, handler, None).unwrap();
            assert_eq!(t1.outbox().lanes().len(), 1);
            assert_eq!(t1.outbox().lanes()[0].peer, 0);
            let _ = lanes.set(t1.outbox().lanes().to_vec());
            for _ in 0..2000 {
                if !seen.borrow().is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(
                out0.send_through_lane(1, &note, 7, &[], &page).unwrap(),
                "taken, free"
            );
            for _ in 0..2000 {
                if seen.borrow().len() == 2 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let seen = seen.borrow();
        assert_eq!(seen.len(), 2, "{seen:?}");
        for &(full, delivered) in seen.iter() {
            let at = full.expect("the page is in the lane when its frame comes");
            assert_eq!(at.after, delivered, "the frame comes right after the page");
        }
        let (first, second) = (seen[0].0.unwrap(), seen[1].0.unwrap());
        assert_eq!((first.page, second.page), (5, 7));
        assert_eq!(first.needs, first.after, "the frame before it counts");
        assert_eq!(
            second.needs, first.after,
            "the announcement of page 5 does not: a faulting thread need not wait for it"
        );
        assert!(seen[0].1 > 3000, "the earlier frame was delivered first");
    }

    #[test]
    fn a_frame_left_half_written_is_a_failure_never_a_message() {
        let (mesh0, mut mesh1) = pair();
        // Rank 1 commits one whole frame and half of the next, then dies (its TCP
        // connection closes).
        let link = mesh1.shm[0].take().unwrap();
        let mut w = crate::ring::RingWriter::new(link.region.clone(), link.send);
        let whole = frame(&numbered(1, 10)).unwrap();
        let torn = frame(&numbered(2, 100)).unwrap();
        w.write(&whole).unwrap();
        w.write(&torn[..50]).unwrap();
        drop(mesh1);
        let got = first_events(mesh0, 2);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].1.contains("\"1:x"), "{got:?}");
        assert!(
            got[1].1.starts_with("Failed") && got[1].1.contains("middle of a message"),
            "{got:?}"
        );
    }

    /// Runs a transport on `mesh` until it has delivered `n` events (at most 10 s).
    fn first_events(mesh: Mesh, n: usize) -> Vec<(usize, String, Instant)> {
        let events: Events = Rc::default();
        run_local(async {
            let _t = Transport::start(mesh, recorder(&events), None).unwrap();
            for _ in 0..2000 {
                if events.borrow().len() >= n {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let got = events.borrow().clone();
        got
    }

    #[test]
    fn a_waiting_thread_takes_ring_frames_itself_in_order_and_never_twice() {
        let (mesh0, mut mesh1) = pair();
        let link = mesh1.shm[0].take().unwrap();
        let mut w = crate::ring::RingWriter::new(link.region.clone(), link.send);
        let events: Events = Rc::default();
        let mut polled = Vec::new();
        let mut woke_reader = false;
        run_local(async {
            let t = Transport::start(mesh0, recorder(&events), None).unwrap();
            let outbox = t.outbox();
            // Let the reader task go to sleep on its bell first.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let mut take = |peer: usize, m: Msg| polled.push((peer, format!("{m:?}")));
            for i in 1..=3 {
                w.write(&frame(&numbered(i, 10)).unwrap()).unwrap();
            }
            assert_eq!(outbox.poll_rings(&mut take), 3);
            // Frames committed while the thread polls and still there when it stops are
            // taken as it stops, not left for the reader task to be woken for.
            for i in 4..=5 {
                w.write(&frame(&numbered(i, 10)).unwrap()).unwrap();
            }
            outbox.end_polling(&mut take);
            // After that the bell is armed again: the next commit wakes the reader task.
            w.write(&frame(&numbered(6, 10)).unwrap()).unwrap();
            woke_reader = w.reader_needs_wake();
            ring_bell(&link.peer_data_bell).unwrap();
            for _ in 0..2000 {
                if !events.borrow().is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Garbage found by a poller is reported by the reader task, not lost.
            w.write(&[0, 0, 0, 3, 0xff, 0xff, 0xff]).unwrap();
            assert_eq!(
                outbox.poll_rings(&mut |_, _| panic!("garbage delivered")),
                0
            );
            for _ in 0..2000 {
                if events.borrow().len() >= 2 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        assert!(woke_reader, "end_polling leaves the bell armed");
        assert_eq!(polled.len(), 5, "{polled:?}");
        for (k, (peer, m)) in polled.iter().enumerate() {
            assert_eq!(*peer, 1);
            assert!(m.contains(&format!("\"{}:x", k + 1)), "{polled:?}");
        }
        let got = events.borrow().clone();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].1.contains("\"6:x"), "{got:?}");
        assert!(got[1].1.contains("Malformed"), "{got:?}");
        drop(mesh1);
    }

    #[test]
    fn garbage_in_a_ring_is_reported_as_malformed() {
        let (mesh0, mut mesh1) = pair();
        let link = mesh1.shm[0].take().unwrap();
        let mut w = crate::ring::RingWriter::new(link.region.clone(), link.send);
        w.write(&frame(&numbered(1, 3)).unwrap()).unwrap();
        w.write(&[0, 0, 0, 3, 0xff, 0xff, 0xff]).unwrap();
        let got = first_events(mesh0, 2);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].1.contains("\"1:xxx"), "{got:?}");
        assert!(got[1].1.contains("Malformed"), "{got:?}");
        drop(mesh1);
    }

    /// A quiet frame does not wake a sleeping reader; the owed bell does, and so does the
    /// next frame sent normally. Quiet frames that fill the ring wake it too (a sleeping
    /// reader must make room), so nothing is ever stuck behind a missing bell.
    #[test]
    fn quiet_frames_wait_for_the_owed_bell_and_never_get_stuck() {
        let (mesh0, mesh1) = pair();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            run_local(async move {
                let _t = Transport::start(
                    mesh1,
                    Rc::new(move |_, e| {
                        let _ = tx.send(format!("{e:?}"));
                    }),
                    None,
                )
                .unwrap();
                tokio::time::sleep(Duration::from_secs(30)).await;
            })
        });
        let got = |within: Duration| rx.recv_timeout(within).ok();
        let head = |i: usize| format!("Message(Abort {{ reason: \"{i}:");
        let outbox = sending_side(mesh0);
        // A normal frame is heard, after which the reader goes back to sleep.
        outbox.send(1, &numbered(0, 10)).unwrap();
        assert!(got(Duration::from_secs(10)).unwrap().starts_with(&head(0)));
        std::thread::sleep(Duration::from_millis(50));

        outbox.send_quiet(1, &numbered(1, 10)).unwrap();
        assert_eq!(
            got(Duration::from_millis(300)),
            None,
            "a quiet frame woke the reader"
        );
        outbox.ring_owed_bells();
        assert!(got(Duration::from_secs(10)).unwrap().starts_with(&head(1)));
        std::thread::sleep(Duration::from_millis(50));

        outbox.send_quiet(1, &numbered(2, 10)).unwrap();
        assert_eq!(got(Duration::from_millis(300)), None);
        outbox.send(1, &numbered(3, 10)).unwrap();
        assert!(got(Duration::from_secs(10)).unwrap().starts_with(&head(2)));
        assert!(got(Duration::from_secs(10)).unwrap().starts_with(&head(3)));
        std::thread::sleep(Duration::from_millis(50));

        // Twice the ring's size in quiet frames: the sender never waits for a bell it
        // owes (the frame that does not fit rings it), and all arrive in order once the
        // sender rings what it owes, as a thread about to wait does. (Without that last
        // ring the frames sent after the queue drained may wait, quietly, for the next
        // frame: on a loaded machine the writer task drains the queue before the loop
        // ends, and this test once failed so.)
        let frames = 2 * crate::ring::DEFAULT_RING_BYTES / 4096;
        for i in 0..frames {
            outbox.send_quiet(1, &numbered(4 + i, 4000)).unwrap();
        }
        outbox.ring_owed_bells();
        for i in 0..frames {
            let e = got(Duration::from_secs(10)).expect("every quiet frame arrives");
            assert!(e.starts_with(&head(4 + i)), "frame {i}: {e:.60}");
        }
    }

    /// The reader task calls the after-frames hook once it has delivered frames and let go
    /// of the ring: the hook can take the frames that follow itself, in order, and the
    /// ring works as before once it stops (`end_polling`).
    #[test]
    fn the_after_frames_hook_can_take_the_frames_that_follow() {
        let (mesh0, mesh1) = pair();
        let outbox = sending_side(mesh0);
        let frames = 200;
        let got = std::thread::spawn(move || {
            let events: Rc<RefCell<Vec<(String, bool)>>> = Rc::default();
            run_local(async {
                let ev = events.clone();
                let t1 = Transport::start(
                    mesh1,
                    Rc::new(move |_, e| ev.borrow_mut().push((format!("{e:?}"), false))),
                    None,
                )
                .unwrap();
                let o = t1.outbox();
                let ev = events.clone();
                t1.after_ring_frames(Rc::new(move || {
                    let deliver = &mut |_: usize, m: Msg| {
                        ev.borrow_mut().push((format!("Message({m:?})"), true))
                    };
                    let until = Instant::now() + Duration::from_millis(20);
                    while Instant::now() < until {
                        o.poll_rings(deliver);
                    }
                    o.end_polling(deliver);
                }));
                let until = Instant::now() + Duration::from_secs(20);
                while events.borrow().len() < frames + 1 && Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            });
            let got = events.borrow().clone();
            got
        });
        // Paced, so that frames arrive while the hook polls (a burst would all be taken
        // by the reader task before it calls the hook).
        for i in 0..frames {
            outbox.send(1, &numbered(i, 100)).unwrap();
            std::thread::sleep(Duration::from_micros(500));
        }
        // A last frame well after the hook stopped polling: the bell was armed again.
        std::thread::sleep(Duration::from_millis(100));
        outbox.send(1, &numbered(frames, 100)).unwrap();
        let got = got.join().unwrap();
        assert_eq!(got.len(), frames + 1);
        for (i, (e, _)) in got.iter().enumerate() {
            let head = format!("Message(Abort {{ reason: \"{i}:");
            assert!(e.starts_with(&head), "frame {i}: {e:.60}");
        }
        assert!(
            got.iter().any(|(_, by_hook)| *by_hook),
            "the hook took frames"
        );
        assert!(
            !got.last().unwrap().1,
            "the reader task was woken for the last one"
        );
    }

    fn recorder(events: &Events) -> Handler {
        let ev = events.clone();
        Rc::new(move |p, e| ev.borrow_mut().push((p, format!("{e:?}"), Instant::now())))
    }

    #[test]
    fn heartbeats_keep_idle_links_alive_and_stay_in_the_transport() {
        let (mesh0, mesh1) = pair();
        let events: Events = Rc::default();
        let deadline = Duration::from_millis(200);
        run_local(async {
            let t0 = Transport::start(mesh0, recorder(&events), Some(deadline)).unwrap();
            let t1 = Transport::start(mesh1, recorder(&events), Some(deadline)).unwrap();
            // Nothing but heartbeats for four deadlines.
            tokio::time::sleep(deadline * 4).await;
            assert!(events.borrow().is_empty(), "{:?}", events.borrow());
            for t in [&t0, &t1] {
                let sent = t.outbox().traffic.messages_sent.load(Ordering::Relaxed);
                let received = t.outbox().traffic.messages_received.load(Ordering::Relaxed);
                assert!(
                    sent >= 4 && received >= 4,
                    "{sent} sent, {received} received"
                );
            }
            // A link busy with other messages needs no heartbeats, and loses nothing.
            for i in 0..20u32 {
                t0.send(
                    1,
                    &Msg::Abort {
                        reason: i.to_string(),
                    },
                )
                .unwrap();
                tokio::time::sleep(deadline / 10).await;
            }
            tokio::time::sleep(deadline / 2).await;
            let got = events.borrow();
            assert_eq!(got.len(), 20, "{got:?}");
            assert!(got.iter().all(|(p, e, _)| *p == 0 && e.contains("Abort")));
        });
    }

    #[test]
    fn a_peer_that_sends_nothing_is_reported_silent_once() {
        let (mesh0, mut mesh1) = pair();
        // Rank 1 keeps its socket open and says nothing, as a stopped process would.
        let _quiet = mesh1.streams[0].take().unwrap();
        let events: Events = Rc::default();
        let deadline = Duration::from_millis(200);
        run_local(async {
            let started = Instant::now();
            let _t = Transport::start(mesh0, recorder(&events), Some(deadline)).unwrap();
            tokio::time::sleep(deadline * 3).await;
            let got = events.borrow();
            assert_eq!(got.len(), 1, "{got:?}");
            let (peer, event, at) = &got[0];
            assert_eq!(*peer, 1);
            assert!(event.starts_with("Silent("), "{event}");
            let waited = at.duration_since(started);
            assert!(
                waited >= deadline && waited <= deadline + heartbeat_period(deadline) * 2,
                "reported after {waited:?}"
            );
        });
    }

    #[test]
    fn a_node_that_was_stalled_itself_does_not_blame_its_peers() {
        let (mesh0, mesh1) = pair();
        let deadline = Duration::from_millis(200);
        // Rank 1 runs on its own thread and keeps sending heartbeats.
        let peer = std::thread::spawn(move || {
            run_local(async {
                let _t = Transport::start(mesh1, Rc::new(|_, _| {}), Some(deadline)).unwrap();
                tokio::time::sleep(deadline * 10).await;
            })
        });
        let events: Events = Rc::default();
        run_local(async {
            let _t = Transport::start(mesh0, recorder(&events), Some(deadline)).unwrap();
            tokio::time::sleep(deadline).await;
            // This thread stops running for three deadlines, as a process under SIGSTOP or
            // starved of CPU would: rank 1's heartbeats wait unread in the socket.
            std::thread::sleep(deadline * 3);
            tokio::time::sleep(deadline * 2).await;
            assert!(events.borrow().is_empty(), "{:?}", events.borrow());
        });
        peer.join().unwrap();
    }

    #[test]
    fn without_a_deadline_silence_is_never_reported() {
        let (mesh0, mut mesh1) = pair();
        let _quiet = mesh1.streams[0].take().unwrap();
        let events: Events = Rc::default();
        run_local(async {
            let t = Transport::start(mesh0, recorder(&events), None).unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(events.borrow().is_empty(), "{:?}", events.borrow());
            assert_eq!(t.outbox().traffic.messages_sent.load(Ordering::Relaxed), 0);
        });
    }
}
