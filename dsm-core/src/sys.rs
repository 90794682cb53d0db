//! Every `unsafe` operation of dsm lives here: mapping the shared segment (one memfd, this
//! process's own or the job's common one, mapped twice: the app view at a fixed address
//! whose page protections drive the protocol, and an always-writable runtime view the comm
//! thread uses), committing a common segment's new pages (`madvise`), the locks of a common
//! segment (atomics and futexes on a table in the shared file, [`HostLock`]), `mprotect`, raw element loads and
//! stores through the app view, the SIGSEGV handler with its alternate stack, and the
//! fault mailbox (socket pair + futex) through which the handler hands a fault to the comm
//! thread and waits.
//!
//! The signal handler is async-signal-safe: it reads and writes atomics, copies a page into
//! a preallocated twin slot or from a page lane or a reply frame (parsed in place on its
//! stack) into the runtime view, calls `mprotect(2)`, `madvise(2)`, `write(2)`, `send(2)`,
//! `recv(2)`, `poll(2)`, `futex(2)`, `sigaction(2)`, `sched_yield(2)`, `clock_gettime(2)`
//! and `abort(3)`, and nothing else. It never allocates, logs or waits for a lock (a TCP
//! link's send lock and its incoming bytes it only tries). A write fault on a page the
//! engine armed is served in the handler itself ([`crate::engine::fast`]); a read fault on
//! a page armed for a fetch asks the home itself and takes the page from the home's lane or
//! out of its socket; every other fault goes to the comm thread.
#![deny(unsafe_op_in_unsafe_fn)]

use std::cell::Cell;
use std::io;
use std::os::fd::{IntoRawFd, OwnedFd};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::{Arc, OnceLock};

use crate::engine::{FastFaults, Prot};
use dsm_net::framing::{
    page_request_frame, plain_page_reply, PAGE_REQUEST_FRAME_MAX, PLAIN_REPLY_FRAME_MAX,
};
use dsm_net::transport::LaneEnd;
use dsm_net::{DirectSend, DirectSender, DirectTake};
use dsm_proto::PAGE_SIZE;

fn prot_bits(prot: Prot) -> libc::c_int {
    {
        match prot {
            Prot::None => libc::PROT_NONE,
            Prot::Read => libc::PROT_READ,
            Prot::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        }
    }
}

fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// The shared segment: `len` bytes backed by a memfd, mapped at `app_base` (same address on
/// every node) and at a private runtime address.
pub(crate) struct Segment {
    app_base: usize,
    runtime_base: usize,
    len: usize,
    memfd: libc::c_int,
    /// Address of the host lock table (see [`HostLock`]) in a common segment file, 0 for a
    /// segment of this process's own. The locks' release clocks follow it in the same
    /// mapping.
    host_locks: usize,
    /// Ranks of the job: entries of each lock's release clock.
    nodes: usize,
}

// SAFETY-relevant invariant for the Send/Sync impls: the segment only holds addresses and a
// file descriptor; all access goes through methods whose contracts are documented below.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Segment {
    /// Reserves the segment at `addr` (never replacing an existing mapping) and the runtime
    /// view anywhere. Pages start inaccessible in the app view and are committed lazily.
    /// `common`: the job's common segment file (every rank maps the same one), sized here
    /// to `len` (every rank sizes it alike, so whoever comes last changes nothing); without
    /// it the segment is a memfd of this process's own.
    /// A common file also holds, after the segment, the table of host locks
    /// ([`HOST_LOCK_BYTES`]) and their release clocks (`nodes` entries per lock, see
    /// [`HostLock::released_clock`]), which cost memory only where a lock is released in
    /// race mode.
    pub(crate) fn map(
        addr: usize,
        len: usize,
        common: Option<OwnedFd>,
        nodes: usize,
    ) -> io::Result<Segment> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page != PAGE_SIZE as libc::c_long {
            return Err(io::Error::other(format!(
                "dsm needs 4 KiB pages; this system uses {page}-byte pages"
            )));
        }
        if len == 0 || !len.is_multiple_of(PAGE_SIZE) || !addr.is_multiple_of(PAGE_SIZE) {
            return Err(io::Error::other(
                "segment address and size must be page-aligned",
            ));
        }
        let is_common = common.is_some();
        let table_len = host_table_bytes(nodes);
        let file_len = if is_common { len + table_len } else { len };
        let memfd = match common {
            Some(file) => file.into_raw_fd(),
            // SAFETY: the name is a valid NUL-terminated string.
            None => unsafe { libc::memfd_create(c"dsm-segment".as_ptr(), libc::MFD_CLOEXEC) },
        };
        if memfd < 0 {
            return Err(os_err("memfd_create"));
        }
        let fail = |what: &str| {
            let e = os_err(what);
            // SAFETY: memfd is a descriptor we own and have not shared.
            unsafe { libc::close(memfd) };
            e
        };
        // SAFETY: ftruncate on our own descriptor.
        if unsafe { libc::ftruncate(memfd, file_len as libc::off_t) } != 0 {
            return Err(fail(&format!(
                "cannot size the segment's memfd to {} MiB (use a smaller dsmrun \
                 --segment or DSM_SEGMENT)",
                len >> 20
            )));
        }
        // SAFETY: MAP_FIXED_NOREPLACE never clobbers an existing mapping; we check below
        // that the kernel honoured the address.
        let app = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_NONE,
                libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE | libc::MAP_NORESERVE,
                memfd,
                0,
            )
        };
        if app == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            // SAFETY: as above.
            unsafe { libc::close(memfd) };
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "cannot reserve the shared segment at {addr:#x} ({} MiB): {e}; \
                     set DSM_SEGMENT_ADDR to a free address range or use a smaller segment \
                     (dsmrun --segment, DSM_SEGMENT)",
                    len >> 20
                ),
            ));
        }
        if app as usize != addr {
            // Kernels before 4.17 ignore MAP_FIXED_NOREPLACE and may place it elsewhere.
            // SAFETY: unmapping the mapping we just created.
            unsafe { libc::munmap(app, len) };
            return Err(fail(
                "the kernel placed the shared segment at another address",
            ));
        }
        // SAFETY: a fresh shared mapping of our memfd at a kernel-chosen address.
        let runtime = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                memfd,
                0,
            )
        };
        if runtime == libc::MAP_FAILED {
            // SAFETY: unmapping the app view we created above.
            unsafe { libc::munmap(app, len) };
            return Err(fail(&format!(
                "cannot map the runtime view of the {} MiB segment (use a smaller dsmrun \
                 --segment or DSM_SEGMENT, or raise ulimit -v)",
                len >> 20
            )));
        }
        let host_locks = if is_common {
            // SAFETY: a fresh shared mapping of the table part of our descriptor (offset
            // `len`, page-aligned) at a kernel-chosen address.
            let table = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    table_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    memfd,
                    len as libc::off_t,
                )
            };
            if table == libc::MAP_FAILED {
                // SAFETY: unmapping the two views we created above.
                unsafe {
                    libc::munmap(app, len);
                    libc::munmap(runtime, len);
                }
                return Err(fail("cannot map the host lock table"));
            }
            // Every lock's first use would otherwise fault its table page in. Failing
            // (a kernel before 5.14) only leaves that to the first use. The clocks after
            // the table stay lazy: most runs never write one.
            // SAFETY: populating the table mapping we just made changes no byte of it.
            unsafe { libc::madvise(table, HOST_LOCK_BYTES, libc::MADV_POPULATE_WRITE) };
            table as usize
        } else {
            0
        };
        Ok(Segment {
            app_base: addr,
            runtime_base: runtime as usize,
            len,
            memfd,
            host_locks,
            nodes,
        })
    }

    /// The host lock in slot `index` (below [`HOST_LOCK_SLOTS`]) with its release clock.
    fn host_lock_at(&'static self, index: usize) -> HostLock {
        debug_assert!(index < HOST_LOCK_SLOTS && self.host_locks != 0);
        // SAFETY: the table mapping (`host_table_bytes(nodes)` long, page-aligned, shared,
        // unmapped only when the segment is dropped, which a `&'static` one never is:
        // `start` leaks it, so both may be borrowed for 'static) holds HOST_LOCK_SLOTS slots of 32
        // bytes and then HOST_LOCK_SLOTS clocks of `nodes` u32s; `index` is below
        // HOST_LOCK_SLOTS, so both lie inside it, aligned. All-zero bytes are valid
        // atomics, and other processes touch these bytes only through the same atomics.
        unsafe {
            let slot = &*((self.host_locks as *const HostLockSlot).add(index));
            let clocks = (self.host_locks + HOST_LOCK_BYTES) as *const AtomicU32;
            let clock = std::slice::from_raw_parts(clocks.add(index * self.nodes), self.nodes);
            HostLock { slot, clock }
        }
    }

    /// The host lock of lock `id` (see [`HostLock`]), made on first use by whichever rank
    /// comes first; `None` without a common segment, or when the [`HOST_LOCK_PROBES`]
    /// slots from the id's hash on are all taken by other ids (the table holds 65,536),
    /// in which case every rank finds them so alike and the lock goes through the
    /// protocol.
    pub(crate) fn host_lock(&'static self, id: u64) -> Option<HostLock> {
        if self.host_locks == 0 {
            return None;
        }
        // Fibonacci hashing spreads consecutive ids (one lock per molecule) over the table.
        let start = (id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48) as usize;
        for probe in 0..HOST_LOCK_PROBES {
            let lock = self.host_lock_at((start + probe) % HOST_LOCK_SLOTS);
            let slot = lock.slot;
            loop {
                match slot.tag.load(Ordering::Acquire) {
                    LOCK_SLOT_READY => {
                        if slot.key.load(Ordering::Relaxed) == id {
                            return Some(lock);
                        }
                        break;
                    }
                    LOCK_SLOT_EMPTY => {
                        if slot
                            .tag
                            .compare_exchange(
                                LOCK_SLOT_EMPTY,
                                LOCK_SLOT_WRITING,
                                Ordering::Acquire,
                                Ordering::Relaxed,
                            )
                            .is_ok()
                        {
                            slot.key.store(id, Ordering::Relaxed);
                            slot.tag.store(LOCK_SLOT_READY, Ordering::Release);
                            return Some(lock);
                        }
                    }
                    // Another rank is writing this slot's key: a few instructions,
                    // unless it lost its core in between.
                    _ => {
                        // SAFETY: sched_yield has no arguments.
                        unsafe { libc::sched_yield() };
                    }
                }
            }
        }
        None
    }

    pub(crate) fn app_base(&self) -> usize {
        self.app_base
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn pages(&self) -> usize {
        self.len / PAGE_SIZE
    }

    fn check_pages(&self, first: usize, count: usize) {
        assert!(
            first.checked_add(count).is_some_and(|e| e <= self.pages()),
            "page range {first}+{count} outside the segment"
        );
    }

    /// Sets the app view's protection of `count` pages from `first`.
    pub(crate) fn protect(&self, first: usize, count: usize, prot: Prot) -> io::Result<()> {
        self.check_pages(first, count);
        // SAFETY: the range lies inside our app-view mapping (checked above); changing its
        // protection cannot invalidate Rust references because app code only reaches the
        // app view through raw-pointer accessors in this module.
        let rc = unsafe {
            libc::mprotect(
                (self.app_base + first * PAGE_SIZE) as *mut libc::c_void,
                count * PAGE_SIZE,
                prot_bits(prot),
            )
        };
        if rc != 0 {
            return Err(os_err("mprotect"));
        }
        Ok(())
    }

    /// Commits `count` pages from `first` and maps them writable in the app view, as a
    /// write to each would (`MADV_POPULATE_WRITE`, Linux 5.14): in a common segment, so
    /// that no rank takes a first-touch fault per page later. The pages must be writable
    /// in the app view. Contents are unchanged.
    pub(crate) fn populate(&self, first: usize, count: usize) -> io::Result<()> {
        self.check_pages(first, count);
        // SAFETY: the range lies inside our app-view mapping (checked above); populating
        // changes no byte of it, only which pages the kernel has mapped.
        let rc = unsafe {
            libc::madvise(
                (self.app_base + first * PAGE_SIZE) as *mut libc::c_void,
                count * PAGE_SIZE,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc != 0 {
            return Err(os_err("madvise(MADV_POPULATE_WRITE)"));
        }
        Ok(())
    }

    /// Copies a page out of the runtime view.
    pub(crate) fn read_page(&self, page: usize, out: &mut [u8]) {
        self.check_pages(page, 1);
        assert_eq!(out.len(), PAGE_SIZE);
        // SAFETY: source is one page inside the runtime mapping, destination is a distinct
        // buffer of the same size. Concurrent app writes to the same page are excluded by the
        // protocol (the page is read-protected in the app view before it is copied).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.runtime_base + page * PAGE_SIZE) as *const u8,
                out.as_mut_ptr(),
                PAGE_SIZE,
            )
        }
    }

    /// Copies `data` into the runtime view at byte `offset` of `page`.
    pub(crate) fn write_bytes(&self, page: usize, offset: usize, data: &[u8]) {
        self.check_pages(page, 1);
        assert!(offset + data.len() <= PAGE_SIZE, "write past the page end");
        // SAFETY: the destination range is inside one page of the runtime mapping. The app
        // may concurrently touch *other* bytes of this page (multi-writer false sharing);
        // only the given bytes are written.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.runtime_base + page * PAGE_SIZE + offset) as *mut u8,
                data.len(),
            )
        }
    }

    /// Runs `f` on a page of the runtime view, without copying it.
    ///
    /// # Safety
    ///
    /// Nothing may write the page while `f` runs: no app thread through the app view (the
    /// page is read-only or inaccessible there, or the only app thread is the caller) and
    /// no other runtime thread through this view. A concurrent write would be a data race
    /// on the bytes `f` reads.
    pub(crate) unsafe fn with_page<R>(&self, page: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        self.check_pages(page, 1);
        // SAFETY: one page inside the runtime mapping; no writer during `f` by the caller's
        // contract, and the slice does not escape `f`.
        let slice = unsafe {
            std::slice::from_raw_parts(
                (self.runtime_base + page * PAGE_SIZE) as *const u8,
                PAGE_SIZE,
            )
        };
        f(slice)
    }

    /// The diff of a page against its twin (see [`crate::diff::create`]).
    ///
    /// The protocol engine asks for it only when it closes an interval, after it has made
    /// the page read-only in the app view (`close_interval` protects the dirty pages before
    /// diffing them), so no app write can land while the page is read; the runtime view is
    /// written only by the thread holding the engine, which is the caller.
    pub(crate) fn diff_against(&self, page: usize, twin: &[u8]) -> Vec<u8> {
        // SAFETY: per the above, nothing writes the page while it is diffed.
        unsafe { self.with_page(page, |cur| crate::diff::create(twin, cur)) }
    }
}

