//! The API apps program against: a [`Dsm`] node handle with rank and size, collective
//! allocation of named typed arrays, element and bulk access through [`View`]s, locks
//! with RAII guards, barriers and a clean, collective shutdown.
//!
//! Every access to shared memory goes through a view, and every view method calls the
//! race recorder when detection is on (a test of an `Option` that is `None` otherwise).
//! Views borrow the node handle, and every synchronization call needs it mutably, so the
//! borrow checker rejects a view that would live across a barrier, an acquire or a release.
//! Bulk accessors (`read_into`, `write_from`, `strided`, rows) record their whole footprint
//! in one step; that is how apps stay fast with detection on.
//!
//! Kernel accesses to protected pages do not fault (`read(2)` into shared memory returns
//! EFAULT): do I/O through local buffers and `write_from`/`read_into`.

use crate::comm::{Comm, SegmentMemory};
use crate::engine::{self, Command, Engine, Reply, StateMirror};
use crate::error::DsmError;
use crate::sys::{self, AppSlice, AppStrided, Segment, PAGE_SIZE};
use bytemuck::Pod;
use dsm_net::{EncodedBitmap, JobEnv, LockId, NodeId, PageNo, PageRuns, RaceNotices, RaceOptions};
use dsm_race::{AllocShadow, Recorder, Reporter, VarInfo, VarTable};
use std::io::Write;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut, Range};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::engine::Stats;

/// Default shared segment: reserved, committed page by page as it is touched.
pub const DEFAULT_SEGMENT: usize = 1 << 30;
/// Default address of the segment (the same on every node).
pub const DEFAULT_SEGMENT_ADDR: usize = 0x3d00_0000_0000;
/// Most bitmap bytes a node ships unasked with a barrier arrival; beyond this the master
/// fetches what it needs instead.
const MAX_SHIPPED_BITMAP_BYTES: usize = 256 << 10;
/// Bulk accesses prefetch missing pages in batches of this many pages.
const PREFETCH_BATCH: usize = 512;
/// Accesses spanning fewer pages than this just take their faults (a fault costs the same
/// round trip as a prefetch request).
const PREFETCH_MIN_PAGES: usize = 2;

static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// How the pages of an allocation are spread over homes. Where pages are homed dominates
/// performance: a node writing pages homed elsewhere pays twins, diffs and faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Distribution {
    /// Contiguous blocks of pages: node k homes the k-th of N equal parts. For 2-D arrays
    /// the split follows row bands ([`band`]) so a node that works on its band of rows
    /// writes only pages it homes.
    #[default]
    Block,
    /// Every page on one node.
    OnNode(usize),
}

/// With `DSM_PIN=1`, keeps this node's threads (the app thread and the comm thread it is
/// about to start) on one core, a different one per node. Faults hand work between those
/// two threads, and on virtual machines a wake-up across cores costs several times one on
/// the same core (measured here: 20 us against 3 us). It is not the default: a node that
/// serves pages must then preempt its own computation, which made SOR 2048x2048 at N = 2
/// 25% slower while lock-heavy Water got 20% faster.
fn place_on_core(rank: usize, nodes: usize) {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let mode = std::env::var("DSM_PIN").unwrap_or_default();
    if mode != "1" {
        return;
    }
    let Ok(allowed) = sched_getaffinity(Pid::from_raw(0)) else {
        return;
    };
    let cores: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .collect();
    // Nodes on this machine: the launcher's local count when known, else the job size.
    let local = std::env::var("DSM_LOCAL_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(nodes);
    let local_rank = std::env::var("DSM_LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(rank);
    if cores.is_empty() {
        return;
    }
    if local > cores.len() {
        tracing::warn!(
            "DSM_PIN=1 with {local} nodes on {} cores: nodes share cores",
            cores.len()
        );
    }
    let mut set = CpuSet::new();
    if set.set(cores[local_rank % cores.len()]).is_ok() {
        if let Err(e) = sched_setaffinity(Pid::from_raw(0), &set) {
            tracing::debug!("could not pin rank {rank} to a core: {e}");
        }
    }
}

/// The `k`-th of `parts` near-equal contiguous pieces of `0..total`.
pub fn band(total: usize, parts: usize, k: usize) -> Range<usize> {
    let parts = parts.max(1);
    (k * total / parts)..((k + 1) * total / parts)
}

/// A shared array: a plain handle (copyable, no borrow) naming an allocation.
pub struct Array<T> {
    id: usize,
    offset: usize,
    len: usize,
    cols: usize,
    _t: PhantomData<T>,
}

impl<T> Clone for Array<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Array<T> {}

impl<T> std::fmt::Debug for Array<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Array(#{}, len {}, cols {})",
            self.id, self.len, self.cols
        )
    }
}

impl<T> Array<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rows of a 2-D array (1-D arrays have one row).
    pub fn rows(&self) -> usize {
        self.len.checked_div(self.cols).unwrap_or(1)
    }

    /// Columns of a 2-D array (1-D arrays: the length).
    pub fn cols(&self) -> usize {
        if self.cols == 0 {
            self.len
        } else {
            self.cols
        }
    }
}

struct AllocMeta {
    name: String,
    first_page: PageNo,
    elem_size: usize,
}

