//! Access recording. Every access through the typed API marks the granules it touches in a
//! per-allocation shadow bitmap (one read and one write bit per granule) and flags the page
//! as read or written in the current interval. At interval end the flagged pages become
//! the interval's read and write notices, their bitmaps move to the epoch store (where the
//! barrier master may ask for them) and the shadow is cleared. An interval that touched
//! many pages of an allocation (a grid's band between two barriers) leaves that
//! allocation's whole shadow to the store instead and records on in a spare one (see
//! `DEFER_MIN_PAGES`): the master asks for a few boundary pages of the thousand. The
//! epoch store is emptied at every barrier, so memory is bounded by one epoch.
//!
//! The granule of an allocation is the largest power of two, at most 8 bytes, dividing its
//! element size: two different elements never share a granule (so neighbouring `u8`
//! elements are told apart) while an `f64` costs one bit, not eight.
//!
//! Every access also notes its source site (the program's line, through
//! `#[track_caller]`): per page and kind, the interval keeps a short most-recently-used
//! list of the sites that touched it, each with the first and last granule it touched, so
//! that a race names both sides' lines in the run that found it. Sites get small numbers
//! per node; the bitmaps carry their sites' spans.
//!
//! The hot path (`read`/`write` of one element) is a flag test, one word OR and a compare
//! of the site with the page's latest; the first touch of a page in an interval, and a
//! site other than the page's latest, take an out-of-line path. Nothing allocates per
//! access once an interval's first accesses have grown the site list.

use dsm_proto::{
    AccessKind, BitmapColumns, BitmapKey, ColumnEntry, EncodedBitmap, Extents, PageExtent, PageNo,
    PageRuns, RaceNotices, SiteSpan, SmallVec, SourceSite, PAGE_SHIFT, PAGE_SIZE,
};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, TryReserveError};
use std::panic::Location;
use std::rc::Rc;

/// A node's numbers for its sites, by site key: looked up once per bitmap stored, where
/// SipHash cost more than the rest of the lookup.
type SiteNumbers = HashMap<usize, u32, foldhash::fast::RandomState>;

/// Where an access was made: a Rust source location, as `#[track_caller]` gives it, or
/// the instrumented instruction of a program compiled with ThreadSanitizer
/// instrumentation (C and C++ through dsm-capi), as its address relative to the
/// executable's load address, so that it means the same on every rank and is symbolised
/// from the executable's debug information by the rank that reports the race.
#[derive(Clone, Copy, Debug)]
pub enum Site {
    /// A line of a Rust program.
    Rust(&'static Location<'static>),
    /// An address in the executable (runtime address minus load bias).
    Code(u64),
}

impl Site {
    /// One word that tells sites apart: a location's address (aligned, so even) or the
    /// code address shifted left with the low bit set.
    #[inline(always)]
    fn key(self) -> usize {
        match self {
            Site::Rust(l) => l as *const Location<'static> as usize,
            Site::Code(a) => ((a as usize) << 1) | 1,
        }
    }

    /// The site as sent to the reporting rank.
    fn source(self) -> SourceSite {
        match self {
            Site::Rust(l) => SourceSite {
                file: l.file().to_string(),
                line: l.line(),
                column: l.column(),
                code: None,
            },
            Site::Code(a) => SourceSite {
                file: String::new(),
                line: 0,
                column: 0,
                code: Some(a),
            },
        }
    }
}

impl PartialEq for Site {
    /// Identity, not contents: one compare on the hot path.
    #[inline(always)]
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Site {}

/// A bitmap's site span as stored: the node's site number, first and last granule.
type StoredSpan = (u32, u16, u16);

const READ: u8 = 1;
const WRITE: u8 = 2;
/// A frozen interval's page (see [`Recorder::freeze_interval`]) keeps its flags shifted
/// up by this much: no access kind's bit is set, so the next access to it takes the
/// first-touch path, which moves the frozen contents aside before recording.
const FROZEN_SHIFT: u32 = 2;
const FROZEN: u8 = (READ | WRITE) << FROZEN_SHIFT;

/// Intervals that touched more pages than this are closed at a release, not frozen:
/// freezing and thawing cost a pass over the touched pages, which pays for a critical
/// section's few pages only.
const FREEZE_MAX_PAGES: usize = 16;

/// Granule shift for an element size: log2 of the largest power of two <= 8 dividing it.
pub fn granule_shift(elem_size: usize) -> u32 {
    if elem_size == 0 {
        return 0;
    }
    elem_size.trailing_zeros().min(3)
}

/// The shadow of one allocation (allocations are page-aligned).
pub struct AllocShadow {
    first_page: PageNo,
    shift: u32,
    words_per_page: usize,
    /// What the interval being recorded touched.
    now: IntervalShadow,
    /// The other [`IntervalShadow`], which the epoch store holds while a closed interval's
    /// bitmaps are in it (see [`DEFER_MIN_PAGES`]).
    spare: Spare,
    /// The last strided pattern built: (period, width, bits).
    pattern: Cell<(usize, usize, u64)>,
    /// Pages of a frozen interval that were touched again before it closed: their frozen
    /// contents, moved aside so that the page records the next interval.
    held: RefCell<Vec<HeldPage>>,
    /// First touches so far, of every allocation of the recorder (see
    /// [`Recorder::freeze_interval`]).
    touches: Rc<Cell<u64>>,
}

/// An allocation's spare [`IntervalShadow`].
enum Spare {
    /// None made yet: the allocation has not closed a large interval.
    None,
    /// Cleared, to record the next interval in when a large one closes.
    Ready(IntervalShadow),
    /// The epoch store holds the allocation's other shadow: a large interval now copies
    /// into the arena.
    Lent,
}

/// What one interval touched in one allocation: its bitmaps, the pages it flagged and the
/// sites that touched them.
struct IntervalShadow {
    read: Vec<Cell<u64>>,
    write: Vec<Cell<u64>>,
    flags: Vec<Cell<u8>>,
    touched: RefCell<Vec<u32>>,
    /// Per page and kind (`2 * page` reads, `2 * page + 1` writes), the one site that
    /// touched it in the interval so far, while there is only one (its span is then the
    /// whole page: one compare per access, as most pages are touched from one line).
    site_single: Vec<Cell<Option<Site>>>,
    /// Per page and kind, once a second site touched it, the head of the interval's list
    /// of its sites, as an index into `runs` plus one (0: none).
    site_heads: Vec<Cell<u32>>,
    /// The interval's site runs; each page's list is most recently used first.
    runs: RefCell<Vec<SiteRun>>,
}

/// A frozen interval's page, moved out of the shadow by a later access (see
/// [`Recorder::freeze_interval`]).
struct HeldPage {
    page: u32,
    /// Its access flags in the frozen interval.
    flags: u8,
    /// Its read and write words (empty for a kind it was not accessed with).
    words: [Vec<Cell<u64>>; 2],
    /// Its read and write site spans, as [`IntervalShadow::sites_of`] gives them.
    sites: [Vec<(Site, u16, u16)>; 2],
}

impl IntervalShadow {
    /// The sites of `page`'s accesses of `kind` (of a page of `words_per_page` words), as
    /// spans of granules of the page sorted by first granule; with `take`, forgets them.
    fn sites_of(
        &self,
        page: usize,
        kind: u8,
        words_per_page: usize,
        take: bool,
        out: &mut Vec<(Site, u16, u16)>,
    ) {
        let slot = 2 * page + usize::from(kind == WRITE);
        let single = if take {
            self.site_single[slot].take()
        } else {
            self.site_single[slot].get()
        };
        if let Some(only) = single {
            let last = (words_per_page * 64 - 1).min(u16::MAX as usize) as u16;
            out.push((only, 0, last));
            return;
        }
        let runs = self.runs.borrow();
        let base = page * words_per_page * 64;
        let mut at = if take {
            self.site_heads[slot].replace(0)
        } else {
            self.site_heads[slot].get()
        };
        let start = out.len();
        while at != 0 {
            let r = &runs[at as usize - 1];
            let g = |x: usize| x.saturating_sub(base).min(u16::MAX as usize) as u16;
            out.push((r.site.get(), g(r.first.get()), g(r.last.get())));
            at = r.next;
        }
        out[start..].sort_unstable_by_key(|s| s.1);
    }

    /// Clears what the interval recorded (pages of `words_per_page` words), so that the
    /// shadow can record another; costs the pages it touched.
    fn clear(&mut self, words_per_page: usize) {
        let mut touched = std::mem::take(self.touched.get_mut());
        // A band's pages come in long runs: each run is cleared in one pass per table.
        let mut at = 0;
        while at < touched.len() {
            let first = touched[at] as usize;
            let mut end = first + 1;
            at += 1;
            while at < touched.len() && touched[at] as usize == end {
                end += 1;
                at += 1;
            }
            let words = first * words_per_page..end * words_per_page;
            self.read[words.clone()]
                .iter_mut()
                .for_each(|w| *w.get_mut() = 0);
            self.write[words].iter_mut().for_each(|w| *w.get_mut() = 0);
            self.flags[first..end]
                .iter_mut()
                .for_each(|f| *f.get_mut() = 0);
            let slots = 2 * first..2 * end;
            self.site_single[slots.clone()]
                .iter_mut()
                .for_each(|s| *s.get_mut() = None);
            self.site_heads[slots]
                .iter_mut()
                .for_each(|h| *h.get_mut() = 0);
        }
        touched.clear();
        *self.touched.get_mut() = touched;
        self.runs.get_mut().clear();
    }

    /// An empty interval shadow of `pages` pages.
    fn new(pages: usize, words_per_page: usize) -> Result<Self, TryReserveError> {
        fn zeroed<T: Clone>(len: usize, zero: T) -> Result<Vec<T>, TryReserveError> {
            let mut v = Vec::new();
            v.try_reserve_exact(len)?;
            v.resize(len, zero);
            Ok(v)
        }
        // `pages * words_per_page` cannot overflow: it is at most the allocation's bytes
        // / 8, rounded up.
        Ok(IntervalShadow {
            read: zeroed(pages * words_per_page, Cell::new(0))?,
            write: zeroed(pages * words_per_page, Cell::new(0))?,
            flags: zeroed(pages, Cell::new(0))?,
            touched: RefCell::new(Vec::new()),
            site_single: zeroed(pages * 2, Cell::new(None))?,
            site_heads: zeroed(pages * 2, Cell::new(0))?,
            runs: RefCell::new(Vec::new()),
        })
    }
}

/// One site's accesses of one kind to one page in the current interval.
struct SiteRun {
    site: Cell<Site>,
    /// First and last granule (of the allocation) the site touched on the page.
    first: Cell<usize>,
    last: Cell<usize>,
    /// The next run of the same page and kind (index plus one; 0: the end).
    next: u32,
}

impl AllocShadow {
    /// The shadow of an allocation of `bytes` bytes from `first_page`, or the reason its
    /// bitmaps could not be allocated (their size is the program's to choose).
    fn new(
        first_page: PageNo,
        bytes: usize,
        elem_size: usize,
        touches: Rc<Cell<u64>>,
    ) -> Result<Self, TryReserveError> {
        let pages = bytes.div_ceil(PAGE_SIZE).max(1);
        let shift = granule_shift(elem_size);
        let words_per_page = (PAGE_SIZE >> shift) / 64;
        Ok(AllocShadow {
            first_page,
            shift,
            words_per_page,
            now: IntervalShadow::new(pages, words_per_page)?,
            spare: Spare::None,
            pattern: Cell::new((0, 0, 0)),
            held: RefCell::new(Vec::new()),
            touches,
        })
    }

    /// `log2` of the bytes each bitmap bit stands for in this allocation (see
    /// [`granule_shift`]).
    pub fn granule_shift(&self) -> u32 {
        self.shift
    }

    #[cold]
    #[inline(never)]
    fn first_touch(&self, page: usize, kind: u8) {
        self.touches.set(self.touches.get() + 1);
        let f = &self.now.flags[page];
        let flags = f.get();
        if flags & FROZEN != 0 {
            // Already in `touched`, for the frozen interval: it goes on being listed
            // there for the open one.
            self.hold_frozen(page, flags >> FROZEN_SHIFT);
            f.set(kind);
            return;
        }
        let slice = std::slice::from_ref(f);
        Self::flag_unfrozen(page, slice, kind, &mut self.now.touched.borrow_mut());
    }

    /// Flags the not-frozen pages `p0..` whose `flags` lack `kind` (listing those touched
    /// for the first time in `touched`); returns how many it flagged.
    fn flag_unfrozen(p0: usize, flags: &[Cell<u8>], kind: u8, touched: &mut Vec<u32>) -> u64 {
        let mut flagged = 0;
        for (p, f) in (p0..).zip(flags) {
            let was = f.get();
            if was & kind != 0 {
                continue;
            }
            if was == 0 {
                touched.push(p as u32);
            }
            f.set(was | kind);
            flagged += 1;
        }
        flagged
    }

    /// Moves frozen page `page`'s contents (accessed as `flags` says) into the held
    /// pages and clears it, so that the page records the open interval alone.
    fn hold_frozen(&self, page: usize, flags: u8) {
        let wpp = self.words_per_page;
        let mut held = HeldPage {
            page: page as u32,
            flags,
            words: [Vec::new(), Vec::new()],
            sites: [Vec::new(), Vec::new()],
        };
        for (k, bit, bits) in [(0, READ, &self.now.read), (1, WRITE, &self.now.write)] {
            if flags & bit != 0 {
                held.words[k] = bits[page * wpp..(page + 1) * wpp]
                    .iter()
                    .map(|w| Cell::new(w.take()))
                    .collect();
                self.take_sites(page, bit, &mut held.sites[k]);
            }
        }
        self.held.borrow_mut().push(held);
    }

    #[inline(always)]
    fn flag_pages(&self, first_byte: usize, last_byte: usize, kind: u8) {
        let (p0, p1) = (first_byte >> PAGE_SHIFT, last_byte >> PAGE_SHIFT);
        if p1 != p0 {
            return self.flag_page_range(p0, p1, kind);
        }
        if self.now.flags[p0].get() & kind == 0 {
            self.first_touch(p0, kind);
        }
    }

