//! The C API of `include/dsm.h`: one node per process, owned by the thread that called
//! `dsm_init`, behind a thread-local pointer that the ThreadSanitizer hooks ([`crate::tsan`])
//! read too. Every call runs under `catch_unwind`; errors come back as negative codes with
//! their message kept for `dsm_last_error`.

use dsm_core::{Dsm, DsmError, RawArray, Semaphore};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// `DSM_EINVAL`: an argument the API does not accept.
pub const DSM_EINVAL: c_int = -1;
/// `DSM_ESTATE`: no node on this thread (before `dsm_init`, after `dsm_finish`, or
/// another thread).
pub const DSM_ESTATE: c_int = -2;
/// `DSM_EFAIL`: the runtime failed.
pub const DSM_EFAIL: c_int = -3;
/// `DSM_EBUG`: a panic inside dsm.
pub const DSM_EBUG: c_int = -4;

/// A failed call: its code and message.
struct Failure(c_int, String);

impl From<DsmError> for Failure {
    fn from(e: DsmError) -> Self {
        let code = match e {
            DsmError::InvalidAlloc(_) | DsmError::Config(_) => DSM_EINVAL,
            _ => DSM_EFAIL,
        };
        Failure(code, e.to_string())
    }
}

fn invalid(msg: impl Into<String>) -> Failure {
    Failure(DSM_EINVAL, msg.into())
}

/// This process's node, as the C API and the hooks see it.
pub(crate) struct Node {
    pub(crate) dsm: Dsm,
    /// The allocations, in address order (dsm allocates upwards).
    pub(crate) arrays: Vec<RawArray>,
    /// Each allocation's address range (`start..stop`), in the same order.
    pub(crate) spans: Vec<(usize, usize)>,
    /// The allocations' address range (`lo..hi`): one compare pair for a hook's access.
    pub(crate) lo: usize,
    pub(crate) hi: usize,
    /// The array the last recorded access fell in (accesses come in runs).
    pub(crate) last: Cell<usize>,
    /// The executable's load bias, subtracted from code addresses so that sites mean the
    /// same on every rank.
    pub(crate) bias: usize,
    /// Locks this rank holds, so that releasing one it does not hold is an error here
    /// rather than a protocol failure.
    held: Vec<u64>,
    named: HashMap<String, u64>,
    semaphores: Vec<Semaphore>,
}

/// Whether `dsm_finish` ran in this process: a process is one node, once.
static FINISHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

thread_local! {
    /// The node of this thread (null: none). Set by `dsm_init`, taken by `dsm_finish`.
    pub(crate) static NODE: Cell<*mut Node> = const { Cell::new(std::ptr::null_mut()) };
    /// Whether this thread's accesses are recorded: a node is here and `--race` is on.
    /// The one test every hook makes.
    pub(crate) static RECORDING: Cell<bool> = const { Cell::new(false) };
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

impl Node {
    fn dsm_owned(self: Box<Self>) -> Dsm {
        self.dsm
    }
}

fn set_error(msg: &str) {
    // A message with a NUL byte is cut there rather than lost.
    let msg = msg.split('\0').next().unwrap_or_default();
    let c = CString::new(msg).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs `f` for a C entry point: panics and errors become `fail`'s code, the message kept.
fn guarded<T>(fail: impl Fn(c_int) -> T, f: impl FnOnce() -> Result<T, Failure>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(Failure(code, msg))) => {
            set_error(&msg);
            fail(code)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            set_error(&format!("internal error in dsm: {what}"));
            fail(DSM_EBUG)
        }
    }
}

/// Runs `f` on this thread's node.
fn with_node<T>(f: impl FnOnce(&mut Node) -> Result<T, Failure>) -> Result<T, Failure> {
    let p = NODE.get();
    if p.is_null() {
        return Err(Failure(
            DSM_ESTATE,
            "no dsm node on this thread: call dsm_init first (from the thread that uses dsm), \
             and nothing after dsm_finish"
                .into(),
        ));
    }
    // SAFETY: `p` came from `Box::into_raw` in `dsm_init` and stays valid until
    // `dsm_finish` nulls the pointer before freeing it; it is only reachable from this
    // thread (thread-local). No other reference to the node is alive during this call: the
    // hooks make theirs only while instrumented C code runs, never inside a dsm call (dsm is
    // not instrumented), and API calls do not nest.
    let node = unsafe { &mut *p };
    // The accesses the hooks are still combining belong to the interval this call may
    // close.
    crate::tsan::flush_all(node);
    f(node)
}

