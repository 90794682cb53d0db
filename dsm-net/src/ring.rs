//! The shared-memory channel between two ranks on one host, and the only `unsafe` code of
//! dsm-net (mapping the shared file, atomics and byte copies over it). The safe transport
//! on top of it is in [`crate::transport`]; how two ranks find out they can share memory and
//! hand each other the file is in [`crate::colocate`].
//!
//! A [`Region`] is a sealed memfd holding two single-producer single-consumer byte rings,
//! one per direction. Each ring is a byte stream exactly like a TCP connection (the same
//! length-prefixed frames travel on it), with a monotonically increasing write index
//! (`tail`, published with release ordering after the bytes are copied in: the commit
//! index) and read index (`head`). A reader never sees bytes before their commit, so a
//! writer that dies in the middle of a frame leaves a short stream, never a misparsed one;
//! indices from a corrupt or hostile peer are checked ([`RingError`]) before any copy.
//!
//! Wake-ups go through eventfds (passed along with the memfd), rung only when the other side
//! said it is going to sleep (a `waiting` flag set before it re-checks the indices, with
//! sequentially consistent ordering on both sides so that a wake-up is never lost), so a
//! busy pair exchanges frames without system calls beyond the copies.
//!
//! Why here and not in dsm-core's `sys`: the rings are part of the transport, which is
//! dsm-net's, and dsm-core depends on dsm-net, not the other way round. The module follows
//! `sys`'s rules: `unsafe_op_in_unsafe_fn` denied, a `// SAFETY:` comment on every block.
#![deny(unsafe_op_in_unsafe_fn)]

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use std::io;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use thiserror::Error;

mod lane;
pub use lane::{LaneCells, LanePosition, LaneState, PageLane, LANE_APPLIED_MAX};

/// What `lane.rs` is built on (`tests/lane_model.rs` gives it loom's atomics instead).
mod lane_deps {
    pub(super) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
}

/// Identifies a dsm shared-memory region and its layout version.
const MAGIC: u64 = u64::from_le_bytes(*b"dsmring3");
/// Bytes of the header before the first ring's data: the identification line and one cache
/// line per ring side.
const HEADER: usize = 4096;
/// One cache line, so the writer's and the reader's indices never share one.
const LINE: usize = 64;
/// Bytes of each direction's page lane after the rings: a page of control words and the
/// page of data.
const LANE_BYTES: usize = 2 * 4096;
/// The seals a region carries: its size can never change, so a mapping of it can never
/// fault with SIGBUS because the other side shrank the file.
const SEALS: SealFlag = SealFlag::from_bits_truncate(
    SealFlag::F_SEAL_SHRINK.bits() | SealFlag::F_SEAL_GROW.bits() | SealFlag::F_SEAL_SEAL.bits(),
);

/// Bytes of each ring unless told otherwise: 256 KiB, which holds the usual page replies
/// (tens of pages) many times over; larger frames pass in pieces. Not more, because every
/// ring page the byte stream has passed through stays resident (shared memory counts in
/// the process's RSS): two rings of 2 MiB per peer made a race-detection run at N = 3 use
/// twice the memory of a plain one.
pub const DEFAULT_RING_BYTES: usize = 256 << 10;

/// What is wrong with a region or a ring.
#[derive(Debug, Error)]
pub enum RingError {
    /// Creating, sealing or mapping the shared file failed.
    #[error("shared memory: {0}")]
    Io(#[from] io::Error),
    /// The file handed over is not a dsm region of a supported layout, or is not sealed.
    #[error("not a dsm shared-memory region: {0}")]
    NotARegion(String),
    /// The peer's indices are impossible (more bytes committed than the ring holds, or an
    /// index that went backwards): its memory is corrupt or it is not a dsm rank.
    #[error("corrupt shared-memory ring: {0}")]
    Corrupt(String),
}

/// The two directions of a region. The rank that creates the region writes `Forward`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the region's creator to the other rank.
    Forward = 0,
    /// From the other rank to the creator.
    Backward = 1,
}