/// Race-detection state of this node.
/// How much of the detector runs. Only benchmarks lower it (`DSM_RACE_PHASES`), to measure
/// what each part costs: the paper's Figure 3 breakdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum RacePhases {
    /// Accesses are recorded and intervals closed, but notices stay home.
    Record,
    /// Notices travel with the intervals; no analysis.
    Notices,
    /// The master also finds concurrent, overlapping interval pairs; no bitmaps fetched.
    Compare,
    /// Everything: bitmaps fetched and compared, races reported.
    Full,
}

impl RacePhases {
    fn from_env() -> Result<Self, DsmError> {
        match std::env::var("DSM_RACE_PHASES").as_deref() {
            Err(_) | Ok("full") => Ok(RacePhases::Full),
            Ok("record") => Ok(RacePhases::Record),
            Ok("notices") => Ok(RacePhases::Notices),
            Ok("compare") => Ok(RacePhases::Compare),
            Ok(other) => Err(DsmError::Config(format!(
                "DSM_RACE_PHASES={other:?}: expected record, notices, compare or full"
            ))),
        }
    }
}

struct RaceState {
    phases: RacePhases,
    recorder: Recorder,
    /// Rank 0 reports.
    reporter: Option<Reporter>,
    vars: VarTable,
    options: RaceOptions,
    races_total: u64,
    close_time: Duration,
    plan_time: Duration,
    bitmap_time: Duration,
    barriers: u64,
    notice_bytes: u64,
    /// Bitmaps the master had to fetch in an extra round (not shipped with arrivals).
    fetched_late: u64,
    sum: dsm_race::PlanStats,
}

/// A node of the job. Create one per process with [`Dsm::init`].
pub struct Dsm {
    rank: usize,
    size: usize,
    seg: &'static Segment,
    comm: Option<Comm>,
    /// Page states as the comm thread sees them, to prefetch only what is missing.
    states: Arc<StateMirror>,
    allocs: Vec<AllocMeta>,
    next_page: usize,
    race: Option<RaceState>,
    finished: bool,
    started: Instant,
    _not_send: PhantomData<*const ()>,
}

