//! The parallel branch and bound. Shared state (DSM allocations, named for race reports):
//!
//! - `bound`: the best tour length found so far (one `i64`, its own allocation so races
//!   on it are reported under its name). As in the original program, the search reads it
//!   **without a lock** for its prune tests (a deliberate read-write race that only
//!   delays pruning, never makes it wrong: the bound only decreases). It is written under
//!   the lock `tsp.bound`, after re-reading it under that lock, and only if the new tour is
//!   still better; `best_tour` is written under the same lock. With `locked_bound`, a node
//!   reads `bound` only under the lock (once per batch of work, and when it offers a tour)
//!   and prunes against a private copy in between: the race-free variant.
//! - `pool`: fixed-capacity records of partial tours (path prefix, length, lower bound),
//!   `queue`: a binary min-heap of (lower bound, pool slot) ordered best-first,
//!   `pool_meta`: heap length, free-slot stack, the count of busy nodes and the `done`
//!   flag. All three are touched only under the lock `tsp.queue`.
//! - `node_stats`: one row of counters per node, each written by its owner only, and
//!   `input_check`: one instance fingerprint per node, so nodes that read different
//!   inputs stop before sharing anything.
//!
//! Each node first offers a nearest-neighbour tour (from its own start city) as an
//! initial incumbent. Then a node takes a batch from the queue (one lock acquire also pushes the children of its
//! previous batch and updates the busy count). A tour with more than `depth_first`
//! unvisited cities is expanded by one city into children that go back to the queue; a
//! smaller one is solved depth-first privately (local `Vec`s and arrays, no shared
//! memory except the bound). Termination: a node that finds the heap empty while no node
//! is busy (busy = holds popped work or children not yet pushed) sets `done`; every node
//! stops at `done` or at that same observation, then the caller's barrier ends the search.
//!
//! Pool exhaustion: allocations are collective and fixed-size, so the pool cannot grow.
//! A child that finds no free slot stays with the node that made it, which solves it
//! depth-first itself (still counted busy, so termination stays correct): the search
//! gets less parallel but never fails or loops. The capacity is `--pool` or
//! [`default_pool`], which holds every tour the queue can ever contain at the given
//! threshold (so with the default threshold it never overflows).
//!
//! Lower bound (for pruning and for the queue order): for a partial tour ending at city
//! `c` with unvisited set `U`, the rest of the tour must leave `c` and every city of `U`
//! exactly once (each to a city of `U` or, for the last one, to city 0), and must enter
//! every city of `U` and city 0 exactly once. The bound is the current length plus the
//! larger of (sum of the cheapest allowed outgoing edges) and (sum of the cheapest
//! allowed incoming edges): a relaxation of the assignment bound. It is computed from
//! per-city neighbour lists sorted by weight; in the depth-first search, for all children
//! of a search node at once (one pass over `U`, then one list scan per child).

use super::{Instance, MAX_CITIES};
use bytemuck::{Pod, Zeroable};
use dsm_core::{Array, Distribution, Dsm, DsmError, View};
use std::cmp::Reverse;
use std::time::Duration;

/// The bound before any tour is known.
pub const NO_TOUR: i64 = i64::MAX;

const QUEUE_LOCK: &str = "tsp.queue";
const BOUND_LOCK: &str = "tsp.bound";

/// A partial tour: `cities` cities of `path` starting at city 0, of length `len`, and a
/// lower bound `lb` on every complete tour that extends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct Tour {
    pub len: i64,
    pub lb: i64,
    pub path: [u8; MAX_CITIES],
    pub cities: u32,
    pub _pad: u32,
}

impl Tour {
    fn visited(&self) -> u32 {
        self.path[..self.cities as usize]
            .iter()
            .fold(0, |m, &c| m | 1 << c)
    }

    fn last(&self) -> usize {
        self.path[self.cities as usize - 1] as usize
    }
}

/// A heap entry: the key (lower bound, then deeper first) and the pool slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
struct Entry {
    lb: i64,
    slot: u32,
    cities: u32,
}

impl Entry {
    fn key(&self) -> (i64, Reverse<u32>, u32) {
        (self.lb, Reverse(self.cities), self.slot)
    }
}

/// Search parameters.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Tours with at most this many unvisited cities are solved depth-first privately.
    pub depth_first: usize,
    /// Pool capacity (partial tours in the queue at once).
    pub pool: usize,
    /// Most tours a node takes per queue-lock acquire.
    pub batch: usize,
    /// Read the bound only under its lock (race-free variant).
    pub locked_bound: bool,
}

