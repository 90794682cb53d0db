//! The ThreadSanitizer instrumentation ABI, as gcc and clang emit calls to it under
//! `-fsanitize=thread`, implemented for dsm.
//!
//! - `__tsan_read{1,2,4,8,16}`, `__tsan_write*`, their `_unaligned_` forms,
//!   `__tsan_read_range`/`__tsan_write_range`, `__tsan_vptr_read`/`__tsan_vptr_update`
//!   and clang's `__tsan_memcpy`/`__tsan_memmove`/`__tsan_memset`: an access inside the
//!   shared segment's allocations is recorded by the race recorder, its site being the
//!   hook's return address (inside the instrumented instruction's call) minus the
//!   executable's load bias; anything else returns after a range check.
//! - The hooks are assembly stubs that load the return address into a free argument
//!   register and jump to a Rust function: Rust has no stable way to read its own return
//!   address. The plain access hooks also make their common case there (see
//!   `SLOTS`). They exist for x86_64 only; elsewhere the symbols are left undefined, so
//!   a program fails to link instead of running unchecked.
//! - `__tsan_atomic{8,16,32,64}_*` (load, store, exchange, fetch_add/sub/and/or/xor/nand,
//!   compare_exchange strong/weak/val) and `__tsan_atomic_thread_fence`/`_signal_fence`
//!   perform the operation, sequentially consistent whatever order was asked (never
//!   weaker than asked). On shared memory they are recorded as **ordinary accesses**, not
//!   as synchronization and not ignored: dsm's coherence is lazy release consistency, so an
//!   atomic instruction is atomic on this rank's copy of the page only; two ranks'
//!   `fetch_add`s on one word in one epoch can lose an update when their diffs merge, and
//!   no atomic orders anything across ranks. Reporting them as races is the truth under
//!   dsm; synchronize with dsm_lock, barriers or semaphores. (Atomics outside the segment,
//!   between a rank's own threads, are only performed.) A read-modify-write is recorded as
//!   a write, which conflicts with everything a read would.
//! - `__tsan_init` notes that the program is instrumented (`dsm_init` refuses `--race`
//!   otherwise); `__tsan_func_entry`, `__tsan_func_exit`: nothing to do. dsm starts in
//!   `dsm_init`; reports name each side's access line, not a call chain, so no shadow call
//!   stack is kept.
//! - Not provided, so a program needing them fails at link time: 128-bit atomics,
//!   `__tsan_volatile_*` (gcc's `--param tsan-distinguish-volatile=1`), the
//!   `__tsan_*_pc` variants and anything else of libtsan's interface.

use crate::api::{NODE, RECORDING};
use dsm_race::Site;
use std::sync::atomic::{
    self, AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst,
};

/// Sites whose runs are combined at once (one slot each, by the low byte of the return
/// address). Call instructions are 5 bytes, so the sites of one loop body within 256
/// bytes of each other never collide. With 64 slots, clang's scalar SOR loop put three
/// of its six sites exactly 64 bytes apart: they evicted each other at every access, and
/// C SOR built by clang took 3.75x its time without `--race` (2.08x with a slot each).
pub(crate) const WAYS: usize = 256;

/// Which slots hold a run ([`flush_all`] visits only those), a bit per slot. Set by
/// [`record`] when a slot starts a run; the stubs only extend runs. Only the recording
/// thread touches it, so plain loads and stores (an atomic read-modify-write took a
/// locked instruction per run started, a row of a sweep).
static OCCUPIED: [AtomicU64; WAYS / 64] = [const { AtomicU64::new(0) }; WAYS / 64];