fn fnv(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

impl Dsm {
    /// Joins the job described by the environment (`dsmrun`, `srun` or `mpirun` with
    /// `DSM_COORD` and `DSM_JOB_SECRET`), or runs as a single node when started alone.
    pub fn init() -> Result<Dsm, DsmError> {
        let env = JobEnv::from_env()?;
        Self::init_with(env)
    }

    /// Like [`Dsm::init`] with an explicit job description.
    pub fn init_with(env: JobEnv) -> Result<Dsm, DsmError> {
        if INITIALIZED.swap(true, Ordering::AcqRel) {
            return Err(DsmError::AlreadyInitialized);
        }
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("DSM_LOG")
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_writer(std::io::stderr)
            .try_init();
        let seg_len = env
            .segment_bytes
            .map(|b| (b as usize).div_ceil(PAGE_SIZE) * PAGE_SIZE)
            .unwrap_or(DEFAULT_SEGMENT);
        let seg_addr = match std::env::var("DSM_SEGMENT_ADDR") {
            Ok(v) => {
                usize::from_str_radix(v.trim().trim_start_matches("0x"), 16).map_err(|_| {
                    DsmError::Config(format!("DSM_SEGMENT_ADDR={v:?} is not a hex address"))
                })?
            }
            Err(_) => DEFAULT_SEGMENT_ADDR,
        };
        let seg: &'static Segment = Box::leak(Box::new(
            Segment::map(seg_addr, seg_len).map_err(DsmError::Segment)?,
        ));
        sys::set_global_segment(seg);
        let mailbox = sys::install_fault_handler(seg).map_err(DsmError::Segment)?;
        let mesh = dsm_net::connect_mesh(&env)?;
        place_on_core(env.rank, env.size);
        let phases = if env.race.enabled {
            RacePhases::from_env()?
        } else {
            RacePhases::Full
        };
        let race = env.race.enabled.then(|| RaceState {
            phases,
            recorder: Recorder::new(),
            reporter: None,
            vars: VarTable::new(),
            options: env.race.clone(),
            races_total: 0,
            close_time: Duration::ZERO,
            plan_time: Duration::ZERO,
            bitmap_time: Duration::ZERO,
            barriers: 0,
            notice_bytes: 0,
            fetched_late: 0,
            sum: Default::default(),
        });
        let mut race = race;
        if let Some(r) = race.as_mut() {
            if env.rank == 0 {
                r.reporter = Some(
                    Reporter::new(r.options.log.as_deref(), r.options.first_only)
                        .map_err(DsmError::Io)?,
                );
            }
        }
        let mut engine = Engine::new(
            env.rank as NodeId,
            env.size,
            seg.pages(),
            SegmentMemory::new(seg),
            race.is_some(),
        );
        let states = Arc::new(StateMirror::new(seg.pages()));
        engine.share_states(states.clone());
        let comm = Comm::start(mesh, engine, mailbox, seg).map_err(DsmError::Io)?;
        Ok(Dsm {
            states,
            rank: env.rank,
            size: env.size,
            seg,
            comm: Some(comm),
            allocs: Vec::new(),
            next_page: 0,
            race,
            finished: false,
            started: Instant::now(),
            _not_send: PhantomData,
        })
    }

    /// This node's rank, `0..size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of nodes in the job.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether race detection is on for this run.
    pub fn race_detection(&self) -> bool {
        self.race.is_some()
    }

    fn comm(&self) -> &Comm {
        self.comm.as_ref().expect("used after finish")
    }

    /// Collectively allocates a named 1-D array of `len` zeroed elements. Every rank must
    /// make the same allocations in the same order; this is also a barrier.
    pub fn alloc<T: Pod>(&mut self, name: &str, len: usize) -> Result<Array<T>, DsmError> {
        self.alloc_shaped(name, len, 0, Distribution::Block)
    }

    /// Collectively allocates a named `rows x cols` array (row-major), homed by row bands.
    pub fn alloc_2d<T: Pod>(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Array<T>, DsmError> {
        if cols == 0 {
            return Err(DsmError::InvalidAlloc(format!("'{name}': zero columns")));
        }
        let len = rows
            .checked_mul(cols)
            .ok_or_else(|| DsmError::InvalidAlloc(format!("'{name}': size overflows")))?;
        self.alloc_shaped(name, len, cols, Distribution::Block)
    }

    /// [`Dsm::alloc`] with an explicit page distribution.
    pub fn alloc_with<T: Pod>(
        &mut self,
        name: &str,
        len: usize,
        dist: Distribution,
    ) -> Result<Array<T>, DsmError> {
        self.alloc_shaped(name, len, 0, dist)
    }

    fn alloc_shaped<T: Pod>(
        &mut self,
        name: &str,
        len: usize,
        cols: usize,
        dist: Distribution,
    ) -> Result<Array<T>, DsmError> {
        let elem = std::mem::size_of::<T>();
        if name.is_empty() {
            return Err(DsmError::InvalidAlloc("allocations need a name".into()));
        }
        if len == 0 || elem == 0 {
            return Err(DsmError::InvalidAlloc(format!(
                "'{name}': empty allocation ({len} elements of {elem} bytes)"
            )));
        }
        if let Distribution::OnNode(n) = dist {
            if n >= self.size {
                return Err(DsmError::InvalidAlloc(format!(
                    "'{name}': home node {n} does not exist in a {}-node job",
                    self.size
                )));
            }
        }
        let bytes = len
            .checked_mul(elem)
            .ok_or_else(|| DsmError::InvalidAlloc(format!("'{name}': size overflows")))?;
        let pages = bytes.div_ceil(PAGE_SIZE);
        if self.next_page + pages > self.seg.pages() {
            return Err(DsmError::SegmentFull {
                name: name.into(),
                bytes,
                free: (self.seg.pages() - self.next_page) * PAGE_SIZE,
                segment: self.seg.len(),
            });
        }
        let first = self.next_page;
        let homes = self.homes(first, pages, bytes, elem, cols, dist);
        let mut digest = fnv(FNV_OFFSET, name.as_bytes());
        for v in [elem, std::mem::align_of::<T>(), len, cols, first] {
            digest = fnv(digest, &(v as u64).to_le_bytes());
        }
        let race = self.close_race_interval();
        let shadow_elem = elem;
        if let Some(r) = self.race.as_mut() {
            r.recorder.add_alloc(first as PageNo, bytes, shadow_elem);
            r.vars.push(VarInfo {
                name: name.to_string(),
                first_page: first as PageNo,
                pages: pages as u32,
                base_addr: self.seg.app_base() + first * PAGE_SIZE,
                elem_size: elem,
                len,
                cols: (cols > 0).then_some(cols),
                granule_shift: dsm_race::granule_shift(elem),
            });
        }
        self.next_page += pages;
        self.allocs.push(AllocMeta {
            name: name.to_string(),
            first_page: first as PageNo,
            elem_size: elem,
        });
        self.sync(Command::Alloc {
            homes,
            digest,
            race,
        })?;
        Ok(Array {
            id: self.allocs.len() - 1,
            offset: first * PAGE_SIZE,
            len,
            cols,
            _t: PhantomData,
        })
    }

    /// Home of each page of a new allocation, as runs `(first, count, home)`.
    fn homes(
        &self,
        first: usize,
        pages: usize,
        bytes: usize,
        elem: usize,
        cols: usize,
        dist: Distribution,
    ) -> Vec<(PageNo, u32, NodeId)> {
        let n = self.size;
        let owner_of_page = |k: usize| -> usize {
            match dist {
                Distribution::OnNode(node) => node,
                Distribution::Block if cols > 0 => {
                    // Home = owner of the row holding the page's first byte.
                    let rows = bytes / (elem * cols);
                    let row = (k * PAGE_SIZE) / (elem * cols);
                    (0..n)
                        .find(|&node| band(rows, n, node).contains(&row))
                        .unwrap_or(n - 1)
                }
                Distribution::Block => (0..n)
                    .find(|&node| band(pages, n, node).contains(&k))
                    .unwrap_or(n - 1),
            }
        };
        let mut runs: Vec<(PageNo, u32, NodeId)> = Vec::new();
        for k in 0..pages {
            let home = owner_of_page(k) as NodeId;
            match runs.last_mut() {
                Some((_, count, h)) if *h == home => *count += 1,
                _ => runs.push(((first + k) as PageNo, 1, home)),
            }
        }
        runs
    }

    /// A view for accessing `array`. Views are cheap; make them where you use them.
    pub fn view<T: Pod>(&self, array: &Array<T>) -> View<'_, T> {
        let meta = &self.allocs[array.id];
        debug_assert_eq!(meta.elem_size, std::mem::size_of::<T>());
        View {
            mem: AppSlice::new(self.seg, array.offset, array.len)
                .expect("allocations lie inside the segment"),
            shadow: self.race.as_ref().map(|r| r.recorder.alloc(array.id)),
            cols: array.cols,
            first_page: meta.first_page,
            dsm: self,
        }
    }

    /// Name of an allocation (for messages).
    pub fn name_of<T>(&self, array: &Array<T>) -> &str {
        &self.allocs[array.id].name
    }

    fn close_race_interval(&mut self) -> Option<RaceNotices> {
        let r = self.race.as_mut()?;
        let t = Instant::now();
        let n = r.recorder.close_interval();
        r.close_time += t.elapsed();
        if r.phases == RacePhases::Record {
            return Some(RaceNotices::default());
        }
        Some(n)
    }

    /// Waits at a barrier with all other nodes.
    pub fn barrier(&mut self) -> Result<(), DsmError> {
        let race = self.close_race_interval();
        let bitmaps = self.shippable_bitmaps();
        self.sync(Command::Barrier {
            finishing: false,
            race,
            bitmaps,
        })
    }

    /// Race mode: the epoch's bitmaps of pages another node may have touched, shipped with
    /// the barrier arrival so the master rarely needs an extra round to fetch them.
    fn shippable_bitmaps(&mut self) -> Vec<EncodedBitmap> {
        let states = self.states.clone();
        let Some(r) = self.race.as_mut() else {
            return Vec::new();
        };
        if r.phases < RacePhases::Full {
            return Vec::new();
        }
        let t = Instant::now();
        let shipped = r
            .recorder
            .shippable(|p| states.shared(p as usize), MAX_SHIPPED_BITMAP_BYTES)
            .unwrap_or_default();
        r.close_time += t.elapsed();
        shipped
    }

    /// Sends a barrier-like command and serves the race-detection rounds until released.
    fn sync(&mut self, cmd: Command) -> Result<(), DsmError> {
        self.comm().send(cmd);
        loop {
            match self.comm().recv() {
                Reply::BarrierDone { epoch, races } => {
                    if let Some(r) = self.race.as_mut() {
                        r.recorder.discard_epoch();
                        r.races_total += races;
                        r.barriers += 1;
                        let _ = epoch;
                    }
                    return Ok(());
                }
                Reply::BitmapsWanted { epoch, keys } => {
                    let r = self.race.as_mut().ok_or_else(|| {
                        DsmError::Protocol("bitmaps requested without race detection".into())
                    })?;
                    let bitmaps = r.recorder.bitmaps(&keys);
                    self.comm().send(Command::SendBitmaps { epoch, bitmaps });
                }
                Reply::AnalyzeEpoch {
                    epoch,
                    intervals,
                    bitmaps,
                } => {
                    let races = self.analyze(epoch, intervals, bitmaps)?;
                    self.comm().send(Command::ReleaseBarrier { races });
                }
                other => {
                    return Err(DsmError::Protocol(format!(
                        "unexpected reply during a barrier: {other:?}"
                    )))
                }
            }
        }
    }

    /// Barrier master, race mode: find, fetch, compare, report.
    fn analyze(
        &mut self,
        epoch: u32,
        intervals: Vec<dsm_net::IntervalRecord>,
        shipped: Vec<(NodeId, EncodedBitmap)>,
    ) -> Result<u64, DsmError> {
        let finishing = self.finished;
        let comm = self.comm.as_ref().expect("comm alive during barrier");
        let r = self.race.as_mut().ok_or_else(|| {
            DsmError::Protocol("analysis requested without race detection".into())
        })?;
        if r.phases < RacePhases::Compare {
            return Ok(0);
        }
        let notice_bytes: u64 = intervals
            .iter()
            .filter_map(|i| i.race.as_ref())
            .map(|n| postcard::experimental::serialized_size(n).map_or(0, |s| s as u64))
            .sum();
        let t0 = Instant::now();
        let mut plan = dsm_race::plan(epoch, intervals);
        let t1 = Instant::now();
        if r.phases < RacePhases::Full {
            plan.wanted.clear();
        }
        let mut bitmaps = dsm_race::Bitmaps::new();
        for (node, b) in shipped {
            bitmaps.insert(node, b);
        }
        let mut pending = 0;
        for (&node, keys) in &plan.wanted {
            let missing: Vec<_> = keys
                .iter()
                .filter(|k| !bitmaps.contains(node, k))
                .copied()
                .collect();
            if missing.is_empty() {
                continue;
            }
            r.fetched_late += missing.len() as u64;
            if node == 0 {
                for b in r.recorder.bitmaps(&missing) {
                    bitmaps.insert(0, b);
                }
            } else {
                comm.send(Command::RequestBitmaps {
                    node,
                    epoch,
                    keys: missing,
                });
                pending += 1;
            }
        }
        while pending > 0 {
            match comm.recv() {
                Reply::BitmapsArrived { from, bitmaps: bs } => {
                    for b in bs {
                        bitmaps.insert(from, b);
                    }
                    pending -= 1;
                }
                other => {
                    return Err(DsmError::Protocol(format!(
                        "unexpected reply while fetching bitmaps: {other:?}"
                    )))
                }
            }
        }
        let mut races = plan.compare(&bitmaps, &r.vars);
        if r.options.first_only {
            races = dsm_race::first_races(races, plan.intervals());
        }
        let t2 = Instant::now();
        r.plan_time += t1 - t0;
        r.bitmap_time += t2 - t1;
        r.notice_bytes += notice_bytes;
        let s = &plan.stats;
        for (acc, v) in [
            (&mut r.sum.intervals, s.intervals),
            (&mut r.sum.pairs_considered, s.pairs_considered),
            (&mut r.sum.concurrent_pairs, s.concurrent_pairs),
            (&mut r.sum.overlapping_pairs, s.overlapping_pairs),
            (&mut r.sum.intervals_in_overlap, s.intervals_in_overlap),
            (&mut r.sum.bitmaps_wanted, s.bitmaps_wanted),
            (&mut r.sum.bitmaps_total, s.bitmaps_total),
        ] {
            *acc += v;
        }
        let point = if finishing {
            dsm_race::Point::Exit(epoch)
        } else {
            dsm_race::Point::Barrier(epoch)
        };
        let reporter = r.reporter.as_mut().expect("rank 0 has the reporter");
        let reported = reporter
            .report(point, &races, &mut std::io::stderr())
            .map_err(DsmError::Io)?;
        if r.options.stats {
            eprintln!(
                "dsm-race-stats: {} {epoch}: intervals {}, interval pairs {} considered / {} concurrent / {} overlapping, bitmaps {} of {} fetched, notice bytes {}, interval comparison {:.3} ms, bitmap round {:.3} ms, races {}",
                if finishing { "exit" } else { "barrier" },
                s.intervals,
                s.pairs_considered,
                s.concurrent_pairs,
                s.overlapping_pairs,
                s.bitmaps_wanted,
                s.bitmaps_total,
                notice_bytes,
                (t1 - t0).as_secs_f64() * 1e3,
                (t2 - t1).as_secs_f64() * 1e3,
                reported
            );
        }
        Ok(reported)
    }

    /// Acquires lock `id` (any integer below 2^63), returning a guard that releases it.
    /// Locks are not recursive.
    pub fn lock(&mut self, id: u64) -> Result<LockGuard<'_>, DsmError> {
        if id >= 1 << 63 {
            return Err(DsmError::Config(format!(
                "lock id {id} is reserved for named locks; use ids below 2^63"
            )));
        }
        self.acquire(id)
    }

    /// Acquires the lock with this name (the same name means the same lock on every node).
    pub fn lock_named(&mut self, name: &str) -> Result<LockGuard<'_>, DsmError> {
        let id = (1u64 << 63) | (fnv(FNV_OFFSET, name.as_bytes()) & !(1u64 << 63));
        if let Some(rep) = self.race.as_mut().and_then(|r| r.reporter.as_mut()) {
            rep.name_lock(id, name);
        }
        self.acquire(id)
    }

    fn acquire(&mut self, lock: LockId) -> Result<LockGuard<'_>, DsmError> {
        let race = self.close_race_interval();
        match self.comm().call(Command::Acquire { lock, race }) {
            Reply::Done => Ok(LockGuard {
                dsm: self,
                lock,
                released: false,
            }),
            other => Err(DsmError::Protocol(format!(
                "unexpected reply to acquire: {other:?}"
            ))),
        }
    }

    fn release(&mut self, lock: LockId) -> Result<(), DsmError> {
        let race = self.close_race_interval();
        match self.comm().call(Command::Release { lock, race }) {
            Reply::Done => Ok(()),
            other => Err(DsmError::Protocol(format!(
                "unexpected reply to release: {other:?}"
            ))),
        }
    }

    /// Protocol counters of this node so far.
    pub fn stats(&self) -> Stats {
        match self.comm().call(Command::Stats) {
            Reply::Stats(s) => *s,
            _ => Stats::default(),
        }
    }

    fn prefetch(&self, first_page: usize, last_page: usize, write: bool) {
        let mut p = first_page;
        while p <= last_page {
            let end = (p + PREFETCH_BATCH - 1).min(last_page);
            let pages = PageRuns::from_runs([(p as PageNo, (end - p + 1) as u32)]);
            match self.comm().call(Command::Prefetch { pages, write }) {
                Reply::Done => {}
                other => crate::comm::fatal(&format!("unexpected reply to prefetch: {other:?}")),
            }
            p = end + 1;
        }
    }

    /// Ends the run for this node: a final barrier (with race analysis of the last epoch),
    /// then the connections close. With race detection on, rank 0 prints the summary and,
    /// if races were reported and the race exit code is not 0, exits the process with it
    /// (like ThreadSanitizer's `exitcode`).
    pub fn finish(mut self) -> Result<(), DsmError> {
        self.finish_inner()
    }

    fn finish_inner(&mut self) -> Result<(), DsmError> {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        let race = self.close_race_interval();
        let bitmaps = self.shippable_bitmaps();
        let result = self.sync(Command::Barrier {
            finishing: true,
            race,
            bitmaps,
        });
        if result.is_ok() {
            if let Ok(path) = std::env::var("DSM_STATS_FILE") {
                let path = path.replace("%r", &self.rank.to_string());
                let stats = self.stats();
                std::fs::write(&path, self.stats_json(&stats).to_string()).map_err(|e| {
                    DsmError::Io(std::io::Error::new(
                        e.kind(),
                        format!("cannot write DSM_STATS_FILE {path}: {e}"),
                    ))
                })?;
            }
        }
        if let Some(comm) = self.comm.take() {
            comm.shutdown();
        }
        result?;
        if let Some(r) = self.race.as_mut() {
            if let Some(rep) = r.reporter.as_mut() {
                rep.finish().map_err(DsmError::Io)?;
                if r.options.stats {
                    let s = &r.sum;
                    let rs = r.recorder.stats();
                    eprintln!(
                        "dsm-race-stats: run: barriers {}, intervals {}, interval pairs {} considered / {} concurrent / {} overlapping, intervals in a concurrent overlapping pair {}, bitmaps {} of {} fetched, notice bytes {}, rank 0 recording (interval close) {:.3} ms, interval comparison {:.3} ms, bitmap round {:.3} ms, peak bitmap store on rank 0 {} bytes",
                        r.barriers,
                        s.intervals,
                        s.pairs_considered,
                        s.concurrent_pairs,
                        s.overlapping_pairs,
                        s.intervals_in_overlap,
                        s.bitmaps_wanted,
                        s.bitmaps_total,
                        r.notice_bytes,
                        r.close_time.as_secs_f64() * 1e3,
                        r.plan_time.as_secs_f64() * 1e3,
                        r.bitmap_time.as_secs_f64() * 1e3,
                        rs.peak_store_bytes
                    );
                }
                eprintln!("{}", rep.summary());
                let _ = std::io::stderr().flush();
                if rep.total() > 0 && r.options.exit_code != 0 {
                    let _ = std::io::stdout().flush();
                    std::process::exit(r.options.exit_code);
                }
            }
        }
        Ok(())
    }
}

