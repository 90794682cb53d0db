//! The page table and everything that moves page contents: faults and prefetches, fetches
//! from homes, twins and the write notices of home pages, serving copies at the home,
//! applying incoming diffs, and the requirements that make a fetch (or the app, for home
//! pages) wait until the diffs a write notice promised have reached the home.

use super::fast::TakenBack;
use super::{Engine, Memory, Output, PageState, Prot, Reply, Twin};
use crate::diff;
use dsm_proto::{
    Msg, NodeId, PageCopy, PageDiff, PageNo, PageRuns, RaceNotices, Requirement, SyncPoint,
    PAGE_SIZE,
};
use std::collections::BTreeMap;

/// A page-table entry. The home is fixed at allocation, so every node can route a fetch or
/// a diff without asking anyone.
#[derive(Clone, Copy, Debug)]
pub(super) struct PageEntry {
    pub(super) state: PageState,
    pub(super) home: NodeId,
}

/// Where copies taken in ([`Engine::take_in_copies`]) came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CopySource {
    /// A [`Msg::PageReply`] to the engine.
    Reply,
    /// The page lane of a co-located home, installed by the handler (a
    /// [`Msg::LanePageReply`] frame follows it).
    Lane,
    /// A reply the handler took out of a remote home's socket and installed.
    Socket,
}

impl PageEntry {
    /// A page no allocation covers yet.
    const UNALLOCATED: PageEntry = PageEntry {
        state: PageState::Unallocated,
        home: 0,
    };
}

/// A fetch the app thread waits for; it may span several homes.
#[derive(Debug)]
pub(super) struct FetchInFlight {
    /// Homes that have not replied yet.
    outstanding: usize,
    then: AfterFetch,
    write: bool,
    /// Pages to make writable once they arrive.
    pages: Vec<PageNo>,
}

/// How to tell the app thread a fetch is complete: a fault is released, a prefetch
/// answered.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum AfterFetch {
    ResolveFault,
    ReplyDone,
}

/// A page request the home cannot serve yet: a diff it requires is still on its way.
pub(super) struct ParkedServe {
    from: NodeId,
    pages: Vec<PageNo>,
    required: Vec<Requirement>,
    lane: bool,
}

/// Something the app waits for until diffs of home pages have arrived.
pub(super) struct HomeWait {
    waits: Vec<Requirement>,
    reply: Reply,
}

impl<M: Memory> Engine<M> {
    /// Every page-table change goes through here so the runtime's mirror hears of it.
    pub(super) fn set_state(&mut self, page: PageNo, state: PageState) {
        let old = self.pages[page as usize].state;
        if old == PageState::ReadOnly && state != PageState::ReadOnly {
            if let Some(fast) = &self.fast {
                // Callers settle a page before deciding what to do with it, so the handler
                // cannot have taken it since; disarming here only keeps it from doing so.
                let taken = fast.disarm(page);
                debug_assert!(!taken, "page {page} changed without being settled first");
            }
        }
        if old == PageState::Invalid && state != PageState::Invalid {
            if let Some(fast) = &self.fast {
                fast.end_fetch(page);
            }
        }
        if self.fast.is_some()
            && (state == PageState::ReadOnly
                || state == PageState::Invalid
                    && self.handler_may_ask(self.pages[page as usize].home))
        {
            self.to_arm.push(page);
        }
        self.pages[page as usize].state = state;
        self.report_state(page, state);
    }

    /// Tells the runtime's mirror of a page-table change.
    fn report_state(&mut self, page: PageNo, state: PageState) {
        // Extending the previous run keeps bulk changes (an allocation, a prefetch, the
        // invalidations at a barrier) to one output instead of one per page.
        if let Some(Output::PageStates {
            first,
            count,
            state: last,
        }) = self.out.last_mut()
        {
            if *last == state && *first + *count == page {
                *count += 1;
                return;
            }
        }
        self.out.push(Output::PageStates {
            first: page,
            count: 1,
            state,
        });
    }

    /// Reports pages another node may access too (see [`Output::PagesShared`]).
    pub(super) fn mark_shared(&mut self, page: PageNo, pages: u32) {
        if let Some(Output::PagesShared { first, count }) = self.out.last_mut() {
            if *first + *count == page {
                *count += pages;
                return;
            }
        }
        self.out.push(Output::PagesShared {
            first: page,
            count: pages,
        });
    }