/// One site's run of accesses: elements of `len` bytes, `stride` bytes apart, from byte
/// `start` of allocation `array`; `next` is where the run's next element would be.
/// `stride` 0: one element so far (repeated or not). `ret` 0: an empty slot. A run may
/// step past its allocation's end (nothing bounds it while it grows, to keep that check
/// off the fast path): [`flush`] gives each element beyond it to the allocation it is in.
///
/// The recorder is called once per run (a loop's sweep of a row), not once per element;
/// runs are flushed before every dsm call that synchronizes ([`flush_all`]), so each lands
/// in the interval it was made in. The first three fields are read and `next` written by
/// the access stubs' assembly at these offsets, so the layout is fixed; each slot is a
/// cache line. Atomics only so that the table can be a static: only the recording thread
/// touches it (the stubs compare the thread first), so relaxed plain moves suffice.
#[repr(C, align(64))]
pub(crate) struct Slot {
    ret: AtomicUsize,
    next: AtomicUsize,
    stride: AtomicUsize,
    len: AtomicUsize,
    write: AtomicBool,
    array: AtomicUsize,
    start: AtomicUsize,
}

// The stubs index the table by the return address's low byte (`ret % WAYS`) times 64 and
// use the fields at 0, 8 and 16.
const _: () = assert!(std::mem::size_of::<Slot>() == 64 && WAYS == 256);

#[allow(clippy::declare_interior_mutable_const)] // an initializer, copied into SLOTS
const EMPTY: Slot = Slot {
    ret: AtomicUsize::new(0),
    next: AtomicUsize::new(0),
    stride: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    write: AtomicBool::new(false),
    array: AtomicUsize::new(0),
    start: AtomicUsize::new(0),
};

/// The runs being combined, of the one thread that records. A static, not a thread-local
/// or the node's, so that [`record`] and [`flush_all`] reach it like any static; the
/// stubs reach it through the thread-local `dsm_tsan_recording_slots` (below).
pub(crate) static SLOTS: [Slot; WAYS] = [EMPTY; WAYS];

// `dsm_tsan_recording_slots`, a thread-local word: [`SLOTS`]' address in the thread that
// records (the one that called `dsm_init`, under `--race`), 0 in every other thread and
// while none records. The access stubs' first test: one load (`fs:` plus an offset the
// linker fixes in an executable, through the GOT in `libdsm.so`) tells them both whether
// anything records and whether this thread does, and hands them the table. Defined in
// assembly, as Rust has no stable way to name a thread-local from `asm!`; initial-exec
// TLS, as the library is loaded with the program (a `dlopen`ed `libdsm.so` takes 8 bytes
// of the static TLS surplus the C library keeps for that).
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .tbss.dsm_tsan_recording_slots,\"awT\",@nobits",
    ".p2align 3",
    ".globl dsm_tsan_recording_slots",
    ".hidden dsm_tsan_recording_slots",
    ".type dsm_tsan_recording_slots,@object",
    ".size dsm_tsan_recording_slots,8",
    "dsm_tsan_recording_slots:",
    ".zero 8",
    ".popsection",
);

/// Names the thread-local of the comment above in this file's assembly.
#[cfg(target_arch = "x86_64")]
macro_rules! recording_slots_offset {
    () => {
        "qword ptr [rip + dsm_tsan_recording_slots@GOTTPOFF]"
    };
}

/// Sets this thread's `dsm_tsan_recording_slots` (see [`SLOTS`]).
#[cfg(target_arch = "x86_64")]
fn set_recording_slots(slots: usize) {
    // SAFETY: writes this thread's own 8-byte thread-local `dsm_tsan_recording_slots`
    // (defined above; the GOT entry holds its offset from the thread pointer), which only
    // the stubs of this thread read.
    unsafe {
        std::arch::asm!(
            concat!("mov {offset}, ", recording_slots_offset!()),
            "mov qword ptr fs:[{offset}], {slots}",
            offset = out(reg) _,
            slots = in(reg) slots,
            options(nostack, preserves_flags),
        )
    };
}

/// Elsewhere the stubs do not exist.
#[cfg(not(target_arch = "x86_64"))]
fn set_recording_slots(_: usize) {}