impl Dsm {
    /// Everything a benchmark wants to know about this node's run (`DSM_STATS_FILE`).
    fn stats_json(&self, stats: &Stats) -> serde_json::Value {
        let shared_bytes: usize = self.next_page * PAGE_SIZE;
        let race = self.race.as_ref().map(|r| {
            let rs = r.recorder.stats();
            serde_json::json!({
                "phases": format!("{:?}", r.phases).to_lowercase(),
                "intervals_with_accesses": rs.intervals_with_accesses,
                "read_notices": rs.read_notices,
                "write_notices": rs.write_notices,
                "bitmaps_stored": rs.bitmaps_stored,
                "bitmaps_served": rs.bitmaps_served,
                "peak_store_bytes": rs.peak_store_bytes,
                "interval_close_ms": r.close_time.as_secs_f64() * 1e3,
                "interval_comparison_ms": r.plan_time.as_secs_f64() * 1e3,
                "bitmap_round_ms": r.bitmap_time.as_secs_f64() * 1e3,
                "analysis": r.sum,
                "analysis_notice_bytes": r.notice_bytes,
                "bitmaps_fetched_in_extra_round": r.fetched_late,
                "races_reported": r.races_total,
            })
        });
        let peak_rss_kib = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmHWM:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            });
        serde_json::json!({
            "rank": self.rank,
            "size": self.size,
            "wall_s": self.started.elapsed().as_secs_f64(),
            "peak_rss_kib": peak_rss_kib,
            "shared_bytes": shared_bytes,
            "allocations": self.allocs.iter().map(|a| a.name.clone()).collect::<Vec<_>>(),
            "protocol": stats,
            "race": race,
        })
    }
}

