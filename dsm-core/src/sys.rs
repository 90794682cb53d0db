//! The operating system below a node, and nothing above it: mapping the shared segment
//! (one memfd, this process's own or the job's common one, mapped twice: the app view at a
//! fixed address whose page protections drive the protocol, and an always-writable runtime
//! view the comm thread uses; with one memory per host, the pages homed on this host are
//! mapped from the host's file instead), committing a common segment's new pages (`madvise`), the
//! locks of a common segment (atomics and futexes on a table in the shared file,
//! [`HostLock`]), `mprotect`, raw element loads and stores through the app view, the
//! alternate signal stack, the clock and futexes the fault handler may use (all
//! async-signal-safe), the inherited lifeline and rendezvous sockets, and the process's
//! exit status. It imports nothing from the engine, the comm thread or dsm-net; the fault
//! path (`fault`) is built on it. With `fault`, the only modules of dsm-core that may use
//! `unsafe`.
#![deny(unsafe_op_in_unsafe_fn)]

use crate::ticket::TicketLock;
use std::io;
use std::os::fd::{IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use dsm_proto::PAGE_SIZE;

/// What the app view lets a thread do with a page (`mprotect`'s protections).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PageAccess {
    None,
    Read,
    ReadWrite,
}

impl PageAccess {
    fn bits(self) -> libc::c_int {
        match self {
            PageAccess::None => libc::PROT_NONE,
            PageAccess::Read => libc::PROT_READ,
            PageAccess::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        }
    }
}

pub(crate) fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// What backs the segment (see [`Segment::map`]).
pub(crate) enum SegmentFile {
    /// A memfd of this process's own.
    Own,
    /// The job's common file: every rank maps all of it, and its host lock table.
    Common(OwnedFd),
    /// A memfd of this process's own, and the host's file, which the pages homed on this
    /// host are mapped from as they are allocated ([`Segment::map_host_pages`]).
    Host(OwnedFd),
}

/// The shared segment: `len` bytes backed by a memfd, mapped at `app_base` (same address on
/// every node) and at a private runtime address.
pub(crate) struct Segment {
    app_base: usize,
    runtime_base: usize,
    len: usize,
    memfd: libc::c_int,
    /// The host's file ([`SegmentFile::Host`]), -1 without one.
    host_file: libc::c_int,
    /// Address of the host's table of applied diffs ([`Segment::host_applied`]), in the
    /// host's file after the segment; 0 without one.
    host_applied: usize,
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
    /// `file`: the job's common segment file (every rank maps the same one) or the host's,
    /// sized here to `len` (every rank sizes it alike, so whoever comes last changes
    /// nothing), or none.
    /// A common file also holds, after the segment, the table of host locks, each with its
    /// release clock (`nodes` entries, see [`HostLock::released_clock`]); only the pages of
    /// locks in use take memory.
    pub(crate) fn map(
        addr: usize,
        len: usize,
        file: SegmentFile,
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
        let (common, host) = match file {
            SegmentFile::Own => (None, None),
            SegmentFile::Common(f) => (Some(f), None),
            SegmentFile::Host(f) => (None, Some(f)),
        };
        let (host_file, host_applied) = match host {
            Some(f) => {
                let fd = segment_file(Some(f), len + applied_table_bytes(len, nodes), len)?;
                // SAFETY: fd is our own descriptor of the host's file, just sized.
                (fd, unsafe { map_applied_table(fd, len, nodes) }?)
            }
            None => (-1, 0),
        };
        let is_common = common.is_some();
        let table_len = host_table_bytes(nodes);
        let file_len = if is_common { len + table_len } else { len };
        // Each step below releases what it made when it fails; the host's file, made
        // before them, is released here.
        let views = || -> io::Result<_> {
            let memfd = segment_file(common, file_len, len)?;
            // SAFETY: memfd is our own and not shared.
            let app = unsafe { map_app_view(addr, len, memfd) }?;
            // SAFETY: as above, and `app` is the app view just made, which nothing uses yet.
            let runtime = unsafe { map_runtime_view(app, len, memfd) }?;
            let host_locks = if is_common {
                // SAFETY: as above, and so is `runtime`.
                unsafe { map_host_table(app, runtime, len, table_len, memfd) }?
            } else {
                0
            };
            Ok((memfd, runtime, host_locks))
        };
        let (memfd, runtime, host_locks) = views().inspect_err(|_| {
            // SAFETY: the host's file and its table mapping were made above for this
            // segment, which failed: nothing else has them.
            unsafe { release_host_file(host_file, host_applied, len, nodes) }
        })?;
        Ok(Segment {
            app_base: addr,
            runtime_base: runtime as usize,
            len,
            memfd,
            host_file,
            host_applied,
            host_locks,
            nodes,
        })
    }

