//! Algorithm 2 (expand): raise a safe order by what every state in which an operation has
//! just completed must also contain.
//!
//! For an *anchor* operation `e` (node `j`, position `c`), the reachable states in which `e`
//! has just completed (`e` last) are bounded below by a vector `v`; [`Search::bound`]
//! raises `v` with three rules, each sound on its own (see ARCHITECTURE.md for how they map
//! onto the paper's observations):
//!
//! 1. *closure*: a state holding an operation holds everything the current order puts
//!    before it, and, `e` being last, nothing the order puts after `e`;
//! 2. *counting* (Observations 1 and 3, with initial tokens): if the waits on a semaphore
//!    in `v` outnumber its initial tokens plus the most of them the signals in `v` can
//!    serve (a maximum matching; a signal the order puts after a wait cannot serve it, the
//!    anchor serves nobody), `k` more signals of it are in the state, so the state is at
//!    least the `k`-th smallest, per component, of the candidates' closed bounds;
//! 3. *case split* (Observations 2 and 4, chained): if a state needs one more signal of a
//!    semaphore, it holds the first such signal beyond `v` of some node; the state is at
//!    least the component-wise minimum, over those (at most one per node), of the bound
//!    of `v` plus that signal, searched again one level down.
//!
//! Depth `d >= 1` applies rules 1-2 to a fixpoint and `d - 1` levels of rule 3.

use crate::{leq, max_into, AnalysisError, Op, Order, Prefixes, Trace};
use std::collections::HashMap;

/// Above this many operations of one semaphore in a state, rule 2 counts tokens instead of
/// matching them (a weaker bound, linear instead of cubic; real epochs rarely get there).
const MATCH_LIMIT: u32 = 48;

/// How many of each node's last operations in a state rule 6 tests.
const RULE6_WINDOW: u32 = 32;

/// The least depth at which rule 8 (probing) runs: it multiplies the work by the nodes.
const PROBE_DEPTH: u32 = 2;

/// Rule 8 runs only for anchors with at most this many operations between their bound
/// and their caps (small traces always; large ones where little is in doubt).
const PROBE_WINDOW: u32 = 48;

/// Ranges of prefixes up to this long are scanned by rule 6; longer ones are bounded by
/// the maximum up to their end or from their start, whichever is less.
const EXACT_RANGE: u32 = 64;

/// How many of each node's last operations in a state rule 7 takes as `w`.
const RULE7_WINDOW: u32 = 8;

/// The least depth at which rule 10 (forced servers) runs: it solves a matching per wait
/// and candidate server, so it costs more than the rest of a state's rules together.
const FORCED_DEPTH: u32 = 3;

/// Rule 10 runs only while the anchor's caps hold at most this many operations: every
/// anchor of a Table 1 trace (at most 40), while on 100 operations a window of 96 took
/// depth 3 from about 40 ms to 20 s a trace.
const FORCED_WINDOW: u32 = 48;

/// Algorithm 2 on a safe order, to a fixpoint, at `depth` (0 leaves the order as it is).
pub(crate) fn expand(trace: &Trace, order: Order, depth: u32) -> Result<Order, AnalysisError> {
    if depth == 0 {
        return Ok(order);
    }
    let mut s = Search::new(trace, order);
    s.depth = depth;
    let n = trace.nodes();
    // Anchors in an order compatible with the current one (by the size of their bound),
    // so that one pass sees most raises before they are needed.
    let mut anchors: Vec<(usize, usize)> = (0..n)
        .flat_map(|j| (0..trace.events[j].len()).map(move |c| (j, c)))
        .collect();
    anchors.sort_by_key(|&(j, c)| (s.order[j][c].iter().sum::<u32>(), j, c));
    // An anchor's search reads only the bounds of operations within its caps, so it is
    // redone only if one of those changed since it last ran: `changed[i]` is the first
    // position of node `i` raised in the previous pass or this one.
    let mut changed_prev = vec![0u32; n];
    loop {
        let mut changed = refine(trace, &mut s.order, None).ok_or_else(|| {
            AnalysisError::Infeasible("a wait has no signal that could serve it".into())
        })?;
        for &(j, c) in &anchors {
            let mut v = s.order[j][c].clone();
            if c > 0 {
                max_into(&mut v, &s.order[j][c - 1]);
            }
            s.set_anchor((j, c as u32 + 1));
            let stale = (0..n).any(|i| changed_prev[i].min(changed[i]) < s.caps[i]);
            if !stale {
                continue;
            }
            s.prepare_reach();
            let v = s.bound(v, depth).ok_or_else(|| {
                AnalysisError::Infeasible(format!(
                    "operation {} of node {j} can never complete",
                    c + 1
                ))
            })?;
            let v = if depth >= PROBE_DEPTH {
                s.probe(v, depth)
            } else {
                v
            };
            if v != s.order[j][c] {
                s.order[j][c] = v;
                changed[j] = changed[j].min(c as u32);
            }
        }
        if changed.iter().all(|&c| c == u32::MAX) {
            return Ok(s.order);
        }
        changed_prev = changed;
    }
}

