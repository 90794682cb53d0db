//! The protocol engine without sockets or signals: several engines over in-memory pages,
//! messages delivered in random order (FIFO per link, like TCP), app threads simulated as
//! scripts of lock/read/write/barrier operations. Random data-race-free programs must
//! behave exactly as under sequential consistency: every read inside a critical section
//! sees the last write made under that lock, and after a barrier every node sees every
//! write made before it, for any home placement and any interleaving.
//!
//! With race detection on, each simulated node also runs the rest of the race pipeline the
//! way `api.rs` does: accesses go into a `dsm_race::Recorder`, every synchronization
//! operation closes its interval and hands the notices to the engine, barrier arrivals ship
//! bitmaps, and the barrier master plans, fetches the missing bitmaps over the simulated
//! network and compares them. The races it reports are checked against a brute-force
//! oracle that knows nothing of intervals or notices: it logs every access with a vector
//! clock it keeps itself from the synchronization that actually happened (the order in
//! which the run granted each lock, barriers, program order), and calls two accesses a race
//! when they conflict and neither clock is below the other.

use dsm_core::engine::fast::pack_applied;
use dsm_core::engine::{
    Command, Engine, FastFaults, HostApplied, KnownClock, Output, PageState, Prot, Reply, VecMemory,
};
use dsm_proto::{
    EncodedBitmap, Msg, NodeId, PageCopy, PageNo, PageRuns, RaceNotices, SyncCause, VectorTime,
    PAGE_SIZE,
};
use dsm_race::{Access, Bitmaps, Plan, Race, RaceKind, Recorder, VarInfo, VarTable};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// Most bitmap bytes a node ships with a barrier arrival (as `api.rs`).
const MAX_SHIPPED_BITMAP_BYTES: usize = 256 << 10;

/// How a [`Op::Touch`] is recorded: the three ways the typed API marks accesses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rec {
    /// One `read`/`write` per element (`View::get`/`set`).
    Each,
    /// One `read`/`write` of the whole span (`read_into`/`write_from`; step 1 only).
    Span,
    /// One `strided` call (`View::strided`/`strided_mut`).
    Strided,
}

#[derive(Clone, Debug)]
enum Op {
    /// Collective allocation number `i` (also a barrier).
    Alloc(usize),
    Acquire(u64),
    Release(u64),
    /// A hint of the locks the node takes next (`Dsm::prefetch_locks`): right, partly
    /// wrong or stale, it must change nothing but the messages.
    PrefetchLocks(Vec<u64>),
    /// Signal (V) of a semaphore created with [`Sim::semaphores`].
    SemSignal(u64),
    /// Wait (P) on a semaphore.
    SemWait(u64),
    Barrier,
    /// The last barrier of a run (`Dsm::finish`).
    Finish,
    /// Read variable, expect the model's value at that moment.
    Check(usize),
    /// Increment variable (read, then write +1; the model follows).
    Incr(usize),
    /// Read or write elements `start, start+step, ...` (`count` of them) of an allocation,
    /// without checking values (programs with races have no sequential model).
    Touch {
        alloc: usize,
        start: usize,
        step: usize,
        count: usize,
        write: bool,
        rec: Rec,
    },
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Alloc(i) => write!(f, "alloc{i}"),
            Op::Acquire(l) => write!(f, "acq{l}"),
            Op::SemSignal(x) => write!(f, "V{x}"),
            Op::SemWait(x) => write!(f, "P{x}"),
            Op::Release(l) => write!(f, "rel{l}"),
            Op::PrefetchLocks(ls) => write!(f, "ahead{ls:?}"),
            Op::Barrier => write!(f, "bar"),
            Op::Finish => write!(f, "finish"),
            Op::Check(v) => write!(f, "check v{v}"),
            Op::Incr(v) => write!(f, "incr v{v}"),
            Op::Touch {
                alloc,
                start,
                step,
                count,
                write,
                rec,
            } => {
                write!(f, "{} a{alloc}[{start}", if *write { "W" } else { "R" })?;
                if *count > 1 {
                    write!(f, "+{step}x{count}")?;
                }
                write!(f, "]")?;
                if *rec != Rec::Each {
                    write!(f, "{rec:?}")?;
                }
                Ok(())
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Wait {
    Running,
    Fault,
    Reply,
}

struct Node {
    eng: Engine<VecMemory>,
    script: VecDeque<Op>,
    wait: Wait,
    /// The synchronization operation whose reply the node waits for.
    pending: Option<Op>,
    /// Race mode: the access recorder, as `api.rs` keeps one per node.
    rec: Option<Recorder>,
    /// The page table as rebuilt from the engine's state outputs (what the runtime mirrors).
    mirror: Vec<PageState>,
    /// Pages served to another node, from the engine's outputs (the runtime's mirror too).
    shared: Vec<bool>,
    /// Race mode: requests the app thread serves while it waits in a barrier.
    inbox: VecDeque<Reply>,
    /// The oracle's view of this node: its vector clock (an index into `Oracle::clocks`),
    /// and the interval, epoch and interval cause it counts itself from the script.
    clock: usize,
    interval: u32,
    epoch: u32,
    began: SyncCause,
    /// Host locks: what the app thread heard of its engine's knowledge, for acquires that
    /// leave the interval open (as `api.rs`).
    known: KnownClock,
    /// Incremental runs: whether the node shipped a race batch since its last barrier
    /// (only then does it ship a last one before the next, as `api.rs`).
    shipped_in_epoch: bool,
    /// Host locks: the lock this node released last, the interval that release closed
    /// and what began that interval (a release of the same lock may take it back).
    last_release: Option<(u64, u32, SyncCause)>,
    /// Host locks: the lock whose release froze the recorder's interval instead of
    /// closing it (`api.rs`'s `freeze_released_interval`), that interval and what began
    /// it. The oracle counts the node in the next interval meanwhile.
    frozen: Option<(u64, u32, SyncCause)>,
}

/// Whether any page of `first..=last` would fault for this access, by the mirrored page
/// table (what the runtime's prefetch asks).
fn any_missing(mirror: &[PageState], first: usize, last: usize, write: bool) -> bool {
    let need = if write {
        PageState::ReadWrite
    } else {
        PageState::ReadOnly
    };
    mirror[first..=last.min(mirror.len() - 1)]
        .iter()
        .any(|&s| (s as u8) < (need as u8))
}

/// Race mode, barrier master: an analysis waiting for bitmaps.
struct Analysis {
    epoch: u32,
    plan: Plan,
    bitmaps: Bitmaps,
    pending: usize,
}

/// One allocation of the simulated segment.
#[derive(Clone)]
struct AllocInfo {
    first_page: usize,
    elem: usize,
    /// Whole elements that fit its pages.
    len: usize,
    homes: Vec<(PageNo, u32, NodeId)>,
}

impl AllocInfo {
    fn name(i: usize) -> String {
        format!("a{i}")
    }

    fn base(&self) -> usize {
        self.first_page * PAGE_SIZE
    }
}

/// An access as the oracle logs it. Field order matters: sorting groups accesses by
/// element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Logged {
    alloc: usize,
    elem: usize,
    node: usize,
    clock: usize,
    epoch: u32,
    interval: u32,
    began: SyncCause,
    write: bool,
}

/// Happens-before from the synchronization as it happened, by plain vector clocks: a
/// release stores the releaser's clock in the lock and then ticks the releaser; the
/// acquire that the run granted next joins it; a barrier joins every arrival's clock and
/// each departing node ticks.
#[derive(Default)]
struct Oracle {
    clocks: Vec<Vec<u32>>,
    lock_clock: HashMap<u64, Vec<u32>>,
    holder: HashMap<u64, usize>,
    arrived: BTreeMap<u32, Vec<Option<Vec<u32>>>>,
    accesses: HashSet<Logged>,
    /// The signaller's clock at each signal, by (semaphore, signaller, its number).
    signal_clock: HashMap<(u64, usize, u32), Vec<u32>>,
    /// Signals made so far, by (semaphore, node): the next signal's number.
    signals_made: HashMap<(u64, usize), u32>,
    /// Signals consumed, to catch a signal granted twice.
    consumed: HashSet<(u64, usize, u32)>,
}

/// A race at the detector's granularity: one element, one pair of intervals.
type RaceKey = (
    u32,
    String,
    usize,
    Access,
    Access,
    RaceKind,
    (usize, usize),
    usize,
);

fn race_key(r: &Race) -> RaceKey {
    (
        r.epoch,
        r.variable.clone(),
        r.index,
        r.first,
        r.second,
        r.kind,
        r.bytes,
        r.addr,
    )
}

#[derive(Debug, Default, Clone, Copy)]
struct OracleCounts {
    /// Conflicting cross-node access pairs of one epoch ordered by synchronization (lock
    /// chains: the pairs the detector must rule out from vector timestamps).
    ordered: u64,
    /// Conflicting cross-node access pairs in different epochs (ordered by a barrier).
    across_barriers: u64,
    /// Conflicting cross-node access pairs that are concurrent (races).
    concurrent: u64,
}

/// One end of a race: an interval of a node, and the oracle's clock during it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct End {
    node: usize,
    interval: u32,
    clock: usize,
}

fn leq(a: &[u32], b: &[u32]) -> bool {
    a.iter().zip(b).all(|(x, y)| x <= y)
}

impl Oracle {
    fn clock(&mut self, c: Vec<u32>) -> usize {
        self.clocks.push(c);
        self.clocks.len() - 1
    }

    /// Every race among the logged accesses, brute force over all pairs per element, with
    /// the two ends of each (node, interval, clock).
    fn races(&self, allocs: &[AllocInfo]) -> (BTreeMap<RaceKey, [End; 2]>, OracleCounts) {
        let mut all: Vec<Logged> = self.accesses.iter().copied().collect();
        all.sort_unstable();
        let wrote: HashSet<(usize, u32, usize, usize)> = all
            .iter()
            .filter(|a| a.write)
            .map(|a| (a.node, a.interval, a.alloc, a.elem))
            .collect();
        let side = |a: &Logged| Access {
            node: a.node as NodeId,
            interval: a.interval,
            write: wrote.contains(&(a.node, a.interval, a.alloc, a.elem)),
            began_with: a.began,
        };
        let mut out = BTreeMap::new();
        let mut counts = OracleCounts::default();
        for group in all.chunk_by(|a, b| (a.alloc, a.elem) == (b.alloc, b.elem)) {
            for (i, a) in group.iter().enumerate() {
                for b in &group[i + 1..] {
                    if a.node == b.node || !(a.write || b.write) {
                        continue;
                    }
                    let (ca, cb) = (&self.clocks[a.clock], &self.clocks[b.clock]);
                    if leq(ca, cb) || leq(cb, ca) {
                        if a.epoch == b.epoch {
                            counts.ordered += 1;
                        } else {
                            counts.across_barriers += 1;
                        }
                        continue;
                    }
                    counts.concurrent += 1;
                    assert_eq!(a.epoch, b.epoch, "barriers order every epoch: {a:?} {b:?}");
                    let (x, y) = if a.node < b.node { (a, b) } else { (b, a) };
                    let (first, second) = (side(x), side(y));
                    let info = &allocs[a.alloc];
                    let end = |l: &Logged| End {
                        node: l.node,
                        interval: l.interval,
                        clock: l.clock,
                    };
                    let key = (
                        a.epoch,
                        AllocInfo::name(a.alloc),
                        a.elem,
                        first,
                        second,
                        if first.write && second.write {
                            RaceKind::WriteWrite
                        } else {
                            RaceKind::ReadWrite
                        },
                        (0, info.elem),
                        info.base() + a.elem * info.elem,
                    );
                    out.insert(key, [end(x), end(y)]);
                }
            }
        }
        (out, counts)
    }
}

struct Sim {
    nodes: Vec<Node>,
    links: Vec<VecDeque<Msg>>, // index from * n + to
    n: usize,
    race: bool,
    allocs: Vec<AllocInfo>,
    vars_table: VarTable,
    /// Model of every variable under sequential consistency.
    model: Vec<u64>,
    var_addr: Vec<usize>,
    rng: u64,
    steps: u64,
    /// Every message delivered, for tests that inspect the traffic.
    delivered: Vec<(usize, usize, Msg)>,
    oracle: Oracle,
    analysis: Option<Analysis>,
    /// Races the barrier master reported, and how many per epoch.
    races: Vec<Race>,
    races_per_epoch: BTreeMap<u32, u64>,
    /// What `--race-first` keeps of each epoch's races (`dsm_race::first_races`).
    first_races: BTreeMap<u32, Vec<Race>>,
    /// Value stored by the next `Touch` write.
    counter: u8,
    /// Race mode, every other seed: nodes ship race batches at random lock operations and
    /// the master analyses them between barriers, as `api/race.rs` does.
    incremental: Option<dsm_race::Incremental>,
    /// Races the incremental analysis reported (between barriers).
    incremental_races: usize,
    /// Replay tests: divergences reported (a divergence is otherwise a failure).
    diverged: Vec<String>,
    expect_divergence: bool,
    /// Write faults the simulated handler served without the engine.
    handler_faults: u64,
    /// The nodes map one common memory (`Engine::set_common_memory`): every store lands in
    /// every node's memory at once, as it does in the one segment file they all map.
    common: bool,
    /// Each node's host (`Engine::set_host_mates`): a page homed on a node's host is one
    /// copy there, the home's memory, which every node of the host reads and writes.
    hosts: Vec<usize>,
    /// Each page's home.
    page_home: Vec<usize>,
    /// Per link (`from * n + to`), the page the sender left in the link's page lane
    /// (`Output::LaneReply`), until a `LanePageReply` delivery or the receiver's
    /// simulated fault handler takes it.
    lanes: Vec<Option<PageCopy>>,
    /// Pages the simulated handler took from a lane and installed itself.
    lane_takes: u64,
    /// Lane pages the simulated comm thread took when their frame arrived.
    lane_comm_takes: u64,
    /// Lane replies sent as plain replies (the lane could not take them).
    lane_refused: u64,
    /// Per link (`from * n + to`), the request the sender's handler posted in the link's
    /// lane (`sys::ask_lane_home`): the page and how many messages of the link must have
    /// been delivered before it (everything sent before it).
    requests: Vec<Option<(PageNo, u64)>>,
    /// Messages delivered so far per link.
    popped: Vec<u64>,
    /// Per node, the page its handler asked for and polls the lane for (`SLOT_ASKED`).
    asked: Vec<Option<PageNo>>,
    /// Read faults whose home the simulated handler asked itself.
    handler_asks: u64,
    /// Of those, waits the handler handed to the comm thread (its budget spent).
    ask_handovers: u64,
    /// Of those, faults the engine resolved while the handler still polled (the copy
    /// reached the comm thread first).
    asks_resolved_by_comm: u64,
    /// Of those, requests the handler wrote to the home's socket (a home with no lane).
    socket_asks: u64,
    /// Socket requests the simulated link refused (the fault then went the slow way).
    socket_refusals: u64,
    /// Replies to a socket request that the simulated handler took out of the link
    /// itself and installed.
    socket_takes: u64,
    /// The engines fetch through page lanes (`Engine::set_lane_peers`).
    lanes_on: bool,
    /// With `common`: locks are taken in the common memory, as `sys::HostLock` does, not
    /// through the protocol (`Command::HostAcquire` / `HostRelease`).
    host_locks: bool,
    /// Host locks: who holds each, and the release clock its last releaser left in it.
    host_held: BTreeMap<u64, usize>,
    host_clocks: BTreeMap<u64, VectorTime>,
    /// Host locks: an acquire whose release clock the node's `known` covers leaves the
    /// interval open instead of asking the engine (`api.rs` does, outside `--pinpoint`,
    /// schedule mode and `--check`).
    elide_acquires: bool,
    elided_acquires: u64,
    /// Host-lock releases that took back the interval their node's previous release of
    /// the same lock closed, or whose frozen interval the next acquire thawed (`api.rs`
    /// does where it elides acquires).
    continued_releases: u64,
    /// Host-lock releases that froze the interval, and frozen intervals closed by a later
    /// synchronization (not thawed).
    frozen_releases: u64,
    settled_frozen: u64,
    /// Protocol locks: acquires first try `Engine::acquire_here_quietly`, which takes
    /// a lock that can bring nothing new without closing the interval (`api.rs` does,
    /// outside `--pinpoint`, chaos, schedule mode and `--check`); and how many it took.
    quiet_acquires: bool,
    quiet_taken: u64,
}

impl Sim {
    fn script_len(&self, k: usize) -> usize {
        self.nodes[k].script.len()
    }

    /// Puts a hint of the locks node `k` takes (`taken`, in order) at position `at` of its
    /// script: for a third of the phases none, for a third the exact order, for the rest
    /// a wrong one (reversed, with a lock it never takes).
    fn hint_locks(&mut self, k: usize, at: usize, mut taken: Vec<u64>, locks: usize) {
        match self.rand(3) {
            0 => return,
            1 => {}
            _ => {
                taken.reverse();
                taken.push(self.rand(locks + 1) as u64);
            }
        }
        self.nodes[k].script.insert(at, Op::PrefetchLocks(taken));
    }

