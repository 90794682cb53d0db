//! Parsers for what the driven programs print: the apps' `verified:` lines, dsm's race
//! summary, the per-rank `DSM_STATS_FILE` JSON, the C programs' timing lines, the verdicts
//! of ThreadSanitizer, Helgrind and DRD, and `dsm-bench`'s JSON. They are deliberately
//! lenient about wording (the apps are written by different people) and strict about
//! numbers: a figure is taken only when it is followed by its unit.

use crate::delay::RankWaits;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Timings from an app's `verified:` line.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AppTimes {
    pub parallel_s: f64,
    pub sequential_s: Option<f64>,
}

/// Strips dsmrun's `[r] ` prefix, returning the rank and the rest of the line.
pub fn strip_rank(line: &str) -> Option<(usize, &str)> {
    let rest = line.strip_prefix('[')?;
    let close = rest.find(']')?;
    let rank = rest[..close].parse().ok()?;
    Some((
        rank,
        rest[close + 1..]
            .strip_prefix(' ')
            .unwrap_or(&rest[close + 1..]),
    ))
}

/// Finds rank 0's `verified:` line (or an unprefixed one, for a run without dsmrun) and
/// reads `parallel <x> s` and `sequential... <x> s` from it.
pub fn parse_verified(stdout: &str) -> Result<AppTimes, String> {
    let line = stdout
        .lines()
        .find_map(|l| match strip_rank(l) {
            Some((0, rest)) if rest.starts_with("verified:") => Some(rest),
            None if l.starts_with("verified:") => Some(l),
            _ => None,
        })
        .ok_or_else(|| "no `verified:` line from rank 0".to_string())?;
    let parallel_s = seconds_after(line, "parallel")
        .ok_or_else(|| format!("no `parallel <float> s` in: {line}"))?;
    Ok(AppTimes {
        parallel_s,
        sequential_s: seconds_after(line, "sequential"),
    })
}

/// The first `<key>[suffix] <float> s` (or `ms`) in `line`, as seconds. The key must start
/// a word; a non-blank suffix such as `(Held-Karp)` or `:` may follow it, so that
/// `sequential(Held-Karp) 0.5 s` and `time: 0.5 s` are read, while `vs sequential (3-D)`
/// is skipped because no number follows.
pub fn seconds_after(line: &str, key: &str) -> Option<f64> {
    let mut from = 0;
    while let Some(pos) = line[from..].find(key) {
        let start = from + pos;
        from = start + key.len();
        let prev = line[..start].chars().next_back();
        let word_start = !matches!(prev, Some(c) if c.is_alphanumeric() || c == '_');
        if !word_start {
            continue;
        }
        let rest = &line[from..];
        // Skip the key's attached suffix, then expect "<number> <unit>".
        let rest = rest.trim_start_matches(|c: char| !c.is_whitespace());
        let mut words = rest.split_whitespace();
        let (Some(num), Some(unit)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(x) = num.trim_start_matches('=').parse::<f64>() else {
            continue;
        };
        let unit = unit.trim_end_matches([',', ';', ')', '.']);
        match unit {
            "s" | "sec" | "secs" | "seconds" => return Some(x),
            "ms" => return Some(x / 1e3),
            _ => continue,
        }
    }
    None
}

/// dsm's end-of-job summary on stderr: `dsm: N data races on M variables`.
pub fn parse_race_summary(stderr: &str) -> Option<(u64, u64)> {
    stderr.lines().rev().find_map(|l| {
        let l = strip_rank(l).map_or(l, |(_, rest)| rest);
        let rest = l.trim().strip_prefix("dsm: ")?;
        let mut w = rest.split_whitespace();
        let races: u64 = w.next()?.parse().ok()?;
        if w.next()? != "data" || !w.next()?.starts_with("race") || w.next()? != "on" {
            return None;
        }
        let vars: u64 = w.next()?.parse().ok()?;
        Some((races, vars))
    })
}

/// The detector's analysis counters (rank 0 only), as in the paper's Table 3: the
/// runtime's own type, so the two cannot drift apart.
pub use dsm_proto::PlanStats as Analysis;

/// A job's `DSM_STATS_FILE` summaries, combined over its ranks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobStats {
    pub ranks: usize,
    /// Size of the shared allocations (rank 0's view; every rank allocates the same).
    pub shared_bytes: u64,
    /// Named allocations; each is a collective call that includes a barrier.
    pub allocations: u64,
    /// Barriers rank 0 passed (every rank passes the same ones).
    pub barriers: u64,
    pub intervals_closed: u64,
    pub lock_acquires: u64,
    pub pages_fetched: u64,
    pub messages_sent: u64,
    pub bytes_sent: u64,
    pub race_notice_bytes: u64,
    pub analysis: Option<Analysis>,
    pub interval_comparison_ms: Option<f64>,
    pub bitmap_round_ms: Option<f64>,
    pub peak_store_bytes: Option<u64>,
    pub races_reported: Option<u64>,
    /// Per-rank peak resident set in KiB, if the runtime writes it (`peak_rss_kib`, from VmHWM).
    pub rank_peak_rss_kb: Vec<u64>,
    /// Per rank, in rank order, what it waited for (the round-trip model's input); empty
    /// when the stats files predate the delay counters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_waits: Vec<RankWaits>,
}