    /// Whether pages homed at `home` come through the page lane of a shared-memory link
    /// (see [`Engine::set_lane_peers`]).
    fn through_lane(&self, home: NodeId) -> bool {
        self.lane_peers & !self.host_mates & node_bit(home) != 0
    }

    /// Whether the SIGSEGV handler can ask `home` for a page itself: through the lane of
    /// their shared-memory link, or in a frame on their TCP link.
    fn handler_may_ask(&self, home: NodeId) -> bool {
        (self.lane_peers | self.socket_peers) & !self.host_mates & node_bit(home) != 0
    }

    pub(super) fn is_home(&self, page: PageNo) -> bool {
        self.pages[page as usize].home == self.me
    }

    /// Whether `page` is one copy on this host: homed here or at a host mate (see
    /// [`Engine::set_host_mates`]). Nobody on the host twins, diffs or fetches it.
    pub(super) fn is_host_page(&self, page: PageNo) -> bool {
        self.host_mates & node_bit(self.pages[page as usize].home) != 0
    }

    /// Whether other nodes map this node's host memory ([`Engine::set_host_mates`]).
    pub(super) fn has_host_mates(&self) -> bool {
        self.host_mates != node_bit(self.me)
    }

    /// Whether `node` is another node mapping this node's host memory.
    pub(super) fn is_host_mate(&self, node: NodeId) -> bool {
        node != self.me && self.host_mates & node_bit(node) != 0
    }

    pub(super) fn protect_runs(&mut self, pages: &mut [PageNo], prot: Prot) {
        pages.sort_unstable();
        let runs = PageRuns::from_sorted_unique(pages);
        for &(first, count) in runs.runs() {
            self.mem.protect(first, count, prot);
        }
    }

    /// What the handler did since the last event, taken in at the start of each: the pages
    /// it installed from lanes, in order (adopting the fetches it asked for itself), then
    /// the writes it let through.
    pub(super) fn take_in_handler_work(&mut self) {
        while let Some(got) = self.fast.as_ref().and_then(|f| f.take_fetched()) {
            // A fetch the handler asked for and finished before the engine heard of it.
            self.adopt_handler_fetch(got.page, got.home);
            let copy = PageCopy {
                page: got.page,
                data: Vec::new(),
                applied: got.applied,
            };
            let source = if self.lane_peers & node_bit(got.home) != 0 {
                CopySource::Lane
            } else {
                CopySource::Socket
            };
            self.take_in_copies(got.home, vec![copy], source);
        }
        self.drain_handler_writes();
    }

    /// Takes in the writes the SIGSEGV handler let through since the last event: each page
    /// is now writable, with its twin in a handler slot (or, at the home, a write notice
    /// to make), exactly as [`Engine::on_fault`] would have left it.
    pub(super) fn drain_handler_writes(&mut self) {
        let Some(fast) = &self.fast else {
            return;
        };
        if fast.take_short() > 0 {
            // The handler sent a fault the slow way for want of a slot (that fault may be
            // this very event): double the pool now, outside the handler.
            fast.grow_slots(fast.slots_made() * 2);
        }
        if !fast.has_done() {
            return;
        }
        let mut taken = Vec::new();
        fast.drain(|page, slot| taken.push((page, slot)));
        for (page, slot) in taken {
            debug_assert_eq!(self.pages[page as usize].state, PageState::ReadOnly);
            self.stats.write_faults += 1;
            self.stats.handler_write_faults += 1;
            match slot {
                None => self.home_writes.push(page),
                Some(slot) => {
                    self.twins.insert(page, Twin::Slot(slot));
                    self.dirty.push(page);
                    self.slot_twins += 1;
                    self.stats.twins_made += 1;
                }
            }
            self.pages[page as usize].state = PageState::ReadWrite;
            self.report_state(page, PageState::ReadWrite);
        }
    }