    fn rand(&mut self, m: usize) -> usize {
        self.rng = self
            .rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.rng >> 33) as usize) % m.max(1)
    }

    fn outputs(&mut self, k: usize, outs: Vec<Output>) {
        // What node k's engine wrote to its host's pages (diffs applied at the home) is in
        // every node of the host's memory, as in the host's one file.
        for p in 0..self.page_home.len() {
            if self.page_home[p] == k {
                self.spread_host_page(p);
            }
        }
        for o in outs {
            match o {
                Output::Send { to, msg } => {
                    assert_ne!(to as usize, k, "engines never send to themselves");
                    self.links[k * self.n + to as usize].push_back(msg)
                }
                Output::LaneReply { to, copy } => {
                    // As the runtime does: into the lane with a frame announcing it, or,
                    // when the lane cannot take it (here a random quarter of the time),
                    // in a plain reply.
                    let li = k * self.n + to as usize;
                    let msg = if self.lanes[li].is_none() && self.rand(4) != 0 {
                        let page = copy.page;
                        self.lanes[li] = Some(copy);
                        Msg::LanePageReply { page }
                    } else {
                        self.lane_refused += 1;
                        Msg::PageReply { pages: vec![copy] }
                    };
                    self.links[li].push_back(msg)
                }
                Output::FaultResolved => {
                    assert_eq!(self.nodes[k].wait, Wait::Fault, "node {k}");
                    self.nodes[k].wait = Wait::Running;
                    if self.asked[k].take().is_some() {
                        self.asks_resolved_by_comm += 1;
                    }
                }
                Output::FaultCrash => panic!("node {k}: fault reported as a crash"),
                Output::Reply(r) => {
                    assert_eq!(self.nodes[k].wait, Wait::Reply, "node {k}: reply {r:?}");
                    match r {
                        Reply::Done => self.completed(k),
                        Reply::HostReleased(known) => {
                            let Some(Op::Release(l)) = self.nodes[k].pending else {
                                panic!("node {k}: host release reply without a release");
                            };
                            assert_eq!(self.host_held.remove(&l), Some(k), "lock {l}");
                            self.nodes[k].known.set(&known);
                            self.host_clocks.insert(l, known);
                            self.completed(k);
                        }
                        Reply::Sem(done) => self.sem_completed(k, done),
                        Reply::BarrierDone {
                            epoch,
                            races,
                            known,
                        } => {
                            self.nodes[k].known.set(&known);
                            self.departed(k, epoch, races)
                        }
                        Reply::AnalyzeEpoch { .. }
                        | Reply::BitmapsWanted { .. }
                        | Reply::BitmapsArrived { .. } => {
                            assert!(self.race, "node {k}: race round without race mode");
                            self.nodes[k].inbox.push_back(r);
                        }
                        r => panic!("node {k}: unexpected reply {r:?}"),
                    }
                }
                Output::PageStates {
                    first,
                    count,
                    state,
                } => {
                    for p in first..first + count {
                        self.nodes[k].mirror[p as usize] = state;
                    }
                }
                Output::PagesShared { first, count } => {
                    for p in first..first + count {
                        self.nodes[k].shared[p as usize] = true;
                    }
                }
                Output::Diverged(m) => {
                    assert!(self.expect_divergence, "node {k}: {m}");
                    self.diverged.push(m);
                }
                Output::Fatal(m) | Output::PeerLost(m) => panic!("node {k}: fatal: {m}"),
                Output::RaceBatch(b) => {
                    assert_eq!(k, 0, "race batches go to the master");
                    let epoch = self.nodes[0].epoch;
                    let inc = self
                        .incremental
                        .as_mut()
                        .expect("race batches only in incremental runs");
                    let races = inc.absorb(
                        epoch,
                        &self.vars_table,
                        b.from,
                        b.known,
                        b.intervals,
                        b.bitmaps,
                    );
                    if b.last {
                        inc.entered_barrier(b.from);
                    }
                    self.incremental_races += races.len();
                    self.races.extend(races);
                }
            }
        }
        let node = &self.nodes[k];
        for (p, &state) in node.mirror.iter().enumerate() {
            assert_eq!(
                state,
                node.eng.page_state(p as PageNo),
                "node {k}: state outputs disagree with the engine on page {p}"
            );
        }
    }

    /// An acquire or release completed.
    fn completed(&mut self, k: usize) {
        if self.incremental.is_some() && self.rand(3) == 0 {
            let bitmaps = self.nodes[k].rec.as_mut().expect("race mode").drain_all();
            self.nodes[k].shipped_in_epoch = true;
            let outs = self.nodes[k].eng.on_command(Command::ShipRaceBatch {
                bitmaps,
                last: None,
            });
            self.outputs(k, outs);
        }
        let node = &mut self.nodes[k];
        node.wait = Wait::Running;
        match node.pending.take() {
            Some(Op::Acquire(l)) => {
                if let Some(h) = self.oracle.holder.insert(l, k) {
                    panic!("node {k} granted lock {l} while node {h} holds it");
                }
                let mut c = self.oracle.clocks[node.clock].clone();
                if let Some(lc) = self.oracle.lock_clock.get(&l) {
                    for (x, y) in c.iter_mut().zip(lc) {
                        *x = (*x).max(*y);
                    }
                }
                node.clock = self.oracle.clock(c);
            }
            // A release, or the prefetch of a bulk access.
            Some(Op::Release(_) | Op::Touch { .. }) => {}
            other => panic!("node {k}: Done for {other:?}"),
        }
    }

    /// A semaphore operation completed. A wait joins the clock of exactly the signal the
    /// run paired it with (the engine says which); an initial token joins nothing.
    fn sem_completed(&mut self, k: usize, done: dsm_core::engine::SemDone) {
        let node = &mut self.nodes[k];
        node.wait = Wait::Running;
        assert!(done.acquired, "node {k}: a wait was refused");
        match node.pending.take() {
            Some(Op::SemSignal(x)) => {
                let seq = self.oracle.signals_made[&(x, k)] - 1;
                assert_eq!(
                    done.signal,
                    Some((k as NodeId, seq)),
                    "node {k}: signal number"
                );
            }
            Some(Op::SemWait(x)) => {
                if let Some((from, seq)) = done.signal {
                    let key = (x, from as usize, seq);
                    assert!(
                        self.oracle.consumed.insert(key),
                        "node {k}: signal {key:?} consumed twice"
                    );
                    let sc = self.oracle.signal_clock.get(&key).unwrap_or_else(|| {
                        panic!("node {k}: paired with signal {key:?}, which was never made")
                    });
                    let mut c = self.oracle.clocks[node.clock].clone();
                    for (a, b) in c.iter_mut().zip(sc) {
                        *a = (*a).max(*b);
                    }
                    node.clock = self.oracle.clock(c);
                }
            }
            other => panic!("node {k}: semaphore reply for {other:?}"),
        }
    }

    /// Creates semaphores `(id, initial)` on every engine (what `Dsm::semaphore` does
    /// before its synchronization).
    fn semaphores(&mut self, sems: &[(u64, u32)]) {
        for node in &mut self.nodes {
            for &(sem, initial) in sems {
                let outs = node.eng.on_command(Command::SemCreate { sem, initial });
                assert!(
                    matches!(&outs[..], [Output::Reply(Reply::Done)]),
                    "{outs:?}"
                );
            }
        }
    }

    /// A barrier (or allocation) completed.
    fn departed(&mut self, k: usize, epoch: u32, races: u64) {
        let n = self.n;
        let node = &mut self.nodes[k];
        node.wait = Wait::Running;
        assert!(
            matches!(
                node.pending.take(),
                Some(Op::Barrier | Op::Finish | Op::Alloc(_))
            ),
            "node {k}: barrier reply without a barrier"
        );
        assert_eq!(epoch, node.epoch, "node {k}: barrier numbering");
        assert!(node.inbox.is_empty(), "node {k}: left a barrier with work");
        if let Some(r) = node.rec.as_mut() {
            r.discard_epoch();
        }
        let arrived = &self.oracle.arrived[&epoch];
        let mut c = vec![0; n];
        for a in arrived {
            let a = a.as_ref().expect("released before every node arrived");
            for (x, y) in c.iter_mut().zip(a) {
                *x = (*x).max(*y);
            }
        }
        c[k] += 1;
        node.clock = self.oracle.clock(c);
        node.epoch += 1;
        let reported = self.races_per_epoch.get(&epoch).copied().unwrap_or(0);
        assert_eq!(races, reported, "node {k}: race count of barrier {epoch}");
    }

    /// The SIGSEGV handler of link `li`'s receiver taking its faulting page from the
    /// lane, as `sys::take_page_from_lane` does: only once every frame sent before the
    /// page was delivered (its `LanePageReply` is next on the link), and only for the
    /// receiver's fault. It installs the page readable, records it for the engine, which
    /// takes it in at its next event without resolving anything, and lets the faulting
    /// access go at once. Returns whether it did.
    fn handler_takes_lane(&mut self, li: usize) -> bool {
        let (from, to) = (li / self.n, li % self.n);
        // The handler needs every frame before the page's announcement delivered, except
        // announcements of pages it took before (the lane's `needs`).
        let in_lane = self.lanes[li].as_ref().map(|c| c.page);
        let taken_before =
            |m: &&Msg| matches!(m, Msg::LanePageReply { page } if Some(*page) != in_lane);
        let Some(Msg::LanePageReply { page }) = self.links[li].iter().find(|m| !taken_before(m))
        else {
            return false;
        };
        let page = *page;
        let waiting = self.nodes[to].wait == Wait::Fault
            && self.lanes[li].as_ref().is_some_and(|c| c.page == page);
        let Some(fast) = self.nodes[to]
            .eng
            .fast_faults()
            .cloned()
            .filter(|_| waiting)
        else {
            return false;
        };
        let copy = self.lanes[li].take().expect("checked above");
        self.handler_installs(from, to, copy, &fast);
        self.lane_takes += 1;
        true
    }

    /// Node `to`'s handler installing `copy` of the page it waits for, homed at `from`,
    /// which it took itself: recorded for the engine, readable, and the faulting access
    /// let go.
    fn handler_installs(&mut self, from: usize, to: usize, copy: PageCopy, fast: &FastFaults) {
        let applied: Vec<u64> = copy.applied.iter().map(pack_applied).collect();
        assert!(
            fast.record_fetched(from as u32, copy.page, &applied),
            "node {to}: an earlier fetched page was never taken in"
        );
        let page = copy.page as usize;
        assert_ne!(
            self.hosts[to], self.hosts[from],
            "node {to}: the handler took page {page} of its own host's copy"
        );
        let mem = self.nodes[to].eng.memory_mut();
        assert_eq!(
            mem.prot[page],
            Prot::None,
            "node {to}: page {page} taken by the handler"
        );
        mem.data[page * PAGE_SIZE..][..PAGE_SIZE].copy_from_slice(&copy.data);
        mem.prot[page] = Prot::Read;
        self.nodes[to].wait = Wait::Running;
        self.asked[to] = None;
        if fast.fetched_backlog_high() {
            // As the runtime's handler: the comm thread is woken to have the engine take
            // the records in.
            let outs = self.nodes[to].eng.on_handler_work();
            self.outputs(to, outs);
        }
    }

    /// The SIGSEGV handler of link `li`'s receiver taking the reply to the request it
    /// wrote to the home's socket out of the link itself, as `sys::take_page_from_socket`
    /// does: only when that reply is the next message on the link (every message sent
    /// before it delivered: the comm thread's reader holds nothing), it is a reply of one
    /// page, and the receiver's handler still polls for that page. It installs the page
    /// readable and records it for the engine, which takes it in at its next event; the
    /// reply never reaches the engine. Returns whether it did.
    fn handler_takes_socket_reply(&mut self, li: usize) -> bool {
        let (from, to) = (li / self.n, li % self.n);
        let Some(Msg::PageReply { pages }) = self.links[li].front() else {
            return false;
        };
        let [copy] = pages.as_slice() else {
            return false;
        };
        if self.lanes_on || self.nodes[to].wait != Wait::Fault || self.asked[to] != Some(copy.page)
        {
            return false;
        }
        let Some(fast) = self.nodes[to].eng.fast_faults().cloned() else {
            return false;
        };
        let Some(Msg::PageReply { mut pages }) = self.links[li].pop_front() else {
            unreachable!("looked at above");
        };
        self.popped[li] += 1;
        let copy = pages.pop().expect("one page");
        self.handler_installs(from, to, copy, &fast);
        self.socket_takes += 1;
        true
    }

    /// The handler of node `k`, at a read fault on `page` (inaccessible), asking the
    /// page's co-located home itself if the engine armed the page for that, as
    /// `sys::ask_lane_home` does: the request goes into the lane of the link to the home,
    /// behind every message already sent on it, and the node waits for the page without
    /// the engine hearing of the fault. Returns whether it asked.
    fn handler_asks_home(&mut self, k: usize, page: usize) -> bool {
        let Some(fast) = self.nodes[k].eng.fast_faults().cloned() else {
            return false;
        };
        let Some(home) = fast.claim_fetch(page) else {
            return false;
        };
        if !self.lanes_on && self.rand(4) == 0 {
            // As `DirectSender::try_send` refusing (the link busy or backed up): the page
            // is unclaimed and the fault goes to the engine as any other.
            fast.unclaim_fetch(page);
            self.socket_refusals += 1;
            return false;
        }
        let li = k * self.n + home as usize;
        assert!(
            self.requests[li].is_none() && self.asked[k].is_none(),
            "node {k}: a second request while one is pending"
        );
        self.asked[k] = Some(page as PageNo);
        self.nodes[k].wait = Wait::Fault;
        self.handler_asks += 1;
        if !self.lanes_on {
            // As `sys::ask_socket_home`: a plain request frame on the link, behind every
            // message sent on it before; the handler takes the reply out of the link
            // itself, or the comm thread takes it in.
            self.socket_asks += 1;
            self.links[li].push_back(Msg::PageRequest {
                pages: vec![page as PageNo],
                required: Vec::new(),
                lane: false,
            });
            return true;
        }
        self.requests[li] = Some((
            page as PageNo,
            self.popped[li] + self.links[li].len() as u64,
        ));
        true
    }

    /// The home's transport delivering the request in link `li`'s lane once every
    /// message sent before it has been delivered. Returns whether it did.
    fn deliver_request(&mut self, li: usize) -> bool {
        let Some((page, after)) = self.requests[li] else {
            return false;
        };
        if self.popped[li] < after {
            return false;
        }
        self.requests[li] = None;
        let (from, to) = (li / self.n, li % self.n);
        let msg = Msg::PageRequest {
            pages: vec![page],
            required: Vec::new(),
            lane: true,
        };
        self.delivered.push((from, to, msg.clone()));
        let outs = self.nodes[to].eng.on_peer_message(from as NodeId, msg);
        self.outputs(to, outs);
        true
    }

    /// Node `k`'s handler, its polling budget spent, handing the wait for the page it
    /// asked for to the comm thread: the fault reaches the engine, which adopts the fetch.
    fn hand_over_ask(&mut self, k: usize) {
        let Some(page) = self.asked[k].take() else {
            return;
        };
        self.ask_handovers += 1;
        let outs = self.nodes[k].eng.on_fault(Some(page), Some(false));
        self.outputs(k, outs);
    }

    /// Whether node k may access `page` now; if not, the node faults and waits, or, for a
    /// write to a write-protected page, usually plays the SIGSEGV handler's fast path
    /// (`engine::fast`): between two engine steps, as the real handler runs between the
    /// comm thread's events, it claims an armed page, makes it writable and twins it
    /// without the engine, which takes the write in at its next event. A page the engine
    /// did not arm (or the quarter of the time the sim does not try) takes the slow path.
    fn access_page(&mut self, k: usize, page: usize, write: bool) -> bool {
        if write && self.nodes[k].eng.memory().prot[page] == Prot::Read && self.rand(4) != 0 {
            if let Some(fast) = self.nodes[k].eng.fast_faults().cloned() {
                let VecMemory { data, prot, .. } = self.nodes[k].eng.memory_mut();
                let served = fast.handler_write_fault(
                    page,
                    || {
                        prot[page] = Prot::ReadWrite;
                        true
                    },
                    |slot| {
                        let bytes = &data[page * PAGE_SIZE..(page + 1) * PAGE_SIZE];
                        for (w, b) in slot.iter().zip(bytes.chunks_exact(8)) {
                            w.store(
                                u64::from_ne_bytes(b.try_into().unwrap()),
                                std::sync::atomic::Ordering::Relaxed,
                            );
                        }
                    },
                );
                if served.is_ok() {
                    self.handler_faults += 1;
                    return true;
                }
            }
        }
        let prot = self.nodes[k].eng.memory().prot[page];
        let ok = match prot {
            Prot::None => false,
            Prot::Read => !write,
            Prot::ReadWrite => true,
        };
        if ok {
            return true;
        }
        if prot == Prot::None && !write && self.rand(4) != 0 && self.handler_asks_home(k, page) {
            return false;
        }
        self.nodes[k].wait = Wait::Fault;
        let outs = self.nodes[k]
            .eng
            .on_fault(Some(page as PageNo), Some(write));
        self.outputs(k, outs);
        false
    }

    /// Simulated app access: faults until the page allows it, then reads/writes.
    /// Returns false if the node now waits for a fault.
    fn access(&mut self, k: usize, addr: usize, write: bool) -> bool {
        self.access_page(k, addr / PAGE_SIZE, write)
    }

    /// The node whose memory holds node k's bytes of `page`: the page's home when it is
    /// homed on k's host (the host's one copy), else k itself.
    fn holder(&self, k: usize, page: usize) -> usize {
        let home = self.page_home[page];
        if self.hosts[home] == self.hosts[k] {
            home
        } else {
            k
        }
    }

    /// Copies `page` from its home's memory into the memories of the home's host mates:
    /// the simulation keeps a host page's bytes at its home (`holder`), and this makes
    /// what a mate's engine would read of it the same, as in the host's one file.
    fn spread_host_page(&mut self, page: usize) {
        let home = self.page_home[page];
        let range = page * PAGE_SIZE..(page + 1) * PAGE_SIZE;
        for j in 0..self.n {
            if j != home && self.hosts[j] == self.hosts[home] {
                let (src, dst) = if home < j {
                    let (a, b) = self.nodes.split_at_mut(j);
                    (&a[home], &mut b[0])
                } else {
                    let (a, b) = self.nodes.split_at_mut(home);
                    (&b[0], &mut a[j])
                };
                dst.eng.memory_mut().data[range.clone()]
                    .copy_from_slice(&src.eng.memory().data[range.clone()]);
            }
        }
    }

    /// After node k wrote `page`: a page of its host's copy is spread to the host's nodes.
    fn spread_if_host_page(&mut self, k: usize, page: usize) {
        if !self.common && self.holder(k, page) == self.page_home[page] {
            self.spread_host_page(page);
        }
    }

    fn load(&self, k: usize, addr: usize) -> u64 {
        let d = &self.nodes[self.holder(k, addr / PAGE_SIZE)]
            .eng
            .memory()
            .data;
        u64::from_le_bytes(d[addr..addr + 8].try_into().unwrap())
    }

    fn store(&mut self, k: usize, addr: usize, v: u64) {
        let nodes: Vec<usize> = if self.common {
            (0..self.n).collect()
        } else {
            vec![self.holder(k, addr / PAGE_SIZE)]
        };
        for j in nodes {
            self.nodes[j].eng.memory_mut().data[addr..addr + 8].copy_from_slice(&v.to_le_bytes());
        }
        self.spread_if_host_page(k, addr / PAGE_SIZE);
    }

    /// Logs an access for the oracle.
    fn log(&mut self, k: usize, alloc: usize, elem: usize, write: bool) {
        let node = &self.nodes[k];
        self.oracle.accesses.insert(Logged {
            alloc,
            elem,
            node: k,
            clock: node.clock,
            epoch: node.epoch,
            interval: node.interval,
            began: node.began,
            write,
        });
    }

    /// A typed-API access to one u64 variable of allocation 0 (for `Check`/`Incr`).
    fn record_var(&mut self, k: usize, addr: usize, write: bool) {
        if let Some(r) = &self.nodes[k].rec {
            let shadow = r.alloc(0);
            if write {
                shadow.write(addr, 8);
            } else {
                shadow.read(addr, 8);
            }
        }
        self.log(k, 0, addr / 8, write);
    }

    /// Before a barrier, as `Dsm::barrier` does in incremental runs: the open interval
    /// closes into a last race batch (the same clock, the next interval number), so the
    /// master may drop the others' intervals without waiting for this node.
    fn ship_last_batch(&mut self, k: usize) {
        let node = &mut self.nodes[k];
        node.shipped_in_epoch = false;
        let rec = node.rec.as_mut().expect("race mode");
        let notices = rec.close_interval();
        let bitmaps = rec.drain_all();
        node.interval += 1;
        let outs = node.eng.on_command(Command::ShipRaceBatch {
            bitmaps,
            last: Some(notices),
        });
        self.outputs(k, outs);
    }

    /// The app side of a synchronization operation: closes the recorder's interval (its
    /// notices go with the command) and tells the oracle what happened.
    fn begin_sync(&mut self, k: usize, op: Op) -> Option<RaceNotices> {
        self.begin_sync_oracle(k, op);
        self.nodes[k].rec.as_mut().map(Recorder::close_interval)
    }

    /// [`Sim::begin_sync`] but for the recorder, whose interval stays open.
    /// Node `k` took its next script op, an acquire, without asking the engine to close
    /// the interval: the oracle orders it after the lock's last release, and the node runs
    /// on in the same interval.
    fn acquired_with_interval_open(&mut self, k: usize, op: Op) {
        let node = &mut self.nodes[k];
        node.script.pop_front();
        node.pending = Some(op);
        node.wait = Wait::Reply;
        self.completed(k);
    }

    fn begin_sync_oracle(&mut self, k: usize, op: Op) {
        let node = &mut self.nodes[k];
        node.script.pop_front();
        node.wait = Wait::Reply;
        node.interval += 1;
        match op {
            Op::Acquire(l) => node.began = SyncCause::Acquire(l),
            Op::SemWait(x) => node.began = SyncCause::SemWait(x),
            Op::SemSignal(x) => {
                let seq = self.oracle.signals_made.entry((x, k)).or_insert(0);
                let c = self.oracle.clocks[node.clock].clone();
                self.oracle.signal_clock.insert((x, k, *seq), c.clone());
                *seq += 1;
                let mut c = c;
                c[k] += 1;
                node.clock = self.oracle.clock(c);
                node.began = SyncCause::SemSignal(x);
            }
            Op::Release(l) => {
                assert_eq!(
                    self.oracle.holder.remove(&l),
                    Some(k),
                    "node {k} releases lock {l} it does not hold"
                );
                let c = self.oracle.clocks[node.clock].clone();
                self.oracle.lock_clock.insert(l, c.clone());
                let mut c = c;
                c[k] += 1;
                node.clock = self.oracle.clock(c);
                node.began = SyncCause::Release(l);
            }
            Op::Barrier | Op::Finish | Op::Alloc(_) => {
                let n = self.n;
                let slots = self
                    .oracle
                    .arrived
                    .entry(node.epoch)
                    .or_insert_with(|| vec![None; n]);
                assert!(slots[k].is_none(), "node {k} arrived twice");
                slots[k] = Some(self.oracle.clocks[node.clock].clone());
                node.began = SyncCause::Barrier(node.epoch);
            }
            _ => unreachable!("not a synchronization operation"),
        }
        node.pending = Some(op);
    }

    /// A release of host lock `l` by node `k`, as `api.rs` decides it: whether it takes
    /// back the interval the node's previous release of `l` closed (nobody took `l` since,
    /// the node synchronized with nothing else since, and the recorder still holds that
    /// interval). If so, the oracle's accesses of the open interval move into the one
    /// taken back, as the recorder's do.
    fn take_back(&mut self, k: usize, l: u64) -> bool {
        let node = &mut self.nodes[k];
        let Some((lock, closed, began)) = node.last_release else {
            return false;
        };
        let left = self.host_clocks.get(&l);
        if lock != l
            || node.interval != closed + 1
            || !left.is_some_and(|c| node.known.is(c.0.iter().copied()))
        {
            return false;
        }
        let rec = node.rec.as_mut().expect("race mode");
        assert_eq!(rec.current_interval(), node.interval, "node {k}");
        if !rec.reopen_last() {
            return false;
        }
        self.merge_open_interval(k, closed, began);
        self.continued_releases += 1;
        true
    }

    /// Node `k`'s open interval goes on as interval `into` (begun by `began`), the one
    /// before it: the oracle's accesses of the open interval move there, as the
    /// recorder's do when it reopens or thaws an interval.
    fn merge_open_interval(&mut self, k: usize, into: u32, began: SyncCause) {
        let node = &mut self.nodes[k];
        assert_eq!(node.interval, into + 1, "node {k}");
        node.interval = into;
        node.began = began;
        let moved: Vec<Logged> = self
            .oracle
            .accesses
            .iter()
            .filter(|a| a.node == k && a.interval == into + 1)
            .copied()
            .collect();
        for a in moved {
            self.oracle.accesses.remove(&a);
            self.oracle.accesses.insert(Logged {
                interval: into,
                began,
                ..a
            });
        }
    }

    /// Before any synchronization of node `k` but the acquire that may thaw it: the
    /// interval a host-lock release froze closes in the recorder and the engine, as that
    /// release would have closed it (`api.rs`'s `settle_frozen_release`).
    fn settle_frozen(&mut self, k: usize) {
        let node = &mut self.nodes[k];
        let Some((lock, interval, began)) = node.frozen.take() else {
            return;
        };
        let rec = node.rec.as_mut().expect("race mode");
        assert_eq!(rec.current_interval(), interval, "node {k}");
        let notices = rec.close_frozen();
        self.settled_frozen += 1;
        let known = node.eng.host_release_now(lock, Some(notices));
        assert!(
            node.known.is(known.0.iter().copied()),
            "node {k}: the frozen release of lock {lock} left {:?}, the engine closed at {known:?}",
            node.known
        );
        node.last_release = Some((lock, interval, began));
        let outs = node.eng.take_outputs();
        self.outputs(k, outs);
    }

    /// A release of host lock `l` by node `k` that freezes the recorder's interval
    /// instead of closing it (as `api.rs` does where acquires may leave intervals open
    /// and the interval touched few pages): the lock gets the clock the engine will
    /// close the interval at, the engine is not asked, and the release completes.
    fn freeze_release(&mut self, k: usize, l: u64) -> bool {
        let node = &mut self.nodes[k];
        let Some(rec) = node.rec.as_mut() else {
            return false;
        };
        // A quarter of the releases close as the product closes an interval of many
        // pages, so that releases taking back a closed interval are checked too.
        if !self.elide_acquires || (self.rng >> 33).is_multiple_of(4) || !rec.freeze_interval() {
            return false;
        }
        self.frozen_releases += 1;
        let frozen = (l, node.interval, node.began);
        let known = node.eng.known_after_close();
        node.known.set(&known);
        node.frozen = Some(frozen);
        node.last_release = None;
        self.begin_sync_oracle(k, Op::Release(l));
        assert_eq!(self.host_held.remove(&l), Some(k), "lock {l}");
        self.host_clocks.insert(l, known);
        self.completed(k);
        true
    }

    /// An acquire of host lock `l`, now held by node `k`, after a release of `l` froze
    /// `k`'s interval: thaws it when the lock still holds the clock that release left.
    fn thaw_acquire(&mut self, k: usize, l: u64, released: &VectorTime) -> bool {
        let node = &mut self.nodes[k];
        let Some((lock, interval, began)) = node.frozen else {
            return false;
        };
        if lock != l
            || !node.known.is(released.0.iter().copied())
            || !node.rec.as_mut().expect("race mode").thaw_interval()
        {
            return false;
        }
        node.frozen = None;
        self.merge_open_interval(k, interval, began);
        self.elided_acquires += 1;
        self.continued_releases += 1;
        self.acquired_with_interval_open(k, Op::Acquire(l));
        true
    }

    /// Bitmaps a barrier arrival ships: none, those of shared pages (as `api.rs`), or all;
    /// the master must fetch whatever is missing either way.
    fn shipped(&mut self, k: usize) -> Vec<EncodedBitmap> {
        let how = self.rand(3);
        let node = &mut self.nodes[k];
        let Some(r) = node.rec.as_mut() else {
            return Vec::new();
        };
        let shared = &node.shared;
        let out = match how {
            0 => None,
            1 => r.shippable(|p| shared[p as usize], MAX_SHIPPED_BITMAP_BYTES),
            _ => r.shippable(|_| true, MAX_SHIPPED_BITMAP_BYTES),
        };
        out.unwrap_or_default()
    }

    /// One step of the app thread serving the race-detection rounds of a barrier, as
    /// `Dsm::sync` and `Dsm::analyze` do.
    fn race_round(&mut self, k: usize, r: Reply) {
        match r {
            Reply::BitmapsWanted { epoch, keys } => {
                let rec = self.nodes[k].rec.as_mut().expect("race mode");
                let bitmaps = rec.bitmaps(&keys);
                let outs = self.nodes[k]
                    .eng
                    .on_command(Command::SendBitmaps { epoch, bitmaps });
                self.outputs(k, outs);
            }
            Reply::AnalyzeEpoch {
                epoch,
                intervals,
                bitmaps: shipped,
            } => {
                assert_eq!(k, 0, "only the master analyzes");
                assert!(self.analysis.is_none(), "two analyses at once");
                // As `Dsm::analyze`: shipped intervals were analysed between barriers;
                // the pending ones stand in for their notices.
                let mut intervals = intervals;
                let mut bitmaps = Bitmaps::new();
                if let Some(inc) = self.incremental.as_mut().filter(|inc| inc.active()) {
                    intervals.retain(|i| !inc.shipped(i.node, i.index));
                    let (pending, pending_bitmaps) = inc.take_pending();
                    intervals.extend(pending);
                    bitmaps.append(pending_bitmaps);
                }
                let inc = self.incremental.as_ref().filter(|inc| inc.active());
                let plan = dsm_race::plan_fresh(epoch, intervals, false, |i| {
                    inc.is_none_or(|inc| !inc.shipped(i.node, i.index))
                });
                for (node, b) in shipped {
                    bitmaps.insert(node, b);
                }
                let mut pending = 0;
                let mut requests = Vec::new();
                for (&node, keys) in &plan.wanted {
                    let missing: Vec<_> = keys
                        .iter()
                        .filter(|key| !bitmaps.contains(node, key))
                        .copied()
                        .collect();
                    if missing.is_empty() {
                        continue;
                    }
                    if node == 0 {
                        let rec = self.nodes[0].rec.as_mut().expect("race mode");
                        for b in rec.bitmaps(&missing) {
                            bitmaps.insert(0, b);
                        }
                    } else {
                        requests.push(Command::RequestBitmaps {
                            node,
                            epoch,
                            keys: missing,
                        });
                        pending += 1;
                    }
                }
                self.analysis = Some(Analysis {
                    epoch,
                    plan,
                    bitmaps,
                    pending,
                });
                for c in requests {
                    let outs = self.nodes[0].eng.on_command(c);
                    self.outputs(0, outs);
                }
                self.finish_analysis_if_complete();
            }
            Reply::BitmapsArrived { from, bitmaps } => {
                assert_eq!(k, 0, "bitmaps go to the master");
                let a = self.analysis.as_mut().expect("bitmaps outside an analysis");
                for b in bitmaps {
                    a.bitmaps.insert(from, b);
                }
                a.pending -= 1;
                self.finish_analysis_if_complete();
            }
            r => unreachable!("{r:?}"),
        }
    }

    fn finish_analysis_if_complete(&mut self) {
        if self.analysis.as_ref().is_some_and(|a| a.pending > 0) {
            return;
        }
        let a = self.analysis.take().expect("an analysis");
        for (&node, keys) in &a.plan.wanted {
            for key in keys {
                assert!(
                    a.bitmaps.contains(node, key),
                    "bitmap {key:?} of {node} never came"
                );
            }
        }
        let races = a.plan.compare(&a.bitmaps, &self.vars_table);
        let count = races.len() as u64;
        assert!(
            self.races_per_epoch.insert(a.epoch, count).is_none(),
            "epoch {} analyzed twice",
            a.epoch
        );
        let first = dsm_race::first_races(races.clone(), a.plan.intervals());
        self.first_races.insert(a.epoch, first);
        self.races.extend(races);
        if let Some(inc) = self.incremental.as_mut() {
            inc.reset();
        }
        let outs = self.nodes[0]
            .eng
            .on_command(Command::ReleaseBarrier { races: count });
        self.outputs(0, outs);
    }

    /// Runs one step of node k: a race round it has to serve, or its script's next op.
    fn step_node(&mut self, k: usize) {
        if let Some(r) = self.nodes[k].inbox.pop_front() {
            self.race_round(k, r);
            return;
        }
        let Some(op) = self.nodes[k].script.front().cloned() else {
            return;
        };
        let thawable = matches!(op, Op::Acquire(l) if self.host_locks
            && self.nodes[k].frozen.is_some_and(|f| f.0 == l));
        let access = matches!(
            op,
            Op::Check(_) | Op::Incr(_) | Op::Touch { .. } | Op::PrefetchLocks(_)
        );
        if !thawable && !access {
            self.settle_frozen(k);
        }
        match op {
            Op::Alloc(i) => {
                let race = self.begin_sync(k, op);
                let a = self.allocs[i].clone();
                if let Some(r) = self.nodes[k].rec.as_mut() {
                    assert_eq!(
                        r.add_alloc(a.first_page as PageNo, a.len * a.elem, a.elem),
                        Ok(i)
                    );
                }
                let at = dsm_proto::SyncPoint::Allocation {
                    name: format!("alloc {i}"),
                    after: self.nodes[k].epoch,
                };
                let outs = self.nodes[k].eng.on_command(Command::Alloc {
                    homes: a.homes,
                    digest: 42 + i as u64,
                    race,
                    at,
                });
                self.outputs(k, outs);
            }
            Op::Acquire(l) if self.host_locks => {
                // The ticket lock: a node finding it held waits (steps again later).
                if self.host_held.contains_key(&l) {
                    return;
                }
                self.host_held.insert(l, k);
                let released = self
                    .host_clocks
                    .get(&l)
                    .cloned()
                    .unwrap_or_else(|| VectorTime::zero(self.n));
                if self.thaw_acquire(k, l, &released) {
                    return;
                }
                self.settle_frozen(k);
                if self.elide_acquires && self.nodes[k].known.covers(released.0.iter().copied()) {
                    // Nothing new: the interval goes on, the engine is not asked.
                    self.elided_acquires += 1;
                    self.acquired_with_interval_open(k, op);
                    return;
                }
                self.nodes[k].known.join(&released);
                let race = self.begin_sync(k, op);
                let outs = self.nodes[k].eng.on_command(Command::HostAcquire {
                    lock: l,
                    race,
                    released,
                });
                self.outputs(k, outs);
            }
            Op::Release(l) if self.host_locks => {
                if self.freeze_release(k, l) {
                    return;
                }
                let again = self.elide_acquires && self.take_back(k, l);
                let closing = (self.nodes[k].interval, self.nodes[k].began);
                let race = self.begin_sync(k, op);
                self.nodes[k].last_release = Some((l, closing.0, closing.1));
                let cmd = if again {
                    Command::HostReleaseAgain { lock: l, race }
                } else {
                    Command::HostRelease { lock: l, race }
                };
                let outs = self.nodes[k].eng.on_command(cmd);
                self.outputs(k, outs);
            }
            Op::Acquire(l) => {
                if self.quiet_acquires && self.nodes[k].eng.acquire_here_quietly(l) {
                    // Nothing new: the interval goes on, in the recorder too.
                    self.quiet_taken += 1;
                    let outs = self.nodes[k].eng.take_outputs();
                    self.outputs(k, outs);
                    self.acquired_with_interval_open(k, op);
                    return;
                }
                let race = self.begin_sync(k, op);
                let outs = self.nodes[k]
                    .eng
                    .on_command(Command::Acquire { lock: l, race });
                self.outputs(k, outs);
            }
            Op::Release(l) => {
                let race = self.begin_sync(k, op);
                let outs = self.nodes[k]
                    .eng
                    .on_command(Command::Release { lock: l, race });
                self.outputs(k, outs);
            }
            Op::SemSignal(sem) => {
                let race = self.begin_sync(k, op);
                let outs = self.nodes[k]
                    .eng
                    .on_command(Command::SemSignal { sem, race });
                self.outputs(k, outs);
            }
            Op::SemWait(sem) => {
                let race = self.begin_sync(k, op);
                let outs = self.nodes[k].eng.on_command(Command::SemWait {
                    sem,
                    try_only: false,
                    race,
                });
                self.outputs(k, outs);
            }
            Op::Barrier | Op::Finish => {
                let finishing = matches!(op, Op::Finish);
                if self.nodes[k].shipped_in_epoch {
                    self.ship_last_batch(k);
                }
                let race = self.begin_sync(k, op);
                let bitmaps = self.shipped(k);
                let at = if finishing {
                    dsm_proto::SyncPoint::Finish {
                        after: self.nodes[k].epoch,
                    }
                } else {
                    dsm_proto::SyncPoint::Barrier(self.nodes[k].epoch + 1)
                };
                let outs = self.nodes[k].eng.on_command(Command::Barrier {
                    finishing,
                    race,
                    bitmaps,
                    at,
                });
                self.outputs(k, outs);
            }
            Op::PrefetchLocks(locks) => {
                // As `Dsm::prefetch_locks`: locks in one common memory take no message.
                self.nodes[k].script.pop_front();
                if !self.host_locks {
                    let outs = self.nodes[k]
                        .eng
                        .on_command(Command::PrefetchLocks { locks });
                    self.outputs(k, outs);
                }
            }
            Op::Check(v) => {
                let addr = self.var_addr[v];
                if self.access(k, addr, false) {
                    let got = self.load(k, addr);
                    assert_eq!(
                        got, self.model[v],
                        "node {k} read var {v} = {got}, model says {}",
                        self.model[v]
                    );
                    self.record_var(k, addr, false);
                    self.nodes[k].script.pop_front();
                }
            }
            Op::Incr(v) => {
                let addr = self.var_addr[v];
                if self.access(k, addr, false) {
                    let got = self.load(k, addr);
                    assert_eq!(got, self.model[v], "node {k} read var {v} before increment");
                    if self.access(k, addr, true) {
                        self.store(k, addr, got + 1);
                        self.model[v] = got + 1;
                        self.record_var(k, addr, false);
                        self.record_var(k, addr, true);
                        self.nodes[k].script.pop_front();
                    }
                }
            }
            Op::Touch {
                alloc,
                start,
                step,
                count,
                write,
                rec,
            } => {
                let (base, size) = (self.allocs[alloc].base(), self.allocs[alloc].elem);
                let elems = (0..count).map(|j| start + j * step);
                if rec == Rec::Span {
                    // Bulk copies first fetch the missing pages of their span in one
                    // request per home (`View::prefetch_checked`).
                    let (p0, p1) = (
                        (base + start * size) / PAGE_SIZE,
                        (base + (start + count) * size - 1) / PAGE_SIZE,
                    );
                    if p1 > p0 && any_missing(&self.nodes[k].mirror, p0, p1, write) {
                        let node = &mut self.nodes[k];
                        node.wait = Wait::Reply;
                        node.pending = Some(op.clone());
                        let pages = PageRuns::from_runs([(p0 as PageNo, (p1 - p0 + 1) as u32)]);
                        let outs = node.eng.on_command(Command::Prefetch { pages, write });
                        self.outputs(k, outs);
                        return;
                    }
                }
                // The app thread faults page by page; the access happens once every page
                // of every element allows it (a home page may lose write access to a
                // serve in the meantime, so each retry checks them all again).
                for e in elems.clone() {
                    let (first, last) = (base + e * size, base + (e + 1) * size - 1);
                    for page in first / PAGE_SIZE..=last / PAGE_SIZE {
                        if !self.access_page(k, page, write) {
                            return;
                        }
                    }
                }
                if let Some(r) = &self.nodes[k].rec {
                    let shadow = r.alloc(alloc);
                    let mark = |offset: usize, len: usize| {
                        if write {
                            shadow.write(offset, len)
                        } else {
                            shadow.read(offset, len)
                        }
                    };
                    match rec {
                        Rec::Each => elems.clone().for_each(|e| mark(e * size, size)),
                        Rec::Span => {
                            assert!(step == 1 || count == 1);
                            mark(start * size, count * size)
                        }
                        Rec::Strided => {
                            shadow.strided(write, start * size, size, step * size, count)
                        }
                    }
                }
                self.counter = self.counter.wrapping_add(1).max(1);
                let value = self.counter;
                for e in elems {
                    let at = base + e * size..base + (e + 1) * size;
                    let holder = self.holder(k, at.start / PAGE_SIZE);
                    let nodes = if self.common && write {
                        0..self.n
                    } else {
                        holder..holder + 1
                    };
                    for j in nodes {
                        let data = &mut self.nodes[j].eng.memory_mut().data[at.clone()];
                        if write {
                            data.fill(value);
                        } else {
                            std::hint::black_box(&*data);
                        }
                    }
                    if write {
                        self.spread_if_host_page(k, at.start / PAGE_SIZE);
                    }
                    self.log(k, alloc, e, write);
                }
                self.nodes[k].script.pop_front();
            }
        }
    }

    fn run(&mut self) {
        self.run_until_quiet(true)
    }

    /// Runs until nothing can make progress; with `all_done`, every script must be
    /// finished and no node left waiting.
    fn run_until_quiet(&mut self, all_done: bool) {
        loop {
            self.steps += 1;
            assert!(
                self.steps < 5_000_000,
                "simulation does not terminate (deadlock?)"
            );
            let runnable: Vec<usize> = (0..self.n)
                .filter(|&k| {
                    let node = &self.nodes[k];
                    !node.inbox.is_empty() || node.wait == Wait::Running && !node.script.is_empty()
                })
                .collect();
            let links: Vec<usize> = (0..self.links.len())
                .filter(|&i| !self.links[i].is_empty())
                .collect();
            let requests: Vec<usize> = (0..self.requests.len())
                .filter(|&i| self.requests[i].is_some_and(|(_, after)| self.popped[i] >= after))
                .collect();
            let only_requests = runnable.is_empty() && links.is_empty();
            if !requests.is_empty() && (only_requests || self.rand(3) == 0) {
                let li = requests[self.rand(requests.len())];
                assert!(self.deliver_request(li));
                continue;
            }
            let asking: Vec<usize> = (0..self.n).filter(|&k| self.asked[k].is_some()).collect();
            if !asking.is_empty() && self.rand(16) == 0 {
                let k = asking[self.rand(asking.len())];
                self.hand_over_ask(k);
                continue;
            }
            if runnable.is_empty() && links.is_empty() {
                if !all_done {
                    return;
                }
                for (k, node) in self.nodes.iter().enumerate() {
                    assert!(
                        node.script.is_empty() && node.wait == Wait::Running,
                        "node {k} stuck waiting ({:?}) with {} ops left",
                        node.wait,
                        node.script.len()
                    );
                }
                return;
            }
            let pick = self.rand(runnable.len() + links.len());
            if pick < runnable.len() {
                self.step_node(runnable[pick]);
            } else {
                let li = links[pick - runnable.len()];
                if self.rand(2) == 0
                    && (self.handler_takes_lane(li) || self.handler_takes_socket_reply(li))
                {
                    continue;
                }
                let mut msg = self.links[li].pop_front().unwrap();
                self.popped[li] += 1;
                let (from, to) = (li / self.n, li % self.n);
                if let Msg::LanePageReply { page } = msg {
                    // The runtime's comm thread: the page is still in the lane (the
                    // handler did not take it), so it stands for a plain reply.
                    if let Some(copy) = self.lanes[li].take_if(|c| c.page == page) {
                        self.lane_comm_takes += 1;
                        msg = Msg::PageReply { pages: vec![copy] };
                    }
                }
                self.delivered.push((from, to, msg.clone()));
                let outs = self.nodes[to].eng.on_peer_message(from as NodeId, msg);
                self.outputs(to, outs);
            }
        }
    }

    /// The scripts as text, for failure messages (call before running them).
    fn program(&self) -> String {
        let mut s = String::new();
        for (k, node) in self.nodes.iter().enumerate() {
            let ops: Vec<String> = node.script.iter().map(Op::to_string).collect();
            s.push_str(&format!("  node {k}: {}\n", ops.join(", ")));
        }
        s
    }

    /// Race mode: the detector's races against the oracle's, at the detector's
    /// granularity (element, interval pair, which side wrote, what began each interval).
    fn check_races(&self, program: &str) -> OracleCounts {
        let (ends, counts) = self.oracle.races(&self.allocs);
        let expected: BTreeSet<RaceKey> = ends.keys().cloned().collect();
        let reported: BTreeSet<RaceKey> = self.races.iter().map(race_key).collect();
        assert_eq!(
            reported.len(),
            self.races.len(),
            "the detector reported a race twice: {:?}",
            self.races
        );
        if reported != expected {
            let missed: Vec<_> = expected.difference(&reported).collect();
            let extra: Vec<_> = reported.difference(&expected).collect();
            panic!(
                "detector and happens-before oracle disagree\nmissed by the detector: {missed:#?}\nreported but not races: {extra:#?}\nprogram:\n{program}"
            );
        }
        // First races (paper, section 6.4), epoch by epoch. A race affects another if an
        // end of it precedes an end of the other (program order on one node,
        // happens-before across nodes); a race is first if every race that reaches it
        // through "affects" is reached back from it, so nothing outside its cycle (if it
        // is in one) affects it.
        let clocks = &self.oracle.clocks;
        let precedes = |o: &End, m: &End| {
            if o.node == m.node {
                o.interval < m.interval
            } else {
                leq(&clocks[o.clock], &clocks[m.clock])
            }
        };
        // First races are a barrier-time notion (`--race-first` ships no batches).
        let first_races = if self.incremental.is_some() {
            BTreeMap::new()
        } else {
            self.first_races.clone()
        };
        for (&epoch, first) in &first_races {
            let of_epoch: Vec<(&RaceKey, &[End; 2])> =
                ends.iter().filter(|(k, _)| k.0 == epoch).collect();
            let m = of_epoch.len();
            let affects: Vec<Vec<bool>> = (0..m)
                .map(|x| {
                    (0..m)
                        .map(|y| {
                            of_epoch[x]
                                .1
                                .iter()
                                .any(|o| of_epoch[y].1.iter().any(|e| precedes(o, e)))
                        })
                        .collect()
                })
                .collect();
            // reach[x][y]: y is reachable from x (or is x).
            let reach: Vec<Vec<bool>> = (0..m)
                .map(|x| {
                    let mut seen = vec![false; m];
                    seen[x] = true;
                    let mut todo = vec![x];
                    while let Some(a) = todo.pop() {
                        for b in 0..m {
                            if affects[a][b] && !seen[b] {
                                seen[b] = true;
                                todo.push(b);
                            }
                        }
                    }
                    seen
                })
                .collect();
            let expected: BTreeSet<RaceKey> = (0..m)
                .filter(|&y| (0..m).all(|x| !reach[x][y] || reach[y][x]))
                .map(|y| of_epoch[y].0.clone())
                .collect();
            assert!(
                m == 0 || !expected.is_empty(),
                "an epoch with races has a first one"
            );
            let got: BTreeSet<RaceKey> = first.iter().map(race_key).collect();
            assert_eq!(
                got, expected,
                "first races of epoch {epoch} differ from the oracle's\nprogram:\n{program}"
            );
        }
        counts
    }
}