    /// The entry of the host's applied-diff table for `page` and `writer`: the latest
    /// interval of `writer` whose diff of `page` the page's home applied to the host's
    /// copy. `None` without a host file.
    fn applied_entry(&self, page: usize, writer: usize) -> Option<&AtomicU32> {
        if self.host_applied == 0 {
            return None;
        }
        self.check_pages(page, 1);
        assert!(
            writer < self.nodes,
            "writer {writer} of {} nodes",
            self.nodes
        );
        // SAFETY: the table mapping (`applied_table_bytes(len, nodes)` long, shared,
        // writable, never unmapped before the segment is dropped, and `&self` borrows the
        // segment) holds one u32 per page and node; page and writer are checked above.
        // Zeroed bytes are a valid atomic, and every process touches these bytes only
        // through atomics.
        Some(unsafe { &*((self.host_applied as *const AtomicU32).add(page * self.nodes + writer)) })
    }

    /// With one memory per host: the latest interval of `writer` whose diff of `page` the
    /// page's home applied to the host's copy (0 without a host file). Its acquire pairs
    /// with [`Segment::publish_host_applied`]'s release, so the diff's bytes are visible.
    pub(crate) fn host_applied(&self, page: usize, writer: usize) -> u32 {
        self.applied_entry(page, writer)
            .map_or(0, |e| e.load(Ordering::Acquire))
    }

    /// At `page`'s home, after applying `writer`'s diff of interval `interval` through the
    /// runtime view: tells the host's other ranks.
    pub(crate) fn publish_host_applied(&self, page: usize, writer: usize, interval: u32) {
        if let Some(e) = self.applied_entry(page, writer) {
            e.fetch_max(interval, Ordering::Release);
        }
    }

    /// Maps `count` pages from `first` from the host's file in both views, in place of
    /// this process's own memfd: every rank of the host then reaches the same bytes. For
    /// pages being allocated (nothing uses them yet) that are homed on this host; they are
    /// inaccessible in the app view until the engine protects them. An error without a
    /// host file.
    pub(crate) fn map_host_pages(&self, first: usize, count: usize) -> io::Result<()> {
        self.check_pages(first, count);
        if self.host_file < 0 || count == 0 {
            return Err(io::Error::other("this segment has no host file"));
        }
        let offset = first * PAGE_SIZE;
        for (base, prot) in [
            (self.app_base, libc::PROT_NONE),
            (self.runtime_base, libc::PROT_READ | libc::PROT_WRITE),
        ] {
            // SAFETY: the range lies inside one of our two views (checked above), which we
            // own and never unmap while the segment lives; MAP_FIXED replaces exactly those
            // pages, which no thread uses yet (they are being allocated), by the same
            // offset of the host's file (sized to the segment's length).
            let at = unsafe {
                libc::mmap(
                    (base + offset) as *mut libc::c_void,
                    count * PAGE_SIZE,
                    prot,
                    libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_NORESERVE,
                    self.host_file,
                    offset as libc::off_t,
                )
            };
            if at == libc::MAP_FAILED {
                return Err(os_err("mapping the host's memory"));
            }
        }
        Ok(())
    }