    /// Takes `page` back from the SIGSEGV handler before the engine decides anything about
    /// it: afterwards its state is exact and the handler leaves it alone until the event
    /// ends (see [`fast`](super::fast)).
    pub(super) fn settle(&mut self, page: PageNo) {
        let Some(fast) = &self.fast else {
            return;
        };
        match fast.take_back(page) {
            // Its copy is taken in as any fetch's (the handler's record, or a reply).
            TakenBack::WasIdle | TakenBack::HandlerFetching => {}
            // Re-armed when the event ends if it is still read-only then.
            TakenBack::WasArmed => self.to_arm.push(page),
            TakenBack::HandlerWrote => self.drain_handler_writes(),
        }
    }

    /// Lets the handler take the pages that became `ReadOnly` in this event, now that every
    /// protection change of the event is made, and fetch those that became invalid and
    /// need nothing but their home's copy, from a home the handler can ask itself (no diff
    /// required from a third party, no fetch of them under way).
    pub(super) fn arm_pending(&mut self) {
        let Some(fast) = self.fast.as_ref().filter(|_| !self.to_arm.is_empty()) else {
            return;
        };
        let mut to_arm = std::mem::take(&mut self.to_arm);
        for page in to_arm.drain(..) {
            let entry = self.pages[page as usize];
            match entry.state {
                PageState::ReadOnly => {
                    // A host page written in the handler takes no twin: its write
                    // notice is made at the next close, as for a home page.
                    fast.arm(page, self.is_host_page(page));
                }
                PageState::Invalid
                    if self.handler_may_ask(entry.home)
                        && !self.required.contains_key(&page)
                        && !self.fetch.as_ref().is_some_and(|f| f.pages.contains(&page)) =>
                {
                    fast.arm_fetch(page, entry.home);
                }
                _ => {}
            }
        }
        // Kept for its capacity: most steps arm a few pages.
        self.to_arm = to_arm;
    }

    /// The handler asked `home` for `page` itself (its word is claimed): unless a fetch
    /// of it is already in flight (the engine adopted it when the fault reached the comm
    /// thread), makes it the engine's fetch in flight for the faulting thread, counted as
    /// the fault and request the handler made. Returns whether the page was the handler's.
    fn adopt_handler_fetch(&mut self, page: PageNo, home: NodeId) -> bool {
        let claimed = self.fast.as_ref().and_then(|f| f.fetch_claimed(page));
        if claimed != Some(home) {
            return false;
        }
        if self.fetch.as_ref().is_some_and(|f| f.pages == [page]) {
            return true;
        }
        if self.fetch.is_some() {
            self.fatal(format!(
                "the fault handler fetched page {page} while another fetch was in flight"
            ));
            return false;
        }
        self.stats.read_faults += 1;
        self.stats.fetch_requests += 1;
        self.stats.handler_fetches += 1;
        self.fetch = Some(FetchInFlight {
            outstanding: 1,
            then: AfterFetch::ResolveFault,
            write: false,
            pages: vec![page],
        });
        true
    }

    fn take_twin(&mut self) -> Box<[u8]> {
        self.spare_twins
            .pop()
            .unwrap_or_else(|| vec![0u8; PAGE_SIZE].into())
    }

    // ---------------------------------------------------------------- faults

    /// A fault of the app thread at `page`. `write` is `None` when the architecture does
    /// not say; the access is then treated as a read and a write retries as a write fault.
    pub fn on_fault(&mut self, page: Option<PageNo>, write: Option<bool>) -> Vec<Output> {
        self.take_in_handler_work();
        let Some(page) = page.filter(|&p| (p as usize) < self.pages.len()) else {
            self.out.push(Output::FaultCrash);
            return self.take_out();
        };
        let entry = self.pages[page as usize];
        let write = write.unwrap_or(false);
        match entry.state {
            PageState::Unallocated => self.out.push(Output::FaultCrash),
            PageState::Invalid if self.host_copy_current(page) => {
                // The diffs it waited for reached the host's copy since it was invalidated.
                self.stats.read_faults += u64::from(!write);
                self.stats.write_faults += u64::from(write);
                self.revalidate_host_page(page);
                if write {
                    self.make_writable(page);
                }
                self.out.push(Output::FaultResolved);
            }
            PageState::Invalid => {
                self.settle(page);
                if self.adopt_handler_fetch(page, entry.home) {
                    // The handler asked the home itself and then handed the wait to this
                    // thread: the copy comes as for any fetch.
                    self.stats.handler_fetches_handed_over += 1;
                    return self.take_out();
                }
                self.stats.read_faults += u64::from(!write);
                self.stats.write_faults += u64::from(write);
                // A read fault on a co-located home's page: the faulting thread can take
                // the page from the link's lane itself (see `fast`).
                let lane = !write && self.through_lane(entry.home);
                self.start_fetch(vec![page], write, AfterFetch::ResolveFault, lane);
            }
            PageState::ReadOnly if write => {
                self.stats.write_faults += 1;
                self.make_writable(page);
                self.out.push(Output::FaultResolved);
            }
            // Spurious: the page became accessible in the meantime (e.g. a prefetch).
            PageState::ReadOnly | PageState::ReadWrite => self.out.push(Output::FaultResolved),
        }
        self.take_out()
    }