/// One allocation of a simulation: element size and the home of each page.
struct AllocSpec {
    elem: usize,
    homes: Vec<usize>,
}

/// Builds engines with one u64 allocation of `pages` pages whose homes are given.
fn sim(n: usize, homes: &[usize], vars: usize, seed: u64) -> Sim {
    sim_with(
        n,
        &[AllocSpec {
            elem: 8,
            homes: homes.to_vec(),
        }],
        vars,
        seed,
        false,
    )
}

/// Builds engines (with race detection if `race`) and makes the allocations, the first of
/// which holds the `vars` u64 variables of `Check`/`Incr`.
fn sim_with(n: usize, specs: &[AllocSpec], vars: usize, seed: u64, race: bool) -> Sim {
    sim_with_setup(n, specs, vars, seed, race, |_, _| {})
}

/// [`sim_with`], calling `setup` on each node's engine before the allocations (to start
/// recording or replaying the synchronization order).
fn sim_with_setup(
    n: usize,
    specs: &[AllocSpec],
    vars: usize,
    seed: u64,
    race: bool,
    setup: impl Fn(usize, &mut Engine<VecMemory>),
) -> Sim {
    let pages: usize = specs.iter().map(|s| s.homes.len()).sum();
    let mut oracle = Oracle::default();
    let mut nodes = Vec::new();
    for k in 0..n {
        let mem = VecMemory::new(pages);
        let mut eng = Engine::new(k as NodeId, n, pages, mem, race)
            .with_fast_faults(Arc::new(FastFaults::new(pages, 64)));
        // Data pushed with grants and arrivals: off, a cap so small that most pushes are
        // cut off, or the default (the fallback to invalidation is exercised by all three).
        eng.set_push_limit(push_limit_for(seed));
        // Written pages kept writable across interval closes (the default outside race
        // mode) in most runs, write-protected at every close in the others.
        eng.set_keep_writable(seed % 4 != 3);
        // Interval logs trimmed every 1 to 8 records in four runs of five (the default
        // period, 256, is longer than most programs here).
        if !seed.is_multiple_of(5) {
            eng.set_log_trim_period(1 + (seed / 5 % 8) as usize);
        }
        // Read faults fetch through the page lanes (the runtime's co-located peers) in
        // two runs of three.
        // In half the others, the handler asks remote homes itself over their sockets.
        let others: Vec<NodeId> = (0..n as NodeId).filter(|&p| p != k as NodeId).collect();
        if !seed.is_multiple_of(3) {
            eng.set_lane_peers(&others);
        } else if socket_asks_for(seed) {
            eng.set_socket_peers(&others);
        }
        setup(k, &mut eng);
        let mut clock = vec![0; n];
        clock[k] = 1;
        nodes.push(Node {
            eng,
            script: VecDeque::new(),
            wait: Wait::Running,
            pending: None,
            rec: race.then(Recorder::new),
            mirror: vec![PageState::Unallocated; pages],
            shared: vec![false; pages],
            inbox: VecDeque::new(),
            clock: oracle.clock(clock),
            interval: 1,
            epoch: 1,
            began: SyncCause::Start,
            known: KnownClock::default(),
            shipped_in_epoch: false,
            last_release: None,
            frozen: None,
        });
    }
    let mut allocs = Vec::new();
    let mut vars_table = VarTable::new();
    let mut first = 0;
    for (i, spec) in specs.iter().enumerate() {
        let bytes = spec.homes.len() * PAGE_SIZE;
        let a = AllocInfo {
            first_page: first,
            elem: spec.elem,
            len: bytes / spec.elem,
            homes: spec
                .homes
                .iter()
                .enumerate()
                .map(|(p, &h)| ((first + p) as PageNo, 1, h as NodeId))
                .collect(),
        };
        vars_table.push(VarInfo {
            name: AllocInfo::name(i),
            first_page: first as PageNo,
            pages: spec.homes.len() as u32,
            base_addr: a.base(),
            elem_size: a.elem,
            len: a.len,
            cols: None,
            granule_shift: dsm_race::granule_shift(a.elem),
        });
        first += spec.homes.len();
        allocs.push(a);
    }
    assert_eq!(allocs[0].elem, 8, "variables live in a u64 allocation");
    let mut s = Sim {
        nodes,
        links: (0..n * n).map(|_| VecDeque::new()).collect(),
        n,
        race,
        allocs,
        vars_table,
        model: vec![0; vars],
        var_addr: Vec::new(),
        rng: seed | 1,
        steps: 0,
        delivered: Vec::new(),
        oracle,
        analysis: None,
        races: Vec::new(),
        races_per_epoch: BTreeMap::new(),
        first_races: BTreeMap::new(),
        counter: 0,
        incremental: (race && seed.is_multiple_of(2)).then(|| dsm_race::Incremental::new(n, false)),
        incremental_races: 0,
        diverged: Vec::new(),
        expect_divergence: false,
        handler_faults: 0,
        common: false,
        hosts: (0..n).collect(),
        page_home: specs.iter().flat_map(|s| s.homes.iter().copied()).collect(),
        host_locks: false,
        host_held: BTreeMap::new(),
        host_clocks: BTreeMap::new(),
        elide_acquires: false,
        elided_acquires: 0,
        continued_releases: 0,
        frozen_releases: 0,
        settled_frozen: 0,
        // In two runs of three (the others close an interval at every acquire, as the
        // modes that number intervals alike in every run do).
        quiet_acquires: !seed.is_multiple_of(3),
        quiet_taken: 0,
        lanes: (0..n * n).map(|_| None).collect(),
        lane_takes: 0,
        lane_comm_takes: 0,
        lane_refused: 0,
        requests: (0..n * n).map(|_| None).collect(),
        popped: vec![0; n * n],
        asked: vec![None; n],
        handler_asks: 0,
        ask_handovers: 0,
        asks_resolved_by_comm: 0,
        socket_asks: 0,
        socket_refusals: 0,
        socket_takes: 0,
        lanes_on: !seed.is_multiple_of(3),
    };
    // Variables spread over the pages, several per page (false sharing across locks).
    let slots = specs[0].homes.len() * PAGE_SIZE / 8;
    s.var_addr = (0..vars).map(|v| ((v * 7919) % slots) * 8).collect();
    s.var_addr.sort_unstable();
    s.var_addr.dedup();
    assert_eq!(s.var_addr.len(), vars);
    // Collective allocations: every node registers, which is also a barrier.
    for i in 0..specs.len() {
        for node in &mut s.nodes {
            node.script.push_back(Op::Alloc(i));
        }
    }
    s.run();
    s
}