    /// [`AllocShadow::flag_pages`] for an access over pages `p0..=p1`: a block of rows
    /// flags hundreds of pages, which take one borrow of the touched list and one count
    /// here instead of a call each. A frozen page among them goes through
    /// [`AllocShadow::first_touch`], which moves its contents aside.
    fn flag_page_range(&self, p0: usize, p1: usize, kind: u8) {
        let flags = &self.now.flags[p0..=p1];
        if flags.iter().any(|f| f.get() & FROZEN != 0) {
            for p in p0..=p1 {
                if self.now.flags[p].get() & kind == 0 {
                    self.first_touch(p, kind);
                }
            }
            return;
        }
        let first = Self::flag_unfrozen(p0, flags, kind, &mut self.now.touched.borrow_mut());
        self.touches.set(self.touches.get() + first);
    }

    /// Notes that `site` touched granules `g0..g1` (of the allocation) on `page` with an
    /// access of `kind`. Costs a compare while one site touches the page, and a compare
    /// and a range update when the page's latest site of that kind is `site`.
    #[inline(always)]
    fn note_site(&self, page: usize, kind: u8, g0: usize, g1: usize, site: Site) {
        let slot = 2 * page + usize::from(kind == WRITE);
        let head = self.now.site_heads[slot].get();
        if head == 0 {
            match self.now.site_single[slot].get() {
                Some(s) if s == site => return,
                None => return self.now.site_single[slot].set(Some(site)),
                Some(_) => {}
            }
        } else {
            let runs = self.now.runs.borrow();
            let r = &runs[head as usize - 1];
            if r.site.get() == site {
                r.first.set(r.first.get().min(g0));
                r.last.set(r.last.get().max(g1 - 1));
                return;
            }
        }
        self.site_changed(slot, g0, g1, site);
    }

    /// [`AllocShadow::note_site`] for an access from a site other than the page's latest:
    /// the site's run moves to the front of the page's list (its contents are swapped with
    /// the head's, so the links stay), or a new run starts there.
    /// A page touched by one site so far turns its span into a run over the whole page
    /// (which granules it touched was not tracked); a granule is later named after the
    /// narrowest span holding it.
    #[cold]
    #[inline(never)]
    fn site_changed(&self, slot: usize, g0: usize, g1: usize, site: Site) {
        let mut runs = self.now.runs.borrow_mut();
        if let Some(only) = self.now.site_single[slot].take() {
            let per_page = self.words_per_page * 64;
            let start = (slot / 2) * per_page;
            runs.push(SiteRun {
                site: Cell::new(only),
                first: Cell::new(start),
                last: Cell::new(start + per_page - 1),
                next: 0,
            });
            self.now.site_heads[slot].set(runs.len() as u32);
        }
        let head = self.now.site_heads[slot].get();
        let mut at = head;
        while at != 0 {
            let r = &runs[at as usize - 1];
            if r.site.get() == site {
                let h = &runs[head as usize - 1];
                let (first, last) = (r.first.get(), r.last.get());
                r.site.set(h.site.get());
                r.first.set(h.first.get());
                r.last.set(h.last.get());
                h.site.set(site);
                h.first.set(first.min(g0));
                h.last.set(last.max(g1 - 1));
                return;
            }
            at = r.next;
        }
        runs.push(SiteRun {
            site: Cell::new(site),
            first: Cell::new(g0),
            last: Cell::new(g1 - 1),
            next: head,
        });
        self.now.site_heads[slot].set(runs.len() as u32);
    }

    /// Notes `site` on every page of granules `g0..g1` (each page gets its part).
    #[inline(always)]
    fn note_site_range(&self, p0: usize, p1: usize, kind: u8, g0: usize, g1: usize, site: Site) {
        if p0 == p1 {
            return self.note_site(p0, kind, g0, g1, site);
        }
        let per_page = self.words_per_page * 64;
        for p in p0..=p1 {
            let lo = g0.max(p * per_page);
            let hi = g1.min((p + 1) * per_page);
            if lo < hi {
                self.note_site(p, kind, lo, hi, site);
            }
        }
    }

    /// The sites of `page`'s accesses of `kind` in the interval, as spans of granules of
    /// the page sorted by first granule; forgets them.
    fn take_sites(&self, page: usize, kind: u8, out: &mut Vec<(Site, u16, u16)>) {
        self.now
            .sites_of(page, kind, self.words_per_page, true, out);
    }

    /// Sets bits `g0..g1` of a flat bitmap.
    #[inline(always)]
    fn set_bits(bits: &[Cell<u64>], g0: usize, g1: usize) {
        let (w0, w1) = (g0 >> 6, (g1 - 1) >> 6);
        if w0 == w1 {
            let n = g1 - g0;
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << (g0 & 63)
            };
            bits[w0].set(bits[w0].get() | mask);
        } else {
            bits[w0].set(bits[w0].get() | (u64::MAX << (g0 & 63)));
            for w in &bits[w0 + 1..w1] {
                w.set(u64::MAX);
            }
            let tail = g1 - (w1 << 6);
            let mask = if tail == 64 {
                u64::MAX
            } else {
                (1u64 << tail) - 1
            };
            bits[w1].set(bits[w1].get() | mask);
        }
    }

    #[inline(always)]
    fn mark(&self, kind: u8, offset: usize, len: usize, site: Site) {
        if len == 0 {
            return;
        }
        let last = offset + len - 1;
        let bits = if kind == READ {
            &self.now.read
        } else {
            &self.now.write
        };
        let (g0, g1) = (offset >> self.shift, (last >> self.shift) + 1);
        if g1 == g0 + 1 {
            // One granule (a typed element of up to 8 bytes, the common access): granules
            // are aligned and at most 8 bytes, so it lies in one page, and it is one bit.
            let page = offset >> PAGE_SHIFT;
            if self.now.flags[page].get() & kind == 0 {
                self.first_touch(page, kind);
            }
            let w = &bits[g0 >> 6];
            w.set(w.get() | 1 << (g0 & 63));
            return self.note_site(page, kind, g0, g1, site);
        }
        self.flag_pages(offset, last, kind);
        Self::set_bits(bits, g0, g1);
        self.note_site_range(offset >> PAGE_SHIFT, last >> PAGE_SHIFT, kind, g0, g1, site);
    }

    /// Records a read of `len` bytes at byte `offset` of the allocation, made at the
    /// caller's source line.
    #[inline(always)]
    #[track_caller]
    pub fn read(&self, offset: usize, len: usize) {
        self.mark(READ, offset, len, Site::Rust(Location::caller()));
    }

    /// Records a write of `len` bytes at byte `offset` of the allocation, made at the
    /// caller's source line.
    #[inline(always)]
    #[track_caller]
    pub fn write(&self, offset: usize, len: usize) {
        self.mark(WRITE, offset, len, Site::Rust(Location::caller()));
    }

    /// Records an access of `len` bytes at byte `offset` of the allocation made at `site`:
    /// for runtimes that know the access's site otherwise than by `#[track_caller]`
    /// (dsm-capi's ThreadSanitizer hooks, which know the instrumented instruction).
    #[inline(always)]
    pub fn access_at(&self, write: bool, offset: usize, len: usize, site: Site) {
        self.mark(if write { WRITE } else { READ }, offset, len, site);
    }

    /// Records accesses to `count` elements of `elem` bytes, `stride` bytes apart, from
    /// byte `offset`, made at the caller's source line. Regular patterns are written a
    /// word at a time.
    #[track_caller]
    pub fn strided(&self, write: bool, offset: usize, elem: usize, stride: usize, count: usize) {
        self.strided_at(
            write,
            offset,
            elem,
            stride,
            count,
            Site::Rust(Location::caller()),
        );
    }

    /// [`AllocShadow::strided`] made at `site` (see [`AllocShadow::access_at`]).
    #[inline]
    pub fn strided_at(
        &self,
        write: bool,
        offset: usize,
        elem: usize,
        stride: usize,
        count: usize,
        site: Site,
    ) {
        if count == 0 || elem == 0 {
            return;
        }
        let kind = if write { WRITE } else { READ };
        if stride == elem {
            return self.mark(kind, offset, elem * count, site);
        }
        let last = offset + stride * (count - 1) + elem - 1;
        self.flag_pages(offset, last, kind);
        self.note_site_range(
            offset >> PAGE_SHIFT,
            last >> PAGE_SHIFT,
            kind,
            offset >> self.shift,
            (last >> self.shift) + 1,
            site,
        );
        let bits = if write {
            &self.now.write
        } else {
            &self.now.read
        };
        let s = self.shift;
        let granule_mask = (1usize << s) - 1;
        let period = stride >> s;
        let width = ((offset + elem - 1) >> s) - (offset >> s) + 1;
        // Short rows are common (SOR marks five per grid row), so the fast path avoids
        // divisions: power-of-two periods only, which covers the usual strides.
        if (stride | offset) & granule_mask == 0
            && period.is_power_of_two()
            && period <= 64
            && width < period
            && count >= 8
        {
            // The bit pattern repeats every word: build it by doubling, rotate it to the
            // first element's phase, then OR whole words (the middle loop vectorizes).
            let g0 = offset >> s;
            let g_end = (last >> s) + 1;
            let (cached_period, cached_width, cached) = self.pattern.get();
            let base = if cached_period == period && cached_width == width {
                cached
            } else {
                let mut p = (1u64 << width) - 1;
                let mut filled = period;
                while filled < 64 {
                    p |= p << filled;
                    filled *= 2;
                }
                self.pattern.set((period, width, p));
                p
            };
            let pattern = base.rotate_left((g0 & (period - 1)) as u32);
            let (w0, w1) = (g0 >> 6, (g_end - 1) >> 6);
            let head = u64::MAX << (g0 & 63);
            let tail_bits = ((g_end - 1) & 63) + 1;
            let tail = if tail_bits == 64 {
                u64::MAX
            } else {
                (1u64 << tail_bits) - 1
            };
            if w0 == w1 {
                let c = &bits[w0];
                c.set(c.get() | (pattern & head & tail));
            } else {
                bits[w0].set(bits[w0].get() | (pattern & head));
                for c in &bits[w0 + 1..w1] {
                    c.set(c.get() | pattern);
                }
                bits[w1].set(bits[w1].get() | (pattern & tail));
            }
        } else {
            for k in 0..count {
                let o = offset + k * stride;
                Self::set_bits(bits, o >> s, ((o + elem - 1) >> s) + 1);
            }
        }
    }
}

/// One stored bitmap, or a run of pages with the same bitmap: where its words are in the
/// epoch's arena. A bitmap whose words are all equal (regular access patterns: whole
/// pages, strided rows) keeps one word, and consecutive pages of one allocation whose
/// bitmaps are that same word with the same sites share one entry.
#[derive(Clone, Copy)]
struct Stored {
    page: PageNo,
    /// Pages in the run (`page..page + pages`); more than one only for uniform bitmaps.
    pages: u32,
    kind: AccessKind,
    offset: u32,
    uniform: bool,
    /// Its sites: `EpochStore::sites[sites.0..sites.1]`.
    sites: (u32, u32),
}

/// Intervals that touched at least this many pages of one allocation leave that
/// allocation's interval shadow to the epoch store as it is and record on in a spare one:
/// a grid's band of a thousand pages closes without a bitmap copied per page, and the few
/// pages the barrier master asks for are read from the kept shadow. Smaller intervals
/// (lock-protected updates) copy their pages into the arena, where any number of them fit.
const DEFER_MIN_PAGES: usize = 64;

/// An allocation's interval shadow that the epoch store holds for a closed interval (see
/// [`DEFER_MIN_PAGES`]); its pages are those in `shadow.touched`, sorted.
struct Deferred {
    /// The allocation's index in the recorder, to give the shadow back.
    alloc: usize,
    first_page: PageNo,
    words_per_page: usize,
    shadow: IntervalShadow,
}

impl Deferred {
    /// Its bitmap of `kind` for `page`, if the interval touched it so.
    fn page(&self, page: PageNo, kind: AccessKind) -> Option<StoredPage<'_>> {
        let local = page.checked_sub(self.first_page)? as usize;
        let flags = self.shadow.flags.get(local)?.get();
        (flags & kind_bit(kind) != 0).then(|| self.page_at(local, kind))
    }

    /// Its bitmap of `kind` for local page `local`.
    fn page_at(&self, local: usize, kind: AccessKind) -> StoredPage<'_> {
        let bits = match kind {
            AccessKind::Read => &self.shadow.read,
            AccessKind::Write => &self.shadow.write,
        };
        let wpp = self.words_per_page;
        StoredPage {
            page: self.first_page + local as PageNo,
            kind,
            words: Words::Live(&bits[local * wpp..(local + 1) * wpp]),
            words_per_page: wpp,
            sites: PageSites::Live(&self.shadow, local),
        }
    }

    /// Its bitmaps: reads, then writes, each in page order.
    fn pages(&self) -> impl Iterator<Item = StoredPage<'_>> + '_ {
        let touched = self.shadow.touched.borrow().clone();
        [AccessKind::Read, AccessKind::Write]
            .into_iter()
            .flat_map(move |kind| {
                let pages: Vec<usize> = touched
                    .iter()
                    .map(|&p| p as usize)
                    .filter(|&p| self.shadow.flags[p].get() & kind_bit(kind) != 0)
                    .collect();
                pages.into_iter().map(move |p| self.page_at(p, kind))
            })
    }

    /// Its bitmaps of pages that pass `keep`, in the order of [`Deferred::pages`]; a page
    /// is tested before its bitmap is looked at (an arrival ships the few shared pages of
    /// a band of thousands).
    fn for_each_page_where(
        &self,
        keep: &mut impl FnMut(PageNo) -> bool,
        mut f: impl FnMut(StoredPage<'_>),
    ) {
        let kept: SmallVec<[u32; 16]> = self
            .shadow
            .touched
            .borrow()
            .iter()
            .copied()
            .filter(|&p| keep(self.first_page + p as PageNo))
            .collect();
        for kind in [AccessKind::Read, AccessKind::Write] {
            for &p in &kept {
                let local = p as usize;
                if self.shadow.flags[local].get() & kind_bit(kind) != 0 {
                    f(self.page_at(local, kind));
                }
            }
        }
    }

    /// Page bitmaps held.
    fn page_bitmaps(&self) -> usize {
        self.shadow
            .touched
            .borrow()
            .iter()
            .map(|&p| self.shadow.flags[p as usize].get().count_ones() as usize)
            .sum()
    }
}

