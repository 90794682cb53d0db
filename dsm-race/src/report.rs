//! Race reports: human-readable blocks on stderr, one JSON object per race in the
//! `--race-log` file (every race, every field; the fields are documented in the README),
//! a SARIF 2.1.0 file (`--race-sarif`) for CI systems and editors, and the end-of-run
//! summary.
//!
//! The printed report collapses the way ThreadSanitizer collapses reports by stack pair:
//! a race is identified by its [`Signature`] (the variable and the two sides: what each
//! did and what began its interval, with lock names but without ranks, interval or
//! barrier numbers), and each signature is printed once, the first time it occurs (with
//! a count and the first few elements of that interval pair); later occurrences are only
//! counted, and the summary lists every distinct race with how often it occurred. The
//! log keeps every race.
//!
//! Epochs are numbered the way the program counts its `barrier()` calls: epoch `k` runs
//! from barrier `k - 1` (or the start) to barrier `k`, and the epoch after the last barrier
//! is checked at finish. Collective allocations synchronize like barriers inside the
//! runtime but are not counted; a race found at one is reported within the epoch it
//! belongs to, naming the allocation.

use crate::check::{Finding, FindingKind};
use crate::detect::{sync_text, Race, RaceClass, RaceKind};
use dsm_proto::{after_barriers, NodeId, SyncCause};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// How many element indices a collapsed block lists.
const SHOWN_INDICES: usize = 4;

/// Prints and logs the races rank 0 finds, and counts them for the summary.
pub struct Reporter {
    /// The race log and its path (named in write errors).
    log: Option<(BufWriter<File>, PathBuf)>,
    total: u64,
    variables: BTreeSet<String>,
    first_only: bool,
    /// With `first_only`, set once an epoch has reported races: later epochs' races are
    /// affected by those and are not first races.
    first_epoch_done: bool,
    /// Names of named locks, so reports say "lock \"queue\"" rather than a hash.
    lock_names: std::collections::HashMap<u64, String>,
    /// What each of the runtime's synchronization epochs was in the program's terms
    /// (`barrier 3`, `the allocation of 'grid'`), for "after barrier N" in reports.
    sync_points: std::collections::HashMap<u32, String>,
    /// Schedule mode: lock edges are left out of the order, and lock-order dependences
    /// are reported (and counted) apart from data races.
    schedule: bool,
    /// Variables whose lock-order dependences are not reported (`--schedule-ignore`).
    ignore: BTreeSet<String>,
    lock_order_total: u64,
    lock_order_variables: BTreeSet<String>,
    /// `--check`: the summary counts check findings too.
    checking: bool,
    /// Elements reported by checks, per kind.
    check_totals: BTreeMap<FindingKind, u64>,
    /// Every distinct race so far, in the order first seen.
    distinct: Vec<Distinct>,
    /// Index into `distinct` by signature.
    by_signature: std::collections::HashMap<Signature, usize>,
    /// Blocks (and their races) not printed because their signature had been.
    suppressed_blocks: u64,
    suppressed_races: u64,
    /// Where to write SARIF at finish (`--race-sarif`).
    sarif: Option<std::path::PathBuf>,
    /// Pinpoint: the watched accesses of the epoch being reported, and where to look for
    /// source files.
    hits: Vec<crate::pinpoint::Hit>,
    roots: Vec<std::path::PathBuf>,
    /// `--check` findings of the run by kind and variable, in the order first seen (for
    /// SARIF).
    distinct_findings: Vec<DistinctFinding>,
    /// Names the function of a recorded source line (the program's debug information).
    functions: Option<FunctionNamer>,
    /// `--race-suppressions`: races these match are counted in `silenced`, not reported.
    suppressions: crate::suppress::Suppressions,
    silenced: u64,
}

/// What makes two races "the same race" for the printed report: the variable, class and
/// kind, and the two sides (sorted), each as its access and what began its interval
/// (lock names kept, barrier numbers, ranks and intervals dropped).
pub type Signature = (String, RaceClass, RaceKind, [String; 2]);

/// One distinct race of the run: its signature, how often it occurred, and where first.
#[derive(Clone, Debug)]
struct Distinct {
    signature: Signature,
    /// Races with this signature (elements times interval pairs times epochs).
    races: u64,
    /// The first occurrence's epoch, element and sides as printed.
    epoch: u32,
    element: String,
    sides: [String; 2],
    /// The source locations of each side.
    locations: [Vec<SourceLine>; 2],
}

/// The `--check` findings of one kind on one variable over the run: how many elements
/// (summed over epochs and ranks) and where first.
#[derive(Clone, Debug)]
struct DistinctFinding {
    kind: FindingKind,
    variable: String,
    elements: u64,
    epoch: u32,
    element: String,
    rank: NodeId,
}

/// Names the function containing a recorded access, where the program's debug
/// information says (set by the runtime, which can read it).
pub type FunctionNamer = Box<dyn Fn(&dsm_proto::SourceSite) -> Option<String> + Send + Sync>;

/// A source location as reports give it: file, line, column and, where known, function.
type SourceLine = (String, u32, u32, Option<String>);

/// Races collapse into one block per variable, interval pair, class and kind.
type BlockKey<'a> = (&'a str, (u16, u32), (u16, u32), RaceClass, RaceKind);

/// Where in the program an analysis happened, in the program's own terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Point {
    /// At the program's `n`-th `barrier()` call (counted from 1).
    Barrier(u32),
    /// At a collective allocation, after `after` barriers.
    Allocation {
        /// The allocation's name.
        name: String,
        /// Barriers the program had passed.
        after: u32,
    },
    /// At `finish()`, after `after` barriers.
    Exit {
        /// Barriers the program had passed.
        after: u32,
    },
    /// Between barriers, by the incremental analysis, after `after` barriers.
    Running {
        /// Barriers the program had passed.
        after: u32,
    },
}

impl Point {
    /// The epoch the analysed accesses belong to: epoch `k` ends at barrier `k`.
    pub fn epoch(&self) -> u32 {
        match self {
            Point::Barrier(n) => *n,
            Point::Allocation { after, .. } | Point::Exit { after } | Point::Running { after } => {
                after + 1
            }
        }
    }