/// Places node k on host `hosts[k]`: its engine's host mates, and the applied-diff table
/// its host's nodes share (`tables[host]`), as the runtime's host file holds it.
fn place_on_host(eng: &mut Engine<VecMemory>, hosts: &[usize], tables: &[HostApplied], k: usize) {
    let mates: Vec<NodeId> = (0..hosts.len())
        .filter(|&j| j != k && hosts[j] == hosts[k])
        .map(|j| j as NodeId)
        .collect();
    eng.set_host_mates(&mates);
    eng.memory_mut().host_applied = Some(tables[hosts[k]].clone());
}

fn host_tables(n: usize) -> Vec<HostApplied> {
    (0..n).map(|_| HostApplied::default()).collect()
}

/// Hosts for `n` nodes from `seed`: about two nodes a host, the first host always
/// holding two or more.
fn random_hosts(n: usize, seed: u64) -> Vec<usize> {
    let spread = n.div_ceil(2);
    (0..n)
        .map(|k| {
            if k < 2 {
                0
            } else {
                (mix(seed ^ k as u64) as usize) % spread
            }
        })
        .collect()
}

/// Whether the handlers of a simulation with this seed ask the pages' homes themselves
/// over sockets (see `sim_with_setup`): lanes off (a multiple of 3), and every other such
/// seed.
fn socket_asks_for(seed: u64) -> bool {
    seed.is_multiple_of(6)
}

/// The push limit a simulation with this seed runs with (see `sim_with_setup`).
fn push_limit_for(seed: u64) -> u32 {
    [0, 1, dsm_proto::config::DEFAULT_PUSH_PAGES][((seed >> 5) % 3) as usize]
}

/// Proptest cases: `default`, or `PROPTEST_CASES` from the environment for longer soaks
/// (an explicit `cases` in a config would otherwise ignore it).
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn lock_of(v: usize, locks: usize) -> u64 {
    (v % locks) as u64
}

/// A random data-race-free program: phases of critical sections (each touching only
/// variables guarded by its lock), separated by barriers after which every node checks
/// every variable.
fn random_program(s: &mut Sim, vars: usize, locks: usize, phases: usize, sections: usize) {
    for _phase in 0..phases {
        for k in 0..s.n {
            let count = s.rand(sections + 1);
            let hint_at = s.script_len(k);
            let mut taken = Vec::new();
            for _ in 0..count {
                let l = s.rand(locks);
                taken.push(l as u64);
                let guarded: Vec<usize> = (0..vars)
                    .filter(|&v| lock_of(v, locks) == l as u64)
                    .collect();
                s.nodes[k].script.push_back(Op::Acquire(l as u64));
                let touches = 1 + s.rand(3);
                for _ in 0..touches {
                    let v = guarded[s.rand(guarded.len())];
                    if s.rand(3) == 0 {
                        s.nodes[k].script.push_back(Op::Check(v));
                    } else {
                        s.nodes[k].script.push_back(Op::Incr(v));
                    }
                }
                s.nodes[k].script.push_back(Op::Release(l as u64));
            }
            s.hint_locks(k, hint_at, taken, locks);
            s.nodes[k].script.push_back(Op::Barrier);
            // After the barrier every write before it is visible everywhere.
            for v in 0..vars {
                s.nodes[k].script.push_back(Op::Check(v));
            }
        }
        // Checks after the barrier are not guarded by locks; they must run before anyone
        // writes again, so end the phase with a second barrier.
        for k in 0..s.n {
            s.nodes[k].script.push_back(Op::Barrier);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(256), .. ProptestConfig::default() })]

    #[test]
    fn random_drf_programs_are_sequentially_consistent(
        n in 2usize..6,
        pages in 1usize..5,
        home_seed in any::<u64>(),
        seed in any::<u64>(),
        locks in 1usize..4,
        vars_per_lock in 1usize..4,
        race in any::<bool>(),
    ) {
        let homes: Vec<usize> = (0..pages).map(|p| ((home_seed >> (p * 3)) as usize) % n).collect();
        let vars = locks * vars_per_lock;
        let spec = AllocSpec { elem: 8, homes };
        let mut s = sim_with(n, &[spec], vars, seed, race);
        random_program(&mut s, vars, locks, 3, 4);
        let program = s.program();
        s.run();
        if race {
            // Data-race free: the oracle finds nothing and neither may the detector.
            let counts = s.check_races(&program);
            prop_assert_eq!(counts.concurrent, 0);
            prop_assert!(s.races.is_empty());
        }
    }
}

/// Runs a random lock-based program on `n` nodes over four pages spread across the homes,
/// with page lanes on (`seed` not a multiple of 3, see `sim_with`).
fn run_lane_program(seed: u64, n: usize) -> Sim {
    assert!(!seed.is_multiple_of(3), "lanes are off for seed {seed}");
    let homes: Vec<usize> = (0..4).map(|p| (seed as usize + p) % n).collect();
    let mut s = sim_with(n, &[AllocSpec { elem: 8, homes }], 6, seed, false);
    random_program(&mut s, 6, 2, 3, 4);
    s.run();
    s
}

/// Read faults through the page lanes: the home answers a lane request with the page in
/// the lane and a `LanePageReply` frame (or a plain reply when the lane cannot take it),
/// and the faulting node's handler takes the page itself once every earlier frame from
/// the home is in, or its comm thread takes it when the frame arrives. Random lock-based
/// programs stay sequentially consistent (checked by every run of the simulator), and all
/// three ways happen.
#[test]
fn faults_through_page_lanes_keep_programs_sequentially_consistent() {
    let (mut handler, mut comm, mut refused) = (0, 0, 0);
    for seed in 0..cases(300) as u64 {
        let seed = seed * 3 + 1;
        let s = run_lane_program(seed, 2 + (seed % 4) as usize);
        handler += s.lane_takes;
        let marks = delivered(&s, |m| matches!(m, Msg::LanePageReply { .. }));
        assert_eq!(
            marks, s.lane_takes,
            "seed {seed}: one frame per page the handler took"
        );
        let stats = total(&s, |st| st.lane_pages);
        assert_eq!(
            stats, s.lane_takes,
            "seed {seed}: the engines took in every lane page"
        );
        assert!(
            s.lanes.iter().all(Option::is_none),
            "seed {seed}: a page left in a lane"
        );
        let requests = delivered(&s, |m| matches!(m, Msg::PageRequest { lane: true, .. }));
        assert_eq!(
            s.lane_takes + s.lane_comm_takes + s.lane_refused,
            requests,
            "seed {seed}: every lane request answered once"
        );
        comm += s.lane_comm_takes;
        refused += s.lane_refused;
    }
    assert!(handler > 0, "the handler never took a page from a lane");
    assert!(comm > 0, "the comm thread never took a page from a lane");
    assert!(refused > 0, "no lane reply fell back to a plain reply");
}

/// After a run whose handlers asked homes themselves: the engines counted every request
/// once, and no handler still waits for an answer.
fn assert_asks_answered_once(seed: u64, s: &Sim) {
    let counted = total(s, |st| st.handler_fetches);
    assert_eq!(
        counted, s.handler_asks,
        "seed {seed}: every request the handler made reached its engine once"
    );
    assert!(
        s.asked.iter().all(Option::is_none),
        "seed {seed}: a request left unanswered"
    );
}

