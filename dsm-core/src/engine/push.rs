//! Releases that carry the data (the lazy hybrid idea of TreadMarks, home-based): a home
//! that hands a lock to a node, or arrives at an all-to-all barrier, sends along fresh
//! copies of its pages that the write notices the receiver is about to learn name and that
//! the receiver holds, so the receiver updates its copy instead of invalidating it and
//! faulting it back in from the home right after the acquire.
//!
//! The home knows who holds copies conservatively: every node it ever served a page to (or
//! pushed it to) is taken to hold it. A push to a node that dropped its copy costs a page
//! of bandwidth and nothing else: the receiver installs it only if it is complete.
//!
//! Acceptance is the receiver's decision and errs towards invalidation. A pushed page
//! carries, per writer other than the home, the latest interval whose diff the home had
//! applied when it made the copy (the home's own writes up to that moment are all in it).
//! The receiver installs it only if that covers every write notice it knows for the page
//! and has not seen in its copy (its `required` entries, which include the notices that
//! arrive with the push) and its own diffs of the page (which may still be on their way to
//! the home). Otherwise, or for a page no new notice names, the push is dropped and the
//! page is invalidated exactly as without pushing. Pushing is off with a limit of 0
//! (`DSM_PUSH=off`).
//!
//! A page homed at a third node (neither granter nor acquirer, so only in jobs of more
//! than 2 nodes) has no whole copy at the granter, only the granter's own diffs of it: the
//! granter keeps the diffs it made since the last barrier and sends those the grant's
//! notices name. The acquirer applies them to its copy only if the copy is valid and every
//! new notice naming the page is the granter's, with its diff there; the requirements stay
//! recorded (the home may not have those diffs yet when the page is next fetched).

use super::{Engine, Memory, PageState, Prot};
use crate::diff;
use dsm_proto::{Grant, IntervalRecord, NodeId, PageNo, PushedDiff, PushedPage, PAGE_SIZE};
use std::collections::BTreeMap;

/// Bytes of its own diffs a node keeps between barriers to push with grants; beyond it,
/// grants fall back to invalidation for the pages whose diffs were not kept.
const KEPT_DIFF_BYTES: usize = 4 << 20;

/// What came with a grant or a barrier's arrivals to bring copies up to date.
#[derive(Default, Debug)]
pub(super) struct Pushed {
    /// Whole pages from their homes.
    pub(super) pages: Vec<PushedPage>,
    /// Diffs of pages homed at third nodes, all made by `diffs_from`.
    pub(super) diffs: Vec<PushedDiff>,
    pub(super) diffs_from: NodeId,
    /// Came with a lock grant: newer than any barrier push still waiting here (the home's
    /// link is FIFO, and no later barrier can have begun while this node is outside its
    /// current one). Pushes taken at a barrier's release are not: what still waits then
    /// is for the next barrier.
    pub(super) with_grant: bool,
}

impl<M: Memory> Engine<M> {
    /// Sets the most pages pushed with one grant or arrival (0: pushing off).
    pub fn set_push_limit(&mut self, pages: u32) {
        self.push_limit = pages;
    }

    /// At the home, after serving or pushing `page` to `to`: `to` holds a copy.
    pub(super) fn note_copy(&mut self, page: PageNo, to: NodeId) {
        if let Some(bit) = 1u64.checked_shl(u32::from(to)) {
            *self.copies.entry(page).or_default() |= bit;
        }
    }

    /// At a non-home writer, when a diff of `page` from interval `interval` goes to the
    /// home: a pushed copy must contain it before it may replace the local one, and in
    /// jobs with third-party homes the diff is kept to push with grants.
    pub(super) fn note_own_diff(&mut self, page: PageNo, interval: u32, runs: &[u8]) {
        if self.push_limit == 0 {
            return;
        }
        self.own_diffs.insert(page, interval);
        if self.n > 2 && self.kept_diff_bytes + runs.len() <= KEPT_DIFF_BYTES {
            self.kept_diff_bytes += runs.len();
            self.kept_diffs
                .entry(page)
                .or_default()
                .push((interval, runs.to_vec()));
        }
    }