impl Drop for Dsm {
    fn drop(&mut self) {
        if self.finished || std::thread::panicking() {
            return;
        }
        if let Err(e) = self.finish_inner() {
            eprintln!("dsm: rank {}: shutdown failed: {e}", self.rank);
        }
    }
}

/// A held lock; dropping it releases the lock. Shared memory is accessed through the
/// guard (it dereferences to the [`Dsm`]), so views cannot outlive the critical section.
pub struct LockGuard<'a> {
    dsm: &'a mut Dsm,
    lock: LockId,
    released: bool,
}

impl LockGuard<'_> {
    /// Releases the lock, reporting errors (dropping the guard releases it too).
    pub fn unlock(mut self) -> Result<(), DsmError> {
        self.released = true;
        self.dsm.release(self.lock)
    }

    pub fn id(&self) -> LockId {
        self.lock
    }
}

impl Deref for LockGuard<'_> {
    type Target = Dsm;
    fn deref(&self) -> &Dsm {
        self.dsm
    }
}

impl DerefMut for LockGuard<'_> {
    fn deref_mut(&mut self) -> &mut Dsm {
        self.dsm
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if !self.released && !std::thread::panicking() {
            if let Err(e) = self.dsm.release(self.lock) {
                crate::comm::fatal(&format!("release of lock {} failed: {e}", self.lock));
            }
        }
    }
}

