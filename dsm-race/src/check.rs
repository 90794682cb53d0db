//! DVM-style dynamic checks (`dsmrun --check`), run by the barrier master beside race
//! detection and from the same access records: reads of shared elements that no node has
//! written since the allocation (uninitialised use), and accesses outside the region of
//! an allocation a program declared for a node (the "local part" of a distributed array).
//!
//! Uninitialised reads. For every page the master keeps the granules written in earlier
//! epochs. A read granule of interval `r` is uninitialised when no earlier epoch wrote it
//! and no interval of this epoch that happens before `r` (or `r` itself) wrote it. Pages
//! every granule of which has been written are complete and cost nothing afterwards; until
//! then every write bitmap of the page is fetched, and every read bitmap. A write and a
//! read of the same granule in one interval count as initialising, whatever their order
//! (bitmaps do not keep order within an interval). The zero fill of a new allocation is
//! not a value the program wrote, so a program that relies on it (a counter starting at
//! zero) says so with [`Checker::initialised`].
//!
//! Regions. [`Checker::declare_region`] names, for each rank, the element range it may
//! write (or, with [`RegionRule::Accesses`], read or write) in one allocation. Pages that
//! lie wholly inside a node's range are not looked at; the bitmaps of the others are
//! fetched and any granule outside the range is reported.

use crate::detect::{word, Bitmaps, VarInfo, VarTable};
use dsm_proto::{AccessKind, BitmapKey, IntervalRecord, NodeId, PageNo, SyncCause, PAGE_SIZE};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;

/// What a declared region limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RegionRule {
    /// Writes outside the node's range are reported; reads anywhere are fine (the usual
    /// owner-computes rule: a node reads its neighbours' boundary, writes only its own).
    Writes,
    /// Reads and writes outside the node's range are reported.
    Accesses,
}

/// What a check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FindingKind {
    /// A read of an element no node had written since the allocation.
    UninitialisedRead,
    /// A read outside the node's declared region.
    ReadOutsideRegion,
    /// A write outside the node's declared region.
    WriteOutsideRegion,
}

impl FindingKind {
    /// The name used in reports and the log.
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::UninitialisedRead => "uninitialised-read",
            FindingKind::ReadOutsideRegion => "read-outside-region",
            FindingKind::WriteOutsideRegion => "write-outside-region",
        }
    }
}

/// The elements one node accessed wrongly in one variable during one epoch, for one kind
/// of finding (one report block, as ThreadSanitizer collapses reports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// What was found.
    pub kind: FindingKind,
    /// The epoch (as race reports number them).
    pub epoch: u32,
    /// The variable.
    pub variable: String,
    /// The elements, ascending.
    pub indices: Vec<usize>,
    /// Columns of the variable when it is 2-D (reports give row and column).
    pub cols: Option<usize>,
    /// The node whose intervals made the accesses.
    pub node: NodeId,
    /// The first of those intervals (in the node's order).
    pub interval: u32,
    /// The synchronization that began that interval.
    pub began_with: SyncCause,
    /// How many of the node's intervals of the epoch made such accesses.
    pub intervals: usize,
    /// For region findings, the node's declared range.
    pub region: Option<Range<usize>>,
}

/// A region declaration: one element range per rank.
#[derive(Clone, Debug)]
struct Region {
    rule: RegionRule,
    ranges: Vec<Range<usize>>,
}

/// The master's checking state across epochs.
#[derive(Default)]
pub struct Checker {
    /// Granules written in earlier epochs, per page not yet complete.
    written: HashMap<PageNo, Vec<u64>>,
    /// Pages every granule of which has been written.
    complete: BTreeSet<PageNo>,
    /// Declared regions by the variable's first page.
    regions: HashMap<PageNo, Region>,
}

/// Number of granules of `var` on `page` (the last page may be partly used).
fn granules_on(var: &VarInfo, page: PageNo) -> usize {
    let bytes = var.len * var.elem_size;
    let lo = (page - var.first_page) as usize * PAGE_SIZE;
    let on_page = bytes.saturating_sub(lo).min(PAGE_SIZE);
    on_page.div_ceil(1 << var.granule_shift)
}

/// The element index of granule `g` of `page`.
fn element_of(var: &VarInfo, page: PageNo, g: usize) -> usize {
    let byte = (page - var.first_page) as usize * PAGE_SIZE + (g << var.granule_shift);
    byte / var.elem_size.max(1)
}