    /// This node's kept diffs of the pages its own intervals among `intervals` name that
    /// are homed neither here nor at `to`: every diff of such a page the intervals name,
    /// or none of it. At most the push limit less `pages_taken` pages.
    pub(super) fn diffs_for(
        &mut self,
        to: NodeId,
        intervals: &[IntervalRecord],
        pages_taken: usize,
    ) -> Vec<PushedDiff> {
        if self.push_limit == 0 || self.kept_diffs.is_empty() {
            return Vec::new();
        }
        let me = self.me;
        let mut wanted: BTreeMap<PageNo, Vec<u32>> = BTreeMap::new();
        for r in intervals.iter().filter(|r| r.node == me) {
            for p in r.writes.iter() {
                let third = self
                    .pages
                    .get(p as usize)
                    .is_some_and(|e| e.home != me && e.home != to);
                if third {
                    wanted.entry(p).or_default().push(r.index);
                }
            }
        }
        let budget = (self.push_limit as usize).saturating_sub(pages_taken);
        let mut out = Vec::new();
        let mut pages = 0;
        for (p, indices) in wanted {
            if pages == budget {
                break;
            }
            let Some(kept) = self.kept_diffs.get(&p) else {
                continue;
            };
            let found: Option<Vec<&(u32, Vec<u8>)>> = indices
                .iter()
                .map(|&i| kept.iter().find(|(k, _)| *k == i))
                .collect();
            let Some(found) = found else { continue };
            out.extend(found.into_iter().map(|(interval, runs)| PushedDiff {
                page: p,
                interval: *interval,
                runs: runs.clone(),
            }));
            pages += 1;
        }
        self.stats.pages_pushed += pages as u64;
        out
    }

    /// Checks the shape of diffs pushed by `from`: valid encodings of pages homed at a
    /// third node.
    pub(super) fn pushed_diffs_well_formed(&mut self, from: NodeId, diffs: &[PushedDiff]) -> bool {
        for d in diffs {
            let ok = from != self.me
                && self
                    .pages
                    .get(d.page as usize)
                    .is_some_and(|e| e.home != from && e.home != self.me)
                && diff::validate(&d.runs).is_ok();
            if !ok {
                self.fatal(format!(
                    "rank {from} pushed a bad diff of page {} ({} bytes)",
                    d.page,
                    d.runs.len()
                ));
                return false;
            }
        }
        true
    }

    /// The pages homed here among `pages` that `to` holds a copy of, up to the push limit,
    /// as copies to send now. Each is write-protected first (as when serving), so the
    /// home's next write faults and makes the write notice that will reach `to`.
    pub(super) fn pushes_for(
        &mut self,
        to: NodeId,
        pages: impl IntoIterator<Item = PageNo>,
    ) -> Vec<PushedPage> {
        if self.push_limit == 0 {
            return Vec::new();
        }
        let Some(bit) = 1u64
            .checked_shl(u32::from(to))
            .filter(|_| !self.is_host_mate(to))
        else {
            return Vec::new();
        };
        let mut chosen: Vec<PageNo> = pages
            .into_iter()
            .filter(|&p| {
                (p as usize) < self.pages.len()
                    && self.is_home(p)
                    && self.copies.get(&p).is_some_and(|m| m & bit != 0)
            })
            .collect();
        chosen.sort_unstable();
        chosen.dedup();
        chosen.truncate(self.push_limit as usize);
        let mut writable: Vec<PageNo> = chosen
            .iter()
            .copied()
            .filter(|&p| self.pages[p as usize].state == PageState::ReadWrite)
            .collect();
        self.protect_runs(&mut writable, Prot::Read);
        for &p in &writable {
            self.set_state(p, PageState::ReadOnly);
        }
        let mut out = Vec::with_capacity(chosen.len());
        for p in chosen {
            self.mark_shared(p, 1);
            let mut data = vec![0u8; PAGE_SIZE];
            self.mem.read_page(p, &mut data);
            let applied = self.applied_in_copy(p);
            out.push(PushedPage {
                page: p,
                data,
                applied,
            });
        }
        self.stats.pages_pushed += out.len() as u64;
        out
    }