/// Default depth-first threshold: expand the first few levels through the queue (enough
/// subproblems to balance the load) and solve the rest privately.
pub fn default_depth_first(n: usize) -> usize {
    n.saturating_sub(4)
}

/// Largest default pool (records of 56 bytes).
pub const MAX_DEFAULT_POOL: usize = 1 << 16;

/// Default pool capacity: room for every partial tour the queue can ever hold with
/// threshold `depth_first` (the root and every path of up to `n - depth_first` cities:
/// only tours with more than `depth_first` unvisited cities are expanded), capped at
/// [`MAX_DEFAULT_POOL`]. With the default threshold the pool therefore never overflows.
pub fn default_pool(n: usize, depth_first: usize) -> usize {
    let deepest = n.saturating_sub(depth_first).max(1);
    let mut total = 0usize;
    let mut paths = 1usize;
    for cities in 1..=deepest {
        if cities > 1 {
            paths = paths.saturating_mul(n - cities + 1);
        }
        total = total.saturating_add(paths);
    }
    total.clamp(1, MAX_DEFAULT_POOL)
}
pub const DEFAULT_BATCH: usize = 8;

/// Per-node counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Queue tours expanded into children.
    pub expanded: u64,
    /// Subproblems solved depth-first.
    pub subproblems: u64,
    /// Of those, children kept because the pool was full.
    pub overflow: u64,
    /// Search-tree nodes visited depth-first.
    pub dfs_nodes: u64,
    /// Tours and children discarded by the bound.
    pub pruned: u64,
    /// Improvements this node wrote to the shared bound.
    pub improvements: u64,
    pub queue_locks: u64,
    pub bound_locks: u64,
    /// Queue visits that found no work (while other nodes were busy).
    pub idle: u64,
}

const STATS_FIELDS: usize = 9;

impl Stats {
    fn to_row(self) -> [u64; STATS_FIELDS] {
        [
            self.expanded,
            self.subproblems,
            self.overflow,
            self.dfs_nodes,
            self.pruned,
            self.improvements,
            self.queue_locks,
            self.bound_locks,
            self.idle,
        ]
    }

    fn from_row(r: &[u64]) -> Stats {
        Stats {
            expanded: r[0],
            subproblems: r[1],
            overflow: r[2],
            dfs_nodes: r[3],
            pruned: r[4],
            improvements: r[5],
            queue_locks: r[6],
            bound_locks: r[7],
            idle: r[8],
        }
    }

    pub fn add(&mut self, o: &Stats) {
        let mut a = self.to_row();
        for (x, y) in a.iter_mut().zip(o.to_row()) {
            *x += y;
        }
        *self = Stats::from_row(&a);
    }
}

/// Where the search looks up and offers the best tour length.
pub trait Incumbent {
    /// The length a tour must beat (the prune test).
    fn bound(&mut self) -> i64;
    /// Offers a complete tour of length `len` (which beat `bound()`).
    fn improve(&mut self, len: i64, path: &[u8]) -> Result<(), DsmError>;
}

/// A private incumbent, for the sequential search.
pub struct LocalBest {
    pub len: i64,
    pub tour: Vec<usize>,
}

impl Incumbent for LocalBest {
    fn bound(&mut self) -> i64 {
        self.len
    }

    fn improve(&mut self, len: i64, path: &[u8]) -> Result<(), DsmError> {
        if len < self.len {
            self.len = len;
            self.tour = path.iter().map(|&c| c as usize).collect();
        }
        Ok(())
    }
}

/// A node's private search machinery: the instance, neighbour lists sorted by weight
/// (for child order and for the lower bound), and the symmetric-tour rule.
pub struct Solver<'a> {
    inst: &'a Instance,
    all: u32,
    /// `out[i]`: every other city j with d(i, j), cheapest first.
    out: Vec<Vec<(u8, i64)>>,
    /// `inn[i]`: every other city j with d(j, i), cheapest first.
    inn: Vec<Vec<(u8, i64)>>,
    /// Symmetric instances list each tour in both directions; searching only the
    /// direction that visits city 1 before city 2 halves the work.
    one_before_two: bool,
}