/// A stored bitmap's words.
#[derive(Clone, Copy)]
enum Words<'a> {
    /// Every word is this one.
    Uniform(u64),
    /// All of them, in the arena.
    Full(&'a [u64]),
    /// All of them, in a deferred interval shadow.
    Live(&'a [Cell<u64>]),
}

impl Words<'_> {
    /// Word `k` of the page's bitmap.
    fn word(&self, k: usize) -> u64 {
        match self {
            Words::Uniform(w) => *w,
            Words::Full(words) => words[k],
            Words::Live(words) => words[k].get(),
        }
    }

    /// The one word of a bitmap whose words are all equal.
    fn uniform(&self) -> Option<u64> {
        match self {
            Words::Uniform(w) => Some(*w),
            Words::Full(_) => None,
            Words::Live(words) => {
                let first = words[0].get();
                words.iter().all(|w| w.get() == first).then_some(first)
            }
        }
    }

    /// All `words_per_page` words.
    fn to_vec(self, words_per_page: usize) -> Vec<u64> {
        (0..words_per_page).map(|k| self.word(k)).collect()
    }

    /// Wire form (see [`encode_uniform`] and [`encode_words`]).
    fn encode(self, words_per_page: usize) -> Vec<u8> {
        match (self.uniform(), self) {
            (Some(w), _) => encode_uniform(w, words_per_page),
            (None, Words::Full(words)) => encode_words(words),
            (None, _) => encode_words(&self.to_vec(words_per_page)),
        }
    }

    /// Feeds the bitmap to `f` in one form whatever holds it: its one word if uniform,
    /// else every word.
    fn for_each_canonical(self, words_per_page: usize, mut f: impl FnMut(u64)) {
        match self.uniform() {
            Some(w) => f(w),
            None => (0..words_per_page).for_each(|k| f(self.word(k))),
        }
    }
}

/// A stored bitmap's sites.
#[derive(Clone, Copy)]
enum PageSites<'a> {
    /// Spans in the arena's site table.
    Stored(&'a [StoredSpan]),
    /// Local page of a deferred interval shadow, whose sites are numbered when asked for.
    Live(&'a IntervalShadow, usize),
}

/// One page's bitmap as the store holds it.
#[derive(Clone, Copy)]
struct StoredPage<'a> {
    page: PageNo,
    kind: AccessKind,
    words: Words<'a>,
    /// Words per page of its allocation.
    words_per_page: usize,
    sites: PageSites<'a>,
}

impl StoredPage<'_> {
    /// Its site spans, numbering sites not seen before.
    fn spans(&self, names: &mut SiteNames<'_>) -> Vec<StoredSpan> {
        let mut out = Vec::new();
        self.spans_into(names, &mut out);
        out
    }

    /// [`StoredPage::spans`], appended to `out`.
    fn spans_into(&self, names: &mut SiteNames<'_>, out: &mut Vec<StoredSpan>) {
        match self.sites {
            PageSites::Stored(spans) => out.extend_from_slice(spans),
            PageSites::Live(shadow, local) => {
                let mut found = Vec::new();
                let bit = kind_bit(self.kind);
                shadow.sites_of(local, bit, self.words_per_page, false, &mut found);
                let k = usize::from(self.kind == AccessKind::Write);
                out.extend(
                    found
                        .into_iter()
                        .map(|(site, first, last)| (names.number(site, k), first, last)),
                );
            }
        }
    }
}

/// One interval's part of the epoch store: its read bitmaps are `index[reads.0..reads.1]`
/// and its write bitmaps `index[reads.1..writes_end]`, each sorted by page, runs not
/// overlapping; the words per page of the allocations they lie in are
/// `words_per_page[table.0..table.1]`; its words and site spans start at `words_start`
/// and `sites_start` of the arena; the shadows of allocations it touched many pages of
/// are `deferred[deferred.0..deferred.1]`.
#[derive(Clone, Copy)]
struct IntervalSpan {
    interval: u32,
    reads: (usize, usize),
    writes_end: usize,
    table: (usize, usize),
    words_start: usize,
    sites_start: usize,
    deferred: (usize, usize),
}

impl IntervalSpan {
    /// The index range of the interval's arena bitmaps of `kind`.
    fn of_kind(&self, kind: AccessKind) -> std::ops::Range<usize> {
        match kind {
            AccessKind::Read => self.reads.0..self.reads.1,
            AccessKind::Write => self.reads.1..self.writes_end,
        }
    }
}

/// Words per page of the allocation holding `page` (`table` sorted by first page).
fn words_for(table: &[(PageNo, usize)], page: PageNo) -> usize {
    table
        .iter()
        .rev()
        .find(|(first, _)| *first <= page)
        .map_or(0, |w| w.1)
}

/// Bitmaps of one epoch, interval by interval (intervals are appended in order), in one
/// arena, and the interval shadows of large intervals: closing an interval allocates
/// nothing once the epoch's first ones have grown the arena, and a barrier empties it
/// keeping its room.
#[derive(Default)]
struct EpochStore {
    spans: Vec<IntervalSpan>,
    index: Vec<Stored>,
    words: Vec<u64>,
    words_per_page: Vec<(PageNo, usize)>,
    /// The bitmaps' site spans.
    sites: Vec<StoredSpan>,
    deferred: Vec<Deferred>,
    /// The bitmap bytes of the `deferred` shadows' touched pages, counted as they come
    /// (a band's shadow has a thousand pages to count).
    deferred_bytes: usize,
    /// Page bitmaps held (a run counts its pages).
    page_bitmaps: usize,
    bytes: usize,
}

/// A bitmap's site spans and the definitions it carries: those of its sites that the
/// list being built (`defined` tells which were named) has not named before.
type WireSites = (SmallVec<[SiteSpan; 2]>, Vec<(u32, SourceSite)>);

/// Wire form of `spans`, each site's first mention in the list being built carrying its
/// definition from `table`.
fn wire_sites(spans: &[StoredSpan], table: &[Site], defined: &mut Vec<bool>) -> WireSites {
    let mut defs = Vec::new();
    let sites = spans
        .iter()
        .map(|&span| wire_span(span, table, defined, &mut defs))
        .collect();
    (sites, defs)
}

/// `span` in wire form; the site's definition goes to `defs` at its first mention in the
/// list being built (`defined`, indexed by site, tells which were named).
fn wire_span(
    (site, first, last): StoredSpan,
    table: &[Site],
    defined: &mut Vec<bool>,
    defs: &mut Vec<(u32, SourceSite)>,
) -> SiteSpan {
    if defined.len() < table.len() {
        defined.resize(table.len(), false);
    }
    if !std::mem::replace(&mut defined[site as usize], true) {
        defs.push((site, table[site as usize].source()));
    }
    SiteSpan { site, first, last }
}

impl EpochStore {
    /// The page bitmaps of one span: its arena's reads, then writes, each in page order,
    /// then each deferred shadow's.
    fn pages<'a>(&'a self, span: &IntervalSpan) -> impl Iterator<Item = StoredPage<'a>> + 'a {
        self.arena_pages(span).chain(
            self.deferred[span.deferred.0..span.deferred.1]
                .iter()
                .flat_map(Deferred::pages),
        )
    }

    /// The page bitmaps of one span in the arena: reads, then writes, in page order.
    fn arena_pages<'a>(&'a self, span: &IntervalSpan) -> impl Iterator<Item = StoredPage<'a>> + 'a {
        let span = *span;
        (span.reads.0..span.writes_end).flat_map(move |j| {
            let s = self.index[j];
            (s.page..s.page + s.pages).map(move |page| self.page_of(&span, &s, page))
        })
    }

    /// Entry `s` (of `span`) narrowed to `page`, one of its pages.
    fn page_of(&self, span: &IntervalSpan, s: &Stored, page: PageNo) -> StoredPage<'_> {
        let words_per_page = words_for(&self.words_per_page[span.table.0..span.table.1], page);
        let at = s.offset as usize;
        StoredPage {
            page,
            kind: s.kind,
            words: if s.uniform {
                Words::Uniform(self.words[at])
            } else {
                Words::Full(&self.words[at..at + words_per_page])
            },
            words_per_page,
            sites: PageSites::Stored(&self.sites[s.sites.0 as usize..s.sites.1 as usize]),
        }
    }

    /// The arena bitmap of `page` and `kind` in `span`, if stored there.
    fn find_in_arena(
        &self,
        span: &IntervalSpan,
        page: PageNo,
        kind: AccessKind,
    ) -> Option<StoredPage<'_>> {
        let entries = &self.index[span.of_kind(kind)];
        let k = entries.partition_point(|s| s.page <= page).checked_sub(1)?;
        let s = entries[k];
        (page < s.page + s.pages).then(|| self.page_of(span, &s, page))
    }

    /// The bitmap of `page` and `kind` in `span`, if stored.
    fn find(&self, span: &IntervalSpan, page: PageNo, kind: AccessKind) -> Option<StoredPage<'_>> {
        self.find_in_arena(span, page, kind).or_else(|| {
            self.deferred[span.deferred.0..span.deferred.1]
                .iter()
                .find_map(|d| d.page(page, kind))
        })
    }

    /// Every stored bitmap whose page passes `keep`, in wire form, its sites named
    /// through `names`.
    fn encoded(
        &self,
        names: &mut SiteNames<'_>,
        mut keep: impl FnMut(PageNo) -> bool,
    ) -> Vec<EncodedBitmap> {
        let mut out = Vec::new();
        let mut defined = Vec::new();
        for span in &self.spans {
            for p in self.arena_pages(span).filter(|p| keep(p.page)) {
                out.push(encode_one(span.interval, &p, names, &mut defined));
            }
            for d in &self.deferred[span.deferred.0..span.deferred.1] {
                d.for_each_page_where(&mut keep, |p| {
                    out.push(encode_one(span.interval, &p, names, &mut defined));
                });
            }
        }
        out
    }

    /// Every stored bitmap in columns (a race batch), its sites named through `names`.
    fn columns(&self, names: &mut SiteNames<'_>) -> BitmapColumns {
        let mut out = BitmapColumns::default();
        let mut defined = Vec::new();
        let mut spans = Vec::new();
        for span in &self.spans {
            for p in self.pages(span) {
                let words_before = out.words.len();
                let uniform = match (p.words.uniform(), p.words) {
                    (Some(w), _) => {
                        out.words.push(w);
                        p.words_per_page as u32
                    }
                    (None, Words::Full(words)) => {
                        out.words.extend_from_slice(words);
                        0
                    }
                    (None, words) => {
                        out.words
                            .extend((0..p.words_per_page).map(|k| words.word(k)));
                        0
                    }
                };
                spans.clear();
                p.spans_into(names, &mut spans);
                for &span in &spans {
                    let wire = wire_span(span, names.sites, &mut defined, &mut out.defs);
                    out.sites.push(wire);
                }
                out.entries.push(ColumnEntry {
                    key: BitmapKey {
                        interval: span.interval,
                        page: p.page,
                        kind: p.kind,
                    },
                    words: (out.words.len() - words_before) as u32,
                    uniform,
                    sites: spans.len() as u32,
                });
            }
        }
        out
    }

    /// [`EpochStore::encoded`] for the bitmaps of `pages` (sorted) alone, in the same
    /// order, each found by a binary search in its interval's index or a look in its
    /// deferred shadows.
    fn encoded_pages(&self, names: &mut SiteNames<'_>, pages: &[PageNo]) -> Vec<EncodedBitmap> {
        let mut out = Vec::new();
        let mut defined = Vec::new();
        let kinds = [AccessKind::Read, AccessKind::Write];
        for span in &self.spans {
            for kind in kinds {
                for &page in pages {
                    if let Some(p) = self.find_in_arena(span, page, kind) {
                        out.push(encode_one(span.interval, &p, names, &mut defined));
                    }
                }
            }
            for d in &self.deferred[span.deferred.0..span.deferred.1] {
                for kind in kinds {
                    for &page in pages {
                        if let Some(p) = d.page(page, kind) {
                            out.push(encode_one(span.interval, &p, names, &mut defined));
                        }
                    }
                }
            }
        }
        out
    }

    /// The words and site spans of bitmap `key`, if stored.
    fn get(
        &self,
        key: &BitmapKey,
        names: &mut SiteNames<'_>,
    ) -> Option<(Vec<u64>, Vec<StoredSpan>)> {
        let i = self
            .spans
            .binary_search_by_key(&key.interval, |b| b.interval)
            .ok()?;
        let p = self.find(&self.spans[i], key.page, key.kind)?;
        Some((p.words.to_vec(p.words_per_page), p.spans(names)))
    }

    /// Drops `span`, the last interval stored, with its words, sites and table entries
    /// (it holds no deferred shadow).
    fn pop_last(&mut self, span: &IntervalSpan) {
        debug_assert_eq!(span.deferred.0, span.deferred.1);
        self.page_bitmaps -= self.index[span.reads.0..span.writes_end]
            .iter()
            .map(|s| s.pages as usize)
            .sum::<usize>();
        self.words.truncate(span.words_start);
        self.sites.truncate(span.sites_start);
        self.index.truncate(span.reads.0);
        self.words_per_page.truncate(span.table.0);
        self.spans.pop();
        self.bytes = self.held_bytes();
    }

    /// Bytes held: words, index entries and site spans in the arena, and the deferred
    /// shadows' touched pages.
    fn held_bytes(&self) -> usize {
        debug_assert_eq!(
            self.deferred_bytes,
            self.deferred
                .iter()
                .map(|d| d.page_bitmaps() * d.words_per_page * 8)
                .sum::<usize>()
        );
        self.words.len() * 8
            + self.index.len() * std::mem::size_of::<Stored>()
            + self.sites.len() * 8
            + self.deferred_bytes
    }

    /// Forgets every bitmap, keeping the arena's room for the next epoch; returns the
    /// deferred shadows, for their allocations to record in again.
    fn clear(&mut self) -> std::vec::Drain<'_, Deferred> {
        self.spans.clear();
        self.index.clear();
        self.words.clear();
        self.words_per_page.clear();
        self.sites.clear();
        self.page_bitmaps = 0;
        self.bytes = 0;
        self.deferred_bytes = 0;
        self.deferred.drain(..)
    }
}