/// A rank's waits from its stats file, or `None` when the file lacks a delay counter.
fn rank_waits(v: &Value) -> Option<RankWaits> {
    let p = |k: &str| u(v, &["protocol", k]);
    Some(RankWaits {
        rank: u(v, &["rank"])? as usize,
        fetch_requests: p("fetch_requests")?,
        remote_acquires: p("lock_acquires")?.saturating_sub(p("lock_acquires_local")?),
        lock_delays: p("lock_acquire_delays")?,
        sem_waits: p("sem_waits")?,
        sem_delays: p("sem_wait_delays")?,
        barriers: p("barriers")?,
        barrier_delays: p("barrier_delays")?,
    })
}

fn u(v: &Value, path: &[&str]) -> Option<u64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_u64()
}

fn f(v: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_f64()
}

/// Combines the ranks' summaries: traffic and interval counts are summed over ranks, the
/// analysis counters and barrier count are rank 0's (only the master analyses).
pub fn combine_stats(files: &[Value]) -> Result<JobStats, String> {
    if files.is_empty() {
        return Err("no stats files were written".into());
    }
    let rank0 = files
        .iter()
        .find(|v| u(v, &["rank"]) == Some(0))
        .unwrap_or(&files[0]);
    let sum = |path: &[&str]| files.iter().filter_map(|v| u(v, path)).sum::<u64>();
    let analysis = rank0
        .get("race")
        .and_then(|r| r.get("analysis"))
        .filter(|a| a.is_object())
        .and_then(|a| serde_json::from_value::<Analysis>(a.clone()).ok());
    let race_present = rank0.get("race").is_some_and(|r| r.is_object());
    let mut rank_peak_rss_kb: Vec<(u64, u64)> = files
        .iter()
        .filter_map(|v| Some((u(v, &["rank"]).unwrap_or(0), u(v, &["peak_rss_kib"])?)))
        .collect();
    rank_peak_rss_kb.sort();
    let mut waits: Vec<RankWaits> = files.iter().filter_map(rank_waits).collect();
    waits.sort_by_key(|w| w.rank);
    if waits.len() != files.len() {
        waits.clear();
    }
    Ok(JobStats {
        ranks: files.len(),
        shared_bytes: u(rank0, &["shared_bytes"]).unwrap_or(0),
        allocations: rank0
            .get("allocations")
            .and_then(Value::as_array)
            .map_or(0, |a| a.len() as u64),
        barriers: u(rank0, &["protocol", "barriers"]).unwrap_or(0),
        intervals_closed: sum(&["protocol", "intervals_closed"]),
        lock_acquires: sum(&["protocol", "lock_acquires"]),
        pages_fetched: sum(&["protocol", "pages_fetched"]),
        messages_sent: sum(&["protocol", "messages_sent"]),
        bytes_sent: sum(&["protocol", "bytes_sent"]),
        race_notice_bytes: sum(&["protocol", "race_notice_bytes"]),
        analysis,
        interval_comparison_ms: f(rank0, &["race", "interval_comparison_ms"]),
        bitmap_round_ms: f(rank0, &["race", "bitmap_round_ms"]),
        peak_store_bytes: race_present.then(|| {
            files
                .iter()
                .filter_map(|v| u(v, &["race", "peak_store_bytes"]))
                .max()
                .unwrap_or(0)
        }),
        races_reported: u(rank0, &["race", "races_reported"]),
        rank_peak_rss_kb: rank_peak_rss_kb.into_iter().map(|(_, kb)| kb).collect(),
        rank_waits: waits,
    })
}