impl<'a> Solver<'a> {
    pub fn new(inst: &'a Instance) -> Solver<'a> {
        let n = inst.n;
        let sorted = |f: &dyn Fn(usize) -> i64, i: usize| {
            let mut v: Vec<(u8, i64)> = (0..n)
                .filter(|&j| j != i)
                .map(|j| (j as u8, f(j)))
                .collect();
            v.sort_by_key(|&(j, w)| (w, j));
            v
        };
        Solver {
            inst,
            all: if n == 32 { u32::MAX } else { (1u32 << n) - 1 },
            out: (0..n).map(|i| sorted(&|j| inst.d(i, j), i)).collect(),
            inn: (0..n).map(|i| sorted(&|j| inst.d(j, i), i)).collect(),
            one_before_two: n >= 3 && inst.is_symmetric(),
        }
    }

    pub fn instance(&self) -> &Instance {
        self.inst
    }

    /// The tour holding only city 0.
    pub fn root(&self) -> Tour {
        let mut t = Tour::zeroed();
        t.cities = 1;
        t.lb = self.rest_bound(0, 1);
        t
    }

    #[inline]
    fn cheapest(list: &[(u8, i64)], allowed: u32) -> i64 {
        list.iter()
            .find(|&&(j, _)| allowed >> j & 1 != 0)
            .map_or(0, |&(_, w)| w)
    }

    /// Lower bound on the cost of completing a tour that ends at `last` having visited
    /// `visited` (see the module doc).
    pub fn rest_bound(&self, last: usize, visited: u32) -> i64 {
        let unv = self.all & !visited;
        if unv == 0 {
            return self.inst.close_cost(last);
        }
        let mut out = Self::cheapest(&self.out[last], unv);
        let mut inn = Self::cheapest(&self.inn[0], unv);
        let mut rest = unv;
        while rest != 0 {
            let u = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let me = !(1u32 << u);
            out += Self::cheapest(&self.out[u], (unv | 1) & me);
            inn += Self::cheapest(&self.inn[u], (unv | 1 << last) & me);
        }
        out.max(inn)
    }

    #[inline]
    fn may_visit(&self, c: u8, visited: u32) -> bool {
        !(self.one_before_two && c == 2 && visited & 2 == 0)
    }

    /// A nearest-neighbour tour that starts its greedy walk at `start`, rotated to
    /// begin at city 0, with its length.
    pub fn greedy_tour(&self, start: usize) -> (i64, Vec<u8>) {
        let n = self.inst.n;
        let mut walk = vec![start as u8];
        let mut visited = 1u32 << start;
        while walk.len() < n {
            let last = walk[walk.len() - 1] as usize;
            let next = self.out[last]
                .iter()
                .find(|&&(j, _)| visited >> j & 1 == 0)
                .map_or(0, |&(j, _)| j);
            visited |= 1 << next;
            walk.push(next);
        }
        let zero = walk.iter().position(|&c| c == 0).unwrap_or(0);
        walk.rotate_left(zero);
        let cities: Vec<usize> = walk.iter().map(|&c| c as usize).collect();
        (self.inst.tour_length(&cities), walk)
    }

    /// The children of `t` (one more city) whose lower bound is below `bound`, appended
    /// to `out`; returns how many were cut by the bound.
    pub fn expand(&self, t: &Tour, bound: i64, out: &mut Vec<Tour>) -> u64 {
        let visited = t.visited();
        let last = t.last();
        let mut cut = 0;
        for &(c, w) in &self.out[last] {
            if visited >> c & 1 != 0 || !self.may_visit(c, visited) {
                continue;
            }
            let len = t.len + w;
            let nv = visited | 1 << c;
            let lb = len + self.rest_bound(c as usize, nv);
            if lb >= bound {
                cut += 1;
                continue;
            }
            let mut child = *t;
            child.path[t.cities as usize] = c;
            child.cities += 1;
            child.len = len;
            child.lb = lb;
            out.push(child);
        }
        cut
    }

    /// Solves the subproblem `t` depth-first, offering every improving tour.
    pub fn solve(&self, t: &Tour, inc: &mut dyn Incumbent, st: &mut Stats) -> Result<(), DsmError> {
        let mut path = t.path;
        self.dfs(&mut path, t.cities as usize, t.visited(), t.len, inc, st)
    }

    fn dfs(
        &self,
        path: &mut [u8; MAX_CITIES],
        depth: usize,
        visited: u32,
        len: i64,
        inc: &mut dyn Incumbent,
        st: &mut Stats,
    ) -> Result<(), DsmError> {
        st.dfs_nodes += 1;
        let last = path[depth - 1] as usize;
        if visited == self.all {
            let total = len + self.inst.close_cost(last);
            if total < inc.bound() {
                inc.improve(total, &path[..depth])?;
            }
            return Ok(());
        }
        let unv = self.all & !visited;
        let cb = self.child_bounds(unv);
        for &(c, w) in &self.out[last] {
            if unv >> c & 1 == 0 || !self.may_visit(c, visited) {
                continue;
            }
            let nl = len + w;
            if nl + self.child_rest(&cb, c as usize, unv) >= inc.bound() {
                st.pruned += 1;
                continue;
            }
            path[depth] = c;
            self.dfs(path, depth + 1, visited | 1 << c, nl, inc, st)?;
        }
        Ok(())
    }

    /// The cheapest and second cheapest weights in `list` to an allowed city, and the
    /// city of the cheapest (the second is the first weight if only one is allowed).
    #[inline]
    fn cheapest_two(list: &[(u8, i64)], allowed: u32) -> (i64, u8, i64) {
        let mut hits = list.iter().filter(|&&(j, _)| allowed >> j & 1 != 0);
        let (a, w1) = hits.next().copied().unwrap_or((u8::MAX, 0));
        let w2 = hits.next().map_or(w1, |&(_, w)| w);
        (w1, a, w2)
    }

    /// What [`Solver::child_rest`] needs, computed once for all children of a search
    /// node with unvisited set `unv`, so that a child's bound costs one
    /// list scan instead of O(|unv|) of them. Moving to child c removes c from the
    /// targets of every outgoing edge (only cities whose cheapest target was c change:
    /// to their second cheapest), and removes `last` from the sources of every incoming
    /// edge (the same for all children).
    fn child_bounds(&self, unv: u32) -> ChildBounds {
        let mut cb = ChildBounds {
            out1: [0; MAX_CITIES],
            out_delta: [0; MAX_CITIES],
            inn1: [0; MAX_CITIES],
            out_sum: 0,
            inn_sum: 0,
            zero: Self::cheapest_two(&self.inn[0], unv),
        };
        let mut rest = unv;
        while rest != 0 {
            let u = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let me = !(1u32 << u);
            let (w1, a, w2) = Self::cheapest_two(&self.out[u], (unv | 1) & me);
            cb.out1[u] = w1;
            cb.out_sum += w1;
            if (a as usize) < MAX_CITIES {
                cb.out_delta[a as usize] += w2 - w1;
            }
            let w = Self::cheapest(&self.inn[u], unv & me);
            cb.inn1[u] = w;
            cb.inn_sum += w;
        }
        cb
    }

    /// [`Solver::rest_bound`] of the child that moves from a search node (described by
    /// `cb`, unvisited set `unv`) to city `c`.
    #[inline]
    fn child_rest(&self, cb: &ChildBounds, c: usize, unv: u32) -> i64 {
        let left = unv & !(1u32 << c);
        if left == 0 {
            return self.inst.close_cost(c);
        }
        let out = Self::cheapest(&self.out[c], left) + cb.out_sum - cb.out1[c] + cb.out_delta[c];
        let (z1, za, z2) = cb.zero;
        let inn = cb.inn_sum - cb.inn1[c] + if za as usize == c { z2 } else { z1 };
        out.max(inn)
    }
}

/// Per-search-node data for the children's bounds (see [`Solver::child_bounds`]).
struct ChildBounds {
    /// Cheapest outgoing edge of each unvisited city (to an unvisited city or 0).
    out1: [i64; MAX_CITIES],
    /// For each city c: how much the outgoing sum grows when c stops being a target.
    out_delta: [i64; MAX_CITIES],
    /// Cheapest incoming edge of each unvisited city from another unvisited city.
    inn1: [i64; MAX_CITIES],
    out_sum: i64,
    inn_sum: i64,
    /// Cheapest and second cheapest edge into city 0 from an unvisited city.
    zero: (i64, u8, i64),
}

/// The whole search on one node, with a private incumbent: the sequential version of
/// the algorithm (used by tests to check the bound and the pruning).
pub fn sequential(solver: &Solver) -> (i64, Vec<usize>, Stats) {
    let mut best = LocalBest {
        len: NO_TOUR,
        tour: Vec::new(),
    };
    let mut st = Stats::default();
    let root = solver.root();
    solver
        .solve(&root, &mut best, &mut st)
        .expect("a local incumbent cannot fail");
    (best.len, best.tour, st)
}

/// The shared allocations of the search.
pub struct Shared {
    n: usize,
    cap: usize,
    bound: Array<i64>,
    best_tour: Array<u32>,
    pool: Array<Tour>,
    queue: Array<Entry>,
    meta: Array<u32>,
    stats: Array<u64>,
}

// pool_meta layout.
const HEAP_LEN: usize = 0;
const FREE_LEN: usize = 1;
const NEXT_UNUSED: usize = 2;
const BUSY: usize = 3;
const DONE: usize = 4;
const FREE_STACK: usize = 8;

/// Collectively checks that every node read the same instance: each node writes the
/// fingerprint of its instance (0 if it could not read one) into its own slot of
/// `input_check`; after a barrier every node gets all of them, in rank order.
pub fn agree_on_input(dsm: &mut Dsm, fingerprint: u64) -> Result<Vec<u64>, DsmError> {
    let check = dsm.alloc_with::<u64>("input_check", dsm.size(), Distribution::OnNode(0))?;
    dsm.view(&check).set(dsm.rank(), fingerprint);
    dsm.barrier()?;
    let all = dsm.view(&check).to_vec();
    Ok(all)
}

/// Allocates the shared state (collective) and, on rank 0, puts the root tour in the
/// queue; ends with a barrier.
pub fn setup(dsm: &mut Dsm, solver: &Solver, cfg: &Config) -> Result<Shared, DsmError> {
    let n = solver.instance().n;
    let cap = cfg.pool.max(1);
    let here = Distribution::OnNode(0);
    let sh = Shared {
        n,
        cap,
        bound: dsm.alloc_with::<i64>("bound", 1, here)?,
        best_tour: dsm.alloc_with::<u32>("best_tour", n, here)?,
        pool: dsm.alloc::<Tour>("pool", cap)?,
        queue: dsm.alloc::<Entry>("queue", cap)?,
        meta: dsm.alloc_with::<u32>("pool_meta", FREE_STACK + cap, here)?,
        stats: dsm.alloc_with::<u64>("node_stats", dsm.size() * STATS_FIELDS, here)?,
    };
    // The heap length, busy count and `done` flag start at the allocation's zero fill
    // (`dsmrun --check` would otherwise report their first reads as uninitialised).
    dsm.assume_initialised(&sh.meta);
    dsm.assume_initialised(&sh.stats);
    if dsm.rank() == 0 {
        dsm.view(&sh.bound).set(0, NO_TOUR);
        let q = Queue::new(dsm, &sh);
        let pushed = q.push(&solver.root());
        debug_assert!(pushed, "an empty pool has room for the root");
    }
    dsm.barrier()?;
    Ok(sh)
}

/// The queue, pool and counters, seen through views taken under the queue lock.
struct Queue<'a> {
    heap: View<'a, Entry>,
    pool: View<'a, Tour>,
    meta: View<'a, u32>,
    cap: usize,
}