/// A mapped region: the header and both rings, shared with one other process.
pub struct Region {
    base: NonNull<u8>,
    len: usize,
    ring_bytes: usize,
    _fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory that stays mapped for the `Region`'s life;
// every access to it goes through atomics or through copies into ranges that the SPSC
// protocol gives to one side at a time, so using it from several threads is sound.
unsafe impl Send for Region {}
// SAFETY: as for `Send`; `&Region` only offers the operations described there.
unsafe impl Sync for Region {}

impl Region {
    /// A new region with two rings of `ring_bytes` each (a power of two, at least a page),
    /// its header carrying `nonce` so the receiver can tell it came from the right peer.
    pub fn create(ring_bytes: usize, nonce: [u8; 32]) -> Result<Region, RingError> {
        assert!(ring_bytes.is_power_of_two() && ring_bytes >= 4096);
        let fd = memfd_create(
            c"dsm-ring",
            MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
        )
        .map_err(io::Error::from)?;
        let len = HEADER + 2 * ring_bytes + 2 * LANE_BYTES;
        nix::unistd::ftruncate(&fd, len as i64).map_err(io::Error::from)?;
        fcntl(fd.as_raw_fd(), FcntlArg::F_ADD_SEALS(SEALS)).map_err(io::Error::from)?;
        let region = Region::map(fd, len, ring_bytes)?;
        // The file is new and zero-filled: indices and flags start at zero.
        region.word(8).store(ring_bytes as u64, Ordering::Relaxed);
        for (i, chunk) in nonce.chunks(8).enumerate() {
            let v = u64::from_le_bytes(chunk.try_into().expect("8-byte chunks"));
            region.word(16 + 8 * i).store(v, Ordering::Relaxed);
        }
        region.word(0).store(MAGIC, Ordering::Release);
        Ok(region)
    }

    /// Maps a region another rank created and handed over, after checking that it is
    /// sealed against resizing and has a dsm header and a consistent size.
    pub fn open(fd: OwnedFd) -> Result<Region, RingError> {
        let seals = fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS).map_err(io::Error::from)?;
        if !SealFlag::from_bits_truncate(seals).contains(SEALS) {
            return Err(RingError::NotARegion(
                "the file is not sealed against resizing".into(),
            ));
        }
        let len = nix::sys::stat::fstat(fd.as_raw_fd())
            .map_err(io::Error::from)?
            .st_size as usize;
        let fixed = HEADER + 2 * LANE_BYTES;
        if len < fixed + 2 * 4096 || !(len - fixed).is_multiple_of(2) {
            return Err(RingError::NotARegion(format!("{len} bytes")));
        }
        let ring_bytes = (len - fixed) / 2;
        if !ring_bytes.is_power_of_two() {
            return Err(RingError::NotARegion(format!("{len} bytes")));
        }
        let region = Region::map(fd, len, ring_bytes)?;
        if region.word(0).load(Ordering::Acquire) != MAGIC {
            return Err(RingError::NotARegion("bad magic".into()));
        }
        if region.word(8).load(Ordering::Relaxed) != ring_bytes as u64 {
            return Err(RingError::NotARegion(
                "ring size disagrees with the file".into(),
            ));
        }
        Ok(region)
    }