/// The shared allocations' address range, `SHARED_LO..SHARED_HI` (empty until the first
/// allocation), for the access stubs' range check.
pub(crate) static SHARED_LO: AtomicUsize = AtomicUsize::new(0);
pub(crate) static SHARED_HI: AtomicUsize = AtomicUsize::new(0);

/// Sets the range of [`SHARED_LO`] and [`SHARED_HI`] (after an allocation).
pub(crate) fn set_shared_range(lo: usize, hi: usize) {
    SHARED_LO.store(lo, Relaxed);
    SHARED_HI.store(hi, Relaxed);
}

/// Starts or stops recording this thread's accesses (`dsm_init`, `dsm_finish`).
pub(crate) fn set_recording(on: bool) {
    set_recording_slots(if on { SLOTS.as_ptr() as usize } else { 0 });
}

/// The slot of the call site returning to `ret`, as the stubs pick it (its low byte).
#[inline(always)]
fn way_of(ret: usize) -> usize {
    ret % WAYS
}

#[inline(always)]
fn slot_of(ret: usize) -> &'static Slot {
    &SLOTS[way_of(ret)]
}

/// Records an access of `len` bytes at `addr`, made by the call returning to `ret`, when
/// this thread records: the Rust form of the access stubs' fast path (which the other
/// hooks take, and the plain access hooks after their stub's path missed): the next
/// element of its site's run, or its last element again, costs a few compares; anything
/// else goes to [`record`].
#[inline(always)]
fn hook(addr: usize, len: usize, write: bool, ret: usize) {
    if !RECORDING.get() {
        return;
    }
    let p = NODE.get();
    if p.is_null() {
        return;
    }
    let s = slot_of(ret);
    if s.ret.load(Relaxed) == ret && s.len.load(Relaxed) == len && s.write.load(Relaxed) == write {
        let (next, stride) = (s.next.load(Relaxed), s.stride.load(Relaxed));
        if addr == next {
            return s.next.store(addr + stride, Relaxed);
        }
        if addr == next.wrapping_sub(stride) {
            return; // the run's last element again
        }
    }
    // SAFETY: `RECORDING` is set only while `NODE` holds the live node of this thread
    // (`dsm_init` to `dsm_finish`). Hooks run from instrumented C code, never inside a
    // dsm API call, so no `&mut` to the node is alive; this shared reference ends with
    // the call.
    record(unsafe { &*p }, addr, len, write, ret);
}

/// [`hook`]'s slow path: an access that does not continue its site's run.
#[inline(never)]
fn record(node: &crate::api::Node, addr: usize, len: usize, write: bool, ret: usize) {
    let end = addr.saturating_add(len);
    if len == 0 || addr >= node.hi || end <= node.lo {
        return;
    }
    let i = find(node, addr);
    let (start, stop) = node.spans[i];
    if addr < start || end > stop {
        return record_spanning(node, addr, end, write, ret);
    }
    let s = slot_of(ret);
    let ours = s.ret.load(Relaxed) == ret
        && s.array.load(Relaxed) == i
        && s.write.load(Relaxed) == write
        && s.len.load(Relaxed) == len;
    let stride = s.stride.load(Relaxed);
    // The second element of a run sets its stride (or corrects the one guessed).
    let first = start + s.start.load(Relaxed);
    if ours && s.next.load(Relaxed) == first + stride && addr >= first + len {
        let stride = addr - first;
        s.stride.store(stride, Relaxed);
        s.next.store(addr + stride, Relaxed);
        return;
    }
    if s.ret.load(Relaxed) != 0 {
        flush(node, s);
    }
    let way = way_of(ret);
    let word = &OCCUPIED[way / 64];
    word.store(word.load(Relaxed) | 1 << (way % 64), Relaxed);
    // A site's next run is guessed to have its last run's stride (a loop's next row), so
    // that its second element takes the stubs' path too; `next` at the element itself
    // with stride 0 otherwise: repeats of it continue the run.
    let stride = if ours { stride } else { 0 };
    s.ret.store(ret, Relaxed);
    s.next.store(addr + stride, Relaxed);
    s.stride.store(stride, Relaxed);
    s.len.store(len, Relaxed);
    s.write.store(write, Relaxed);
    s.array.store(i, Relaxed);
    s.start.store(addr - start, Relaxed);
}