    /// The host lock in slot `index` (below [`HOST_LOCK_SLOTS`]) with its release clock.
    fn host_lock_at(&'static self, index: usize) -> HostLock {
        debug_assert!(index < HOST_LOCK_SLOTS && self.host_locks != 0);
        let entry = self.host_locks + index * host_entry_bytes(self.nodes);
        // SAFETY: the table mapping (`host_table_bytes(nodes)` long, page-aligned, shared,
        // unmapped only when the segment is dropped, which a `&'static` one never is:
        // `start` leaks it, so both may be borrowed for 'static) holds HOST_LOCK_SLOTS
        // entries of `host_entry_bytes(nodes)` bytes, each a slot followed by a clock of
        // `nodes` u32s; `index` is below HOST_LOCK_SLOTS, so both lie inside it, aligned
        // (entries are multiples of 64 bytes). All-zero bytes are valid atomics, and other
        // processes touch these bytes only through the same atomics.
        unsafe {
            let slot = &*(entry as *const HostLockSlot);
            let clocks = (entry + std::mem::size_of::<HostLockSlot>()) as *const AtomicU32;
            let clock = std::slice::from_raw_parts(clocks, self.nodes);
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
        // Consecutive ids (one lock per molecule) take consecutive entries, so a program's
        // locks share a few pages: each page a rank touches first costs it a fault. Named
        // locks' ids are hashes, spread anyway.
        let start = (id % HOST_LOCK_SLOTS as u64) as usize;
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

    /// Where the always-writable runtime view of the segment starts.
    pub(crate) fn runtime_base(&self) -> usize {
        self.runtime_base
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
    pub(crate) fn protect(&self, first: usize, count: usize, prot: PageAccess) -> io::Result<()> {
        self.check_pages(first, count);
        // SAFETY: the range lies inside our app-view mapping (checked above); changing its
        // protection cannot invalidate Rust references because app code only reaches the
        // app view through raw-pointer accessors in this module.
        let rc = unsafe {
            libc::mprotect(
                (self.app_base + first * PAGE_SIZE) as *mut libc::c_void,
                count * PAGE_SIZE,
                prot.bits(),
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
        // protocol (the page is read-protected in the app view before it is copied), except
        // by the app of another rank of the host on a page of the host's file: then each
        // byte copied is its old or its new value, and the write's notice, made at that
        // rank's next close, invalidates the copy.
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

/// Bytes of one entry of the host lock table: its slot and, right after it, its release
/// clock (one `u32` per rank), in whole 64-byte cache lines: the holder touches one line
/// (up to 8 ranks), and neighbouring locks share none.
fn host_entry_bytes(nodes: usize) -> usize {
    (std::mem::size_of::<HostLockSlot>() + 4 * nodes).next_multiple_of(64)
}

/// The descriptor behind the segment, `file_len` bytes long: the job's `common` file or a
/// memfd of this process's own (`len`, the segment's size, is for the message).
fn segment_file(common: Option<OwnedFd>, file_len: usize, len: usize) -> io::Result<libc::c_int> {
    let memfd = match common {
        Some(file) => file.into_raw_fd(),
        // SAFETY: the name is a valid NUL-terminated string.
        None => unsafe { libc::memfd_create(c"dsm-segment".as_ptr(), libc::MFD_CLOEXEC) },
    };
    if memfd < 0 {
        return Err(os_err("memfd_create"));
    }
    // SAFETY: ftruncate on our own descriptor.
    if unsafe { libc::ftruncate(memfd, file_len as libc::off_t) } != 0 {
        // SAFETY: memfd is our own and has not been shared.
        return Err(unsafe {
            close_on_failure(
                memfd,
                &format!(
                    "cannot size the segment's memfd to {} MiB (use a smaller dsmrun \
                 --segment or DSM_SEGMENT)",
                    len >> 20
                ),
            )
        });
    }
    Ok(memfd)
}

/// The error of the call that just failed, after closing `memfd`, the segment's
/// descriptor.
///
/// # Safety
/// `memfd` is the caller's own descriptor, not yet shared, and not used after this.
unsafe fn close_on_failure(memfd: libc::c_int, what: &str) -> io::Error {
    let e = os_err(what);
    // SAFETY: memfd is a descriptor we own and have not shared.
    unsafe { libc::close(memfd) };
    e
}

/// The app view: `len` bytes of `memfd` at `addr`, inaccessible. Closes `memfd` on failure.
///
/// # Safety
/// As for [`close_on_failure`]'s `memfd`, should this fail.
unsafe fn map_app_view(
    addr: usize,
    len: usize,
    memfd: libc::c_int,
) -> io::Result<*mut libc::c_void> {
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
        // SAFETY: memfd is ours to close (our contract).
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
        // SAFETY: memfd is ours to close (our contract).
        return Err(unsafe {
            close_on_failure(
                memfd,
                "the kernel placed the shared segment at another address",
            )
        });
    }
    Ok(app)
}

/// The runtime view: `len` bytes of `memfd`, writable, anywhere. Unmaps the app view `app`
/// and closes `memfd` on failure.
///
/// # Safety
/// `app` is the `len`-byte app view [`map_app_view`] just made, which nothing uses yet, and
/// `memfd` is as for [`close_on_failure`], should this fail.
unsafe fn map_runtime_view(
    app: *mut libc::c_void,
    len: usize,
    memfd: libc::c_int,
) -> io::Result<*mut libc::c_void> {
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
        // SAFETY: unmapping the app view our caller created for this segment, and memfd is
        // ours to close (our contract).
        unsafe { libc::munmap(app, len) };
        return Err(unsafe {
            close_on_failure(
                memfd,
                &format!(
                    "cannot map the runtime view of the {} MiB segment (use a smaller dsmrun \
                 --segment or DSM_SEGMENT, or raise ulimit -v)",
                    len >> 20
                ),
            )
        });
    }
    Ok(runtime)
}

/// The host lock table: the `table_len` bytes of a common segment file after the segment's
/// `len`, at an address returned. Unmaps both views and closes `memfd` on failure.
///
/// # Safety
/// `app` and `runtime` are the `len`-byte views just made, which nothing uses yet, and
/// `memfd` is as for [`close_on_failure`], should this fail.
unsafe fn map_host_table(
    app: *mut libc::c_void,
    runtime: *mut libc::c_void,
    len: usize,
    table_len: usize,
    memfd: libc::c_int,
) -> io::Result<usize> {
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
        // SAFETY: unmapping the two views our caller created for this segment, and memfd
        // is ours to close (our contract).
        unsafe {
            libc::munmap(app, len);
            libc::munmap(runtime, len);
            return Err(close_on_failure(memfd, "cannot map the host lock table"));
        }
    }
    Ok(table as usize)
}

/// Bytes of the host's applied-diff table after a host file's segment: a u32 per page and
/// node, in whole pages. Only the pages of entries in use take memory.
fn applied_table_bytes(len: usize, nodes: usize) -> usize {
    (len / PAGE_SIZE * nodes * 4).next_multiple_of(PAGE_SIZE)
}

/// Maps the applied-diff table of the host's file `fd` (after its `len`-byte segment),
/// writable, at an address returned. Closes `fd` on failure.
///
/// # Safety
/// `fd` is the caller's own descriptor of a file at least `len` plus the table long, not
/// used after a failure.
unsafe fn map_applied_table(fd: libc::c_int, len: usize, nodes: usize) -> io::Result<usize> {
    // SAFETY: a fresh shared mapping of the table part of our descriptor (offset `len`,
    // page-aligned) at a kernel-chosen address.
    let table = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            applied_table_bytes(len, nodes),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
            fd,
            len as libc::off_t,
        )
    };
    if table == libc::MAP_FAILED {
        // SAFETY: fd is ours to close (our contract).
        return Err(unsafe { close_on_failure(fd, "cannot map the host's table of diffs") });
    }
    Ok(table as usize)
}

/// Bytes of the host lock table at the end of a common segment file (4 MiB up to 8 ranks),
/// in whole pages.
fn host_table_bytes(nodes: usize) -> usize {
    (HOST_LOCK_SLOTS * host_entry_bytes(nodes)).next_multiple_of(PAGE_SIZE)
}

const LOCK_SLOT_EMPTY: u32 = 0;
const LOCK_SLOT_WRITING: u32 = 1;
const LOCK_SLOT_READY: u32 = 2;

/// One entry of the host lock table: which lock (`key`, valid once `tag` is ready) and its
/// ticket lock.
#[repr(C, align(32))]
struct HostLockSlot {
    tag: AtomicU32,
    lock: TicketLock,
    key: AtomicU64,
    /// Names the clock its last releaser left (see [`HostLock::released_stamp`]).
    stamp: AtomicU64,
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
        self.released().collect()
    }

    /// [`HostLock::released_clock`] without collecting it. Read without holding the lock,
    /// it is a guess that may be torn by a concurrent release.
    pub(crate) fn released(self) -> impl ExactSizeIterator<Item = u32> {
        self.clock.iter().map(|e| e.load(Ordering::Relaxed))
    }

    /// Stores what this rank knows as it releases the lock (one entry per rank), under
    /// `stamp`, a number no other release of the job uses. Call while holding the lock,
    /// before [`HostLock::unlock`].
    pub(crate) fn set_released_clock(self, known: &[u32], stamp: u64) {
        for (e, &v) in self.clock.iter().zip(known) {
            e.store(v, Ordering::Relaxed);
        }
        self.slot.stamp.store(stamp, Ordering::Relaxed);
    }

    /// The stamp the last [`HostLock::set_released_clock`] stored with its clock (0 if
    /// none did): a releaser that finds its own stamp still there knows the clock is the
    /// one it left, with one compare instead of one per rank. Ordered as the clock is.
    pub(crate) fn released_stamp(self) -> u64 {
        self.slot.stamp.load(Ordering::Relaxed)
    }

    /// Takes the lock, polling for `spin_ns` before sleeping.
    pub(crate) fn lock(self, spin_ns: u64) {
        self.slot.lock.lock(spin_ns);
    }

    /// Releases the lock to the next ticket, waking its holder if it sleeps.
    pub(crate) fn unlock(self) {
        self.slot.lock.unlock();
    }
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
            release_host_file(self.host_file, self.host_applied, self.len, self.nodes);
        }
    }
}