/// Slots of the host lock table: distinct lock ids a common segment serves in memory.
const HOST_LOCK_SLOTS: usize = 1 << 16;

/// Slots an id may occupy, from its hash on: an id with no free slot among them goes
/// through the protocol. Slots are never freed, so every rank reaches the same verdict
/// for an id, and a nearly full table costs a lookup at most this many loads.
const HOST_LOCK_PROBES: usize = 64;

/// Bytes of the host lock table at the end of a common segment file (2 MiB).
pub(crate) const HOST_LOCK_BYTES: usize = HOST_LOCK_SLOTS * std::mem::size_of::<HostLockSlot>();

/// Bytes of the host lock table and, after it, the locks' release clocks (one `u32` per
/// rank per slot), rounded up to whole pages.
fn host_table_bytes(nodes: usize) -> usize {
    (HOST_LOCK_BYTES + HOST_LOCK_SLOTS * nodes * 4).next_multiple_of(PAGE_SIZE)
}

const LOCK_SLOT_EMPTY: u32 = 0;
const LOCK_SLOT_WRITING: u32 = 1;
const LOCK_SLOT_READY: u32 = 2;

/// One entry of the host lock table: which lock (`key`, valid once `tag` is ready) and its
/// ticket lock (`next` ticket to hand out, ticket `serving`, `sleepers` on the futex).
#[repr(C, align(32))]
struct HostLockSlot {
    tag: AtomicU32,
    next: AtomicU32,
    serving: AtomicU32,
    sleepers: AtomicU32,
    key: AtomicU64,
}

/// A lock of a job whose ranks map one common segment, kept in that memory: a ticket lock
/// shared by the ranks' processes. Taking a free one is one atomic add and one load, with
/// no message; ranks get the lock in the order they asked for it (first come, first
/// served, as the protocol's locks), so a rank polling a flag under a lock cannot keep
/// taking it back from a rank waiting for its turn. A waiter polls for the spin budget
/// (yielding its core), then sleeps on the `serving` word (`FUTEX_WAIT_BITSET` with a bit
/// of its ticket, so a release wakes only the waiters whose turn may have come). Release
/// and acquire orderings on `serving` order the holder's writes before the next holder's
/// reads, which is all the memory needs: it is common. A rank that dies holding one leaves
/// it held; the others then stop when their comm threads notice the death (the peer-lost
/// status), as for any lost peer.
#[derive(Clone, Copy)]
pub(crate) struct HostLock {
    slot: &'static HostLockSlot,
    /// What the lock's last releaser knew (its vector time, one entry per rank), written
    /// by the holder before it releases and read by the next holder after it acquires:
    /// the ticket lock orders both, so relaxed accesses suffice. Race detection joins it
    /// on acquire, as a protocol grant carries the releaser's knowledge; all zeros until
    /// the first release in race mode.
    clock: &'static [AtomicU32],
}

impl HostLock {
    /// The vector time the lock's last releaser stored ([`HostLock::set_released_clock`]),
    /// all zeros if none did. Call while holding the lock.
    pub(crate) fn released_clock(self) -> Vec<u32> {
        self.clock
            .iter()
            .map(|e| e.load(Ordering::Relaxed))
            .collect()
    }

    /// Stores what this rank knows as it releases the lock (one entry per rank). Call
    /// while holding the lock, before [`HostLock::unlock`].
    pub(crate) fn set_released_clock(self, known: &[u32]) {
        for (e, &v) in self.clock.iter().zip(known) {
            e.store(v, Ordering::Relaxed);
        }
    }

    /// Takes the lock, polling for `spin_ns` before sleeping.
    pub(crate) fn lock(self, spin_ns: u64) {
        let s = self.slot;
        let ticket = s.next.fetch_add(1, Ordering::Relaxed);
        if s.serving.load(Ordering::Acquire) == ticket {
            return;
        }
        if spin_ns > 0 {
            let from = monotonic_ns();
            while monotonic_ns().wrapping_sub(from) < spin_ns {
                // SAFETY: sched_yield has no arguments.
                unsafe { libc::sched_yield() };
                if s.serving.load(Ordering::Acquire) == ticket {
                    return;
                }
            }
        }
        loop {
            // Announce the sleep before the last look (both sequentially consistent, as
            // the release's add and its look at `sleepers`), so a release either sees the
            // sleeper or happened before that look.
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            let seen = s.serving.load(Ordering::SeqCst);
            if seen != ticket {
                futex(
                    &s.serving,
                    libc::FUTEX_WAIT_BITSET,
                    seen,
                    ticket_bit(ticket),
                );
            }
            s.sleepers.fetch_sub(1, Ordering::Relaxed);
            if s.serving.load(Ordering::Acquire) == ticket {
                return;
            }
        }
    }