    /// How a report says where this is.
    fn describe(&self) -> String {
        match self {
            Point::Barrier(n) => format!("in epoch {n} (ending at barrier {n})"),
            Point::Allocation { name, after } => format!(
                "in epoch {} (ending at the collective allocation of '{name}', {})",
                after + 1,
                after_barriers(*after)
            ),
            Point::Exit { after } => format!(
                "in epoch {} ({}, checked at finish)",
                after + 1,
                after_barriers(*after)
            ),
            Point::Running { after } => format!(
                "in epoch {} ({}, found while the program runs)",
                after + 1,
                after_barriers(*after)
            ),
        }
    }

    /// What this synchronization is called in reports: `barrier 3`, `the allocation of
    /// 'grid'`, `finish`.
    pub fn sync_label(&self) -> String {
        match self {
            Point::Barrier(n) => format!("barrier {n}"),
            Point::Allocation { name, .. } => format!("the allocation of '{name}'"),
            Point::Exit { .. } => "finish".into(),
            Point::Running { .. } => "the incremental analysis".into(),
        }
    }

    fn found_at(&self) -> &'static str {
        match self {
            Point::Barrier(_) => "barrier",
            Point::Allocation { .. } => "allocation",
            Point::Exit { .. } => "exit",
            Point::Running { .. } => "running",
        }
    }
}

