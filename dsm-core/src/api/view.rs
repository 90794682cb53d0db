//! Access to shared arrays: the [`Array`] handle an allocation returns and the views
//! ([`View`], [`Block`], [`Strided`], [`StridedMut`]) through which every load and store
//! goes. Each view method records its footprint for the race detector when detection is on;
//! bulk accessors record it in one step and prefetch missing pages in batches.

use super::pinpoint::AllocWatch;
use super::{Dsm, PREFETCH_MIN_PAGES};
use crate::sys::{AppSlice, AppStrided};
use bytemuck::Pod;
use dsm_proto::{PageNo, PageRuns, PAGE_SIZE};
use dsm_race::AllocShadow;
use std::marker::PhantomData;
use std::ops::Range;
use std::panic::Location;

/// The `k`-th of `parts` near-equal contiguous pieces of `0..total`: the pieces for
/// `k = 0..parts` are disjoint, cover `0..total` in order and differ in length by at most
/// one. [`Distribution::Block`](crate::Distribution::Block) homes 2-D arrays by these
/// bands of rows, so a node working on `band(rows, size, rank)` writes pages it homes.
/// `parts` of 0 counts as 1.
pub fn band(total: usize, parts: usize, k: usize) -> Range<usize> {
    let parts = parts.max(1);
    (k * total / parts)..((k + 1) * total / parts)
}

/// A shared array: a plain handle (copyable, no borrow) naming an allocation.
pub struct Array<T> {
    pub(super) id: usize,
    pub(super) offset: usize,
    pub(super) len: usize,
    pub(super) cols: usize,
    pub(super) _t: PhantomData<T>,
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
    /// Number of elements (`rows * cols` for 2-D arrays).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the array has no elements (never true: empty allocations are refused).
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
    pub(super) mem: AppSlice<T>,
    pub(super) shadow: Option<&'a AllocShadow>,
    /// Pinpoint: this allocation's watched elements (only with race detection on).
    pub(super) pin: Option<&'a AllocWatch>,
    pub(super) cols: usize,
    pub(super) first_page: PageNo,
    pub(super) dsm: &'a Dsm,
}

impl<T> Clone for View<'_, T> {
    fn clone(&self) -> Self {
        View {
            mem: self.mem,
            shadow: self.shadow,
            pin: self.pin,
            cols: self.cols,
            first_page: self.first_page,
            dsm: self.dsm,
        }
    }
}

impl<'a, T: Pod> View<'a, T> {
    const SIZE: usize = std::mem::size_of::<T>();

    /// Number of elements of the array.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }

    /// Columns of a 2-D array (1-D arrays: the length, as [`Array::cols`](crate::Array::cols)).
    pub fn cols(&self) -> usize {
        if self.cols == 0 {
            self.len()
        } else {
            self.cols
        }
    }

    /// Reads element `i`, recorded as a read of that element. Panics if `i` is out of
    /// bounds.
    #[inline(always)]
    #[track_caller]
    pub fn get(&self, i: usize) -> T {
        // The access first: an index out of bounds panics there, at the caller's line.
        let value = self.mem.get(i);
        if let Some(s) = self.shadow {
            s.read(i * Self::SIZE, Self::SIZE);
            if let Some(w) = self.pin.filter(|w| w.may_touch(i, i + 1)) {
                self.pin_touch(w, i, 1, 1, false, Location::caller());
            }
        }
        value
    }

    /// Writes element `i`, recorded as a write of that element. Panics if `i` is out of
    /// bounds.
    #[inline(always)]
    #[track_caller]
    pub fn set(&self, i: usize, value: T) {
        // The access first: an index out of bounds panics there, at the caller's line.
        self.mem.set(i, value);
        if let Some(s) = self.shadow {
            s.write(i * Self::SIZE, Self::SIZE);
            if let Some(w) = self.pin.filter(|w| w.may_touch(i, i + 1)) {
                self.pin_touch(w, i, 1, 1, true, Location::caller());
            }
        }
    }

    /// Reads element `(row, col)` of a 2-D array.
    #[inline(always)]
    #[track_caller]
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
    #[track_caller]
    pub fn set2(&self, row: usize, col: usize, value: T) {
        assert!(
            col < self.cols,
            "column {col} out of bounds ({} columns)",
            self.cols
        );
        self.set(row * self.cols + col, value)
    }