/// Records slot `s`'s run with the recorder.
fn flush(node: &crate::api::Node, s: &Slot) {
    let a = &node.arrays[s.array.load(Relaxed)];
    let ret = s.ret.load(Relaxed);
    let (start, len, stride) = (
        s.start.load(Relaxed),
        s.len.load(Relaxed),
        s.stride.load(Relaxed),
    );
    let write = s.write.load(Relaxed);
    let first = a.addr() + start;
    // Stride 0: one element.
    let count = (s.next.load(Relaxed) - first)
        .checked_div(stride)
        .unwrap_or(1);
    // The elements inside the run's allocation (the first one always is).
    let last_fitting = a.addr() + a.bytes() - len;
    let inside = (last_fitting - first)
        .checked_div(stride)
        .map_or(1, |k| (k + 1).min(count));
    if let Some(shadow) = node.dsm.raw_shadow(a) {
        let site = Site::Code(ret.wrapping_sub(node.bias) as u64);
        if inside == 1 {
            shadow.access_at(write, start, len, site);
        } else {
            shadow.strided_at(write, start, len, stride, inside, site);
        }
    }
    // A run that went on past its allocation (a loop over adjacent allocations, or past
    // the last one): rare, so element by element; those past every allocation are not
    // shared memory.
    for k in inside..count {
        let at = first + k * stride;
        if at >= node.hi {
            break;
        }
        record_spanning(node, at, at + len, write, ret);
    }
}

/// Records every pending run: before a synchronization closes the interval.
pub(crate) fn flush_all(node: &crate::api::Node) {
    for (w, word) in OCCUPIED.iter().enumerate() {
        let mut bits = word.load(Relaxed);
        word.store(0, Relaxed);
        while bits != 0 {
            let s = &SLOTS[w * 64 + bits.trailing_zeros() as usize];
            bits &= bits - 1;
            if s.ret.load(Relaxed) != 0 {
                flush(node, s);
                s.ret.store(0, Relaxed);
            }
        }
    }
}

/// An access reaching outside one allocation (a range over several, or into the padding
/// after an allocation's last element): each allocation gets its part, recorded at once.
#[cold]
fn record_spanning(node: &crate::api::Node, addr: usize, end: usize, write: bool, ret: usize) {
    let site = Site::Code(ret.wrapping_sub(node.bias) as u64);
    let mut at = addr.max(node.lo);
    while at < end.min(node.hi) {
        let a = &node.arrays[find(node, at)];
        let (start, stop) = (a.addr(), a.addr() + a.bytes());
        if at < start {
            at = start;
            continue;
        }
        if at >= stop {
            break; // past the last allocation's last element
        }
        let upto = end.min(stop);
        if let Some(shadow) = node.dsm.raw_shadow(a) {
            shadow.access_at(write, at - start, upto - at, site);
        }
        at = stop;
    }
}

/// The allocation holding `addr` (or the first after it), the last one found first.
#[inline(always)]
fn find(node: &crate::api::Node, addr: usize) -> usize {
    let last = node.last.get();
    if let Some(&(start, stop)) = node.spans.get(last) {
        if start <= addr && addr < stop {
            return last;
        }
    }
    let i = node
        .spans
        .partition_point(|&(_, stop)| stop <= addr)
        .min(node.spans.len() - 1);
    node.last.set(i);
    i
}

