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

use crate::detect::{sync_text, Race, RaceKind};
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
}

/// Races collapse into one block per variable, interval pair and kind.
type BlockKey<'a> = (&'a str, (u16, u32), (u16, u32), RaceKind);

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
}

impl Point {
    /// The epoch the analysed accesses belong to: epoch `k` ends at barrier `k`.
    pub fn epoch(&self) -> u32 {
        match self {
            Point::Barrier(n) => *n,
            Point::Allocation { after, .. } | Point::Exit { after } => after + 1,
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
        }
    }

    /// What this synchronization is called in reports: `barrier 3`, `the allocation of
    /// 'grid'`, `finish`.
    pub fn sync_label(&self) -> String {
        match self {
            Point::Barrier(n) => format!("barrier {n}"),
            Point::Allocation { name, .. } => format!("the allocation of '{name}'"),
            Point::Exit { .. } => "finish".into(),
        }
    }

    fn found_at(&self) -> &'static str {
        match self {
            Point::Barrier(_) => "barrier",
            Point::Allocation { .. } => "allocation",
            Point::Exit { .. } => "exit",
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
        })
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

    /// Races reported so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Distinct variables with races so far.
    pub fn variables(&self) -> usize {
        self.variables.len()
    }

    /// Prints the epoch's races to `out` and logs them; returns how many there were.
    pub fn report(&mut self, at: &Point, races: &[Race], out: &mut dyn Write) -> io::Result<u64> {
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
        self.total += races.len() as u64;
        for r in races {
            self.variables.insert(r.variable.clone());
        }
        Ok(races.len() as u64)
    }

    /// `dsm: N data races on M variables`.
    pub fn summary(&self) -> String {
        let n = self.total;
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
    fn sync_text(&self, cause: dsm_proto::SyncCause) -> String {
        sync_text(cause, &|l| self.locks.get(&l).cloned(), &|e| {
            self.syncs.get(&e).cloned()
        })
    }
}

fn block(at: &Point, races: &[&Race], names: &Names<'_>) -> String {
    let r = races[0];
    let access = |w: bool| if w { "write" } else { "read" };
    let mut s = format!(
        "==================\ndsm: DATA RACE ({}) on {} {}\n  address {:#x}, bytes {}..{} of the element\n  {} by rank {} in interval {} ({})\n  {} by rank {} in interval {} ({})\n",
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
        "first": side(&r.first),
        "second": side(&r.second),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::Access;
    use dsm_proto::SyncCause;

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