/// Rule 9 (servers): a wait on a semaphore without initial tokens follows, per component,
/// the earliest of the signals of it the order does not put after the wait (one of them
/// served it). Within `caps` (the operations a probed state may hold), only signals within
/// them count, and a wait none can serve is marked impossible by a bound beyond its
/// node's cap. Raises `order` to a fixpoint and returns, per node, the first position it
/// raised (`u32::MAX` if none); `None` if, without caps, some wait has no possible server.
fn refine(trace: &Trace, order: &mut Order, caps: Option<&[u32]>) -> Option<Vec<u32>> {
    let n = trace.nodes();
    let mut first = vec![u32::MAX; n];
    let mut servers: Vec<Vec<(usize, usize)>> = vec![Vec::new(); trace.initial.len()];
    for (j, evs) in trace.events.iter().enumerate() {
        let len = caps.map_or(evs.len(), |c| c[j] as usize);
        for (c, e) in evs[..len].iter().enumerate() {
            if e.op == Op::Signal {
                servers[e.sem].push((j, c));
            }
        }
    }
    loop {
        let mut changed = false;
        for j in 0..n {
            let len = caps.map_or(trace.events[j].len(), |c| c[j] as usize);
            for c in 0..len {
                let e = &trace.events[j][c];
                let mut v = order[j][c].clone();
                if c > 0 {
                    max_into(&mut v, &order[j][c - 1]);
                }
                if e.op == Op::Wait && trace.initial[e.sem] == 0 {
                    let mut m: Option<Vec<u32>> = None;
                    for &(i, p) in &servers[e.sem] {
                        let ts = &order[i][p];
                        if ts[j] > c as u32 {
                            continue;
                        }
                        match &mut m {
                            None => m = Some(ts.clone()),
                            Some(m) => m.iter_mut().zip(ts).for_each(|(a, &b)| *a = (*a).min(b)),
                        }
                    }
                    match (m, caps) {
                        (Some(m), _) => max_into(&mut v, &m),
                        (None, None) => return None,
                        (None, Some(caps)) => v[j] = v[j].max(caps[j] + 1),
                    }
                }
                if v != order[j][c] {
                    order[j][c] = v;
                    first[j] = first[j].min(c as u32);
                    changed = true;
                }
            }
        }
        if !changed {
            return Some(first);
        }
    }
}

/// How far nodes must be, as `(node, operations)`.
type Raise = Vec<(usize, u32)>;

/// The search for one anchor at a time over the current safe order.
struct Search<'a> {
    trace: &'a Trace,
    prefixes: Prefixes,
    order: Order,
    /// Per semaphore, per node: positions (0-based) of its signals.
    signal_at: Vec<Vec<Vec<u32>>>,
    /// The anchor: node and 1-based position.
    anchor: (usize, u32),
    /// Bounds already searched for this anchor, by closed vector and depth.
    memo: HashMap<(Vec<u32>, u32), Option<Vec<u32>>>,
    /// Per node, the most of its operations a state with the anchor last can hold (the
    /// anchor's node: up to the anchor; others: those the order does not put after it).
    caps: Vec<u32>,
    /// What rule 4 allows under the anchor's own bound as caps, with its signal counts:
    /// every cap rule 4 is asked about is above that bound, and rule 4 is monotone in
    /// the caps, so each run starts here instead of from nothing.
    reach_base: (Vec<u32>, Vec<i64>),
    /// Per node, per semaphore: the most net tokens (signals less waits) over the node's
    /// prefixes up to each length, and from each length on.
    net_max: Vec<Vec<(Vec<i64>, Vec<i64>)>>,
    /// Rule 7's result per wait for the current anchor (it does not depend on the state).
    best: HashMap<(usize, u32), Option<Raise>>,
    /// The depth of the whole expansion (rules 8 and 10 run only from some depth on).
    depth: u32,
}

