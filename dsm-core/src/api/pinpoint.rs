//! Pinpoint mode on a node (`dsmrun --pinpoint VAR[INDEX]@EPOCH`): the view accessors are
//! `#[track_caller]`, and a view of an allocation with a watched element carries a
//! reference to its [`AllocWatch`] (one word, `None` for every other view); an access that touches a watched element in its epoch is noted with the
//! caller's file, line and column (and, once per location, the function, from a
//! backtrace). Before each barrier the node appends its notes to its file in the
//! pinpoint directory, where the barrier master reads them when it reports the epoch
//! (`dsm_race::pinpoint`). Views of other allocations carry nothing, and without race
//! detection no view does, so the rest of the program pays nothing.

use dsm_race::pinpoint::{Hit, PinTarget};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::panic::Location;
use std::path::PathBuf;

/// What makes a note distinct: element, epoch, interval, write, file, line, column.
type NoteKey = (usize, u32, u32, bool, &'static str, u32, u32);

/// The node's pinpoint state.
pub(super) struct PinState {
    rank: u16,
    targets: Vec<PinTarget>,
    pub(super) dir: PathBuf,
    /// Per allocation (by id): its name and watched elements.
    watched: Vec<AllocWatch>,
    /// The program's epoch (barriers called + 1) and this node's interval (from 1, one
    /// more at every acquire, release, barrier and allocation), as race reports count.
    epoch: Cell<u32>,
    interval: Cell<u32>,
    hits: RefCell<Vec<Hit>>,
    /// Accesses already noted (element, epoch, interval, read/write, location), so a
    /// repeated access costs one lookup.
    seen: RefCell<std::collections::HashSet<NoteKey>>,
    /// Function names by location, resolved once.
    functions: RefCell<HashMap<(&'static str, u32), Option<String>>>,
}

/// An allocation's watched elements (with their epochs) and its name.
pub(super) struct AllocWatch {
    name: String,
    watched: Vec<(usize, u32)>,
    /// The lowest and highest watched index, so that most accesses are passed over
    /// inline, without a call.
    lo: usize,
    hi: usize,
}

impl AllocWatch {
    /// Whether an access to elements `start..end` may touch a watched element.
    #[inline(always)]
    pub(super) fn may_touch(&self, start: usize, end: usize) -> bool {
        start <= self.hi && end > self.lo
    }
}

impl PinState {
    pub(super) fn new(rank: usize, specs: &[String], dir: PathBuf) -> Result<PinState, String> {
        let targets = specs
            .iter()
            .map(|s| s.parse::<PinTarget>())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PinState {
            rank: rank as u16,
            targets,
            dir,
            watched: Vec::new(),
            epoch: Cell::new(1),
            interval: Cell::new(1),
            hits: RefCell::new(Vec::new()),
            seen: RefCell::new(Default::default()),
            functions: RefCell::new(HashMap::new()),
        })
    }

    /// A new allocation (ids count up from 0): its watched elements.
    pub(super) fn add_alloc(&mut self, name: &str) {
        let watched: Vec<(usize, u32)> = self
            .targets
            .iter()
            .filter(|t| t.variable == name)
            .map(|t| (t.index, t.epoch))
            .collect();
        self.watched.push(AllocWatch {
            name: name.to_string(),
            lo: watched.iter().map(|w| w.0).min().unwrap_or(usize::MAX),
            hi: watched.iter().map(|w| w.0).max().unwrap_or(0),
            watched,
        });
    }

    /// What a view of allocation `id` carries: its watch, if it has watched elements.
    pub(super) fn view(&self, id: usize) -> Option<&AllocWatch> {
        self.watched.get(id).filter(|w| !w.watched.is_empty())
    }

    pub(super) fn interval_closed(&self) {
        self.interval.set(self.interval.get() + 1);
    }

    pub(super) fn barrier_passed(&self, barriers_called: u32) {
        self.epoch.set(barriers_called + 1);
        // Notes of past epochs cannot repeat.
        self.seen.borrow_mut().clear();
    }

    /// Appends the notes so far to this node's files (before a barrier, where the master
    /// may report the epoch).
    pub(super) fn flush(&self) -> std::io::Result<()> {
        let hits = std::mem::take(&mut *self.hits.borrow_mut());
        if hits.is_empty() {
            return Ok(());
        }
        dsm_race::pinpoint::append_hits(&self.dir, self.rank as usize, &hits)
    }

    /// Warnings for the targets the run could not watch: a name no allocation had, an
    /// index past the allocation's end, an epoch after the last one the run had
    /// (`last_epoch`, the one checked at finish). `allocs` gives each allocation's name
    /// and length.
    pub(super) fn unmet_targets(&self, allocs: &[(&str, usize)], last_epoch: u32) -> Vec<String> {
        let mut warnings = Vec::new();
        for t in &self.targets {
            let what = match allocs.iter().find(|(name, _)| *name == t.variable) {
                None => {
                    let names: Vec<&str> = allocs.iter().map(|a| a.0).collect();
                    format!(
                        "no allocation is named '{}' (the run allocated: {})",
                        t.variable,
                        names.join(", ")
                    )
                }
                Some((_, len)) if t.index >= *len => format!(
                    "index {} is past the end of '{}' ({len} element{})",
                    t.index,
                    t.variable,
                    if *len == 1 { "" } else { "s" }
                ),
                Some(_) if t.epoch > last_epoch => format!(
                    "the run ended in epoch {last_epoch} ({} barrier{} before finish)",
                    last_epoch - 1,
                    if last_epoch == 2 { "" } else { "s" }
                ),
                Some(_) => continue,
            };
            warnings.push(format!(
                "dsm: warning: --pinpoint {t} watched nothing: {what}"
            ));
        }
        warnings
    }

    fn function(&self, loc: &'static Location<'static>) -> Option<String> {
        self.functions
            .borrow_mut()
            .entry((loc.file(), loc.line()))
            .or_insert_with(|| {
                let bt = std::backtrace::Backtrace::force_capture().to_string();
                dsm_race::pinpoint::function_in_backtrace(&bt, loc.file(), loc.line())
            })
            .clone()
    }
}

impl PinState {
    /// An access to elements `start, start + step, ...` (`count` of them) of the
    /// allocation `watch` at `loc`.
    #[cold]
    #[inline(never)]
    pub(super) fn touch(
        &self,
        watch: &AllocWatch,
        start: usize,
        step: usize,
        count: usize,
        write: bool,
        loc: &'static Location<'static>,
    ) {
        let s = self;
        let epoch = s.epoch.get();
        let step = step.max(1);
        for &(index, ep) in &watch.watched {
            if ep != epoch || index < start || !(index - start).is_multiple_of(step) {
                continue;
            }
            if (index - start) / step >= count {
                continue;
            }
            let interval = s.interval.get();
            let key = (
                index,
                epoch,
                interval,
                write,
                loc.file(),
                loc.line(),
                loc.column(),
            );
            if !s.seen.borrow_mut().insert(key) {
                continue;
            }
            let hit = Hit {
                variable: watch.name.clone(),
                index,
                epoch,
                rank: s.rank,
                interval,
                write,
                file: loc.file().to_string(),
                line: loc.line(),
                column: loc.column(),
                function: s.function(loc),
            };
            s.hits.borrow_mut().push(hit);
        }
    }
}