    /// Releases the lock to the next ticket, waking its holder if it sleeps.
    pub(crate) fn unlock(self) {
        let s = self.slot;
        let next = s.serving.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            futex(
                &s.serving,
                libc::FUTEX_WAKE_BITSET,
                i32::MAX as u32,
                ticket_bit(next),
            );
        }
    }
}

/// The futex bitset bit of a ticket: a release wakes the sleepers of one bit, among them
/// the one whose turn it is.
fn ticket_bit(ticket: u32) -> u32 {
    1 << (ticket % 32)
}

/// One futex operation, without timeout: `FUTEX_WAIT[_BITSET]` (`val`: the value
/// expected) or `FUTEX_WAKE[_BITSET]` (`val`: how many); `bitset` is ignored by the plain
/// operations. Without `FUTEX_PRIVATE_FLAG` in `op` it works on a word other processes map
/// too. A raw system call: async-signal-safe.
fn futex(word: &AtomicU32, op: libc::c_int, val: u32, bitset: u32) {
    // SAFETY: a futex operation on a valid, aligned u32 that stays mapped for the call;
    // no timeout, no second word (these operations do not use one).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            val,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            bitset,
        );
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmapping our two mappings and closing our descriptor. Callers drop the
        // segment only after the app has stopped using shared memory (Dsm::finish).
        unsafe {
            libc::munmap(self.app_base as *mut libc::c_void, self.len);
            libc::munmap(self.runtime_base as *mut libc::c_void, self.len);
            if self.host_locks != 0 {
                libc::munmap(
                    self.host_locks as *mut libc::c_void,
                    host_table_bytes(self.nodes),
                );
            }
            libc::close(self.memfd);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Element access through the app view. These are the only places app data is read or
// written. The segment is mapped once per process and never unmapped, so every address a
// checked `AppSlice` holds stays valid memory for the life of the process; touching a page
// the protocol has protected faults and is resolved by the handler.

/// Elements at a fixed stride inside a checked window: element `k < count` lies at
/// `addr + k * stride`, and that product cannot overflow because the whole span was checked
/// to fit in the segment when the value was made.
#[derive(Debug)]
pub(crate) struct AppStrided<T> {
    addr: usize,
    stride: usize,
    count: usize,
    _t: std::marker::PhantomData<*const T>,
}

impl<T> Clone for AppStrided<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for AppStrided<T> {}

impl<T: bytemuck::Pod> AppStrided<T> {
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    #[inline(always)]
    #[track_caller]
    pub(crate) fn get(&self, k: usize) -> T {
        if k >= self.count {
            out_of_bounds(k, self.count);
        }
        // SAFETY: k < count, and the span of count elements was checked to lie inside the
        // (never unmapped) segment, aligned for T.
        unsafe { std::ptr::read((self.addr + k.wrapping_mul(self.stride)) as *const T) }
    }

    #[inline(always)]
    #[track_caller]
    pub(crate) fn set(&self, k: usize, value: T) {
        if k >= self.count {
            out_of_bounds(k, self.count);
        }
        // SAFETY: as in `get`.
        unsafe { std::ptr::write((self.addr + k.wrapping_mul(self.stride)) as *mut T, value) }
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn out_of_bounds(i: usize, len: usize) -> ! {
    panic!("index {i} out of bounds (len {len})")
}

static GLOBAL_SEGMENT: OnceLock<&'static Segment> = OnceLock::new();

/// Records the process's segment (there is one per process, mapped for its lifetime).
fn set_global_segment(seg: &'static Segment) {
    let _ = GLOBAL_SEGMENT.set(seg);
}

/// A typed, bounds-checked window onto the app view of the segment.
#[derive(Debug)]
pub(crate) struct AppSlice<T> {
    addr: usize,
    len: usize,
    /// Not Send/Sync: shared memory is accessed from the app thread.
    _t: std::marker::PhantomData<*const T>,
}

impl<T> Clone for AppSlice<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for AppSlice<T> {}

impl<T: bytemuck::Pod> AppSlice<T> {
    /// A window of `len` elements at byte `offset` of the app view, or `None` if it does
    /// not lie inside the segment or is misaligned for `T`.
    pub(crate) fn new(seg: &'static Segment, offset: usize, len: usize) -> Option<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?;
        let end = offset.checked_add(bytes)?;
        let addr = seg.app_base + offset;
        if end > seg.len || !addr.is_multiple_of(std::mem::align_of::<T>()) {
            return None;
        }
        Some(AppSlice {
            addr,
            len,
            _t: std::marker::PhantomData,
        })
    }

    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of element `i` (not checked).
    #[inline(always)]
    pub(crate) fn addr_of(&self, i: usize) -> usize {
        self.addr + i * std::mem::size_of::<T>()
    }

    /// A sub-window of `len` elements from element `start`.
    #[track_caller]
    pub(crate) fn sub(&self, start: usize, len: usize) -> Self {
        assert!(
            start.checked_add(len).is_some_and(|e| e <= self.len),
            "range {start}+{len} out of bounds (len {})",
            self.len
        );
        AppSlice {
            addr: self.addr_of(start),
            len,
            _t: std::marker::PhantomData,
        }
    }

    #[inline(always)]
    #[track_caller]
    pub(crate) fn get(&self, i: usize) -> T {
        if i >= self.len {
            out_of_bounds(i, self.len);
        }
        // SAFETY: in bounds of a window checked to lie inside the (never unmapped) segment
        // and aligned for T; any bit pattern is a valid Pod.
        unsafe { std::ptr::read(self.addr_of(i) as *const T) }
    }

    #[inline(always)]
    #[track_caller]
    pub(crate) fn set(&self, i: usize, value: T) {
        if i >= self.len {
            out_of_bounds(i, self.len);
        }
        // SAFETY: as in `get`; no Rust reference to shared memory exists to be invalidated.
        unsafe { std::ptr::write(self.addr_of(i) as *mut T, value) }
    }

    /// A window into the segment of the running node (see [`set_global_segment`]), for
    /// tools and tests that address segment memory outside the typed API.
    pub(crate) fn new_in_global_segment(offset: usize, len: usize) -> Option<Self> {
        Self::new(GLOBAL_SEGMENT.get()?, offset, len)
    }

    /// `count` elements `step` apart from element `start`, checked to lie in the window.
    #[inline(always)]
    #[track_caller]
    pub(crate) fn strided(&self, start: usize, step: usize, count: usize) -> AppStrided<T> {
        assert!(step > 0, "stride must be positive");
        if count > 0 {
            let last = (count - 1)
                .checked_mul(step)
                .and_then(|x| x.checked_add(start));
            assert!(
                last.is_some_and(|l| l < self.len),
                "strided range {start}+{step}*{count} out of bounds (len {})",
                self.len
            );
        }
        AppStrided {
            addr: self.addr_of(start.min(self.len)),
            stride: step * std::mem::size_of::<T>(),
            count,
            _t: std::marker::PhantomData,
        }
    }

    /// Copies `out.len()` elements starting at `start` into `out`.
    pub(crate) fn read_into(&self, start: usize, out: &mut [T]) {
        assert!(
            start.checked_add(out.len()).is_some_and(|e| e <= self.len),
            "range {start}+{} out of bounds (len {})",
            out.len(),
            self.len
        );
        // SAFETY: source range checked inside the window; destination is a distinct local
        // buffer of the same length.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.addr_of(start) as *const T,
                out.as_mut_ptr(),
                out.len(),
            )
        }
    }

    /// Copies `src` into the window starting at `start`.
    pub(crate) fn write_from(&self, start: usize, src: &[T]) {
        assert!(
            start.checked_add(src.len()).is_some_and(|e| e <= self.len),
            "range {start}+{} out of bounds (len {})",
            src.len(),
            self.len
        );
        // SAFETY: destination range checked inside the window; the source is a distinct
        // local slice.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.addr_of(start) as *mut T, src.len())
        }
    }
}

// ---------------------------------------------------------------------------------------
// Fault mailbox: the handler publishes a fault, kicks the comm thread through a socket
// and sleeps on a futex until the comm thread posts the outcome.

const SLOT_IDLE: u32 = 0;
const SLOT_CLAIMED: u32 = 1;
const SLOT_PENDING: u32 = 2;
const SLOT_TAKEN: u32 = 3;
const SLOT_RESOLVED: u32 = 4;
const SLOT_CRASH: u32 = 5;
/// The handler asked a co-located home for the page itself (see [`ask_lane_home`]) and
/// polls its lane; the comm thread leaves the slot alone unless a reply to that request
/// reaches it first (it then resolves the fault) or the handler hands the wait over
/// (`SLOT_PENDING`).
const SLOT_ASKED: u32 = 6;

