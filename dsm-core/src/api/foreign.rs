//! For runtimes of other languages (dsm-capi's C API and its ThreadSanitizer hooks):
//! allocations whose element type is known only by its size, their addresses in the
//! segment, and their race shadows, through which such a runtime records the accesses
//! the compiler's instrumentation reports.

use super::{Distribution, Dsm, ElemType};
use crate::error::DsmError;
use dsm_race::AllocShadow;

/// A shared array of elements known by size only (see [`Dsm::alloc_raw`]): a plain,
/// copyable handle.
#[derive(Clone, Copy, Debug)]
pub struct RawArray {
    id: usize,
    addr: usize,
    len: usize,
    cols: usize,
    elem_size: usize,
}

impl RawArray {
    /// The address of element 0 in this process (the same on every rank).
    #[inline]
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Number of elements (`rows * cols` for 2-D arrays).
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the array has no elements (never true: empty allocations are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of one element.
    #[inline]
    pub fn elem_size(&self) -> usize {
        self.elem_size
    }

    /// Bytes of the whole array.
    #[inline]
    pub fn bytes(&self) -> usize {
        self.len * self.elem_size
    }

    /// Columns of a 2-D array; 0 for a 1-D array.
    #[inline]
    pub fn cols(&self) -> usize {
        self.cols
    }
}

impl Dsm {
    /// Collectively allocates a named array of `len` zeroed elements of `elem_size` bytes
    /// each, 2-D with `cols` columns (row-major, homed by row bands) when `cols` is not 0:
    /// [`Dsm::alloc`] and [`Dsm::alloc_2d`] for elements whose type the caller knows only
    /// by size (a C program's). Race reports name its elements `name[i]` or `name[r][c]`.
    /// The memory is accessed through [`RawArray::addr`], so nothing records its
    /// accesses unless the caller does, through [`Dsm::raw_shadow`].
    pub fn alloc_raw(
        &mut self,
        name: &str,
        elem_size: usize,
        len: usize,
        cols: usize,
    ) -> Result<RawArray, DsmError> {
        if cols > 0 && !len.is_multiple_of(cols) {
            return Err(DsmError::InvalidAlloc(format!(
                "'{name}': {len} elements are not whole rows of {cols}"
            )));
        }
        // Elements of a C program are aligned to at most their size, and at most 16.
        let align = if elem_size.is_power_of_two() {
            elem_size.min(16)
        } else {
            1 << elem_size.trailing_zeros().min(4)
        };
        let ty = ElemType {
            size: elem_size,
            align,
            name: format!("[u8; {elem_size}]"),
        };
        let (id, offset) = self.alloc_elems(name, len, cols, Distribution::Block, ty)?;
        Ok(RawArray {
            id,
            addr: self.seg.app_base() + offset,
            len,
            cols,
            elem_size,
        })
    }

    /// The race shadow of `array`, through which accesses to it are recorded; `None`
    /// without race detection.
    #[inline]
    pub fn raw_shadow(&self, array: &RawArray) -> Option<&AllocShadow> {
        self.race.as_ref().map(|r| r.recorder.alloc(array.id))
    }

    /// [`Dsm::assume_initialised`] for a raw array (C's `dsm_assume_initialised`).
    pub fn assume_raw_initialised(&mut self, array: &RawArray) {
        self.assume_alloc_initialised(array.id);
    }

    /// [`Dsm::declare_region`] for a raw array (C's `dsm_declare_region`).
    pub fn declare_raw_region(
        &mut self,
        array: &RawArray,
        rule: super::RegionRule,
        region: impl Fn(usize) -> std::ops::Range<usize>,
    ) {
        self.declare_alloc_region(array.id, rule, region);
    }

    /// Acquires lock `id` as [`Dsm::lock`] does, without a guard: for a caller that
    /// cannot hold one (C's `dsm_lock` and `dsm_unlock` are separate calls). The caller
    /// must release it with [`Dsm::unlock_unguarded`].
    pub fn lock_unguarded(&mut self, id: u64) -> Result<(), DsmError> {
        let guard = self.lock(id)?;
        // Forgetting the guard keeps the lock held; it owns nothing else.
        std::mem::forget(guard);
        Ok(())
    }

    /// [`Dsm::lock_named`] without a guard (see [`Dsm::lock_unguarded`]); returns the
    /// lock's id, for [`Dsm::unlock_unguarded`].
    pub fn lock_named_unguarded(&mut self, name: &str) -> Result<u64, DsmError> {
        let guard = self.lock_named(name)?;
        let id = guard.id();
        std::mem::forget(guard);
        Ok(id)
    }

    /// Releases lock `id` taken by [`Dsm::lock_unguarded`] or
    /// [`Dsm::lock_named_unguarded`]. The caller keeps track of which locks it holds:
    /// releasing one it does not hold is its error, not checked here.
    pub fn unlock_unguarded(&mut self, id: u64) -> Result<(), DsmError> {
        match self.host_locks.then(|| self.seg.host_lock(id)).flatten() {
            Some(host) => self.release_host_lock(id, host),
            None => self.release(id),
        }
    }

    /// The address range of the shared segment's allocations so far (`start..end`):
    /// accesses outside it are not to shared memory.
    pub fn allocated_range(&self) -> std::ops::Range<usize> {
        let base = self.seg.app_base();
        base..base + self.next_page * dsm_proto::PAGE_SIZE
    }
}