impl<'a> Queue<'a> {
    fn new(dsm: &'a Dsm, sh: &Shared) -> Queue<'a> {
        Queue {
            heap: dsm.view(&sh.queue),
            pool: dsm.view(&sh.pool),
            meta: dsm.view(&sh.meta),
            cap: sh.cap,
        }
    }

    fn len(&self) -> usize {
        self.meta.get(HEAP_LEN) as usize
    }

    fn top(&self) -> Option<Entry> {
        (self.len() > 0).then(|| self.heap.get(0))
    }

    fn take_slot(&self) -> Option<u32> {
        let free = self.meta.get(FREE_LEN);
        if free > 0 {
            self.meta.set(FREE_LEN, free - 1);
            return Some(self.meta.get(FREE_STACK + free as usize - 1));
        }
        let next = self.meta.get(NEXT_UNUSED);
        if (next as usize) < self.cap {
            self.meta.set(NEXT_UNUSED, next + 1);
            return Some(next);
        }
        None
    }

    fn free_slot(&self, slot: u32) {
        let free = self.meta.get(FREE_LEN);
        self.meta.set(FREE_STACK + free as usize, slot);
        self.meta.set(FREE_LEN, free + 1);
    }

    /// Adds `t`; false if the pool is full.
    fn push(&self, t: &Tour) -> bool {
        let Some(slot) = self.take_slot() else {
            return false;
        };
        self.pool.write_from(slot as usize, std::slice::from_ref(t));
        let e = Entry {
            lb: t.lb,
            slot,
            cities: t.cities,
        };
        let mut i = self.len();
        while i > 0 {
            let parent = (i - 1) / 2;
            let p = self.heap.get(parent);
            if p.key() <= e.key() {
                break;
            }
            self.heap.set(i, p);
            i = parent;
        }
        self.heap.set(i, e);
        self.meta.set(HEAP_LEN, self.len() as u32 + 1);
        true
    }

    /// Removes the best tour.
    fn pop(&self) -> Option<Tour> {
        let len = self.len();
        if len == 0 {
            return None;
        }
        let top = self.heap.get(0);
        let len = len - 1;
        self.meta.set(HEAP_LEN, len as u32);
        if len > 0 {
            let e = self.heap.get(len);
            let mut i = 0;
            loop {
                let l = 2 * i + 1;
                if l >= len {
                    break;
                }
                let mut c = l;
                let mut ce = self.heap.get(l);
                if l + 1 < len {
                    let r = self.heap.get(l + 1);
                    if r.key() < ce.key() {
                        c = l + 1;
                        ce = r;
                    }
                }
                if e.key() <= ce.key() {
                    break;
                }
                self.heap.set(i, ce);
                i = c;
            }
            self.heap.set(i, e);
        }
        let mut t = [Tour::zeroed()];
        self.pool.read_into(top.slot as usize, &mut t);
        self.free_slot(top.slot);
        Some(t[0])
    }

    /// Drops every queued tour (all slots become free).
    fn clear(&self) {
        self.meta.set(HEAP_LEN, 0);
        self.meta.set(FREE_LEN, 0);
        self.meta.set(NEXT_UNUSED, 0);
    }
}

/// The shared bound as the search sees it.
struct SharedBound<'d> {
    dsm: &'d mut Dsm,
    sh: &'d Shared,
    locked: bool,
    /// The smallest value of `bound` this node has seen (or written).
    known: i64,
    improvements: u64,
    locks: u64,
}