    /// Whether `page`, a host page homed at a mate, holds every diff its notices required,
    /// by its home's published table ([`Memory::host_applied`]).
    fn host_copy_current(&self, page: PageNo) -> bool {
        let home = self.pages[page as usize].home;
        self.is_host_mate(home)
            && self
                .required
                .get(&page)
                .into_iter()
                .flatten()
                .all(|&(w, i)| self.mem.host_applied(page, w) >= i)
    }

    /// What a copy of home page `page` made now holds, per writer: the diffs applied, and
    /// for each host mate every interval this node knows it closed (its writes went to
    /// the host's copy before it closed them), so a push can cover the notices of mates'
    /// writes (see `push`).
    pub(super) fn applied_in_copy(&self, page: PageNo) -> Vec<(NodeId, u32)> {
        let mut applied = self.applied.get(&page).cloned().unwrap_or_default();
        if self.has_host_mates() {
            for m in 0..self.n as NodeId {
                if self.is_host_mate(m) && self.vt.get(m) > 0 {
                    applied.push((m, self.vt.get(m)));
                }
            }
        }
        applied
    }

    /// An invalid host page whose diffs are in the host's copy: readable again.
    fn revalidate_host_page(&mut self, page: PageNo) {
        self.stats.host_diffs_found_applied += 1;
        self.required.remove(&page);
        self.mem.protect(page, 1, Prot::Read);
        self.set_state(page, PageState::ReadOnly);
    }

    /// Read-only -> read-write: a twin for pages homed on other hosts, a write notice
    /// for host pages (see [`Engine::set_host_mates`]).
    fn make_writable(&mut self, page: PageNo) {
        self.settle(page);
        if self.pages[page as usize].state != PageState::ReadOnly {
            // The handler made it writable meanwhile.
            return;
        }
        if self.is_host_page(page) {
            self.home_writes.push(page);
        } else {
            let mut twin = self.take_twin();
            self.mem.read_page(page, &mut twin);
            self.twins.insert(page, Twin::Owned(twin));
            self.dirty.push(page);
            self.stats.twins_made += 1;
        }
        self.mem.protect(page, 1, Prot::ReadWrite);
        self.set_state(page, PageState::ReadWrite);
    }

    /// Asks the pages' homes for copies; `lane`: of one page, for a fault whose thread
    /// takes it from the page lane (see [`Msg::PageRequest::lane`]).
    fn start_fetch(&mut self, pages: Vec<PageNo>, write: bool, then: AfterFetch, lane: bool) {
        let mut by_home: BTreeMap<NodeId, Vec<PageNo>> = BTreeMap::new();
        for &p in &pages {
            by_home
                .entry(self.pages[p as usize].home)
                .or_default()
                .push(p);
        }
        self.fetch = Some(FetchInFlight {
            outstanding: by_home.len(),
            then,
            write,
            pages,
        });
        for (home, pages) in by_home {
            let required =
                pages
                    .iter()
                    .flat_map(|&p| {
                        self.required.get(&p).into_iter().flatten().map(
                            move |&(writer, interval)| Requirement {
                                page: p,
                                writer,
                                interval,
                            },
                        )
                    })
                    .collect();
            self.stats.fetch_requests += 1;
            let lane = lane && pages.len() == 1;
            self.send(
                home,
                Msg::PageRequest {
                    pages,
                    required,
                    lane,
                },
            );
        }
    }