/// An app's `--threads N` line (`threads: ...; threads <x> s, sequential <y> s, ...`):
/// the threaded kernel's time and the sequential one, both timed in that process.
pub fn parse_threads(stdout: &str) -> Result<AppTimes, String> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("threads:"))
        .ok_or_else(|| "no `threads:` line".to_string())?;
    let parallel_s = seconds_after(line, "threads")
        .ok_or_else(|| format!("no `threads <float> s` in: {line}"))?;
    Ok(AppTimes {
        parallel_s,
        sequential_s: seconds_after(line, "sequential"),
    })
}

/// The C programs' timing: `... time <x> s`.
pub fn parse_c_time(stdout: &str) -> Option<f64> {
    stdout.lines().find_map(|l| seconds_after(l, "time"))
}

/// A thread-level race detector run against a C program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    /// No detector: the baseline.
    Plain,
    /// gcc -fsanitize=thread.
    Tsan,
    /// valgrind --tool=helgrind.
    Helgrind,
    /// valgrind --tool=drd.
    Drd,
}

impl Tool {
    pub fn label(self) -> &'static str {
        match self {
            Tool::Plain => "plain (no detector)",
            Tool::Tsan => "ThreadSanitizer",
            Tool::Helgrind => "Helgrind",
            Tool::Drd => "DRD",
        }
    }

    /// Exit code this suite asks the tool to use when it reports an error (TSan's default).
    pub const RACE_EXIT: i32 = 66;
}

/// Whether a detector's output reports a data race. Exit codes alone are not enough:
/// valgrind's `--error-exitcode` also fires for errors that are not races (lock order,
/// API misuse), so the verdict is the race report itself.
pub fn tool_found_race(tool: Tool, output: &str) -> bool {
    match tool {
        Tool::Plain => false,
        Tool::Tsan => output.contains("WARNING: ThreadSanitizer: data race"),
        Tool::Helgrind => output.contains("Possible data race"),
        Tool::Drd => output.contains("Conflicting load") || output.contains("Conflicting store"),
    }
}

/// Median figures of `dsm-bench`'s JSON, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchFigures {
    pub rtt_us: Option<f64>,
    pub remote_fault_us: Option<f64>,
    pub write_fault_us: Option<f64>,
    pub lock_acquire_us: Option<f64>,
    pub lock_handoff_us: Option<f64>,
    /// A lock hand-off carrying one page of changes, turns passed outside the DSM (no
    /// polling through the lock): the hand-off latency.
    #[serde(default)]
    pub lock_handoff_page_us: Option<f64>,
    /// Barrier time per node count ("2", "4", "8").
    pub barrier_us: std::collections::BTreeMap<String, f64>,
}