/// One stored bitmap in wire form, its sites named through `names` (`defined`: which
/// sites the list being built has defined).
fn encode_one(
    interval: u32,
    p: &StoredPage<'_>,
    names: &mut SiteNames<'_>,
    defined: &mut Vec<bool>,
) -> EncodedBitmap {
    let spans = p.spans(names);
    let (sites, defs) = wire_sites(&spans, names.sites, defined);
    EncodedBitmap {
        key: BitmapKey {
            interval,
            page: p.page,
            kind: p.kind,
        },
        bits: p.words.encode(p.words_per_page),
        sites,
        defs,
    }
}

/// The recorder's site numbering, lent to an interval close.
struct SiteNames<'a> {
    sites: &'a mut Vec<Site>,
    numbers: &'a mut SiteNumbers,
    last: &'a [Cell<(usize, u32)>; 2],
}

impl SiteNames<'_> {
    /// The node's number for `site`, looked up for bitmaps of kind `k` (0 reads, 1 writes).
    fn number(&mut self, site: Site, k: usize) -> u32 {
        intern_site(self.sites, self.numbers, &self.last[k], site)
    }
}

/// The access flag of `kind` in an allocation's page flags.
fn kind_bit(kind: AccessKind) -> u8 {
    match kind {
        AccessKind::Read => READ,
        AccessKind::Write => WRITE,
    }
}

/// What one interval close builds, page by page: the notices, and the interval's write
/// entries until its read entries are all in the store. Kept by the recorder for its
/// room.
#[derive(Default)]
struct Closing {
    reads: Vec<PageNo>,
    writes: Vec<PageNo>,
    read_extents: Extents,
    write_extents: Extents,
    write_entries: Vec<Stored>,
    /// Per kind (0 reads, 1 writes), the site spans of the last bitmap stored.
    last_spans: [(u32, u32); 2],
    /// Per kind, whether the last entry belongs to this close and allocation, so that the
    /// next page may extend it as a run.
    runs_open: [bool; 2],
    /// One page's site spans.
    site_buf: Vec<(Site, u16, u16)>,
}

impl Closing {
    fn begin(&mut self, store: &EpochStore) {
        self.reads.clear();
        self.writes.clear();
        self.write_entries.clear();
        let at = store.sites.len() as u32;
        self.last_spans = [(at, at); 2];
        self.runs_open = [false; 2];
    }

    /// Leaves allocation `a`'s (number `id`) interval shadow to the store as the
    /// interval's bitmaps, noting its pages, and gives the allocation its spare to record
    /// on in; `false`, changing nothing, when the store holds the other shadow already or
    /// no spare can be had (the pages are then copied into the arena).
    fn defer(&mut self, store: &mut EpochStore, id: usize, a: &mut AllocShadow) -> bool {
        let spare = match std::mem::replace(&mut a.spare, Spare::Lent) {
            Spare::Ready(spare) => spare,
            Spare::None => match IntervalShadow::new(a.now.flags.len(), a.words_per_page) {
                Ok(spare) => spare,
                Err(_) => {
                    a.spare = Spare::None;
                    return false;
                }
            },
            Spare::Lent => return false,
        };
        let mut bitmaps = 0;
        for &page in a.now.touched.borrow().iter() {
            let flags = a.now.flags[page as usize].get();
            let global = a.first_page + page as PageNo;
            if flags & READ != 0 {
                self.reads.push(global);
                bitmaps += 1;
            }
            if flags & WRITE != 0 {
                self.writes.push(global);
                bitmaps += 1;
            }
        }
        store.page_bitmaps += bitmaps;
        store.deferred_bytes += bitmaps * a.words_per_page * 8;
        store.deferred.push(Deferred {
            alloc: id,
            first_page: a.first_page,
            words_per_page: a.words_per_page,
            shadow: std::mem::replace(&mut a.now, spare),
        });
        true
    }

    /// Moves allocation `a`'s pages of the frozen interval into the store: those still in
    /// the shadow and those moved aside ([`HeldPage`]), in page order. The pages touched
    /// since it froze stay listed as touched.
    fn store_frozen(&mut self, store: &mut EpochStore, names: &mut SiteNames<'_>, a: &AllocShadow) {
        let mut held = std::mem::take(&mut *a.held.borrow_mut());
        let mut touched = a.now.touched.borrow_mut();
        let frozen_here = |p: &u32| a.now.flags[*p as usize].get() & FROZEN != 0;
        if held.is_empty() && !touched.iter().any(frozen_here) {
            return;
        }
        sort_touched(&mut touched);
        held.sort_unstable_by_key(|h| h.page);
        store.words_per_page.push((a.first_page, a.words_per_page));
        self.runs_open = [false; 2];
        let mut moved = held.iter().peekable();
        for &page in touched.iter() {
            while let Some(h) = moved.next_if(|h| h.page <= page) {
                self.store_held(store, names, a, h);
            }
            let f = &a.now.flags[page as usize];
            let flags = f.replace(0);
            if flags & FROZEN == 0 {
                f.set(flags);
                continue;
            }
            self.store_page(store, names, a, page as usize, flags >> FROZEN_SHIFT);
        }
        for h in moved {
            self.store_held(store, names, a, h);
        }
        touched.retain(|&p| a.now.flags[p as usize].get() != 0);
        if touched.is_empty() {
            a.now.runs.borrow_mut().clear();
        }
    }

    /// Moves `page`'s (of allocation `a`) bitmaps of the kinds `flags` names into the
    /// store and clears them.
    fn store_page(
        &mut self,
        store: &mut EpochStore,
        names: &mut SiteNames<'_>,
        a: &AllocShadow,
        page: usize,
        flags: u8,
    ) {
        for kind in [AccessKind::Read, AccessKind::Write] {
            if flags & kind_bit(kind) != 0 {
                self.store_bitmap(store, names, a, page, kind);
            }
        }
    }

    /// Moves `page`'s (of allocation `a`) bitmap of `kind` into the store and clears it,
    /// noting the page and its extent; a bitmap that stayed empty leaves nothing.
    fn store_bitmap(
        &mut self,
        store: &mut EpochStore,
        names: &mut SiteNames<'_>,
        a: &AllocShadow,
        page: usize,
        kind: AccessKind,
    ) {
        let bits = match kind {
            AccessKind::Read => &a.now.read,
            AccessKind::Write => &a.now.write,
        };
        self.site_buf.clear();
        a.take_sites(page, kind_bit(kind), &mut self.site_buf);
        let words = &bits[page * a.words_per_page..(page + 1) * a.words_per_page];
        let global = a.first_page + page as PageNo;
        self.store_words(store, names, global, a.shift, kind, words);
    }

    /// A frozen interval's page that was moved aside ([`HeldPage`]): its bitmaps into the
    /// store, as [`Closing::store_bitmap`] moves a page's from the shadow.
    fn store_held(
        &mut self,
        store: &mut EpochStore,
        names: &mut SiteNames<'_>,
        a: &AllocShadow,
        held: &HeldPage,
    ) {
        for (k, kind) in [AccessKind::Read, AccessKind::Write]
            .into_iter()
            .enumerate()
        {
            if held.flags & kind_bit(kind) != 0 {
                self.site_buf.clear();
                self.site_buf.extend_from_slice(&held.sites[k]);
                let global = a.first_page + held.page as PageNo;
                self.store_words(store, names, global, a.shift, kind, &held.words[k]);
            }
        }
    }

    /// Moves one page's bitmap `words` of `kind` (sites in `site_buf`) into the store and
    /// clears them, noting the page and its extent; a bitmap that stayed empty leaves
    /// nothing.
    fn store_words(
        &mut self,
        store: &mut EpochStore,
        names: &mut SiteNames<'_>,
        global: PageNo,
        shift: u32,
        kind: AccessKind,
        words: &[Cell<u64>],
    ) {
        let k = usize::from(kind == AccessKind::Write);
        let first = words[0].get();
        let uniform = words.iter().all(|w| w.get() == first);
        if uniform && first == 0 {
            return;
        }
        let (list, extents) = match kind {
            AccessKind::Read => (&mut self.reads, &mut self.read_extents),
            AccessKind::Write => (&mut self.writes, &mut self.write_extents),
        };
        list.push(global);
        let mask = if uniform {
            uniform_block_mask(first, shift)
        } else {
            block_mask(words.iter().map(Cell::get), shift)
        };
        if mask != u64::MAX {
            let (start, end) = byte_bounds(words, shift);
            extents.push(PageExtent {
                page: global,
                blocks: mask,
                start,
                end,
            });
        }
        let sites = self.store_sites(store, names, k);
        let entries = match kind {
            AccessKind::Read => &mut store.index,
            AccessKind::Write => &mut self.write_entries,
        };
        store.page_bitmaps += 1;
        if uniform && self.runs_open[k] {
            let last = entries.last_mut().expect("an open run has an entry");
            if last.uniform
                && last.sites == sites
                && last.page + last.pages == global
                && store.words[last.offset as usize] == first
            {
                last.pages += 1;
                words.iter().for_each(|w| w.set(0));
                return;
            }
        }
        self.runs_open[k] = true;
        entries.push(Stored {
            page: global,
            pages: 1,
            kind,
            offset: store.words.len() as u32,
            uniform,
            sites,
        });
        if uniform {
            store.words.push(first);
            words.iter().for_each(|w| w.set(0));
        } else {
            store.words.extend(words.iter().map(Cell::take));
        }
    }

    /// Stores the site spans in `site_buf` for a bitmap of kind `k` and returns where they
    /// are; pages in a row mostly have the spans of the one before, and then share them.
    fn store_sites(
        &mut self,
        store: &mut EpochStore,
        names: &mut SiteNames<'_>,
        k: usize,
    ) -> (u32, u32) {
        let from = store.sites.len();
        for &(site, first, last) in &self.site_buf {
            store.sites.push((names.number(site, k), first, last));
        }
        let (p0, p1) = self.last_spans[k];
        let sites = if store.sites[p0 as usize..p1 as usize] == store.sites[from..] {
            store.sites.truncate(from);
            (p0, p1)
        } else {
            (from as u32, store.sites.len() as u32)
        };
        self.last_spans[k] = sites;
        sites
    }

    /// The interval's notices; the extents leave with them.
    fn notices(&mut self) -> RaceNotices {
        debug_assert!(self.reads.windows(2).all(|p| p[0] < p[1]));
        debug_assert!(self.writes.windows(2).all(|p| p[0] < p[1]));
        RaceNotices {
            reads: PageRuns::from_sorted_unique(&self.reads),
            writes: PageRuns::from_sorted_unique(&self.writes),
            read_extents: std::mem::take(&mut self.read_extents),
            write_extents: std::mem::take(&mut self.write_extents),
        }
    }
}

/// Counters of the recorder, for `--race-stats`; totals over the run.
#[derive(Clone, Debug, Default)]
pub struct RecordStats {
    /// Closed intervals that recorded at least one access.
    pub intervals_with_accesses: u64,
    /// Pages named in read notices, summed over intervals.
    pub read_notices: u64,
    /// Pages named in write notices, summed over intervals.
    pub write_notices: u64,
    /// Bitmaps kept in the epoch store: one per read or write notice.
    pub bitmaps_stored: u64,
    /// Bitmaps asked for by the barrier master through [`Recorder::bitmaps`] (shipped
    /// bitmaps are not counted).
    pub bitmaps_served: u64,
    /// Largest amount of bitmap memory held at once (bytes).
    pub peak_store_bytes: usize,
}

/// The per-node recorder: shadows of all allocations and the epoch store.
pub struct Recorder {
    allocs: Vec<AllocShadow>,
    /// Index of the interval being recorded (mirrors the protocol engine's numbering:
    /// intervals start at 1 and every synchronization operation closes exactly one).
    interval: u32,
    store: EpochStore,
    stats: RecordStats,
    /// The epoch's access digest over the intervals already drained into race batches.
    drained_digest: u64,
    /// What the last close built, kept for its room.
    closing: Closing,
    /// [`DEFER_MIN_PAGES`], except in tests that compare both ways of storing an interval.
    defer_min_pages: usize,
    /// The source sites seen so far (a site's number is its index), by address, with the
    /// last one looked up for reads and for writes (a loop's pages are read at one line
    /// and written at another).
    sites: Vec<Site>,
    site_numbers: SiteNumbers,
    last_site: [Cell<(usize, u32)>; 2],
    /// The last interval whose bitmaps left the store (drained into a race batch or
    /// discarded at a barrier): it and those before it can no longer be reopened.
    sealed: u32,
    /// Whether the open interval is frozen (see [`Recorder::freeze_interval`]).
    frozen: bool,
    /// The frozen interval's pages (allocation, page), for the thaw.
    frozen_pages: Vec<(u32, u32)>,
    /// Whether the epoch's access digest is kept (see [`Recorder::keep_digest`]).
    digest: bool,
    /// First touches so far, counted by the allocations' shadows.
    touches: Rc<Cell<u64>>,
    /// The first touches counted when the interval was last thawed, if the pages it had
    /// touched were then exactly those in `frozen_pages`.
    thawed_at: Option<u64>,
    /// The first touches counted when the interval froze.
    frozen_at: u64,
    /// Whether the frozen interval's page flags are still to be shifted aside (see
    /// [`Recorder::freeze_interval`]): a freeze of the pages the last thaw left defers
    /// it to the next access, and a thaw before any is then free.
    freeze_deferred: Cell<bool>,
}