    pub(super) fn on_page_reply(&mut self, from: NodeId, copies: Vec<PageCopy>) {
        if let [copy] = copies.as_slice() {
            // The copy answers the handler's own request if the engine has not heard of
            // that fault yet (and is a clear fatal error if another fetch is in flight,
            // rather than credited to that one).
            self.adopt_handler_fetch(copy.page, from);
        }
        self.take_in_copies(from, copies, CopySource::Reply);
    }

    /// The frame that follows a page the home left in the lane, when the faulting thread
    /// took the page (had the runtime taken it, the frame would have come as the
    /// [`Msg::PageReply`] it stands for): the handler's record of it was taken in at the
    /// start of this event or an earlier one, and counted.
    pub(super) fn on_lane_page_reply(&mut self, from: NodeId, page: PageNo) {
        let unmarked = self.lane_pages_unmarked.entry(from).or_default();
        if *unmarked == 0 {
            self.fatal(format!(
                "rank {from} said it left page {page} in the page lane, which held nothing"
            ));
            return;
        }
        *unmarked -= 1;
    }

    /// Takes in copies from `from`, the pages' home. Unless they came in a reply to the
    /// engine, the copies' data is already in memory and readable in the app view (the
    /// handler put it there), so only the engine's state changes; their `data` is empty.
    fn take_in_copies(&mut self, from: NodeId, copies: Vec<PageCopy>, source: CopySource) {
        let installed = source != CopySource::Reply;
        let Some(fetch) = self.fetch.as_mut() else {
            self.fatal(format!("rank {from} sent pages nobody asked for"));
            return;
        };
        fetch.outstanding = fetch.outstanding.saturating_sub(1);
        for copy in &copies {
            let p = copy.page as usize;
            // A host page's reply confirms that the diffs are in the one copy: no data.
            let size = if self.is_host_mate(from) {
                0
            } else {
                PAGE_SIZE
            };
            if p >= self.pages.len()
                || (copy.data.len() != size && !installed)
                || self.pages[p].state != PageState::Invalid
                || self.pages[p].home != from
            {
                self.fatal(format!(
                    "rank {from} sent a bad copy of page {} ({} bytes)",
                    copy.page,
                    copy.data.len()
                ));
                return;
            }
        }
        let mut readable = Vec::with_capacity(copies.len());
        if self.pushes_await_barrier() {
            let pages: Vec<PageNo> = copies.iter().map(|c| c.page).collect();
            self.drop_older_pushes(from, &pages);
        }
        for copy in copies {
            if !installed {
                if !copy.data.is_empty() {
                    self.mem.write_page(copy.page, &copy.data);
                }
                readable.push(copy.page);
            }
            self.note_copy_installed(copy.page, copy.applied);
            self.required.remove(&copy.page);
            self.set_state(copy.page, PageState::ReadOnly);
            self.stats.pages_fetched += 1;
            match source {
                CopySource::Reply => {}
                CopySource::Lane => {
                    self.stats.lane_pages += 1;
                    *self.lane_pages_unmarked.entry(from).or_default() += 1;
                }
                // No frame follows: the handler took the reply itself.
                CopySource::Socket => self.stats.socket_pages += 1,
            }
        }
        self.protect_runs(&mut readable, Prot::Read);
        let fetch = self.fetch.as_ref().expect("checked above");
        if fetch.outstanding > 0 {
            return;
        }
        let fetch = self.fetch.take().expect("checked above");
        if fetch.write {
            for p in fetch.pages {
                if self.pages[p as usize].state == PageState::ReadOnly {
                    self.make_writable(p);
                }
            }
        }
        match fetch.then {
            // The handler that installed the page has let its thread go already.
            AfterFetch::ResolveFault if installed => {}
            AfterFetch::ResolveFault => self.out.push(Output::FaultResolved),
            AfterFetch::ReplyDone => self.reply(Reply::Done),
        }
    }

    // ---------------------------------------------------------------- serving pages

    /// Whether every diff `required` names is in this node's copies of its home pages. A
    /// host mate's writes need no diff: they are in the host's one copy from the moment
    /// the mate closed the interval, which it did before anyone could learn of it.
    pub(super) fn requirements_met(&self, required: &[Requirement]) -> bool {
        required.iter().all(|r| {
            self.is_host_mate(r.writer)
                || self
                    .applied
                    .get(&r.page)
                    .and_then(|v| v.iter().find(|(w, _)| *w == r.writer))
                    .is_some_and(|&(_, i)| i >= r.interval)
        })
    }