/// The elements of `var` on `page`, as a half-open range.
fn elements_on(var: &VarInfo, page: PageNo) -> Range<usize> {
    let n = granules_on(var, page);
    if n == 0 {
        return 0..0;
    }
    element_of(var, page, 0)..element_of(var, page, n - 1) + 1
}

fn is_internal(var: &VarInfo) -> bool {
    var.name.starts_with(dsm_proto::INTERNAL_ALLOC_PREFIX)
}

/// Granules of a page, as a bitmap with all `n` bits set.
fn full_mask(n: usize) -> Vec<u64> {
    let mut m = vec![u64::MAX; n / 64];
    if !n.is_multiple_of(64) {
        m.push((1u64 << (n % 64)) - 1);
    }
    m
}

impl Checker {
    /// A checker with nothing written and no regions.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the zero fill of `var` as written: the program relies on a fresh allocation
    /// reading as zeros.
    pub fn initialised(&mut self, var: &VarInfo) {
        for page in var.first_page..var.first_page + var.pages {
            self.written.remove(&page);
            self.complete.insert(page);
        }
    }

    /// Declares `ranges[rank]` as the elements of `var` that `rank` may write (or access,
    /// by `rule`). Ranks beyond `ranges` may touch nothing.
    pub fn declare_region(&mut self, var: &VarInfo, rule: RegionRule, ranges: Vec<Range<usize>>) {
        self.regions.insert(var.first_page, Region { rule, ranges });
    }

    fn region_of(&self, var: &VarInfo) -> Option<&Region> {
        self.regions.get(&var.first_page)
    }

    /// Whether the checks need `kind` accesses of `node` on `page` of `var` checked against
    /// a region: the page is not wholly inside the node's range.
    fn region_wants(&self, var: &VarInfo, page: PageNo, node: NodeId, kind: AccessKind) -> bool {
        let Some(region) = self.region_of(var) else {
            return false;
        };
        if kind == AccessKind::Read && region.rule == RegionRule::Writes {
            return false;
        }
        let on_page = elements_on(var, page);
        match region.ranges.get(node as usize) {
            Some(r) => !(r.start <= on_page.start && on_page.end <= r.end),
            None => true,
        }
    }

    /// Every bitmap the checks of this epoch need, by owning node (to be fetched with the
    /// race plan's own).
    pub fn wanted(
        &self,
        intervals: &[IntervalRecord],
        vars: &VarTable,
    ) -> BTreeMap<NodeId, Vec<BitmapKey>> {
        let mut out: BTreeMap<NodeId, BTreeSet<BitmapKey>> = BTreeMap::new();
        for r in intervals {
            let Some(n) = r.race.as_ref() else { continue };
            for (runs, kind) in [(&n.reads, AccessKind::Read), (&n.writes, AccessKind::Write)] {
                for page in runs.iter() {
                    let Some(var) = vars.lookup(page) else {
                        continue;
                    };
                    if is_internal(var) {
                        continue;
                    }
                    let unchecked_page = !self.complete.contains(&page);
                    if unchecked_page || self.region_wants(var, page, r.node, kind) {
                        out.entry(r.node).or_default().insert(BitmapKey {
                            interval: r.index,
                            page,
                            kind,
                        });
                    }
                }
            }
        }
        out.into_iter()
            .map(|(node, keys)| (node, keys.into_iter().collect()))
            .collect()
    }

    /// Runs the checks of epoch `epoch` on its intervals and the fetched bitmaps (which
    /// must include everything [`Checker::wanted`] named), and takes the epoch's writes
    /// into account for later epochs.
    pub fn check(
        &mut self,
        epoch: u32,
        intervals: &[IntervalRecord],
        bitmaps: &Bitmaps,
        vars: &VarTable,
    ) -> Vec<Finding> {
        // Per page: the intervals that read it and those that wrote it.
        let mut readers: IntervalsByPage = BTreeMap::new();
        let mut writers: IntervalsByPage = BTreeMap::new();
        for r in intervals {
            let Some(n) = r.race.as_ref() else { continue };
            for page in n.reads.iter() {
                readers.entry(page).or_default().push(r);
            }
            for page in n.writes.iter() {
                writers.entry(page).or_default().push(r);
            }
        }
        let mut found = Found::default();
        let no_writers = Vec::new();
        // Uninitialised reads, then the epoch's writes into `written`.
        let pages: BTreeSet<PageNo> = readers.keys().chain(writers.keys()).copied().collect();
        for &page in &pages {
            if self.complete.contains(&page) {
                continue;
            }
            let Some(var) = vars.lookup(page) else {
                continue;
            };
            if is_internal(var) {
                continue;
            }
            let ws = writers.get(&page).unwrap_or(&no_writers);
            let rs = readers.get(&page).map_or(&[][..], Vec::as_slice);
            self.check_initialised(page, var, rs, ws, bitmaps, &mut found);
        }
        self.check_regions(intervals, bitmaps, vars, &mut found);
        self.findings(epoch, found, intervals, vars)
    }

