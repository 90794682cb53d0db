//! Race reports: human-readable blocks on stderr (one block per variable and interval
//! pair, with a count and the first few elements, the way ThreadSanitizer collapses
//! reports by stack pair), one JSON object per race in the `--race-log` file (every race,
//! every field), and the end-of-run summary.

use crate::detect::{sync_text, Race, RaceKind};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

/// How many element indices a collapsed block lists.
const SHOWN_INDICES: usize = 4;

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
}

/// Races collapse into one block per variable, interval pair and kind.
type BlockKey<'a> = (&'a str, (u16, u32), (u16, u32), RaceKind);

/// Where in the run an analysis happened, for the report header.
#[derive(Clone, Copy, Debug)]
pub enum Point {
    Barrier(u32),
    Exit(u32),
}

impl Reporter {
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
        })
    }

    /// Remembers the name of a named lock for reports.
    pub fn name_lock(&mut self, id: u64, name: &str) {
        self.lock_names.insert(id, name.to_string());
    }

    pub fn first_only(&self) -> bool {
        self.first_only
    }

    /// Whether races of this epoch should still be reported (`--race-first` stops after
    /// the first epoch with races).
    pub fn wants_more(&self) -> bool {
        !(self.first_only && self.first_epoch_done)
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn variables(&self) -> usize {
        self.variables.len()
    }

    /// Prints the epoch's races to `out` and logs them; returns how many there were.
    pub fn report(&mut self, at: Point, races: &[Race], out: &mut dyn Write) -> io::Result<u64> {
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
        let names = |l: u64| self.lock_names.get(&l).cloned();
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

fn at_text(at: Point) -> String {
    match at {
        Point::Barrier(e) => format!("in the epoch ending at barrier {e}"),
        Point::Exit(e) => format!("after the last barrier (epoch {e}, checked at exit)"),
    }
}

fn block(at: Point, races: &[&Race], names: &dyn Fn(u64) -> Option<String>) -> String {
    let r = races[0];
    let access = |w: bool| if w { "write" } else { "read" };
    let mut s = format!(
        "==================\ndsm: DATA RACE ({}) on {} {}\n  address {:#x}, bytes {}..{} of the element\n  {} by rank {} in interval {} ({})\n  {} by rank {} in interval {} ({})\n",
        r.kind.as_str(),
        element(r),
        at_text(at),
        r.addr,
        r.bytes.0,
        r.bytes.1,
        access(r.first.write),
        r.first.node,
        r.first.interval,
        sync_text(r.first.began_with, names),
        access(r.second.write),
        r.second.node,
        r.second.interval,
        sync_text(r.second.began_with, names),
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

fn json_of(at: Point, r: &Race, names: &dyn Fn(u64) -> Option<String>) -> serde_json::Value {
    let side = |a: &crate::detect::Access| {
        json!({
            "rank": a.node,
            "interval": a.interval,
            "access": if a.write { "write" } else { "read" },
            "sync": sync_text(a.began_with, names),
        })
    };
    let (at_kind, epoch) = match at {
        Point::Barrier(e) => ("barrier", e),
        Point::Exit(e) => ("exit", e),
    };
    json!({
        "epoch": epoch,
        "found_at": at_kind,
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
        assert_eq!(rep.report(Point::Barrier(2), &races, &mut out).unwrap(), 8);
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
        assert_eq!(rep.report(Point::Barrier(1), &[], &mut out).unwrap(), 0);
        assert!(rep.wants_more());
        assert_eq!(
            rep.report(Point::Barrier(2), &[race(1, 1)], &mut out)
                .unwrap(),
            1
        );
        assert!(!rep.wants_more());
        assert_eq!(
            rep.report(Point::Barrier(3), &[race(1, 2)], &mut out)
                .unwrap(),
            0
        );
        assert_eq!(rep.total(), 1);
    }
}