impl<'d> SharedBound<'d> {
    fn new(dsm: &'d mut Dsm, sh: &'d Shared, locked: bool, known: i64) -> Self {
        SharedBound {
            dsm,
            sh,
            locked,
            known,
            improvements: 0,
            locks: 0,
        }
    }

    /// Reads `bound` under its lock.
    fn refresh(&mut self) -> Result<(), DsmError> {
        let g = self.dsm.lock_named(BOUND_LOCK)?;
        self.locks += 1;
        let b = g.view(&self.sh.bound).get(0);
        g.unlock()?;
        self.known = self.known.min(b);
        Ok(())
    }
}

impl Incumbent for SharedBound<'_> {
    fn bound(&mut self) -> i64 {
        if !self.locked {
            // The unlocked read of the original program: racy by design.
            let b = self.dsm.view(&self.sh.bound).get(0);
            self.known = self.known.min(b);
        }
        self.known
    }

    fn improve(&mut self, len: i64, path: &[u8]) -> Result<(), DsmError> {
        let g = self.dsm.lock_named(BOUND_LOCK)?;
        self.locks += 1;
        let bound = g.view(&self.sh.bound);
        let cur = bound.get(0);
        if len < cur {
            bound.set(0, len);
            let tour: Vec<u32> = path.iter().map(|&c| c as u32).collect();
            g.view(&self.sh.best_tour).write_from(0, &tour);
            self.improvements += 1;
        }
        g.unlock()?;
        self.known = self.known.min(len).min(cur);
        Ok(())
    }
}