static SEG_START: AtomicUsize = AtomicUsize::new(0);
static SEG_END: AtomicUsize = AtomicUsize::new(0);
/// Write end of the socket pair that wakes the comm thread (-1: no DSM running).
static FAULT_KICK_FD: AtomicI32 = AtomicI32::new(-1);
static SLOT_STATE: AtomicU32 = AtomicU32::new(SLOT_IDLE);
/// Threads asleep (or about to sleep) on [`SLOT_STATE`]'s futex. A change of the state
/// makes the `futex` wake system call only when there is one: a parked fault normally
/// polls, and the wake-up would cost the comm thread a system call per fault for nothing.
static SLOT_SLEEPERS: AtomicU32 = AtomicU32::new(0);
/// Set while the comm thread polls the slot for the next fault (`FaultMailbox::watch`):
/// the handler then skips the kick, a system call on the faulting thread's path that would
/// also wake the comm thread's runtime later for a fault already taken.
static COMM_WATCHING: AtomicBool = AtomicBool::new(false);
static SLOT_ADDR: AtomicUsize = AtomicUsize::new(0);
/// 0 = read, 1 = write, 2 = unknown (architecture does not tell).
static SLOT_KIND: AtomicU32 = AtomicU32::new(0);
static HANDLER_INSTALLED: AtomicBool = AtomicBool::new(false);
/// Base of the segment's runtime view, where the handler copies twins from.
static RUNTIME_BASE: AtomicUsize = AtomicUsize::new(0);
/// The state shared with the engine for write faults served in the handler; unset when
/// the fast path is off (`DSM_FAST_FAULTS=0`). Each value comes from `Arc::into_raw` and is
/// never released, so the handler may use whatever pointer it loads for the life of the
/// process, even if a later `Dsm::init` in the same process replaces it.
static FAST: AtomicPtr<FastFaults> = AtomicPtr::new(std::ptr::null_mut());

thread_local! {
    /// Set while this thread holds the protocol engine's lock. A fault in the segment
    /// then can never be served (the comm thread needs the lock, and the handler's fast
    /// path relies on the engine not being mid-step on this thread), so the handler stops
    /// the process with a clear message instead of deadlocking. Const-initialized and
    /// without a destructor, so reading it in the handler is a plain TLS load.
    static IN_ENGINE: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as holding the engine lock for as long as it lives (see
/// [`IN_ENGINE`]).
pub(crate) struct InEngine(());

impl InEngine {
    pub(crate) fn enter() -> InEngine {
        IN_ENGINE.set(true);
        InEngine(())
    }
}

impl Drop for InEngine {
    fn drop(&mut self) {
        IN_ENGINE.set(false);
    }
}

/// Lets the handler serve write faults on the pages the engine arms in `fast`, or, with
/// `None`, sends every fault to the comm thread. Set before the engine arms any page (at
/// `Dsm::init`); a value set earlier in the process is replaced, not freed.
/// The page lanes from co-located homes, indexed by rank, for the handler: a value from
/// `Box::into_raw` never given back (a later job in the same process replaces it and
/// leaks the old one), so a loaded pointer stays valid for the process's life.
static LANES: AtomicPtr<Vec<Option<LaneEnd>>> = AtomicPtr::new(std::ptr::null_mut());
/// `home + 1` while the fault in service waits for a page from `home`'s lane; 0 otherwise.
static LANE_HOME: AtomicU32 = AtomicU32::new(0);

/// Gives the handler the page lanes from this node's co-located peers.
pub(crate) fn set_lanes(lanes: &[dsm_net::transport::LaneEnd], size: usize) {
    let mut table: Vec<Option<dsm_net::transport::LaneEnd>> = vec![None; size];
    for l in lanes {
        if let Some(slot) = table.get_mut(l.peer) {
            *slot = Some(l.clone());
        }
    }
    LANES.store(Box::into_raw(Box::new(table)), Ordering::Release);
}

/// The links to peers reached over TCP, indexed by rank, for the handler to ask a page's
/// home itself (see [`ask_socket_home`]); kept like [`LANES`], never freed.
static DIRECT: AtomicPtr<Vec<Option<DirectSender>>> = AtomicPtr::new(std::ptr::null_mut());

/// Gives the handler the TCP links of this node, to send page requests on.
pub(crate) fn set_direct_senders(senders: Vec<DirectSender>, size: usize) {
    let mut table: Vec<Option<DirectSender>> = vec![None; size];
    for d in senders {
        let peer = d.peer();
        if let Some(slot) = table.get_mut(peer) {
            *slot = Some(d);
        }
    }
    DIRECT.store(Box::into_raw(Box::new(table)), Ordering::Release);
}

/// The TCP link to `peer`, if any.
fn direct_sender(peer: usize) -> Option<&'static DirectSender> {
    peer_entry(&DIRECT, peer)
}

/// `peer`'s entry in one of the handler's per-peer tables ([`LANES`], [`DIRECT`]).
fn peer_entry<T>(table: &AtomicPtr<Vec<Option<T>>>, peer: usize) -> Option<&'static T> {
    let table = table.load(Ordering::Acquire);
    if table.is_null() {
        return None;
    }
    // SAFETY: a non-null value of either table comes from Box::into_raw and is never
    // freed (see their docs), so the reference may live for the rest of the process.
    let table: &'static Vec<Option<T>> = unsafe { &*table };
    table.get(peer)?.as_ref()
}

/// How the handler asked a page's home for the page itself.
#[derive(Clone, Copy)]
enum Asked {
    /// Through the request slot of the shared-memory link's lane; the page comes back
    /// in the home's lane, which this thread polls.
    Lane(&'static LaneEnd),
    /// In a frame written to the TCP link; the page comes back in a reply frame, which
    /// this thread takes out of the socket itself if the comm thread's reader holds
    /// nothing of the link's then ([`take_page_from_socket`]); otherwise the comm thread
    /// takes it in, resolving the fault.
    Socket(&'static DirectSender),
}

/// From the handler, holding the fault slot for a read fault at `addr`: if the engine
/// armed the page for a fetch of the handler's own ([`FastFaults::claim_fetch`]), asks
/// its home for it, through the lane of a shared-memory link ([`ask_lane_home`]) or in a
/// frame on a TCP link ([`ask_socket_home`]). Returns how it asked, if it did; if not, the
/// page is unclaimed and the slot still this thread's alone (`SLOT_CLAIMED`).
fn ask_home(addr: usize, start: usize) -> Option<Asked> {
    let fast = fast_faults()?;
    let page = (addr - start) / PAGE_SIZE;
    let home = usize::from(fast.claim_fetch(page)?);
    let asked = if let Some(end) = lane_end(home) {
        ask_lane_home(end, page).then_some(Asked::Lane(end))
    } else if let Some(link) = direct_sender(home) {
        ask_socket_home(link, page).then_some(Asked::Socket(link))
    } else {
        None
    };
    if asked.is_none() {
        fast.unclaim_fetch(page);
    }
    asked
}

/// From the handler, `page` claimed for a fetch from the home at the far end of TCP link
/// `link`: writes the home a [`dsm_proto::Msg::PageRequest`] for it, behind every frame
/// this node handed to the link before, unless another thread is sending on the link or
/// frames wait in its queue ([`DirectSender::try_send`]). This thread then looks for the
/// reply in the socket itself ([`take_page_from_socket`]); if the comm thread's reader
/// takes it first, its engine adopts the fetch and resolves the fault. Returns whether it
/// asked. Nothing here allocates, locks or blocks: the frame is encoded on the stack, and
/// the link's lock is only tried.
fn ask_socket_home(link: &DirectSender, page: usize) -> bool {
    let Ok(page_no) = dsm_proto::PageNo::try_from(page) else {
        return false;
    };
    let mut buf = [0u8; PAGE_REQUEST_FRAME_MAX];
    let frame = page_request_frame(page_no, &mut buf);
    // Before the request, since the reply may come at once: the comm thread resolves an
    // asked fault when the copy arrives, and its reader leaves the reply to this thread.
    set_slot(SLOT_ASKED);
    link.await_reply(true);
    match link.try_send(frame) {
        DirectSend::Sent => true,
        DirectSend::Partly => {
            // The rest waits in the link until the comm thread queues it for the writer.
            kick();
            true
        }
        DirectSend::Refused => {
            // Nothing asked, so nothing can answer: the slot is still this thread's alone.
            link.await_reply(false);
            SLOT_STATE.store(SLOT_CLAIMED, Ordering::SeqCst);
            false
        }
    }
}

/// Whether the fault in service waits for a page from `home`'s lane (its thread polls it).
pub(crate) fn lane_awaited(home: usize) -> bool {
    LANE_HOME.load(Ordering::Acquire) == home as u32 + 1
        && matches!(SLOT_STATE.load(Ordering::Acquire), SLOT_TAKEN | SLOT_ASKED)
}

/// From the handler, `page` claimed for a fetch from `end`'s peer, a co-located home:
/// asks for it through the request slot of the lane towards the home, behind every frame
/// this node has handed to that link, and rings the home's bell if its reader sleeps.
/// The page then comes back through the home's lane as for a fetch the comm thread asked
/// for, with neither thread of this node in the way. Returns whether it asked. Nothing
/// here allocates, locks or blocks: atomics and at most one `write(2)`.
fn ask_lane_home(end: &'static LaneEnd, page: usize) -> bool {
    let home = end.peer as u32;
    // All before the request, since the home may answer at once: the flag, the home this
    // thread waits for, and the slot's state, which lets the comm thread resolve the fault
    // if the copy reaches it first.
    end.region.lane(end.dir).set_taker_polling(true);
    LANE_HOME.store(home + 1, Ordering::Release);
    set_slot(SLOT_ASKED);
    let lane = end.region.lane(end.to_peer);
    if !lane.post_request(page as u64, end.sent.load(Ordering::Acquire)) {
        // Nothing asked, so nothing can answer: the slot is still this thread's alone.
        SLOT_STATE.store(SLOT_CLAIMED, Ordering::SeqCst);
        LANE_HOME.store(0, Ordering::Release);
        end.region.lane(end.dir).set_taker_polling(false);
        return false;
    }
    if end.region.reader_needs_wake(end.to_peer) {
        ring_eventfd(&end.peer_bell);
    }
    true
}

/// The state shared with the engine for the handler's paths, unless they are off.
fn fast_faults() -> Option<&'static FastFaults> {
    let ptr = FAST.load(Ordering::Acquire);
    // SAFETY: a non-null value of FAST comes from Arc::into_raw and its count is never
    // given back, so the FastFaults it points to lives for the rest of the process.
    (!ptr.is_null()).then(|| unsafe { &*ptr })
}

/// The lane end shared with co-located `peer`, if any.
fn lane_end(peer: usize) -> Option<&'static LaneEnd> {
    peer_entry(&LANES, peer)
}