/// Access to one shared array, valid until the next synchronization call.
///
/// A view borrows the node handle; synchronization needs the handle mutably, so keeping a
/// view across a barrier (or lock, or release) does not compile:
///
/// ```compile_fail
/// let mut dsm = dsm_core::Dsm::init()?;
/// let a = dsm.alloc::<u64>("a", 1)?;
/// let v = dsm.view(&a);
/// dsm.barrier()?; // error: `dsm` is still borrowed by `v`
/// v.set(0, 1);
/// # Ok::<(), dsm_core::DsmError>(())
/// ```
///
/// The same holds for a lock guard: views made through it end with the critical section.
///
/// ```compile_fail
/// let mut dsm = dsm_core::Dsm::init()?;
/// let a = dsm.alloc::<u64>("a", 1)?;
/// let guard = dsm.lock(1)?;
/// let v = guard.view(&a);
/// drop(guard); // error: `guard` is still borrowed by `v`
/// v.set(0, 1);
/// # Ok::<(), dsm_core::DsmError>(())
/// ```
pub struct View<'a, T> {
    mem: AppSlice<T>,
    shadow: Option<&'a AllocShadow>,
    cols: usize,
    first_page: PageNo,
    dsm: &'a Dsm,
}

impl<T> Clone for View<'_, T> {
    fn clone(&self) -> Self {
        View {
            mem: self.mem,
            shadow: self.shadow,
            cols: self.cols,
            first_page: self.first_page,
            dsm: self.dsm,
        }
    }
}