const MIN_BACKOFF: Duration = Duration::from_micros(100);
const MAX_BACKOFF: Duration = Duration::from_millis(4);

/// Runs this node's part of the search until the whole search is done. The caller ends
/// it with a barrier (after [`publish_stats`]).
pub fn run(dsm: &mut Dsm, sh: &Shared, solver: &Solver, cfg: &Config) -> Result<Stats, DsmError> {
    let n = sh.n;
    let size = dsm.size();
    let mut st = Stats::default();
    let mut known = NO_TOUR;
    let mut pending: Vec<Tour> = Vec::new();
    let mut work: Vec<Tour> = Vec::new();
    let mut kept: Vec<Tour> = Vec::new();
    let mut holding = false;
    let mut backoff = MIN_BACKOFF;
    {
        // A first incumbent for pruning: each node offers a nearest-neighbour tour from
        // its own start city, with the same protocol as every later improvement. Every
        // node's first synchronization after the setup barrier is this acquire of the
        // bound lock, so the first node to get it writes `bound` in an interval
        // concurrent with the other nodes' unlocked reads just before: with unlocked
        // reads the race on `bound` shows up in every run with 3 or more nodes, however
        // the nodes are scheduled.
        let mut inc = SharedBound::new(&mut *dsm, sh, cfg.locked_bound, known);
        let (len, tour) = solver.greedy_tour(inc.dsm.rank() % n);
        if len < inc.bound() {
            inc.improve(len, &tour)?;
        }
        known = inc.known;
        st.improvements += inc.improvements;
        st.bound_locks += inc.locks;
    }
    loop {
        let finished = {
            let g = dsm.lock_named(QUEUE_LOCK)?;
            st.queue_locks += 1;
            let q = Queue::new(&g, sh);
            for t in pending.drain(..) {
                if t.lb >= known {
                    st.pruned += 1;
                } else if !q.push(&t) {
                    kept.push(t);
                }
            }
            st.overflow += kept.len() as u64;
            // Best-first: once the best queued bound cannot win, no queued tour can.
            if q.top().is_some_and(|e| e.lb >= known) {
                st.pruned += q.len() as u64;
                q.clear();
            }
            if kept.is_empty() {
                let most = (q.len() / (2 * size)).clamp(1, cfg.batch.max(1));
                while work.len() < most {
                    let Some(top) = q.top() else { break };
                    let small = n - top.cities as usize <= cfg.depth_first;
                    // A tour to expand comes alone, so its children are back soon.
                    if !work.is_empty() && !small {
                        break;
                    }
                    work.extend(q.pop());
                    if !small {
                        break;
                    }
                }
            }
            let now = !work.is_empty() || !kept.is_empty();
            let busy = q.meta.get(BUSY) + now as u32 - holding as u32;
            q.meta.set(BUSY, busy);
            holding = now;
            let finished = if !now && q.len() == 0 && busy == 0 {
                q.meta.set(DONE, 1);
                true
            } else {
                q.meta.get(DONE) != 0
            };
            g.unlock()?;
            finished
        };
        if finished {
            break;
        }
        if !holding {
            st.idle += 1;
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
            continue;
        }
        backoff = MIN_BACKOFF;
        let mut inc = SharedBound::new(&mut *dsm, sh, cfg.locked_bound, known);
        if cfg.locked_bound {
            inc.refresh()?;
        }
        for t in kept.drain(..) {
            if t.lb < inc.bound() {
                st.subproblems += 1;
                solver.solve(&t, &mut inc, &mut st)?;
            } else {
                st.pruned += 1;
            }
        }
        for t in work.drain(..) {
            if t.lb >= inc.bound() {
                st.pruned += 1;
            } else if n - t.cities as usize <= cfg.depth_first {
                st.subproblems += 1;
                solver.solve(&t, &mut inc, &mut st)?;
            } else {
                st.expanded += 1;
                let b = inc.bound();
                st.pruned += solver.expand(&t, b, &mut pending);
            }
        }
        known = inc.known;
        st.improvements += inc.improvements;
        st.bound_locks += inc.locks;
    }
    Ok(st)
}