/// From the handler, which asked `end`'s peer for a page and stops polling its lane (the
/// page taken, the fault resolved, or the wait handed to the comm thread): says so in the
/// lane, and with `wake_reader` rings this node's reader of the peer's ring, which then
/// reads an announcement the peer may have left without ringing while this thread polled.
fn stop_polling_lane(end: &LaneEnd, wake_reader: bool) {
    end.region.lane(end.dir).set_taker_polling(false);
    if wake_reader {
        ring_eventfd(&end.own_bell);
    }
}

/// Rings an eventfd bell (async-signal-safe: one `write(2)`).
fn ring_eventfd(bell: &std::os::fd::OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: write(2) on an eventfd is async-signal-safe; the buffer is 8 valid bytes and
    // the descriptor belongs to the never-freed lane table.
    unsafe {
        libc::write(
            std::os::fd::AsRawFd::as_raw_fd(bell),
            one.as_ptr().cast(),
            8,
        )
    };
}

/// Whether the faulting thread asked the home for its page itself and polls for it
/// (`SLOT_ASKED`), in the home's lane or in the socket from it: the comm thread then
/// keeps off the cores (its polling would only compete with that thread and with the
/// home's) and leaves the page to it.
pub(crate) fn handler_asking() -> bool {
    SLOT_STATE.load(Ordering::Acquire) == SLOT_ASKED
}

/// The comm thread, about to ask `home` for the faulting page through its lane.
pub(crate) fn expect_lane(home: usize) {
    LANE_HOME.store(home as u32 + 1, Ordering::Release);
}

/// From the handler, while its read fault is in service: if the home left the faulting
/// page in the lane and this node has taken in every frame the home sent before it, takes
/// the page, copies it into the runtime view, makes it readable in the app view and
/// records it for the engine (see [`FastFaults::record_fetched`]); returns whether it
/// did. The engine takes the page in at the start of its next event, before it can
/// change anything about it; until then the comm thread leaves the page alone (the lane
/// is taken, and only its frame or this record completes the fetch). Nothing here
/// allocates, locks or blocks: atomics, two page-sized copies and one `mprotect`.
/// What [`take_page_from_lane`] did.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LaneTake {
    /// The page is installed and recorded: the fault is over.
    Taken,
    /// Not there yet (or not this thread's to take).
    NotYet,
    /// There, but the record queue is full until the engine takes records in.
    NoRoom,
}

/// The runtime view of `page`, for the handler to copy a fetched page into.
///
/// # Safety
///
/// The caller holds the page's fetch, its reply not yet taken in: the page is invalid, so
/// the app view has no access to it, and the comm thread installs a fetched page only
/// from its reply, which the caller holds (the lane it took, or the socket bytes it
/// claimed). Nothing else touches the page meanwhile.
unsafe fn runtime_page_of_fetch(page: usize) -> &'static mut [u8] {
    let runtime = RUNTIME_BASE.load(Ordering::Relaxed) + page * PAGE_SIZE;
    // SAFETY: `runtime` is the page's address in the runtime view, mapped for the life of
    // the process and page-aligned; the caller guarantees nothing else uses it.
    unsafe { std::slice::from_raw_parts_mut(runtime as *mut u8, PAGE_SIZE) }
}

/// Sets the app view's protection of the page at `app` (page-aligned, inside the segment);
/// returns whether `mprotect` succeeded. Async-signal-safe.
fn protect_app_page(app: usize, prot: libc::c_int) -> bool {
    // SAFETY: one page of our app-view mapping; no Rust reference to app-view memory
    // exists.
    unsafe { libc::mprotect(app as *mut libc::c_void, PAGE_SIZE, prot) == 0 }
}

/// From the handler, having recorded a page it installed: when the records waiting reach
/// a mark, kicks the comm thread. No fault of this thread has reached it for a while, so
/// its engine must take the records in before they run out (a watching comm thread looks
/// for faults only, so it is kicked too).
fn kick_if_backlog_high(fast: &FastFaults) {
    if fast.fetched_backlog_high() {
        kick();
    }
}

fn take_page_from_lane(addr: usize, start: usize) -> LaneTake {
    let home = LANE_HOME.load(Ordering::Acquire);
    let (Some(end), Some(fast)) = (
        home.checked_sub(1).and_then(|h| lane_end(h as usize)),
        fast_faults(),
    ) else {
        return LaneTake::NotYet;
    };
    let page = (addr - start) / PAGE_SIZE;
    let lane = end.region.lane(end.dir);
    match lane.full() {
        Some(at) if at.page == page as u64 && end.delivered.load(Ordering::Acquire) >= at.needs => {
        }
        _ => return LaneTake::NotYet,
    }
    if !lane.take() {
        return LaneTake::NotYet;
    }
    let mut applied = [0u64; dsm_net::ring::LANE_APPLIED_MAX];
    // SAFETY: the page is invalid and its fetch outstanding, and its reply is the lane
    // this thread now holds.
    let data = unsafe { runtime_page_of_fetch(page) };
    let (_, n) = lane.copy_out(&mut applied, data);
    let app = start + page * PAGE_SIZE;
    let readable = protect_app_page(app, libc::PROT_READ);
    if !readable || !fast.record_fetched(home - 1, page as dsm_proto::PageNo, &applied[..n]) {
        // Left to the comm thread, as if the handler had never looked: the page stays
        // inaccessible (back to no access, as the engine has it) and the lane full (what
        // was copied is the lane's own data).
        protect_app_page(app, libc::PROT_NONE);
        lane.put_back();
        return if readable {
            LaneTake::NoRoom
        } else {
            LaneTake::NotYet
        };
    }
    lane.release();
    kick_if_backlog_high(fast);
    LaneTake::Taken
}

/// From the handler, which asked the home at the far end of TCP link `link` for the page
/// at `addr` itself and has not handed the wait over: if the socket's next frame is that
/// page's reply, whole, and the comm thread's reader holds nothing of the link's (so every
/// frame the home sent before it has been taken in), takes it out of the socket, copies
/// the page into the runtime view, makes it readable in the app view and records it for
/// the engine, as [`take_page_from_lane`] does for a lane. The engine takes the page in
/// at the start of its next event; the reply never reaches it. Nothing here allocates,
/// locks or blocks: atomics, `recv(2)`, the frame parsed in place on this stack, one
/// page-sized copy and one `mprotect`.
fn take_page_from_socket(link: &DirectSender, addr: usize, start: usize) -> LaneTake {
    let Some(fast) = fast_faults() else {
        return LaneTake::NotYet;
    };
    if !fast.fetched_room() {
        return LaneTake::NoRoom;
    }
    let page = (addr - start) / PAGE_SIZE;
    let app = start + page * PAGE_SIZE;
    let mut frame = [0u8; PLAIN_REPLY_FRAME_MAX];
    // The reply's `applied` entries, packed by `install` for `record`.
    let applied = Cell::new([0u64; crate::engine::FETCHED_APPLIED_MAX]);
    let entries = Cell::new(0);
    let install = &mut |payload: &[u8]| {
        let Some(reply) = plain_page_reply(payload) else {
            return false;
        };
        if reply.page as usize != page || reply.applied().len() > crate::engine::FETCHED_APPLIED_MAX
        {
            return false;
        }
        // SAFETY: the page is invalid and this thread's fetch of it outstanding, and its
        // reply is in the socket bytes the link lets only this thread read now.
        unsafe { runtime_page_of_fetch(page) }.copy_from_slice(reply.data);
        let mut packed = [0u64; crate::engine::FETCHED_APPLIED_MAX];
        for (slot, entry) in packed.iter_mut().zip(reply.applied()) {
            *slot = crate::engine::pack_applied(entry);
        }
        applied.set(packed);
        entries.set(reply.applied().len());
        // If not readable, left in the socket for the comm thread, whose copy overwrites
        // this one.
        protect_app_page(app, libc::PROT_READ)
    };
    // Recorded before the link's reader may read on, so the engine takes the page in
    // before anything the home sent after the reply. Room was there, and only this
    // thread records, so the record goes in.
    let record = &mut |_: &[u8]| {
        let recorded = fast.record_fetched(
            link.peer() as u32,
            page as dsm_proto::PageNo,
            &applied.get()[..entries.get()],
        );
        debug_assert!(recorded, "room for a fetched record was checked first");
    };
    match link.try_take_frame(&mut frame, install, record) {
        DirectTake::NotThere => return LaneTake::NotYet,
        DirectTake::Other => {
            // Something else comes first: the reader takes it in, and the reply with it.
            link.await_reply(false);
            return LaneTake::NotYet;
        }
        // Taken (or read out of a socket that then failed, whole: the page is installed
        // and recorded all the same, and the reader reports the link).
        DirectTake::Taken | DirectTake::Broken => link.await_reply(false),
    }
    kick_if_backlog_high(fast);
    LaneTake::Taken
}

pub(crate) fn set_fast_faults(fast: Option<Arc<FastFaults>>) {
    let ptr = fast.map_or(std::ptr::null_mut(), |f| Arc::into_raw(f).cast_mut());
    FAST.store(ptr, Ordering::Release);
}

/// The handler's message when a thread faults on the segment while it holds the engine.
const FAULT_IN_ENGINE: &[u8] = b"dsm: fatal: page fault on shared memory by a thread that holds \
the protocol engine's lock; this is a bug in dsm (the engine must never touch the app view)\n";