    pub(super) fn on_page_request(
        &mut self,
        from: NodeId,
        pages: Vec<PageNo>,
        required: Vec<Requirement>,
        lane: bool,
    ) {
        for &p in &pages {
            if (p as usize) >= self.pages.len()
                || !self.is_home(p)
                || self.pages[p as usize].state == PageState::Unallocated
            {
                self.fatal(format!(
                    "rank {from} asked for page {p}, which is not homed here"
                ));
                return;
            }
        }
        if self.requirements_met(&required) {
            self.serve(from, pages, lane);
        } else {
            self.parked.push(ParkedServe {
                from,
                pages,
                required,
                lane,
            });
        }
    }

    /// Sends copies of `pages` to `to`: through the page lane when `lane` asks for it and
    /// there is one page ([`Output::LaneReply`]), else in a [`Msg::PageReply`].
    fn serve(&mut self, to: NodeId, pages: Vec<PageNo>, lane: bool) {
        if self.is_host_mate(to) {
            self.confirm_host_pages(to, pages);
            return;
        }
        // The app may be writing meanwhile: take the pages back from the handler so the
        // states below are exact (a write it let through is a write notice to make).
        for &p in &pages {
            self.settle(p);
        }
        // Write-protect first, so that any later write by the home faults and produces the
        // write notice that will invalidate the copy we hand out.
        let mut newly_shared: Vec<PageNo> = pages
            .iter()
            .copied()
            .filter(|&p| self.pages[p as usize].state == PageState::ReadWrite)
            .collect();
        self.protect_runs(&mut newly_shared, Prot::Read);
        for &p in &newly_shared {
            self.set_state(p, PageState::ReadOnly);
        }
        for &p in &pages {
            self.mark_shared(p, 1);
            self.note_copy(p, to);
        }
        let copies = pages
            .into_iter()
            .map(|page| {
                let mut data = vec![0u8; PAGE_SIZE];
                self.mem.read_page(page, &mut data);
                let applied = self.applied_in_copy(page);
                PageCopy {
                    page,
                    data,
                    applied,
                }
            })
            .collect::<Vec<_>>();
        self.stats.pages_served += copies.len() as u64;
        match <[PageCopy; 1]>::try_from(copies) {
            Ok([copy]) if lane => self.out.push(Output::LaneReply { to, copy }),
            Ok(one) => self.send(to, Msg::PageReply { pages: one.into() }),
            Err(copies) => self.send(to, Msg::PageReply { pages: copies }),
        }
    }

    /// Answers a host mate's request for pages of the host's one copy: it holds every
    /// diff the request required, so the reply carries no data, and nothing here changes
    /// (the mate's accesses go to that copy: it is no copy served, to invalidate later).
    fn confirm_host_pages(&mut self, to: NodeId, pages: Vec<PageNo>) {
        let copies = pages
            .into_iter()
            .map(|page| PageCopy {
                page,
                data: Vec::new(),
                applied: self.applied.get(&page).cloned().unwrap_or_default(),
            })
            .collect();
        self.stats.host_pages_confirmed += 1;
        self.send(to, Msg::PageReply { pages: copies });
    }

    pub(super) fn on_diffs(
        &mut self,
        from: NodeId,
        interval: u32,
        diffs: Vec<PageDiff>,
        after: Vec<Requirement>,
    ) {
        for d in after
            .iter()
            .map(|r| r.page)
            .chain(diffs.iter().map(|d| d.page))
        {
            if (d as usize) >= self.pages.len() || !self.is_home(d) {
                self.fatal(format!(
                    "rank {from} sent a diff for page {d}, which is not homed here"
                ));
                return;
            }
        }
        for d in &diffs {
            if (d.page as usize) >= self.pages.len() || !self.is_home(d.page) {
                self.fatal(format!(
                    "rank {from} sent a diff for page {}, which is not homed here",
                    d.page
                ));
                return;
            }
            if let Err(e) = diff::validate(&d.runs) {
                self.fatal(format!(
                    "rank {from} sent a malformed diff for page {}: {e}",
                    d.page
                ));
                return;
            }
        }
        // A writer's diffs apply in the order it sent them: behind a parked one, park too.
        let behind = self.parked_diffs.iter().any(|(w, ..)| *w == from);
        if !behind && self.requirements_met(&after) {
            self.apply_diffs(from, interval, diffs);
            self.recheck_waits();
        } else {
            self.parked_diffs.push((from, interval, diffs, after));
        }
    }