/// Where an epoch's access digest starts (the FNV-1a offset basis).
const DIGEST_SEED: u64 = 0xcbf2_9ce4_8422_2325;

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// A recorder with no allocations, recording interval 1.
    pub fn new() -> Self {
        Recorder {
            allocs: Vec::new(),
            interval: 1,
            store: EpochStore::default(),
            stats: RecordStats::default(),
            drained_digest: DIGEST_SEED,
            closing: Closing::default(),
            defer_min_pages: DEFER_MIN_PAGES,
            sites: Vec::new(),
            site_numbers: SiteNumbers::default(),
            last_site: [Cell::new((0, u32::MAX)), Cell::new((0, u32::MAX))],
            sealed: 0,
            frozen: false,
            frozen_pages: Vec::with_capacity(FREEZE_MAX_PAGES),
            digest: true,
            touches: Rc::new(Cell::new(0)),
            thawed_at: None,
            frozen_at: 0,
            freeze_deferred: Cell::new(false),
        }
    }

    /// Whether [`Recorder::epoch_digest`] is wanted (it is, unless this says otherwise):
    /// only a recorded or replayed run compares it, and keeping it costs a pass over
    /// every race batch's bitmaps.
    pub fn keep_digest(&mut self, keep: bool) {
        self.digest = keep;
    }

    /// Adds the shadow for a new allocation of `bytes` bytes from `first_page`; returns its
    /// id. Fails, adding nothing, when the memory for its bitmaps cannot be had.
    pub fn add_alloc(
        &mut self,
        first_page: PageNo,
        bytes: usize,
        elem_size: usize,
    ) -> Result<usize, TryReserveError> {
        let shadow = AllocShadow::new(first_page, bytes, elem_size, self.touches.clone())?;
        self.allocs.try_reserve(1)?;
        self.allocs.push(shadow);
        Ok(self.allocs.len() - 1)
    }

    /// The shadow of allocation `id` (as returned by [`Recorder::add_alloc`]), through
    /// which views record their accesses. Panics for an unknown id.
    #[inline]
    pub fn alloc(&self, id: usize) -> &AllocShadow {
        self.settle_freeze();
        &self.allocs[id]
    }

    /// Shifts the frozen interval's page flags aside if its freeze deferred it: before
    /// anything records into the shadows or reads them.
    #[inline(always)]
    fn settle_freeze(&self) {
        if self.freeze_deferred.get() {
            self.shift_deferred_freeze();
        }
    }

    #[cold]
    #[inline(never)]
    fn shift_deferred_freeze(&self) {
        self.freeze_deferred.set(false);
        self.shift_frozen_pages(true);
    }

    /// Index of the interval being recorded; the protocol engine's open interval has the
    /// same index.
    pub fn current_interval(&self) -> u32 {
        self.interval
    }

    /// The run's counters so far.
    pub fn stats(&self) -> &RecordStats {
        &self.stats
    }

    /// Ends the current interval: turns touched pages into notices, moves their bitmaps to
    /// the epoch store and clears the shadows.
    pub fn close_interval(&mut self) -> RaceNotices {
        debug_assert!(
            !self.frozen,
            "a frozen interval closes through close_frozen"
        );
        self.thawed_at = None;
        let index = self.interval;
        self.interval += 1;
        // Lock-heavy programs close many intervals that touched nothing (from a release
        // to the next acquire): those cost no allocation.
        if self
            .allocs
            .iter()
            .all(|a| a.now.touched.borrow().is_empty())
        {
            return RaceNotices::default();
        }
        self.store_interval(index, false)
    }

    /// Freezes the open interval at a release that a later acquire may take back: its
    /// accesses stay in the shadows, the interval keeps its number, and the next
    /// synchronization either thaws it ([`Recorder::thaw_interval`]: the same lock taken
    /// again with nobody having taken it since, so the interval goes on, as
    /// [`Recorder::reopen_last`] would make it, without anything moved) or closes it
    /// ([`Recorder::close_frozen`]). Accesses in between record what follows the release:
    /// a page the frozen interval touched has its frozen contents moved aside first.
    ///
    /// Returns `false`, changing nothing, when the interval touched more than
    /// `FREEZE_MAX_PAGES` (16) pages (it is then closed as usual).
    #[inline]
    pub fn freeze_interval(&mut self) -> bool {
        if self.frozen {
            return false;
        }
        if self.thawed_at == Some(self.touches.get()) {
            // Nothing was touched since the thaw: the interval's pages are those it froze.
            // (A rank re-taking its own lock comes here at every release.) Their flags
            // are shifted aside only when something records before the next thaw:
            // recording goes through `alloc`, and a view cannot outlive a lock operation.
            self.freeze_deferred.set(true);
            self.frozen_at = self.touches.get();
            self.frozen = true;
            return true;
        }
        self.freeze_touched_pages()
    }

    /// [`Recorder::freeze_interval`] of an interval whose pages are not known to be those
    /// it froze last: every touched page.
    #[inline(never)]
    fn freeze_touched_pages(&mut self) -> bool {
        self.thawed_at = None;
        self.frozen_pages.clear();
        for (id, a) in self.allocs.iter().enumerate() {
            let touched = a.now.touched.borrow();
            if self.frozen_pages.len() + touched.len() > FREEZE_MAX_PAGES {
                drop(touched);
                self.shift_frozen_pages(false);
                return false;
            }
            for &page in touched.iter() {
                let f = &a.now.flags[page as usize];
                f.set(f.get() << FROZEN_SHIFT);
                self.frozen_pages.push((id as u32, page));
            }
        }
        self.frozen_at = self.touches.get();
        self.frozen = true;
        true
    }

    /// Shifts the flags of the pages in `frozen_pages` out of the access bits (`freeze`)
    /// or back.
    #[inline]
    fn shift_frozen_pages(&self, freeze: bool) {
        for &(a, page) in &self.frozen_pages {
            let f = &self.allocs[a as usize].now.flags[page as usize];
            f.set(if freeze {
                f.get() << FROZEN_SHIFT
            } else {
                f.get() >> FROZEN_SHIFT
            });
        }
    }

    /// Whether the open interval is frozen.
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Lets the frozen interval go on recording, with what was recorded since it froze
    /// as part of it. Returns `false`, changing nothing, when nothing is frozen or a
    /// frozen page was touched again (its contents were moved aside:
    /// [`Recorder::close_frozen`] then closes the frozen interval).
    #[inline]
    pub fn thaw_interval(&mut self) -> bool {
        if self.freeze_deferred.get() {
            // Nothing recorded since the freeze, which moved nothing.
            debug_assert!(self.frozen && self.touches.get() == self.frozen_at);
            self.freeze_deferred.set(false);
            self.thawed_at = Some(self.frozen_at);
            self.frozen = false;
            return true;
        }
        // A frozen page touched again lost its frozen flags when it was moved aside; that
        // touch was a first touch, so with none since the freeze none was.
        if !self.frozen || (self.touches.get() != self.frozen_at && self.frozen_page_touched()) {
            return false;
        }
        self.shift_frozen_pages(false);
        // Pages first touched while it was frozen are not in `frozen_pages`.
        self.thawed_at = (self.touches.get() == self.frozen_at).then_some(self.frozen_at);
        self.frozen = false;
        true
    }

    /// Whether a page of the frozen interval was touched since it froze.
    #[inline(never)]
    fn frozen_page_touched(&self) -> bool {
        self.frozen_pages
            .iter()
            .any(|&(a, page)| self.allocs[a as usize].now.flags[page as usize].get() & FROZEN == 0)
    }

    /// Closes the frozen interval: its pages, in the shadows or moved aside, become its
    /// notices and stored bitmaps, as [`Recorder::close_interval`] makes them. What was
    /// recorded since it froze stays in the shadows as the open interval's, which takes
    /// the next number.
    pub fn close_frozen(&mut self) -> RaceNotices {
        debug_assert!(self.frozen, "no frozen interval to close");
        self.frozen = false;
        let index = self.interval;
        self.interval += 1;
        self.store_interval(index, true)
    }

    /// Moves interval `index`'s pages into the store: every touched page, or with
    /// `frozen`, the frozen interval's pages alone.
    fn store_interval(&mut self, index: u32, frozen: bool) -> RaceNotices {
        self.settle_freeze();
        self.thawed_at = None;
        let mut c = std::mem::take(&mut self.closing);
        let store = &mut self.store;
        c.begin(store);
        let mut names = SiteNames {
            sites: &mut self.sites,
            numbers: &mut self.site_numbers,
            last: &self.last_site,
        };
        let (index_start, table_start) = (store.index.len(), store.words_per_page.len());
        let (words_start, sites_start) = (store.words.len(), store.sites.len());
        let deferred_start = store.deferred.len();
        // Allocations are in page order, so each kind's entries come out sorted by page
        // once each allocation's touched pages are sorted.
        for (id, a) in self.allocs.iter_mut().enumerate() {
            if frozen {
                c.store_frozen(store, &mut names, a);
                continue;
            }
            let count = {
                let mut touched = a.now.touched.borrow_mut();
                sort_touched(&mut touched);
                touched.len()
            };
            if count == 0 || (count >= self.defer_min_pages && c.defer(store, id, a)) {
                continue;
            }
            let mut touched = a.now.touched.borrow_mut();
            store.words_per_page.push((a.first_page, a.words_per_page));
            c.runs_open = [false; 2];
            for &page in touched.iter() {
                let page = page as usize;
                let flags = a.now.flags[page].replace(0);
                c.store_page(store, &mut names, a, page, flags);
            }
            touched.clear();
            a.now.runs.borrow_mut().clear();
        }
        let reads_end = store.index.len();
        store.index.append(&mut c.write_entries);
        if store.index.len() > index_start || store.deferred.len() > deferred_start {
            store.spans.push(IntervalSpan {
                interval: index,
                reads: (index_start, reads_end),
                writes_end: store.index.len(),
                table: (table_start, store.words_per_page.len()),
                words_start,
                sites_start,
                deferred: (deferred_start, store.deferred.len()),
            });
            store.bytes = store.held_bytes();
        } else {
            store.words_per_page.truncate(table_start);
        }
        self.stats.peak_store_bytes = self.stats.peak_store_bytes.max(self.store.bytes);
        let (reads, writes) = (c.reads.len() as u64, c.writes.len() as u64);
        if reads + writes > 0 {
            self.stats.intervals_with_accesses += 1;
        }
        self.stats.read_notices += reads;
        self.stats.write_notices += writes;
        self.stats.bitmaps_stored += reads + writes;
        let notices = c.notices();
        self.closing = c;
        notices
    }

    /// The stored bitmaps for `keys` (missing ones come back empty: nothing accessed).
    pub fn bitmaps(&mut self, keys: &[BitmapKey]) -> Vec<EncodedBitmap> {
        self.stats.bitmaps_served += keys.len() as u64;
        let mut defined = Vec::new();
        let (store, mut names) = self.store_and_names();
        keys.iter()
            .map(|&key| match store.get(&key, &mut names) {
                Some((words, spans)) => {
                    let (sites, defs) = wire_sites(&spans, names.sites, &mut defined);
                    EncodedBitmap {
                        key,
                        bits: encode_words(&words),
                        sites,
                        defs,
                    }
                }
                None => EncodedBitmap {
                    key,
                    bits: Vec::new(),
                    sites: SmallVec::new(),
                    defs: Vec::new(),
                },
            })
            .collect()
    }

    /// Bitmaps of this epoch for pages that pass `shared`, to ship with the barrier
    /// arrival, as long as they fit in `max_bytes`; `None` if they do not (the master then
    /// fetches what it needs).
    pub fn shippable(
        &mut self,
        shared: impl FnMut(PageNo) -> bool,
        max_bytes: usize,
    ) -> Option<Vec<EncodedBitmap>> {
        let (store, mut names) = self.store_and_names();
        let out = store.encoded(&mut names, shared);
        let bytes: usize = out.iter().map(|b| b.bits.len() + 16).sum();
        (bytes <= max_bytes).then_some(out)
    }

    /// [`Recorder::shippable`] for the pages in `pages` (sorted, unique) alone, looked up
    /// in each interval's index instead of testing every stored bitmap: in one common
    /// memory only the pages the master asked for before go with an arrival, a few
    /// boundary pages against the thousands a grid's rows fill. Falls back to the scan
    /// when the lookups would cost more.
    pub fn shippable_pages(
        &mut self,
        pages: &[PageNo],
        max_bytes: usize,
    ) -> Option<Vec<EncodedBitmap>> {
        let (store, mut names) = self.store_and_names();
        let lookups = pages.len().saturating_mul(store.spans.len()) * 2;
        let out = if lookups.saturating_mul(16) < store.page_bitmaps {
            store.encoded_pages(&mut names, pages)
        } else {
            store.encoded(&mut names, |p| pages.binary_search(&p).is_ok())
        };
        let bytes: usize = out.iter().map(|b| b.bits.len() + 16).sum();
        (bytes <= max_bytes).then_some(out)
    }

    /// Every stored bitmap, in columns for a race batch; the store is emptied (the race
    /// master keeps them from now on). The epoch's access digest carries on over what was
    /// drained.
    pub fn drain_all(&mut self) -> BitmapColumns {
        let (store, mut names) = self.store_and_names();
        let out = store.columns(&mut names);
        if self.digest {
            self.drained_digest = self.fold_digest(self.drained_digest);
        }
        self.clear_store();
        self.sealed = self.interval - 1;
        out
    }

    /// The epoch store, and the site numbering its deferred shadows name sites through.
    fn store_and_names(&mut self) -> (&EpochStore, SiteNames<'_>) {
        let names = SiteNames {
            sites: &mut self.sites,
            numbers: &mut self.site_numbers,
            last: &self.last_site,
        };
        (&self.store, names)
    }

    /// Empties the epoch store; each deferred shadow, cleared, becomes its allocation's
    /// spare again.
    fn clear_store(&mut self) {
        for mut d in self.store.clear() {
            d.shadow.clear(d.words_per_page);
            self.allocs[d.alloc].spare = Spare::Ready(d.shadow);
        }
    }

    /// A hash of every access of the epoch so far (interval, page, read or write, and the
    /// granules), for a replay to check that it touched the same elements as the recorded
    /// run (`dsmrun --replay`). Costs a pass over the epoch's bitmaps still held; those
    /// shipped in race batches were folded in when they left, so the digest does not
    /// depend on when batches were shipped.
    pub fn epoch_digest(&self) -> u64 {
        self.fold_digest(self.drained_digest)
    }

    /// Folds the held intervals' accesses into `h`, in interval order.
    fn fold_digest(&self, mut h: u64) -> u64 {
        let mix = |h: u64, v: u64| {
            v.to_le_bytes()
                .iter()
                .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
        };
        for span in &self.store.spans {
            h = mix(h, u64::from(span.interval));
            for p in self.store.pages(span) {
                h = mix(
                    h,
                    u64::from(p.page) << 1 | (p.kind == AccessKind::Write) as u64,
                );
                p.words
                    .for_each_canonical(p.words_per_page, |w| h = mix(h, w));
            }
        }
        h
    }

    /// Forgets the epoch's bitmaps (after the barrier analysis).
    pub fn discard_epoch(&mut self) {
        self.clear_store();
        self.sealed = self.interval - 1;
        self.drained_digest = DIGEST_SEED;
    }

    /// Takes the last closed interval back into the open one, as if the synchronization
    /// that closed it had not happened: its bitmaps and sites are recorded again into the
    /// open interval (which keeps what it recorded since), and the open interval takes its
    /// number. For a release that no other node observed (see `Dsm::release_host_lock`):
    /// the next close then yields one interval where there would have been two.
    ///
    /// Returns `false`, changing nothing, when the last closed interval's bitmaps have
    /// left the store (a race batch or a barrier took them: the master knows it as
    /// closed), or no interval has closed yet.
    pub fn reopen_last(&mut self) -> bool {
        let last = self.interval - 1;
        if last == 0 || last <= self.sealed || self.frozen {
            return false;
        }
        if let Some(span) = self.store.spans.last().copied() {
            debug_assert!(span.interval <= last, "the store holds an open interval");
            if span.interval == last {
                if span.deferred.0 != span.deferred.1 {
                    // Its shadows are no longer recorded in; reopening is a saving only.
                    return false;
                }
                self.restore(&span);
                self.store.pop_last(&span);
            }
        }
        self.interval = last;
        true
    }

    /// Records `span`'s stored bitmaps and sites again into the open interval's shadows.
    fn restore(&self, span: &IntervalSpan) {
        for p in self.store.arena_pages(span) {
            let at = self.allocs.partition_point(|a| a.first_page <= p.page);
            let Some(a) = at.checked_sub(1).map(|i| &self.allocs[i]) else {
                debug_assert!(false, "stored page {} is in no allocation", p.page);
                continue;
            };
            let page = (p.page - a.first_page) as usize;
            let wpp = p.words_per_page;
            let (bit, bits) = match p.kind {
                AccessKind::Read => (READ, &a.now.read),
                AccessKind::Write => (WRITE, &a.now.write),
            };
            for (k, w) in bits[page * wpp..(page + 1) * wpp].iter().enumerate() {
                w.set(w.get() | p.words.word(k));
            }
            if a.now.flags[page].get() & bit == 0 {
                a.first_touch(page, bit);
            }
            let base = page * wpp * 64;
            let PageSites::Stored(spans) = p.sites else {
                unreachable!("arena pages have stored sites");
            };
            for &(site, first, last) in spans {
                let (g0, g1) = (base + usize::from(first), base + usize::from(last) + 1);
                a.note_site(page, bit, g0, g1, self.sites[site as usize]);
            }
        }
    }

    /// Bytes of bitmap memory held for the current epoch (words plus index).
    pub fn store_bytes(&self) -> usize {
        self.store.bytes
    }
}