    fn map(fd: OwnedFd, len: usize, ring_bytes: usize) -> Result<Region, RingError> {
        // SAFETY: a fresh shared mapping of the whole file, at an address the kernel
        // picks, so no existing memory is affected; the file is sealed against shrinking
        // (checked by `open`, done by `create` before mapping), so every page of the
        // mapping stays backed.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error().into());
        }
        Ok(Region {
            base: NonNull::new(base.cast()).expect("mmap succeeded"),
            len,
            ring_bytes,
            _fd: fd,
        })
    }

    /// The descriptor of the shared file, to hand to the peer.
    pub fn fd(&self) -> &OwnedFd {
        &self._fd
    }

    /// Bytes of each ring.
    pub fn ring_bytes(&self) -> usize {
        self.ring_bytes
    }

    /// The creator's nonce from the header.
    pub fn nonce(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (i, chunk) in out.chunks_mut(8).enumerate() {
            chunk.copy_from_slice(&self.word(16 + 8 * i).load(Ordering::Relaxed).to_le_bytes());
        }
        out
    }

    /// The 64-bit word at byte `offset` of the header.
    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= HEADER);
        // SAFETY: in bounds of the mapping (checked above), 8-aligned (the mapping is
        // page-aligned), and only ever accessed atomically by both processes; the
        // reference lives no longer than `self`, which keeps the mapping.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// The 32-bit word at byte `offset` of the header.
    fn flag(&self, offset: usize) -> &AtomicU32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= HEADER);
        // SAFETY: as in `word`, for a 4-byte atomic.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    fn side(&self, dir: Direction) -> Side<'_> {
        let producer = LINE * (1 + 2 * dir as usize);
        let consumer = producer + LINE;
        Side {
            tail: self.word(producer),
            reader_waiting: self.flag(producer + 8),
            head: self.word(consumer),
            writer_waiting: self.flag(consumer + 8),
            data: HEADER + dir as usize * self.ring_bytes,
        }
    }

    /// Copies `src` into ring `dir`'s data at ring position `pos` (wrapping).
    ///
    /// # Safety
    /// `[pos, pos + src.len())` must be free space the caller owns as the ring's writer.
    unsafe fn copy_in(&self, data: usize, pos: u64, src: &[u8]) {
        let mask = self.ring_bytes - 1;
        let start = pos as usize & mask;
        let first = src.len().min(self.ring_bytes - start);
        // SAFETY: both ranges lie inside the ring's data (start < ring_bytes, first and the
        // rest fit before the end and from the start), which the caller owns as writer.
        unsafe {
            let ring = self.base.as_ptr().add(data);
            std::ptr::copy_nonoverlapping(src.as_ptr(), ring.add(start), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), ring, src.len() - first);
        }
    }

    /// Copies `dst.len()` bytes of ring data at ring position `pos` (wrapping) into `dst`,
    /// which need not be initialized (every byte of it is written).
    ///
    /// # Safety
    /// `[pos, pos + dst.len())` must be committed bytes the caller owns as the ring's reader.
    unsafe fn copy_out(&self, data: usize, pos: u64, dst: &mut [MaybeUninit<u8>]) {
        let mask = self.ring_bytes - 1;
        let start = pos as usize & mask;
        let first = dst.len().min(self.ring_bytes - start);
        // SAFETY: as in `copy_in`, for committed bytes that the writer no longer touches.
        unsafe {
            let ring = self.base.as_ptr().add(data);
            let dst_ptr = dst.as_mut_ptr().cast::<u8>();
            std::ptr::copy_nonoverlapping(ring.add(start), dst_ptr, first);
            std::ptr::copy_nonoverlapping(ring, dst_ptr.add(first), dst.len() - first);
        }
    }
}

/// One direction's page lane in a region (see [`PageLane`]).
pub type Lane<'a> = PageLane<RegionLane<'a>>;

/// The memory of one lane of a region: a control page, then the data page.
pub struct RegionLane<'a> {
    region: &'a Region,
    /// Byte offset of the lane's control page in the region.
    at: usize,
}

impl LaneCells for RegionLane<'_> {
    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= 4096);
        // SAFETY: inside the lane's control page of the mapping (checked above, and the
        // lane lies inside the region by construction), 8-aligned, only ever accessed
        // atomically; borrowed no longer than the region.
        unsafe {
            &*self
                .region
                .base
                .as_ptr()
                .add(self.at + offset)
                .cast::<AtomicU64>()
        }
    }

    fn state(&self) -> &AtomicU32 {
        // SAFETY: as in `word`, for the 4-byte state at the start of the control page.
        unsafe { &*self.region.base.as_ptr().add(self.at).cast::<AtomicU32>() }
    }

    fn put_data(&self, data: &[u8]) {
        assert_eq!(data.len(), 4096, "a lane carries one page");
        // SAFETY: the data page lies inside the mapping; `PageLane` copies in only while
        // the lane is empty, when its data belongs to the home (this side) until it
        // stores `FULL`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.region.base.as_ptr().add(self.at + 4096),
                4096,
            )
        };
    }

    fn get_data(&self, data: &mut [u8]) {
        assert_eq!(data.len(), 4096, "a lane carries one page");
        // SAFETY: the data page lies inside the mapping; `PageLane` copies out only while
        // this thread holds the taken lane, whose data belongs to it until it empties
        // the lane.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.region.base.as_ptr().add(self.at + 4096),
                data.as_mut_ptr(),
                4096,
            )
        };
    }
}