impl Reporter {
    /// A reporter writing the JSON log to `log` (created now) if given; `first_only`
    /// reports only the first epoch with races (`--race-first`).
    pub fn new(log: Option<&Path>, first_only: bool) -> io::Result<Self> {
        let log = match log {
            Some(p) => Some((
                BufWriter::new(File::create(p).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("cannot create race log {}: {e}", p.display()),
                    )
                })?),
                p.to_path_buf(),
            )),
            None => None,
        };
        Ok(Reporter {
            log,
            total: 0,
            variables: BTreeSet::new(),
            first_only,
            first_epoch_done: false,
            lock_names: Default::default(),
            sync_points: Default::default(),
            schedule: false,
            ignore: BTreeSet::new(),
            lock_order_total: 0,
            lock_order_variables: BTreeSet::new(),
            checking: false,
            check_totals: BTreeMap::new(),
            distinct: Vec::new(),
            by_signature: Default::default(),
            suppressed_blocks: 0,
            suppressed_races: 0,
            sarif: None,
            hits: Vec::new(),
            roots: Vec::new(),
            distinct_findings: Vec::new(),
            functions: None,
            suppressions: Default::default(),
            silenced: 0,
        })
    }

    /// Races `suppressions` match are neither printed, logged nor counted as reported,
    /// only counted apart ([`Reporter::silenced`]).
    pub fn set_suppressions(&mut self, suppressions: crate::suppress::Suppressions) {
        self.suppressions = suppressions;
    }

    /// Races (and lock-order dependences) the suppressions silenced so far.
    pub fn silenced(&self) -> u64 {
        self.silenced
    }

    /// Pinpoint: the source locations of the watched accesses of the epoch about to be
    /// reported (every node's), so that races on watched elements show both sides' code.
    pub fn set_hits(&mut self, hits: Vec<crate::pinpoint::Hit>) {
        self.hits = hits;
    }

    /// How the functions of recorded source lines are named. Naming reads the program's
    /// debug information (a fraction of a second, once), so the reports printed as the
    /// program runs name functions only where `--pinpoint` does or a suppression entry
    /// matches by function; the SARIF log, written at the end, names them all.
    pub fn set_function_namer(&mut self, namer: FunctionNamer) {
        self.functions = Some(namer);
    }

    /// Directories in which source files named by relative paths are looked up.
    pub fn set_source_roots(&mut self, roots: Vec<std::path::PathBuf>) {
        self.roots = roots;
    }

    /// Writes the distinct races as SARIF 2.1.0 to `path` at [`Reporter::finish`].
    pub fn set_sarif(&mut self, path: &Path) {
        self.sarif = Some(path.to_path_buf());
    }

    /// Schedule mode (`--race=schedule`): the summary counts lock-order dependences apart
    /// from data races, and those on the `ignore`d variables (order-independent ones, such
    /// as a commutative sum) are not reported at all.
    pub fn set_schedule(&mut self, ignore: impl IntoIterator<Item = String>) {
        self.schedule = true;
        self.ignore = ignore.into_iter().collect();
    }

    /// `--check`: the summary says what the checks found (even when nothing).
    pub fn set_checking(&mut self) {
        self.checking = true;
    }

    /// Elements reported by `--check` so far, all kinds together.
    pub fn check_total(&self) -> u64 {
        self.check_totals.values().sum()
    }

    /// Prints the epoch's check findings to `out`, one block per variable, interval and
    /// kind, and logs each block as one JSON object; returns the number of elements
    /// reported.
    pub fn report_findings(
        &mut self,
        at: &Point,
        findings: &[Finding],
        out: &mut dyn Write,
    ) -> io::Result<u64> {
        if findings.is_empty() {
            return Ok(0);
        }
        let names = Names {
            locks: &self.lock_names,
            syncs: &self.sync_points,
            hits: &[],
            roots: &[],
            functions: None,
        };
        let mut text = String::new();
        for f in findings {
            text.push_str(&finding_block(at, f, &names));
        }
        out.write_all(text.as_bytes())?;
        out.flush()?;
        if let Some((log, path)) = self.log.as_mut() {
            let written = findings
                .iter()
                .try_for_each(|f| {
                    serde_json::to_writer(&mut *log, &finding_json(at, f, &names))?;
                    log.write_all(b"\n")
                })
                .and_then(|()| log.flush());
            written.map_err(|e| log_write_error(path, e))?;
        }
        let mut n = 0;
        for f in findings {
            *self.check_totals.entry(f.kind).or_default() += f.indices.len() as u64;
            n += f.indices.len() as u64;
            match self
                .distinct_findings
                .iter_mut()
                .find(|d| d.kind == f.kind && d.variable == f.variable)
            {
                Some(d) => d.elements += f.indices.len() as u64,
                None => self.distinct_findings.push(DistinctFinding {
                    kind: f.kind,
                    variable: f.variable.clone(),
                    elements: f.indices.len() as u64,
                    epoch: at.epoch(),
                    element: finding_element(f, f.indices[0]),
                    rank: f.node,
                }),
            }
        }
        Ok(n)
    }

    /// Stops reporting lock-order dependences on `variable` (an order-independent one).
    pub fn ignore(&mut self, variable: &str) {
        self.ignore.insert(variable.to_string());
    }

    /// Lock-order dependences reported so far (schedule mode).
    pub fn lock_order_total(&self) -> u64 {
        self.lock_order_total
    }

    /// Records what the runtime's synchronization epoch `epoch` was in the program's terms,
    /// once it has completed, so that later reports name it that way.
    pub fn note_sync(&mut self, epoch: u32, at: &Point) {
        self.sync_points.insert(epoch, at.sync_label());
    }

    /// Remembers the name of a named lock for reports.
    pub fn name_lock(&mut self, id: u64, name: &str) {
        self.lock_names.insert(id, name.to_string());
    }

    /// Whether only first races are reported.
    pub fn first_only(&self) -> bool {
        self.first_only
    }

    /// Whether races of this epoch should still be reported (`--race-first` stops after
    /// the first epoch with races).
    pub fn wants_more(&self) -> bool {
        !(self.first_only && self.first_epoch_done)
    }

    /// Data races reported so far (not counting lock-order dependences).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Distinct variables with races so far.
    pub fn variables(&self) -> usize {
        self.variables.len()
    }

    /// Prints the epoch's races (and, in schedule mode, lock-order dependences) to `out`
    /// and logs them; returns how many were reported. Lock-order dependences on ignored
    /// variables are dropped first.
    pub fn report(&mut self, at: &Point, races: &[Race], out: &mut dyn Write) -> io::Result<u64> {
        let kept: Vec<Race>;
        let races = match self.unsilenced(races) {
            Some(unsilenced) => {
                kept = unsilenced;
                &kept[..]
            }
            None => races,
        };
        if races.is_empty() || !self.wants_more() {
            return Ok(0);
        }
        if self.first_only {
            self.first_epoch_done = true;
        }
        let mut blocks: BTreeMap<BlockKey, Vec<&Race>> = BTreeMap::new();
        for r in races {
            blocks
                .entry((
                    r.variable.as_str(),
                    (r.first.node, r.first.interval),
                    (r.second.node, r.second.interval),
                    r.class,
                    r.kind,
                ))
                .or_default()
                .push(r);
        }
        self.print_blocks(at, &blocks, out)?;
        if let Some((mut log, path)) = self.log.take() {
            // Out of `self` while it is written: the names borrow `self`.
            let written = write_log(&mut log, at, races, &self.names());
            let written = written.map_err(|e| log_write_error(&path, e));
            self.log = Some((log, path));
            written?;
        }
        for r in races {
            if r.class == RaceClass::LockOrder {
                self.lock_order_total += 1;
                self.lock_order_variables.insert(r.variable.clone());
            } else {
                self.total += 1;
                self.variables.insert(r.variable.clone());
            }
        }
        Ok(races.len() as u64)
    }

    /// What reports name sides by: locks, sync points, pinpoint's hits, source roots and,
    /// when suppressions match functions, the function namer.
    fn names(&self) -> Names<'_> {
        Names {
            locks: &self.lock_names,
            syncs: &self.sync_points,
            hits: &self.hits,
            roots: &self.roots,
            functions: self
                .functions
                .as_ref()
                .filter(|_| self.suppressions.by_function()),
        }
    }

    /// `races` without the lock-order dependences on ignored variables and the races the
    /// suppressions silence (counted in `silenced`); `None` when neither can drop any.
    fn unsilenced(&mut self, races: &[Race]) -> Option<Vec<Race>> {
        if self.ignore.is_empty() && self.suppressions.is_empty() {
            return None;
        }
        let names = self.names();
        let silenced = |r: &Race| {
            !self.suppressions.is_empty() && {
                let (a, b) = (names.located(r, &r.first), names.located(r, &r.second));
                self.suppressions.suppresses(r, [&a, &b])
            }
        };
        let mut silenced_now = 0;
        let kept = races
            .iter()
            .filter(|r| !(r.class == RaceClass::LockOrder && self.ignore.contains(&r.variable)))
            .filter(|r| {
                let s = silenced(r);
                silenced_now += u64::from(s);
                !s
            })
            .cloned()
            .collect();
        self.silenced += silenced_now;
        Some(kept)
    }

    /// Prints one block per signature: the first interval pair of a signature not seen
    /// before, with a note of how many more interval pairs share it; later occurrences
    /// are only counted.
    fn print_blocks(
        &mut self,
        at: &Point,
        blocks: &BTreeMap<BlockKey, Vec<&Race>>,
        out: &mut dyn Write,
    ) -> io::Result<()> {
        // Built from the fields, not by `names()`: the loop below updates other fields
        // of `self` while it names.
        let names = Names {
            locks: &self.lock_names,
            syncs: &self.sync_points,
            hits: &self.hits,
            roots: &self.roots,
            functions: self
                .functions
                .as_ref()
                .filter(|_| self.suppressions.by_function()),
        };
        let mut text = String::new();
        let mut printed: BTreeMap<Signature, (usize, u64)> = BTreeMap::new();
        let mut order: Vec<(Signature, &Vec<&Race>)> = Vec::new();
        for rs in blocks.values() {
            let sig = signature(rs[0], &names);
            let n = rs.len() as u64;
            if let Some(&i) = self.by_signature.get(&sig) {
                let d = &mut self.distinct[i];
                d.races += n;
                if let Some(p) = printed.get_mut(&sig) {
                    p.0 += 1;
                    p.1 += n;
                } else {
                    self.suppressed_blocks += 1;
                    self.suppressed_races += n;
                }
                continue;
            }
            let r = rs[0];
            let side = |a: &crate::detect::Access| {
                format!(
                    "{} by rank {} ({})",
                    if a.write { "write" } else { "read" },
                    a.node,
                    names.sync_text(a.began_with)
                )
            };
            self.by_signature.insert(sig.clone(), self.distinct.len());
            self.distinct.push(Distinct {
                signature: sig.clone(),
                races: n,
                epoch: at.epoch(),
                element: element(r),
                sides: [side(&r.first), side(&r.second)],
                locations: [&r.first, &r.second].map(|a| {
                    names
                        .located(r, a)
                        .into_iter()
                        .map(|h| (h.file, h.line, h.column, h.function))
                        .collect()
                }),
            });
            printed.insert(sig.clone(), (0, 0));
            order.push((sig, rs));
        }
        for (sig, rs) in order {
            text.push_str(&block(at, rs, &names));
            let (pairs, races) = printed[&sig];
            if pairs > 0 {
                text.push_str(&format!(
                    "  the same race (same variable and sides) in {pairs} more interval pair{} of this epoch: {races} more race{} (see --race-log)\n",
                    if pairs == 1 { "" } else { "s" },
                    if races == 1 { "" } else { "s" },
                ));
                self.suppressed_blocks += pairs as u64;
                self.suppressed_races += races;
            }
        }
        out.write_all(text.as_bytes())?;
        out.flush()
    }

    /// `dsm: N data races on M variables`; in schedule mode `dsm: N data races, K lock-order
    /// dependences on M variables (schedule mode)`, M counting the variables of both.
    pub fn summary(&self) -> String {
        let races = self.race_summary();
        if !self.checking {
            return races;
        }
        let count = |k| self.check_totals.get(&k).copied().unwrap_or(0);
        let outside =
            count(FindingKind::ReadOutsideRegion) + count(FindingKind::WriteOutsideRegion);
        let uninit = count(FindingKind::UninitialisedRead);
        format!(
            "{races}; --check: {uninit} uninitialised read{}, {outside} access{} outside declared regions",
            if uninit == 1 { "" } else { "s" },
            if outside == 1 { "" } else { "es" },
        )
    }

    fn race_summary(&self) -> String {
        let silenced = match self.silenced {
            0 => String::new(),
            k => format!("; {k} more silenced by --race-suppressions (not counted)"),
        };
        format!("{}{silenced}", self.counted_summary())
    }

    fn counted_summary(&self) -> String {
        let n = self.total;
        if self.schedule {
            let k = self.lock_order_total;
            let m = self.variables.union(&self.lock_order_variables).count();
            return format!(
                "dsm: {n} data race{}, {k} lock-order dependence{} on {m} variable{} (schedule mode){}",
                if n == 1 { "" } else { "s" },
                if k == 1 { "" } else { "s" },
                if m == 1 { "" } else { "s" },
                if self.first_only {
                    " (first races only)"
                } else {
                    ""
                }
            );
        }
        let m = self.variables.len();
        format!(
            "dsm: {n} data race{} on {m} variable{}{}",
            if n == 1 { "" } else { "s" },
            if m == 1 { "" } else { "s" },
            if self.first_only {
                " (first races only)"
            } else {
                ""
            }
        )
    }

    /// The distinct races of the run, one line each with how often it occurred, when
    /// the printed report left some out (`None` otherwise: every block was printed).
    pub fn distinct_summary(&self) -> Option<String> {
        if self.suppressed_blocks == 0 {
            return None;
        }
        // Schedule mode reports lock-order dependences, which are not data races.
        let races = self
            .distinct
            .iter()
            .any(|d| d.signature.1 == RaceClass::DataRace);
        let orders = self
            .distinct
            .iter()
            .any(|d| d.signature.1 == RaceClass::LockOrder);
        let (one, many) = match (races, orders) {
            (false, true) => ("lock-order dependence", "lock-order dependences"),
            (true, true) => ("report", "reports"),
            _ => ("race", "races"),
        };
        let noun = |n: usize| if n == 1 { one } else { many };
        let mut s = format!(
            "dsm: {} distinct {} (by variable and the two sides); {} more report block{} ({} {}) repeated one already shown and were not printed (--race-log has every race):\n",
            self.distinct.len(),
            noun(self.distinct.len()),
            self.suppressed_blocks,
            if self.suppressed_blocks == 1 { "" } else { "s" },
            self.suppressed_races,
            noun(self.suppressed_races as usize),
        );
        for d in &self.distinct {
            s.push_str(&format!(
                "dsm:   {} ({}) on {}: {} vs {}: {} time{}, first {} in epoch {}\n",
                match d.signature.1 {
                    RaceClass::DataRace => "data race",
                    RaceClass::LockOrder => "lock-order dependence",
                },
                d.signature.2.as_str(),
                d.signature.0,
                d.signature.3[0],
                d.signature.3[1],
                d.races,
                if d.races == 1 { "" } else { "s" },
                d.element,
                d.epoch
            ));
        }
        s.pop();
        Some(s)
    }

    /// The distinct races as a SARIF 2.1.0 log (one result per distinct race).
    pub fn sarif(&self) -> serde_json::Value {
        let named: Vec<Distinct> = self
            .distinct
            .iter()
            .map(|d| {
                let mut d = d.clone();
                if let Some(namer) = &self.functions {
                    for (file, line, column, function) in d.locations.iter_mut().flatten() {
                        if function.is_none() {
                            *function = namer(&dsm_proto::SourceSite {
                                file: file.clone(),
                                line: *line,
                                column: *column,
                                code: None,
                            });
                        }
                    }
                }
                d
            })
            .collect();
        let results: Vec<serde_json::Value> = named
            .iter()
            .map(|d| {
                let SarifRule {
                    id: rule, level, ..
                } = match d.signature.1 {
                    RaceClass::DataRace => SARIF_RULES[0],
                    RaceClass::LockOrder => SARIF_RULES[1],
                };
                json!({
                    "ruleId": rule,
                    "level": level,
                    "message": {
                        "text": format!(
                            "{} ({}) on {}: {} vs {}; first on {} in epoch {}, {} occurrence{} in the run",
                            if d.signature.1 == RaceClass::DataRace { "Data race" } else { "Lock-order dependence" },
                            d.signature.2.as_str(),
                            d.signature.0,
                            d.sides[0],
                            d.sides[1],
                            d.element,
                            d.epoch,
                            d.races,
                            if d.races == 1 { "" } else { "s" },
                        )
                    },
                    "locations": [sarif_primary(d)],
                    "relatedLocations": sarif_related(d),
                    "partialFingerprints": {
                        "dsmRaceSignature/v1": format!(
                            "{}|{}|{}|{}|{}",
                            d.signature.0,
                            d.signature.1.as_str(),
                            d.signature.2.as_str(),
                            d.signature.3[0],
                            d.signature.3[1]
                        ),
                    },
                    "properties": {
                        "occurrences": d.races,
                        "epoch": d.epoch,
                        "sides": d.signature.3,
                    },
                })
            })
            .chain(self.distinct_findings.iter().map(finding_sarif))
            .collect();
        json!({
            "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
            "version": "2.1.0",
            "runs": [{
                "tool": {
                    "driver": {
                        "name": "dsm",
                        "version": env!("CARGO_PKG_VERSION"),
                        "rules": SARIF_RULES.iter().map(|r| json!({
                            "id": r.id,
                            "name": r.name,
                            "shortDescription": { "text": r.description },
                            "defaultConfiguration": { "level": r.level },
                        })).collect::<Vec<_>>(),
                    }
                },
                "results": results,
            }]
        })
    }

    /// Flushes the log and writes the SARIF file, if asked for.
    pub fn finish(&mut self) -> io::Result<()> {
        if let Some((log, path)) = self.log.as_mut() {
            log.flush().map_err(|e| log_write_error(path, e))?;
        }
        if let Some(path) = &self.sarif {
            let text = serde_json::to_string_pretty(&self.sarif())?;
            std::fs::write(path, text + "\n").map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot write the SARIF file {}: {e}", path.display()),
                )
            })?;
        }
        Ok(())
    }
}