    /// Reports the reads of `page` (of `var`) by `readers` that neither an earlier epoch
    /// nor a write that happens before them initialised, then takes the page's `writers`
    /// as having written it.
    fn check_initialised(
        &mut self,
        page: PageNo,
        var: &VarInfo,
        readers: &[&IntervalRecord],
        writers: &[&IntervalRecord],
        bitmaps: &Bitmaps,
        found: &mut Found,
    ) {
        let n = granules_on(var, page);
        let valid = full_mask(n);
        let before = self.written.get(&page);
        // Granules found uninitialised, taken as written afterwards so that each is
        // reported once, not at every later read.
        let mut reported = vec![0u64; valid.len()];
        for r in readers {
            let reads = bitmaps.get(r, page, AccessKind::Read);
            for (i, &v) in valid.iter().enumerate() {
                let read = word(reads, i) & v;
                if read == 0 {
                    continue;
                }
                let mut covered = before.map_or(0, |b| word(b, i));
                for w in writers {
                    if covered & read == read {
                        break;
                    }
                    if std::ptr::eq(*w, *r) || w.precedes(r) {
                        covered |= word(bitmaps.get(w, page, AccessKind::Write), i);
                    }
                }
                let uninitialised = read & !covered;
                reported[i] |= uninitialised;
                found.note(
                    FindingKind::UninitialisedRead,
                    var,
                    r,
                    page,
                    uninitialised,
                    i,
                );
            }
        }
        if writers.is_empty() && reported.iter().all(|&w| w == 0) {
            return;
        }
        let entry = self
            .written
            .entry(page)
            .or_insert_with(|| vec![0; n.div_ceil(64)]);
        for (e, r) in entry.iter_mut().zip(&reported) {
            *e |= r;
        }
        for w in writers {
            let bits = bitmaps.get(w, page, AccessKind::Write);
            for (i, e) in entry.iter_mut().enumerate() {
                *e |= word(bits, i);
            }
        }
        if entry.iter().zip(&valid).all(|(e, v)| e & v == *v) {
            self.written.remove(&page);
            self.complete.insert(page);
        }
    }

    /// Reports the accesses outside the declared regions.
    fn check_regions(
        &self,
        intervals: &[IntervalRecord],
        bitmaps: &Bitmaps,
        vars: &VarTable,
        found: &mut Found,
    ) {
        for r in intervals {
            let Some(notices) = r.race.as_ref() else {
                continue;
            };
            for (runs, kind, finding) in [
                (
                    &notices.reads,
                    AccessKind::Read,
                    FindingKind::ReadOutsideRegion,
                ),
                (
                    &notices.writes,
                    AccessKind::Write,
                    FindingKind::WriteOutsideRegion,
                ),
            ] {
                for page in runs.iter() {
                    let Some(var) = vars.lookup(page) else {
                        continue;
                    };
                    if !self.region_wants(var, page, r.node, kind) {
                        continue;
                    }
                    let allowed = self
                        .region_of(var)
                        .and_then(|g| g.ranges.get(r.node as usize))
                        .cloned()
                        .unwrap_or(0..0);
                    let bits = bitmaps.get(r, page, kind);
                    for (i, &w) in bits.iter().enumerate() {
                        let mut outside = 0u64;
                        let mut any = w;
                        while any != 0 {
                            let b = any.trailing_zeros() as usize;
                            any &= any - 1;
                            if !allowed.contains(&element_of(var, page, i * 64 + b)) {
                                outside |= 1 << b;
                            }
                        }
                        found.note(finding, var, r, page, outside, i);
                    }
                }
            }
        }
    }

