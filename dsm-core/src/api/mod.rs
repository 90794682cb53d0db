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
//!
//! This module owns the node handle: initialisation from the [`JobConfig`], allocation,
//! synchronization and shutdown. The views live in [`view`], race-detection orchestration
//! in [`race`], the run's counters and stats file in [`stats`].

mod analyst;
mod code_sites;
mod foreign;
mod functions;
mod pinpoint;
mod race;
mod semaphore;
mod stats;
mod trace;
mod view;

pub use foreign::RawArray;
pub use semaphore::{semaphore_id, Semaphore};
pub use view::{band, Array, Block, Strided, StridedMut, View};

use crate::chaos;
use crate::comm::{Comm, SegmentMemory, StateMirror};
use crate::engine::{self, Command, Engine, Reply};
use crate::error::DsmError;
use crate::fault;
use crate::sys::{self, AppSlice, Segment, SegmentFile};
use bytemuck::Pod;
use dsm_proto::segment_base::{self, SegmentChoice, SegmentProbe};
use dsm_proto::{
    JobConfig, LockId, NodeId, PageNo, PageRuns, RaceNotices, SyncPoint, VectorTime,
    MAX_SEGMENT_BYTES, PAGE_SIZE,
};
pub use dsm_race::RegionRule;
use dsm_race::{Point, VarInfo};
use race::RaceState;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use trace::TraceState;

pub use crate::engine::Stats;

/// Default shared segment: reserved, committed page by page as it is touched.
pub const DEFAULT_SEGMENT: usize = 1 << 30;
/// Default address of the segment (the same on every node).
pub const DEFAULT_SEGMENT_ADDR: usize = dsm_proto::segment_base::CANDIDATE_BASES[0] as usize;
/// Most bitmap bytes a node ships unasked with a barrier arrival; beyond this the master
/// fetches what it needs instead.
const MAX_SHIPPED_BITMAP_BYTES: usize = 256 << 10;
/// Bulk accesses prefetch missing pages in batches of this many pages. A batch is one
/// request per home and one reply message: bigger batches mean fewer round trips but
/// replies that are neither pipelined nor cache-warm (FFT 128x128x64 at N = 2, whose
/// transposes fetch 1024 pages: 32-page batches 0.046-0.052 s, 128 0.049-0.058 s, 512
/// 0.056-0.068 s, five alternating runs each).
const PREFETCH_BATCH: usize = 32;
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

/// Most twins per interval the SIGSEGV handler can take without the comm thread (16 MiB
/// of slots at most, made as intervals need them; see `engine::fast`).
const MAX_HANDLER_TWINS: usize = 4096;