/// Stops the process from inside the handler: one `write` of a fixed message, then abort.
fn abort_fault_in_engine() -> ! {
    // SAFETY: write(2) and abort(3) are async-signal-safe; the buffer is a static.
    unsafe {
        libc::write(2, FAULT_IN_ENGINE.as_ptr().cast(), FAULT_IN_ENGINE.len());
        libc::abort()
    }
}

/// Serves a write fault at `addr` (inside the segment that starts at `start`) in the
/// handler if the engine armed its page. Returns false to take the slow path.
fn fast_write_fault(addr: usize, start: usize) -> bool {
    let Some(fast) = fast_faults() else {
        return false;
    };
    let page = (addr - start) / PAGE_SIZE;
    let app = start + page * PAGE_SIZE;
    let runtime = RUNTIME_BASE.load(Ordering::Relaxed) + page * PAGE_SIZE;
    fast.handler_write_fault(
        page,
        || protect_app_page(app, libc::PROT_READ | libc::PROT_WRITE),
        |slot: &[AtomicU64]| {
            let src = runtime as *const u64;
            for (i, word) in slot.iter().enumerate().take(PAGE_SIZE / 8) {
                // SAFETY: `runtime` is the page's address in the runtime view, mapped for
                // the life of the process, page-aligned, and i < PAGE_SIZE / 8. Nothing
                // writes a valid non-home page there (the comm thread installs fetched
                // pages, which are invalid, and applies diffs to home pages only), and the
                // app thread is here, so the copy is the page as it was before the write.
                word.store(unsafe { std::ptr::read(src.add(i)) }, Ordering::Relaxed);
            }
        },
    )
    .is_ok()
}
static PREVIOUS_ACTION: OnceLock<SavedAction> = OnceLock::new();

struct SavedAction(libc::sigaction);
// SAFETY: a plain C struct of function pointers and flags, only read after being set once.
unsafe impl Send for SavedAction {}
unsafe impl Sync for SavedAction {}

/// What the comm thread learns of a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fault {
    pub(crate) addr: usize,
    /// `None` when the architecture does not report the access kind.
    pub(crate) write: Option<bool>,
}

/// CLOCK_MONOTONIC in nanoseconds, from the handler (clock_gettime is async-signal-safe).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own; it is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn futex_wait(word: &AtomicU32, expected: u32) {
    futex(
        word,
        libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
        expected,
        0,
    );
}

/// From the handler, while a read fault's page is being fetched: commits the page at
/// `offset` in the runtime view (`MADV_POPULATE_WRITE`), so that on a page this rank never
/// held the kernel's first-touch work overlaps the round trip instead of lengthening the
/// comm thread's copy into it (3.5 us of a 22 us remote fault, measured). Contents are
/// unchanged. On a kernel without the advice the copy does the work, as before, so the
/// result is not checked.
fn commit_runtime_page(offset: usize) {
    let page_start = (offset & !(PAGE_SIZE - 1)) + RUNTIME_BASE.load(Ordering::Relaxed);
    // SAFETY: `offset` lies inside the segment (the handler checked the address), so the
    // page lies inside the runtime mapping, which is always readable and writable;
    // madvise is a system call, async-signal-safe, and populating changes no byte.
    unsafe {
        libc::madvise(
            page_start as *mut libc::c_void,
            PAGE_SIZE,
            libc::MADV_POPULATE_WRITE,
        )
    };
}

/// Sleeps on the fault slot while it holds `expected`, counted in [`SLOT_SLEEPERS`].
fn sleep_on_slot(expected: u32) {
    // SeqCst against `set_slot`: either it sees this sleeper, or the futex sees its new
    // state and returns at once.
    SLOT_SLEEPERS.fetch_add(1, Ordering::SeqCst);
    futex_wait(&SLOT_STATE, expected);
    SLOT_SLEEPERS.fetch_sub(1, Ordering::SeqCst);
}

/// Moves the fault slot to `state` and wakes its sleepers, if any.
fn set_slot(state: u32) {
    SLOT_STATE.store(state, Ordering::SeqCst);
    wake_slot_sleepers();
}

/// Wakes the threads asleep on the fault slot after a change of its state, if any.
fn wake_slot_sleepers() {
    if SLOT_SLEEPERS.load(Ordering::SeqCst) > 0 {
        futex_wake_all(&SLOT_STATE);
    }
}

fn futex_wake_all(word: &AtomicU32) {
    futex(
        word,
        libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
        i32::MAX as u32,
        0,
    );
}

fn errno_location() -> *mut libc::c_int {
    // SAFETY: __errno_location has no preconditions and returns the thread's errno slot.
    unsafe { libc::__errno_location() }
}

#[cfg(target_arch = "x86_64")]
fn fault_is_write(ctx: *mut libc::c_void) -> u32 {
    // SAFETY: for SA_SIGINFO handlers the kernel passes a valid ucontext_t; on x86_64 the
    // page-fault error code is in gregs[REG_ERR], bit 1 set for writes.
    let err =
        unsafe { (*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_ERR as usize] };
    u32::from(err & 2 != 0)
}

#[cfg(not(target_arch = "x86_64"))]
fn fault_is_write(_ctx: *mut libc::c_void) -> u32 {
    2
}

/// Makes SIGSEGV take its default action, so that returning from our handler re-executes
/// the faulting instruction and the process dies of it as it would without dsm.
fn die_by_default_on_return() {
    // SAFETY: an all-zero sigaction with SIG_DFL is a valid value.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = libc::SIG_DFL;
    // SAFETY: sigaction is async-signal-safe; the struct is valid.
    unsafe { libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut()) };
}

/// Hands a fault dsm does not own to whatever handled SIGSEGV before us, the way wasmtime
/// chains: a handler function is called in place (Rust's own stack-overflow handler, a
/// profiler's, a JIT's), and our handler stays installed for the faults that follow; only
/// if there was none (`SIG_DFL`, or `SIG_IGN`, which cannot ignore a real fault) does the
/// default action come back, which then ends the process.
fn chain_to_previous(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(SavedAction(prev)) = PREVIOUS_ACTION.get() else {
        die_by_default_on_return();
        return;
    };
    let handler = prev.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        die_by_default_on_return();
        return;
    }
    if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous disposition declared SA_SIGINFO, so `handler` is the address
        // of a function with the three-argument signature, installed by code of this
        // process; we pass it the kernel's own arguments, as the kernel would have.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: without SA_SIGINFO, `handler` is a one-argument signal handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

extern "C" fn on_sigsegv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    if code <= 0 {
        // Sent by kill/raise/sigqueue, not a fault: nothing re-faults on return, so die
        // from it the default way.
        die_by_default_on_return();
        // SAFETY: raise is async-signal-safe; SIGSEGV is blocked until we return.
        unsafe { libc::raise(libc::SIGSEGV) };
        return;
    }
    let start = SEG_START.load(Ordering::Relaxed);
    let end = SEG_END.load(Ordering::Relaxed);
    if addr < start || addr >= end || FAULT_KICK_FD.load(Ordering::Relaxed) < 0 {
        chain_to_previous(sig, info, ctx);
        return;
    }
    if IN_ENGINE.with(Cell::get) {
        abort_fault_in_engine();
    }
    let errno = errno_location();
    // SAFETY: errno slot of this thread; preserved across our syscalls.
    let saved_errno = unsafe { *errno };
    if fault_is_write(ctx) == 1 && fast_write_fault(addr, start) {
        // SAFETY: restoring this thread's errno.
        unsafe { *errno = saved_errno };
        return;
    }

    // One fault at a time: other faulting threads wait for the slot.
    while SLOT_STATE
        .compare_exchange(
            SLOT_IDLE,
            SLOT_CLAIMED,
            Ordering::Acquire,
            Ordering::Relaxed,
        )
        .is_err()
    {
        let seen = SLOT_STATE.load(Ordering::Relaxed);
        if seen != SLOT_IDLE {
            sleep_on_slot(seen);
        }
    }
    SLOT_ADDR.store(addr, Ordering::Relaxed);
    SLOT_KIND.store(fault_is_write(ctx), Ordering::Relaxed);
    // A parked fault polls for the process's budget before it sleeps (`crate::spin`).
    let spin_ns = crate::spin::budget_ns();
    // A read fault of a page the engine armed asks the home itself, if this thread will
    // poll for the answer; otherwise, or once the budget is spent, the comm thread takes
    // the fault (and with it the wait for the copy).
    let mut asked = None;
    if spin_ns > 0 && fault_is_write(ctx) == 0 {
        asked = ask_home(addr, start);
    }
    if asked.is_none() {
        hand_to_comm_thread();
    }
    // Set once the wait is the comm thread's (the budget spent): the engine then owns the
    // fetch, and a page this thread took from the lane could race its step for the fault.
    let mut handed_over = false;
    let mut spin_from = if spin_ns > 0 { monotonic_ns() } else { 0 };
    let (mut polled, mut slept) = (false, false);
    // A read fault is a fetch of an invalid page (or a wild access): once the comm thread
    // has taken it, this thread has nothing to do until the page comes.
    let commit_page = fault_is_write(ctx) == 0;
    let mut committed = false;
    let outcome = loop {
        let s = SLOT_STATE.load(Ordering::Acquire);
        if s == SLOT_RESOLVED || s == SLOT_CRASH {
            break s;
        }
        if (s == SLOT_TAKEN && !handed_over || s == SLOT_ASKED) && commit_page {
            let took = match asked {
                Some(Asked::Socket(link)) if s == SLOT_ASKED => {
                    take_page_from_socket(link, addr, start)
                }
                _ => take_page_from_lane(addr, start),
            };
            if took == LaneTake::NoRoom && s == SLOT_ASKED {
                // The engine must take records in before this thread can install more:
                // hand the wait over now rather than poll for the budget.
                spin_from = spin_from.wrapping_sub(spin_ns);
            }
            if took == LaneTake::Taken {
                if let Some(Asked::Lane(end)) = asked.take() {
                    stop_polling_lane(end, false);
                }
                // The fault is over: the engine takes the page in from the record at the
                // start of its next event (before any next fault), resolving nothing.
                LANE_HOME.store(0, Ordering::Release);
                if polled || slept {
                    crate::spin::count_wait(!slept);
                }
                set_slot(SLOT_IDLE);
                // SAFETY: restoring this thread's errno.
                unsafe { *errno = saved_errno };
                return;
            }
            if !committed {
                committed = true;
                commit_runtime_page(addr - start);
                continue;
            }
        }
        if spin_ns > 0 && monotonic_ns().wrapping_sub(spin_from) < spin_ns {
            polled = true;
            // SAFETY: sched_yield has no arguments and is async-signal-safe.
            unsafe { libc::sched_yield() };
            continue;
        }
        if s == SLOT_ASKED {
            // No answer within the budget: the comm thread takes over the wait (its engine
            // adopts the fetch this thread asked for), and this thread sleeps.
            match asked.take() {
                Some(Asked::Lane(end)) => stop_polling_lane(end, true),
                Some(Asked::Socket(link)) => link.await_reply(false),
                None => {}
            }
            handed_over = true;
            // The comm thread takes the page when its announcement comes, without
            // deferring to this thread.
            LANE_HOME.store(0, Ordering::Release);
            if SLOT_STATE
                .compare_exchange(
                    SLOT_ASKED,
                    SLOT_PENDING,
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                kick_unless_watched();
            }
            spin_from = monotonic_ns();
            continue;
        }
        slept = true;
        sleep_on_slot(s);
    };
    if polled || slept {
        crate::spin::count_wait(!slept);
    }
    match asked {
        // Resolved by the comm thread, which read the announcement (or the reply) already.
        Some(Asked::Lane(end)) => stop_polling_lane(end, false),
        Some(Asked::Socket(link)) => link.await_reply(false),
        None => {}
    }
    set_slot(SLOT_IDLE);
    if outcome == SLOT_CRASH {
        // Inside the segment but in no allocation: a wild access; crash like one.
        die_by_default_on_return();
    }
    // SAFETY: restoring this thread's errno.
    unsafe { *errno = saved_errno };
}