impl<'a> Search<'a> {
    fn new(trace: &'a Trace, order: Order) -> Search<'a> {
        let mut signal_at = vec![vec![Vec::new(); trace.nodes()]; trace.initial.len()];
        for (j, evs) in trace.events.iter().enumerate() {
            for (c, e) in evs.iter().enumerate() {
                if e.op == Op::Signal {
                    signal_at[e.sem][j].push(c as u32);
                }
            }
        }
        let prefixes = Prefixes::new(trace);
        let net_max = (0..trace.nodes())
            .map(|i| {
                (0..trace.initial.len())
                    .map(|sem| {
                        let net: Vec<i64> = (0..=trace.events[i].len())
                            .map(|q| {
                                prefixes.signals[i][q][sem] as i64
                                    - prefixes.waits[i][q][sem] as i64
                            })
                            .collect();
                        let mut up = net.clone();
                        for q in 1..up.len() {
                            up[q] = up[q].max(up[q - 1]);
                        }
                        let mut down = net;
                        for q in (0..down.len().saturating_sub(1)).rev() {
                            down[q] = down[q].max(down[q + 1]);
                        }
                        (up, down)
                    })
                    .collect()
            })
            .collect();
        Search {
            trace,
            net_max,
            prefixes,
            order,
            signal_at,
            anchor: (0, 0),
            memo: HashMap::new(),
            caps: Vec::new(),
            reach_base: (Vec::new(), Vec::new()),
            best: HashMap::new(),
            depth: 0,
        }
    }

    fn set_anchor(&mut self, anchor: (usize, u32)) {
        let (j, c) = anchor;
        self.anchor = anchor;
        self.memo.clear();
        self.best.clear();
        self.caps = (0..self.trace.nodes())
            .map(|i| {
                if i == j {
                    c
                } else {
                    self.order[i].partition_point(|w| w[j] < c) as u32
                }
            })
            .collect();
    }

    /// Rule 4's starting point for the current anchor (see `reach_base`).
    fn prepare_reach(&mut self) {
        let (j, c) = self.anchor;
        self.reach_base = (
            vec![0; self.trace.nodes()],
            vec![0; self.trace.initial.len()],
        );
        let own = self.order[j][c as usize - 1].clone();
        self.reach_base = self.relaxed_reach(&own);
    }

    /// Rule 8 (probing): if no state with node `i` held at `v[i]` exists (the search
    /// under that cap finds none), every state has more of node `i`. The cap prunes the
    /// candidates of that node at once, so the search refutes what it could only bound.
    fn probe(&mut self, mut v: Vec<u32>, depth: u32) -> Vec<u32> {
        let caps = self.caps.clone();
        let window: u32 = caps.iter().zip(&v).map(|(c, x)| c - x).sum();
        if window > PROBE_WINDOW {
            return v;
        }
        for i in 0..v.len() {
            while i != self.anchor.0 && v[i] < caps[i] {
                self.caps[i] = v[i];
                let found = self.under_caps(|s| s.bound(v.clone(), depth).is_some());
                self.caps[i] = caps[i];
                if found {
                    break;
                }
                v[i] += 1;
                match self.bound(v.clone(), depth) {
                    Some(w) => v = w,
                    // Cannot happen: the unprobed search found a state.
                    None => break,
                }
            }
        }
        v
    }

    /// Runs `f` with the order refined by rule 9 within the current caps, then restores
    /// the order (a safe order of the whole trace is safe for the part within the caps,
    /// whose executions are prefixes of the trace's).
    fn under_caps<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let saved = self.order.clone();
        refine(self.trace, &mut self.order, Some(&self.caps));
        self.memo.clear();
        self.best.clear();
        let out = f(self);
        self.order = saved;
        self.memo.clear();
        self.best.clear();
        out
    }

    /// Rule 4 (relaxed reachability): the most of each node's operations some execution
    /// within `caps` could complete if waits never used tokens up, only needed them: a wait
    /// may complete once its semaphore's initial tokens and completed signals (the anchor
    /// excepted) number at least the waits on it the order puts before it, itself
    /// included. Every execution within `caps` completes only operations this allows (by
    /// induction along it: each wait's earlier waits consumed distinct earlier tokens),
    /// and the anchor is allowed only if every state above `v` it ends could be.
    fn relaxed_reach(&self, caps: &[u32]) -> (Vec<u32>, Vec<i64>) {
        let n = caps.len();
        let (mut done, mut signals) = self.reach_base.clone();
        loop {
            let mut progress = false;
            for i in 0..n {
                while done[i] < caps[i] {
                    let p = done[i] as usize;
                    let e = &self.trace.events[i][p];
                    match e.op {
                        Op::Signal => {
                            if (i, done[i] + 1) != self.anchor {
                                signals[e.sem] += 1;
                            }
                        }
                        Op::Wait => {
                            let tw = &self.order[i][p];
                            if tw.iter().zip(caps).any(|(a, b)| a > b) {
                                break;
                            }
                            let before: i64 = tw
                                .iter()
                                .enumerate()
                                .map(|(q, &k)| self.prefixes.waits[q][k as usize][e.sem] as i64)
                                .sum();
                            if self.trace.initial[e.sem] as i64 + signals[e.sem] < before {
                                break;
                            }
                        }
                    }
                    done[i] += 1;
                    progress = true;
                }
            }
            if !progress {
                return (done, signals);
            }
        }
    }