impl<'a, T: Pod> View<'a, T> {
    const SIZE: usize = std::mem::size_of::<T>();

    pub fn len(&self) -> usize {
        self.mem.len()
    }

    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }

    /// Columns of a 2-D array (0 for 1-D).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Reads element `i`.
    #[inline(always)]
    pub fn get(&self, i: usize) -> T {
        if let Some(s) = self.shadow {
            s.read(i * Self::SIZE, Self::SIZE);
        }
        self.mem.get(i)
    }

    /// Writes element `i`.
    #[inline(always)]
    pub fn set(&self, i: usize, value: T) {
        if let Some(s) = self.shadow {
            s.write(i * Self::SIZE, Self::SIZE);
        }
        self.mem.set(i, value)
    }

    /// Reads element `(row, col)` of a 2-D array.
    #[inline(always)]
    pub fn get2(&self, row: usize, col: usize) -> T {
        assert!(
            col < self.cols,
            "column {col} out of bounds ({} columns)",
            self.cols
        );
        self.get(row * self.cols + col)
    }

    /// Writes element `(row, col)` of a 2-D array.
    #[inline(always)]
    pub fn set2(&self, row: usize, col: usize, value: T) {
        assert!(
            col < self.cols,
            "column {col} out of bounds ({} columns)",
            self.cols
        );
        self.set(row * self.cols + col, value)
    }

    fn page_span(&self, start: usize, count: usize) -> (usize, usize) {
        let first = self.first_page as usize + start * Self::SIZE / PAGE_SIZE;
        let last = self.first_page as usize + ((start + count) * Self::SIZE - 1) / PAGE_SIZE;
        (first, last)
    }

    /// Fetches, in one request per home, the pages of elements `start..start+count` that
    /// are not yet accessible (for writing, if `write`), when the range spans several
    /// pages. Bulk copies and blocks do this themselves (strided views take their faults); call it before element-wise
    /// access to a large range. It records nothing.
    pub fn prefetch(&self, start: usize, count: usize, write: bool) {
        if count == 0 {
            return;
        }
        assert!(
            start.checked_add(count).is_some_and(|e| e <= self.len()),
            "prefetch of {start}+{count} out of bounds (len {})",
            self.len()
        );
        self.prefetch_checked(start, count, write);
    }

    /// [`View::prefetch`] for a range the caller has already bounds-checked (the bulk
    /// copies and `block`, which check their range first).
    #[inline]
    fn prefetch_checked(&self, start: usize, count: usize, write: bool) {
        if count == 0 {
            return;
        }
        let (first, last) = self.page_span(start, count);
        if last >= first + PREFETCH_MIN_PAGES - 1 && self.dsm.states.any_missing(first, last, write)
        {
            self.dsm.prefetch(first, last, write);
        }
    }

    /// Copies `out.len()` elements from `start` into `out` (one recorded read of the
    /// whole range; missing pages are fetched in batches).
    pub fn read_into(&self, start: usize, out: &mut [T]) {
        assert!(
            start
                .checked_add(out.len())
                .is_some_and(|e| e <= self.len()),
            "read of {start}+{} out of bounds (len {})",
            out.len(),
            self.len()
        );
        if let Some(s) = self.shadow {
            s.read(start * Self::SIZE, out.len() * Self::SIZE);
        }
        self.prefetch_checked(start, out.len(), false);
        self.mem.read_into(start, out)
    }

    /// Copies `src` into the array from `start` (one recorded write of the whole range).
    pub fn write_from(&self, start: usize, src: &[T]) {
        assert!(
            start
                .checked_add(src.len())
                .is_some_and(|e| e <= self.len()),
            "write of {start}+{} out of bounds (len {})",
            src.len(),
            self.len()
        );
        if let Some(s) = self.shadow {
            s.write(start * Self::SIZE, src.len() * Self::SIZE);
        }
        self.prefetch_checked(start, src.len(), true);
        self.mem.write_from(start, src)
    }

    /// The whole array as a local vector.
    pub fn to_vec(&self) -> Vec<T> {
        let mut v = vec![T::zeroed(); self.len()];
        self.read_into(0, &mut v);
        v
    }

    /// Sets every element of `range` to `value`.
    pub fn fill(&self, range: Range<usize>, value: T) {
        let v = vec![value; range.len()];
        self.write_from(range.start, &v);
    }

    /// Copies row `row` of a 2-D array into `out` (`out.len()` must be the column count).
    pub fn read_row(&self, row: usize, out: &mut [T]) {
        assert_eq!(out.len(), self.cols, "row buffer must hold one row");
        self.read_into(row * self.cols, out)
    }

    /// Writes row `row` of a 2-D array from `src`.
    pub fn write_row(&self, row: usize, src: &[T]) {
        assert_eq!(src.len(), self.cols, "row buffer must hold one row");
        self.write_from(row * self.cols, src)
    }

    /// Read access to elements `start, start+step, ...` (`count` of them), recorded as one
    /// read of exactly those elements.
    pub fn strided(&self, start: usize, step: usize, count: usize) -> Strided<'a, T> {
        let mem = self.mem.strided(start, step, count);
        if let Some(s) = self.shadow {
            s.strided(
                false,
                start * Self::SIZE,
                Self::SIZE,
                step * Self::SIZE,
                count,
            );
        }
        Strided {
            mem,
            _life: PhantomData,
        }
    }

    /// Write access to elements `start, start+step, ...`, recorded as one write of exactly
    /// those elements.
    pub fn strided_mut(&self, start: usize, step: usize, count: usize) -> StridedMut<'a, T> {
        let mem = self.mem.strided(start, step, count);
        if let Some(s) = self.shadow {
            s.strided(
                true,
                start * Self::SIZE,
                Self::SIZE,
                step * Self::SIZE,
                count,
            );
        }
        StridedMut {
            mem,
            _life: PhantomData,
        }
    }

    /// Read access to rows `rows` of a 2-D array, recorded as one read of all of them:
    /// the cheapest way for stencil codes to declare what they read.
    pub fn block(&self, rows: Range<usize>) -> Block<'a, T> {
        assert!(self.cols > 0, "block() needs a 2-D array");
        let start = rows.start * self.cols;
        let len = rows.len() * self.cols;
        let mem = self.mem.sub(start, len);
        self.prefetch_checked(start, len, false);
        if let Some(s) = self.shadow {
            s.read(start * Self::SIZE, len * Self::SIZE);
        }
        Block {
            mem,
            first_row: rows.start,
            rows: rows.len(),
            cols: self.cols,
            _life: PhantomData,
        }
    }

    /// Read access to one row of a 2-D array.
    pub fn row(&self, row: usize) -> Strided<'a, T> {
        self.strided(row * self.cols, 1, self.cols)
    }

    /// Write access to one row of a 2-D array.
    pub fn row_mut(&self, row: usize) -> StridedMut<'a, T> {
        self.strided_mut(row * self.cols, 1, self.cols)
    }

    /// The same view with recording turned off: accesses through it are invisible to the
    /// race detector (for code that knowingly opts out).
    pub fn unrecorded(&self) -> View<'a, T> {
        View {
            shadow: None,
            ..self.clone()
        }
    }
}