impl Region {
    /// Whether ring `dir`'s reader said it is going to sleep (and so needs its bell
    /// rung); clears the flag. For the ring's writer, and for a thread that posted a
    /// request in the lane of `dir` ([`Lane::post_request`]).
    pub fn reader_needs_wake(&self, dir: Direction) -> bool {
        let flag = self.side(dir).reader_waiting;
        flag.load(Ordering::SeqCst) != 0 && flag.swap(0, Ordering::SeqCst) != 0
    }

    /// The page lane that travels with ring `dir` (written by that ring's writer).
    pub fn lane(&self, dir: Direction) -> Lane<'_> {
        PageLane::new(RegionLane {
            region: self,
            at: HEADER + 2 * self.ring_bytes + dir as usize * LANE_BYTES,
        })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference into it outlives
        // `self` (all accessors borrow `self`).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// The control words of one ring.
struct Side<'a> {
    tail: &'a AtomicU64,
    reader_waiting: &'a AtomicU32,
    head: &'a AtomicU64,
    writer_waiting: &'a AtomicU32,
    data: usize,
}

/// The writing end of one ring. Only one `RingWriter` may exist per ring and direction
/// (the transport keeps it behind its link's lock).
pub struct RingWriter {
    region: std::sync::Arc<Region>,
    dir: Direction,
    /// Our own copy of the tail: only we move it.
    tail: u64,
}

impl RingWriter {
    /// The writer of ring `dir` of `region`.
    pub fn new(region: std::sync::Arc<Region>, dir: Direction) -> RingWriter {
        let tail = region.side(dir).tail.load(Ordering::Relaxed);
        RingWriter { region, dir, tail }
    }

    /// Copies as much of `bytes` as fits and commits it; returns how much was taken.
    /// Fails if the reader's index is impossible.
    pub fn write(&mut self, bytes: &[u8]) -> Result<usize, RingError> {
        let side = self.region.side(self.dir);
        let head = side.head.load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        if used > self.region.ring_bytes as u64 {
            return Err(RingError::Corrupt(format!(
                "the reader's index {head} is ahead of what was written ({})",
                self.tail
            )));
        }
        let n = bytes.len().min(self.region.ring_bytes - used as usize);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: `[tail, tail + n)` is free (at most ring_bytes - used bytes past the
        // tail), and we are the ring's only writer.
        unsafe { self.region.copy_in(side.data, self.tail, &bytes[..n]) };
        self.tail += n as u64;
        // The commit: the bytes are visible before the new tail. Sequentially consistent
        // so that the check of `reader_waiting` below cannot be ordered before it.
        side.tail.store(self.tail, Ordering::SeqCst);
        Ok(n)
    }

    /// The ring position after everything committed so far.
    pub fn position(&self) -> u64 {
        self.tail
    }

    /// The page lane that travels with this ring.
    pub fn lane(&self) -> Lane<'_> {
        self.region.lane(self.dir)
    }

    /// Whether the reader said it is going to sleep (and so needs its bell rung); clears
    /// the flag, so one commit rings at most once.
    pub fn reader_needs_wake(&self) -> bool {
        self.region.reader_needs_wake(self.dir)
    }