/// A SARIF physical location (with the function as a logical location, where known).
fn sarif_physical(file: &str, line: u32, column: u32, function: Option<&str>) -> serde_json::Value {
    let mut loc = json!({
        "physicalLocation": {
            "artifactLocation": { "uri": file },
            "region": { "startLine": line, "startColumn": column },
        }
    });
    if let Some(f) = function {
        loc["logicalLocations"] = json!([{
            "fullyQualifiedName": f,
            "kind": "function",
        }]);
    }
    loc
}

/// A distinct race's SARIF location: the first side's source line (when known) and the
/// element as a logical location.
fn sarif_primary(d: &Distinct) -> serde_json::Value {
    let variable = json!({
        "name": d.element,
        "fullyQualifiedName": d.signature.0,
        "kind": "variable",
    });
    match d.locations[0].first() {
        Some((file, line, column, function)) => {
            let mut loc = sarif_physical(file, *line, *column, function.as_deref());
            let logical = loc["logicalLocations"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            loc["logicalLocations"] =
                json!(std::iter::once(variable).chain(logical).collect::<Vec<_>>());
            loc
        }
        None => json!({ "logicalLocations": [variable] }),
    }
}

/// A distinct race's SARIF related locations: the second side's source lines, then any
/// further lines of the first side, each saying which access it is.
fn sarif_related(d: &Distinct) -> Vec<serde_json::Value> {
    let first = d.locations[0].iter().skip(1).map(|l| (0, l));
    let second = d.locations[1].iter().map(|l| (1, l));
    first
        .chain(second)
        .enumerate()
        .map(|(id, (side, (file, line, column, function)))| {
            let mut loc = sarif_physical(file, *line, *column, function.as_deref());
            loc["id"] = json!(id + 1);
            loc["message"] = json!({ "text": format!("the {}", d.sides[side]) });
            loc
        })
        .collect()
}

/// A race's [`Signature`].
fn signature(r: &Race, names: &Names<'_>) -> Signature {
    let side = |a: &crate::detect::Access| {
        let located = names.located(r, a);
        if !located.is_empty() {
            let at: Vec<String> = located.iter().map(|h| h.location()).collect();
            return format!(
                "{} at {}",
                if a.write { "write" } else { "read" },
                at.join(" or ")
            );
        }
        let began = match a.began_with {
            SyncCause::Start => "from the start".to_string(),
            SyncCause::Barrier(_) => "after a barrier".to_string(),
            c => names.sync_text(c),
        };
        format!("{} ({began})", if a.write { "write" } else { "read" })
    };
    let mut sides = [side(&r.first), side(&r.second)];
    sides.sort();
    (r.variable.clone(), r.class, r.kind, sides)
}

fn element(r: &Race) -> String {
    match r.row_col {
        Some((row, col)) => format!("{}[{row}][{col}]", r.variable),
        None => format!("{}[{}]", r.variable, r.index),
    }
}

fn short_index(r: &Race) -> String {
    match r.row_col {
        Some((row, col)) => format!("[{row}][{col}]"),
        None => format!("[{}]", r.index),
    }
}

/// The program's names for locks and synchronization points, as far as rank 0 knows them.
/// A failed write to the race log at `path`, naming it.
fn log_write_error(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("cannot write race log {}: {e}", path.display()),
    )
}