/// Read access to a band of rows of a 2-D array, already recorded as read.
pub struct Block<'a, T> {
    mem: AppSlice<T>,
    first_row: usize,
    rows: usize,
    cols: usize,
    _life: PhantomData<&'a ()>,
}

impl<T: Pod> Block<'_, T> {
    /// Rows of the array this block covers.
    pub fn rows(&self) -> Range<usize> {
        self.first_row..self.first_row + self.rows
    }

    /// Elements `col, col+step, ...` (`count` of them) of row `row` (numbered as in the
    /// whole array). Nothing more is recorded: the block already was.
    #[inline(always)]
    pub fn strided(&self, row: usize, col: usize, step: usize, count: usize) -> Strided<'_, T> {
        let r = row.wrapping_sub(self.first_row);
        assert!(
            r < self.rows,
            "row {row} outside block rows {:?}",
            self.rows()
        );
        assert!(
            count == 0 || col + (count - 1) * step < self.cols,
            "columns {col}+{step}*{count} outside the row ({} columns)",
            self.cols
        );
        Strided {
            mem: self.mem.strided(r * self.cols + col, step, count),
            _life: PhantomData,
        }
    }

    /// Element `(row, col)`, with `row` numbered as in the whole array.
    #[inline(always)]
    pub fn get(&self, row: usize, col: usize) -> T {
        let r = row.wrapping_sub(self.first_row);
        if r >= self.rows || col >= self.cols {
            panic!(
                "element ({row}, {col}) outside block rows {:?} x {} columns",
                self.rows(),
                self.cols
            );
        }
        self.mem.get(r * self.cols + col)
    }
}

/// Read access to a strided set of elements, already recorded as read.
pub struct Strided<'a, T> {
    mem: AppStrided<T>,
    _life: PhantomData<&'a ()>,
}

impl<T: Pod> Strided<'_, T> {
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }

    /// The `k`-th element of the set.
    #[inline(always)]
    pub fn get(&self, k: usize) -> T {
        self.mem.get(k)
    }
}

/// Write access to a strided set of elements, already recorded as written.
pub struct StridedMut<'a, T> {
    mem: AppStrided<T>,
    _life: PhantomData<&'a ()>,
}

impl<T: Pod> StridedMut<'_, T> {
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }

    /// Writes the `k`-th element of the set.
    #[inline(always)]
    pub fn set(&self, k: usize, value: T) {
        self.mem.set(k, value)
    }
}

/// Lock manager of a lock id in a job of `nodes` nodes (exposed for tools and tests).
pub fn lock_manager(lock: LockId, nodes: usize) -> usize {
    engine::lock_manager(lock, nodes) as usize
}