/// Writes this node's counters into its row of `node_stats` (before the final barrier).
pub fn publish_stats(dsm: &Dsm, sh: &Shared, st: &Stats) {
    dsm.view(&sh.stats)
        .write_from(dsm.rank() * STATS_FIELDS, &st.to_row());
}

/// The result, read after the barrier that ends the search.
pub struct Outcome {
    pub length: i64,
    pub tour: Vec<usize>,
    pub per_node: Vec<Stats>,
}

pub fn outcome(dsm: &Dsm, sh: &Shared) -> Outcome {
    let length = dsm.view(&sh.bound).get(0);
    let tour = dsm
        .view(&sh.best_tour)
        .to_vec()
        .into_iter()
        .map(|c| c as usize)
        .collect();
    let rows = dsm.view(&sh.stats).to_vec();
    Outcome {
        length,
        tour,
        per_node: rows.chunks(STATS_FIELDS).map(Stats::from_row).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tsp::heldkarp::{brute_force, held_karp};
    use crate::tsp::input::{random, SplitMix64};

    #[test]
    fn default_pool_holds_every_queued_tour() {
        // 19 cities, threshold 15: paths of 1..=4 cities: 1 + 18 + 18*17 + 18*17*16.
        assert_eq!(default_pool(19, 15), 1 + 18 + 306 + 4896);
        assert_eq!(default_pool(1, 0), 1);
        assert_eq!(default_pool(3, 0), 1 + 2 + 2);
        assert_eq!(default_pool(32, 0), MAX_DEFAULT_POOL);
    }

    #[test]
    fn greedy_tours_are_tours() {
        for n in 1..=9 {
            for asym in [false, true] {
                let inst = random(n, 77 + n as u64, asym);
                let s = Solver::new(&inst);
                for start in 0..n {
                    let (len, walk) = s.greedy_tour(start);
                    let tour: Vec<usize> = walk.iter().map(|&c| c as usize).collect();
                    assert!(inst.is_tour(&tour), "{tour:?}");
                    assert_eq!(inst.tour_length(&tour), len);
                    assert!(len >= held_karp(&inst));
                }
            }
        }
    }

    #[test]
    fn records_have_no_padding() {
        assert_eq!(std::mem::size_of::<Tour>(), 56);
        assert_eq!(std::mem::size_of::<Entry>(), 16);
    }

    #[test]
    fn sequential_search_is_exact() {
        for n in 1..=9 {
            for seed in 0..8 {
                for asym in [false, true] {
                    let inst = random(n, 1000 + seed, asym);
                    let solver = Solver::new(&inst);
                    let (len, tour, _) = sequential(&solver);
                    let want = brute_force(&inst);
                    assert_eq!(len, want, "n {n} seed {seed} asym {asym}");
                    assert!(inst.is_tour(&tour), "{tour:?}");
                    assert_eq!(inst.tour_length(&tour), len);
                }
            }
        }
    }

    #[test]
    fn bound_never_exceeds_the_optimum_of_the_rest() {
        // For every prefix of a random tiny instance, len + rest_bound <= best completion.
        let mut rng = SplitMix64::new(7);
        for trial in 0..40 {
            let n = 3 + trial % 5;
            let dist = (0..n * n).map(|_| rng.below(50) as i64).collect();
            let inst = Instance::new("b", n, dist);
            let s = Solver::new(&inst);
            let opt = held_karp(&inst);
            assert!(s.root().lb <= opt, "trial {trial}");
            // Every child bound of the root is at most the best tour through that child.
            let mut kids = Vec::new();
            s.expand(&s.root(), NO_TOUR, &mut kids);
            for k in kids {
                let mut best = LocalBest {
                    len: NO_TOUR,
                    tour: vec![],
                };
                s.solve(&k, &mut best, &mut Stats::default()).unwrap();
                assert!(k.lb <= best.len, "trial {trial}: {} > {}", k.lb, best.len);
            }
        }
    }

    #[test]
    fn child_bounds_match_the_direct_bound() {
        let mut rng = SplitMix64::new(11);
        for trial in 0..300 {
            let n = 2 + trial % 12;
            let asym = trial % 3 == 0;
            let inst = random(n, rng.next_u64(), asym);
            let s = Solver::new(&inst);
            // A random visited set containing 0 and a random last city in it.
            let all = (1u32 << n) - 1;
            let visited = (rng.next_u64() as u32 & all) | 1;
            let members: Vec<usize> = (0..n).filter(|&c| visited >> c & 1 != 0).collect();
            let last = members[rng.below(members.len() as u64) as usize];
            let unv = all & !visited;
            if unv == 0 {
                continue;
            }
            let cb = s.child_bounds(unv);
            for c in (0..n).filter(|&c| unv >> c & 1 != 0) {
                assert_eq!(
                    s.child_rest(&cb, c, unv),
                    s.rest_bound(c, visited | 1 << c),
                    "trial {trial} n {n} visited {visited:b} last {last} child {c}"
                );
            }
        }
    }

    #[test]
    fn larger_random_instances_match_held_karp() {
        for (n, seed, asym) in [(12, 3, false), (13, 4, true), (14, 5, false)] {
            let inst = random(n, seed, asym);
            let (len, _, _) = sequential(&Solver::new(&inst));
            assert_eq!(len, held_karp(&inst), "n {n}");
        }
    }
}