/// Writes one JSON object per race to the race log.
fn write_log(
    log: &mut BufWriter<File>,
    at: &Point,
    races: &[Race],
    names: &Names<'_>,
) -> io::Result<()> {
    for r in races {
        serde_json::to_writer(&mut *log, &json_of(at, r, names))?;
        log.write_all(b"\n")?;
    }
    log.flush()
}

struct Names<'a> {
    locks: &'a std::collections::HashMap<u64, String>,
    syncs: &'a std::collections::HashMap<u32, String>,
    hits: &'a [crate::pinpoint::Hit],
    roots: &'a [std::path::PathBuf],
    functions: Option<&'a FunctionNamer>,
}

impl Names<'_> {
    /// The source locations of one side of a race: those pinpoint watched (with their
    /// functions), else the site recorded with the access, else none.
    fn located(&self, r: &Race, a: &crate::detect::Access) -> Vec<crate::pinpoint::Hit> {
        let mut out: Vec<crate::pinpoint::Hit> = self
            .hits
            .iter()
            .filter(|h| {
                // The hits are those of the epoch being reported (`Race::epoch` counts
                // the runtime's barriers, allocations included, so it is not compared).
                h.variable == r.variable
                    && h.index == r.index
                    && h.rank == a.node
                    && h.interval == a.interval
                    && h.write == a.write
            })
            .cloned()
            .collect();
        out.dedup_by(|x, y| x.location() == y.location());
        if out.is_empty() {
            let side = usize::from(*a != r.first);
            out.extend(r.sites[side].as_ref().map(|s| crate::pinpoint::Hit {
                variable: r.variable.clone(),
                index: r.index,
                epoch: r.epoch,
                rank: a.node,
                interval: a.interval,
                write: a.write,
                file: s.file.clone(),
                line: s.line,
                column: s.column,
                function: self.functions.and_then(|name| name(s)),
            }));
        }
        out
    }

    /// The lines a block prints under a side: each location, its function and its code.
    fn code_lines(&self, r: &Race, a: &crate::detect::Access) -> String {
        let mut s = String::new();
        for h in self.located(r, a) {
            s.push_str(&format!(
                "    at {}{}\n",
                h.location(),
                h.function
                    .as_deref()
                    .map(|f| format!(" in {f}"))
                    .unwrap_or_default()
            ));
            if let Some(code) = crate::pinpoint::source_line(&h.file, h.line, self.roots) {
                s.push_str(&format!("      | {code}\n"));
            }
        }
        s
    }

    fn sync_text(&self, cause: SyncCause) -> String {
        sync_text(cause, &|l| self.locks.get(&l).cloned(), &|e| {
            self.syncs.get(&e).cloned()
        })
    }

    /// The name of lock `l` as reports give it: the program's name, or its number.
    fn lock(&self, l: u64) -> String {
        match self.locks.get(&l) {
            Some(name) => name.clone(),
            None if l >= 1 << 63 => format!("#{:x}", l & !(1 << 63)),
            None => l.to_string(),
        }
    }

    /// The locks whose acquire or release began either side's interval: the locks whose
    /// order decided a lock-order dependence (sorted, without duplicates).
    fn locks_of(&self, r: &Race) -> Vec<String> {
        let mut ls: Vec<String> = [r.first.began_with, r.second.began_with]
            .into_iter()
            .filter_map(|c| match c {
                SyncCause::Acquire(l) | SyncCause::Release(l) => Some(self.lock(l)),
                _ => None,
            })
            .collect();
        ls.sort();
        ls.dedup();
        ls
    }
}