/// Read faults whose handler asks the co-located home itself, through the request slot
/// of the link's lane: the request reaches the home only behind every message sent before
/// it, the handler takes the page from the lane, or hands its wait to the comm thread when
/// its budget is spent, or the copy reaches the comm thread first and the engine adopts
/// the fetch and resolves the fault. Programs stay sequentially consistent, every request
/// is answered once, and the engines count each handler request exactly once.
#[test]
fn handlers_asking_homes_themselves_keep_programs_sequentially_consistent() {
    let (mut asks, mut handovers, mut by_comm, mut taken) = (0, 0, 0, 0);
    for seed in 0..cases(300) as u64 {
        let seed = seed * 3 + 2;
        let s = run_lane_program(seed, 2 + (seed % 3) as usize);
        assert_asks_answered_once(seed, &s);
        assert!(
            s.requests.iter().all(Option::is_none),
            "seed {seed}: a request left in a lane"
        );
        asks += s.handler_asks;
        handovers += s.ask_handovers;
        by_comm += s.asks_resolved_by_comm;
        taken += s.lane_takes;
    }
    assert!(asks > 0, "no handler asked a home itself");
    assert!(
        handovers > 0,
        "no handler handed its wait to the comm thread"
    );
    assert!(
        by_comm > 0,
        "no copy for a handler's request reached the comm thread"
    );
    assert!(taken > 0, "no handler took its page from the lane");
}

/// Read faults whose handler asks a home with no lane itself, writing the request to the
/// home's socket behind everything sent on it before: the handler takes the reply out of
/// the link itself when it comes next, or the reply reaches the comm thread, whose engine
/// adopts the fetch and resolves the fault, or the handler hands its wait over first and
/// the engine adopts the fetch on the fault. Programs stay sequentially consistent, every
/// request is answered, and each is counted once.
#[test]
fn handlers_asking_homes_over_sockets_keep_programs_sequentially_consistent() {
    let (mut asks, mut handovers, mut by_comm, mut refused, mut taken) = (0, 0, 0, 0, 0);
    let mut sizes = std::collections::BTreeSet::new();
    for k in 0..cases(300) as u64 {
        let seed = k * 6;
        assert!(socket_asks_for(seed));
        let n = 2 + (k % 4) as usize;
        sizes.insert(n);
        let homes: Vec<usize> = (0..4).map(|p| (seed as usize + p) % n).collect();
        let mut s = sim_with(n, &[AllocSpec { elem: 8, homes }], 6, seed, false);
        random_program(&mut s, 6, 2, 3, 4);
        s.run();
        assert_asks_answered_once(seed, &s);
        assert_eq!(s.socket_asks, s.handler_asks, "seed {seed}: no lanes here");
        asks += s.handler_asks;
        handovers += s.ask_handovers;
        by_comm += s.asks_resolved_by_comm;
        refused += s.socket_refusals;
        taken += s.socket_takes;
        assert_eq!(
            total(&s, |st| st.socket_pages),
            s.socket_takes,
            "seed {seed}: every reply the handler took was taken in once"
        );
        assert_eq!(
            total(&s, |st| st.lane_pages),
            0,
            "seed {seed}: no lanes here"
        );
    }
    assert!(asks > 0, "no handler asked a home itself");
    assert!(taken > 0, "no handler took a reply out of its socket");
    assert!(handovers > 0, "no handler handed its wait over");
    assert!(
        by_comm > 0,
        "no copy for a handler's request reached the comm thread"
    );
    assert!(refused > 0, "no link refused a handler's request");
    assert!(sizes.len() == 4 || cases(300) < 4, "job sizes {sizes:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(128), .. ProptestConfig::default() })]

    /// Nodes mapping one common memory: the protocol only orders synchronization, no page
    /// is ever faulted, fetched, diffed or pushed, and random lock-based programs still
    /// read what sequential consistency says.
    #[test]
    fn random_drf_programs_in_one_common_memory_are_sequentially_consistent(
        n in 2usize..6,
        pages in 1usize..5,
        home_seed in any::<u64>(),
        seed in any::<u64>(),
        locks in 1usize..4,
        vars_per_lock in 1usize..4,
    ) {
        let homes: Vec<usize> = (0..pages).map(|p| ((home_seed >> (p * 3)) as usize) % n).collect();
        let vars = locks * vars_per_lock;
        let spec = AllocSpec { elem: 8, homes };
        let mut s = sim_with_setup(n, &[spec], vars, seed, false, |_, eng| {
            eng.set_common_memory(true)
        });
        s.common = true;
        random_program(&mut s, vars, locks, 3, 4);
        s.run();
        for (from, to, m) in &s.delivered {
            prop_assert!(
                !matches!(m, Msg::PageRequest { .. } | Msg::PageReply { .. } | Msg::Diffs { .. }),
                "{} -> {}: {:?}", from, to, m
            );
        }
        for node in &s.nodes {
            let st = node.eng.stats();
            prop_assert_eq!(
                (st.read_faults, st.write_faults, st.twins_made, st.pages_pushed, st.invalidations),
                (0, 0, 0, 0, 0)
            );
        }
        prop_assert!(s.steps > 0);
    }
}

/// Runs a random lock-based program on nodes spread over hosts (`random_hosts`), each
/// host mapping one copy of the pages its nodes home, and checks what crossed between
/// nodes of one host: no page data and no diff of a host page.
fn run_on_hosts(n: usize, homes: Vec<usize>, seed: u64, locks: usize, vars: usize) -> Sim {
    let hosts = random_hosts(n, seed);
    let spec = AllocSpec { elem: 8, homes };
    let (mates, tables) = (hosts.clone(), host_tables(n));
    let mut s = sim_with_setup(n, &[spec], vars, seed, false, |k, eng| {
        place_on_host(eng, &mates, &tables, k)
    });
    s.hosts = hosts;
    random_program(&mut s, vars, locks, 3, 4);
    s.run();
    for (from, to, m) in &s.delivered {
        let on_host = s.hosts[*from] == s.hosts[*to];
        match m {
            Msg::PageReply { pages } if on_host => {
                assert!(
                    pages.iter().all(|c| c.data.is_empty()),
                    "{from} -> {to}: {m:?}"
                )
            }
            Msg::Diffs { diffs, .. } => assert!(
                diffs
                    .iter()
                    .all(|d| s.hosts[s.page_home[d.page as usize]] != s.hosts[*from]),
                "{from} -> {to}: a diff of a host page: {m:?}"
            ),
            _ => {}
        }
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(256), .. ProptestConfig::default() })]

    /// Nodes on several hosts, each host one copy of the pages its nodes home: the
    /// protocol runs between hosts only, and random lock-based programs still read what
    /// sequential consistency says.
    #[test]
    fn random_drf_programs_with_one_copy_per_host_are_sequentially_consistent(
        n in 2usize..7,
        pages in 1usize..5,
        home_seed in any::<u64>(),
        seed in any::<u64>(),
        locks in 1usize..4,
        vars_per_lock in 1usize..4,
    ) {
        let homes: Vec<usize> = (0..pages).map(|p| ((home_seed >> (p * 3)) as usize) % n).collect();
        let s = run_on_hosts(n, homes, seed, locks, locks * vars_per_lock);
        prop_assert!(s.steps > 0);
    }
}

/// One copy per host is exercised: pages of a host are confirmed, not copied, between its
/// nodes (or found up to date in the home's table of applied diffs), and written by
/// non-home nodes without twins, while pages of other hosts still travel and get diffed.
#[test]
fn one_copy_per_host_confirms_instead_of_copying() {
    let (mut confirmed, mut fetched, mut twins, mut host_writes) = (0, 0, 0, 0);
    let mut found_applied = 0;
    for seed in 0..40u64 {
        let n = 3 + (seed % 3) as usize;
        let homes: Vec<usize> = (0..4).map(|p| (p + seed as usize) % n).collect();
        let s = run_on_hosts(n, homes, seed * 7 + 1, 2, 6);
        for node in &s.nodes {
            let st = node.eng.stats();
            confirmed += st.host_pages_confirmed;
            fetched += st.pages_fetched;
            twins += st.twins_made;
            host_writes += st.write_faults;
            found_applied += st.host_diffs_found_applied;
        }
    }
    assert!(
        found_applied > 0,
        "no notice found its diff applied already"
    );
    assert!(confirmed > 0, "no host page was ever confirmed");
    assert!(fetched > confirmed, "no page crossed between hosts");
    assert!(
        twins > 0 && host_writes > twins,
        "twins {twins}, write faults {host_writes}"
    );
}

/// The simulated handler serves write faults between engine steps, racing the engine's
/// serves and invalidations; programs stay sequentially consistent, and every write it
/// let through reaches the engine's counters exactly once.
#[test]
fn handler_write_faults_keep_programs_sequentially_consistent() {
    let mut handler_faults = 0;
    let mut home_handler_faults = 0;
    for seed in 0..64u64 {
        let n = 2 + (seed % 3) as usize;
        let homes: Vec<usize> = (0..4).map(|p| (p + seed as usize) % n).collect();
        let mut s = sim(n, &homes, 6, seed);
        random_program(&mut s, 6, 2, 3, 4);
        s.run();
        let counted: u64 = s
            .nodes
            .iter()
            .map(|node| node.eng.stats().handler_write_faults)
            .sum();
        assert_eq!(counted, s.handler_faults, "seed {seed}");
        let twins: u64 = s.nodes.iter().map(|node| node.eng.stats().twins_made).sum();
        home_handler_faults += s.handler_faults.saturating_sub(twins);
        handler_faults += s.handler_faults;
    }
    assert!(
        handler_faults > 100,
        "the handler path ran ({handler_faults})"
    );
    assert!(
        home_handler_faults > 0,
        "home pages were served in the handler too"
    );
}

/// A page the engine takes back from the handler to serve it is armed again once the event
/// is over, and a write the handler let through before a serve becomes the home's write
/// notice, with the page write-protected (and armed) again after the serve.
#[test]
fn pages_taken_back_for_a_serve_are_armed_again() {
    use dsm_core::engine::fast::{ARMED_HOME, ARMED_REMOTE};
    use std::sync::atomic::Ordering::Relaxed;
    let mut s = sim(2, &[0, 1], 2, 7);
    assert_eq!(
        s.var_addr[0] / PAGE_SIZE,
        0,
        "variable 0 lives on page 0 (homed on 0)"
    );
    s.nodes[1].script.push_back(Op::Check(0));
    s.run();
    let word = |s: &Sim, k: usize, p: usize| {
        let fast = s.nodes[k].eng.fast_faults().expect("sims have fast faults");
        fast.page_word(p).expect("allocated").load(Relaxed)
    };
    assert_eq!(s.nodes[0].eng.page_state(0), PageState::ReadOnly, "served");
    assert_eq!(word(&s, 0, 0), ARMED_HOME);
    assert_eq!(word(&s, 1, 0), ARMED_REMOTE, "the fetched copy");
    let request = || Msg::PageRequest {
        pages: vec![0],
        required: Vec::new(),
        lane: false,
    };
    let served = |outs: &[Output]| {
        outs.iter().any(|o| {
            matches!(
                o,
                Output::Send {
                    msg: Msg::PageReply { .. },
                    ..
                }
            )
        })
    };
    // Served again while read-only: taken back for the serve, armed again after it.
    let outs = s.nodes[0].eng.on_peer_message(1, request());
    assert!(served(&outs));
    assert_eq!(word(&s, 0, 0), ARMED_HOME);
    // The handler lets a home write through; the next serve takes it in first.
    let fast = s.nodes[0].eng.fast_faults().unwrap().clone();
    fast.handler_write_fault(0, || true, |_| panic!("home pages have no twin"))
        .unwrap();
    let outs = s.nodes[0].eng.on_peer_message(1, request());
    assert!(served(&outs));
    assert_eq!(s.nodes[0].eng.stats().handler_write_faults, 1);
    assert_eq!(s.nodes[0].eng.page_state(0), PageState::ReadOnly);
    assert_eq!(s.nodes[0].eng.memory().prot[0], Prot::Read);
    assert_eq!(word(&s, 0, 0), ARMED_HOME);
}

#[test]
fn lock_counter_reaches_n_times_k() {
    for n in [2, 3, 5, 8] {
        for home in 0..n {
            let mut s = sim(n, &[home], 1, 7 + n as u64 * 31 + home as u64);
            let k = 20;
            for node in 0..n {
                for _ in 0..k {
                    s.nodes[node]
                        .script
                        .extend([Op::Acquire(3), Op::Incr(0), Op::Release(3)]);
                }
                s.nodes[node].script.push_back(Op::Barrier);
            }
            s.run();
            assert_eq!(s.model[0], (n * k) as u64);
            for node in 0..n {
                s.nodes[node].script.push_back(Op::Check(0));
            }
            s.run();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(32), .. ProptestConfig::default() })]

    /// Lock-only programs far longer than the log's trim period (no barrier until the
    /// end): every check under a lock still sees the latest value, and each node's log
    /// keeps only a fraction of the records the nodes made (those some other node has not
    /// seen yet), where it used to keep them all until the barrier.
    #[test]
    fn long_lock_only_programs_keep_short_logs(
        n in 2usize..5,
        seed in any::<u64>(),
        locks in 1usize..4,
        race in any::<bool>(),
    ) {
        let vars = locks * 2;
        let homes: Vec<usize> = (0..3).map(|p| p % n).collect();
        // Race mode with race batches (even seeds, see `sim_with_setup`): without them the
        // records keep their race notices for the barrier, as `--race-first` needs.
        let seed = if race { seed & !1 } else { seed };
        let mut s = sim_with(n, &[AllocSpec { elem: 8, homes }], vars, seed, race);
        // 600 critical sections a node, the locks of each run of 20 hinted ahead (or not,
        // or wrongly: see `hint_locks`), so tokens also travel as grants taken early and
        // passed on.
        for k in 0..n {
            for _ in 0..30 {
                let hint_at = s.script_len(k);
                let mut taken = Vec::new();
                for _ in 0..20 {
                    let l = s.rand(locks);
                    taken.push(l as u64);
                    let guarded: Vec<usize> =
                        (0..vars).filter(|&v| lock_of(v, locks) == l as u64).collect();
                    let v = guarded[s.rand(guarded.len())];
                    let touch = if s.rand(4) == 0 { Op::Check(v) } else { Op::Incr(v) };
                    s.nodes[k]
                        .script
                        .extend([Op::Acquire(l as u64), touch, Op::Release(l as u64)]);
                }
                s.hint_locks(k, hint_at, taken, locks);
            }
        }
        s.run();
        let made: u64 = s.nodes.iter().map(|x| x.eng.stats().intervals_closed).sum();
        for (k, node) in s.nodes.iter().enumerate() {
            let kept = node.eng.logged_records() as u64;
            prop_assert!(
                kept * 4 < made,
                "node {} keeps {} records of the {} intervals closed", k, kept, made
            );
        }
        for k in 0..n {
            s.nodes[k].script.push_back(Op::Barrier);
            s.nodes[k].script.extend((0..vars).map(Op::Check));
        }
        s.run();
    }
}

#[test]
fn each_acquire_counts_the_message_delays_it_waited_for() {
    // Lock 0's manager is node 0, which holds its token at first. Each step runs alone, so
    // the path of each grant is known: what the round-trip model charges.
    let mut s = sim(3, &[0], 1, 11);
    let step = |s: &mut Sim, node: usize| {
        s.nodes[node]
            .script
            .extend([Op::Acquire(0), Op::Incr(0), Op::Release(0)]);
        s.run();
    };
    let delays = |s: &Sim| -> Vec<u64> {
        s.nodes
            .iter()
            .map(|n| n.eng.stats().lock_acquire_delays)
            .collect()
    };
    // Node 1 asks the manager, which grants: 2.
    step(&mut s, 1);
    assert_eq!(delays(&s), [0, 2, 0]);
    // Node 2 asks the manager, which forwards to node 1, which grants: 3.
    step(&mut s, 2);
    assert_eq!(delays(&s), [0, 2, 3]);
    // The manager itself forwards to node 2, which grants: 2.
    step(&mut s, 0);
    assert_eq!(delays(&s), [2, 2, 3]);
    // Its token is here now: a local acquire waits for nothing.
    step(&mut s, 0);
    assert_eq!(delays(&s), [2, 2, 3]);
    assert_eq!(s.nodes[0].eng.stats().lock_acquires_local, 1);
    // Three nodes meet all-to-all without race detection: one delay each (the set-up's
    // allocation was a barrier too).
    let barrier_delays = |s: &Sim| -> Vec<u64> {
        s.nodes
            .iter()
            .map(|n| n.eng.stats().barrier_delays)
            .collect()
    };
    let before = barrier_delays(&s);
    for node in 0..3 {
        s.nodes[node].script.push_back(Op::Barrier);
    }
    s.run();
    let after: Vec<u64> = barrier_delays(&s)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    assert_eq!(after, [1, 1, 1]);
    assert_eq!(s.model[0], 4);
}

#[test]
fn each_semaphore_wait_counts_the_message_delays_it_waited_for() {
    // Semaphore 0's manager is node 0; it starts with one token.
    let mut s = sim(3, &[0], 1, 13);
    s.semaphores(&[(0, 1)]);
    let run = |s: &mut Sim, ops: &[(usize, Op)]| {
        for (node, op) in ops {
            s.nodes[*node].script.push_back(op.clone());
        }
        s.run();
    };
    let delays = |s: &Sim| -> Vec<u64> {
        s.nodes
            .iter()
            .map(|n| n.eng.stats().sem_wait_delays)
            .collect()
    };
    // The initial token: node 1 asks the manager, which grants: 2.
    run(&mut s, &[(1, Op::SemWait(0))]);
    assert_eq!(delays(&s), [0, 2, 0]);
    // Node 2's signal: node 1 asks the manager, which sends it on to node 2, which
    // grants: 3.
    run(&mut s, &[(2, Op::SemSignal(0))]);
    run(&mut s, &[(1, Op::SemWait(0))]);
    assert_eq!(delays(&s), [0, 5, 0]);
    // The manager consumes its own signal without a message, and node 2's with two.
    run(&mut s, &[(0, Op::SemSignal(0))]);
    run(&mut s, &[(0, Op::SemWait(0))]);
    assert_eq!(delays(&s), [0, 5, 0]);
    run(&mut s, &[(2, Op::SemSignal(0))]);
    run(&mut s, &[(0, Op::SemWait(0))]);
    assert_eq!(delays(&s), [2, 5, 0]);
}

#[test]
fn false_sharing_writers_all_survive_the_barrier() {
    // Every node increments its own variables, all on one page homed elsewhere, with no
    // locks at all (disjoint words: no race); after the barrier all see all writes.
    let n = 4;
    let vars = 16;
    let mut s = sim(n, &[3], vars, 99);
    // Rebuild variable addresses: adjacent words on page 0.
    s.var_addr = (0..vars).map(|v| v * 8).collect();
    for k in 0..n {
        for v in (0..vars).filter(|v| v % n == k) {
            s.nodes[k].script.push_back(Op::Incr(v));
        }
        s.nodes[k].script.push_back(Op::Barrier);
        for v in 0..vars {
            s.nodes[k].script.push_back(Op::Check(v));
        }
    }
    s.run();
    assert!(s.model.iter().all(|&x| x == 1));
}