/// Unmaps the host's table of applied diffs at `table` and closes the host's file `fd`
/// (nothing when `fd` is -1, a segment without one).
///
/// # Safety
/// `fd` and `table` are the caller's own, made by [`Segment::map`] for a segment of `len`
/// bytes and `nodes` ranks, and not used afterwards.
unsafe fn release_host_file(fd: libc::c_int, table: usize, len: usize, nodes: usize) {
    if fd < 0 {
        return;
    }
    // SAFETY: our contract.
    unsafe {
        libc::munmap(table as *mut libc::c_void, applied_table_bytes(len, nodes));
        libc::close(fd);
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
pub(crate) fn set_global_segment(seg: &'static Segment) {
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

// ---------------------------------------------------------------------------------------
// Time and futexes, for the fault handler and the host locks (async-signal-safe).

/// CLOCK_MONOTONIC in nanoseconds, from the handler (clock_gettime is async-signal-safe).
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own; it is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub(crate) fn futex_wait(word: &AtomicU32, expected: u32) {
    futex(
        word,
        libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
        expected,
        0,
    );
}

/// `FUTEX_WAIT_BITSET` on a word other processes may map too: sleeps while `word` holds
/// `expected`, until a wake-up for a bit of `bitset`.
pub(crate) fn futex_wait_bitset(word: &AtomicU32, expected: u32, bitset: u32) {
    futex(word, libc::FUTEX_WAIT_BITSET, expected, bitset);
}

/// `FUTEX_WAKE_BITSET` on a word other processes may map too: wakes every sleeper on a
/// bit of `bitset`.
pub(crate) fn futex_wake_bitset(word: &AtomicU32, bitset: u32) {
    futex(word, libc::FUTEX_WAKE_BITSET, i32::MAX as u32, bitset);
}

pub(crate) fn futex_wake_all(word: &AtomicU32) {
    futex(
        word,
        libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
        i32::MAX as u32,
        0,
    );
}

pub(crate) fn errno_location() -> *mut libc::c_int {
    // SAFETY: __errno_location has no preconditions and returns the thread's errno slot.
    unsafe { libc::__errno_location() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh, empty memfd named `name`, as a rank's segment file.
    fn test_memfd(name: &std::ffi::CStr) -> OwnedFd {
        // SAFETY: memfd_create with a valid C string; the descriptor is checked and then
        // owned by the returned value alone.
        unsafe {
            let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
            std::os::fd::FromRawFd::from_raw_fd(fd)
        }
    }

    /// Two mappings of one common file, as two ranks have: increments made under a host
    /// lock from both are never lost, and a lock id means the same slot in both.
    #[test]
    fn host_locks_exclude_across_mappings_of_one_file() {
        let a = test_memfd(c"host-lock-test");
        let b = a.try_clone().expect("dup failed");
        let len = PAGE_SIZE;
        let one: &'static Segment = Box::leak(Box::new(
            Segment::map(0x5f00_0000_0000, len, SegmentFile::Common(a), 2).unwrap(),
        ));
        let two: &'static Segment = Box::leak(Box::new(
            Segment::map(0x5f10_0000_0000, len, SegmentFile::Common(b), 2).unwrap(),
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
                / host_entry_bytes(seg.nodes)
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
            Segment::map(0x5f20_0000_0000, PAGE_SIZE, SegmentFile::Own, 1).unwrap(),
        ));
        assert!(seg.host_lock(1).is_none());
        assert!(seg.map_host_pages(0, 1).is_err(), "no host file to map");
    }

    /// Two segments over one host file: the pages mapped from it are one memory, written
    /// through one's runtime view and read through the other's app view; the others stay
    /// each segment's own.
    #[test]
    fn pages_mapped_from_the_host_file_are_one_memory() {
        let a = test_memfd(c"host-memory-test");
        let b = a.try_clone().expect("dup failed");
        let len = 4 * PAGE_SIZE;
        let segs = [(0x5f30_0000_0000, a), (0x5f40_0000_0000, b)].map(|(addr, f)| {
            let seg: &'static Segment = Box::leak(Box::new(
                Segment::map(addr, len, SegmentFile::Host(f), 2).unwrap(),
            ));
            seg.map_host_pages(1, 2).unwrap();
            seg.protect(0, 4, PageAccess::Read).unwrap();
            seg
        });
        for page in 0..4 {
            segs[0].write_bytes(page, 8, &[page as u8 + 1; 8]);
        }
        let read = |seg: &'static Segment, page: usize| {
            AppSlice::<u64>::new(seg, page * PAGE_SIZE + 8, 1)
                .unwrap()
                .get(0)
        };
        for page in 0..4 {
            let expect = u64::from_ne_bytes([page as u8 + 1; 8]);
            assert_eq!(
                read(segs[0], page),
                expect,
                "page {page}, the writer's own view"
            );
            let shared = page == 1 || page == 2;
            assert_eq!(
                read(segs[1], page),
                if shared { expect } else { 0 },
                "page {page}"
            );
        }
    }

    /// A segment that cannot be mapped (its address is taken) releases the host's file it
    /// was given and the table it mapped from it: no descriptor of that file and no
    /// mapping of it stay in the process.
    #[test]
    fn a_failed_segment_releases_the_hosts_file() {
        let name = format!("host-release-test-{}", std::process::id());
        let file = test_memfd(&std::ffi::CString::new(name.clone()).unwrap());
        let taken = 0x5f50_0000_0000usize;
        occupy_page_for_test(taken).expect("the test's address was free");
        assert!(Segment::map(taken, 4 * PAGE_SIZE, SegmentFile::Host(file), 2).is_err());
        let memfd = format!("/memfd:{name}");
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(
            !maps.lines().any(|l| l.contains(&memfd)),
            "a mapping of the host's file is left:\n{maps}"
        );
        for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
            let target = std::fs::read_link(entry.unwrap().path()).unwrap_or_default();
            assert!(
                !target.to_string_lossy().contains(&memfd),
                "a descriptor of the host's file is left"
            );
        }
    }
}