/// The node's number for `site`, given it one if new (`last` remembers the previous
/// lookup: pages in a row are mostly touched by one site).
fn intern_site(
    sites: &mut Vec<Site>,
    numbers: &mut SiteNumbers,
    last: &Cell<(usize, u32)>,
    site: Site,
) -> u32 {
    let addr = site.key();
    if last.get().0 == addr {
        return last.get().1;
    }
    let n = *numbers.entry(addr).or_insert_with(|| {
        sites.push(site);
        sites.len() as u32 - 1
    });
    last.set((addr, n));
    n
}

/// The 64-byte blocks of a page (bit `i`: bytes `64 i..64 i + 64`) that a page's bitmap
/// `words`, of granules of `1 << shift` bytes (`shift` at most 3), touches.
fn block_mask(words: impl Iterator<Item = u64>, shift: u32) -> u64 {
    let per_word = 1u32 << shift;
    let mut mask = 0u64;
    for (i, w) in words.enumerate() {
        mask |= word_blocks(w, shift) << (i as u32 * per_word);
    }
    mask
}

/// The first accessed byte of a page's bitmap `words` (granules of `1 << shift` bytes)
/// and one past the last; `(0, 0)` if nothing was.
fn byte_bounds(words: &[Cell<u64>], shift: u32) -> (u16, u16) {
    let first = words.iter().position(|w| w.get() != 0);
    let last = words.iter().rposition(|w| w.get() != 0);
    let (Some(f), Some(l)) = (first, last) else {
        return (0, 0);
    };
    let g0 = f * 64 + words[f].get().trailing_zeros() as usize;
    let g1 = l * 64 + 64 - words[l].get().leading_zeros() as usize;
    ((g0 << shift) as u16, (g1 << shift) as u16)
}

/// Sorts an allocation's touched pages, listed in the order they were first touched. A
/// banded program's sweep lists its band in order and a neighbour's page or two after
/// it, so a few pages after the sorted prefix are sorted and merged in (a quicksort of
/// the whole list cost 20 000 instructions an interval for SOR's 260 pages).
fn sort_touched(touched: &mut Vec<u32>) {
    let sorted = touched
        .windows(2)
        .position(|w| w[0] > w[1])
        .map_or(touched.len(), |i| i + 1);
    if sorted == touched.len() {
        return;
    }
    if touched.len() - sorted > 16 {
        return touched.sort_unstable();
    }
    // A sorted list and a few pages after it: sort those and put them in place from the
    // largest down, each moving the sorted pages above it up in one block.
    let mut tail: SmallVec<[u32; 16]> = touched.drain(sorted..).collect();
    tail.sort_unstable();
    let mut unmoved = touched.len();
    touched.resize(unmoved + tail.len(), 0);
    for (k, &page) in tail.iter().enumerate().rev() {
        let at = touched[..unmoved].partition_point(|&p| p < page);
        touched.copy_within(at..unmoved, at + k + 1);
        touched[at + k] = page;
        unmoved = at;
    }
}

/// [`block_mask`] of a page whose every word is `w` (most pages of banded programs).
fn uniform_block_mask(w: u64, shift: u32) -> u64 {
    let per_word = 1u32 << shift;
    let blocks = word_blocks(w, shift);
    if blocks == (1u64 << per_word) - 1 {
        return u64::MAX;
    }
    (0..64 / per_word).fold(0, |m, i| m | blocks << (i * per_word))
}

/// The blocks one bitmap word touches: bit `b` for its `b`-th run of `64 >> shift`
/// granules (a byte of the word for 8-byte granules).
#[inline]
fn word_blocks(w: u64, shift: u32) -> u64 {
    match shift {
        0 => u64::from(w != 0),
        3 => {
            // Each byte's bits folded into its lowest bit, then the eight lowest bits
            // gathered into one byte by a multiply whose partial products never overlap.
            let mut t = w | w >> 4;
            t |= t >> 2;
            t |= t >> 1;
            (t & 0x0101_0101_0101_0101).wrapping_mul(0x0102_0408_1020_4080) >> 56
        }
        _ => {
            let width = 64 >> shift;
            let lane = (1u64 << width) - 1;
            (0..1u32 << shift)
                .filter(|b| w >> (b * width) & lane != 0)
                .fold(0, |m, b| m | 1 << b)
        }
    }
}