#[test]
fn the_page_table_follows_the_allocations_not_the_segment() {
    // A 16 TiB segment: 2^32 pages, of which allocations may use all but the last (page
    // numbers and their sums are 32-bit). Nothing may be sized by it.
    let mem = VecMemory::new(8);
    let mut eng = Engine::new(0, 1, 1 << 32, mem, false);
    assert_eq!(eng.page_limit(), PageNo::MAX as usize);
    assert_eq!(eng.allocated_pages(), 0);
    assert_eq!(eng.page_state(PageNo::MAX), PageState::Unallocated);
    let fatal = |outs: &[Output]| outs.iter().any(|o| matches!(o, Output::Fatal(_)));
    let crash = |outs: &[Output]| outs.iter().any(|o| matches!(o, Output::FaultCrash));
    for (first, count) in [(0, 3), (3, 2)] {
        eng.reserve_pages(first as usize + count as usize).unwrap();
        let outs = eng.on_command(Command::Alloc {
            homes: vec![(first, count, 0)],
            digest: 7,
            race: None,
            at: dsm_proto::SyncPoint::Allocation {
                name: "a".into(),
                after: 0,
            },
        });
        assert!(!fatal(&outs), "{outs:?}");
        assert_eq!(eng.allocated_pages(), (first + count) as usize);
    }
    assert_eq!(eng.page_state(4), PageState::ReadWrite);
    assert_eq!(eng.page_state(5), PageState::Unallocated);
    // Above the high-water mark, in the segment or not, an access is a wild one.
    assert!(crash(&eng.on_fault(Some(5), Some(false))));
    assert!(crash(&eng.on_fault(Some(PageNo::MAX), Some(true))));
    // An allocation past the usable pages is refused, not wrapped.
    let outs = eng.on_command(Command::Alloc {
        homes: vec![(PageNo::MAX - 1, 2, 0)],
        digest: 8,
        race: None,
        at: dsm_proto::SyncPoint::Allocation {
            name: "past the end".into(),
            after: 0,
        },
    });
    assert!(fatal(&outs), "{outs:?}");
    assert_eq!(eng.allocated_pages(), 5);
}

#[test]
fn interval_bookkeeping_counts() {
    // One node writes a page homed elsewhere under a lock; the other acquires the lock and
    // must fetch (one fetch), see the value, and the writer sends exactly one diff.
    let mut s = sim(2, &[0], 1, 5);
    s.nodes[1]
        .script
        .extend([Op::Acquire(0), Op::Incr(0), Op::Release(0)]);
    s.run();
    s.nodes[0]
        .script
        .extend([Op::Acquire(0), Op::Check(0), Op::Release(0)]);
    s.run();
    let w = s.nodes[1].eng.stats().clone();
    assert_eq!(w.diffs_sent, 1);
    assert_eq!(w.twins_made, 1);
    assert_eq!(w.pages_fetched, 1);
    let h = s.nodes[0].eng.stats().clone();
    assert_eq!(h.diffs_applied, 1);
    assert_eq!(h.pages_fetched, 0, "the home never fetches its own page");
    assert_eq!(s.model[0], 1);
}

#[test]
fn pages_written_interval_after_interval_stay_writable_until_a_notice_names_them() {
    // Node 1 adds to a counter on a page homed at node 0 in five critical sections in a
    // row: only the first write faults (the page stays writable, its twin refreshed at
    // each close), yet every section's diff reaches the home. Then node 0 writes the page
    // under the lock: node 1's next acquire must see that write, so the notice
    // write-protects node 1's kept copy before it is invalidated or brought up to date.
    let mut s = sim(2, &[0], 1, 0);
    for _ in 0..5 {
        s.nodes[1]
            .script
            .extend([Op::Acquire(0), Op::Incr(0), Op::Release(0)]);
    }
    s.run();
    let w = s.nodes[1].eng.stats().clone();
    assert_eq!(w.write_faults, 1, "{w:?}");
    assert_eq!(w.diffs_sent, 5, "{w:?}");
    assert!(w.pages_kept_writable >= 5, "{w:?}");
    s.nodes[0]
        .script
        .extend([Op::Acquire(0), Op::Incr(0), Op::Check(0), Op::Release(0)]);
    s.run();
    s.nodes[1]
        .script
        .extend([Op::Acquire(0), Op::Check(0), Op::Incr(0), Op::Release(0)]);
    s.run();
    assert_eq!(s.model[0], 7);
    let w = s.nodes[1].eng.stats().clone();
    assert_eq!(
        w.write_faults, 2,
        "the kept copy was write-protected: {w:?}"
    );

    // With keeping off, every section faults.
    let mut s = sim(2, &[0], 1, 0);
    s.nodes[1].eng.set_keep_writable(false);
    for _ in 0..5 {
        s.nodes[1]
            .script
            .extend([Op::Acquire(0), Op::Incr(0), Op::Release(0)]);
    }
    s.run();
    assert_eq!(s.nodes[1].eng.stats().write_faults, 5);
}

/// Three generated programs (N = 4 and 5) in which a granter's pushed diff of a page homed
/// at a third node reached a copy that already held it, fetched or pushed from the home
/// after the home had applied it, together with a later write to the same bytes; laying
/// the diff again undid that write and a later read saw the old value. The copy now
/// knows which diffs it holds (`PageCopy::applied`) and those are passed over.
#[test]
fn pushed_diffs_never_undo_later_writes_a_copy_already_holds() {
    for (case, race) in [(27108u64, false), (1907, true), (9349, true)] {
        let r = mix(case ^ 0x1234_5678);
        let n = 2 + (r % 4) as usize;
        let pages = 1 + ((r >> 4) % 4) as usize;
        let home_seed = mix(r);
        let homes: Vec<usize> = (0..pages)
            .map(|p| ((home_seed >> (p * 3)) as usize) % n)
            .collect();
        let locks = 1 + ((r >> 8) % 3) as usize;
        let vars = locks * (1 + ((r >> 12) % 3) as usize);
        let spec = AllocSpec { elem: 8, homes };
        let mut s = sim_with(n, &[spec], vars, mix(r ^ 77), race);
        random_program(&mut s, vars, locks, 3, 4);
        s.run();
        let by_diffs: u64 = s
            .nodes
            .iter()
            .map(|node| node.eng.stats().pushes_applied_diffs)
            .sum();
        assert!(by_diffs > 0, "case {case}: pushed diffs were taken");
    }
}

#[test]
fn grant_carries_the_knowledge_of_the_release_not_later_intervals() {
    // Node 0 writes under lock 1 and releases it (closing interval r), then arrives at a
    // barrier (closing interval r+1, which has a write of its own). Node 1's acquire of
    // lock 1 is granted by node 0 while node 0 waits at the barrier: the grant must order
    // node 1 after interval r only. Claiming r+1 would hide a race with node 0's later write.
    let mut s = sim(2, &[0, 1], 2, 11);
    s.var_addr = vec![0, 4096];
    s.nodes[0].script.extend([
        Op::Acquire(1),
        Op::Incr(0),
        Op::Release(1),
        Op::Incr(1),
        Op::Barrier,
    ]);
    s.run_until_quiet(false);
    assert!(
        s.nodes[0].script.is_empty() && s.nodes[0].wait == Wait::Reply,
        "node 0 waits at the barrier"
    );
    s.nodes[1]
        .script
        .extend([Op::Acquire(1), Op::Check(0), Op::Release(1), Op::Barrier]);
    s.run();
    let grants: Vec<&Msg> = s
        .delivered
        .iter()
        .filter(|(from, to, m)| *from == 0 && *to == 1 && matches!(m, Msg::LockGrant { .. }))
        .map(|(_, _, m)| m)
        .collect();
    assert_eq!(grants.len(), 1);
    let Msg::LockGrant { grants } = grants[0] else {
        unreachable!()
    };
    let [dsm_proto::Grant {
        known, intervals, ..
    }] = grants.as_slice()
    else {
        panic!("one grant expected: {grants:?}")
    };
    // Intervals of node 0: 1 (start, alloc), 2 (before acquire), 3 (critical section),
    // 4 (after the release, written var 1, closed by the barrier).
    assert_eq!(known.get(0), 3, "grant knowledge {known:?}");
    assert!(
        intervals.iter().all(|r| r.node != 0 || r.index <= 3),
        "{intervals:?}"
    );
}

// ------------------------------------------------------------------ race detection

/// Who may access a block of elements in a program that keeps the discipline.
enum Class {
    /// Only under this lock.
    Guarded(u64),
    /// Only by this node (with or without locks).
    Owned(usize),
    /// Read by anyone, written by no one.
    ReadOnly,
}

/// Random programs with races: critical sections (some nested), unlocked accesses,
/// barriers. Elements come in blocks, each with a [`Class`]; every access keeps to its
/// elements' classes except, with probability `violate`/8, when it breaks them (unlocked,
/// under the wrong lock, by another node, or writing read-only data). With `violate == 0`
/// the program is race free by construction.
struct RaceGen {
    locks: usize,
    phases: usize,
    ops: usize,
    violate: usize,
    /// Elements per class block.
    block: usize,
    salt: u64,
    /// Elements accesses cluster around, so that nodes meet: (allocation, element).
    hot: Vec<(usize, usize)>,
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
    x ^ (x >> 31)
}

impl RaceGen {
    fn new(s: &mut Sim, locks: usize, phases: usize, ops: usize, violate: usize) -> Self {
        let block = [1, 4, 32, 512][s.rand(4)];
        let salt = mix(s.rng);
        let mut hot = Vec::new();
        for _ in 0..4 + s.rand(8) {
            let alloc = s.rand(s.allocs.len());
            let len = s.allocs[alloc].len;
            let elem = match s.rand(4) {
                // Near a page boundary: elements there may straddle it.
                0 => {
                    let per_page = PAGE_SIZE / s.allocs[alloc].elem;
                    let page = s.rand(len / per_page + 1);
                    (page * per_page + per_page - s.rand(3)).min(len - 1)
                }
                _ => s.rand(len),
            };
            hot.push((alloc, elem));
            // A neighbour: same page, different element (false sharing).
            if s.rand(2) == 0 && elem + 1 < len {
                hot.push((alloc, elem + 1));
            }
        }
        RaceGen {
            locks,
            phases,
            ops,
            violate,
            block,
            salt,
            hot,
        }
    }

    fn class(&self, n: usize, alloc: usize, elem: usize) -> Class {
        let h = mix(self.salt ^ ((alloc as u64) << 40) ^ (elem / self.block) as u64);
        let c = (h % (self.locks + n + 1) as u64) as usize;
        if c < self.locks {
            Class::Guarded(c as u64)
        } else if c < self.locks + n {
            Class::Owned(c - self.locks)
        } else {
            Class::ReadOnly
        }
    }

    fn allowed(&self, n: usize, k: usize, held: &[u64], op: &Op) -> bool {
        let Op::Touch {
            alloc,
            start,
            step,
            count,
            write,
            ..
        } = *op
        else {
            unreachable!()
        };
        (0..count).all(|j| match self.class(n, alloc, start + j * step) {
            Class::Guarded(l) => held.contains(&l),
            Class::Owned(o) => o == k,
            Class::ReadOnly => !write,
        })
    }

    /// A random access by node k holding `held`, keeping the discipline unless it rolls a
    /// violation; `None` if no try kept it.
    fn touch(&self, s: &mut Sim, k: usize, held: &[u64]) -> Option<Op> {
        let violate = s.rand(8) < self.violate;
        for _ in 0..8 {
            let (alloc, centre) = self.hot[s.rand(self.hot.len())];
            let len = s.allocs[alloc].len;
            let (start, step, count) = match s.rand(10) {
                0..=5 => (centre, 1, 1),
                6..=8 => (
                    centre.saturating_sub(s.rand(4)),
                    1 + s.rand(3),
                    1 + s.rand(8),
                ),
                _ => (s.rand(len), 1 + s.rand(5), 1 + s.rand(600)),
            };
            let count = count.min((len - 1 - start) / step + 1);
            let rec = match s.rand(3) {
                0 => Rec::Each,
                1 if step == 1 || count == 1 => Rec::Span,
                _ => Rec::Strided,
            };
            let op = Op::Touch {
                alloc,
                start,
                step,
                count,
                write: s.rand(2) == 0,
                rec,
            };
            if violate || self.allowed(s.n, k, held, &op) {
                return Some(op);
            }
        }
        None
    }

    fn generate(&self, s: &mut Sim) {
        for phase in 0..self.phases {
            for k in 0..s.n {
                let mut script = Vec::new();
                for _ in 0..s.rand(self.ops + 1) {
                    if s.rand(3) == 0 {
                        for _ in 0..1 + s.rand(2) {
                            script.extend(self.touch(s, k, &[]));
                        }
                        continue;
                    }
                    let l = s.rand(self.locks) as u64;
                    script.push(Op::Acquire(l));
                    for _ in 0..1 + s.rand(3) {
                        script.extend(self.touch(s, k, &[l]));
                    }
                    // Nested sections take locks in increasing order (no deadlock).
                    if (l as usize) + 1 < self.locks && s.rand(4) == 0 {
                        let inner = l + 1 + s.rand(self.locks - l as usize - 1) as u64;
                        script.push(Op::Acquire(inner));
                        for _ in 0..1 + s.rand(2) {
                            script.extend(self.touch(s, k, &[l, inner]));
                        }
                        script.push(Op::Release(inner));
                        script.extend(self.touch(s, k, &[l]));
                    }
                    script.push(Op::Release(l));
                }
                script.push(if phase + 1 == self.phases {
                    Op::Finish
                } else {
                    Op::Barrier
                });
                s.nodes[k].script.extend(script);
            }
        }
    }
}

/// Element sizes of the second allocation: byte granules, sizes that are not powers of
/// two (elements straddle pages), elements of several granules.
const ELEM_SIZES: [usize; 7] = [1, 2, 3, 4, 8, 12, 16];

/// How often a race case's synchronizations left the interval open: host-lock acquires
/// that learned nothing, releases that took back the interval before, releases that froze
/// it and frozen intervals closed later, and protocol acquires of a lock whose token
/// stayed here.
#[derive(Default)]
struct IntervalsLeftOpen {
    elided: u64,
    continued: u64,
    frozen: u64,
    settled: u64,
    quiet: u64,
}

/// Runs one random program with race detection and checks the detector against the
/// oracle; with `common`, the nodes map one common memory and take their locks in it
/// (`Command::HostAcquire` / `HostRelease`, the lock's release clock joined on acquire).
/// Returns the oracle's counts, the races reported, those found between barriers and the
/// synchronizations that left their interval open.
/// Where a simulation's nodes keep their pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Each node its own copy (ranks on different hosts, or `DSM_TRANSPORT=rings`).
    Copies,
    /// One common memory, locks taken in it (every rank on one host).
    Common,
    /// One copy per host (`random_hosts`), the protocol between hosts.
    Hosts,
}

#[allow(clippy::too_many_arguments)]
fn race_case_in(
    layout: Layout,
    n: usize,
    pages: (usize, usize),
    elem: usize,
    home_seed: u64,
    seed: u64,
    locks: usize,
    phases: usize,
    violate: usize,
) -> (OracleCounts, Vec<Race>, usize, IntervalsLeftOpen) {
    let homes = |count: usize, shift: usize| -> Vec<usize> {
        (0..count)
            .map(|p| (mix(home_seed ^ (shift + p) as u64) as usize) % n)
            .collect()
    };
    let specs = [
        AllocSpec {
            elem: 8,
            homes: homes(pages.0, 0),
        },
        AllocSpec {
            elem,
            homes: homes(pages.1, 16),
        },
    ];
    let common = layout == Layout::Common;
    let hosts = match layout {
        Layout::Hosts => random_hosts(n, seed),
        _ => (0..n).collect(),
    };
    let (mates, tables) = (hosts.clone(), host_tables(n));
    let mut s = sim_with_setup(n, &specs, 1, seed, true, |k, eng| {
        eng.set_common_memory(common);
        place_on_host(eng, &mates, &tables, k);
    });
    s.hosts = hosts;
    s.common = common;
    s.host_locks = common;
    // As the runtime does outside `--pinpoint`, schedule mode and `--check` (a quarter of
    // the cases keep every acquire's interval, as those modes do).
    s.elide_acquires = common && !seed.is_multiple_of(4);
    let gen = RaceGen::new(&mut s, locks, phases, 8, violate);
    gen.generate(&mut s);
    let program = s.program();
    s.run();
    let counts = s.check_races(&program);
    if violate == 0 {
        assert_eq!(
            counts.concurrent, 0,
            "a disciplined program raced:\n{program}"
        );
    }
    (
        counts,
        s.races,
        s.incremental_races,
        IntervalsLeftOpen {
            elided: s.elided_acquires,
            continued: s.continued_releases,
            frozen: s.frozen_releases,
            settled: s.settled_frozen,
            quiet: s.quiet_taken,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(1024), .. ProptestConfig::default() })]

    /// Random race programs against the brute-force happens-before oracle, with each node
    /// its own copy of the pages, all in one common memory, as one host's ranks run by
    /// default (no page moves, locks are taken in the memory and carry their releaser's
    /// vector time), or one copy per host: the races reported are exactly the oracle's.
    #[test]
    fn race_reports_match_a_happens_before_oracle(
        layout in prop::sample::select(vec![Layout::Copies, Layout::Common, Layout::Hosts]),
        n in 2usize..6,
        pages0 in 1usize..4,
        pages1 in 1usize..3,
        elem in prop::sample::select(ELEM_SIZES.to_vec()),
        home_seed in any::<u64>(),
        seed in any::<u64>(),
        locks in 1usize..4,
        phases in 1usize..5,
        violate in prop::sample::select(vec![0usize, 1, 2, 4, 8]),
    ) {
        let _ = race_case_in(layout, n, (pages0, pages1), elem, home_seed, seed, locks, phases, violate);
    }
}

/// The random race programs are not vacuous: across fixed seeds, some report races and
/// some do not, races of both kinds occur, many conflicting pairs within an epoch are
/// ordered only by lock chains (so the detector's happens-before is really exercised), and
/// the incremental analysis finds races between barriers.
#[test]
fn race_programs_cover_races_and_ordered_conflicts() {
    for layout in [Layout::Copies, Layout::Common, Layout::Hosts] {
        race_programs_cover_races_and_ordered_conflicts_in(layout);
    }
}

fn race_programs_cover_races_and_ordered_conflicts_in(layout: Layout) {
    let common = layout == Layout::Common;
    let (mut racy, mut clean) = (0, 0);
    let mut total = OracleCounts::default();
    let mut kinds = BTreeSet::new();
    let mut between_barriers = 0;
    let mut open = IntervalsLeftOpen::default();
    for i in 0..60u64 {
        let n = 2 + (i % 4) as usize;
        let violate = [0, 1, 2, 4, 8][(i % 5) as usize];
        let elem = ELEM_SIZES[(i % 7) as usize];
        let (c, races, incremental, here) =
            race_case_in(layout, n, (2, 2), elem, i * 77, i * 1013 + 5, 2, 3, violate);
        open.elided += here.elided;
        open.continued += here.continued;
        open.frozen += here.frozen;
        open.settled += here.settled;
        open.quiet += here.quiet;
        between_barriers += incremental;
        if races.is_empty() {
            clean += 1;
        } else {
            racy += 1;
        }
        kinds.extend(races.iter().map(|r| r.kind));
        total.ordered += c.ordered;
        total.across_barriers += c.across_barriers;
        total.concurrent += c.concurrent;
    }
    assert!(racy >= 20 && clean >= 12, "racy {racy}, clean {clean}");
    // Through the protocol, acquires of a lock whose token stayed here leave their
    // interval open, and the races still match the oracle's.
    let IntervalsLeftOpen {
        elided,
        continued,
        frozen,
        settled,
        quiet,
    } = open;
    println!("{quiet} protocol acquires left their interval open");
    assert_eq!(
        !common,
        quiet > 0,
        "{quiet} protocol acquires left their interval open"
    );
    // In one common memory, host-lock acquires that bring nothing new leave their
    // interval open, and the races still match the oracle's.
    println!("{elided} acquires left their interval open");
    assert_eq!(
        common,
        elided > 0,
        "{elided} acquires left their interval open"
    );
    // And releases of a lock nobody took since the node's previous release of it take
    // back the interval that release closed, with the same races.
    println!("{continued} releases took back the interval before");
    assert_eq!(
        common,
        continued > 0,
        "{continued} releases took back the interval before"
    );
    // Releases freeze their interval; some are thawed by the next acquire of the lock,
    // others closed by another synchronization, with the same races.
    println!("{frozen} releases froze their interval, {settled} of them closed later");
    assert_eq!(
        common,
        settled > 0 && frozen > settled,
        "{frozen} / {settled}"
    );
    // Half the seeds run the incremental analysis, and it finds races of its own (checked
    // against the oracle with the others).
    println!("{between_barriers} races found between barriers");
    assert!(
        between_barriers >= 20,
        "{between_barriers} races found between barriers"
    );
    assert_eq!(kinds.len(), 2, "{kinds:?}");
    assert!(
        total.ordered >= 500 && total.across_barriers >= 500 && total.concurrent >= 300,
        "{total:?}"
    );
}

