//! Race reports: human-readable blocks on stderr (one block per variable and interval
//! pair, with a count and the first few elements, the way ThreadSanitizer collapses
//! reports by stack pair), one JSON object per race in the `--race-log` file (every race,
//! every field; the fields are documented in the README), and the end-of-run summary.
//!
//! Epochs are numbered the way the program counts its `barrier()` calls: epoch `k` runs
//! from barrier `k - 1` (or the start) to barrier `k`, and the epoch after the last barrier
//! is checked at finish. Collective allocations synchronize like barriers inside the
//! runtime but are not counted; a race found at one is reported within the epoch it
//! belongs to, naming the allocation.

use crate::check::{Finding, FindingKind};
use crate::detect::{sync_text, Race, RaceClass, RaceKind};
use dsm_proto::SyncCause;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

/// How many element indices a collapsed block lists.
const SHOWN_INDICES: usize = 4;

/// Prints and logs the races rank 0 finds, and counts them for the summary.
pub struct Reporter {
    log: Option<BufWriter<File>>,
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
}

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

fn after_barriers(after: u32) -> String {
    match after {
        0 => "before the first barrier".into(),
        n => format!("after barrier {n}"),
    }
}

impl Reporter {
    /// A reporter writing the JSON log to `log` (created now) if given; `first_only`
    /// reports only the first epoch with races (`--race-first`).
    pub fn new(log: Option<&Path>, first_only: bool) -> io::Result<Self> {
        let log = match log {
            Some(p) => Some(BufWriter::new(File::create(p).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot create race log {}: {e}", p.display()),
                )
            })?)),
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
        })
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
        };
        let mut text = String::new();
        for f in findings {
            text.push_str(&finding_block(at, f, &names));
        }
        out.write_all(text.as_bytes())?;
        out.flush()?;
        if let Some(log) = self.log.as_mut() {
            for f in findings {
                serde_json::to_writer(&mut *log, &finding_json(at, f, &names))?;
                log.write_all(b"\n")?;
            }
            log.flush()?;
        }
        let mut n = 0;
        for f in findings {
            *self.check_totals.entry(f.kind).or_default() += f.indices.len() as u64;
            n += f.indices.len() as u64;
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
        let races = if self.ignore.is_empty() {
            races
        } else {
            kept = races
                .iter()
                .filter(|r| !(r.class == RaceClass::LockOrder && self.ignore.contains(&r.variable)))
                .cloned()
                .collect();
            &kept[..]
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
        let names = Names {
            locks: &self.lock_names,
            syncs: &self.sync_points,
        };
        let mut text = String::new();
        for rs in blocks.values() {
            text.push_str(&block(at, rs, &names));
        }
        out.write_all(text.as_bytes())?;
        out.flush()?;
        if let Some(log) = self.log.as_mut() {
            for r in races {
                serde_json::to_writer(&mut *log, &json_of(at, r, &names))?;
                log.write_all(b"\n")?;
            }
            log.flush()?;
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

    /// Flushes the log.
    pub fn finish(&mut self) -> io::Result<()> {
        if let Some(log) = self.log.as_mut() {
            log.flush()?;
        }
        Ok(())
    }
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
struct Names<'a> {
    locks: &'a std::collections::HashMap<u64, String>,
    syncs: &'a std::collections::HashMap<u32, String>,
}

impl Names<'_> {
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
        "==================\ndsm: {title} ({}) on {} {}\n  address {:#x}, bytes {}..{} of the element\n  {} by rank {} in interval {} ({})\n  {} by rank {} in interval {} ({})\n",
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
        access(r.second.write),
        r.second.node,
        r.second.interval,
        names.sync_text(r.second.began_with),
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
        json!({
            "rank": a.node,
            "interval": a.interval,
            "access": if a.write { "write" } else { "read" },
            "sync": names.sync_text(a.began_with),
        })
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
        assert_eq!(text.matches("DATA RACE").count(), 2, "{text}");
        assert!(text.contains("bound[0]"), "{text}");
        assert!(text.contains("and 6 more elements"), "{text}");
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
}
