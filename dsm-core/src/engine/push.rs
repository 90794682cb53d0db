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

use super::{Engine, Memory, PageState, Prot};
use dsm_proto::{IntervalRecord, NodeId, PageNo, PushedPage, PAGE_SIZE};

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
    /// home: a pushed copy must contain it before it may replace the local one.
    pub(super) fn note_own_diff(&mut self, page: PageNo, interval: u32) {
        if self.push_limit > 0 {
            self.own_diffs.insert(page, interval);
        }
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
        let Some(bit) = 1u64.checked_shl(u32::from(to)) else {
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
            let applied = self.applied.get(&p).cloned().unwrap_or_default();
            out.push(PushedPage {
                page: p,
                data,
                applied,
            });
        }
        self.stats.pages_pushed += out.len() as u64;
        out
    }

    /// A copy of `pages` just arrived from their home `from`. Pushes of those pages that
    /// `from` sent with a barrier arrival still waiting here for the other arrivals are
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
        self.stats.pushes_rejected += dropped as u64;
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

    /// Installs the pushed copies among `pushed` that cover everything (see the module
    /// doc) for pages in `named` (pages new write notices name, not homed here), and
    /// returns the pages still to invalidate. Runs after the notices' requirements have
    /// been recorded.
    pub(super) fn take_pushes(
        &mut self,
        named: Vec<PageNo>,
        mut pushed: Vec<PushedPage>,
    ) -> Vec<PageNo> {
        if pushed.is_empty() {
            return named.into_iter().filter(|&p| self.holds_copy(p)).collect();
        }
        pushed.sort_by_key(|p| p.page);
        let offered = pushed.len() as u64;
        let applied_before = self.stats.pushes_applied;
        let mut invalidate = Vec::new();
        let mut installed = Vec::new();
        for p in named {
            let push = pushed
                .binary_search_by_key(&p, |q| q.page)
                .ok()
                .map(|i| &pushed[i]);
            match push {
                Some(push) if self.push_covers(p, push) => {
                    self.mem.write_page(p, &push.data);
                    self.required.remove(&p);
                    if self.pages[p as usize].state == PageState::Invalid {
                        self.set_state(p, PageState::ReadOnly);
                        installed.push(p);
                    }
                    self.stats.pushes_applied += 1;
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