    /// What was found, one [`Finding`] per kind, variable and node.
    fn findings(
        &self,
        epoch: u32,
        found: Found,
        intervals: &[IntervalRecord],
        vars: &VarTable,
    ) -> Vec<Finding> {
        let by_first_page: HashMap<PageNo, &VarInfo> = found
            .0
            .keys()
            .filter_map(|k| vars.lookup(k.1).map(|v| (k.1, v)))
            .collect();
        let began: HashMap<(NodeId, u32), SyncCause> = intervals
            .iter()
            .map(|r| ((r.node, r.index), r.began_with))
            .collect();
        found
            .0
            .into_iter()
            .map(|((kind, first, node), (indices, intervals))| {
                let var = by_first_page[&first];
                let interval = *intervals.first().expect("a finding has an interval");
                Finding {
                    kind,
                    epoch,
                    variable: var.name.clone(),
                    indices: indices.into_iter().collect(),
                    cols: var.cols,
                    node,
                    interval,
                    began_with: began[&(node, interval)],
                    intervals: intervals.len(),
                    region: match kind {
                        FindingKind::UninitialisedRead => None,
                        _ => self
                            .region_of(var)
                            .map(|g| g.ranges.get(node as usize).cloned().unwrap_or(0..0)),
                    },
                }
            })
            .collect()
    }
}

/// The intervals of an epoch that read (or wrote) each page.
type IntervalsByPage<'a> = BTreeMap<PageNo, Vec<&'a IntervalRecord>>;

/// What the checks of an epoch found so far: per (kind, variable's first page, node), the
/// elements and the intervals that made the accesses.
#[derive(Default)]
struct Found(BTreeMap<FindingKey, (BTreeSet<usize>, BTreeSet<u32>)>);

/// A finding's kind, its variable's first page and the node.
type FindingKey = (FindingKind, PageNo, NodeId);