    /// Announces that the writer is about to wait for space; returns whether there is space
    /// after all (then the caller writes instead of waiting).
    pub fn prepare_wait(&self) -> bool {
        let side = self.region.side(self.dir);
        side.writer_waiting.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let head = side.head.load(Ordering::SeqCst);
        if self.tail.wrapping_sub(head) < self.region.ring_bytes as u64 {
            side.writer_waiting.store(0, Ordering::Relaxed);
            true
        } else {
            false
        }
    }
}

/// The reading end of one ring (one per ring and direction, owned by its reader task).
pub struct RingReader {
    region: std::sync::Arc<Region>,
    dir: Direction,
    /// Our own copy of the head: only we move it.
    head: u64,
}

impl RingReader {
    /// The reader of ring `dir` of `region`.
    pub fn new(region: std::sync::Arc<Region>, dir: Direction) -> RingReader {
        let head = region.side(dir).head.load(Ordering::Relaxed);
        RingReader { region, dir, head }
    }

    fn committed(&self, side: &Side<'_>, order: Ordering) -> Result<usize, RingError> {
        let tail = side.tail.load(order);
        let avail = tail.wrapping_sub(self.head);
        if avail > self.region.ring_bytes as u64 {
            return Err(RingError::Corrupt(format!(
                "the writer's commit index {tail} is not within one ring of the read index {}",
                self.head
            )));
        }
        Ok(avail as usize)
    }

    /// Moves every committed byte (up to `max`) to the end of `out` and frees its space;
    /// returns how many. Fails if the writer's index is impossible.
    pub fn read_into(&mut self, out: &mut Vec<u8>, max: usize) -> Result<usize, RingError> {
        let side = self.region.side(self.dir);
        let n = self.committed(&side, Ordering::Acquire)?.min(max);
        if n == 0 {
            return Ok(0);
        }
        // Copied into the vector's spare room: zeroing it first cost as much as the copy.
        out.reserve(n);
        let at = out.len();
        // SAFETY: `[head, head + n)` is committed (at most tail - head), and we are the
        // ring's only reader; `copy_out` writes all `n` bytes of the spare room, which
        // `reserve` made at least `n` long, so the first `at + n` are initialized.
        unsafe {
            self.region
                .copy_out(side.data, self.head, &mut out.spare_capacity_mut()[..n]);
            out.set_len(at + n);
        }
        self.head += n as u64;
        side.head.store(self.head, Ordering::SeqCst);
        Ok(n)
    }

    /// Whether the writer said it waits for space (and so needs its bell rung); clears the
    /// flag.
    pub fn writer_needs_wake(&self) -> bool {
        let flag = self.region.side(self.dir).writer_waiting;
        flag.load(Ordering::SeqCst) != 0 && flag.swap(0, Ordering::SeqCst) != 0
    }

    /// Announces that the reader is about to sleep; returns whether bytes arrived after all
    /// (then the caller reads instead of sleeping).
    pub fn prepare_wait(&self) -> Result<bool, RingError> {
        let side = self.region.side(self.dir);
        side.reader_waiting.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.committed(&side, Ordering::SeqCst)? > 0 || self.request_ready() {
            side.reader_waiting.store(0, Ordering::Relaxed);
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Withdraws a [`RingReader::prepare_wait`]: commits stop ringing the bell. For a
    /// reader that polls instead of sleeping; it must call `prepare_wait` again before
    /// anyone sleeps on the bell.
    pub fn stop_waiting(&self) {
        self.region
            .side(self.dir)
            .reader_waiting
            .store(0, Ordering::SeqCst);
    }

    /// The ring position after everything read so far.
    pub fn position(&self) -> u64 {
        self.head
    }

    /// The lane that travels with this ring (its request slot is the reader's to take).
    pub fn lane(&self) -> Lane<'_> {
        self.region.lane(self.dir)
    }

    /// Whether the lane holds a request this reader could serve once it has delivered
    /// what it read (its frames up to the request's position are out of the ring).
    fn request_ready(&self) -> bool {
        self.lane()
            .pending_request()
            .is_some_and(|(_, after)| after <= self.head)
    }

    /// Committed bytes not yet read.
    pub fn pending(&self) -> Result<usize, RingError> {
        self.committed(&self.region.side(self.dir), Ordering::Acquire)
    }

    /// Test support: overwrites the ring's commit index as a corrupt peer would.
    #[cfg(test)]
    pub(crate) fn corrupt_tail(&self, tail: u64) {
        self.region
            .side(self.dir)
            .tail
            .store(tail, Ordering::SeqCst);
    }
}

/// Sends `bytes` and the descriptors `fds` in one message on a unix stream socket
/// (`SCM_RIGHTS`): how a region and its bells reach the peer.
pub fn send_fds(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let iov = [IoSlice::new(bytes)];
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let n = sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)?;
    if n != bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short descriptor message",
        ));
    }
    Ok(())
}