/// With `DSM_PIN=1`, keeps this node's threads (the app thread and the comm thread it is
/// about to start) on one core, a different one per node. Faults hand work between those
/// two threads, and on virtual machines a wake-up across cores costs several times one on
/// the same core. It is not the default: a node that serves pages must then preempt its own
/// computation, which slows page-serving programs such as SOR while lock-heavy ones gain
/// (docs/measurements.md).
fn place_on_core(config: &JobConfig) {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    if !config.pin {
        return;
    }
    let rank = config.rank;
    let Ok(allowed) = sched_getaffinity(Pid::from_raw(0)) else {
        return;
    };
    let cores: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .collect();
    // Nodes on this machine: the launcher's local placement when known, else the job.
    let (local_rank, local) = config
        .local
        .map_or((config.rank, config.size), |l| (l.rank, l.size));
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

struct AllocMeta {
    name: String,
    first_page: PageNo,
    elem_size: usize,
    /// Elements.
    len: usize,
    /// Columns of a 2-D array, 0 for 1-D.
    cols: usize,
    /// The element type's name, for value traces.
    type_name: String,
    /// Home of each page, as runs `(first, count, home)`.
    homes: Vec<(PageNo, u32, NodeId)>,
    /// dsm's own allocation (value-trace hashes): not traced.
    internal: bool,
}

/// Stops this rank when its launcher is gone: a thread waits on the lifeline pipe dsmrun
/// gave the rank, whose only writer is dsmrun, and end-of-file there means dsmrun has
/// exited, however it died. Without it, `kill -9` of dsmrun would leave every rank running.
fn watch_launcher(fd: i32, rank: usize) -> Result<(), DsmError> {
    use std::io::Read;
    let mut pipe = sys::adopt_lifeline(fd).map_err(DsmError::Io)?;
    std::thread::Builder::new()
        .name("dsm-lifeline".into())
        .stack_size(64 << 10)
        .spawn(move || {
            let mut byte = [0u8; 1];
            loop {
                match pipe.read(&mut byte) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            crate::comm::fatal(&format!(
                "rank {rank}: the launcher (dsmrun) is gone; stopping this rank"
            ));
        })
        .map_err(DsmError::Io)?;
    Ok(())
}

/// This rank's [`SegmentProbe`]: which candidate bases (the user's, or
/// [`segment_base::CANDIDATE_BASES`]) it could map `seg_len` bytes at, and whether it
/// could map the job's common segment or its host's memory (see [`may_share_memory`]).
fn probe_segment_bases(
    env: &JobConfig,
    seg_len: usize,
    mesh: &dsm_net::Mesh,
) -> Result<SegmentProbe, DsmError> {
    let shm_peers: Vec<u32> = (0..mesh.size)
        .filter(|&r| r != mesh.rank && mesh.shm[r].is_some())
        .map(|r| r as u32)
        .collect();
    let shares = may_share_memory(env) && mesh.segment_file.is_some();
    let common_memory = shares && shm_peers.len() + 1 == mesh.size;
    let host_memory = shares && env.host_memory;
    // Recording, replay and chaos order the protocol's lock grants.
    let host_locks =
        env.replay.record.is_none() && env.replay.replay.is_none() && env.replay.chaos.is_none();
    // Fault injection for tests: a page in the way at the default base on one rank.
    if env.debug.occupy_base_on_rank == Some(env.rank) {
        sys::occupy_page_for_test(DEFAULT_SEGMENT_ADDR).map_err(DsmError::Segment)?;
    }
    let bases: Vec<u64> = match env.segment_addr {
        Some(a) => vec![a as u64],
        None => segment_base::CANDIDATE_BASES.to_vec(),
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "?".into());
    Ok(SegmentProbe {
        host,
        len: seg_len as u64,
        bases: bases
            .into_iter()
            .map(|b| {
                let why = sys::address_range_free(b as usize, seg_len)
                    .err()
                    .map(|e| e.to_string());
                (b, why)
            })
            .collect(),
        common_memory,
        host_locks,
        host_memory,
        shm_peers,
    })
}

/// Whether this rank's configuration lets it share memory with the ranks on its host
/// (one common segment when every rank is on it, else one memory per host), so that no
/// page travels between them: nothing asks for the protocol's page copies
/// (`DSM_TRANSPORT=rings` or `tcp` does). Race detection does not need them: the views
/// record accesses, and synchronization carries vector times. A race-detecting record or
/// replay does: in one memory a racy read sees whatever the writer stored last, so a
/// replay of a racy program (the one `--pinpoint` needs) would diverge nearly always,
/// where the protocol's copies fix what most racy reads see.
fn may_share_memory(env: &JobConfig) -> bool {
    let ordering = env.replay.record.is_some() || env.replay.replay.is_some();
    env.transport == dsm_proto::TransportChoice::Auto && !(env.race.enabled && ordering)
}

/// Largest allocation of a common segment committed when it is made (see
/// `Dsm::populate`): the dense arrays of the shipped apps at their scaled inputs (SOR 4096
/// is 128 MiB) fit, a large sparse one stays lazy.
const POPULATE_MAX_BYTES: u64 = 256 << 20;

/// The host's available memory (`MemAvailable` of `/proc/meminfo`), in bytes.
fn available_memory() -> Option<u64> {
    Some(proc_kib("/proc/meminfo", "MemAvailable")? * 1024)
}

/// A `Key:   N kB` line of a `/proc` file (`meminfo`, `self/status`): N.
fn proc_kib(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text
        .lines()
        .find(|l| l.strip_prefix(key).is_some_and(|r| r.starts_with(':')))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A node of the job. Create one per process with [`Dsm::init`].
pub struct Dsm {
    rank: usize,
    size: usize,
    seg: &'static Segment,
    /// Every rank maps the same segment file (see [`may_share_memory`]).
    common_memory: bool,
    /// With one memory per host: the other ranks of this host. Pages homed at any of them
    /// or here are mapped from the host's file as they are allocated.
    host_mates: Vec<NodeId>,
    /// Locks are taken in the common memory ([`sys::HostLock`]) rather than through the
    /// protocol: a common segment, and no rank records, replays or runs chaos (which order
    /// the protocol's lock grants); decided by rank 0 for every rank alike.
    host_locks: bool,
    /// Host locks this rank holds: taking one again is an error, as the protocol's
    /// locks say, not a wait for ever.
    host_locks_held: Vec<LockId>,
    /// Locks taken in the common memory so far.
    host_lock_acquires: u64,
    comm: Option<Comm>,
    /// Page states as the comm thread sees them, to prefetch only what is missing.
    states: Arc<StateMirror>,
    allocs: Vec<AllocMeta>,
    /// The allocation high-water mark: allocations are contiguous from page 0 upwards.
    next_page: usize,
    /// Pages allocations may use (the segment's, at most `PageNo::MAX`).
    page_limit: usize,
    race: Option<RaceState>,
    /// Value tracing or comparison is on (every rank takes part in its barriers).
    tracing: bool,
    /// Rank 0's trace file, when tracing.
    trace: Option<TraceState>,
    /// The value-trace hash array (one u64 per traced block), once allocated.
    trace_hashes: Option<(Array<u64>, usize)>,
    /// Rank 0 reads values at trace points (comparison, or a trace with values), so
    /// every node waits for it at a second internal barrier.
    trace_reads_values: bool,
    /// dsm is making its own allocation (the only time a reserved name is accepted).
    allocating_internal: bool,
    finished: bool,
    /// A barrier failed on this rank (its analysis, say): the others may be waiting in
    /// it, so the finishing barrier would wait forever; dropping the node then leaves
    /// the job without it, and its peers see it gone.
    barrier_failed: bool,
    started: Instant,
    /// The program's `barrier()` calls so far: epochs are numbered by them in reports.
    barriers_called: u32,
    /// The synchronization under way, in the program's terms, for race reports.
    sync_point: Point,
    /// Where to write the run's counters at finish (`DSM_STATS_FILE`).
    stats_file: Option<std::path::PathBuf>,
    /// Recording the synchronization order: where this rank writes its part at finish.
    record_part: Option<std::path::PathBuf>,
    /// Recording or replaying: named locks whose names the engine has been given.
    named_locks: Option<std::collections::HashSet<LockId>>,
    /// Chaos mode's random delays (`--chaos`).
    chaos: Option<chaos::Chaos>,
    /// Pinpoint mode: watched elements and the source locations of their accesses.
    pin: Option<pinpoint::PinState>,
    /// Semaphores this node created: name and initial count.
    semaphores: std::collections::HashMap<dsm_proto::SemId, (String, u32)>,
    /// This rank's part of the semaphore trace (`--sem-trace`).
    sem_trace: Option<dsm_ahb::format::PartWriter<std::io::BufWriter<std::fs::File>>>,
    _not_send: PhantomData<*const ()>,
}

/// What an allocation's elements are, as far as dsm needs to know: their size and
/// alignment, and a type name for value traces.
struct ElemType {
    size: usize,
    align: usize,
    name: String,
}

fn fnv(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The shared segment's length: the job's choice rounded up to whole pages, or the default.
fn segment_len(env: &JobConfig) -> Result<usize, DsmError> {
    let seg_len = match env.segment_bytes {
        None => DEFAULT_SEGMENT,
        Some(b) if b.div_ceil(PAGE_SIZE as u64) <= MAX_SEGMENT_BYTES / PAGE_SIZE as u64 => {
            (b as usize).div_ceil(PAGE_SIZE) * PAGE_SIZE
        }
        Some(b) => {
            return Err(DsmError::Config(format!(
                "a shared segment of {b} bytes (dsmrun --segment, DSM_SEGMENT) is larger \
                 than the largest, 16T ({MAX_SEGMENT_BYTES} bytes): page numbers are 32-bit"
            )))
        }
    };
    Ok(seg_len)
}

/// Where the segment goes, agreed by every rank before anyone maps it.
struct SegmentPlan {
    base: usize,
    /// Every rank maps one common segment (see [`may_share_memory`]).
    common_memory: bool,
    /// Locks live in the common segment.
    host_locks: bool,
    /// The file to map.
    file: SegmentFile,
    /// With one memory per host: the other ranks of this host.
    host_mates: Vec<NodeId>,
}

/// Agrees with every rank on the segment's base and on whether ranks share memory: the
/// whole job one common segment, one memory per host, or none.
fn choose_segment(
    env: &JobConfig,
    mesh: &mut dsm_net::Mesh,
    seg_len: usize,
) -> Result<SegmentPlan, DsmError> {
    let probe = probe_segment_bases(env, seg_len, mesh)?;
    let shm_peers = probe.shm_peers.clone();
    // Every rank maps the segment at one address: agree on one free on every host
    // before mapping, so that a clash is one clear message, never a crash later.
    let explicit = env.segment_addr.is_some();
    let choice = if env.size == 1 {
        segment_base::choose(&[probe], explicit)
    } else {
        dsm_net::agree_segment_base(
            mesh,
            probe,
            |probes| segment_base::choose(probes, explicit),
            env.connect_timeout,
        )?
    };
    let (seg_addr, common_memory, host_locks, host_memory) = match choice {
        SegmentChoice::Use {
            base,
            moved_because,
            common_memory,
            host_locks,
            host_memory,
        } => {
            if let (Some(why), 0) = (moved_because, env.rank) {
                tracing::warn!(
                    "{why}; the job maps its shared segment at {base:#x} instead (free on every host)"
                );
            }
            (base as usize, common_memory, host_locks, host_memory)
        }
        SegmentChoice::Stop { reason } => {
            return Err(DsmError::Segment(std::io::Error::other(reason)))
        }
    };
    if env.rank == 0 && common_memory {
        tracing::info!(
            "the {} ranks share one host: they map one common segment, and no page \
             travels (DSM_TRANSPORT=rings gives each rank its own copy)",
            env.size
        );
    } else if env.rank == 0 && host_memory {
        tracing::info!(
            "the ranks on each host share one memory: pages travel between hosts only \
             (DSM_TRANSPORT=rings gives each rank its own copy)"
        );
    }
    let file = if common_memory || host_memory {
        let file = mesh.segment_file.take().ok_or_else(|| {
            DsmError::Segment(std::io::Error::other(
                "rank 0 chose shared memory, but this rank holds no segment file",
            ))
        })?;
        if common_memory {
            SegmentFile::Common(file)
        } else {
            SegmentFile::Host(file)
        }
    } else {
        SegmentFile::Own
    };
    mesh.segment_file = None;
    Ok(SegmentPlan {
        base: seg_addr,
        common_memory,
        host_locks,
        file,
        host_mates: if host_memory {
            shm_peers.into_iter().map(|r| r as NodeId).collect()
        } else {
            Vec::new()
        },
    })
}

/// The protocol engine over the mapped segment, with the handler's fast path, pushes,
/// and recording or replay as the job asks; also the path of this rank's record part.
fn build_engine(
    env: &JobConfig,
    seg: &'static Segment,
    common_memory: bool,
    host_mates: &[NodeId],
    race_on: bool,
) -> Result<(Engine<SegmentMemory>, Option<std::path::PathBuf>), DsmError> {
    let mut engine = Engine::new(
        env.rank as NodeId,
        env.size,
        seg.pages(),
        SegmentMemory::new(seg),
        race_on,
    );
    engine.set_common_memory(common_memory);
    engine.set_host_mates(host_mates);
    // In one common memory nothing faults: no handler path to hand work over at every
    // engine step (a lock-heavy race run makes two per lock operation), no twin slots.
    if env.debug.fast_faults && !common_memory {
        let fast = std::sync::Arc::new(crate::engine::FastFaults::new(
            engine.page_limit(),
            MAX_HANDLER_TWINS,
        ));
        fault::set_fast_faults(Some(fast.clone()));
        engine = engine.with_fast_faults(fast);
    } else {
        fault::set_fast_faults(None);
    }
    let record_part = env.replay.record.as_ref().map(|prefix| {
        let mut p = prefix.as_os_str().to_owned();
        p.push(format!(".{}", env.rank));
        std::path::PathBuf::from(p)
    });
    engine.set_push_limit(env.push_pages);
    if record_part.is_some() {
        engine.start_recording();
    }
    if let Some(path) = &env.replay.replay {
        engine.start_replay(load_schedule(path, env.rank, env.size)?);
    }
    Ok((engine, record_part))
}

impl Dsm {
    /// Joins the job described by the environment (`dsmrun`, `srun` or `mpirun` with
    /// `DSM_COORD` and `DSM_JOB_SECRET`), or runs as a single node when started alone.
    pub fn init() -> Result<Dsm, DsmError> {
        Self::init_with(Self::job_config()?)
    }

    /// The job [`Dsm::init`] would join, read from the environment, for a caller that
    /// must look at it first (the C API refuses `--race` for an uninstrumented program).
    pub fn job_config() -> Result<JobConfig, DsmError> {
        // The user's key is read (or made) only for a Slurm job without DSM_JOB_SECRET.
        Ok(JobConfig::from_lookup_keyed(
            |k| std::env::var(k).ok(),
            dsm_net::user_key::load_or_create,
        )?)
    }

    /// Like [`Dsm::init`] with an explicit job description.
    pub fn init_with(env: JobConfig) -> Result<Dsm, DsmError> {
        if INITIALIZED.swap(true, Ordering::AcqRel) {
            return Err(DsmError::AlreadyInitialized);
        }
        if let Some(fd) = env.launcher_fd {
            watch_launcher(fd, env.rank)?;
        }
        let seg_len = segment_len(&env)?;
        let rendezvous = match (env.rank, env.coord_fd, env.coord) {
            (0, Some(fd), Some(coord)) => {
                Some(sys::adopt_rendezvous(fd, coord).map_err(DsmError::Io)?)
            }
            _ => None,
        };
        let mut mesh = dsm_net::connect_mesh_with(&env, rendezvous)?;
        let SegmentPlan {
            base: seg_addr,
            common_memory,
            host_locks,
            file,
            host_mates,
        } = choose_segment(&env, &mut mesh, seg_len)?;
        let (seg, mailbox) =
            fault::start(seg_addr, seg_len, file, env.size).map_err(DsmError::Segment)?;
        // Whether polling pays depends on the cores the job's ranks may use on this host,
        // so it is decided before `DSM_PIN=1` narrows this process to one of them.
        let ranks_here = env.local.map_or(env.size, |l| l.size);
        let spin_budget = crate::spin::budget_for(env.spin, ranks_here);
        place_on_core(&env);
        let mut race = if env.race.enabled {
            let mut r =
                RaceState::new(env.race.clone(), env.rank, env.size).map_err(DsmError::Io)?;
            r.timed = env.race.stats || env.stats_file.is_some();
            Some(r)
        } else {
            None
        };
        let tracing = env.trace.mode != dsm_proto::TraceMode::Off;
        let trace = if env.rank == 0 {
            TraceState::open(&env.trace, env.debug.trace_stats)?
        } else {
            None
        };
        let (engine, record_part) =
            build_engine(&env, seg, common_memory, &host_mates, race.is_some())?;
        let order_on = record_part.is_some() || env.replay.replay.is_some();
        let pin = match (&race, env.race.pinpoint.is_empty()) {
            (Some(_), false) => {
                let dir = env.race.pinpoint_dir.clone().ok_or_else(|| {
                    DsmError::Config(format!(
                        "{} needs {} (dsmrun sets both)",
                        dsm_proto::env_vars::PINPOINT,
                        dsm_proto::env_vars::PINPOINT_DIR
                    ))
                })?;
                Some(
                    pinpoint::PinState::new(env.rank, &env.race.pinpoint, dir)
                        .map_err(DsmError::Config)?,
                )
            }
            _ => None,
        };
        let page_limit = engine.page_limit();
        crate::spin::set_budget(spin_budget);
        let comm = Comm::start(mesh, engine, mailbox, seg, env.liveness, env.replay.chaos)
            .map_err(DsmError::Io)?;
        if let Some(r) = race.as_mut() {
            r.start_analyst(&comm).map_err(DsmError::Io)?;
            r.recorder.keep_digest(order_on);
        }
        if let Some(marker) = &env.race.started_marker {
            // This rank is set up and runs the program under race detection: from here a
            // failure cuts race detection short (a failure to set up, such as a damaged
            // record part, did not). Every rank notes it, since one may fail before
            // another's set-up ends. Only dsmrun's wording depends on it, so a failure to
            // write it is no error.
            if let Err(e) = std::fs::write(marker, b"") {
                tracing::debug!("cannot note the job's start in '{}': {e}", marker.display());
            }
        }
        Ok(Dsm {
            page_limit,
            states: comm.states(),
            rank: env.rank,
            size: env.size,
            seg,
            common_memory,
            host_mates,
            host_locks,
            host_locks_held: Vec::new(),
            host_lock_acquires: 0,
            comm: Some(comm),
            allocs: Vec::new(),
            next_page: 0,
            race,
            tracing,
            trace,
            trace_hashes: None,
            trace_reads_values: matches!(env.trace.mode, dsm_proto::TraceMode::Compare(_))
                || env.trace.full
                || !env.trace.vars.is_empty(),
            allocating_internal: false,
            finished: false,
            barrier_failed: false,
            started: Instant::now(),
            stats_file: env.stats_file.clone(),
            record_part,
            named_locks: order_on.then(Default::default),
            chaos: env
                .replay
                .chaos
                .map(|seed| chaos::Chaos::new(seed, env.rank)),
            pin,
            semaphores: Default::default(),
            sem_trace: semaphore::open_trace(&env)?,
            barriers_called: 0,
            sync_point: Point::Barrier(0),
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

    /// Runs `f` holding the engine lock (see `read_segment_word_holding_the_engine`).
    pub(crate) fn with_engine_held<R>(&self, f: impl FnOnce() -> R) -> R {
        self.comm().with_engine_held(f)
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
        let elem = ElemType {
            size: std::mem::size_of::<T>(),
            align: std::mem::align_of::<T>(),
            name: std::any::type_name::<T>().to_string(),
        };
        let (id, offset) = self.alloc_elems(name, len, cols, dist, elem)?;
        Ok(Array {
            id,
            offset,
            len,
            cols,
            _t: PhantomData,
        })
    }

    /// The allocation behind [`Dsm::alloc`] and [`Dsm::alloc_raw`], for elements described
    /// by `ty`: its index and its byte offset in the segment.
    fn alloc_elems(
        &mut self,
        name: &str,
        len: usize,
        cols: usize,
        dist: Distribution,
        ty: ElemType,
    ) -> Result<(usize, usize), DsmError> {
        let elem = ty.size;
        if name.is_empty() {
            return Err(DsmError::InvalidAlloc("allocations need a name".into()));
        }
        if name.starts_with(trace::INTERNAL_PREFIX) && !self.allocating_internal {
            return Err(DsmError::InvalidAlloc(format!(
                "'{name}': names starting with '{}' are dsm's own",
                trace::INTERNAL_PREFIX
            )));
        }
        if len == 0 || elem == 0 {
            return Err(DsmError::InvalidAlloc(format!(
                "'{name}': empty allocation ({len} elements of {elem} bytes)"
            )));
        }
        if self.allocs.iter().any(|a| a.name == name) {
            return Err(DsmError::InvalidAlloc(format!(
                "'{name}' is allocated already: names must be unique (race reports and value \
                 traces name elements by them)"
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
        if pages > self.page_limit - self.next_page {
            return Err(DsmError::SegmentFull {
                name: name.into(),
                bytes,
                free: (self.page_limit - self.next_page) * PAGE_SIZE,
                segment: self.seg.len(),
            });
        }
        let first = self.next_page;
        // The bookkeeping of the new pages (page table, state mirror, race shadow) is made
        // now, before anything changes, so that a node short of memory returns an error.
        let out_of_memory = |what: &str, e: std::collections::TryReserveError| {
            DsmError::OutOfMemory(format!(
                "cannot allocate the {what} of '{name}' ({bytes} bytes, {pages} pages): {e}"
            ))
        };
        self.comm()
            .reserve_pages(first + pages)
            .map_err(|e| out_of_memory("page table", e))?;
        if let Some(r) = self.race.as_mut() {
            r.recorder
                .add_alloc(first as PageNo, bytes, elem)
                .map_err(|e| out_of_memory("race-detection shadow", e))?;
        }
        let homes = self.homes(first, pages, bytes, elem, cols, dist);
        let mut digest = fnv(FNV_OFFSET, name.as_bytes());
        for v in [elem, ty.align, len, cols, first] {
            digest = fnv(digest, &(v as u64).to_le_bytes());
        }
        let race = self.close_race_interval()?;
        self.fold_access_digest();
        if let Some(r) = self.race.as_mut() {
            let var = VarInfo {
                name: name.to_string(),
                first_page: first as PageNo,
                pages: pages as u32,
                base_addr: self.seg.app_base() + first * PAGE_SIZE,
                elem_size: elem,
                len,
                cols: (cols > 0).then_some(cols),
                granule_shift: dsm_race::granule_shift(elem),
            };
            if let Some(mut m) = r.master() {
                m.vars.push(var.clone());
            }
            r.vars.push(var);
        }
        self.next_page += pages;
        if let Some(p) = self.pin.as_mut() {
            p.add_alloc(name);
        }
        self.allocs.push(AllocMeta {
            name: name.to_string(),
            first_page: first as PageNo,
            elem_size: elem,
            len,
            cols,
            type_name: ty.name,
            homes: homes.clone(),
            internal: name.starts_with(trace::INTERNAL_PREFIX),
        });
        self.sync_point = Point::Allocation {
            name: name.to_string(),
            after: self.barriers_called,
        };
        self.flush_pin_hits()?;
        let at = SyncPoint::Allocation {
            name: name.to_string(),
            after: self.barriers_called,
        };
        self.map_host_pages(&homes)?;
        self.sync(Command::Alloc {
            homes,
            digest,
            race,
            at,
        })?;
        if self.common_memory {
            self.populate(first, pages);
        }
        Ok((self.allocs.len() - 1, first * PAGE_SIZE))
    }

    /// With one memory per host: maps the pages of a new allocation homed on this host
    /// from the host's file, before the engine makes them accessible.
    fn map_host_pages(&self, homes: &[(PageNo, u32, NodeId)]) -> Result<(), DsmError> {
        if self.host_mates.is_empty() {
            return Ok(());
        }
        let on_host = |home: NodeId| home as usize == self.rank || self.host_mates.contains(&home);
        for &(first, count, _) in homes.iter().filter(|r| on_host(r.2)) {
            self.seg
                .map_host_pages(first as usize, count as usize)
                .map_err(DsmError::Segment)?;
        }
        Ok(())
    }

    /// Commits a new allocation's pages of the common segment and maps them in this
    /// process: the first touch of a page of shared memory costs each process a fault (the
    /// file's page is found or made, and zeroed, then mapped), about 1 us per 4 KiB, which
    /// a program with threads pays once per page and, as dsm's benchmarks set it up,
    /// outside its timing. The allocation is a barrier anyway. Skipped for an allocation
    /// larger than [`POPULATE_MAX_BYTES`] or a quarter of the host's available memory (a
    /// sparse array must not be committed whole), and where the kernel cannot (before
    /// 5.14): the pages are then committed on first touch.
    fn populate(&self, first: usize, pages: usize) {
        let bytes = (pages * PAGE_SIZE) as u64;
        if bytes > POPULATE_MAX_BYTES || available_memory().is_some_and(|avail| bytes > avail / 4) {
            tracing::debug!("allocation of {bytes} bytes left to be committed on first touch");
            return;
        }
        if let Err(e) = self.seg.populate(first, pages) {
            tracing::debug!("pages {first}+{pages} left to be committed on first touch: {e}");
        }
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
            pin: self.pin.as_ref().and_then(|p| p.view(array.id)),
            cols: array.cols,
            first_page: meta.first_page,
            dsm: self,
        }
    }

    /// Declares that the elements of `array` are made of `f64` fields only (a struct of
    /// f64s or an array of them), so value traces (`dsmrun --trace-values`, `--compare`)
    /// compare them field by field within `--tolerance` and print the differing field as a
    /// number; other element types are compared bit for bit and printed as bytes. Fails if
    /// the element size is not a multiple of 8. Local: every rank may call it or not.
    pub fn trace_as_f64<T: Pod>(&mut self, array: &Array<T>) -> Result<(), DsmError> {
        let meta = &mut self.allocs[array.id];
        if !meta.elem_size.is_multiple_of(8) {
            return Err(DsmError::InvalidAlloc(format!(
                "'{}': elements of {} bytes cannot be f64 fields",
                meta.name, meta.elem_size
            )));
        }
        if !meta.type_name.ends_with(dsm_trace::F64_FIELDS) {
            meta.type_name.push_str(dsm_trace::F64_FIELDS);
        }
        Ok(())
    }

    /// Name of an allocation (for messages).
    pub fn name_of<T>(&self, array: &Array<T>) -> &str {
        &self.allocs[array.id].name
    }
    /// Waits at a barrier with all other nodes.
    pub fn barrier(&mut self) -> Result<(), DsmError> {
        self.barriers_called += 1;
        self.sync_point = Point::Barrier(self.barriers_called);
        self.barrier_command(false, SyncPoint::Barrier(self.barriers_called))?;
        if let Some(p) = &self.pin {
            p.barrier_passed(self.barriers_called);
        }
        if let Some(t) = self.sem_trace.as_mut() {
            // The semaphore analysis cuts the trace into epochs here.
            t.barrier(self.barriers_called)
                .map_err(|e| DsmError::Config(format!("semaphore trace: {e}")))?;
        }
        self.trace_point(false)
    }

    /// A barrier the program did not call (value tracing): not counted in its epochs.
    fn internal_barrier(&mut self) -> Result<(), DsmError> {
        let after = self.barriers_called;
        self.barrier_command(false, SyncPoint::Internal { after })
    }

    /// Closes the interval and waits at a barrier (the last one of the run when
    /// `finishing`), serving race-detection rounds meanwhile. `at` names it in messages.
    fn barrier_command(&mut self, finishing: bool, at: SyncPoint) -> Result<(), DsmError> {
        let result = self.barrier_round(finishing, at);
        if result.is_err() {
            self.barrier_failed = true;
        }
        result
    }

    fn barrier_round(&mut self, finishing: bool, at: SyncPoint) -> Result<(), DsmError> {
        if let Some(c) = self.chaos.as_mut() {
            c.before_barrier();
        }
        self.flush_pin_hits()?;
        self.ship_last_race_batch()?;
        let race = self.close_race_interval()?;
        self.fold_access_digest();
        let bitmaps = self.shippable_bitmaps();
        self.sync(Command::Barrier {
            finishing,
            race,
            bitmaps,
            at,
        })
    }

    /// The last barrier of the run, in `finish()` or when a value comparison stops it.
    fn finishing_barrier(&mut self) -> Result<(), DsmError> {
        let after = self.barriers_called;
        self.barrier_command(true, SyncPoint::Finish { after })
    }

    /// Sends a barrier-like command and serves the race-detection rounds until released.
    fn sync(&mut self, cmd: Command) -> Result<(), DsmError> {
        self.comm().send(cmd);
        loop {
            match self.comm().recv() {
                // The count of races is rank 0's, which reports them itself.
                Reply::BarrierDone {
                    epoch,
                    races: _,
                    known,
                } => {
                    if let Some(r) = self.race.as_mut() {
                        r.set_known(&known);
                        r.recorder.discard_epoch();
                        r.epoch_done(self.barriers_called);
                        if let Some(mut m) = r.master() {
                            m.reporter.note_sync(epoch, &self.sync_point);
                        }
                    }
                    return Ok(());
                }
                Reply::BitmapsWanted { epoch, keys } => {
                    let r = self.race.as_mut().ok_or_else(|| {
                        DsmError::Protocol("bitmaps requested without race detection".into())
                    })?;
                    r.asked_pages.extend(keys.iter().map(|k| k.page));
                    let bitmaps = r.recorder.bitmaps(&keys);
                    self.comm().send(Command::SendBitmaps { epoch, bitmaps });
                }
                Reply::AnalyzeEpoch {
                    epoch,
                    intervals,
                    bitmaps,
                } => {
                    let (races, spent) = self.analyze(epoch, intervals, bitmaps)?;
                    self.comm().send(Command::ReleaseBarrier { races });
                    drop(spent);
                }
                other => {
                    return Err(DsmError::Protocol(format!(
                        "unexpected reply during a barrier: {other:?}"
                    )))
                }
            }
        }
    }

    /// Acquires lock `id` (any integer below 2^63), returning a guard that releases it.
    /// Locks are not recursive. Through the protocol (a manager per lock, grants carrying
    /// the writes the acquirer has not seen), or, when every rank maps one common segment,
    /// in that memory (a ticket lock shared by the ranks, no message).
    pub fn lock(&mut self, id: u64) -> Result<LockGuard<'_>, DsmError> {
        if id >= 1 << 63 {
            return Err(DsmError::Config(format!(
                "lock id {id} is reserved for named locks; use ids below 2^63"
            )));
        }
        self.acquire(id)
    }

    /// Says which locks this rank takes next, in order (ids as for [`Dsm::lock`]): a loop
    /// that updates many elements, each under its own lock, calls it once before the loop.
    /// Their tokens are then asked for a few at a time ahead of the acquires, so that an
    /// acquire finds its lock here instead of waiting a round trip for it (across hosts,
    /// most of what such a loop costs). A hint never changes what the program computes:
    /// a token that came ahead is not held, and goes on at once to a rank that asks for
    /// it first; a lock the program then does not take costs its messages and nothing
    /// else. A new hint replaces the previous one. Without effect when the ranks share one
    /// common memory (their locks take no message) and in a replay. An id reserved for
    /// named locks (2^63 and above) is an error, as in [`Dsm::lock`], and nothing is hinted.
    pub fn prefetch_locks(&mut self, ids: impl IntoIterator<Item = u64>) -> Result<(), DsmError> {
        let locks: Vec<u64> = ids.into_iter().collect();
        if let Some(bad) = locks.iter().find(|&&id| id >= 1 << 63) {
            return Err(DsmError::Config(format!(
                "lock id {bad} is reserved for named locks; use ids below 2^63"
            )));
        }
        if !self.host_locks && !locks.is_empty() {
            self.comm().send(Command::PrefetchLocks { locks });
        }
        Ok(())
    }

    /// Marks the allocation `name` as order-independent (a commutative sum, say): in schedule
    /// mode (`dsmrun --race=schedule`) its lock-order dependences are not reported, as with
    /// `--schedule-ignore NAME`. Data races on it are still reported; without schedule mode
    /// this does nothing. Only rank 0's call matters (it reports), but every rank may make it.
    pub fn order_independent(&mut self, name: &str) {
        if let Some(mut m) = self.race.as_ref().and_then(|r| r.master()) {
            m.reporter.ignore(name);
        }
    }

    /// `dsmrun --check`: takes the zero fill of `array` as its initial value, so reading
    /// elements nobody wrote (a counter that starts at zero) is not reported as an
    /// uninitialised read. Call it right after the allocation. Only rank 0's call matters
    /// (it runs the checks), but every rank may make it; without `--check` it does nothing.
    pub fn assume_initialised<T: Pod>(&mut self, array: &Array<T>) {
        self.assume_alloc_initialised(array.id);
    }

    /// [`Dsm::assume_initialised`] of allocation number `id`.
    pub(super) fn assume_alloc_initialised(&mut self, id: usize) {
        let first = self.allocs[id].first_page;
        if let Some(r) = self.race.as_mut() {
            if let (Some(checker), Some(var)) = (r.checker.as_mut(), r.vars.lookup(first)) {
                checker.initialised(var);
            }
        }
    }

    /// `dsmrun --check`: declares which elements of `array` each rank may write
    /// ([`RegionRule::Writes`]) or touch at all ([`RegionRule::Accesses`]): `region(rank)`
    /// for every rank of the job, like the local part of a distributed array. Accesses
    /// outside a rank's region are reported. Every rank may call it with the same
    /// function; only rank 0's call matters. Without `--check` it does nothing.
    pub fn declare_region<T: Pod>(
        &mut self,
        array: &Array<T>,
        rule: RegionRule,
        region: impl Fn(usize) -> std::ops::Range<usize>,
    ) {
        self.declare_alloc_region(array.id, rule, region);
    }

    /// [`Dsm::declare_region`] of allocation number `id`.
    pub(super) fn declare_alloc_region(
        &mut self,
        id: usize,
        rule: RegionRule,
        region: impl Fn(usize) -> std::ops::Range<usize>,
    ) {
        let first = self.allocs[id].first_page;
        let ranges = (0..self.size).map(region).collect();
        if let Some(r) = self.race.as_mut() {
            if let (Some(checker), Some(var)) = (r.checker.as_mut(), r.vars.lookup(first)) {
                checker.declare_region(var, rule, ranges);
            }
        }
    }

    /// Acquires the lock with this name (the same name means the same lock on every node).
    pub fn lock_named(&mut self, name: &str) -> Result<LockGuard<'_>, DsmError> {
        if name.is_empty() {
            return Err(DsmError::Config("named locks need a name".into()));
        }
        let id = (1u64 << 63) | (fnv(FNV_OFFSET, name.as_bytes()) & !(1u64 << 63));
        if let Some(mut m) = self.race.as_ref().and_then(|r| r.master()) {
            m.reporter.name_lock(id, name);
        }
        if let Some(named) = self.named_locks.as_mut() {
            if named.insert(id) {
                let name = name.to_string();
                self.comm().send(Command::NameLock { lock: id, name });
            }
        }
        self.acquire(id)
    }

    fn acquire(&mut self, lock: LockId) -> Result<LockGuard<'_>, DsmError> {
        if let Some(host) = self.host_locks.then(|| self.seg.host_lock(lock)).flatten() {
            if self.host_locks_held.contains(&lock) {
                return Err(DsmError::Protocol(format!(
                    "lock {lock} acquired again by rank {} while already held (locks are \
                     not recursive)",
                    self.rank
                )));
            }
            self.take_host_lock(lock, host)?;
            return Ok(LockGuard {
                dsm: self,
                lock,
                host: Some(host),
                released: false,
            });
        }
        if self.may_leave_interval_open()
            && self
                .comm()
                .with_engine_now(|e| e.acquire_here_quietly(lock))
        {
            // Nothing to learn: the interval goes on, in the recorder too.
            if let Some(r) = self.race.as_mut() {
                r.note_quiet_acquire();
            }
            self.after_lock_sync(false)?;
            return Ok(LockGuard {
                dsm: self,
                lock,
                host: None,
                released: false,
            });
        }
        if let Some(c) = self.chaos.as_mut() {
            c.before_acquire();
        }
        let race = self.close_race_interval()?;
        let reply = self.comm().call(Command::Acquire { lock, race });
        if let Some(c) = self.chaos.as_mut() {
            c.while_holding();
        }
        match reply {
            Reply::Done => self.after_lock_sync(false).map(|()| LockGuard {
                dsm: self,
                lock,
                host: None,
                released: false,
            }),
            other => Err(DsmError::Protocol(format!(
                "unexpected reply to acquire: {other:?}"
            ))),
        }
    }

    /// Whether a protocol lock's acquire that learns nothing may leave the interval open
    /// (see [`Engine::acquire_here_quietly`](crate::engine::Engine::acquire_here_quietly)):
    /// not where intervals must be numbered alike in every run (`--pinpoint`, and chaos
    /// runs, whose delays are the acquire's), nor where race detection closes one at every
    /// lock operation (`--race=schedule`, `--check`), nor while a host lock's release froze
    /// the interval (any other synchronization closes it first).
    fn may_leave_interval_open(&self) -> bool {
        self.chaos.is_none()
            && self.pin.is_none()
            && self
                .race
                .as_ref()
                .is_none_or(|r| r.elide_acquires && r.frozen_release.is_none())
    }

    /// Takes host lock `lock`. With race detection, the interval a release of the same
    /// lock froze may thaw once the lock is held, and any other frozen interval closes
    /// first; an acquire that learns nothing leaves the interval open, and one that
    /// learns something closes it and joins the lock's clock in the engine.
    fn take_host_lock(&mut self, lock: LockId, host: sys::HostLock) -> Result<(), DsmError> {
        let Some(r) = self.race.as_ref() else {
            host.lock(crate::spin::budget_ns());
            self.host_locks_held.push(lock);
            self.host_lock_acquires += 1;
            return Ok(());
        };
        let thawable = r.frozen_release == Some(lock);
        if !thawable {
            self.settle_frozen_release()?;
        }
        // A lock whose last release this rank already knows of leaves the interval open
        // (see `KnownClock`). The lock's clock read before taking the lock is a guess,
        // checked again once held.
        let elide = |r: &RaceState| r.elide_acquires && r.known.covers(host.released());
        let guessed = thawable || self.race.as_ref().is_some_and(elide);
        // Otherwise the interval before the acquire closes before the wait, not inside
        // the critical section the other ranks queue behind.
        let race = if guessed {
            None
        } else {
            self.close_race_interval()?
        };
        host.lock(crate::spin::budget_ns());
        self.host_locks_held.push(lock);
        self.host_lock_acquires += 1;
        if thawable && self.thaw_frozen_release(host) {
            return self.after_lock_sync(false);
        }
        self.settle_frozen_release()?;
        let r = self.race.as_mut().expect("race mode");
        if guessed && elide(r) {
            r.elided_acquires += 1;
            // Lock operations count towards the next race batch whether or not they
            // close an interval (see `after_lock_sync`).
            self.after_lock_sync(false)
        } else {
            self.host_acquire_in_engine(lock, host, race, guessed)
        }
    }

    /// Race mode: a host lock just taken joins its release clock in the engine, closing
    /// the interval before it (here, if the guess that it would not need to was wrong).
    fn host_acquire_in_engine(
        &mut self,
        lock: LockId,
        host: sys::HostLock,
        race: Option<RaceNotices>,
        still_open: bool,
    ) -> Result<(), DsmError> {
        let race = if still_open {
            self.close_race_interval()?
        } else {
            race
        };
        let released = VectorTime::from(host.released_clock());
        if let Some(r) = self.race.as_mut() {
            r.known.join(&released);
            r.known_stamp = 0;
        }
        if !self
            .comm()
            .with_engine_now(|e| e.host_acquire_now(lock, race, &released))
        {
            return Err(DsmError::Protocol(format!(
                "lock {lock}: the engine refused an acquire in common memory"
            )));
        }
        self.after_lock_sync(false)
    }

    /// Releases a lock held in the common memory; with race detection, leaves what this
    /// rank knew in the lock's memory for the next holder first.
    ///
    /// Only the decision (whether this release takes back the one before) and the clock
    /// need the lock held: the recorder and the engine close the interval after the
    /// unlock, so the ranks queued on the lock do not wait behind the bitmaps. Nothing
    /// runs in between (the program is inside this call), and the next holder learns
    /// only the clock, which names the interval being closed.
    fn release_host_lock(&mut self, lock: LockId, host: sys::HostLock) -> Result<(), DsmError> {
        if let Some(i) = self.host_locks_held.iter().rposition(|&l| l == lock) {
            self.host_locks_held.swap_remove(i);
        }
        if self.race.is_none() {
            host.unlock();
            return Ok(());
        }
        self.settle_frozen_release()?;
        if self.freeze_released_interval(lock, host) {
            return self.after_lock_sync(true);
        }
        if self.take_back_released_interval(lock, host) {
            // The lock keeps the clock this node left at the release taken back.
            host.unlock();
            let race = self.close_race_interval()?;
            let taken = self
                .comm()
                .with_engine_now(|e| e.host_release_again_now(lock, race));
            if !taken {
                return Err(DsmError::Protocol(format!(
                    "lock {lock}: the engine could not take back the interval its last \
                     release closed"
                )));
            }
            return self.after_host_release(lock);
        }
        let clock = self.comm().with_engine_now(|e| e.known_after_close());
        if let Some(r) = self.race.as_mut() {
            r.set_known(&clock);
            r.leave_known(host);
        }
        host.unlock();
        let race = self.close_race_interval()?;
        self.close_release_in_engine(lock, race)?;
        self.after_host_release(lock)
    }

    /// Race mode, after a host lock's release: a race batch if one is due, and the
    /// release remembered for the next one (see `take_back_released_interval`).
    fn after_host_release(&mut self, lock: LockId) -> Result<(), DsmError> {
        self.after_lock_sync(true)?;
        self.remember_release(lock);
        Ok(())
    }

    /// Race mode, releasing host lock `lock`: whether this release may take back the
    /// interval that this node's previous release, of the same lock, closed, so that the
    /// two critical sections and what ran between them are one interval. They may when
    /// no node can know that interval's index:
    /// - a node learns it only from that release (a release closes the interval it ends,
    ///   so the index is in no earlier release or barrier), hence only by taking `lock`
    ///   after it;
    /// - the lock still holds the clock this node left (a node that held it since left
    ///   its own, whose entry for itself this node has not seen), and this node closed no
    ///   interval since, so it learned nothing from another node either (an acquire
    ///   that learns something closes the interval).
    ///
    /// Merging two intervals that no node tells apart reports the same races, as an
    /// acquire that leaves the interval open does (see `KnownClock`); a rank that re-takes
    /// its own lock closes one interval per stretch between other synchronizations
    /// instead of one per critical section. The recorder takes the closed interval's
    /// bitmaps back unless a race batch or a barrier already took them.
    fn take_back_released_interval(&mut self, lock: LockId, host: sys::HostLock) -> bool {
        let Some(r) = self.race.as_mut() else {
            return false;
        };
        let open = r.recorder.current_interval();
        let unobserved = r.last_release == Some((lock, open - 1)) && r.lock_holds_known(host);
        if !unobserved || !r.recorder.reopen_last() {
            return false;
        }
        r.continued_releases += 1;
        true
    }

    fn release(&mut self, lock: LockId) -> Result<(), DsmError> {
        let race = self.close_race_interval()?;
        match self.comm().call(Command::Release { lock, race }) {
            Reply::Done => self.after_lock_sync(true),
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
        let count = (last_page + 1 - first_page) as u32;
        self.prefetch_runs(PageRuns::from_runs([(first_page as PageNo, count)]), write);
    }

    /// Brings `pages` in, in requests of at most [`PREFETCH_BATCH`] pages each (pages that
    /// are already accessible cost nothing: the engine skips them).
    fn prefetch_runs(&self, pages: PageRuns, write: bool) {
        let mut batch: Vec<(PageNo, u32)> = Vec::new();
        let mut in_batch = 0usize;
        let send = |batch: &mut Vec<(PageNo, u32)>| {
            let pages = PageRuns::from_runs(batch.drain(..));
            match self.comm().call(Command::Prefetch { pages, write }) {
                Reply::Done => {}
                other => crate::comm::fatal(&format!("unexpected reply to prefetch: {other:?}")),
            }
        };
        for &(first, count) in pages.runs() {
            let (mut first, mut count) = (first, count as usize);
            while count > 0 {
                let take = count.min(PREFETCH_BATCH - in_batch);
                batch.push((first, take as u32));
                in_batch += take;
                first += take as PageNo;
                count -= take;
                if in_batch == PREFETCH_BATCH {
                    send(&mut batch);
                    in_batch = 0;
                }
            }
        }
        if !batch.is_empty() {
            send(&mut batch);
        }
    }

    /// Ends the run for this node: a final barrier (with race analysis of the last epoch),
    /// then the connections close. With race detection on, rank 0 prints the summary. The
    /// returned [`Outcome`] says whether races were reported and which exit status the
    /// race convention asks for (like ThreadSanitizer's `exitcode`); the program decides
    /// whether to use it, typically by returning [`Outcome::exit_code`] from `main`.
    pub fn finish(mut self) -> Result<Outcome, DsmError> {
        self.finish_inner()
    }

    fn finish_inner(&mut self) -> Result<Outcome, DsmError> {
        if self.finished {
            return Ok(Outcome::default());
        }
        self.finished = true;
        if self.barrier_failed {
            return Err(DsmError::Protocol(
                "a barrier failed on this rank, so the ranks cannot finish together".into(),
            ));
        }
        self.sync_point = Point::Exit {
            after: self.barriers_called,
        };
        if self.tracing {
            // The last epoch's writes become visible, then rank 0 takes the final trace
            // point while the others wait.
            self.internal_barrier()?;
            self.trace_point(true)?;
        }
        let result = self.finishing_barrier();
        if let (Ok(()), Some(pin), 0) = (&result, &self.pin, self.rank) {
            let allocs: Vec<(&str, usize)> = self
                .allocs
                .iter()
                .map(|a| (a.name.as_str(), a.len))
                .collect();
            for w in pin.unmet_targets(&allocs, self.barriers_called + 1) {
                eprintln!("{w}");
            }
        }
        if result.is_ok() {
            if self.named_locks.is_some() {
                // Recording or replaying: the values the run leaves in this node's home
                // pages (complete after the last barrier) end its part of the record.
                let digest = self.home_values_digest();
                self.comm().send(Command::NoteValues { digest });
            }
            self.write_stats_file()?;
            self.write_record_part()?;
        }
        if let Some(comm) = self.comm.take() {
            comm.shutdown();
        }
        result?;
        let differ = match self.trace.as_mut() {
            Some(t) => t.finish()?,
            None => false,
        };
        let mut outcome = match self.race.as_mut() {
            Some(r) => r.finish().map_err(DsmError::Io)?,
            None => Outcome::default(),
        };
        if differ && outcome.exit_status == 0 {
            outcome.exit_status = dsm_proto::exit_codes::VALUES_DIFFER;
        }
        if outcome.exit_status != 0 {
            // The status reaches the launcher even if `main` ignores the outcome.
            sys::exit_with_at_process_exit(i32::from(outcome.exit_status));
        }
        Ok(outcome)
    }
}

impl Dsm {
    /// Recording or replaying with race detection: before a barrier, the digest of the
    /// epoch's accesses goes into the barrier's check, so a replay notices a racy value
    /// that changed which elements the program touched.
    fn fold_access_digest(&self) {
        if let (Some(_), Some(r)) = (&self.named_locks, &self.race) {
            let digest = r.recorder.epoch_digest();
            self.comm().send(Command::FoldAccessDigest { digest });
        }
    }

    /// Pinpoint: hands this node's notes so far to the master (before a barrier).
    fn flush_pin_hits(&self) -> Result<(), DsmError> {
        match &self.pin {
            Some(p) => p.flush().map_err(|e| {
                DsmError::Config(format!(
                    "cannot write pinpoint notes in '{}': {e}",
                    p.dir.display()
                ))
            }),
            None => Ok(()),
        }
    }
}

/// Reads the record to replay and this rank's schedule from it. dsmrun has checked the
/// record against the job already; this catches a file changed since, or a job started
/// by hand with `DSM_REPLAY`.
fn load_schedule(
    path: &std::path::Path,
    rank: usize,
    size: usize,
) -> Result<dsm_replay::Schedule, DsmError> {
    let bad = |why: String| DsmError::Config(format!("replay of '{}': {why}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let record = dsm_replay::Record::from_bytes(&bytes).map_err(|e| bad(e.to_string()))?;
    if record.header.nodes as usize != size {
        return Err(bad(format!(
            "it records a job of {} nodes, this one has {size}",
            record.header.nodes
        )));
    }
    record.schedule(rank as u32).map_err(|e| bad(e.to_string()))
}

impl Dsm {
    /// Recording: writes this rank's synchronization events for dsmrun to merge.
    fn write_record_part(&mut self) -> Result<(), DsmError> {
        let Some(path) = self.record_part.clone() else {
            return Ok(());
        };
        let events = match self.comm().call(Command::TakeRecord) {
            Reply::Record(events) => events,
            other => {
                return Err(DsmError::Protocol(format!(
                    "unexpected reply to the record request: {other:?}"
                )))
            }
        };
        std::fs::write(&path, dsm_replay::part_to_bytes(self.rank as u32, &events)).map_err(|e| {
            DsmError::Config(format!(
                "cannot write the record part '{}': {e}",
                path.display()
            ))
        })
    }
}

/// How a node's run ended, as [`Dsm::finish`] reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Data races reported (rank 0 knows them all; other ranks report 0).
    pub races_reported: u64,
    /// The exit status the race convention asks for: the race exit code on rank 0 when races
    /// were reported and the code is not 0; 0 otherwise. When it is not 0, the process
    /// ends with it whatever `main` returns (as ThreadSanitizer's `exitcode`), so returning
    /// [`Outcome::exit_code`] from `main` is a courtesy, not a requirement.
    pub exit_status: u8,
}

impl Outcome {
    /// [`Outcome::exit_status`] as a value `main` can return.
    pub fn exit_code(&self) -> std::process::ExitCode {
        std::process::ExitCode::from(self.exit_status)
    }
}

impl Drop for Dsm {
    fn drop(&mut self) {
        if self.finished || self.barrier_failed || std::thread::panicking() {
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
    /// Taken in the common memory rather than through the protocol.
    host: Option<sys::HostLock>,
    released: bool,
}

impl LockGuard<'_> {
    /// Releases the lock, reporting errors (dropping the guard releases it too).
    pub fn unlock(mut self) -> Result<(), DsmError> {
        self.released = true;
        self.release()
    }

    fn release(&mut self) -> Result<(), DsmError> {
        match self.host {
            Some(host) => self.dsm.release_host_lock(self.lock, host),
            None => self.dsm.release(self.lock),
        }
    }

    /// The id of the held lock: the id given to [`Dsm::lock`], or the id a name hashes to
    /// for [`Dsm::lock_named`] (with the top bit set).
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
            if let Err(e) = self.release() {
                crate::comm::fatal(&format!("release of lock {} failed: {e}", self.lock));
            }
        }
    }
}

/// Lock manager of a lock id in a job of `nodes` nodes (exposed for tools and tests).
pub fn lock_manager(lock: LockId, nodes: usize) -> usize {
    engine::lock_manager(lock, nodes) as usize
}