/// A C string argument as UTF-8.
///
/// # Safety
/// `s` is null or points to a NUL-terminated string.
unsafe fn str_arg<'a>(s: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if s.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: not null, and NUL-terminated by the caller's contract (dsm.h).
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str()
        .map_err(|_| invalid(format!("{what} is not UTF-8")))
}

/// The load bias of the executable: `dl_iterate_phdr` reports the main program first.
fn executable_bias() -> usize {
    extern "C" fn first(info: *mut libc::dl_phdr_info, _size: usize, out: *mut c_void) -> c_int {
        // SAFETY: the C library passes a valid `info` for the duration of the callback,
        // and `out` is the `usize` that `executable_bias` passed in.
        unsafe { *(out as *mut usize) = (*info).dlpi_addr as usize };
        1 // stop after the first object: the executable
    }
    let mut bias = 0usize;
    // SAFETY: `first` matches the callback type and writes only through `out`, which
    // points at `bias`, alive for the call.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut bias as *mut usize as *mut c_void) };
    bias
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env(dsm_core::env_vars::LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// `int dsm_init(void)`
#[no_mangle]
pub extern "C" fn dsm_init() -> c_int {
    guarded(
        |c| c,
        || {
            if !NODE.get().is_null() {
                return Err(Failure(DSM_ESTATE, "dsm_init called twice".into()));
            }
            if FINISHED.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(Failure(
                    DSM_ESTATE,
                    "dsm_init after dsm_finish: a process is one node, once".into(),
                ));
            }
            init_logging();
            let config = Dsm::job_config()?;
            if config.race.enabled
                && !crate::tsan::INSTRUMENTED.load(std::sync::atomic::Ordering::Relaxed)
            {
                return Err(invalid(
                    "race detection (--race) needs a program compiled with ThreadSanitizer \
                     instrumentation (-fsanitize=thread, as dsmcc compiles): this one was not, \
                     so none of its accesses would be recorded and no race could be found",
                ));
            }
            let dsm = Dsm::init_with(config)?;
            let race = dsm.race_detection();
            let node = Box::new(Node {
                dsm,
                arrays: Vec::new(),
                spans: Vec::new(),
                lo: 0,
                hi: 0,
                last: Cell::new(0),
                bias: executable_bias(),
                held: Vec::new(),
                named: HashMap::new(),
                semaphores: Vec::new(),
            });
            NODE.set(Box::into_raw(node));
            RECORDING.set(race);
            crate::tsan::set_recording(race);
            finish_at_exit_once();
            Ok(0)
        },
    )
}

/// `int dsm_rank(void)`
#[no_mangle]
pub extern "C" fn dsm_rank() -> c_int {
    guarded(|c| c, || with_node(|n| Ok(n.dsm.rank() as c_int)))
}

/// `int dsm_size(void)`
#[no_mangle]
pub extern "C" fn dsm_size() -> c_int {
    guarded(|c| c, || with_node(|n| Ok(n.dsm.size() as c_int)))
}

/// `int dsm_race_detection(void)`
#[no_mangle]
pub extern "C" fn dsm_race_detection() -> c_int {
    guarded(
        |c| c,
        || with_node(|n| Ok(c_int::from(n.dsm.race_detection()))),
    )
}

fn alloc(name: *const c_char, elem: usize, len: usize, cols: usize) -> *mut c_void {
    guarded(
        |_| std::ptr::null_mut(),
        || {
            // SAFETY: dsm.h asks for a NUL-terminated name.
            let name = unsafe { str_arg(name, "the allocation's name") }?;
            with_node(|n| {
                let a = n.dsm.alloc_raw(name, elem, len, cols)?;
                n.lo = n.arrays.first().map_or(a.addr(), |f| f.addr());
                n.hi = a.addr() + a.bytes();
                n.arrays.push(a);
                n.spans.push((a.addr(), a.addr() + a.bytes()));
                crate::tsan::set_shared_range(n.lo, n.hi);
                Ok(a.addr() as *mut c_void)
            })
        },
    )
}

/// `void *dsm_alloc(const char *name, size_t elem_size, size_t count)`
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dsm_alloc(
    name: *const c_char,
    elem_size: usize,
    count: usize,
) -> *mut c_void {
    alloc(name, elem_size, count, 0)
}

/// `void *dsm_alloc_2d(const char *name, size_t elem_size, size_t rows, size_t cols)`
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dsm_alloc_2d(
    name: *const c_char,
    elem_size: usize,
    rows: usize,
    cols: usize,
) -> *mut c_void {
    if cols == 0 {
        set_error("dsm_alloc_2d: zero columns");
        return std::ptr::null_mut();
    }
    match rows.checked_mul(cols) {
        Some(len) => alloc(name, elem_size, len, cols),
        None => {
            set_error("dsm_alloc_2d: rows * cols overflows");
            std::ptr::null_mut()
        }
    }
}

/// The allocation that starts at `array`, for `call`'s message when there is none.
fn allocation_at(n: &Node, array: *const c_void, call: &str) -> Result<RawArray, Failure> {
    n.arrays
        .iter()
        .find(|a| a.addr() == array as usize)
        .copied()
        .ok_or_else(|| {
            invalid(format!(
                "{call}: {array:p} is not the start of a shared allocation"
            ))
        })
}

/// `int dsm_assume_initialised(const void *array)`: `--check` takes the zero fill of the
/// allocation that starts at `array` as its initial value ([`dsm_core::Dsm::assume_initialised`]).
#[no_mangle]
pub extern "C" fn dsm_assume_initialised(array: *const c_void) -> c_int {
    guarded(
        |c| c,
        || {
            with_node(|n| {
                let a = allocation_at(n, array, "dsm_assume_initialised")?;
                n.dsm.assume_raw_initialised(&a);
                Ok(0)
            })
        },
    )
}

/// `int dsm_declare_region(const void *array, int rule, const size_t *first, const
/// size_t *end)`: `--check` reports rank `r`'s writes (`DSM_REGION_WRITES`) or accesses
/// (`DSM_REGION_ACCESSES`) of the allocation starting at `array` outside its elements
/// `first[r]..end[r]` ([`dsm_core::Dsm::declare_region`]); both arrays have `dsm_size()`
/// entries.
///
/// # Safety
/// `first` and `end` are null or point to `dsm_size()` readable `size_t`s each.
#[no_mangle]
pub unsafe extern "C" fn dsm_declare_region(
    array: *const c_void,
    rule: c_int,
    first: *const usize,
    end: *const usize,
) -> c_int {
    guarded(
        |c| c,
        || {
            with_node(|n| {
                let a = allocation_at(n, array, "dsm_declare_region")?;
                let rule = match rule {
                    0 => dsm_core::RegionRule::Writes,
                    1 => dsm_core::RegionRule::Accesses,
                    _ => {
                        return Err(invalid(format!(
                            "dsm_declare_region: rule {rule} is neither DSM_REGION_WRITES (0) \
                             nor DSM_REGION_ACCESSES (1)"
                        )))
                    }
                };
                if first.is_null() || end.is_null() {
                    return Err(invalid("dsm_declare_region: NULL range array"));
                }
                let size = n.dsm.size();
                // SAFETY: dsm.h asks for `dsm_size()` entries in each (checked non-null).
                let (first, end) = unsafe {
                    (
                        std::slice::from_raw_parts(first, size),
                        std::slice::from_raw_parts(end, size),
                    )
                };
                if let Some(r) = (0..size).find(|&r| first[r] > end[r] || end[r] > a.len()) {
                    return Err(invalid(format!(
                        "dsm_declare_region: rank {r}'s range {}..{} is not within the \
                         allocation's {} elements",
                        first[r],
                        end[r],
                        a.len()
                    )));
                }
                n.dsm.declare_raw_region(&a, rule, |r| first[r]..end[r]);
                Ok(0)
            })
        },
    )
}

/// `int dsm_barrier(void)`
#[no_mangle]
pub extern "C" fn dsm_barrier() -> c_int {
    guarded(|c| c, || with_node(|n| Ok(n.dsm.barrier().map(|()| 0)?)))
}

/// `int dsm_lock(uint64_t id)`
#[no_mangle]
pub extern "C" fn dsm_lock(id: u64) -> c_int {
    guarded(
        |c| c,
        || {
            with_node(|n| {
                if n.held.contains(&id) {
                    return Err(invalid(format!("lock {id} is already held by this rank")));
                }
                n.dsm.lock_unguarded(id)?;
                n.held.push(id);
                Ok(0)
            })
        },
    )
}

fn unlock(n: &mut Node, id: u64, what: &str) -> Result<c_int, Failure> {
    let Some(at) = n.held.iter().position(|&h| h == id) else {
        return Err(invalid(format!("{what} is not held by this rank")));
    };
    n.held.swap_remove(at);
    n.dsm.unlock_unguarded(id)?;
    Ok(0)
}

/// `int dsm_unlock(uint64_t id)`
#[no_mangle]
pub extern "C" fn dsm_unlock(id: u64) -> c_int {
    guarded(
        |c| c,
        || with_node(|n| unlock(n, id, &format!("lock {id}"))),
    )
}

/// `int dsm_prefetch_locks(const uint64_t *ids, size_t count)`: see
/// [`dsm_core::Dsm::prefetch_locks`].
///
/// # Safety
/// `ids` is null with `count` 0, or points to `count` readable `uint64_t`s.
#[no_mangle]
pub unsafe extern "C" fn dsm_prefetch_locks(ids: *const u64, count: usize) -> c_int {
    guarded(
        |c| c,
        || {
            if count == 0 {
                return with_node(|_| Ok(0));
            }
            if ids.is_null() {
                return Err(invalid("the lock ids are NULL"));
            }
            // SAFETY: not null, and `count` readable ids by the caller's contract (dsm.h).
            let ids = unsafe { std::slice::from_raw_parts(ids, count) };
            with_node(|n| {
                n.dsm.prefetch_locks(ids.iter().copied())?;
                Ok(0)
            })
        },
    )
}

/// `int dsm_lock_named(const char *name)`
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dsm_lock_named(name: *const c_char) -> c_int {
    guarded(
        |c| c,
        || {
            // SAFETY: dsm.h asks for a NUL-terminated name.
            let name = unsafe { str_arg(name, "the lock's name") }?;
            with_node(|n| {
                if n.named.get(name).is_some_and(|id| n.held.contains(id)) {
                    return Err(invalid(format!(
                        "lock \"{name}\" is already held by this rank"
                    )));
                }
                let id = n.dsm.lock_named_unguarded(name)?;
                n.named.insert(name.to_string(), id);
                n.held.push(id);
                Ok(0)
            })
        },
    )
}

/// `int dsm_unlock_named(const char *name)`
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dsm_unlock_named(name: *const c_char) -> c_int {
    guarded(
        |c| c,
        || {
            // SAFETY: dsm.h asks for a NUL-terminated name.
            let name = unsafe { str_arg(name, "the lock's name") }?;
            with_node(|n| {
                let what = format!("lock \"{name}\"");
                match n.named.get(name).copied() {
                    Some(id) => unlock(n, id, &what),
                    None => Err(invalid(format!("{what} is not held by this rank"))),
                }
            })
        },
    )
}

/// `int dsm_sem_open(const char *name, unsigned initial)`
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dsm_sem_open(name: *const c_char, initial: c_uint) -> c_int {
    guarded(
        |c| c,
        || {
            // SAFETY: dsm.h asks for a NUL-terminated name.
            let name = unsafe { str_arg(name, "the semaphore's name") }?;
            with_node(|n| {
                let s = n.dsm.semaphore(name, initial)?;
                n.semaphores.push(s);
                Ok((n.semaphores.len() - 1) as c_int)
            })
        },
    )
}

fn semaphore(n: &Node, sem: c_int) -> Result<Semaphore, Failure> {
    usize::try_from(sem)
        .ok()
        .and_then(|i| n.semaphores.get(i))
        .cloned()
        .ok_or_else(|| invalid(format!("{sem} is not a semaphore handle of dsm_sem_open")))
}

/// `int dsm_sem_wait(int sem)`
#[no_mangle]
pub extern "C" fn dsm_sem_wait(sem: c_int) -> c_int {
    guarded(
        |c| c,
        || {
            with_node(|n| {
                let s = semaphore(n, sem)?;
                Ok(n.dsm.wait(&s).map(|()| 0)?)
            })
        },
    )
}

/// `int dsm_sem_signal(int sem)`
#[no_mangle]
pub extern "C" fn dsm_sem_signal(sem: c_int) -> c_int {
    guarded(
        |c| c,
        || {
            with_node(|n| {
                let s = semaphore(n, sem)?;
                Ok(n.dsm.signal(&s).map(|()| 0)?)
            })
        },
    )
}

/// `int dsm_finish(void)`. A failure is also said on stderr: programs end with
/// `return dsm_finish();`, and a status alone would not say why.
#[no_mangle]
pub extern "C" fn dsm_finish() -> c_int {
    let code = finish();
    if code < 0 {
        LAST_ERROR.with(|e| eprintln!("dsm: dsm_finish failed: {}", e.borrow().to_string_lossy()));
    }
    code
}

fn finish() -> c_int {
    guarded(
        |c| c,
        || {
            with_node(|n| match n.held.as_slice() {
                [] => Ok(()),
                held => Err(Failure(
                    DSM_ESTATE,
                    format!(
                        "dsm_finish with lock(s) {held:?} still held: the ranks waiting for \
                         them would wait forever; unlock them first"
                    ),
                )),
            })?;
            RECORDING.set(false);
            crate::tsan::set_recording(false);
            let p = NODE.replace(std::ptr::null_mut());
            FINISHED.store(true, std::sync::atomic::Ordering::Relaxed);
            // SAFETY: `p` is the non-null pointer `dsm_init` made with `Box::into_raw`
            // (checked just above); it was nulled first, so nothing reaches it any more.
            let node = unsafe { Box::from_raw(p) };
            let outcome = node.dsm_owned().finish()?;
            Ok(c_int::from(outcome.exit_status))
        },
    )
}

/// Registers [`finish_at_exit`] once per process.
fn finish_at_exit_once() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: `on_exit` only records the handler and its argument (none) for `exit`.
        unsafe { on_exit(finish_at_exit, std::ptr::null_mut()) };
    });
}

extern "C" {
    /// glibc's `on_exit`: like `atexit`, with the exit status.
    fn on_exit(f: extern "C" fn(c_int, *mut c_void), arg: *mut c_void) -> c_int;
}

/// A program that exits with status 0 (returns from `main`) without `dsm_finish` finishes
/// here, as a Rust program's `Dsm` does when dropped: the analysis of the last epoch runs,
/// and when races were reported the process exits with the race status, as
/// ThreadSanitizer's runtime does; a failure to finish is said, and exits 1. A program
/// exiting with another status is failing: it is left to (its peers then stop).
extern "C" fn finish_at_exit(status: c_int, _: *mut c_void) {
    if status != 0 || NODE.get().is_null() {
        return;
    }
    let code = match dsm_finish() {
        0 => return,
        code if code < 0 => 1,
        races => races,
    };
    // SAFETY: flushes the C streams (the program's output), then ends the process with the
    // status, as `exit` would have after the remaining handlers.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::_exit(code)
    }
}

/// `const char *dsm_last_error(void)`
#[no_mangle]
pub extern "C" fn dsm_last_error() -> *const c_char {
    // The string stays in the thread-local until the next failure on this thread.
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