    /// Whether pushes that came with barrier arrivals, or beside them to a master barrier,
    /// wait here for the barrier's release (see [`Engine::drop_older_pushes`]).
    pub(super) fn pushes_await_barrier(&self) -> bool {
        !self.arrivals.is_empty() || !self.master_pushes.is_empty()
    }

    /// A copy of `pages` just arrived from their home `from` (fetched, or pushed with a
    /// lock grant). Pushes of those pages that `from` sent with a barrier arrival (or
    /// beside one, to a master barrier) still waiting here for the barrier's release are
    /// older than that copy (the link is FIFO), and may lack diffs the copy has and this
    /// node already knew of (whose notices will not come again): they are dropped.
    pub(super) fn drop_older_pushes(&mut self, from: NodeId, pages: &[PageNo]) {
        let mut dropped = 0;
        for slots in self.arrivals.values_mut() {
            if let Some(Some(a)) = slots.get_mut(from as usize) {
                let before = a.pages.len();
                a.pages.retain(|q| !pages.contains(&q.page));
                dropped += before - a.pages.len();
            }
        }
        // Only a page's home pushes it: these came from `from` too.
        for waiting in self.master_pushes.values_mut() {
            let before = waiting.len();
            waiting.retain(|q| !pages.contains(&q.page));
            dropped += before - waiting.len();
        }
        self.stats.pushes_rejected += dropped as u64;
    }

    /// All-to-all barrier arrival to `to`: the pages homed here that this node wrote in
    /// the epoch, in intervals `to` has not been told of by a lock grant, and that `to`
    /// holds, so it need not fault them back in after the barrier.
    pub(super) fn barrier_pushes_for(&mut self, to: NodeId) -> Vec<PushedPage> {
        let own = &self.log[self.me as usize];
        let told = self.told[to as usize];
        let start = own.partition_point(|r| r.index <= told);
        let written = self.home_pages_named(&own[start..]);
        self.pushes_for(to, written)
    }

    /// The pages homed here that `intervals`' write notices name.
    pub(super) fn home_pages_named(&self, intervals: &[IntervalRecord]) -> Vec<PageNo> {
        let mut pages: Vec<PageNo> = intervals
            .iter()
            .flat_map(|r| r.writes.iter())
            .filter(|&p| (p as usize) < self.pages.len() && self.is_home(p))
            .collect();
        pages.sort_unstable();
        pages.dedup();
        pages
    }

    /// Checks the shape of pages pushed by `from`: whole pages, homed at the sender.
    pub(super) fn pushes_well_formed(&mut self, from: NodeId, pushed: &[PushedPage]) -> bool {
        for p in pushed {
            let ok = (p.page as usize) < self.pages.len()
                && self.pages[p.page as usize].home == from
                && from != self.me
                && p.data.len() == PAGE_SIZE;
            if !ok {
                self.fatal(format!(
                    "rank {from} pushed a bad copy of page {} ({} bytes)",
                    p.page,
                    p.data.len()
                ));
                return false;
            }
        }
        true
    }

    /// Whether a pushed copy holds every change this node must see in `page`: each write
    /// notice it learned since its copy was made, and its own diffs.
    fn push_covers(&self, page: PageNo, push: &PushedPage) -> bool {
        let has = |writer: NodeId, interval: u32| {
            push.applied
                .iter()
                .any(|&(w, i)| w == writer && i >= interval)
        };
        let notices = self
            .required
            .get(&page)
            .into_iter()
            .flatten()
            .all(|&(w, i)| has(w, i));
        let own = self.own_diffs.get(&page).is_none_or(|&i| has(self.me, i));
        notices && own
    }