/// A figure is a bare number or an object with a `median` (or only a `mean`, as the lock
/// hand-off, which is timed as a whole and not per sample).
fn median_of(v: Option<&Value>) -> Option<f64> {
    let v = v?;
    v.as_f64()
        .or_else(|| v.get("median")?.as_f64())
        .or_else(|| v.get("mean")?.as_f64())
}

pub fn parse_bench(v: &Value) -> Result<BenchFigures, String> {
    if !v.is_object() {
        return Err("dsm-bench output is not a JSON object".into());
    }
    let barrier_us = v
        .get("barrier_us")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, x)| Some((k.clone(), median_of(Some(x))?)))
                .collect()
        })
        .unwrap_or_default();
    let b = BenchFigures {
        rtt_us: median_of(v.get("rtt_us")),
        remote_fault_us: median_of(v.get("remote_fault_us")),
        write_fault_us: median_of(v.get("write_fault_us")),
        lock_acquire_us: median_of(v.get("lock_acquire_us")),
        lock_handoff_us: median_of(v.get("lock_handoff_us")),
        lock_handoff_page_us: median_of(v.get("lock_handoff_page_us")),
        barrier_us,
    };
    if b.rtt_us.is_none() {
        return Err("dsm-bench output has no rtt_us".into());
    }
    Ok(b)
}