/// Small, hand-written cases with known answers (the oracle is tested too).
#[test]
fn race_detection_known_cases() {
    let run = |scripts: Vec<Vec<Op>>, seed: u64| -> Vec<Race> {
        let specs = [AllocSpec {
            elem: 8,
            homes: vec![0, 1],
        }];
        let mut s = sim_with(scripts.len(), &specs, 1, seed, true);
        for (k, script) in scripts.into_iter().enumerate() {
            s.nodes[k].script.extend(script);
        }
        let program = s.program();
        s.run();
        s.check_races(&program);
        s.races
    };
    let touch = |elem: usize, write: bool| Op::Touch {
        alloc: 0,
        start: elem,
        step: 1,
        count: 1,
        write,
        rec: Rec::Each,
    };
    for seed in 0..20 {
        // Unlocked writes of one element: one write-write race, in the epoch after the
        // allocation (epoch 2), between each node's first interval after it.
        let races = run(
            vec![
                vec![touch(3, true), Op::Barrier],
                vec![touch(3, true), Op::Barrier],
            ],
            seed,
        );
        assert_eq!(races.len(), 1, "{races:?}");
        let r = &races[0];
        assert_eq!((r.epoch, r.index, r.kind), (2, 3, RaceKind::WriteWrite));
        assert_eq!(r.first.began_with, SyncCause::Barrier(1));
        // Neighbouring elements: false sharing, no race.
        let races = run(
            vec![
                vec![touch(3, true), Op::Barrier],
                vec![touch(4, true), Op::Barrier],
            ],
            seed,
        );
        assert!(races.is_empty(), "{races:?}");
        // Writes on either side of a barrier are ordered.
        let races = run(
            vec![
                vec![touch(600, true), Op::Barrier, Op::Barrier],
                vec![Op::Barrier, touch(600, false), Op::Barrier],
            ],
            seed,
        );
        assert!(races.is_empty(), "{races:?}");
        // A read under lock 1 and a write under lock 2 race; under the same lock they
        // do not.
        for (l0, l1, expect) in [(1, 2, 1), (1, 1, 0)] {
            let races = run(
                vec![
                    vec![
                        Op::Acquire(l0),
                        touch(5, true),
                        Op::Release(l0),
                        Op::Barrier,
                    ],
                    vec![
                        Op::Acquire(l1),
                        touch(5, false),
                        Op::Release(l1),
                        Op::Barrier,
                    ],
                ],
                seed,
            );
            assert_eq!(races.len(), expect, "locks {l0}/{l1}: {races:?}");
        }
    }
}

#[test]
fn unlocked_accesses_ordered_through_a_lock_chain_are_not_races() {
    // Node 0 writes x without a lock, then passes lock 1 to node 1, which passes lock 2
    // to node 2, which reads x without a lock: ordered by the chain, no race. Running each
    // node's part to quiescence before the next one starts forces the grant order.
    let touch = |write: bool| Op::Touch {
        alloc: 0,
        start: 9,
        step: 1,
        count: 1,
        write,
        rec: Rec::Each,
    };
    for seed in 0..20 {
        let specs = [AllocSpec {
            elem: 8,
            homes: vec![2],
        }];
        let mut s = sim_with(3, &specs, 1, seed, true);
        s.nodes[0]
            .script
            .extend([touch(true), Op::Acquire(1), Op::Release(1)]);
        s.run();
        s.nodes[1].script.extend([
            Op::Acquire(1),
            Op::Release(1),
            Op::Acquire(2),
            Op::Release(2),
        ]);
        s.run();
        s.nodes[2]
            .script
            .extend([Op::Acquire(2), Op::Release(2), touch(false)]);
        s.run();
        // Node 1 writes x after the chain passed it on: that races with node 2's read.
        s.nodes[1].script.push_back(touch(true));
        s.run();
        for k in 0..3 {
            s.nodes[k].script.push_back(Op::Barrier);
        }
        let program = s.program();
        s.run();
        let counts = s.check_races(&program);
        assert_eq!(s.races.len(), 1, "{:?}", s.races);
        assert_eq!(counts.ordered, 2);
        let r = &s.races[0];
        assert_eq!((r.first.node, r.second.node), (1, 2));
        assert_eq!(r.first.began_with, SyncCause::Release(2));
        assert_eq!(r.second.began_with, SyncCause::Release(2));
    }
}

#[test]
fn crossing_races_leave_a_first_race() {
    // Node 0 writes x, then (another interval) y; node 1 writes y, then x. The race on x
    // affects the one on y through node 0's program order and the race on y affects the
    // one on x through node 1's: neither is preceded by a race outside the pair, so
    // `--race-first` must report both rather than neither.
    let touch = |elem: usize| Op::Touch {
        alloc: 0,
        start: elem,
        step: 1,
        count: 1,
        write: true,
        rec: Rec::Each,
    };
    for seed in 0..20 {
        let specs = [AllocSpec {
            elem: 8,
            homes: vec![0],
        }];
        let mut s = sim_with(2, &specs, 1, seed, true);
        // First races are a barrier-time notion: `--race-first` ships no race batches.
        s.incremental = None;
        s.nodes[0].script.extend([
            touch(0),
            Op::Acquire(1),
            Op::Release(1),
            touch(1),
            Op::Barrier,
        ]);
        s.nodes[1].script.extend([
            touch(1),
            Op::Acquire(2),
            Op::Release(2),
            touch(0),
            Op::Barrier,
        ]);
        let program = s.program();
        s.run();
        s.check_races(&program);
        assert_eq!(s.races.len(), 2, "{:?}", s.races);
        assert_eq!(s.first_races[&2].len(), 2, "{:?}", s.first_races);
    }
}

// ------------------------------------------------------------------ record and replay

/// Runs `program` on `n` nodes with the message order drawn from `order_seed`, recording
/// the synchronization order (and replaying `replay` if given); returns every node's
/// recorded events and the simulation.
fn run_ordered(
    n: usize,
    homes: &[usize],
    vars: usize,
    race: bool,
    program: &dyn Fn(&mut Sim),
    order_seed: u64,
    replay: Option<&dsm_replay::Record>,
) -> (dsm_replay::Record, Sim) {
    let spec = AllocSpec {
        elem: 8,
        homes: homes.to_vec(),
    };
    let mut s = sim_with_setup(n, &[spec], vars, 1, race, |k, eng| {
        eng.start_recording();
        if let Some(r) = replay {
            eng.start_replay(r.schedule(k as u32).unwrap());
        }
    });
    program(&mut s);
    s.rng = order_seed | 1;
    s.expect_divergence = replay.is_some();
    s.run_until_quiet(replay.is_none());
    let ranks = s
        .nodes
        .iter_mut()
        .map(|node| node.eng.take_recording())
        .collect();
    let record = dsm_replay::Record {
        header: dsm_replay::Header {
            program: "sim".into(),
            args: Vec::new(),
            nodes: n as u32,
            chaos: None,
            race: false,
        },
        ranks,
    };
    // Every record survives its file format.
    let record = dsm_replay::Record::from_bytes(&record.to_bytes()).unwrap();
    (record, s)
}

/// Who took each lock, grant by grant.
fn grant_order(r: &dsm_replay::Record) -> BTreeMap<u64, Vec<usize>> {
    let mut out: BTreeMap<u64, BTreeMap<u64, usize>> = BTreeMap::new();
    for (k, events) in r.ranks.iter().enumerate() {
        for e in events {
            if let dsm_replay::Event::Acquire { lock, grant } = *e {
                out.entry(lock).or_default().insert(grant, k);
            }
        }
    }
    out.into_iter()
        .map(|(l, g)| (l, g.into_values().collect()))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(96), .. ProptestConfig::default() })]

    /// A recorded run replayed under another message order takes every lock in the
    /// recorded order and closes the same intervals (the records are equal event for
    /// event, barrier checks included), and never deadlocks.
    #[test]
    fn replays_grant_every_lock_in_the_recorded_order(
        n in 2usize..6,
        pages in 1usize..4,
        home_seed in any::<u64>(),
        program_seed in any::<u64>(),
        record_seed in any::<u64>(),
        replay_seed in any::<u64>(),
        locks in 1usize..4,
        race in any::<bool>(),
    ) {
        let homes: Vec<usize> = (0..pages).map(|p| ((home_seed >> (p * 3)) as usize) % n).collect();
        let vars = locks * 2;
        let program = |s: &mut Sim| {
            s.rng = program_seed | 1;
            random_program(s, vars, locks, 2, 5);
        };
        let (recorded, _) = run_ordered(n, &homes, vars, race, &program, record_seed, None);
        let (replayed, s) =
            run_ordered(n, &homes, vars, race, &program, replay_seed, Some(&recorded));
        prop_assert!(s.diverged.is_empty(), "{:?}", s.diverged);
        for (k, node) in s.nodes.iter().enumerate() {
            prop_assert!(node.script.is_empty() && node.wait == Wait::Running, "node {} stuck", k);
        }
        prop_assert_eq!(grant_order(&replayed), grant_order(&recorded));
        prop_assert_eq!(&replayed.ranks, &recorded.ranks);
    }
}

/// Without replay, message orders do change who gets a lock first: the property above
/// is not vacuous.
#[test]
fn message_orders_change_the_lock_order_without_replay() {
    let program = |s: &mut Sim| {
        for k in 0..s.n {
            for _ in 0..3 {
                s.nodes[k]
                    .script
                    .extend([Op::Acquire(1), Op::Incr(0), Op::Release(1)]);
            }
            s.nodes[k].script.push_back(Op::Barrier);
        }
    };
    let orders: BTreeSet<Vec<usize>> = (0..20)
        .map(|seed| {
            let (r, _) = run_ordered(3, &[0], 1, false, &program, seed * 7919, None);
            grant_order(&r)[&1].clone()
        })
        .collect();
    assert!(orders.len() > 1, "{orders:?}");
}

/// A replay whose program leaves the record (one node acquires once more, or once
/// less) reports a divergence naming the lock and rank instead of waiting forever.
#[test]
fn a_deviating_replay_reports_divergence_instead_of_hanging() {
    let program = |extra: usize| {
        move |s: &mut Sim| {
            for k in 0..s.n {
                let rounds = if k == 1 { 3 + extra } else { 3 };
                for _ in 0..rounds {
                    s.nodes[k]
                        .script
                        .extend([Op::Acquire(1), Op::Incr(0), Op::Release(1)]);
                }
                s.nodes[k].script.push_back(Op::Barrier);
            }
        }
    };
    let (recorded, _) = run_ordered(3, &[0], 1, false, &program(1), 5, None);
    for (variant, seed) in [(0, 11), (2, 13)] {
        let (_, s) = run_ordered(3, &[0], 1, false, &program(variant), seed, Some(&recorded));
        assert!(
            !s.diverged.is_empty(),
            "variant {variant}: no divergence reported"
        );
        let m = &s.diverged[0];
        assert!(m.contains("replay diverged on rank"), "{m}");
        assert!(m.contains("lock 1"), "{m}");
    }
}

// ------------------------------------------------------------------ semaphores

/// A random data-race-free program with semaphores: a token (the right to touch the
/// variables) travels between nodes through one semaphore per receiving node, each holder
/// checking and incrementing variables before passing it on; some nodes also use a
/// semaphore with one token as a lock. Every read must see the sequential model's value.
fn random_semaphore_chain(s: &mut Sim, vars: usize, hops: usize) {
    let n = s.n;
    // Semaphore 100 + x is waited on by node x only; 99 is a mutex for variable 0.
    let mut sems: Vec<(u64, u32)> = (0..n).map(|x| (100 + x as u64, 0)).collect();
    sems.push((99, 1));
    s.semaphores(&sems);
    let mut holder = s.rand(n);
    for hop in 0..hops {
        if hop > 0 {
            s.nodes[holder]
                .script
                .push_back(Op::SemWait(100 + holder as u64));
        }
        for _ in 0..1 + s.rand(3) {
            let v = 1 + s.rand(vars - 1);
            let op = if s.rand(3) == 0 {
                Op::Check(v)
            } else {
                Op::Incr(v)
            };
            s.nodes[holder].script.push_back(op);
        }
        let next = s.rand(n);
        if hop + 1 < hops {
            s.nodes[holder]
                .script
                .push_back(Op::SemSignal(100 + next as u64));
        }
        holder = next;
    }
    // Variable 0 under the semaphore mutex, from every node at any time.
    for k in 0..n {
        // Between chain operations (never inside another section), latest first.
        let len = s.nodes[k].script.len();
        let mut at: Vec<usize> = (0..s.rand(3)).map(|_| s.rand(len + 1)).collect();
        at.sort_unstable_by(|a, b| b.cmp(a));
        for at in at {
            let section = [Op::SemWait(99), Op::Incr(0), Op::SemSignal(99)];
            for (i, op) in section.into_iter().enumerate() {
                s.nodes[k].script.insert(at + i, op);
            }
        }
        s.nodes[k].script.push_back(Op::Barrier);
        for v in 0..vars {
            s.nodes[k].script.push_back(Op::Check(v));
        }
    }
}

/// A random program with races through counting semaphores, generated as a sequential
/// execution (the paper's Figure 5): a random node either touches a random element, or
/// signals a random node's semaphore, or waits on its own when a token is due. Each
/// semaphore has one waiter, so no schedule can deadlock, yet which signal a wait
/// consumes depends on message timing: the detector must order each wait after exactly
/// the signal it consumed.
fn random_semaphore_races(s: &mut Sim, steps: usize, initial: u32) {
    let n = s.n;
    let sems: Vec<(u64, u32)> = (0..n).map(|x| (200 + x as u64, initial)).collect();
    s.semaphores(&sems);
    let mut tokens = vec![initial as usize; n];
    let len = s.allocs[0].len.min(8);
    for _ in 0..steps {
        let k = s.rand(n);
        match s.rand(4) {
            0 => {
                let x = s.rand(n);
                tokens[x] += 1;
                s.nodes[k].script.push_back(Op::SemSignal(200 + x as u64));
            }
            1 if tokens[k] > 0 => {
                tokens[k] -= 1;
                s.nodes[k].script.push_back(Op::SemWait(200 + k as u64));
            }
            _ => {
                let write = s.rand(2) == 0;
                let elem = s.rand(len);
                s.nodes[k].script.push_back(Op::Touch {
                    alloc: 0,
                    start: elem,
                    step: 1,
                    count: 1,
                    write,
                    rec: Rec::Each,
                });
            }
        }
    }
    for k in 0..n {
        s.nodes[k].script.push_back(Op::Finish);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(256), .. ProptestConfig::default() })]

    #[test]
    fn random_drf_semaphore_programs_are_sequentially_consistent(
        n in 2usize..6,
        pages in 1usize..4,
        home_seed in any::<u64>(),
        seed in any::<u64>(),
        vars in 2usize..6,
        hops in 1usize..12,
        race in any::<bool>(),
    ) {
        let homes: Vec<usize> = (0..pages).map(|p| ((home_seed >> (p * 3)) as usize) % n).collect();
        let mut s = sim_with(n, &[AllocSpec { elem: 8, homes }], vars, seed, race);
        random_semaphore_chain(&mut s, vars, hops);
        let program = s.program();
        s.run();
        if race {
            let counts = s.check_races(&program);
            prop_assert_eq!(counts.concurrent, 0);
            prop_assert!(s.races.is_empty());
        }
    }

    #[test]
    fn semaphore_race_reports_match_a_happens_before_oracle(
        n in 2usize..5,
        pages in 1usize..3,
        home_seed in any::<u64>(),
        seed in any::<u64>(),
        steps in 4usize..40,
        initial in 0u32..2,
    ) {
        let homes: Vec<usize> = (0..pages).map(|p| ((home_seed >> (p * 3)) as usize) % n).collect();
        let mut s = sim_with(n, &[AllocSpec { elem: 8, homes }], 1, seed, true);
        random_semaphore_races(&mut s, steps, initial);
        let program = s.program();
        s.run();
        s.check_races(&program);
    }
}

/// Two signals race for one wait: whichever the run pairs, the reader is ordered after
/// that signal only, so the write before the other signal races with the read exactly when
/// the other signal was the one consumed. Over many seeds both pairings occur.
#[test]
fn a_wait_is_ordered_after_its_own_signal_only() {
    let (mut raced, mut ordered) = (0, 0);
    for seed in 0..200u64 {
        let mut s = sim_with(
            3,
            &[AllocSpec {
                elem: 8,
                homes: vec![(seed % 3) as usize],
            }],
            1,
            seed * 7919 + 1,
            true,
        );
        s.semaphores(&[(5, 0)]);
        let w = |write| Op::Touch {
            alloc: 0,
            start: 3,
            step: 1,
            count: 1,
            write,
            rec: Rec::Each,
        };
        s.nodes[0]
            .script
            .extend([w(true), Op::SemSignal(5), Op::Finish]);
        s.nodes[1].script.extend([Op::SemSignal(5), Op::Finish]);
        s.nodes[2]
            .script
            .extend([Op::SemWait(5), w(false), Op::SemWait(5), Op::Finish]);
        let program = s.program();
        s.run();
        let counts = s.check_races(&program);
        let first_from_0 = s
            .delivered
            .iter()
            .any(|(from, to, m)| *from == 0 && *to == 2 && matches!(m, Msg::SemGrant { .. }))
            && !s
                .delivered
                .iter()
                .position(|(from, to, m)| {
                    *from == 1 && *to == 2 && matches!(m, Msg::SemGrant { .. })
                })
                .is_some_and(|p1| {
                    p1 < s
                        .delivered
                        .iter()
                        .position(|(from, to, m)| {
                            *from == 0 && *to == 2 && matches!(m, Msg::SemGrant { .. })
                        })
                        .unwrap()
                });
        if counts.concurrent > 0 {
            raced += 1;
            assert!(
                !first_from_0,
                "raced although paired with the writer's signal"
            );
            assert_eq!(s.races.len(), 1, "{:?}", s.races);
        } else {
            ordered += 1;
            assert!(s.races.is_empty());
        }
    }
    assert!(
        raced > 10 && ordered > 10,
        "raced {raced}, ordered {ordered}"
    );
}