    /// Installs the pushed copies (and applies the pushed diffs) among `pushed` that bring
    /// a page fully up to date (see the module doc), for pages in `named` (pages new write
    /// notices name, not homed here; `fresh` lists those notices), and returns the pages
    /// still to invalidate. Runs after the notices' requirements have been recorded.
    /// Drops `pushed` unused (it came with a grant that was passed on, or before a
    /// barrier): counted as refused, as [`Engine::take_pushes`] counts what it drops.
    pub(super) fn refuse_pushes(&mut self, pushed: &Pushed) {
        let mut diff_pages: Vec<PageNo> = pushed.diffs.iter().map(|d| d.page).collect();
        diff_pages.sort_unstable();
        diff_pages.dedup();
        self.stats.pushes_rejected += (pushed.pages.len() + diff_pages.len()) as u64;
    }

    /// Records that a copy of `page` holding the diffs `applied` was installed here.
    pub(super) fn note_copy_installed(&mut self, page: PageNo, applied: Vec<(NodeId, u32)>) {
        self.copy_holds.insert(page, applied);
        self.copies_installed += 1;
        self.copy_installed_at.insert(page, self.copies_installed);
    }

    /// The pushes of a grant that came ahead of its acquire (`LockState::early_grant`),
    /// less the copies of pages installed here since it came (`installs_before`): those
    /// copies came later from the same home, over the same link, so they are newer, and
    /// laying the older copy over one would undo writes this node has seen (the
    /// requirements the newer copy met are gone, so `push_covers` cannot tell).
    pub(super) fn drop_superseded_copies(
        &mut self,
        mut pushed: Pushed,
        installs_before: u64,
    ) -> Pushed {
        let before = pushed.pages.len();
        pushed.pages.retain(|c| {
            self.copy_installed_at
                .get(&c.page)
                .is_none_or(|&at| at <= installs_before)
        });
        self.stats.pushes_rejected += (before - pushed.pages.len()) as u64;
        pushed
    }