/// The last `n` lines of `text`, for failure reports.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn threads_line() {
        let t = parse_threads(
            "threads: sor 2048x2048, 50 iterations, 2 threads: bitwise identical to sequential (checksum 12.5); threads 0.1250 s, sequential 0.2400 s, speedup 1.92x\n",
        )
        .unwrap();
        assert_eq!(t.parallel_s, 0.125);
        assert_eq!(t.sequential_s, Some(0.24));
        let t = parse_threads(
            "threads: fft 3-D 128x128x64, 2 threads: bitwise identical to sequential (checksum 00ff); threads 12 ms, sequential 0.0200 s, speedup 1.67x",
        )
        .unwrap();
        assert_eq!(t.parallel_s, 0.012);
        assert!(parse_threads("verified: sor ... parallel 0.1 s").is_err());
        assert!(parse_threads("threads: sor 2 threads: wrong").is_err());
    }

    #[test]
    fn sor_verified_line() {
        let out = "[0] verified: sor 512x512, 100 iterations, 2 nodes: bitwise identical to sequential (checksum 1.5); parallel 0.1234 s, sequential 0.4567 s, speedup 3.70x\n";
        let t = parse_verified(out).unwrap();
        assert_eq!(t.parallel_s, 0.1234);
        assert_eq!(t.sequential_s, Some(0.4567));
    }

    #[test]
    fn fft_line_skips_words_before_the_time() {
        let out = "[1] noise\n[0] verified: fft 64x64x16, 2 nodes: max rel err 1.2e-15 vs sequential (3-D), round trip 1e-16; checksum 00ff, round-trip checksum 00ee; parallel 0.0500 s, sequential 0.0900 s, speedup 1.80x";
        let t = parse_verified(out).unwrap();
        assert_eq!(t.parallel_s, 0.05);
        assert_eq!(t.sequential_s, Some(0.09));
    }

    #[test]
    fn tsp_line_with_suffixed_sequential() {
        let out = "[0] verified: tsp 19 cities, optimal length 1234 (Held-Karp agrees), tour 0-1-2, 2 nodes, racy bound, parallel 1.250 s, sequential(Held-Karp) 3.500 s";
        let t = parse_verified(out).unwrap();
        assert_eq!(t.parallel_s, 1.25);
        assert_eq!(t.sequential_s, Some(3.5));
    }

    #[test]
    fn water_line_and_ms_units() {
        let out = "[0] verified: water 216 molecules: energies match sequential (max rel diff 1e-12), energy drift 1e-5 (bound 1e-3), parallel 250 ms, sequential 0.9 s";
        let t = parse_verified(out).unwrap();
        assert!((t.parallel_s - 0.25).abs() < 1e-12);
        assert_eq!(t.sequential_s, Some(0.9));
    }

    #[test]
    fn verified_must_come_from_rank_0() {
        assert!(parse_verified("[1] verified: x parallel 1 s").is_err());
        assert!(parse_verified("[0] done: sor parallel 1.0 s (not verified)").is_err());
        assert!(parse_verified("[0] verified: sor but no timing").is_err());
        // A run without dsmrun prints no prefix.
        assert_eq!(
            parse_verified("verified: sor; parallel 2 s").unwrap(),
            AppTimes {
                parallel_s: 2.0,
                sequential_s: None
            }
        );
    }

    #[test]
    fn seconds_after_needs_word_start_and_unit() {
        assert_eq!(seconds_after("nonparallel 1 s", "parallel"), None);
        assert_eq!(
            seconds_after("parallel 1 x, parallel 2 s", "parallel"),
            Some(2.0)
        );
        assert_eq!(seconds_after("time: 0.5 s", "time"), Some(0.5));
        assert_eq!(seconds_after("parallel 3.5 s.", "parallel"), Some(3.5));
        assert_eq!(seconds_after("parallel", "parallel"), None);
    }

    #[test]
    fn race_summary() {
        let err = "[0] race: ...\n[0] dsm: 12 data races on 1 variables\n";
        assert_eq!(parse_race_summary(err), Some((12, 1)));
        assert_eq!(
            parse_race_summary("dsm: 1 data race on 1 variable"),
            Some((1, 1))
        );
        assert_eq!(
            parse_race_summary("dsm: 0 data races on 0 variables"),
            Some((0, 0))
        );
        assert_eq!(parse_race_summary("dsm: rank 1 failed"), None);
    }

    #[test]
    fn stats_are_combined_over_ranks() {
        let r0 = json!({"rank": 0, "size": 2, "shared_bytes": 8192, "allocations": ["grid"],
            "protocol": {"barriers": 5, "intervals_closed": 10, "lock_acquires": 1, "pages_fetched": 3,
                          "messages_sent": 7, "bytes_sent": 1000, "race_notice_bytes": 50},
            "race": {"analysis": {"intervals": 20, "pairs_considered": 4, "concurrent_pairs": 3,
                     "overlapping_pairs": 2, "intervals_in_overlap": 5, "bitmaps_wanted": 1, "bitmaps_total": 40},
                     "interval_comparison_ms": 0.5, "bitmap_round_ms": 1.5, "peak_store_bytes": 64, "races_reported": 0},
            "peak_rss_kib": 3000});
        let r1 = json!({"rank": 1, "size": 2, "shared_bytes": 8192, "allocations": ["grid"],
            "protocol": {"barriers": 5, "intervals_closed": 12, "lock_acquires": 2, "pages_fetched": 4,
                          "messages_sent": 9, "bytes_sent": 3000, "race_notice_bytes": 150},
            "race": {"analysis": null, "peak_store_bytes": 128},
            "peak_rss_kib": 2000});
        let s = combine_stats(&[r1, r0]).unwrap();
        assert_eq!(s.ranks, 2);
        assert_eq!(s.shared_bytes, 8192);
        assert_eq!(s.allocations, 1);
        assert_eq!(s.barriers, 5);
        assert_eq!(s.intervals_closed, 22);
        assert_eq!(s.lock_acquires, 3);
        assert_eq!(s.bytes_sent, 4000);
        assert_eq!(s.race_notice_bytes, 200);
        assert_eq!(s.analysis.as_ref().unwrap().intervals_in_overlap, 5);
        assert_eq!(s.interval_comparison_ms, Some(0.5));
        assert_eq!(s.peak_store_bytes, Some(128));
        assert_eq!(s.races_reported, Some(0));
        assert_eq!(s.rank_peak_rss_kb, vec![3000, 2000]);
        // Older files without the delay counters give no waits rather than zeros.
        assert!(s.rank_waits.is_empty());
    }

    #[test]
    fn each_ranks_waits_are_read_in_rank_order() {
        let file = |rank: u64, fetches: u64, local: u64| {
            json!({"rank": rank, "protocol": {"fetch_requests": fetches, "lock_acquires": 10,
                "lock_acquires_local": local, "lock_acquire_delays": 2 * (10 - local) + 1,
                "sem_waits": 0, "sem_wait_delays": 0, "barriers": 4, "barrier_delays": 4}})
        };
        let s = combine_stats(&[file(1, 7, 6), file(0, 3, 10)]).unwrap();
        let w = &s.rank_waits;
        assert_eq!((w[0].rank, w[1].rank), (0, 1));
        assert_eq!(
            (w[1].fetch_requests, w[1].remote_acquires, w[1].lock_delays),
            (7, 4, 9)
        );
        assert_eq!(w[0].remote_acquires, 0);
        // Rank 1: 2 x 7 + 9 + 4 = 27 delays.
        assert_eq!(w[1].delays(), 27);
        // A job where one rank's file lacks them has none.
        let mut old = file(1, 7, 6);
        old["protocol"]
            .as_object_mut()
            .unwrap()
            .remove("barrier_delays");
        assert!(combine_stats(&[old, file(0, 3, 10)])
            .unwrap()
            .rank_waits
            .is_empty());
    }

    #[test]
    fn stats_without_race_block() {
        let r0 =
            json!({"rank": 0, "shared_bytes": 4096, "protocol": {"barriers": 2}, "race": null});
        let s = combine_stats(&[r0]).unwrap();
        assert_eq!(s.analysis, None);
        assert_eq!(s.peak_store_bytes, None);
        assert!(combine_stats(&[]).is_err());
    }

    #[test]
    fn c_time_and_tool_verdicts() {
        let out = "sor 64x64, 10 iterations, 2 threads: checksum 1.0; time 0.001234 s\n";
        assert_eq!(parse_c_time(out), Some(0.001234));
        assert!(tool_found_race(
            Tool::Tsan,
            "==================\nWARNING: ThreadSanitizer: data race (pid=1)\n"
        ));
        assert!(!tool_found_race(
            Tool::Tsan,
            "ThreadSanitizer: reported 0 warnings"
        ));
        assert!(tool_found_race(
            Tool::Helgrind,
            "==1== Possible data race during read of size 8"
        ));
        assert!(tool_found_race(
            Tool::Drd,
            "==1== Conflicting store by thread 2 at 0x1"
        ));
        assert!(!tool_found_race(Tool::Drd, "==1== ERROR SUMMARY: 0 errors"));
        assert!(!tool_found_race(Tool::Plain, "Possible data race"));
    }

    #[test]
    fn bench_json() {
        let v = json!({"rtt_us": {"median": 20.0, "mean": 21.0}, "remote_fault_us": {"median": 45.5},
            "write_fault_us": {"median": 3.0}, "lock_acquire_us": {"median": 30.0},
            "lock_handoff_us": 60.0, "barrier_us": {"2": {"median": 40.0}, "8": {"median": 400.0}}});
        let b = parse_bench(&v).unwrap();
        assert_eq!(b.rtt_us, Some(20.0));
        assert_eq!(b.remote_fault_us, Some(45.5));
        assert_eq!(b.lock_handoff_us, Some(60.0));
        assert_eq!(b.barrier_us.get("8"), Some(&400.0));
        assert!(parse_bench(&json!({"x": 1})).is_err());
        assert!(parse_bench(&json!([1])).is_err());
    }

    #[test]
    fn tails_and_prefixes() {
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        assert_eq!(strip_rank("[12] hello"), Some((12, "hello")));
        assert_eq!(strip_rank("hello"), None);
    }
}