/// Defines `$stub`, which loads its return address into `$reg` and jumps to `$body`. A
/// naked function, so that it is exported from `libdsm.so` like any `#[no_mangle]`
/// function (symbols of `global_asm!` are not).
macro_rules! stub {
    ($stub:ident, $reg:literal, $body:path) => {
        // SAFETY: the stub only copies its return address (at [rsp] on entry) into
        // `$reg`, an argument register its caller's call does not use, and tail-jumps to
        // `$body`, an `extern "C"` function that takes the caller's arguments plus that
        // one: the stack and every other register are as the caller left them, so
        // `$body` returns straight to the caller.
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        #[no_mangle]
        #[doc(hidden)]
        pub extern "C" fn $stub() {
            std::arch::naked_asm!(
                concat!("mov ", $reg, ", qword ptr [rsp]"),
                "jmp {body}",
                body = sym $body,
            )
        }
    };
}

/// `__tsan_{read,write}N(addr)` and their unaligned forms. The stub returns at once unless
/// this thread records (its `dsm_tsan_recording_slots`); continues its site's run in
/// [`SLOTS`] when `addr` is the run's next element (the one case that matters for speed: a loop's
/// sweep); returns when the access lies outside the shared allocations (private memory:
/// the program's other accesses); else jumps to `$body` with the return address in rsi.
/// A slot's return address fixes which hook the call site calls, hence the access's
/// length and kind: the stub need not compare them.
///
/// The stubs share one section and each ends padded to 64 bytes, so every stub starts on
/// a cache line: the path without `--race` never straddles two lines. Where a stub landed
/// by chance of the link, the C SOR without `--race` ran about 20% slower from one build
/// to the next.
macro_rules! access {
    ($body:ident, $len:literal, $write:literal, $($stub:ident),+) => {
        extern "C" fn $body(addr: usize, ret: usize) {
            hook(addr, $len, $write, ret);
        }
        $(
            // SAFETY: as for `stub!`. Before that, the stub uses only rax, rcx and rsi
            // (scratch registers of the C calling convention, free at a call), reads its
            // thread's `dsm_tsan_recording_slots` and, when that is `SLOTS`, its slot
            // there, and writes that slot's `next`, which only this thread (the one that
            // records) reads or writes (`Slot`'s layout is `repr(C)`, 64 bytes, checked
            // at compile time).
            #[cfg(target_arch = "x86_64")]
            #[unsafe(naked)]
            #[no_mangle]
            #[doc(hidden)]
            #[link_section = ".text.dsm_tsan_access"]
            pub extern "C" fn $stub() {
                std::arch::naked_asm!(
                    // Without --race, and in threads that do not record: a test falling
                    // through to the return (a taken jump to a `ret` at the end made the
                    // run without --race 30-40% slower).
                    concat!("mov rax, ", recording_slots_offset!()),
                    "mov rcx, qword ptr fs:[rax]",
                    "test rcx, rcx",
                    "jnz 4f",
                    "ret",
                    "4:",
                    "mov rsi, qword ptr [rsp]",
                    "movzx eax, sil",
                    "shl eax, 6",
                    "cmp rsi, qword ptr [rcx + rax]",
                    "jne 2f",
                    "cmp rdi, qword ptr [rcx + rax + 8]",
                    "jne 2f",
                    "add rdi, qword ptr [rcx + rax + 16]",
                    "mov qword ptr [rcx + rax + 8], rdi",
                    "3:",
                    "ret",
                    "2:",
                    "lea rax, [rdi + {len} - 1]",
                    "cmp rax, qword ptr [rip + {lo}]",
                    "jb 3b",
                    "cmp rdi, qword ptr [rip + {hi}]",
                    "jae 3b",
                    "jmp {body}",
                    // The next stub of the section starts on a cache line (see above).
                    ".p2align 6",
                    lo = sym SHARED_LO,
                    hi = sym SHARED_HI,
                    len = const $len,
                    body = sym $body,
                )
            }
        )+
    };
}