    pub(super) fn take_pushes(
        &mut self,
        named: Vec<PageNo>,
        pushed: Pushed,
        fresh: &[(PageNo, NodeId, u32)],
    ) -> Vec<PageNo> {
        let Pushed {
            pages: mut copies,
            mut diffs,
            diffs_from,
            with_grant,
        } = pushed;
        if copies.is_empty() && diffs.is_empty() {
            return named.into_iter().filter(|&p| self.holds_copy(p)).collect();
        }
        copies.sort_by_key(|p| p.page);
        diffs.sort_by_key(|d| (d.page, d.interval));
        let mut diff_pages: Vec<PageNo> = diffs.iter().map(|d| d.page).collect();
        diff_pages.dedup();
        let offered = (copies.len() + diff_pages.len()) as u64;
        let applied_before = self.stats.pushes_applied;
        let mut invalidate = Vec::new();
        let mut installed = Vec::new();
        for p in named {
            if self.is_host_page(p) {
                // The host's one copy: nothing pushed may be laid over it, and the home
                // confirms the diffs when the page is next accessed.
                if self.holds_copy(p) {
                    invalidate.push(p);
                }
                continue;
            }
            let copy = copies
                .binary_search_by_key(&p, |q| q.page)
                .ok()
                .map(|i| &copies[i]);
            let first = diffs.partition_point(|d| d.page < p);
            let end = diffs.partition_point(|d| d.page <= p);
            let page_diffs = &diffs[first..end];
            match copy {
                Some(copy) if self.push_covers(p, copy) => {
                    self.mem.write_page(p, &copy.data);
                    self.note_copy_installed(p, copy.applied.clone());
                    self.required.remove(&p);
                    // As after a fetch: a barrier push of the page from the same home
                    // still waiting here is older, and its requirements just went.
                    if with_grant && self.pushes_await_barrier() {
                        self.drop_older_pushes(self.pages[p as usize].home, &[p]);
                    }
                    if self.pages[p as usize].state == PageState::Invalid {
                        self.set_state(p, PageState::ReadOnly);
                        installed.push(p);
                    }
                    self.stats.pushes_applied += 1;
                }
                _ if !page_diffs.is_empty()
                    && self.pages[p as usize].state == PageState::ReadOnly
                    && fresh.iter().filter(|&&(q, _, _)| q == p).all(|&(_, w, i)| {
                        w == diffs_from && page_diffs.iter().any(|d| d.interval == i)
                    }) =>
                {
                    // The copy held everything before these notices; the granter's diffs
                    // (disjoint from other writers' bytes, or ordered after them) bring
                    // it up to them. The requirements stay: the home may lack the diffs.
                    // A diff the copy holds already (it came from the home after the
                    // home applied it) is passed over: the copy may also hold later
                    // writes to the same bytes, which laying it again would undo.
                    let holds = self.copy_holds.entry(p).or_default();
                    let held = holds
                        .iter()
                        .find(|(w, _)| *w == diffs_from)
                        .map_or(0, |&(_, i)| i);
                    for d in page_diffs.iter().filter(|d| d.interval > held) {
                        self.mem.apply_diff(p, &d.runs);
                    }
                    let newest = page_diffs.iter().map(|d| d.interval).max().unwrap_or(0);
                    match holds.iter_mut().find(|(w, _)| *w == diffs_from) {
                        Some((_, i)) => *i = (*i).max(newest),
                        None => holds.push((diffs_from, newest)),
                    }
                    self.stats.pushes_applied += 1;
                    self.stats.pushes_applied_diffs += 1;
                }
                _ => {
                    if self.holds_copy(p) {
                        invalidate.push(p);
                    }
                }
            }
        }
        self.protect_runs(&mut installed, Prot::Read);
        // Pushes not taken: incomplete, or for pages no new notice named.
        self.stats.pushes_rejected += offered - (self.stats.pushes_applied - applied_before);
        invalidate
    }

    fn holds_copy(&self, page: PageNo) -> bool {
        matches!(
            self.pages[page as usize].state,
            PageState::ReadOnly | PageState::ReadWrite
        )
    }
}

/// Drops from `grant` the pushed copies and diffs that an earlier grant of the same message
/// carries already (they were made in the same event, so they are the same):
/// [`share_grant_pushes`] gives them back at the receiver.
pub(super) fn drop_shared_pushes(earlier: &[Grant], grant: &mut Grant) {
    grant.pages.retain(|p| {
        !earlier
            .iter()
            .any(|g| g.pages.iter().any(|q| q.page == p.page))
    });
    grant.diffs.retain(|d| {
        !earlier.iter().any(|g| {
            g.diffs
                .iter()
                .any(|x| x.page == d.page && x.interval == d.interval)
        })
    });
}

/// At the receiver of several grants in one message: gives each grant the copies and
/// diffs of the pages its intervals name that an earlier grant of the message carries
/// (see [`drop_shared_pushes`]).
pub(super) fn share_grant_pushes(grants: &mut [Grant]) {
    for i in 1..grants.len() {
        let (earlier, rest) = grants.split_at_mut(i);
        let grant = &mut rest[0];
        let mut named: Vec<PageNo> = grant
            .intervals
            .iter()
            .flat_map(|r| r.writes.iter())
            .collect();
        named.sort_unstable();
        named.dedup();
        let is_named = |p: PageNo| named.binary_search(&p).is_ok();
        for g in earlier.iter() {
            for p in &g.pages {
                if is_named(p.page) && !grant.pages.iter().any(|q| q.page == p.page) {
                    grant.pages.push(p.clone());
                }
            }
            for d in &g.diffs {
                let known = grant
                    .diffs
                    .iter()
                    .any(|x| x.page == d.page && x.interval == d.interval);
                if is_named(d.page) && !known {
                    grant.diffs.push(d.clone());
                }
            }
        }
    }
}