/// Bitmap words as little-endian bytes (a whole number of words).
pub fn encode_words(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// A bitmap whose `count` words all equal `word`: the word, then the count (10 bytes, so
/// it cannot be mistaken for whole words).
pub fn encode_uniform(word: u64, count: usize) -> Vec<u8> {
    let mut v = word.to_le_bytes().to_vec();
    v.extend_from_slice(&(count as u16).to_le_bytes());
    v
}

/// Inverse of [`encode_words`] and [`encode_uniform`].
pub fn decode_words(bytes: &[u8]) -> Vec<u64> {
    if bytes.len() == 10 {
        let word = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        let count = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        return vec![word; count];
    }
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("chunk of 8")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn code_sites_travel_as_addresses_and_are_told_apart() {
        let mut r = Recorder::new();
        let id = r.add_alloc(0, PAGE_SIZE, 8).unwrap();
        let a = r.alloc(id);
        a.access_at(true, 0, 8, Site::Code(0x1234));
        a.access_at(true, 800, 8, Site::Code(0x1240));
        // A strided run from a third site: elements 10, 12, 14 (8 bytes each).
        a.strided_at(true, 80, 8, 16, 3, Site::Code(0x1250));
        a.access_at(true, 8, 8, Site::Code(0x1234));
        r.close_interval();
        let b = r.bitmaps(&[BitmapKey {
            interval: 1,
            page: 0,
            kind: AccessKind::Write,
        }]);
        let mut codes: Vec<Option<u64>> = b[0].defs.iter().map(|(_, d)| d.code).collect();
        codes.sort();
        assert_eq!(codes, vec![Some(0x1234), Some(0x1240), Some(0x1250)]);
        // Nothing is named on the recording rank: the reporting rank symbolises.
        assert!(b[0]
            .defs
            .iter()
            .all(|(_, d)| d.file.is_empty() && d.line == 0));
        let words = decode_words(&b[0].bits);
        assert_eq!(words[0], 0b101_0100_0000_0011);
        assert_eq!(words[1] >> 36 & 1, 1); // byte 800: granule 100
    }

    fn bits_of(r: &mut Recorder, interval: u32, page: PageNo, kind: AccessKind) -> Vec<u64> {
        let b = r.bitmaps(&[BitmapKey {
            interval,
            page,
            kind,
        }]);
        decode_words(&b[0].bits)
    }

    #[test]
    fn granules() {
        assert_eq!(granule_shift(1), 0);
        assert_eq!(granule_shift(2), 1);
        assert_eq!(granule_shift(4), 2);
        assert_eq!(granule_shift(8), 3);
        assert_eq!(granule_shift(16), 3);
        assert_eq!(granule_shift(12), 2);
        assert_eq!(granule_shift(24), 3);
        assert_eq!(granule_shift(3), 0);
    }

    #[test]
    fn element_accesses_become_notices_and_bitmaps() {
        let mut r = Recorder::new();
        let id = r.add_alloc(10, 3 * PAGE_SIZE, 8).unwrap();
        r.alloc(id).read(0, 8); // element 0, page 10
        r.alloc(id).write(PAGE_SIZE + 16, 8); // element 514, page 11
        r.alloc(id).read(2 * PAGE_SIZE - 4, 8); // hypothetical straddle: pages 11 and 12
        let n = r.close_interval();
        assert_eq!(n.reads.iter().collect::<Vec<_>>(), vec![10, 11, 12]);
        assert_eq!(n.writes.iter().collect::<Vec<_>>(), vec![11]);
        let w = bits_of(&mut r, 1, 11, AccessKind::Write);
        assert_eq!(w.len(), 8);
        assert_eq!(w[0], 1 << 2);
        // The shadow is clear for the next interval.
        let n2 = r.close_interval();
        assert!(n2.reads.is_empty() && n2.writes.is_empty());
        assert_eq!(r.current_interval(), 3);
    }

    #[test]
    fn neighbouring_records_share_a_block_but_their_extents_do_not_meet() {
        // 72-byte elements (Water's per-molecule forces): element 1 ends in the block
        // element 2 begins in.
        let mut r = Recorder::new();
        let forces = r.add_alloc(0, PAGE_SIZE, 72).unwrap();
        r.alloc(forces).write(72, 72);
        let one = r.close_interval().extent(0, true);
        r.alloc(forces).read(144, 72);
        r.alloc(forces).write(144, 72);
        let two = r.close_interval();
        assert_eq!((one.start, one.end), (72, 144));
        assert_ne!(
            one.blocks & two.extent(0, true).blocks,
            0,
            "a block in common"
        );
        assert!(!one.meets(&two.extent(0, true)) && !one.meets(&two.extent(0, false)));
        r.alloc(forces).write(140, 8);
        let three = r.close_interval().extent(0, true);
        assert!(three.meets(&one) && three.meets(&two.extent(0, false)));
    }

    #[test]
    fn notices_narrow_partly_touched_pages_to_their_blocks() {
        let mut r = Recorder::new();
        let f64s = r.add_alloc(0, 2 * PAGE_SIZE, 8).unwrap();
        let bytes = r.add_alloc(2, PAGE_SIZE, 1).unwrap();
        r.alloc(f64s).write(0, 8); // block 0 of page 0
        r.alloc(f64s).write(100 * 8, 8); // byte 800: block 12
        r.alloc(f64s).read(PAGE_SIZE, PAGE_SIZE); // all of page 1
        r.alloc(bytes).read(65, 1); // block 1 of page 2
        r.alloc(bytes).read(4095, 1); // block 63
        let n = r.close_interval();
        let extent = |page, blocks, start, end| PageExtent {
            page,
            blocks,
            start,
            end,
        };
        assert_eq!(n.write_extents.as_slice(), [extent(0, 1 | 1 << 12, 0, 808)]);
        assert_eq!(
            n.read_extents.as_slice(),
            [extent(2, 1 << 1 | 1 << 63, 65, 4096)]
        );
        assert_eq!(
            n.extent(1, false),
            PageExtent::whole(1),
            "a whole page is not narrowed"
        );
        assert_eq!(
            n.extent(1, true),
            PageExtent::none(1),
            "page 1 was not written"
        );
        assert_eq!(n.extent(0, true).blocks, 1 | 1 << 12);
        for shift in 0..4 {
            let words = (PAGE_SIZE >> shift) / 64;
            let last = block_mask(std::iter::repeat_n(1u64 << 63, words), shift);
            assert_eq!(
                last.count_ones() as usize,
                words,
                "one block a word, shift {shift}"
            );
            let all = block_mask(std::iter::repeat_n(u64::MAX, words), shift);
            assert_eq!(all, u64::MAX, "shift {shift}");
            for w in [
                1u64,
                1 << 63,
                0x5555_5555_5555_5555,
                0x00ff_0000_0000_0001,
                u64::MAX,
            ] {
                assert_eq!(
                    uniform_block_mask(w, shift),
                    block_mask(std::iter::repeat_n(w, words), shift),
                    "{w:#x}, shift {shift}"
                );
            }
            assert_eq!(block_mask(std::iter::once(1), shift), 1);
        }
        // The byte-gathering multiply against a plain loop over the bytes.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let w = x & (x >> 3) & (x >> 5);
            let plain = (0..8)
                .filter(|b| w >> (8 * b) & 0xff != 0)
                .fold(0, |m, b| m | 1 << b);
            assert_eq!(word_blocks(w, 3), plain, "{w:#x}");
        }
    }

    #[test]
    fn byte_granules_separate_neighbouring_bytes() {
        let mut r = Recorder::new();
        let id = r.add_alloc(0, PAGE_SIZE, 1).unwrap();
        r.alloc(id).write(5, 1);
        r.close_interval();
        let w = bits_of(&mut r, 1, 0, AccessKind::Write);
        assert_eq!(w.len(), 64);
        assert_eq!(w[0], 1 << 5);
    }

    #[test]
    fn strided_marks_match_element_marks() {
        for (elem, stride, offset, count) in [
            (8usize, 16usize, 8usize, 1000usize),
            (8, 16, 0, 17),
            (8, 24, 8, 300),
            (4, 8, 4, 2000),
            (1, 2, 1, 5000),
            (8, 32, 16, 100),
            (8, 8, 0, 40),
            (16, 32, 0, 64),
        ] {
            let bytes = offset + stride * count + elem;
            let mut a = Recorder::new();
            let ida = a.add_alloc(0, bytes, elem).unwrap();
            a.alloc(ida).strided(true, offset, elem, stride, count);
            let mut b = Recorder::new();
            let idb = b.add_alloc(0, bytes, elem).unwrap();
            for k in 0..count {
                b.alloc(idb).write(offset + k * stride, elem);
            }
            let na = a.close_interval();
            let nb = b.close_interval();
            assert_eq!(na, nb, "notices for {elem}/{stride}/{offset}/{count}");
            for p in na.writes.iter() {
                assert_eq!(
                    bits_of(&mut a, 1, p, AccessKind::Write),
                    bits_of(&mut b, 1, p, AccessKind::Write),
                    "page {p} for {elem}/{stride}/{offset}/{count}"
                );
            }
        }
    }

    /// Accesses for the reopening property: allocation (0 or 1), write, byte offset in
    /// it, length, and which of three sites made it.
    type Access = (usize, bool, usize, usize, u64);

    fn replay(r: &Recorder, accesses: &[Access]) {
        for &(alloc, write, offset, len, site) in accesses {
            r.alloc(alloc)
                .access_at(write, offset, len, Site::Code(0x1000 + site));
        }
    }

    /// Up to `count` accesses of up to `len` bytes to the two allocations of
    /// [`reopening_recorder`], from three sites.
    fn accesses(
        len: usize,
        count: std::ops::Range<usize>,
    ) -> impl proptest::strategy::Strategy<Value = Vec<Access>> {
        proptest::collection::vec(
            (
                0usize..2,
                proptest::bool::ANY,
                0usize..2 * PAGE_SIZE,
                1..len,
                0u64..3,
            ),
            count,
        )
    }

    /// The (allocation, page) pairs `accesses` touch.
    fn pages_of(accesses: &[Access]) -> std::collections::HashSet<(usize, usize)> {
        accesses
            .iter()
            .flat_map(|&(a, _, o, l, _)| {
                (o / PAGE_SIZE..=(o + l - 1) / PAGE_SIZE).map(move |p| (a, p))
            })
            .collect()
    }

    /// Two allocations (three pages of u64s, three of bytes) and a first
    /// interval that touched something before the accesses under test.
    fn reopening_recorder() -> Recorder {
        let mut r = Recorder::new();
        r.add_alloc(0, 3 * PAGE_SIZE, 8).unwrap();
        r.add_alloc(3, 3 * PAGE_SIZE, 1).unwrap();
        r.alloc(1).write(0, 1);
        r.close_interval();
        r
    }

    /// The bitmaps as shipped, with their sites as sets (a reopened interval may name a
    /// site's span more widely than one recorded in one go: see `reopen_last`).
    fn shipped_form(r: &mut Recorder) -> Vec<(BitmapKey, Vec<u64>, Vec<usize>)> {
        let drained = r.drain_all();
        // After draining: sites of kept shadows are numbered as they are shipped.
        let table: Vec<usize> = r.sites.iter().map(|s| s.key()).collect();
        drained
            .iter()
            .map(|(e, words, spans)| {
                let mut sites: Vec<usize> = spans.iter().map(|s| table[s.site as usize]).collect();
                sites.sort();
                sites.dedup();
                let mut spread = Vec::new();
                e.spread_into(words, &mut spread);
                (e.key, spread, sites)
            })
            .collect()
    }

    /// The same accesses, over three intervals: a partial and a whole page of u64s from
    /// two sites, every page of a 40-page byte allocation (its shadow is deferred), reads.
    fn batch_recorder() -> Recorder {
        let mut r = Recorder::new();
        r.add_alloc(0, 3 * PAGE_SIZE, 8).unwrap();
        r.add_alloc(3, 40 * PAGE_SIZE, 1).unwrap();
        let a = r.alloc(0);
        a.access_at(true, 8, 8, Site::Code(0x10));
        a.access_at(true, 800, 8, Site::Code(0x20));
        a.strided_at(true, PAGE_SIZE, 8, 8, PAGE_SIZE / 8, Site::Code(0x30));
        r.close_interval();
        let b_len = 40 * PAGE_SIZE;
        r.alloc(1).access_at(true, 0, b_len, Site::Code(0x40));
        r.alloc(0).access_at(false, 16, 8, Site::Code(0x50));
        r.close_interval();
        r.alloc(1)
            .access_at(false, 5 * PAGE_SIZE + 3, 1, Site::Code(0x60));
        r.close_interval();
        r
    }

    #[test]
    fn drained_columns_hold_what_a_fetch_returns() {
        let mut drained = batch_recorder();
        let columns = drained.drain_all();
        assert!(columns.is_consistent());
        let keys: Vec<BitmapKey> = columns.entries.iter().map(|e| e.key).collect();
        assert!(keys.len() >= 44, "{} bitmaps", keys.len());
        assert!(
            columns.entries.iter().any(|e| e.uniform != 0),
            "whole pages are uniform"
        );
        let mut fetched = batch_recorder();
        let encoded = fetched.bitmaps(&keys);
        let named = |r: &Recorder, site: u32| r.sites[site as usize].key();
        for ((e, words, spans), b) in columns.iter().zip(&encoded) {
            assert_eq!(e.key, b.key);
            let mut spread = Vec::new();
            e.spread_into(words, &mut spread);
            assert_eq!(spread, decode_words(&b.bits), "{:?}", e.key);
            let ours: Vec<_> = spans
                .iter()
                .map(|s| (named(&drained, s.site), s.first, s.last))
                .collect();
            let theirs: Vec<_> = b
                .sites
                .iter()
                .map(|s| (named(&fetched, s.site), s.first, s.last))
                .collect();
            assert_eq!(ours, theirs, "{:?}", e.key);
        }
        let defs =
            |d: &[(u32, SourceSite)]| d.iter().map(|(_, s)| s.clone()).collect::<BTreeSet<_>>();
        let all_defs: Vec<(u32, SourceSite)> = encoded
            .iter()
            .flat_map(|b| b.defs.iter().cloned())
            .collect();
        assert_eq!(defs(&columns.defs), defs(&all_defs));
    }

    #[test]
    fn reopening_stops_at_what_left_the_store() {
        let mut r = reopening_recorder();
        r.alloc(0).write(0, 8);
        r.close_interval();
        r.drain_all();
        assert!(!r.reopen_last(), "interval 2 went out in a batch");
        assert_eq!(r.current_interval(), 3);
        r.close_interval();
        assert!(
            r.reopen_last(),
            "interval 3 touched nothing and is still here"
        );
        assert_eq!(r.current_interval(), 3);
        r.close_interval();
        r.discard_epoch();
        assert!(!r.reopen_last(), "the barrier discarded interval 3");
        assert!(!Recorder::new().reopen_last(), "nothing closed yet");
    }

    #[test]
    fn an_interval_of_many_pages_is_not_frozen() {
        let mut r = Recorder::new();
        r.add_alloc(0, (FREEZE_MAX_PAGES + 1) * PAGE_SIZE, 8)
            .unwrap();
        for page in 0..FREEZE_MAX_PAGES {
            r.alloc(0).write(page * PAGE_SIZE, 8);
        }
        assert!(r.freeze_interval(), "{FREEZE_MAX_PAGES} pages freeze");
        assert!(!r.freeze_interval(), "an interval freezes once");
        assert!(!r.reopen_last(), "a frozen interval reopens nothing");
        assert!(r.thaw_interval());
        r.alloc(0).write(FREEZE_MAX_PAGES * PAGE_SIZE, 8);
        assert!(!r.freeze_interval(), "one page more is closed instead");
        assert!(!r.thaw_interval(), "nothing is frozen");
        let notices = r.close_interval();
        assert_eq!(notices.writes.page_count(), FREEZE_MAX_PAGES as u64 + 1);
    }

    proptest::proptest! {
        /// Touched pages come out as a full sort puts them, for a sorted list followed by
        /// any pages (a few are merged in, more are sorted with the rest).
        #[test]
        fn touched_pages_sort_as_a_full_sort(
            head in proptest::collection::btree_set(0u32..4000, 0..300),
            tail in proptest::collection::btree_set(0u32..4000, 0..40),
            rotate in 0usize..40,
        ) {
            let mut tail: Vec<u32> = tail.difference(&head).copied().collect();
            if !tail.is_empty() {
                let k = rotate % tail.len();
                tail.rotate_left(k);
            }
            let mut pages: Vec<u32> = head.iter().copied().chain(tail).collect();
            let mut want = pages.clone();
            want.sort_unstable();
            super::sort_touched(&mut pages);
            proptest::prop_assert_eq!(pages, want);
        }

        /// Closing, reopening and closing again is closing once: the same notices and
        /// bitmaps, under the first interval's number.
        #[test]
        fn a_reopened_interval_is_one_interval(
            first in accesses(3000, 0..12),
            second in accesses(3000, 0..12),
        ) {
            let mut split = reopening_recorder();
            replay(&split, &first);
            split.close_interval();
            replay(&split, &second);
            proptest::prop_assert!(split.reopen_last());
            proptest::prop_assert_eq!(split.current_interval(), 2);
            let notices_split = split.close_interval();
            let mut whole = reopening_recorder();
            replay(&whole, &first);
            replay(&whole, &second);
            let notices_whole = whole.close_interval();
            proptest::prop_assert_eq!(notices_split, notices_whole);
            proptest::prop_assert_eq!(split.current_interval(), 3);
            proptest::prop_assert_eq!(shipped_form(&mut split), shipped_form(&mut whole));
        }

        /// Freezing an interval and closing it after more accesses is closing it at the
        /// freeze: the same notices and bitmaps for it and for the next interval.
        #[test]
        fn a_frozen_interval_closes_as_at_its_freeze(
            first in accesses(3000, 0..12),
            second in accesses(3000, 0..12),
        ) {
            let mut frozen = reopening_recorder();
            replay(&frozen, &first);
            proptest::prop_assert!(frozen.freeze_interval());
            replay(&frozen, &second);
            let frozen_notices = [frozen.close_frozen(), frozen.close_interval()];
            let mut closed = reopening_recorder();
            replay(&closed, &first);
            let first_notices = closed.close_interval();
            replay(&closed, &second);
            let closed_notices = [first_notices, closed.close_interval()];
            proptest::prop_assert_eq!(frozen_notices, closed_notices);
            proptest::prop_assert_eq!(frozen.current_interval(), 4);
            proptest::prop_assert_eq!(shipped_form(&mut frozen), shipped_form(&mut closed));
        }

        /// A frozen interval thaws unless a page it touched was touched again, and a
        /// thawed one is one interval with what followed the freeze.
        #[test]
        fn a_thawed_interval_is_one_interval(
            first in accesses(3000, 0..6),
            second in accesses(3000, 0..6),
        ) {
            let touched_again = !pages_of(&first).is_disjoint(&pages_of(&second));
            let mut thawed = reopening_recorder();
            replay(&thawed, &first);
            proptest::prop_assert!(thawed.freeze_interval());
            replay(&thawed, &second);
            proptest::prop_assert_eq!(thawed.thaw_interval(), !touched_again);
            if touched_again {
                proptest::prop_assert!(thawed.is_frozen());
                thawed.close_frozen();
            }
            let notices = thawed.close_interval();
            let mut whole = reopening_recorder();
            replay(&whole, &first);
            if touched_again {
                whole.close_interval();
            }
            replay(&whole, &second);
            proptest::prop_assert_eq!(notices, whole.close_interval());
            proptest::prop_assert_eq!(shipped_form(&mut thawed), shipped_form(&mut whole));
        }

        /// Releases and re-acquires in a row: each cycle records, freezes, records again
        /// and thaws unless a frozen page was touched again (then the frozen interval
        /// closes). The notices and bitmaps are those of closing exactly where a thaw
        /// failed.
        #[test]
        fn freezing_and_thawing_in_a_row_closes_where_a_thaw_fails(
            cycles in proptest::collection::vec(
                (
                    accesses(600, 0..3),
                    accesses(600, 0..2),
                ),
                1..8,
            ),
        ) {
            let mut frozen = reopening_recorder();
            let mut closed = reopening_recorder();
            let (mut frozen_notices, mut closed_notices) = (Vec::new(), Vec::new());
            let mut open_pages = std::collections::HashSet::new();
            for (inside, between) in &cycles {
                replay(&frozen, inside);
                replay(&closed, inside);
                open_pages.extend(pages_of(inside));
                proptest::prop_assert!(frozen.freeze_interval());
                replay(&frozen, between);
                let touched_again = !open_pages.is_disjoint(&pages_of(between));
                proptest::prop_assert_eq!(frozen.thaw_interval(), !touched_again);
                if touched_again {
                    frozen_notices.push(frozen.close_frozen());
                    closed_notices.push(closed.close_interval());
                    open_pages.clear();
                }
                replay(&closed, between);
                open_pages.extend(pages_of(between));
            }
            frozen_notices.push(frozen.close_interval());
            closed_notices.push(closed.close_interval());
            proptest::prop_assert_eq!(frozen_notices, closed_notices);
            proptest::prop_assert_eq!(frozen.current_interval(), closed.current_interval());
            proptest::prop_assert_eq!(shipped_form(&mut frozen), shipped_form(&mut closed));
        }

        #[test]
        fn strided_marks_equal_per_element_marks(
            shift in 0u32..4,
            elems_per in 1usize..4,
            step in 1usize..12,
            start in 0usize..40,
            count in 0usize..700,
        ) {
            let elem = (1usize << shift) * elems_per;
            let stride = elem * step;
            let offset = start * elem;
            let bytes = offset + stride * count + elem + 1;
            let mut a = Recorder::new();
            let ida = a.add_alloc(0, bytes, elem).unwrap();
            a.alloc(ida).strided(false, offset, elem, stride, count);
            let mut b = Recorder::new();
            let idb = b.add_alloc(0, bytes, elem).unwrap();
            for k in 0..count {
                b.alloc(idb).read(offset + k * stride, elem);
            }
            let (na, nb) = (a.close_interval(), b.close_interval());
            proptest::prop_assert_eq!(&na, &nb);
            for p in na.reads.iter() {
                proptest::prop_assert_eq!(
                    bits_of(&mut a, 1, p, AccessKind::Read),
                    bits_of(&mut b, 1, p, AccessKind::Read)
                );
            }
        }
    }

    #[test]
    fn shippable_bitmaps_round_trip_and_respect_the_cap() {
        let mut r = Recorder::new();
        let id = r.add_alloc(0, 4 * PAGE_SIZE, 8).unwrap();
        r.alloc(id).write(0, 2 * PAGE_SIZE); // pages 0, 1: uniform
        r.alloc(id).read(2 * PAGE_SIZE + 8, 8); // page 2: one element
        r.alloc(id).read(3 * PAGE_SIZE, 8); // page 3
        r.close_interval();
        let shipped = r.shippable(|p| p != 3, 1 << 20).unwrap();
        assert_eq!(shipped.len(), 3);
        for b in &shipped {
            assert_eq!(
                decode_words(&b.bits),
                bits_of(&mut r, 1, b.key.page, b.key.kind)
            );
        }
        let write = shipped.iter().find(|b| b.key.kind == AccessKind::Write);
        assert_eq!(
            write.unwrap().bits.len(),
            10,
            "uniform bitmaps ship compactly"
        );
        assert!(r.shippable(|_| true, 40).is_none());
    }

    #[test]
    fn shipping_listed_pages_looks_them_up_as_the_scan_finds_them() {
        let mut r = Recorder::new();
        let id = r.add_alloc(0, 64 * PAGE_SIZE, 8).unwrap();
        for interval in 0..3 {
            for p in 0..64 {
                if (p + interval) % 3 != 0 {
                    r.alloc(id).read(p * PAGE_SIZE + 8 * interval, 16);
                }
                if p % 5 == interval {
                    r.alloc(id).write(p * PAGE_SIZE + 40, 8);
                }
            }
            r.close_interval();
        }
        for pages in [vec![], vec![0], vec![1, 2, 30, 63], vec![7, 64, 99]] {
            let keep = |p: PageNo| pages.contains(&p);
            let scanned = r.shippable(keep, usize::MAX).unwrap();
            let looked_up = {
                let (store, mut names) = r.store_and_names();
                store.encoded_pages(&mut names, &pages)
            };
            assert_eq!(looked_up, scanned, "{pages:?}");
            assert_eq!(r.shippable_pages(&pages, usize::MAX).unwrap(), scanned);
        }
        assert!(r.shippable_pages(&[1], 8).is_none(), "over the cap");
    }

    #[test]
    fn runs_of_pages_answer_as_single_pages() {
        let mut r = Recorder::new();
        // Two allocations back to back with different granules (words per page), so a run
        // must not cross from one into the other.
        let f64s = r.add_alloc(0, 6 * PAGE_SIZE, 8).unwrap();
        let bytes = r.add_alloc(6, 3 * PAGE_SIZE, 1).unwrap();
        r.alloc(f64s).write(0, 6 * PAGE_SIZE);
        r.alloc(f64s).write(3 * PAGE_SIZE + 8, 8); // same bits, but a second site
        r.alloc(f64s).read(PAGE_SIZE, 2 * PAGE_SIZE); // pages 1, 2
        r.alloc(f64s).read(4 * PAGE_SIZE + 16, 8); // page 4: not uniform
        r.alloc(f64s).read(5 * PAGE_SIZE, PAGE_SIZE);
        r.alloc(bytes).write(0, 3 * PAGE_SIZE);
        r.close_interval();
        let expect = |page: PageNo, kind: AccessKind| -> Vec<u64> {
            let wpp = if page < 6 { 8 } else { 64 };
            let full = vec![u64::MAX; wpp];
            match (kind, page) {
                (AccessKind::Write, _) => full,
                (AccessKind::Read, 1 | 2 | 5) => full,
                (AccessKind::Read, 4) => {
                    let mut w = vec![0; wpp];
                    w[0] = 1 << 2;
                    w
                }
                (AccessKind::Read, _) => Vec::new(),
            }
        };
        for page in 0..10 {
            for kind in [AccessKind::Read, AccessKind::Write] {
                let want = if page < 9 {
                    expect(page, kind)
                } else {
                    Vec::new()
                };
                assert_eq!(bits_of(&mut r, 1, page, kind), want, "{page} {kind:?}");
            }
        }
        let all: Vec<PageNo> = (0..10).collect();
        let scanned = r.shippable(|_| true, usize::MAX).unwrap();
        assert_eq!(scanned.len(), 9 + 4);
        let (store, mut names) = r.store_and_names();
        assert_eq!(store.encoded_pages(&mut names, &all), scanned);
        // Page 3's second site splits the writes' run; the allocation boundary does too.
        let write_entries = r.store.index.iter().filter(|s| s.kind == AccessKind::Write);
        assert_eq!(write_entries.count(), 4);
    }

    /// A recorder of 80 pages of u64s and 3 of bytes, keeping the shadows of intervals
    /// that touch `defer_min_pages` pages of one allocation.
    fn large_recorder(defer_min_pages: usize) -> Recorder {
        let mut r = Recorder::new();
        r.defer_min_pages = defer_min_pages;
        r.add_alloc(0, 80 * PAGE_SIZE, 8).unwrap();
        r.add_alloc(80, 3 * PAGE_SIZE, 1).unwrap();
        r
    }

    /// Bitmaps in a comparable form (sorted: where each is kept sets their order).
    fn sorted(
        mut b: Vec<(BitmapKey, Vec<u64>, Vec<usize>)>,
    ) -> Vec<(BitmapKey, Vec<u64>, Vec<usize>)> {
        b.sort_by_key(|(k, _, _)| *k);
        b
    }

    proptest::proptest! {
        /// Intervals whose shadows the store keeps (see `DEFER_MIN_PAGES`) give the same
        /// notices' pages and the same bitmaps, with their sites, as when every page is
        /// copied; and a shadow given back at the end of an epoch records afresh.
        #[test]
        fn kept_shadows_answer_as_copied_bitmaps(
            epochs in proptest::collection::vec(
                proptest::collection::vec(
                    (
                        0usize..3,
                        proptest::collection::vec(
                            (0usize..2, proptest::bool::ANY, 0usize..80 * PAGE_SIZE, 1usize..9000, 0u64..3),
                            0..24,
                        ),
                    ),
                    1..4,
                ),
                1..4,
            ),
        ) {
            let mut kept = large_recorder(DEFER_MIN_PAGES);
            let mut copied = large_recorder(usize::MAX);
            let sizes = [80 * PAGE_SIZE, 3 * PAGE_SIZE];
            for (e, intervals) in epochs.iter().enumerate() {
                for (band, accesses) in intervals {
                    let accesses: Vec<Access> = accesses
                        .iter()
                        .map(|&(alloc, write, offset, len, site)| {
                            let offset = offset % sizes[alloc];
                            (alloc, write, offset, len.min(sizes[alloc] - offset), site)
                        })
                        .collect();
                    for r in [&kept, &copied] {
                        // A band written from one line makes the interval large; a band of
                        // reads from two lines gives pages with two sites.
                        match band {
                            1 => r.alloc(0).write(PAGE_SIZE, 70 * PAGE_SIZE),
                            2 => {
                                r.alloc(0).read(0, 40 * PAGE_SIZE);
                                r.alloc(0).read(30 * PAGE_SIZE, 40 * PAGE_SIZE);
                            }
                            _ => {}
                        }
                        replay(r, &accesses);
                    }
                    let (k, c) = (kept.close_interval(), copied.close_interval());
                    proptest::prop_assert_eq!(&k.reads, &c.reads);
                    proptest::prop_assert_eq!(&k.writes, &c.writes);
                }
                let keys: Vec<BitmapKey> = (0..83)
                    .step_by(7)
                    .flat_map(|page| {
                        (1..=kept.current_interval()).flat_map(move |interval| {
                            [AccessKind::Read, AccessKind::Write]
                                .map(|kind| BitmapKey { interval, page, kind })
                        })
                    })
                    .collect();
                let fetched = |r: &mut Recorder| {
                    let bitmaps = r.bitmaps(&keys);
                    let table: Vec<usize> = r.sites.iter().map(|s| s.key()).collect();
                    bitmaps
                        .into_iter()
                        .map(|b| {
                            let spans: Vec<(usize, u16, u16)> = b
                                .sites
                                .iter()
                                .map(|s| (table[s.site as usize], s.first, s.last))
                                .collect();
                            (b.key, decode_words(&b.bits), spans)
                        })
                        .collect::<Vec<_>>()
                };
                proptest::prop_assert_eq!(fetched(&mut kept), fetched(&mut copied));
                let pages: Vec<PageNo> = vec![0, 1, 40, 70, 71, 80, 82];
                let listed = |r: &mut Recorder| {
                    let mut b = r.shippable_pages(&pages, usize::MAX).unwrap();
                    b.sort_by_key(|b| b.key);
                    b.into_iter().map(|b| (b.key, decode_words(&b.bits))).collect::<Vec<_>>()
                };
                proptest::prop_assert_eq!(listed(&mut kept), listed(&mut copied));
                if e % 2 == 0 {
                    proptest::prop_assert_eq!(sorted(shipped_form(&mut kept)), sorted(shipped_form(&mut copied)));
                } else {
                    kept.discard_epoch();
                    copied.discard_epoch();
                }
            }
        }
    }

    #[test]
    fn epoch_discard_frees_bitmaps() {
        let mut r = Recorder::new();
        let id = r.add_alloc(0, 4 * PAGE_SIZE, 8).unwrap();
        r.alloc(id).write(0, 4 * PAGE_SIZE);
        r.close_interval();
        // Four fully written pages from one line: one run of uniform bitmaps (one word,
        // one index entry) and one site span.
        assert_eq!(r.store_bytes(), 8 + std::mem::size_of::<Stored>() + 8);
        r.discard_epoch();
        assert_eq!(r.store_bytes(), 0);
        assert!(bits_of(&mut r, 1, 0, AccessKind::Write).is_empty());
    }

    /// Reads `len` bytes at `offset`, recorded at the caller's line; returns that line.
    #[track_caller]
    fn read_here(r: &Recorder, offset: usize, len: usize) -> u32 {
        r.alloc(0).read(offset, len);
        Location::caller().line()
    }

    #[test]
    fn bitmaps_name_the_sites_of_their_granules() {
        let mut r = Recorder::new();
        r.add_alloc(0, 2 * PAGE_SIZE, 8).unwrap();
        let a = r.alloc(0);
        // Two lines alternate on page 0 (their list keeps one run per site), a third
        // writes across the page boundary.
        let mut lines = (0, 0);
        for i in 0..10 {
            a.read(8 * i, 8);
            lines.0 = line!() - 1;
            a.read(8 * (100 + i), 8);
            lines.1 = line!() - 1;
        }
        a.write(PAGE_SIZE - 16, 32);
        let write_line = line!() - 1;
        r.close_interval();
        let bitmaps = r.bitmaps(&[
            BitmapKey {
                interval: 1,
                page: 0,
                kind: AccessKind::Read,
            },
            BitmapKey {
                interval: 1,
                page: 0,
                kind: AccessKind::Write,
            },
            BitmapKey {
                interval: 1,
                page: 1,
                kind: AccessKind::Write,
            },
        ]);
        let spans = |b: &EncodedBitmap| -> Vec<(u32, u16, u16)> {
            b.sites.iter().map(|s| (s.site, s.first, s.last)).collect()
        };
        // The first line's granules were not tracked while it was the page's only site:
        // its span is the page; the second's is exact (and the narrowest names a granule).
        assert_eq!(spans(&bitmaps[0]), vec![(0, 0, 511), (1, 100, 109)]);
        // Pages touched from one line only: the whole page.
        assert_eq!(spans(&bitmaps[1]), vec![(2, 0, 511)]);
        assert_eq!(spans(&bitmaps[2]), vec![(2, 0, 511)]);
        // Each site is defined once in the list, on its first mention.
        let defs: Vec<(u32, u32)> = bitmaps
            .iter()
            .flat_map(|b| &b.defs)
            .map(|(site, d)| (*site, d.line))
            .collect();
        assert_eq!(defs, vec![(0, lines.0), (1, lines.1), (2, write_line)]);
        assert!(bitmaps[0].defs[0].1.file.ends_with("record.rs"));
        assert!(bitmaps[0].defs[0].1.column > 0);
        assert!(bitmaps[2].defs.is_empty(), "defined once in the list");
        // A new interval starts with no sites; known sites keep their numbers.
        let again = read_here(&r, 0, 8);
        r.close_interval();
        let b = r.bitmaps(&[BitmapKey {
            interval: 2,
            page: 0,
            kind: AccessKind::Read,
        }]);
        assert_eq!(b[0].sites.len(), 1);
        assert_eq!(b[0].sites[0].site, 3);
        assert_eq!(b[0].defs, vec![(3, b[0].defs[0].1.clone())]);
        assert_eq!(b[0].defs[0].1.line, again);
    }
}