/// From the handler: posts the fault in the slot for the comm thread and wakes it, unless
/// it is watching the slot already.
fn hand_to_comm_thread() {
    // SeqCst against the comm thread's `COMM_WATCHING` clear and re-look
    // (`FaultMailbox::watch`): either it sees this fault, or this thread sees it is not
    // watching and kicks it.
    SLOT_STATE.store(SLOT_PENDING, Ordering::SeqCst);
    kick_unless_watched();
}

/// From the handler, a fault just posted: kicks the comm thread unless it watches the slot.
fn kick_unless_watched() {
    if !COMM_WATCHING.load(Ordering::SeqCst) {
        kick();
    }
}

/// From the handler: wakes the comm thread, which serves the pending fault if there is one
/// and otherwise has its engine take in what the handler did.
fn kick() {
    let kick: u8 = 1;
    // SAFETY: write(2) on a socket is async-signal-safe; the buffer is 1 valid byte.
    unsafe {
        libc::write(
            FAULT_KICK_FD.load(Ordering::Relaxed),
            (&kick as *const u8).cast(),
            1,
        )
    };
}

/// Receiving end of the fault mailbox, owned by the comm thread.
pub(crate) struct FaultMailbox {
    /// Kept open so the handler's writes always have a peer.
    _kick_tx: std::os::unix::net::UnixStream,
    kick_rx: Option<std::os::unix::net::UnixStream>,
}

impl FaultMailbox {
    /// The nonblocking stream that becomes readable when a fault is pending; drain it,
    /// then call [`FaultMailbox::take`].
    pub(crate) fn take_receiver(&mut self) -> Option<std::os::unix::net::UnixStream> {
        self.kick_rx.take()
    }

    /// The pending fault, if any (each fault is delivered once).
    pub(crate) fn take(&self) -> Option<Fault> {
        if SLOT_STATE
            .compare_exchange(
                SLOT_PENDING,
                SLOT_TAKEN,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return None;
        }
        Some(Fault {
            addr: SLOT_ADDR.load(Ordering::Relaxed),
            write: match SLOT_KIND.load(Ordering::Relaxed) {
                0 => Some(false),
                1 => Some(true),
                _ => None,
            },
        })
    }

    /// Whether the comm thread has taken a fault and not yet resolved it (a fetch for it is
    /// under way).
    pub(crate) fn in_service(&self) -> bool {
        SLOT_STATE.load(Ordering::Acquire) == SLOT_TAKEN
    }

    /// Lets the faulting thread retry its access.
    pub(crate) fn resolve(&self) {
        self.finish(SLOT_RESOLVED);
    }

    /// Tells the faulting thread its access is a genuine segmentation fault.
    pub(crate) fn crash(&self) {
        self.finish(SLOT_CRASH);
    }

    /// Posts `outcome` for the fault in service: one posted, taken, or asked for by the
    /// handler. A slot in any other state has no fault the engine could be answering (its
    /// fault ended in the handler, or the next one is being posted), so it is left alone.
    fn finish(&self, outcome: u32) {
        let mut seen = SLOT_STATE.load(Ordering::Acquire);
        while matches!(seen, SLOT_PENDING | SLOT_TAKEN | SLOT_ASKED) {
            match SLOT_STATE.compare_exchange(seen, outcome, Ordering::SeqCst, Ordering::Acquire) {
                Ok(_) => {
                    LANE_HOME.store(0, Ordering::Release);
                    wake_slot_sleepers();
                    return;
                }
                Err(now) => seen = now,
            }
        }
    }

    /// Polls the slot for the next fault for up to `budget` ([`crate::spin::poll_for`]),
    /// telling the handler meanwhile that it need not kick: the comm thread is looking.
    /// The last look comes after the flag is cleared, so a fault whose handler saw the
    /// flag set is taken here rather than left without a kick.
    pub(crate) fn watch(&self, budget: std::time::Duration) -> Option<Fault> {
        COMM_WATCHING.store(true, Ordering::SeqCst);
        let seen = crate::spin::poll_for(budget, || match self.take() {
            Some(f) => Some(Some(f)),
            None if handler_asking() => Some(None),
            None => None,
        })
        .flatten();
        COMM_WATCHING.store(false, Ordering::SeqCst);
        seen.or_else(|| self.take())
    }
}

impl Drop for FaultMailbox {
    fn drop(&mut self) {
        // From now on faults in the segment are treated as crashes.
        FAULT_KICK_FD.store(-1, Ordering::Relaxed);
    }
}

/// Whether `len` bytes at `addr` could be mapped now: reserves the range without access
/// and releases it at once. The error says what holds it (or why not).
pub(crate) fn address_range_free(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: MAP_FIXED_NOREPLACE never clobbers an existing mapping; an anonymous
    // PROT_NONE reservation commits no memory.
    let got = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_FIXED_NOREPLACE
                | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if got == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::EEXIST) {
            io::Error::new(e.kind(), "something is already mapped in that range")
        } else {
            e
        });
    }
    // SAFETY: unmapping exactly the reservation made above.
    unsafe { libc::munmap(got, len) };
    if got as usize != addr {
        return Err(io::Error::other(
            "the kernel placed a test mapping elsewhere (kernel older than 4.17?)",
        ));
    }
    Ok(())
}

/// Tests only (`DSM_TEST_OCCUPY_BASE`): maps one inaccessible page at `addr` for the rest
/// of the process's life, as a library or another program's shared memory might.
pub(crate) fn occupy_page_for_test(addr: usize) -> io::Result<()> {
    // SAFETY: MAP_FIXED_NOREPLACE never clobbers an existing mapping; the page is never
    // accessed or unmapped.
    let got = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            PAGE_SIZE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if got == libc::MAP_FAILED {
        return Err(os_err("mmap (DSM_TEST_OCCUPY_BASE)"));
    }
    Ok(())
}

/// Maps the process's segment at `addr` (in `common`, the job's common segment file, if
/// given) for the rest of its life, records it for
/// [`AppSlice::new_in_global_segment`] and installs the fault handler for it: the safe entry
/// point to everything below.
pub(crate) fn start(
    addr: usize,
    len: usize,
    common: Option<OwnedFd>,
    nodes: usize,
) -> io::Result<(&'static Segment, FaultMailbox)> {
    let seg: &'static Segment = Box::leak(Box::new(Segment::map(addr, len, common, nodes)?));
    set_global_segment(seg);
    // SAFETY: the segment is leaked, so it stays mapped for the life of the process, longer
    // than any fault the handler can be asked to serve.
    let mailbox = unsafe { install_fault_handler(seg)? };
    Ok((seg, mailbox))
}