#[test]
fn semaphore_misuse_is_a_clear_fatal_error() {
    let fatal = |outs: &[Output], want: &str| {
        assert!(
            outs.iter()
                .any(|o| matches!(o, Output::Fatal(m) if m.contains(want))),
            "wanted a fatal error with '{want}': {outs:?}"
        )
    };
    let mut eng = Engine::new(0, 2, 4, VecMemory::new(4), false);
    // Used before this node created it.
    fatal(
        &eng.on_command(Command::SemSignal { sem: 4, race: None }),
        "has not created",
    );
    fatal(
        &eng.on_peer_message(1, Msg::SemSignal { sem: 4, seq: 0 }),
        "has not created",
    );
    let outs = eng.on_command(Command::SemCreate { sem: 4, initial: 0 });
    assert!(matches!(&outs[..], [Output::Reply(Reply::Done)]));
    fatal(
        &eng.on_command(Command::SemCreate { sem: 4, initial: 0 }),
        "created twice",
    );
    // A forward naming a signal never made, a grant nobody asked for, bad vectors.
    fatal(
        &eng.on_peer_message(
            1,
            Msg::SemForward {
                sem: 4,
                seq: 9,
                waiter: 1,
                known: dsm_proto::VectorTime::zero(2),
            },
        ),
        "never made",
    );
    fatal(
        &eng.on_peer_message(
            1,
            Msg::SemGrant {
                sem: 4,
                signal: Some((1, 0)),
                known: dsm_proto::VectorTime::zero(2),
                intervals: Vec::new(),
            },
        ),
        "not waiting",
    );
    fatal(
        &eng.on_peer_message(
            1,
            Msg::SemWait {
                sem: 4,
                known: dsm_proto::VectorTime::zero(5),
                try_only: false,
            },
        ),
        "malformed",
    );
    // A peer lost while this node waits: the runtime is told (and stops the rank).
    let outs = eng.on_command(Command::SemWait {
        sem: 4,
        try_only: false,
        race: None,
    });
    assert!(
        outs.iter().all(|o| !matches!(o, Output::Reply(_))),
        "{outs:?}"
    );
    let outs = eng.on_peer_lost(1, "connection reset");
    assert!(
        outs.iter()
            .any(|o| matches!(o, Output::PeerLost(m) if m.contains("lost rank 1"))),
        "{outs:?}"
    );
}

#[test]
fn try_wait_takes_a_token_or_is_refused() {
    // Node 0 manages semaphore 2 (2 % 2 == 0) with one initial token.
    let mut eng = Engine::new(0, 2, 4, VecMemory::new(4), false);
    eng.on_command(Command::SemCreate { sem: 2, initial: 1 });
    let try_wait = |eng: &mut Engine<VecMemory>| {
        let outs = eng.on_command(Command::SemWait {
            sem: 2,
            try_only: true,
            race: None,
        });
        match &outs[..] {
            [Output::Reply(Reply::Sem(done))] => done.clone(),
            other => panic!("{other:?}"),
        }
    };
    let first = try_wait(&mut eng);
    assert!(first.acquired && first.signal.is_none());
    let second = try_wait(&mut eng);
    assert!(!second.acquired);
    // A signal makes a token; the next try-wait takes it, paired with that signal.
    eng.on_command(Command::SemSignal { sem: 2, race: None });
    let third = try_wait(&mut eng);
    assert!(third.acquired);
    assert_eq!(third.signal, Some((0, 0)));
}

/// The random semaphore race programs are not vacuous: across fixed seeds, conflicts
/// ordered only through semaphores occur as well as races.
#[test]
fn semaphore_race_programs_cover_races_and_ordered_conflicts() {
    let mut total = OracleCounts::default();
    for seed in 0..100u64 {
        let n = 2 + (seed % 3) as usize;
        let homes = vec![(seed % n as u64) as usize];
        let mut s = sim_with(n, &[AllocSpec { elem: 8, homes }], 1, mix(seed), true);
        random_semaphore_races(&mut s, 30, (seed % 2) as u32);
        let program = s.program();
        s.run();
        let c = s.check_races(&program);
        total.ordered += c.ordered;
        total.concurrent += c.concurrent;
    }
    assert!(total.ordered > 50 && total.concurrent > 50, "{total:?}");
}

// ---------------------------------------------------------------- data pushed with releases

/// Sets every node's push limit (the simulations otherwise pick one from the seed).
fn set_push(s: &mut Sim, pages: u32) {
    for node in &mut s.nodes {
        node.eng.set_push_limit(pages);
    }
}

/// Messages delivered so far, on every link, that `f` accepts.
fn delivered(s: &Sim, f: impl Fn(&Msg) -> bool) -> u64 {
    s.delivered.iter().filter(|(_, _, m)| f(m)).count() as u64
}

/// Sums a counter over the nodes.
fn total(s: &Sim, f: impl Fn(&dsm_core::engine::Stats) -> u64) -> u64 {
    s.nodes.iter().map(|n| f(n.eng.stats())).sum()
}

#[test]
fn a_grant_carries_the_page_the_acquirer_holds() {
    // Node 1 reads a page homed at node 0 (so node 0 knows it holds a copy); node 0 then
    // writes it in a critical section. Node 1's acquire gets the page with the grant: it
    // reads the new value without fetching. With pushing off it refetches.
    for (push, fetched, applied) in [(dsm_proto::config::DEFAULT_PUSH_PAGES, 1, 1), (0, 2, 0)] {
        let mut s = sim(2, &[0], 1, 11);
        set_push(&mut s, push);
        s.nodes[1].script.push_back(Op::Check(0));
        s.run();
        s.nodes[0]
            .script
            .extend([Op::Acquire(0), Op::Incr(0), Op::Release(0)]);
        s.run();
        s.nodes[1]
            .script
            .extend([Op::Acquire(0), Op::Check(0), Op::Release(0)]);
        s.run();
        let r = s.nodes[1].eng.stats().clone();
        assert_eq!(r.pages_fetched, fetched, "push {push}: {r:?}");
        assert_eq!(r.pushes_applied, applied, "push {push}: {r:?}");
        assert_eq!(r.invalidations, 1 - applied, "push {push}: {r:?}");
        assert_eq!(s.nodes[0].eng.stats().pages_pushed, applied);
        assert_eq!(s.model[0], 1);
    }
}

#[test]
fn grants_of_one_message_share_their_pushed_pages() {
    // Node 1 holds a copy of page 0 (homed at node 0); node 0 writes a variable of it under
    // each of three locks; node 1 asks for the three ahead and gets them in one message,
    // where only the first grant carries the page. Taking each lock, node 1 uses that
    // copy: no fetch and no invalidation after its first read.
    let mut s = sim(2, &[0], 3, 5);
    set_push(&mut s, dsm_proto::config::DEFAULT_PUSH_PAGES);
    s.var_addr = vec![8, 16, 24];
    s.nodes[1].script.push_back(Op::Check(0));
    s.run();
    for (v, l) in [(0, 2), (1, 4), (2, 6)] {
        s.nodes[0]
            .script
            .extend([Op::Acquire(l), Op::Incr(v), Op::Release(l)]);
    }
    s.run();
    s.nodes[1]
        .script
        .push_back(Op::PrefetchLocks(vec![2, 4, 6]));
    for (v, l) in [(0, 2), (1, 4), (2, 6)] {
        s.nodes[1]
            .script
            .extend([Op::Acquire(l), Op::Check(v), Op::Release(l)]);
    }
    s.run();
    let grants: Vec<&Vec<dsm_proto::Grant>> = s
        .delivered
        .iter()
        .filter_map(|(from, to, m)| match m {
            Msg::LockGrant { grants } if *from == 0 && *to == 1 => Some(grants),
            _ => None,
        })
        .collect();
    assert_eq!(grants.len(), 1, "{grants:?}");
    let with_pages: Vec<usize> = grants[0].iter().map(|g| g.pages.len()).collect();
    assert_eq!(with_pages, [1, 0, 0], "the page went more than once");
    let r = s.nodes[1].eng.stats().clone();
    assert_eq!((r.pages_fetched, r.invalidations), (1, 0), "{r:?}");
    assert_eq!(
        r.pushes_applied + r.pushes_rejected,
        s.nodes[0].eng.stats().pages_pushed
    );
    assert!(r.pushes_applied >= 1 && r.lock_acquires_local == 3, "{r:?}");
    assert_eq!(s.model, vec![1, 1, 1]);
}

#[test]
fn a_barrier_arrival_carries_the_homes_writes_to_its_readers() {
    // The SOR pattern: node 1 reads a row homed at node 0, node 0 rewrites it, a barrier,
    // node 1 reads it again. The all-to-all arrival brings the page.
    let mut s = sim(2, &[0, 1], 2, 3);
    set_push(&mut s, dsm_proto::config::DEFAULT_PUSH_PAGES);
    s.var_addr = vec![8, PAGE_SIZE + 8];
    for phase in 0..4 {
        s.nodes[1].script.push_back(Op::Check(0));
        s.nodes[0].script.push_back(Op::Check(1));
        for k in 0..2 {
            s.nodes[k].script.push_back(Op::Barrier);
        }
        // Each writes its own page, then both read the other's after a barrier.
        s.nodes[0].script.push_back(Op::Incr(0));
        s.nodes[1].script.push_back(Op::Incr(1));
        for k in 0..2 {
            s.nodes[k].script.push_back(Op::Barrier);
        }
        s.run();
        assert_eq!(s.model, vec![phase + 1, phase + 1]);
    }
    for k in 0..2 {
        let st = s.nodes[k].eng.stats();
        assert_eq!(
            st.pages_fetched, 1,
            "node {k}: only the first read fetches: {st:?}"
        );
        assert_eq!(st.pushes_applied, 4, "node {k}: {st:?}");
        assert_eq!(st.invalidations, 0, "node {k}: {st:?}");
    }
}

#[test]
fn a_push_without_the_acquirers_own_diff_is_refused() {
    // Node 1 writes a word of a page homed at node 0 (its diff goes to node 0 directly),
    // then acquires a lock that node 0 holds, through manager node 2. When the forwarded
    // request overtakes node 1's diff, node 0's pushed copy lacks node 1's own write:
    // installing it would lose that write, so node 1 must refuse it and fetch. Both
    // message orders occur over the seeds; the values are checked either way.
    let (mut applied, mut refused) = (0, 0);
    for seed in 0..300u64 {
        let mut s = sim(3, &[0], 2, seed);
        set_push(&mut s, dsm_proto::config::DEFAULT_PUSH_PAGES);
        s.var_addr = vec![8, 16];
        // Node 1 holds a copy; node 0 takes lock 2 (managed by node 2) first.
        s.nodes[1].script.push_back(Op::Check(0));
        s.nodes[0].script.push_back(Op::Acquire(2));
        s.run();
        s.nodes[1]
            .script
            .extend([Op::Incr(1), Op::Acquire(2), Op::Check(0), Op::Check(1)]);
        s.nodes[0].script.extend([Op::Incr(0), Op::Release(2)]);
        s.run();
        s.nodes[1].script.push_back(Op::Release(2));
        s.run();
        applied += s.nodes[1].eng.stats().pushes_applied;
        refused += s.nodes[1].eng.stats().pushes_rejected;
    }
    assert!(applied > 0, "no push was ever taken");
    assert!(refused > 0, "no push was ever refused");
}

#[test]
fn lock_hints_are_taken_and_passed_on_in_random_programs() {
    // The random race-free programs with their lock hints (`Sim::hint_locks`: exact,
    // wrong or none), race mode on and off: values match the sequential model and every
    // race oracle holds (checked by the simulation), while tokens come ahead and are
    // taken, come ahead and go on to a node that asked first, and are still on their way
    // when the acquire comes; requests, forwards and grants of several locks share
    // messages.
    let (mut asked, mut passed_on, mut awaited) = (0, 0, 0);
    let (mut local, mut merged) = (0, 0);
    for seed in 0..u64::from(cases(120)) {
        let n = 2 + (seed % 4) as usize;
        let homes: Vec<usize> = (0..3).map(|p| (seed as usize / 4 + p) % n).collect();
        let spec = AllocSpec { elem: 8, homes };
        let mut s = sim_with(n, &[spec], 6, seed, seed % 2 == 0);
        random_program(&mut s, 6, 3, 3, 4);
        s.run();
        merged += s
            .delivered
            .iter()
            .filter(|(_, _, m)| match m {
                Msg::LockRequest { locks, .. } | Msg::LockForward { locks, .. } => locks.len() > 1,
                Msg::LockGrant { grants } => grants.len() > 1,
                _ => false,
            })
            .count();
        asked += total(&s, |t| t.lock_tokens_asked_ahead);
        passed_on += total(&s, |t| t.lock_tokens_passed_on);
        local += total(&s, |t| t.lock_acquires_local);
        // Acquires that waited: each counted message delays.
        awaited += total(&s, |t| t.lock_acquire_delays);
    }
    assert!(asked > 0, "no token was asked for ahead");
    assert!(merged > 0, "no message carried several locks");
    assert!(
        passed_on > 0,
        "no token that came ahead went on to another node"
    );
    assert!(
        passed_on < asked && local > 0 && awaited > 0,
        "asked {asked}, passed on {passed_on}, local {local}, delays {awaited}"
    );
}

#[test]
fn pushes_are_taken_and_refused_in_random_programs() {
    // The random race-free programs of `random_drf_programs_are_sequentially_consistent`
    // with pushing at its default and at one page: values match the sequential model
    // (checked by the simulation) whichever way each push goes, and both ways occur.
    let (mut applied, mut refused, mut pushed, mut by_diffs) = (0, 0, 0, 0);
    let mut beside_arrivals = 0;
    for seed in 0..u64::from(cases(120)) {
        let n = 2 + (seed % 4) as usize;
        let homes: Vec<usize> = (0..3).map(|p| (seed as usize / 4 + p) % n).collect();
        let mut s = sim(n, &homes, 6, seed);
        set_push(&mut s, if seed % 2 == 0 { 1 } else { 32 });
        random_program(&mut s, 6, 2, 3, 4);
        s.run();
        applied += total(&s, |t| t.pushes_applied);
        refused += total(&s, |t| t.pushes_rejected);
        pushed += total(&s, |t| t.pages_pushed);
        by_diffs += total(&s, |t| t.pushes_applied_diffs);
        beside_arrivals += s
            .delivered
            .iter()
            .filter(|(_, _, m)| matches!(m, Msg::BarrierPush { .. }))
            .count();
    }
    assert!(
        applied > 0 && refused > 0,
        "applied {applied}, refused {refused}"
    );
    // Jobs of 5 nodes have barriers through the master, whose pushes go beside the
    // arrivals.
    assert!(
        beside_arrivals > 0,
        "no page was pushed beside a master barrier's arrival"
    );
    // Jobs of 3 to 5 nodes have pages homed at neither granter nor acquirer.
    assert!(
        by_diffs > 0,
        "no page was brought up to date by pushed diffs"
    );
    assert_eq!(applied + refused, pushed, "every push is taken or refused");
}

#[test]
fn a_malformed_push_is_a_clear_fatal_error() {
    // Page 0 is homed at node 0, page 1 at node 1. A push may only come from the page's
    // home, whole.
    let mut s = sim(2, &[0, 1], 1, 21);
    let fatal = |outs: &[Output]| {
        assert!(
            outs.iter()
                .any(|o| matches!(o, Output::Fatal(m) if m.contains("pushed a bad copy"))),
            "wanted a fatal error: {outs:?}"
        )
    };
    let push = |page: PageNo, len: usize| dsm_proto::PushedPage {
        page,
        data: vec![0; len],
        applied: Vec::new(),
    };
    let grant = |p| Msg::LockGrant {
        grants: vec![dsm_proto::Grant {
            lock: 1,
            known: dsm_proto::VectorTime::zero(2),
            intervals: Vec::new(),
            grant: 0,
            pages: vec![p],
            diffs: Vec::new(),
        }],
    };
    let eng = &mut s.nodes[0].eng;
    fatal(&eng.on_peer_message(1, grant(push(0, PAGE_SIZE))));
    fatal(&eng.on_peer_message(1, grant(push(1, 100))));
    fatal(&eng.on_peer_message(1, grant(push(9, PAGE_SIZE))));
    fatal(&eng.on_peer_message(
        1,
        Msg::BarrierArrive {
            epoch: 2,
            at: dsm_proto::SyncPoint::Barrier(2),
            known: dsm_proto::VectorTime::zero(2),
            intervals: Vec::new(),
            check: 0,
            finishing: false,
            bitmaps: Vec::new(),
            pages: vec![push(0, PAGE_SIZE)],
        },
    ));
}

#[test]
fn a_grant_carries_the_granters_diffs_of_a_third_nodes_page() {
    // The page is homed at node 2. Node 1 holds a copy; node 0 writes the page under a
    // lock and hands the lock to node 1, which gets node 0's diff with the grant and
    // applies it to its copy instead of refetching from node 2. With pushing off it
    // refetches.
    for (push, fetched, applied) in [(dsm_proto::config::DEFAULT_PUSH_PAGES, 1, 1), (0, 2, 0)] {
        let mut s = sim(3, &[2], 2, 13);
        set_push(&mut s, push);
        s.var_addr = vec![8, 16];
        s.nodes[1].script.push_back(Op::Check(0));
        s.run();
        s.nodes[0]
            .script
            .extend([Op::Acquire(5), Op::Incr(0), Op::Incr(1), Op::Release(5)]);
        s.run();
        s.nodes[1]
            .script
            .extend([Op::Acquire(5), Op::Check(0), Op::Check(1), Op::Release(5)]);
        s.run();
        let r = s.nodes[1].eng.stats().clone();
        assert_eq!(r.pages_fetched, fetched, "push {push}: {r:?}");
        assert_eq!(r.pushes_applied, applied, "push {push}: {r:?}");
        assert_eq!(r.pushes_applied_diffs, applied, "push {push}: {r:?}");
        assert_eq!(s.nodes[0].eng.stats().pages_pushed, applied);
        // Then everyone sees both writes after a barrier, node 2 (the home) included.
        for k in 0..3 {
            s.nodes[k]
                .script
                .extend([Op::Barrier, Op::Check(0), Op::Check(1)]);
        }
        s.run();
    }
}

#[test]
fn a_node_waits_for_the_race_master_to_absorb_its_batches() {
    let done = |outs: &[Output]| matches!(outs, [Output::Reply(Reply::Done)]);
    let mut eng = Engine::new(1, 2, 4, VecMemory::new(4), true);
    // Nothing absorbed yet: asking for zero batches answers at once, for two it waits.
    assert!(done(
        &eng.on_command(Command::AwaitRaceAbsorbed { batches: 0 })
    ));
    assert!(eng
        .on_command(Command::AwaitRaceAbsorbed { batches: 2 })
        .is_empty());
    assert!(eng
        .on_peer_message(0, Msg::RaceAbsorbed { batches: 1 })
        .is_empty());
    assert!(done(
        &eng.on_peer_message(0, Msg::RaceAbsorbed { batches: 3 })
    ));
    // An acknowledgement that goes backwards changes nothing; one already covered answers.
    assert!(eng
        .on_peer_message(0, Msg::RaceAbsorbed { batches: 2 })
        .is_empty());
    assert!(done(
        &eng.on_command(Command::AwaitRaceAbsorbed { batches: 3 })
    ));
    // Only the master analyses.
    let mut three = Engine::new(2, 3, 4, VecMemory::new(4), true);
    let outs = three.on_peer_message(1, Msg::RaceAbsorbed { batches: 1 });
    assert!(
        outs.iter()
            .any(|o| matches!(o, Output::Fatal(m) if m.contains("only rank 0"))),
        "{outs:?}"
    );
    // The master's count for itself needs no message; for another node it is one.
    let mut master = Engine::new(0, 2, 4, VecMemory::new(4), true);
    assert!(master
        .on_command(Command::AwaitRaceAbsorbed { batches: 1 })
        .is_empty());
    assert!(done(&master.on_command(Command::RaceAbsorbed {
        node: 0,
        batches: 1
    })));
    let outs = master.on_command(Command::RaceAbsorbed {
        node: 1,
        batches: 4,
    });
    assert!(
        matches!(
            &outs[..],
            [Output::Send {
                to: 1,
                msg: Msg::RaceAbsorbed { batches: 4 }
            }]
        ),
        "{outs:?}"
    );
}