/// Receives one message sent by [`send_fds`]: up to `buf.len()` bytes and up to `MAX_FDS`
/// descriptors, which arrive close-on-exec.
pub fn recv_fds(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            for fd in raw {
                // SAFETY: the kernel has just installed this descriptor in our table for
                // this message; nothing else in the process knows or owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "too many descriptors in one message",
        ));
    }
    Ok((msg.bytes, fds))
}

/// Registers an eventfd bell with the current tokio runtime, so a task can await it.
/// Must be called on a runtime with I/O enabled.
pub fn register_bell(bell: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the `AsyncFd` owns the `OwnedFd`, which stays open and names the same file
    // description until the `AsyncFd` drops it; `as_raw_fd` of an `OwnedFd` never changes.
    unsafe { tokio::io::unix::AsyncFd::register(bell) }.map_err(|e| e.into_parts().1)
}

/// Most descriptors [`recv_fds`] accepts in one message.
pub const MAX_FDS: usize = 8;

/// A shared-memory link to one co-located peer: the region and the bells of both
/// directions, seen from this rank.
pub struct ShmLink {
    /// The region holding both rings.
    pub region: std::sync::Arc<Region>,
    /// The ring this rank writes; it reads the other.
    pub send: Direction,
    /// Rung by the peer when it committed bytes for us while we slept.
    pub our_data_bell: OwnedFd,
    /// Rung by the peer when it freed space we wait for.
    pub our_space_bell: OwnedFd,
    /// What we ring when we committed bytes and the peer sleeps.
    pub peer_data_bell: OwnedFd,
    /// What we ring when we freed space the peer waits for.
    pub peer_space_bell: OwnedFd,
}