impl Found {
    /// Notes the granules set in `bits`, word `i` of `page`'s bitmap, as accessed wrongly
    /// by `r`.
    fn note(
        &mut self,
        kind: FindingKind,
        var: &VarInfo,
        r: &IntervalRecord,
        page: PageNo,
        bits: u64,
        i: usize,
    ) {
        if bits == 0 {
            return;
        }
        let (elements, intervals) = self.0.entry((kind, var.first_page, r.node)).or_default();
        intervals.insert(r.index);
        let mut any = bits;
        while any != 0 {
            let g = i * 64 + any.trailing_zeros() as usize;
            any &= any - 1;
            elements.insert(element_of(var, page, g));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsm_proto::{EncodedBitmap, PageRuns, RaceNotices, VectorTime};

    fn var() -> VarInfo {
        // 1024 f64 = 2 pages
        VarInfo {
            name: "a".into(),
            first_page: 10,
            pages: 2,
            base_addr: 0,
            elem_size: 8,
            len: 1024,
            cols: None,
            granule_shift: 3,
        }
    }

    fn vars() -> VarTable {
        let mut t = VarTable::new();
        t.push(var());
        t
    }

    fn interval(
        node: NodeId,
        index: u32,
        vt: &[u32],
        reads: &[PageNo],
        writes: &[PageNo],
    ) -> IntervalRecord {
        let mut v = VectorTime::zero(vt.len());
        for (k, &x) in vt.iter().enumerate() {
            v.set(k as NodeId, x);
        }
        IntervalRecord {
            node,
            index,
            vt: v,
            writes: PageRuns::new(),
            race: Some(RaceNotices {
                reads: PageRuns::from_pages(reads.iter().copied()),
                writes: PageRuns::from_pages(writes.iter().copied()),
                ..Default::default()
            }),
            began_with: SyncCause::Start,
        }
    }

    /// A bitmap of the given elements (f64: one granule each) on `page`.
    fn bitmap(interval: u32, page: PageNo, kind: AccessKind, elems: Range<usize>) -> EncodedBitmap {
        let mut words = vec![0u64; 8];
        for e in elems {
            let g = e - (page - 10) as usize * 512;
            words[g / 64] |= 1 << (g % 64);
        }
        EncodedBitmap {
            key: BitmapKey {
                interval,
                page,
                kind,
            },
            bits: crate::record::encode_words(&words),
            sites: Default::default(),
            defs: Vec::new(),
        }
    }

    #[test]
    fn reads_of_unwritten_elements_are_found_and_ordered_writes_cover_them() {
        let vars = vars();
        let mut c = Checker::new();
        // Epoch 1: node 0 writes elements 0..100; node 1, after node 0's interval (vt[0]=1),
        // reads 0..110: 100..110 are uninitialised.
        let w = interval(0, 1, &[1, 0], &[], &[10]);
        let r = interval(1, 1, &[1, 1], &[10], &[]);
        let mut b = Bitmaps::new();
        b.insert(0, bitmap(1, 10, AccessKind::Write, 0..100));
        b.insert(1, bitmap(1, 10, AccessKind::Read, 0..110));
        let wanted = c.wanted(&[w.clone(), r.clone()], &vars);
        assert_eq!(wanted[&0].len(), 1);
        assert_eq!(wanted[&1].len(), 1);
        let f = c.check(1, &[w, r], &b, &vars);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, FindingKind::UninitialisedRead);
        assert_eq!(f[0].indices, (100..110).collect::<Vec<_>>());
        assert_eq!(f[0].node, 1);
        // Epoch 2: node 1 reads 0..100 again: written in epoch 1, nothing found.
        let r2 = interval(1, 2, &[1, 2], &[10], &[]);
        let mut b2 = Bitmaps::new();
        b2.insert(1, bitmap(2, 10, AccessKind::Read, 0..100));
        assert!(c.check(2, &[r2], &b2, &vars).is_empty());
    }

    #[test]
    fn a_concurrent_write_does_not_initialise_a_read() {
        let vars = vars();
        let mut c = Checker::new();
        let w = interval(0, 1, &[1, 0], &[], &[10]);
        let r = interval(1, 1, &[0, 1], &[10], &[]); // has not seen node 0's interval
        let mut b = Bitmaps::new();
        b.insert(0, bitmap(1, 10, AccessKind::Write, 0..512));
        b.insert(1, bitmap(1, 10, AccessKind::Read, 5..6));
        let f = c.check(1, &[w, r], &b, &vars);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].indices, vec![5]);
        // The page is complete now: no bitmap is wanted for it any more.
        let r2 = interval(1, 2, &[1, 2], &[10], &[]);
        assert!(c.wanted(&[r2], &vars).is_empty());
    }

    #[test]
    fn the_last_page_counts_only_the_allocations_elements_and_declared_zero_fill_is_initial() {
        let mut v = var();
        v.len = 600; // page 11 holds elements 512..600
        let mut vars = VarTable::new();
        vars.push(v.clone());
        let mut c = Checker::new();
        let w = interval(0, 1, &[1, 0], &[], &[11]);
        let mut b = Bitmaps::new();
        b.insert(0, bitmap(1, 11, AccessKind::Write, 512..600));
        assert!(c.check(1, &[w], &b, &vars).is_empty());
        assert!(c.complete.contains(&11));
        let mut c = Checker::new();
        c.initialised(&v);
        let r = interval(1, 1, &[0, 1], &[10, 11], &[]);
        assert!(c.wanted(&[r], &vars).is_empty());
    }

    #[test]
    fn regions_report_only_accesses_outside_the_nodes_range() {
        let vars = vars();
        let mut c = Checker::new();
        c.initialised(&var());
        c.declare_region(&var(), RegionRule::Writes, vec![0..512, 512..1024]);
        // Node 0 writes inside its range (page 10 wholly inside: not even fetched) and
        // reads node 1's part (fine under the Writes rule); node 1 writes 500..520.
        let a = interval(0, 1, &[1, 0], &[11], &[10]);
        let bi = interval(1, 1, &[0, 1], &[], &[10, 11]);
        let wanted = c.wanted(&[a.clone(), bi.clone()], &vars);
        assert!(!wanted.contains_key(&0), "{wanted:?}");
        assert_eq!(wanted[&1].len(), 1, "page 11 lies inside node 1's range");
        let mut b = Bitmaps::new();
        b.insert(1, bitmap(1, 10, AccessKind::Write, 500..512));
        let f = c.check(1, &[a, bi], &b, &vars);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, FindingKind::WriteOutsideRegion);
        assert_eq!(f[0].indices, (500..512).collect::<Vec<_>>());
        assert_eq!(f[0].region, Some(512..1024));
    }
}