access!(read1, 1, false, __tsan_read1, __tsan_unaligned_read1);
access!(read2, 2, false, __tsan_read2, __tsan_unaligned_read2);
access!(read4, 4, false, __tsan_read4, __tsan_unaligned_read4);
access!(
    read8,
    8,
    false,
    __tsan_read8,
    __tsan_unaligned_read8,
    __tsan_vptr_read
);
access!(read16, 16, false, __tsan_read16, __tsan_unaligned_read16);
access!(write1, 1, true, __tsan_write1, __tsan_unaligned_write1);
access!(write2, 2, true, __tsan_write2, __tsan_unaligned_write2);
access!(write4, 4, true, __tsan_write4, __tsan_unaligned_write4);
access!(write8, 8, true, __tsan_write8, __tsan_unaligned_write8);
access!(write16, 16, true, __tsan_write16, __tsan_unaligned_write16);

/// `__tsan_vptr_update(void **vptr, void *new)`: a write of the pointer (return address
/// in rdx).
extern "C" fn vptr_update(addr: usize, _new: usize, ret: usize) {
    hook(addr, 8, true, ret);
}
stub!(__tsan_vptr_update, "rdx", vptr_update);

/// `__tsan_read_range(addr, size)` (return address in rdx).
extern "C" fn read_range(addr: usize, size: usize, ret: usize) {
    hook(addr, size, false, ret);
}
stub!(__tsan_read_range, "rdx", read_range);

/// `__tsan_write_range(addr, size)` (return address in rdx).
extern "C" fn write_range(addr: usize, size: usize, ret: usize) {
    hook(addr, size, true, ret);
}
stub!(__tsan_write_range, "rdx", write_range);

/// clang's `__tsan_memcpy(dst, src, n)` (return address in rcx): records, then copies.
/// `memmove`, so that overlapping arguments are not undefined behaviour here.
extern "C" fn memcpy_hook(dst: *mut u8, src: *const u8, n: usize, ret: usize) -> *mut u8 {
    hook(src as usize, n, false, ret);
    hook(dst as usize, n, true, ret);
    // SAFETY: the compiler replaced a `memcpy`/`memmove` of these arguments with this
    // call, so they are valid for `n` bytes as the program's own call required.
    unsafe { std::ptr::copy(src, dst, n) };
    dst
}
stub!(__tsan_memcpy, "rcx", memcpy_hook);
stub!(__tsan_memmove, "rcx", memcpy_hook);

/// clang's `__tsan_memset(dst, c, n)` (return address in rcx).
extern "C" fn memset_hook(dst: *mut u8, c: i32, n: usize, ret: usize) -> *mut u8 {
    hook(dst as usize, n, true, ret);
    // SAFETY: as for `memcpy_hook`: the program's own `memset` of these arguments.
    unsafe { std::ptr::write_bytes(dst, c as u8, n) };
    dst
}
stub!(__tsan_memset, "rcx", memset_hook);

/// Whether instrumented code ran `__tsan_init` (every instrumented object calls it from a
/// constructor, before `main`): `dsm_init` under `--race` refuses a program that was not
/// compiled with `-fsanitize=thread`, whose accesses no hook would record.
pub(crate) static INSTRUMENTED: AtomicBool = AtomicBool::new(false);

/// `void __tsan_init(void)`: dsm starts in `dsm_init`; this notes that the program is
/// instrumented.
#[no_mangle]
pub extern "C" fn __tsan_init() {
    INSTRUMENTED.store(true, Relaxed);
}

/// `void __tsan_func_entry(void *pc)`: no call stack is kept (see the module docs).
#[no_mangle]
pub extern "C" fn __tsan_func_entry(_pc: *mut std::ffi::c_void) {}

/// `void __tsan_func_exit(void)`.
#[no_mangle]
pub extern "C" fn __tsan_func_exit() {}

/// `void __tsan_atomic_thread_fence(int mo)`.
#[no_mangle]
pub extern "C" fn __tsan_atomic_thread_fence(_mo: i32) {
    atomic::fence(SeqCst);
}