impl ShmLink {
    /// The ring this rank reads.
    pub fn receive(&self) -> Direction {
        match self.send {
            Direction::Forward => Direction::Backward,
            Direction::Backward => Direction::Forward,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    fn pair(ring: usize) -> (RingWriter, RingReader) {
        let a = Arc::new(Region::create(ring, [7; 32]).unwrap());
        // The other side maps the same file through a second descriptor, as a peer would.
        let fd = a.fd().try_clone().unwrap();
        let b = Arc::new(Region::open(fd).unwrap());
        assert_eq!(b.nonce(), [7; 32]);
        (
            RingWriter::new(a, Direction::Forward),
            RingReader::new(b, Direction::Forward),
        )
    }

    #[test]
    fn a_full_ring_takes_nothing_until_the_reader_frees_space() {
        let (mut w, mut r) = pair(4096);
        assert_eq!(w.write(&[1; 3000]).unwrap(), 3000);
        // Back-pressure: only what fits is taken.
        assert_eq!(w.write(&[2; 3000]).unwrap(), 1096);
        assert_eq!(w.write(&[3; 10]).unwrap(), 0);
        assert!(!w.prepare_wait(), "no space: the writer must wait");
        let mut out = Vec::new();
        assert_eq!(r.read_into(&mut out, 1000).unwrap(), 1000);
        assert!(r.writer_needs_wake(), "the waiting writer is woken once");
        assert!(!r.writer_needs_wake());
        assert!(w.prepare_wait(), "space again");
        // Wrap-around: the next write spans the end of the ring.
        assert_eq!(w.write(&[4; 1000]).unwrap(), 1000);
        r.read_into(&mut out, usize::MAX).unwrap();
        assert_eq!(out.len(), 5096);
        assert!(out[..3000].iter().all(|&b| b == 1));
        assert!(out[3000..4096].iter().all(|&b| b == 2));
        assert!(out[4096..].iter().all(|&b| b == 4));
    }

    #[test]
    fn a_sleeping_reader_is_woken_by_the_next_commit_only() {
        let (mut w, mut r) = pair(4096);
        assert!(!r.prepare_wait().unwrap());
        w.write(b"abc").unwrap();
        assert!(w.reader_needs_wake());
        w.write(b"def").unwrap();
        assert!(!w.reader_needs_wake(), "one bell per sleep");
        // Bytes already there: the reader does not sleep.
        assert!(r.prepare_wait().unwrap());
        let mut out = Vec::new();
        r.read_into(&mut out, usize::MAX).unwrap();
        assert_eq!(out, b"abcdef");
    }

    #[test]
    fn impossible_indices_are_reported_not_followed() {
        let (_w, mut r) = pair(4096);
        r.corrupt_tail(1 << 40);
        let err = r.read_into(&mut Vec::new(), usize::MAX).unwrap_err();
        assert!(err.to_string().contains("corrupt"), "{err}");
    }

    #[test]
    fn an_unsealed_or_foreign_file_is_refused() {
        let fd = memfd_create(c"x", MemFdCreateFlag::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&fd, (HEADER + 8192) as i64).unwrap();
        let err = Region::open(fd).err().expect("unsealed").to_string();
        assert!(err.contains("sealed"), "{err}");
        let fd = memfd_create(c"x", MemFdCreateFlag::MFD_ALLOW_SEALING).unwrap();
        nix::unistd::ftruncate(&fd, (HEADER + 8192 + 2 * LANE_BYTES) as i64).unwrap();
        fcntl(fd.as_raw_fd(), FcntlArg::F_ADD_SEALS(SEALS)).unwrap();
        let err = Region::open(fd).err().expect("no magic").to_string();
        assert!(err.contains("magic"), "{err}");
    }

    #[test]
    fn a_lane_holds_one_page_at_a_time_for_one_taker() {
        let region = Region::create(4096, [0; 32]).unwrap();
        let (home, back) = (
            region.lane(Direction::Forward),
            region.lane(Direction::Backward),
        );
        let page: Vec<u8> = (0..4096).map(|i| (i * 7) as u8).collect();
        assert_eq!(home.state(), LaneState::Empty);
        assert_eq!(home.full(), None);
        assert!(home.publish(at(9, 1234, 1200), &[5 << 32 | 2, 1 << 32 | 7], &page));
        assert_eq!(home.full(), Some(at(9, 1234, 1200)));
        assert_eq!(
            back.state(),
            LaneState::Empty,
            "each direction has its own lane"
        );
        assert!(
            !home.publish(at(10, 0, 0), &[], &page),
            "a full lane takes nothing more"
        );
        let too_many = vec![0; LANE_APPLIED_MAX + 1];
        assert!(
            !back.publish(at(1, 0, 0), &too_many, &page),
            "too many entries for a lane"
        );
        assert_eq!(back.state(), LaneState::Empty);

        assert!(home.take());
        assert!(!home.take(), "one taker");
        assert_eq!(home.state(), LaneState::Taken);
        home.put_back();
        assert!(home.take(), "given back, taken again");
        let mut applied = [0u64; LANE_APPLIED_MAX];
        let mut data = vec![0u8; 4096];
        assert_eq!(home.copy_out(&mut applied, &mut data), (9, 2));
        assert_eq!(&applied[..2], &[5 << 32 | 2, 1 << 32 | 7]);
        assert_eq!(data, page);
        assert!(!home.publish(at(11, 0, 0), &[], &page), "still taken");
        home.release();
        assert!(home.publish(at(11, 0, 0), &[], &page), "empty again");

        // The peer's mapping of the same file sees the same lane.
        let peer = Region::open(region.fd().try_clone().unwrap()).unwrap();
        assert_eq!(peer.lane(Direction::Forward).full(), Some(at(11, 0, 0)));
    }

    fn at(page: u64, after: u64, needs: u64) -> LanePosition {
        LanePosition { page, after, needs }
    }

    #[test]
    fn a_request_in_the_lane_waits_for_the_frames_sent_before_it() {
        let region = std::sync::Arc::new(Region::create(4096, [0; 32]).unwrap());
        let (mut writer, mut reader) = (
            RingWriter::new(region.clone(), Direction::Forward),
            RingReader::new(region.clone(), Direction::Forward),
        );
        let peer = Region::open(region.fd().try_clone().unwrap()).unwrap();
        assert_eq!(writer.write(b"frame").unwrap(), 5);
        // The requester posts behind the frame it sent.
        let lane = peer.lane(Direction::Forward);
        assert!(lane.post_request(42, writer.position()));
        assert!(!lane.post_request(43, 0), "one request at a time");
        assert_eq!(reader.lane().pending_request(), Some((42, 5)));
        assert!(!reader.request_ready(), "its frame is still in the ring");
        let mut buf = Vec::new();
        reader.read_into(&mut buf, 64).unwrap();
        assert!(reader.request_ready());
        assert!(
            reader.prepare_wait().unwrap(),
            "a ready request keeps it awake"
        );
        reader.stop_waiting();
        assert!(!reader.lane().take_request(41), "only the pending page");
        assert!(reader.lane().take_request(42));
        assert_eq!(reader.lane().pending_request(), None);
        assert!(!reader.prepare_wait().unwrap(), "nothing left: it sleeps");
        assert!(lane.post_request(43, 5), "the slot is free again");
        assert!(
            peer.reader_needs_wake(Direction::Forward),
            "the reader announced its sleep: the requester rings"
        );
        assert!(!peer.reader_needs_wake(Direction::Forward), "once");
        assert_eq!(
            region.lane(Direction::Backward).pending_request(),
            None,
            "each direction has its own slot"
        );
    }

    #[test]
    fn a_torn_write_is_never_visible_before_its_commit() {
        // Two threads, a small ring: every byte read is a byte written, in order.
        let (mut w, mut r) = pair(4096);
        let total = 1 << 20;
        let writer = std::thread::spawn(move || {
            let mut sent = 0usize;
            while sent < total {
                let chunk: Vec<u8> = (sent..(sent + 777).min(total)).map(|i| i as u8).collect();
                let mut off = 0;
                while off < chunk.len() {
                    off += w.write(&chunk[off..]).unwrap();
                    std::hint::spin_loop();
                }
                sent += chunk.len();
            }
        });
        let mut out = Vec::with_capacity(total);
        while out.len() < total {
            r.read_into(&mut out, 1000).unwrap();
        }
        writer.join().unwrap();
        assert!(out.iter().enumerate().all(|(i, &b)| b == i as u8));
    }

    proptest! {
        #[test]
        fn bytes_come_out_in_order_whatever_the_chunking(
            chunks in proptest::collection::vec(1usize..3000, 1..40),
            reads in proptest::collection::vec(1usize..5000, 1..40),
        ) {
            let (mut w, mut r) = pair(4096);
            let mut written = Vec::new();
            let mut out = Vec::new();
            let mut next = 0u8;
            let mut reads = reads.into_iter().cycle();
            for len in chunks {
                let chunk: Vec<u8> = (0..len).map(|_| { next = next.wrapping_add(1); next }).collect();
                let mut off = 0;
                while off < chunk.len() {
                    let n = w.write(&chunk[off..]).unwrap();
                    written.extend_from_slice(&chunk[off..off + n]);
                    off += n;
                    r.read_into(&mut out, reads.next().unwrap()).unwrap();
                }
            }
            r.read_into(&mut out, usize::MAX).unwrap();
            prop_assert_eq!(out, written);
        }
    }
}