    /// Pinpoint: notes an access to watched allocation `w` (only views of watched
    /// allocations get here).
    #[cold]
    #[inline(never)]
    fn pin_touch(
        &self,
        w: &AllocWatch,
        start: usize,
        step: usize,
        count: usize,
        write: bool,
        loc: &'static Location<'static>,
    ) {
        if let Some(state) = &self.dsm.pin {
            state.touch(w, start, step, count, write, loc);
        }
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

    /// [`View::prefetch`] of several element ranges at once: the missing pages of all of
    /// them travel in one request per home (up to the batch limit), instead of one round
    /// trip per range. For gathers of many separate chunks, such as the columns of a
    /// row-major matrix. It records nothing.
    pub fn prefetch_ranges(&self, ranges: impl IntoIterator<Item = Range<usize>>, write: bool) {
        let mut runs = Vec::new();
        for r in ranges {
            if r.is_empty() {
                continue;
            }
            assert!(
                r.end <= self.len(),
                "prefetch of {}..{} out of bounds (len {})",
                r.start,
                r.end,
                self.len()
            );
            let (first, last) = self.page_span(r.start, r.len());
            if self.dsm.states.any_missing(first, last, write) {
                runs.push((first as PageNo, (last - first + 1) as u32));
            }
        }
        if !runs.is_empty() {
            self.dsm.prefetch_runs(PageRuns::from_runs(runs), write);
        }
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
    #[track_caller]
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
            if let Some(w) = self.pin.filter(|w| w.may_touch(start, start + out.len())) {
                self.pin_touch(w, start, 1, out.len(), false, Location::caller());
            }
        }
        self.prefetch_checked(start, out.len(), false);
        self.mem.read_into(start, out)
    }

    /// Copies `src` into the array from `start` (one recorded write of the whole range).
    #[track_caller]
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
            if let Some(w) = self.pin.filter(|w| w.may_touch(start, start + src.len())) {
                self.pin_touch(w, start, 1, src.len(), true, Location::caller());
            }
        }
        self.prefetch_checked(start, src.len(), true);
        self.mem.write_from(start, src)
    }

    /// The whole array as a local vector.
    #[track_caller]
    pub fn to_vec(&self) -> Vec<T> {
        let mut v = vec![T::zeroed(); self.len()];
        self.read_into(0, &mut v);
        v
    }

    /// Sets every element of `range` to `value`.
    #[track_caller]
    pub fn fill(&self, range: Range<usize>, value: T) {
        let v = vec![value; range.len()];
        self.write_from(range.start, &v);
    }

    /// Copies row `row` of a 2-D array into `out` (`out.len()` must be the column count).
    #[track_caller]
    pub fn read_row(&self, row: usize, out: &mut [T]) {
        assert_eq!(out.len(), self.cols, "row buffer must hold one row");
        self.read_into(row * self.cols, out)
    }

    /// Writes row `row` of a 2-D array from `src`.
    #[track_caller]
    pub fn write_row(&self, row: usize, src: &[T]) {
        assert_eq!(src.len(), self.cols, "row buffer must hold one row");
        self.write_from(row * self.cols, src)
    }

    /// Read access to elements `start, start+step, ...` (`count` of them), recorded as one
    /// read of exactly those elements.
    #[track_caller]
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
            if let Some(w) = self
                .pin
                .filter(|w| w.may_touch(start, start + step * count))
            {
                self.pin_touch(w, start, step, count, false, Location::caller());
            }
        }
        Strided {
            mem,
            _life: PhantomData,
        }
    }

    /// Write access to elements `start, start+step, ...`, recorded as one write of exactly
    /// those elements.
    #[track_caller]
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
            if let Some(w) = self
                .pin
                .filter(|w| w.may_touch(start, start + step * count))
            {
                self.pin_touch(w, start, step, count, true, Location::caller());
            }
        }
        StridedMut {
            mem,
            _life: PhantomData,
        }
    }

    /// Read access to rows `rows` of a 2-D array, recorded as one read of all of them:
    /// the cheapest way for stencil codes to declare what they read.
    #[track_caller]
    pub fn block(&self, rows: Range<usize>) -> Block<'a, T> {
        assert!(self.cols > 0, "block() needs a 2-D array");
        let start = rows.start * self.cols;
        let len = rows.len() * self.cols;
        let mem = self.mem.sub(start, len);
        self.prefetch_checked(start, len, false);
        if let Some(s) = self.shadow {
            s.read(start * Self::SIZE, len * Self::SIZE);
            if let Some(w) = self.pin.filter(|w| w.may_touch(start, start + len)) {
                self.pin_touch(w, start, 1, len, false, Location::caller());
            }
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
    #[track_caller]
    pub fn row(&self, row: usize) -> Strided<'a, T> {
        self.strided(row * self.cols, 1, self.cols)
    }

    /// Write access to one row of a 2-D array.
    #[track_caller]
    pub fn row_mut(&self, row: usize) -> StridedMut<'a, T> {
        self.strided_mut(row * self.cols, 1, self.cols)
    }

    /// The same view with recording turned off: accesses through it are invisible to the
    /// race detector (for code that knowingly opts out).
    pub fn unrecorded(&self) -> View<'a, T> {
        View {
            shadow: None,
            pin: None,
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
    #[track_caller]
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
    #[track_caller]
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
    /// Number of elements in the set (the `count` it was made with).
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Whether the set has no elements.
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }

    /// The `k`-th element of the set. Panics if `k` is not below [`len`](Self::len).
    #[inline(always)]
    #[track_caller]
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
    /// Number of elements in the set (the `count` it was made with).
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Whether the set has no elements.
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }

    /// Writes the `k`-th element of the set. Panics if `k` is not below
    /// [`len`](Self::len).
    #[inline(always)]
    #[track_caller]
    pub fn set(&self, k: usize, value: T) {
        self.mem.set(k, value)
    }
}