    /// Raises each component of `v` to the least cap under which rule 4 still allows all
    /// of `v`; `None` if even the anchor's caps do not.
    fn reach_bound(&self, mut v: Vec<u32>) -> Option<Vec<u32>> {
        let allows = |caps: &[u32], v: &[u32]| leq(v, &self.relaxed_reach(caps).0);
        if !allows(&self.caps, &v) {
            return None;
        }
        let mut caps = self.caps.clone();
        for i in 0..v.len() {
            if i == self.anchor.0 || v[i] >= caps[i] {
                continue;
            }
            let full = caps[i];
            caps[i] = v[i];
            if !allows(&caps, &v) {
                // The least cap that allows `v` lies in (v[i], full].
                let (mut lo, mut hi) = (v[i], full);
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    caps[i] = mid;
                    if allows(&caps, &v) {
                        hi = mid;
                    } else {
                        lo = mid;
                    }
                }
                v[i] = hi;
            }
            caps[i] = full;
        }
        Some(v)
    }

    /// Rule 1 to a fixpoint; `None` if no state with the anchor last is above `v`.
    fn close(&self, mut v: Vec<u32>) -> Option<Vec<u32>> {
        let (j, c) = self.anchor;
        loop {
            let mut changed = false;
            for i in 0..v.len() {
                if v[i] > self.caps[i] {
                    return None;
                }
                if v[i] == 0 {
                    continue;
                }
                let w = &self.order[i][v[i] as usize - 1];
                // Everything else in the state completed before the anchor.
                if (i, v[i]) != (j, c) && w[j] >= c {
                    return None;
                }
                if !leq(w, &v) {
                    max_into(&mut v, w);
                    changed = true;
                }
            }
            if v[j] > c || v.iter().zip(&self.caps).any(|(a, b)| a > b) {
                return None;
            }
            if !changed {
                return Some(v);
            }
        }
    }

    /// A lower bound of the states, with the anchor last, above `v`; `None` if there is
    /// none. `levels` is how many case splits (rule 3) may still be made.
    fn bound(&mut self, v: Vec<u32>, levels: u32) -> Option<Vec<u32>> {
        let mut v = self.close(v)?;
        // Rule 4 costs a run over the anchor's window per node; the last level of
        // candidates does without it.
        if levels > 0 {
            v = self.close(self.reach_bound(v)?)?;
        }
        if let Some(r) = self.memo.get(&(v.clone(), levels)) {
            return r.clone();
        }
        let r = self.bound_closed(v.clone(), levels);
        self.memo.insert((v, levels), r.clone());
        r
    }

    /// Rules 2 and 5 to a fixpoint, each candidate signal's bound searched `levels` deep.
    fn bound_closed(&mut self, mut v: Vec<u32>, levels: u32) -> Option<Vec<u32>> {
        loop {
            let mut changed = false;
            let raised = self.best_points(v.clone())?;
            let w = self.close(raised)?;
            if w != v {
                v = w;
                continue;
            }
            for sem in 0..self.trace.initial.len() {
                if let Some(raised) = self.count_raise(None, &v, sem, levels)? {
                    v = self.close(raised)?;
                    changed = true;
                }
            }
            if changed {
                continue;
            }
            // Rule 6: if a wait of the state could not get a token even with each other
            // node at its best point (below), a signal of its semaphore beyond the state
            // is in it too.
            if let Some(sem) = self.starved(&v) {
                let cands = self.candidates(&v, sem, 1);
                let bounds = self.cases(&v, &cands, levels);
                if bounds.is_empty() {
                    return None;
                }
                let m = min_k(&bounds, 1, v.len());
                if !leq(&m, &v) {
                    max_into(&mut v, &m);
                    v = self.close(v)?;
                    continue;
                }
            }
            // Rule 5: a state that cannot complete its own operations even by rule 4's
            // relaxation holds more: a signal beyond it of a semaphore one of its stuck
            // waits needs (extra waits feed nobody, and the first stuck wait to move
            // needs a new token of its own semaphore).
            let (reach, _) = self.relaxed_reach(&v);
            if leq(&v, &reach) {
                match self.forced_raise(&v, levels)? {
                    Some(w) => {
                        v = w;
                        continue;
                    }
                    None => return Some(v),
                }
            }
            let mut cands = Vec::new();
            for i in 0..v.len() {
                if reach[i] < v[i] {
                    let sem = self.trace.events[i][reach[i] as usize].sem;
                    for s in self.candidates(&v, sem, 1) {
                        if !cands.contains(&s) {
                            cands.push(s);
                        }
                    }
                }
            }
            let bounds = self.cases(&v, &cands, levels);
            if bounds.is_empty() {
                return None;
            }
            let m = min_k(&bounds, 1, v.len());
            if leq(&m, &v) {
                match self.forced_raise(&v, levels)? {
                    Some(w) => {
                        v = w;
                        continue;
                    }
                    None => return Some(v),
                }
            }
            max_into(&mut v, &m);
            v = self.close(v)?;
        }
    }

    /// Rule 10 (forced servers), once the other rules hold: raises `v` by what the serving
    /// of its waits forces. `None` if no state with the anchor last is above `v`;
    /// `Some(None)` if the rule adds nothing (or does not run at this depth or size).
    ///
    /// In a state `S >= v` reached by an execution `E` with the anchor last, every wait of
    /// `v` is served by its own signal of `S` (or initial token) that precedes it in `E`,
    /// so the servers of `v`'s waits are a matching of them into the signals within the
    /// caps (the anchor, last, serves nobody) along edges the order allows (the signal not
    /// after the wait). A wait that has the server `s` in some such matching covering all
    /// of `v`'s waits on its semaphore, and only those, follows the earliest of them: a
    /// *local* order, which holds for the operations of `S` in `E` (induction over its
    /// raises: each raise takes a minimum over a set holding the wait's server in `E`,
    /// and closure follows `E`). Local orders then raise `v` (the state holds what they
    /// put before its operations) and count tokens like rule 2, which, with the local
    /// order, no longer lets a signal serve a wait whose server must come after it.
    fn forced_raise(&mut self, v: &[u32], levels: u32) -> Option<Option<Vec<u32>>> {
        if self.depth < FORCED_DEPTH || self.caps.iter().sum::<u32>() > FORCED_WINDOW {
            return Some(None);
        }
        let local = self.forced_order(v)?;
        let mut w = v.to_vec();
        loop {
            let before = w.clone();
            for (i, ops) in local.iter().enumerate() {
                if w[i] > self.caps[i] {
                    return None;
                }
                for x in &ops[..w[i] as usize] {
                    max_into(&mut w, x);
                }
            }
            if w.iter().zip(&self.caps).any(|(a, b)| a > b) {
                return None;
            }
            if w == before {
                break;
            }
        }
        if w != v {
            return Some(Some(self.close(w)?));
        }
        for sem in 0..self.trace.initial.len() {
            if let Some(raised) = self.count_raise(Some(&local), &w, sem, levels)? {
                return Some(Some(self.close(raised)?));
            }
        }
        Some(None)
    }

    /// Rule 2's count on `sem` for the state `v`: the `k` tokens its waits on `sem` still
    /// need come from `k` signals beyond it, so a state above `v` holds at least the
    /// `k`-th smallest, per component, of the candidates' bounds. `local` is rule 10's
    /// order where it decides which signal can serve which wait, else the search's order
    /// does. `None` if fewer than `k` candidates are possible; `Some(None)` if the count
    /// raises nothing; else `v` raised (not closed).
    fn count_raise(
        &mut self,
        local: Option<&Order>,
        v: &[u32],
        sem: usize,
        levels: u32,
    ) -> Option<Option<Vec<u32>>> {
        let k = match local {
            Some(order) => self.need_in(order, v, sem),
            None => self.need(v, sem),
        };
        if k <= 0 {
            return Some(None);
        }
        let k = k as usize;
        let cands = self.candidates(v, sem, k);
        let bounds = self.cases(v, &cands, levels);
        if bounds.len() < k {
            return None;
        }
        let m = min_k(&bounds, k, v.len());
        if leq(&m, v) {
            return Some(None);
        }
        let mut raised = v.to_vec();
        max_into(&mut raised, &m);
        Some(Some(raised))
    }

    /// Rule 10's local order for the state `v` (see [`Search::forced_raise`]): the order
    /// raised, to a fixpoint, by the forced servers of `v`'s waits, and closed under the
    /// orderings it holds between operations within the caps. `None` if some semaphore's
    /// waits in `v` have no matching into their possible servers.
    fn forced_order(&self, v: &[u32]) -> Option<Order> {
        let n = v.len();
        let caps = &self.caps;
        let mut local: Order = (0..n)
            .map(|i| self.order[i][..caps[i] as usize].to_vec())
            .collect();
        loop {
            let mut changed = false;
            for sem in 0..self.trace.initial.len() {
                changed |= self.raise_by_forced_servers(v, sem, &mut local)?;
            }
            // Rule 7 with the local order, both ways: when a wait of `v` completes, each
            // other node is at a point whose net tokens cover the rest, so the local
            // order puts the wait after the first such point and the operation after the
            // last such point after the wait; no such point, no state.
            for (a, &va) in v.iter().enumerate() {
                for pw in 0..va {
                    if self.trace.events[a][pw as usize].op == Op::Wait {
                        changed |= self.raise_around_wait(v, a, pw, &mut local)?;
                    }
                }
            }
            changed |= self.close_order(&mut local);
            if !changed {
                return Some(local);
            }
        }
    }

    /// Raises `local` by the servers the waits on `sem` in `v` must have: each wait comes
    /// after what every server left to it in some saturating matching has in common.
    /// `None` if the waits have no matching into their possible servers; else whether
    /// `local` changed.
    fn raise_by_forced_servers(&self, v: &[u32], sem: usize, local: &mut Order) -> Option<bool> {
        let n = v.len();
        let caps = &self.caps;
        let mut changed = false;
        let mut waits = Vec::new();
        for (i, &vi) in v.iter().enumerate() {
            for p in 0..vi {
                let e = &self.trace.events[i][p as usize];
                if e.op == Op::Wait && e.sem == sem {
                    waits.push((i, p));
                }
            }
        }
        if waits.is_empty() {
            return Some(false);
        }
        // Servers: the initial tokens (`None`, before everything), then signals.
        let mut servers: Vec<Option<(usize, u32)>> = vec![None; self.trace.initial[sem] as usize];
        for (i, at) in self.signal_at[sem].iter().enumerate() {
            for &p in at.iter().take_while(|&&p| p < caps[i]) {
                if (i, p + 1) != self.anchor {
                    servers.push(Some((i, p)));
                }
            }
        }
        let allowed = |s: usize, w: usize| match servers[s] {
            None => true,
            Some((i, p)) => local[i][p as usize][waits[w].0] <= waits[w].1,
        };
        let serves: Vec<Vec<usize>> = (0..servers.len())
            .map(|s| (0..waits.len()).filter(|&w| allowed(s, w)).collect())
            .collect();
        if saturating(&serves, waits.len(), None) < waits.len() {
            return None;
        }
        for w in 0..waits.len() {
            let mut m: Option<Vec<u32>> = None;
            for s in 0..servers.len() {
                if !serves[s].contains(&w)
                    || saturating(&serves, waits.len(), Some((s, w))) < waits.len() - 1
                {
                    continue;
                }
                let Some((i, p)) = servers[s] else {
                    m = Some(vec![0; n]);
                    break;
                };
                let ts = &local[i][p as usize];
                match &mut m {
                    None => m = Some(ts.clone()),
                    Some(m) => m.iter_mut().zip(ts).for_each(|(a, &b)| *a = (*a).min(b)),
                }
            }
            let m = m.expect("a saturating matching gives every wait a server");
            let (i, p) = waits[w];
            if !leq(&m, &local[i][p as usize]) {
                max_into(&mut local[i][p as usize], &m);
                changed = true;
            }
        }
        Some(changed)
    }

    /// Rule 7 with the local order for the wait `pw` of node `a` (see
    /// [`Search::forced_order`]). `None` if no state lets the wait complete; else whether
    /// `local` changed.
    fn raise_around_wait(&self, v: &[u32], a: usize, pw: u32, local: &mut Order) -> Option<bool> {
        let n = v.len();
        let caps = &self.caps;
        let mut changed = false;
        let sem = self.trace.events[a][pw as usize].sem;
        let p = &self.prefixes;
        let net = |i: usize, q: u32| {
            p.signals[i][q as usize][sem] as i64 - p.waits[i][q as usize][sem] as i64
        };
        let (j, c) = self.anchor;
        let tw = local[a][pw as usize].clone();
        let is_anchor = (a, pw + 1) == (j, c);
        let mut ranges = vec![(0u32, 0u32); n];
        let mut best = vec![0i64; n];
        let mut total = self.trace.initial[sem] as i64 + net(a, pw + 1);
        for i in (0..n).filter(|&i| i != a) {
            let cap = if i == j && !is_anchor { c - 1 } else { caps[i] };
            let last = (0..cap)
                .find(|&q| local[i][q as usize][a] > pw)
                .unwrap_or(cap);
            let from = tw[i].min(last);
            ranges[i] = (from, last);
            best[i] = (from..=last).map(|q| net(i, q)).max().unwrap_or(0);
            total += best[i];
        }
        if total < 0 {
            return None;
        }
        for i in (0..n).filter(|&i| i != a) {
            let want = best[i] - total;
            let (from, last) = ranges[i];
            let ok = |q: &u32| net(i, *q) >= want;
            let lo = (from..=last).find(ok).unwrap_or(from);
            let hi = (from..=last).rev().find(ok).unwrap_or(last);
            let w = &mut local[a][pw as usize];
            if lo > w[i] {
                w[i] = lo;
                changed = true;
            }
            if hi < last {
                let mut m = local[a][pw as usize].clone();
                m[a] = m[a].max(pw + 1);
                let x = &mut local[i][hi as usize];
                if !leq(&m, x) {
                    max_into(x, &m);
                    changed = true;
                }
            }
        }
        Some(changed)
    }

    /// Closes `local`: an operation follows its predecessor and what its vector holds.
    /// Whether `local` changed.
    fn close_order(&self, local: &mut Order) -> bool {
        let n = local.len();
        let caps = &self.caps;
        let mut changed = false;
        for i in 0..n {
            for p in 0..caps[i] as usize {
                let mut x = local[i][p].clone();
                if p > 0 {
                    max_into(&mut x, &local[i][p - 1]);
                }
                for k in 0..n {
                    let q = x[k];
                    if k != i && q > 0 && q <= caps[k] {
                        let y = local[k][q as usize - 1].clone();
                        max_into(&mut x, &y);
                    }
                }
                if x != local[i][p] {
                    local[i][p] = x;
                    changed = true;
                }
            }
        }
        changed
    }

    /// Rule 7 (best points): for each recent wait `w` of `v`, the state in which `w` has
    /// just completed is below the final one; in it `w`'s node is at `w` and each other
    /// node somewhere between what the order puts before `w` and the last of its
    /// operations within the anchor's caps the order does not put after `w`. The
    /// semaphore's count there is at most its initial tokens plus `w`'s node's net
    /// contribution plus each other node's best one; if that is negative there is no such
    /// state, and otherwise each node must reach far enough for the others' best to
    /// cover the rest. `None` if some wait can never get its token.
    fn best_points(&mut self, mut v: Vec<u32>) -> Option<Vec<u32>> {
        let snapshot = v.clone();
        for (a, &va) in snapshot.iter().enumerate() {
            for pw in va.saturating_sub(RULE7_WINDOW)..va {
                if self.trace.events[a][pw as usize].op != Op::Wait {
                    continue;
                }
                let raise = match self.best.get(&(a, pw)) {
                    Some(r) => r.clone(),
                    None => {
                        let r = self.best_point(a, pw);
                        self.best.insert((a, pw), r.clone());
                        r
                    }
                };
                for (i, t) in raise? {
                    v[i] = v[i].max(t);
                }
            }
        }
        Some(v)
    }

    /// Rule 7 for the wait at 0-based position `pw` of node `a`: how far each other node
    /// must be, as `(node, operations)`; `None` if the wait can never get its token.
    fn best_point(&self, a: usize, pw: u32) -> Option<Raise> {
        let p = &self.prefixes;
        let (j, c) = self.anchor;
        let n = self.caps.len();
        let sem = self.trace.events[a][pw as usize].sem;
        let net = |i: usize, q: u32| {
            p.signals[i][q as usize][sem] as i64 - p.waits[i][q as usize][sem] as i64
        };
        let tw = &self.order[a][pw as usize];
        let is_anchor = (a, pw + 1) == (j, c);
        let mut ranges = vec![(0u32, 0u32); n];
        let mut best = vec![0i64; n];
        let mut total = self.trace.initial[sem] as i64 + net(a, pw + 1);
        for i in (0..n).filter(|&i| i != a) {
            let cap = if i == j && !is_anchor {
                c - 1
            } else {
                self.caps[i]
            };
            let last = self.order[i][..cap as usize].partition_point(|x| x[a] <= pw) as u32;
            let from = tw[i].min(last);
            ranges[i] = (from, last);
            best[i] = (from..=last).map(|q| net(i, q)).max().unwrap_or(0);
            total += best[i];
        }
        if total < 0 {
            return None;
        }
        let mut out = Vec::new();
        for i in (0..n).filter(|&i| i != a) {
            // Node `i` must reach a point whose net contribution is at least this.
            let want = best[i] - total;
            let (from, last) = ranges[i];
            let t = (from..=last).find(|&q| net(i, q) >= want).unwrap_or(last);
            if t > tw[i] {
                out.push((i, t));
            }
        }
        Some(out)
    }

    /// Rule 6's test: a semaphore of a wait `w` in `v` whose tokens would run out in every
    /// state where `w` has just completed and every node stays within `v`. In such a state
    /// `w`'s node is at `w` and each other node at some point between what the order puts
    /// before `w` and the last of its operations in `v` the order does not put after `w`;
    /// taking each node's best point (most signals less waits) independently bounds the
    /// semaphore's count from above. Only the last `RULE6_WINDOW` waits of each node are
    /// tested, which keeps the test linear in the state's recent operations.
    fn starved(&self, v: &[u32]) -> Option<usize> {
        let p = &self.prefixes;
        for (a, &va) in v.iter().enumerate() {
            for pw in va.saturating_sub(RULE6_WINDOW)..va {
                let w = &self.trace.events[a][pw as usize];
                if w.op != Op::Wait {
                    continue;
                }
                let sem = w.sem;
                let net = |i: usize, q: u32| {
                    p.signals[i][q as usize][sem] as i64 - p.waits[i][q as usize][sem] as i64
                };
                let tw = &self.order[a][pw as usize];
                let mut count = self.trace.initial[sem] as i64 + net(a, pw + 1);
                let (j, c) = self.anchor;
                for (i, &vi) in v.iter().enumerate() {
                    if i == a {
                        continue;
                    }
                    // The anchor comes after every other operation of the state.
                    let vi = if i == j { c - 1 } else { vi };
                    // Operations of node `i` the order does not put after `w`.
                    let last = self.order[i][..vi as usize].partition_point(|x| x[a] <= pw);
                    let from = tw[i].min(last as u32);
                    count += if last as u32 - from <= EXACT_RANGE {
                        (from..=last as u32).map(|q| net(i, q)).max().unwrap_or(0)
                    } else {
                        // Any range around it bounds the maximum from above.
                        self.net_max[i][sem].0[last].min(self.net_max[i][sem].1[from as usize])
                    };
                }
                if count < 0 {
                    return Some(sem);
                }
            }
        }
        None
    }

    /// The bound of `v` plus each candidate signal, searched `levels` deep (closure only
    /// at the last level); impossible cases are left out.
    fn cases(&mut self, v: &[u32], cands: &[(usize, u32)], levels: u32) -> Vec<Vec<u32>> {
        let mut bounds = Vec::new();
        for &(i, p) in cands {
            let mut w = v.to_vec();
            max_into(&mut w, &self.order[i][p as usize]);
            bounds.extend(if levels == 0 {
                self.close(w)
            } else {
                self.bound(w, levels - 1)
            });
        }
        bounds
    }

    /// The first `k` signals of `sem` beyond `v` on each node but the anchor's, as
    /// `(node, 0-based position)`: any `k` signals beyond `v` include, per node, a prefix
    /// of these.
    fn candidates(&self, v: &[u32], sem: usize, k: usize) -> Vec<(usize, u32)> {
        let mut out = Vec::new();
        for (i, at) in self.signal_at[sem].iter().enumerate() {
            if i == self.anchor.0 {
                continue;
            }
            let from = at.partition_point(|&p| p < v[i]);
            out.extend(at[from..].iter().take(k).map(|&p| (i, p)));
        }
        out
    }

    /// How many waits on `sem` in the state `v` signals outside it must serve (rule 2).
    fn need(&self, v: &[u32], sem: usize) -> i64 {
        self.need_in(&self.order, v, sem)
    }

    /// [`Search::need`] with `order` deciding which signal can serve which wait.
    fn need_in(&self, order: &Order, v: &[u32], sem: usize) -> i64 {
        let p = &self.prefixes;
        let (mut waits, mut signals) = (0i64, 0i64);
        for (i, &c) in v.iter().enumerate() {
            waits += p.waits[i][c as usize][sem] as i64;
            signals += p.signals[i][c as usize][sem] as i64;
        }
        let (j, c) = self.anchor;
        let anchor_op = &self.trace.events[j][c as usize - 1];
        if anchor_op.op == Op::Signal && anchor_op.sem == sem {
            signals -= 1;
        }
        let need = waits - self.trace.initial[sem] as i64;
        if need <= 0 {
            return need;
        }
        if waits + signals > MATCH_LIMIT as i64 {
            return need - signals;
        }
        need - self.matched(order, v, sem) as i64
    }

    /// The most waits on `sem` in `v` that signals in `v` can serve: a signal can serve a
    /// wait unless the order puts it after the wait (Kuhn's augmenting paths).
    fn matched(&self, order: &Order, v: &[u32], sem: usize) -> usize {
        let mut waits = Vec::new();
        let mut signals = Vec::new();
        for (i, &c) in v.iter().enumerate() {
            for (p, e) in self.trace.events[i][..c as usize].iter().enumerate() {
                if e.sem != sem {
                    continue;
                }
                match e.op {
                    Op::Wait => waits.push((i, p as u32)),
                    Op::Signal if (i, p as u32 + 1) != self.anchor => signals.push((i, p)),
                    Op::Signal => {}
                }
            }
        }
        // serves[s] = the waits signal s can serve.
        let serves: Vec<Vec<usize>> = signals
            .iter()
            .map(|&(i, p)| {
                let vs = &order[i][p];
                (0..waits.len())
                    .filter(|&w| vs[waits[w].0] <= waits[w].1)
                    .collect()
            })
            .collect();
        let mut served_by: Vec<Option<usize>> = vec![None; waits.len()];
        let mut matched = 0;
        for s in 0..signals.len() {
            let mut seen = vec![false; waits.len()];
            if augment(s, &serves, &mut served_by, &mut seen) {
                matched += 1;
            }
        }
        matched
    }
}