    fn apply_diffs(&mut self, from: NodeId, interval: u32, diffs: Vec<PageDiff>) {
        let mates = self.has_host_mates();
        for d in diffs {
            self.mem.apply_diff(d.page, &d.runs);
            if mates {
                self.mem.publish_host_applied(d.page, from, interval);
            }
            self.stats.diffs_applied += 1;
            let v = self.applied.entry(d.page).or_default();
            match v.iter_mut().find(|(w, _)| *w == from) {
                Some((_, i)) => *i = (*i).max(interval),
                None => v.push((from, interval)),
            }
        }
    }

    fn recheck_waits(&mut self) {
        // Parked diffs first (applying one may release another), then what waits for them.
        while let Some(i) = (0..self.parked_diffs.len()).find(|&i| {
            let (writer, _, _, after) = &self.parked_diffs[i];
            self.requirements_met(after)
                && !self.parked_diffs[..i].iter().any(|(w, ..)| w == writer)
        }) {
            let (from, interval, diffs, _) = self.parked_diffs.remove(i);
            self.apply_diffs(from, interval, diffs);
        }
        if !self.parked.is_empty() {
            let parked = std::mem::take(&mut self.parked);
            for p in parked {
                if self.requirements_met(&p.required) {
                    self.serve(p.from, p.pages, p.lane);
                } else {
                    self.parked.push(p);
                }
            }
        }
        if let Some(hw) = self.home_wait.take() {
            if self.requirements_met(&hw.waits) {
                self.reply(hw.reply);
            } else {
                self.home_wait = Some(hw);
            }
        }
    }

    /// Replies to the app once the diffs of home pages named in newly seen write notices
    /// have arrived (the app reads home pages without faulting).
    pub(super) fn reply_after_home_diffs(&mut self, waits: Vec<Requirement>, reply: Reply) {
        if self.requirements_met(&waits) {
            self.reply(reply);
        } else {
            self.home_wait = Some(HomeWait { waits, reply });
        }
    }

    /// Says which peers a read fault fetches from through the page lane of their
    /// shared-memory link, the faulting thread taking the page itself (the runtime's
    /// co-located peers; needs the handler's state, [`Engine::with_fast_faults`]). Their
    /// requests for one faulting page ask for [`Output::LaneReply`]; the copy then comes
    /// back either through [`FastFaults`](super::fast::FastFaults)' record of a page the
    /// handler installed or in a [`Msg::PageReply`].
    pub fn set_lane_peers(&mut self, peers: &[NodeId]) {
        self.lane_peers = 0;
        if self.fast.is_some() {
            for &p in peers {
                self.lane_peers |= node_bit(p);
            }
        }
    }

    /// Says to which peers the SIGSEGV handler can write a page request itself, on their
    /// TCP link (the runtime's peers on other hosts; needs the handler's state,
    /// [`Engine::with_fast_faults`]). Their invalid pages that need nothing but the home's
    /// copy are armed for a fetch of the handler's own, as lane peers' are; the copy comes
    /// back in a [`Msg::PageReply`], and the engine adopts the fetch then, or when the
    /// handler hands its wait over in a fault.
    pub fn set_socket_peers(&mut self, peers: &[NodeId]) {
        self.socket_peers = 0;
        if self.fast.is_some() {
            for &p in peers {
                self.socket_peers |= node_bit(p);
            }
        }
    }

    /// Says that every node of the job maps the same memory (the runtime's common
    /// segment: every rank on one host). Must be said before the first
    /// allocation, by every node alike. Every page is then one this node homes and nobody
    /// else copies: writable from its allocation on, never protected, fetched, diffed or
    /// pushed, with no write notices. What the protocol still does is order
    /// synchronization (locks, semaphores and barriers keep their messages and vector
    /// times); the memory itself makes a write visible to every rank, and the message that
    /// orders a release before an acquire (a ring commit with release ordering) orders the
    /// write before the read.
    pub fn set_common_memory(&mut self, on: bool) {
        assert!(
            self.pages.is_empty(),
            "set_common_memory after an allocation"
        );
        self.common_memory = on;
    }