fn block(at: &Point, races: &[&Race], names: &Names<'_>) -> String {
    let r = races[0];
    let access = |w: bool| if w { "write" } else { "read" };
    let title = match r.class {
        RaceClass::DataRace => "DATA RACE",
        RaceClass::LockOrder => "LOCK-ORDER DEPENDENCE",
    };
    let mut s = format!(
        "==================\ndsm: {title} ({}) on {} {}\n  address {:#x}, bytes {}..{} of the element\n  {} by rank {} in interval {} ({})\n{}  {} by rank {} in interval {} ({})\n{}",
        r.kind.as_str(),
        element(r),
        at.describe(),
        r.addr,
        r.bytes.0,
        r.bytes.1,
        access(r.first.write),
        r.first.node,
        r.first.interval,
        names.sync_text(r.first.began_with),
        names.code_lines(r, &r.first),
        access(r.second.write),
        r.second.node,
        r.second.interval,
        names.sync_text(r.second.began_with),
        names.code_lines(r, &r.second),
    );
    if r.class == RaceClass::LockOrder {
        let locks = names.locks_of(r);
        s.push_str(&if locks.is_empty() {
            "  ordered only through a chain of lock transfers: the order depends on which node got the locks first\n".to_string()
        } else {
            format!(
                "  ordered by lock{} {}: the result may depend on which node got the lock first\n",
                if locks.len() == 1 { "" } else { "s" },
                locks
                    .iter()
                    .map(|l| if l.parse::<u64>().is_ok() || l.starts_with('#') {
                        l.clone()
                    } else {
                        format!("\"{l}\"")
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        });
    }
    if races.len() > 1 {
        let shown: Vec<String> = races
            .iter()
            .skip(1)
            .take(SHOWN_INDICES)
            .map(|r| short_index(r))
            .collect();
        let more = races.len() - 1 - shown.len();
        s.push_str(&format!(
            "  and {} more element{} of {} in the same interval pair: {}{}\n",
            races.len() - 1,
            if races.len() == 2 { "" } else { "s" },
            r.variable,
            shown.join(", "),
            if more > 0 { ", ..." } else { "" }
        ));
    }
    s
}

fn json_of(at: &Point, r: &Race, names: &Names<'_>) -> serde_json::Value {
    let side = |a: &crate::detect::Access| {
        let mut v = json!({
            "rank": a.node,
            "interval": a.interval,
            "access": if a.write { "write" } else { "read" },
            "sync": names.sync_text(a.began_with),
        });
        let located = names.located(r, a);
        if !located.is_empty() {
            v["locations"] = located
                .iter()
                .map(|h| {
                    json!({
                        "file": h.file,
                        "line": h.line,
                        "column": h.column,
                        "function": h.function,
                    })
                })
                .collect();
        }
        v
    };
    json!({
        "epoch": at.epoch(),
        "found_at": at.found_at(),
        "allocation": match at {
            Point::Allocation { name, .. } => Some(name.as_str()),
            _ => None,
        },
        "variable": r.variable,
        "index": r.index,
        "row": r.row_col.map(|x| x.0),
        "col": r.row_col.map(|x| x.1),
        "address": format!("{:#x}", r.addr),
        "bytes": [r.bytes.0, r.bytes.1],
        "kind": r.kind.as_str(),
        "class": r.class.as_str(),
        "locks": match r.class {
            RaceClass::LockOrder => names.locks_of(r),
            RaceClass::DataRace => Vec::new(),
        },
        "first": side(&r.first),
        "second": side(&r.second),
    })
}

/// An element of a finding's variable, as reports write it.
/// A SARIF rule: what a result's `ruleId` names.
#[derive(Clone, Copy)]
struct SarifRule {
    id: &'static str,
    name: &'static str,
    level: &'static str,
    description: &'static str,
}

/// The rules of dsm's SARIF results: data races, lock-order dependences, then the three
/// `--check` findings.
const SARIF_RULES: [SarifRule; 5] = [
    SarifRule {
        id: "dsm/data-race",
        name: "DataRace",
        level: "error",
        description:
            "Two concurrent accesses to one element of shared memory, at least one a write",
    },
    SarifRule {
        id: "dsm/lock-order-dependence",
        name: "LockOrderDependence",
        level: "warning",
        description:
            "Conflicting accesses ordered only by which node got a lock first (schedule mode)",
    },
    SarifRule {
        id: "dsm/uninitialised-read",
        name: "UninitialisedRead",
        level: "error",
        description: "A read of an element no node had written since its allocation (--check)",
    },
    SarifRule {
        id: "dsm/read-outside-region",
        name: "ReadOutsideRegion",
        level: "warning",
        description: "A read outside the rank's declared region (--check)",
    },
    SarifRule {
        id: "dsm/write-outside-region",
        name: "WriteOutsideRegion",
        level: "error",
        description: "A write outside the rank's declared region (--check)",
    },
];

/// One SARIF result for the `--check` findings of one kind on one variable.
fn finding_sarif(d: &DistinctFinding) -> serde_json::Value {
    let (
        SarifRule {
            id: rule, level, ..
        },
        what,
    ) = match d.kind {
        FindingKind::UninitialisedRead => (SARIF_RULES[2], "Uninitialised read"),
        FindingKind::ReadOutsideRegion => (SARIF_RULES[3], "Read outside the declared region"),
        FindingKind::WriteOutsideRegion => (SARIF_RULES[4], "Write outside the declared region"),
    };
    json!({
        "ruleId": rule,
        "level": level,
        "message": {
            "text": format!(
                "{what} on {}: {} element{} in the run, first {} by rank {} in epoch {}",
                d.variable,
                d.elements,
                if d.elements == 1 { "" } else { "s" },
                d.element,
                d.rank,
                d.epoch
            )
        },
        "locations": [{
            "logicalLocations": [{
                "name": d.element,
                "fullyQualifiedName": d.variable,
                "kind": "variable",
            }]
        }],
        "partialFingerprints": {
            "dsmCheck/v1": format!("{}|{}", d.kind.as_str(), d.variable),
        },
        "properties": {
            "occurrences": d.elements,
            "epoch": d.epoch,
        },
    })
}

fn finding_element(f: &Finding, index: usize) -> String {
    match f.cols {
        Some(c) if c > 0 => format!("{}[{}][{}]", f.variable, index / c, index % c),
        _ => format!("{}[{index}]", f.variable),
    }
}

fn finding_block(at: &Point, f: &Finding, names: &Names<'_>) -> String {
    let first = f.indices[0];
    let (title, what) = match f.kind {
        FindingKind::UninitialisedRead => ("UNINITIALISED READ", "read"),
        FindingKind::ReadOutsideRegion => ("READ OUTSIDE REGION", "read"),
        FindingKind::WriteOutsideRegion => ("WRITE OUTSIDE REGION", "write"),
    };
    let mut s = format!(
        "==================\ndsm: {title} of {} {}\n  {what} by rank {} in interval {} ({}){}\n",
        finding_element(f, first),
        at.describe(),
        f.node,
        f.interval,
        names.sync_text(f.began_with),
        match f.intervals {
            1 => String::new(),
            n => format!(
                " and {} later interval{} of rank {}",
                n - 1,
                if n == 2 { "" } else { "s" },
                f.node
            ),
        }
    );
    match (&f.region, f.kind) {
        (_, FindingKind::UninitialisedRead) => s.push_str(
            "  no node wrote the element since its allocation, and no write of this epoch happens before the read\n",
        ),
        (Some(r), _) if r.is_empty() => s.push_str(&format!(
            "  rank {} declared no region of {}\n",
            f.node, f.variable
        )),
        (Some(r), _) => s.push_str(&format!(
            "  rank {}'s declared region of {} is elements {}..{}\n",
            f.node, f.variable, r.start, r.end
        )),
        (None, _) => {}
    }
    if f.indices.len() > 1 {
        let shown: Vec<String> = f
            .indices
            .iter()
            .skip(1)
            .take(SHOWN_INDICES)
            .map(|&i| finding_element(f, i))
            .collect();
        let more = f.indices.len() - 1 - shown.len();
        s.push_str(&format!(
            "  and {} more element{}: {}{}\n",
            f.indices.len() - 1,
            if f.indices.len() == 2 { "" } else { "s" },
            shown.join(", "),
            if more > 0 { ", ..." } else { "" }
        ));
    }
    s
}

/// How many element indices a logged finding lists.
const LOGGED_INDICES: usize = 64;

fn finding_json(at: &Point, f: &Finding, names: &Names<'_>) -> serde_json::Value {
    json!({
        "check": f.kind.as_str(),
        "epoch": at.epoch(),
        "found_at": at.found_at(),
        "variable": f.variable,
        "count": f.indices.len(),
        "indices": f.indices.iter().take(LOGGED_INDICES).collect::<Vec<_>>(),
        "rank": f.node,
        "interval": f.interval,
        "intervals": f.intervals,
        "sync": names.sync_text(f.began_with),
        "region": f.region.as_ref().map(|r| [r.start, r.end]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::Access;

    fn race(index: usize, interval: u32) -> Race {
        Race {
            epoch: 2,
            variable: "bound".into(),
            index,
            row_col: None,
            addr: 0x1000 + index * 4,
            bytes: (0, 4),
            kind: RaceKind::ReadWrite,
            first: Access {
                node: 0,
                interval,
                write: false,
                began_with: SyncCause::Acquire(3),
            },
            second: Access {
                node: 2,
                interval: 9,
                write: true,
                began_with: SyncCause::Barrier(1),
            },
            class: RaceClass::DataRace,
            sites: Default::default(),
        }
    }

    #[test]
    fn blocks_collapse_and_log_has_every_race() {
        let dir = std::env::temp_dir().join(format!("dsm-race-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("races.jsonl");
        let mut rep = Reporter::new(Some(&path), false).unwrap();
        let races: Vec<Race> = (0..7).map(|i| race(i, 4)).chain([race(0, 5)]).collect();
        let mut out = Vec::new();
        assert_eq!(rep.report(&Point::Barrier(2), &races, &mut out).unwrap(), 8);
        rep.finish().unwrap();
        let text = String::from_utf8(out).unwrap();
        // The second interval pair is the same race (variable and sides): one block.
        assert_eq!(text.matches("DATA RACE").count(), 1, "{text}");
        assert!(text.contains("bound[0]"), "{text}");
        assert!(text.contains("and 6 more elements"), "{text}");
        assert!(
            text.contains("in 1 more interval pair of this epoch"),
            "{text}"
        );
        assert!(text.contains("after acquire of lock 3"), "{text}");
        assert!(text.contains("read by rank 0 in interval 4"), "{text}");
        let log = std::fs::read_to_string(&path).unwrap();
        assert_eq!(log.lines().count(), 8);
        let first: serde_json::Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
        assert_eq!(first["variable"], "bound");
        assert_eq!(first["kind"], "read-write");
        assert_eq!(first["second"]["rank"], 2);
        assert_eq!(rep.summary(), "dsm: 8 data races on 1 variable");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn schedule_mode_labels_counts_and_mutes_lock_order() {
        let mut rep = Reporter::new(None, false).unwrap();
        rep.set_schedule(["muted".to_string()]);
        rep.name_lock(3, "queue");
        let mut dep = race(0, 4);
        dep.class = RaceClass::LockOrder;
        dep.second.began_with = SyncCause::Release(5);
        let mut muted = dep.clone();
        muted.variable = "muted".into();
        let mut muted_race = race(1, 4);
        muted_race.variable = "muted".into();
        let mut out = Vec::new();
        let n = rep
            .report(
                &Point::Barrier(2),
                &[dep, muted, race(2, 4), muted_race],
                &mut out,
            )
            .unwrap();
        assert_eq!(n, 3);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("LOCK-ORDER DEPENDENCE (read-write) on bound[0]"),
            "{text}"
        );
        assert!(text.contains("ordered by locks 5, \"queue\""), "{text}");
        assert!(
            text.contains("DATA RACE (read-write) on bound[2]"),
            "{text}"
        );
        assert!(
            text.contains("DATA RACE (read-write) on muted[1]"),
            "{text}"
        );
        assert_eq!((rep.total(), rep.lock_order_total()), (2, 1));
        assert_eq!(
            rep.summary(),
            "dsm: 2 data races, 1 lock-order dependence on 2 variables (schedule mode)"
        );
    }

    #[test]
    fn the_same_race_is_printed_once_and_counted_and_sarif_lists_each_once() {
        let mut rep = Reporter::new(None, false).unwrap();
        rep.name_lock(3, "bound");
        let mut out = Vec::new();
        // Epoch 2: two interval pairs of one signature (read after acquire of lock 3 vs
        // write after a barrier), and a write-write race on another variable.
        let mut ww = race(0, 4);
        ww.variable = "queue".into();
        ww.kind = RaceKind::WriteWrite;
        ww.first.write = true;
        rep.report(
            &Point::Barrier(2),
            &[race(0, 4), race(1, 4), race(0, 6), ww],
            &mut out,
        )
        .unwrap();
        // Epoch 3: the first signature again, at other intervals and another barrier.
        let mut again = race(2, 8);
        again.second.began_with = SyncCause::Barrier(2);
        rep.report(&Point::Barrier(3), &[again], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("DATA RACE").count(), 2, "{text}");
        assert!(
            text.contains("the same race (same variable and sides) in 1 more interval pair of this epoch: 1 more race"),
            "{text}"
        );
        let summary = rep.distinct_summary().expect("blocks were left out");
        assert!(summary.starts_with("dsm: 2 distinct races"), "{summary}");
        assert!(
            summary.contains("2 more report blocks (2 races)"),
            "{summary}"
        );
        assert!(
            summary.contains("on bound: read (after acquire of lock \"bound\") vs write (after a barrier): 4 times, first bound[0] in epoch 2"),
            "{summary}"
        );
        assert_eq!(rep.summary(), "dsm: 5 data races on 2 variables");

        // SARIF 2.1.0: the shape CI systems read.
        let sarif = rep.sarif();
        assert_eq!(sarif["version"], "2.1.0");
        assert!(sarif["$schema"].as_str().unwrap().contains("sarif-2.1.0"));
        let run = &sarif["runs"][0];
        assert_eq!(run["tool"]["driver"]["name"], "dsm");
        let rules: Vec<&str> = run["tool"]["driver"]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap())
            .collect();
        let results = run["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        for r in results {
            assert!(rules.contains(&r["ruleId"].as_str().unwrap()), "{r}");
            assert!(["error", "warning", "note"].contains(&r["level"].as_str().unwrap()));
            assert!(!r["message"]["text"].as_str().unwrap().is_empty());
            let loc = &r["locations"][0]["logicalLocations"][0];
            assert!(loc["name"].is_string() && loc["kind"] == "variable", "{r}");
            assert!(r["partialFingerprints"].is_object());
        }
        assert_eq!(results[0]["properties"]["occurrences"], 4);
        // A run with nothing collapsed prints no distinct list.
        let mut quiet = Reporter::new(None, false).unwrap();
        quiet
            .report(&Point::Barrier(1), &[race(0, 1)], &mut Vec::new())
            .unwrap();
        assert!(quiet.distinct_summary().is_none());
    }

    #[test]
    fn first_only_stops_after_first_epoch() {
        let mut rep = Reporter::new(None, true).unwrap();
        let mut out = Vec::new();
        assert_eq!(rep.report(&Point::Barrier(1), &[], &mut out).unwrap(), 0);
        assert!(rep.wants_more());
        assert_eq!(
            rep.report(&Point::Barrier(2), &[race(1, 1)], &mut out)
                .unwrap(),
            1
        );
        assert!(!rep.wants_more());
        assert_eq!(
            rep.report(&Point::Barrier(3), &[race(1, 2)], &mut out)
                .unwrap(),
            0
        );
        assert_eq!(rep.total(), 1);
    }

    #[test]
    fn a_summary_of_lock_order_dependences_does_not_call_them_races() {
        let mut rep = Reporter::new(None, false).unwrap();
        let mut out = Vec::new();
        let order = |interval| {
            let mut r = race(0, interval);
            r.class = RaceClass::LockOrder;
            r
        };
        rep.report(&Point::Barrier(2), &[order(4)], &mut out)
            .unwrap();
        rep.report(&Point::Barrier(3), &[order(8)], &mut out)
            .unwrap();
        let summary = rep.distinct_summary().expect("a block was left out");
        assert!(
            summary.starts_with("dsm: 1 distinct lock-order dependence (by variable"),
            "{summary}"
        );
        assert!(
            summary.contains("1 more report block (1 lock-order dependence)"),
            "{summary}"
        );
    }
}