/// `void __tsan_atomic_signal_fence(int mo)`.
#[no_mangle]
pub extern "C" fn __tsan_atomic_signal_fence(_mo: i32) {
    atomic::compiler_fence(SeqCst);
}

/// The atomic hooks of one width, in module `$m`. Every body takes six integer arguments,
/// the return address last (r9, loaded by its stub); C's narrower arguments arrive in
/// full registers whose upper bits are unspecified, hence the truncating casts. Memory
/// orders are ignored: every operation is sequentially consistent.
macro_rules! atomics {
    ($m:ident, $t:ty, $atomic:ty, $($stub:ident = $op:ident),+) => {
        mod $m {
            use super::{hook, SeqCst};
            const LEN: usize = std::mem::size_of::<$t>();

            /// The atomic at `a`.
            fn at<'a>(a: usize) -> &'a $atomic {
                // SAFETY: the compiler passes the address of the atomic object the
                // program operates on: valid, aligned (C's atomic types are) and only
                // accessed atomically while the program's own operation would be.
                unsafe { <$atomic>::from_ptr(a as *mut $t) }
            }

            pub(super) extern "C" fn load(a: usize, _: u64, _: u64, _: u64, _: u64, ret: usize) -> $t {
                hook(a, LEN, false, ret);
                at(a).load(SeqCst)
            }

            pub(super) extern "C" fn store(a: usize, v: u64, _: u64, _: u64, _: u64, ret: usize) {
                hook(a, LEN, true, ret);
                at(a).store(v as $t, SeqCst)
            }

            pub(super) extern "C" fn exchange(a: usize, v: u64, _: u64, _: u64, _: u64, ret: usize) -> $t {
                hook(a, LEN, true, ret);
                at(a).swap(v as $t, SeqCst)
            }

            pub(super) extern "C" fn fetch_add(a: usize, v: u64, _: u64, _: u64, _: u64, ret: usize) -> $t {
                hook(a, LEN, true, ret);
                at(a).fetch_add(v as $t, SeqCst)
            }

            pub(super) extern "C" fn fetch_sub(a: usize, v: u64, _: u64, _: u64, _: u64, ret: usize) -> $t {
                hook(a, LEN, true, ret);
                at(a).fetch_sub(v as $t, SeqCst)
            }

            pub(super) extern "C" fn fetch_and(a: usize, v: u64, _: u64, _: u64, _: u64, ret: usize) -> $t {
                hook(a, LEN, true, ret);
                at(a).fetch_and(v as $t, SeqCst)
            }

            pub(super) extern "C" fn fetch_or(a: usize, v: u64, _: u64, _: u64, _: u64, ret: usize) -> $t {
                hook(a, LEN, true, ret);
                at(a).fetch_or(v as $t, SeqCst)
            }

            pub(super) extern "C" fn fetch_xor(a: usize, v: u64, _: u64, _: u64, _: u64, ret: usize) -> $t {
                hook(a, LEN, true, ret);
                at(a).fetch_xor(v as $t, SeqCst)
            }

            pub(super) extern "C" fn fetch_nand(a: usize, v: u64, _: u64, _: u64, _: u64, ret: usize) -> $t {
                hook(a, LEN, true, ret);
                at(a).fetch_nand(v as $t, SeqCst)
            }

            /// `int compare_exchange_{strong,weak}(a, T *expected, T desired, mo, fmo)`:
            /// on failure the current value goes to `*expected`. Strong serves for weak.
            pub(super) extern "C" fn compare_exchange(a: usize, c: usize, v: u64, _: u64, _: u64, ret: usize) -> i32 {
                hook(a, LEN, true, ret);
                let expected = c as *mut $t;
                // SAFETY: `expected` points at the program's expected value, as the
                // operation it replaces requires.
                let old = unsafe { expected.read() };
                match at(a).compare_exchange(old, v as $t, SeqCst, SeqCst) {
                    Ok(_) => 1,
                    Err(now) => {
                        // SAFETY: as above.
                        unsafe { expected.write(now) };
                        0
                    }
                }
            }

            /// `T compare_exchange_val(a, T expected, T desired, mo, fmo)`: the old value.
            pub(super) extern "C" fn compare_exchange_val(a: usize, c: u64, v: u64, _: u64, _: u64, ret: usize) -> $t {
                hook(a, LEN, true, ret);
                match at(a).compare_exchange(c as $t, v as $t, SeqCst, SeqCst) {
                    Ok(old) | Err(old) => old,
                }
            }
        }
        $(stub!($stub, "r9", $m::$op);)+
    };
}