    /// Says which other nodes map this node's host memory: the pages homed at any of them
    /// or here are then one copy on this host (the runtime maps them from the host's
    /// segment file), and the protocol runs only between hosts. Must be said before the
    /// first allocation, by every node of a host alike.
    ///
    /// A host page homed at a mate is valid from its allocation on. Writing it takes no
    /// twin and sends no diff: the write notice is made at the interval's close, which
    /// write-protects the page again, so every interval that writes it makes one (the
    /// home cannot tell from its own faults when another host's copy went stale). A
    /// notice of another host's writer invalidates the page until the home says its diff
    /// is in (a request whose reply carries no data); a mate's notice needs nothing, and
    /// a requirement on a mate's write is met at once (its writes are in the copy).
    /// Pushes never replace a host page, and the page lanes never carry one.
    pub fn set_host_mates(&mut self, mates: &[NodeId]) {
        assert!(self.pages.is_empty(), "set_host_mates after an allocation");
        self.host_mates = node_bit(self.me);
        for &m in mates {
            self.host_mates |= node_bit(m);
        }
    }

    pub(super) fn alloc(
        &mut self,
        homes: Vec<(PageNo, u32, NodeId)>,
        digest: u64,
        race: Option<RaceNotices>,
        at: SyncPoint,
    ) {
        let mut mine = Vec::new();
        let mut mates = Vec::new();
        for (first, count, home) in homes {
            let end = first as usize + count as usize;
            if end > self.page_limit || home as usize >= self.n {
                self.fatal(format!(
                    "allocation of pages {first}..{end} does not fit the segment"
                ));
                return;
            }
            let home = if self.common_memory { self.me } else { home };
            if end > self.pages.len() {
                // The table covers the allocated pages only; grow it to the new high-water
                // mark (the runtime has reserved the room already, see `reserve_pages`).
                if let Err(e) = self.reserve_pages(end) {
                    self.fatal(format!(
                        "out of memory for the page table of pages {first}..{end}: {e}"
                    ));
                    return;
                }
                self.pages.resize(end, PageEntry::UNALLOCATED);
                if let Some(fast) = &self.fast {
                    fast.reserve_pages(end);
                }
            }
            for p in first..first + count {
                let e = &mut self.pages[p as usize];
                if e.state != PageState::Unallocated {
                    self.fatal(format!("page {p} allocated twice"));
                    return;
                }
                e.home = home;
                let state = if home == self.me {
                    PageState::ReadWrite
                } else if self.is_host_mate(home) {
                    PageState::ReadOnly
                } else {
                    PageState::Invalid
                };
                self.set_state(p, state);
            }
            if home == self.me {
                mine.push((first, count));
            } else {
                if self.is_host_mate(home) {
                    mates.push((first, count));
                }
                self.mark_shared(first, count);
            }
        }
        for (first, count) in mine {
            self.mem.protect(first, count, Prot::ReadWrite);
        }
        for (first, count) in mates {
            self.mem.protect(first, count, Prot::Read);
        }
        self.alloc_digest = self.alloc_digest.rotate_left(7) ^ digest;
        self.barrier(false, race, Vec::new(), at);
    }

    pub(super) fn prefetch(&mut self, pages: PageRuns, write: bool) {
        let mut missing = Vec::new();
        for p in pages.iter() {
            if (p as usize) >= self.pages.len() {
                break;
            }
            match self.pages[p as usize].state {
                PageState::Invalid if self.host_copy_current(p) => {
                    self.revalidate_host_page(p);
                    if write {
                        self.make_writable(p);
                    }
                }
                PageState::Invalid => {
                    self.settle(p);
                    missing.push(p);
                }
                PageState::ReadOnly if write => self.make_writable(p),
                _ => {}
            }
        }
        if missing.is_empty() {
            self.reply(Reply::Done);
        } else {
            self.start_fetch(missing, write, AfterFetch::ReplyDone, false);
        }
    }
}

/// `node`'s bit in a set of nodes kept as a `u64` (none beyond 64 nodes).
pub(super) fn node_bit(node: NodeId) -> u64 {
    1u64.checked_shl(u32::from(node)).unwrap_or(0)
}