/// Installs the SIGSEGV handler for faults inside `seg`, and returns the mailbox the comm
/// thread serves. Faults outside the segment are chained to the previous disposition.
///
/// # Safety
///
/// `seg` must stay mapped for as long as the returned mailbox lives: the handler resolves
/// faults in its address range by changing the protection of its pages.
pub(crate) unsafe fn install_fault_handler(seg: &Segment) -> io::Result<FaultMailbox> {
    use std::os::fd::AsRawFd;
    let (kick_tx, kick_rx) = std::os::unix::net::UnixStream::pair()?;
    kick_rx.set_nonblocking(true)?;
    let efd = kick_tx.as_raw_fd();
    RUNTIME_BASE.store(seg.runtime_base, Ordering::Relaxed);
    SEG_START.store(seg.app_base, Ordering::Relaxed);
    SEG_END.store(seg.app_base + seg.len, Ordering::Relaxed);
    FAULT_KICK_FD.store(efd, Ordering::Release);
    if !HANDLER_INSTALLED.swap(true, Ordering::AcqRel) {
        // SAFETY: building a sigaction for our handler; zeroed is a valid starting value.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_sigsegv as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: sa_mask is a valid sigset_t to initialise.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: zeroed sigaction is a valid out-parameter.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: installing a handler that is async-signal-safe (see on_sigsegv).
        if unsafe { libc::sigaction(libc::SIGSEGV, &sa, &mut old) } != 0 {
            HANDLER_INSTALLED.store(false, Ordering::Release);
            return Err(os_err("sigaction(SIGSEGV)"));
        }
        let _ = PREVIOUS_ACTION.set(SavedAction(old));
    }
    install_alt_stack()?;
    Ok(FaultMailbox {
        _kick_tx: kick_tx,
        kick_rx: Some(kick_rx),
    })
}

/// Size of the alternate signal stack given to threads that touch shared memory.
const ALT_STACK_SIZE: usize = 256 << 10;

/// Gives the calling thread an alternate signal stack large enough for the fault handler,
/// unless it already has one at least that large.
pub(crate) fn install_alt_stack() -> io::Result<()> {
    // SAFETY: querying the current alternate stack into a zeroed stack_t.
    let mut cur: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-parameter.
    if unsafe { libc::sigaltstack(std::ptr::null(), &mut cur) } == 0
        && cur.ss_flags & libc::SS_DISABLE == 0
        && cur.ss_size >= ALT_STACK_SIZE
    {
        return Ok(());
    }
    // SAFETY: anonymous private mapping for the stack; intentionally never unmapped (the
    // thread may take signals until it exits).
    let mem = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            ALT_STACK_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if mem == libc::MAP_FAILED {
        return Err(os_err("mmap of the signal stack"));
    }
    let st = libc::stack_t {
        ss_sp: mem,
        ss_flags: 0,
        ss_size: ALT_STACK_SIZE,
    };
    // SAFETY: the stack memory is valid for the thread's lifetime.
    if unsafe { libc::sigaltstack(&st, std::ptr::null_mut()) } != 0 {
        return Err(os_err("sigaltstack"));
    }
    Ok(())
}

/// Takes ownership of the launcher's lifeline, the inherited read end of a pipe
/// (`DSM_LAUNCHER_FD`), after checking that `fd` is open and is a pipe.
pub(crate) fn adopt_lifeline(fd: i32) -> io::Result<std::fs::File> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: fstat writes into a zeroed, properly sized stat buffer; an invalid fd is
    // reported as EBADF, not undefined behaviour.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(os_err(&format!("DSM_LAUNCHER_FD={fd}")));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return Err(io::Error::other(format!(
            "DSM_LAUNCHER_FD={fd} is not a pipe; it is set by dsmrun and must not be set by hand"
        )));
    }
    // SAFETY: the fd is open (fstat succeeded) and was inherited for this purpose: the
    // launcher made it for this process, and nothing else in the process knows its number,
    // so this is its only owner.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(std::fs::File::from(owned))
}

/// Takes ownership of the inherited rendezvous socket (`DSM_COORD_FD`), after checking
/// that `fd` is an open socket listening at `coord`.
pub(crate) fn adopt_rendezvous(
    fd: i32,
    coord: std::net::SocketAddr,
) -> io::Result<std::net::TcpListener> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: fstat writes into a zeroed stat buffer; an invalid fd is reported as EBADF.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(os_err(&format!("DSM_COORD_FD={fd}")));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(io::Error::other(format!(
            "DSM_COORD_FD={fd} is not a socket; it is set by dsmrun and must not be set by hand"
        )));
    }
    // SAFETY: the fd is open (fstat succeeded) and was inherited for this purpose; nothing
    // else in the process knows its number, so this is its only owner.
    let listener = std::net::TcpListener::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let bound = listener.local_addr()?;
    if bound != coord {
        return Err(io::Error::other(format!(
            "DSM_COORD_FD={fd} listens at {bound}, not at DSM_COORD={coord}"
        )));
    }
    Ok(listener)
}

/// The status this process ends with whatever `main` returns (0: none), see
/// [`exit_with_at_process_exit`].
static EXIT_STATUS_OVERRIDE: AtomicI32 = AtomicI32::new(0);

/// Makes this process end with `status` at its exit, whatever `main` returns or passes to
/// `exit` (as ThreadSanitizer's `exitcode`): rank 0's race and value-comparison statuses
/// must reach the launcher even from a program that returns success. Output buffers are
/// flushed first (Rust's are by then; C's stdio with `fflush`). A death by signal or an
/// `_exit` is not changed. Only the first call registers the hook; later ones set the status.
pub(crate) fn exit_with_at_process_exit(status: i32) {
    if EXIT_STATUS_OVERRIDE.swap(status, Ordering::SeqCst) == 0 && status != 0 {
        // SAFETY: `atexit` takes a function of no arguments that does not return into
        // freed state; `override_exit_status` only reads an atomic and ends the process.
        unsafe { libc::atexit(override_exit_status) };
    }
}

extern "C" fn override_exit_status() {
    let status = EXIT_STATUS_OVERRIDE.load(Ordering::SeqCst);
    if status != 0 {
        // SAFETY: fflush(NULL) flushes every C stream; _exit never returns. Both are
        // async-signal-safe enough for an exit handler, which runs on the exiting thread.
        unsafe {
            libc::fflush(std::ptr::null_mut());
            libc::_exit(status)
        }
    }
}

/// Exits immediately without unwinding or running destructors, for fatal errors found on
/// the comm thread while the app thread may be parked inside the fault handler.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and is always safe to call.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two mappings of one common file, as two ranks have: increments made under a host
    /// lock from both are never lost, and a lock id means the same slot in both.
    #[test]
    fn host_locks_exclude_across_mappings_of_one_file() {
        // SAFETY: a fresh memfd; the name is a valid C string.
        let fd = unsafe { libc::memfd_create(c"host-lock-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fd is ours; dup gives a second descriptor of the same file.
        let (a, b) = unsafe {
            (
                std::os::fd::FromRawFd::from_raw_fd(fd),
                std::os::fd::FromRawFd::from_raw_fd({
                    let copy = libc::dup(fd);
                    assert!(copy >= 0, "dup failed");
                    copy
                }),
            )
        };
        let len = PAGE_SIZE;
        let one: &'static Segment = Box::leak(Box::new(
            Segment::map(0x5f00_0000_0000, len, Some(a), 2).unwrap(),
        ));
        let two: &'static Segment = Box::leak(Box::new(
            Segment::map(0x5f10_0000_0000, len, Some(b), 2).unwrap(),
        ));
        // The counter lives in the first page of the file, seen through each runtime view.
        let counter = |seg: &'static Segment| -> &'static AtomicU64 {
            // SAFETY: the runtime view is mapped, writable, page-aligned and never unmapped
            // (the segment is leaked); both mappings show the same file page.
            unsafe { &*(seg.runtime_base as *const AtomicU64) }
        };
        const ROUNDS: u64 = 20_000;
        let workers: Vec<_> = [one, two]
            .into_iter()
            .enumerate()
            .map(|(k, seg)| {
                std::thread::spawn(move || {
                    for i in 0..ROUNDS {
                        // Lock 7 is the contended one; the others only fill the table.
                        let _ = seg.host_lock(1000 + 2 * (i % 4000) + k as u64).unwrap();
                        let lock = seg.host_lock(7).unwrap();
                        lock.lock(if k == 0 { 0 } else { 20_000 });
                        // A read-modify-write that is not atomic: only the lock keeps
                        // increments from being lost.
                        let c = counter(seg);
                        let v = c.load(Ordering::Relaxed);
                        std::hint::spin_loop();
                        c.store(v + 1, Ordering::Relaxed);
                        lock.unlock();
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(counter(one).load(Ordering::Relaxed), 2 * ROUNDS);
        assert!(std::ptr::eq(
            one.host_lock(7).unwrap().slot,
            one.host_lock(7).unwrap().slot
        ));
        // Both mappings agree on every id's slot (same index in the table).
        let index = |seg: &'static Segment, id: u64| {
            (std::ptr::from_ref(seg.host_lock(id).unwrap().slot) as usize - seg.host_locks)
                / std::mem::size_of::<HostLockSlot>()
        };
        for id in [7, 1000, 1001, 1000 + 2 * 3999 + 1, u64::MAX] {
            assert_eq!(index(one, id), index(two, id), "lock {id}");
        }
        // Fill the table until an id finds no slot: both mappings then send it through the
        // protocol, and every id that has a slot keeps it.
        let mut id = 1 << 40;
        let refused = loop {
            id += 1;
            if one.host_lock(id).is_none() {
                break id;
            }
            assert!(
                id < (1 << 40) + 2 * HOST_LOCK_SLOTS as u64,
                "the table never filled"
            );
        };
        assert!(one.host_lock(refused).is_none() && two.host_lock(refused).is_none());
        assert_eq!(index(one, 7), index(two, 7));
        assert_eq!(index(two, refused - 1), index(one, refused - 1));
    }

    #[test]
    fn a_segment_of_its_own_has_no_host_locks() {
        let seg: &'static Segment = Box::leak(Box::new(
            Segment::map(0x5f20_0000_0000, PAGE_SIZE, None, 1).unwrap(),
        ));
        assert!(seg.host_lock(1).is_none());
    }
}