/// The size of a maximum matching of waits `0..waits` into servers (`serves[s]`: the
/// waits server `s` may serve), with `fixed = (s, w)` taken out of both sides.
fn saturating(serves: &[Vec<usize>], waits: usize, fixed: Option<(usize, usize)>) -> usize {
    let mut served_by: Vec<Option<usize>> = vec![None; waits];
    let mut matched = 0;
    let mut pruned;
    let serves = match fixed {
        None => serves,
        Some((fs, fw)) => {
            pruned = serves.to_vec();
            pruned[fs].clear();
            for s in &mut pruned {
                s.retain(|&w| w != fw);
            }
            &pruned[..]
        }
    };
    for s in 0..serves.len() {
        let mut seen = vec![false; waits];
        if augment(s, serves, &mut served_by, &mut seen) {
            matched += 1;
        }
    }
    matched
}

fn augment(
    s: usize,
    serves: &[Vec<usize>],
    served_by: &mut [Option<usize>],
    seen: &mut [bool],
) -> bool {
    for &w in &serves[s] {
        if seen[w] {
            continue;
        }
        seen[w] = true;
        let free = match served_by[w] {
            None => true,
            Some(other) => augment(other, serves, served_by, seen),
        };
        if free {
            served_by[w] = Some(s);
            return true;
        }
    }
    false
}

/// The k-th smallest (1-based) of each component.
pub(crate) fn min_k(vecs: &[Vec<u32>], k: usize, n: usize) -> Vec<u32> {
    let mut out = vec![0; n];
    let mut col = Vec::with_capacity(vecs.len());
    for (i, o) in out.iter_mut().enumerate() {
        col.clear();
        col.extend(vecs.iter().map(|v| v[i]));
        let (_, kth, _) = col.select_nth_unstable(k - 1);
        *o = *kth;
    }
    out
}