atomics!(
    a8,
    u8,
    std::sync::atomic::AtomicU8,
    __tsan_atomic8_load = load,
    __tsan_atomic8_store = store,
    __tsan_atomic8_exchange = exchange,
    __tsan_atomic8_fetch_add = fetch_add,
    __tsan_atomic8_fetch_sub = fetch_sub,
    __tsan_atomic8_fetch_and = fetch_and,
    __tsan_atomic8_fetch_or = fetch_or,
    __tsan_atomic8_fetch_xor = fetch_xor,
    __tsan_atomic8_fetch_nand = fetch_nand,
    __tsan_atomic8_compare_exchange_strong = compare_exchange,
    __tsan_atomic8_compare_exchange_weak = compare_exchange,
    __tsan_atomic8_compare_exchange_val = compare_exchange_val
);
atomics!(
    a16,
    u16,
    std::sync::atomic::AtomicU16,
    __tsan_atomic16_load = load,
    __tsan_atomic16_store = store,
    __tsan_atomic16_exchange = exchange,
    __tsan_atomic16_fetch_add = fetch_add,
    __tsan_atomic16_fetch_sub = fetch_sub,
    __tsan_atomic16_fetch_and = fetch_and,
    __tsan_atomic16_fetch_or = fetch_or,
    __tsan_atomic16_fetch_xor = fetch_xor,
    __tsan_atomic16_fetch_nand = fetch_nand,
    __tsan_atomic16_compare_exchange_strong = compare_exchange,
    __tsan_atomic16_compare_exchange_weak = compare_exchange,
    __tsan_atomic16_compare_exchange_val = compare_exchange_val
);
atomics!(
    a32,
    u32,
    std::sync::atomic::AtomicU32,
    __tsan_atomic32_load = load,
    __tsan_atomic32_store = store,
    __tsan_atomic32_exchange = exchange,
    __tsan_atomic32_fetch_add = fetch_add,
    __tsan_atomic32_fetch_sub = fetch_sub,
    __tsan_atomic32_fetch_and = fetch_and,
    __tsan_atomic32_fetch_or = fetch_or,
    __tsan_atomic32_fetch_xor = fetch_xor,
    __tsan_atomic32_fetch_nand = fetch_nand,
    __tsan_atomic32_compare_exchange_strong = compare_exchange,
    __tsan_atomic32_compare_exchange_weak = compare_exchange,
    __tsan_atomic32_compare_exchange_val = compare_exchange_val
);
atomics!(
    a64,
    u64,
    std::sync::atomic::AtomicU64,
    __tsan_atomic64_load = load,
    __tsan_atomic64_store = store,
    __tsan_atomic64_exchange = exchange,
    __tsan_atomic64_fetch_add = fetch_add,
    __tsan_atomic64_fetch_sub = fetch_sub,
    __tsan_atomic64_fetch_and = fetch_and,
    __tsan_atomic64_fetch_or = fetch_or,
    __tsan_atomic64_fetch_xor = fetch_xor,
    __tsan_atomic64_fetch_nand = fetch_nand,
    __tsan_atomic64_compare_exchange_strong = compare_exchange,
    __tsan_atomic64_compare_exchange_weak = compare_exchange,
    __tsan_atomic64_compare_exchange_val = compare_exchange_val
);
