//! From runs to the report: groups the run records by table, takes medians and spreads,
//! derives the paper's metrics (Tables 1 and 3, Figure 3), the comparison with other
//! detectors, the speedups and the three targets. Pure: no process is started here, so it
//! is tested on made-up runs.

use crate::model::*;
use crate::parse::{parse_bench, BenchFigures, Tool};
use crate::stats::{geomean, median, paired_ratios, summary};
use std::collections::BTreeMap;

/// What the analysis needs besides the runs.
#[derive(Clone, Debug, Default)]
pub struct Context {
    pub settings: Settings,
    pub machine: Machine,
    /// App name -> why it was not run (missing binary...).
    pub missing_apps: BTreeMap<String, String>,
    /// App names in table order.
    pub apps: Vec<String>,
    /// The kernels with whether each has a race.
    pub kernels: Vec<(String, bool)>,
    /// Tool -> why it was not run.
    pub missing_tools: BTreeMap<Tool, String>,
    /// Runner of the C row -> why it was not run (its program could not be built).
    pub missing_c: BTreeMap<CRunner, String>,
}

fn app_runs<'a>(
    runs: &'a [RunRecord],
    app: &'a str,
    nodes: usize,
    variant: Variant,
) -> impl Iterator<Item = (usize, &'a Outcome)> + 'a {
    runs.iter().filter_map(move |r| match &r.job {
        Job::App {
            app: a,
            nodes: n,
            variant: v,
            rep,
            purpose,
            ..
        } if a == app
            && *n == nodes
            && *v == variant
            && matches!(purpose, Purpose::Table | Purpose::Speedup) =>
        {
            Some((*rep, &r.outcome))
        }
        _ => None,
    })
}

/// Parallel times of the successful runs, indexed by repetition (NaN for failed ones, so
/// that pairs stay aligned).
fn times_by_rep(runs: &[RunRecord], app: &str, nodes: usize, variant: Variant) -> Vec<f64> {
    let mut v: Vec<(usize, f64)> = app_runs(runs, app, nodes, variant)
        .map(|(rep, o)| (rep, o.parallel_s.filter(|_| o.ok).unwrap_or(f64::NAN)))
        .collect();
    v.sort_by_key(|(rep, _)| *rep);
    v.into_iter().map(|(_, t)| t).collect()
}

fn pct(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| 100.0 * num as f64 / den as f64)
}

fn status_of(total: usize, failed: usize) -> String {
    match (total, failed) {
        (0, _) => "not run".into(),
        (t, f) if f == t => "failed".into(),
        (_, 0) => "ok".into(),
        (t, f) => format!("ok ({f} of {t} runs failed)"),
    }
}

pub fn app_rows(ctx: &Context, runs: &[RunRecord]) -> Vec<AppRow> {
    let s = &ctx.settings;
    let mut nodes: Vec<usize> = s
        .table_nodes
        .iter()
        .chain(&s.skipped_nodes)
        .copied()
        .collect();
    nodes.sort_unstable();
    let mut rows = Vec::new();
    for app in &ctx.apps {
        for &n in &nodes {
            let mut row = AppRow {
                app: app.clone(),
                nodes: n,
                oversubscribed: n > ctx.machine.cores,
                input: s.inputs.get(app).cloned().unwrap_or_default(),
                ..AppRow::default()
            };
            if let Some(why) = ctx.missing_apps.get(app) {
                row.status = format!("not run: {why}");
                rows.push(row);
                continue;
            }
            if s.skipped_nodes.contains(&n) {
                row.status = format!(
                    "not run: N = {n} is skipped in --{} on this machine",
                    s.mode
                );
                rows.push(row);
                continue;
            }
            let off = times_by_rep(runs, app, n, Variant::Off);
            let on = times_by_rep(runs, app, n, Variant::On);
            let total = off.len() + on.len();
            let failed = off.iter().chain(&on).filter(|t| t.is_nan()).count();
            row.status = status_of(total, failed);
            row.off = summary(&off);
            row.on = summary(&on);
            row.ratio = summary(&paired_ratios(&off, &on));
            row.race_off_s = row.off.map(|x| x.median);
            row.race_on_s = row.on.map(|x| x.median);
            row.race_ratio = row.ratio.map(|x| x.median);
            // Structure from a race-off run: the protocol as the app uses it.
            if let Some(st) = app_runs(runs, app, n, Variant::Off)
                .find_map(|(_, o)| o.stats.as_ref().filter(|_| o.ok))
            {
                row.shared_bytes = Some(st.shared_bytes);
                row.barriers = Some(st.barriers);
                row.lock_acquires = Some(st.lock_acquires);
                // Every allocation and the final `finish` are barriers too; only the
                // ones the app asks for make it a barrier program.
                let own_barriers = st.barriers.saturating_sub(st.allocations + 1);
                if own_barriers > 0 {
                    row.sync.push("barrier".into());
                }
                if st.lock_acquires > 0 {
                    row.sync.push("lock".into());
                }
                if st.barriers > 0 && st.ranks > 0 {
                    row.intervals_per_barrier =
                        Some(st.intervals_closed as f64 / st.barriers as f64 / st.ranks as f64);
                }
            }
            let races: Vec<f64> = app_runs(runs, app, n, Variant::On)
                .filter(|(_, o)| o.ok)
                .filter_map(|(_, o)| o.races.map(|r| r as f64))
                .collect();
            row.races = median(&races).map(|m| m.round() as u64);
            rows.push(row);
        }
    }
    rows
}

pub fn dynamic_rows(ctx: &Context, runs: &[RunRecord]) -> Vec<DynamicRow> {
    let mut rows = Vec::new();
    for app in &ctx.apps {
        for &n in &ctx.settings.table_nodes {
            let stats: Vec<_> = app_runs(runs, app, n, Variant::On)
                .filter(|(_, o)| o.ok)
                .filter_map(|(_, o)| o.stats.as_ref())
                .collect();
            if stats.is_empty() {
                continue;
            }
            let med = |f: &dyn Fn(&crate::parse::JobStats) -> Option<f64>| {
                median(&stats.iter().filter_map(|s| f(s)).collect::<Vec<_>>())
            };
            let medu = |f: &dyn Fn(&crate::parse::JobStats) -> Option<u64>| {
                median(
                    &stats
                        .iter()
                        .filter_map(|s| f(s).map(|x| x as f64))
                        .collect::<Vec<_>>(),
                )
                .map(|m| m.round() as u64)
            };
            rows.push(DynamicRow {
                app: app.clone(),
                nodes: n,
                intervals_in_overlap_pct: med(&|s| {
                    let a = s.analysis.as_ref()?;
                    pct(a.intervals_in_overlap, a.intervals)
                }),
                bitmaps_fetched_pct: med(&|s| {
                    let a = s.analysis.as_ref()?;
                    pct(a.bitmaps_wanted, a.bitmaps_total)
                }),
                notice_bytes_pct: med(&|s| pct(s.race_notice_bytes, s.bytes_sent)),
                // The run in the middle, for the raw counts.
                analysis: {
                    let mut with: Vec<_> =
                        stats.iter().filter_map(|s| s.analysis.clone()).collect();
                    with.sort_by_key(|a| a.intervals_in_overlap);
                    with.get(with.len() / 2).cloned()
                },
                race_notice_bytes: medu(&|s| Some(s.race_notice_bytes)),
                bytes_sent: medu(&|s| Some(s.bytes_sent)),
                interval_comparison_ms: med(&|s| s.interval_comparison_ms),
                bitmap_round_ms: med(&|s| s.bitmap_round_ms),
            });
        }
    }
    rows
}

pub fn breakdown_rows(ctx: &Context, runs: &[RunRecord]) -> Vec<BreakdownRow> {
    let mut rows = Vec::new();
    for app in &ctx.apps {
        if ctx.missing_apps.contains_key(app) {
            continue;
        }
        for &n in &ctx.settings.breakdown_nodes {
            let mut row = BreakdownRow {
                app: app.clone(),
                nodes: n,
                ..BreakdownRow::default()
            };
            let variants = [
                Variant::Off,
                Variant::Record,
                Variant::Notices,
                Variant::Compare,
                Variant::On,
            ];
            for v in variants {
                if let Some(m) = median(&times_by_rep(runs, app, n, v)) {
                    let key = if v == Variant::On {
                        "on"
                    } else {
                        v.label().trim_start_matches("race:")
                    };
                    row.median_s.insert(key.to_string(), m);
                }
            }
            // Per repetition, each component relative to that repetition's own race-off
            // run (the five variants of a repetition ran back to back), then the median
            // over repetitions: slow drifts of the machine's load cancel out.
            let t: Vec<Vec<f64>> = variants
                .iter()
                .map(|&v| times_by_rep(runs, app, n, v))
                .collect();
            let reps = t.iter().map(Vec::len).max().unwrap_or(0);
            let at = |v: usize, k: usize| t[v].get(k).copied().unwrap_or(f64::NAN);
            let mut parts: [Vec<f64>; 5] = Default::default();
            for k in 0..reps {
                let [off, rec, not, cmp, on] = [at(0, k), at(1, k), at(2, k), at(3, k), at(4, k)];
                if off.is_nan() || off <= 0.0 || [rec, not, cmp, on].iter().any(|x| x.is_nan()) {
                    continue;
                }
                for (slot, d) in
                    parts
                        .iter_mut()
                        .zip([rec - off, not - rec, cmp - not, on - cmp, on - off])
                {
                    slot.push(100.0 * d / off);
                }
            }
            if parts[0].is_empty() {
                row.status = "failed: no repetition where every phase ran".into();
            } else {
                row.recording_pct = median(&parts[0]);
                row.protocol_pct = median(&parts[1]);
                row.intervals_pct = median(&parts[2]);
                row.bitmaps_pct = median(&parts[3]);
                row.total_pct = median(&parts[4]);
                row.status = if parts[0].len() < reps {
                    format!("ok ({} of {reps} repetitions complete)", parts[0].len())
                } else {
                    "ok".into()
                };
            }
            // The master's own timers of the last two components, for comparison.
            if let Some(off) = row.median_s.get("off").copied().filter(|&o| o > 0.0) {
                let timer = |f: &dyn Fn(&crate::parse::JobStats) -> Option<f64>| {
                    let v: Vec<f64> = app_runs(runs, app, n, Variant::On)
                        .filter(|(_, o)| o.ok)
                        .filter_map(|(_, o)| f(o.stats.as_ref()?))
                        .collect();
                    median(&v).map(|ms| 100.0 * ms / 1e3 / off)
                };
                row.timer_intervals_pct = timer(&|s| s.interval_comparison_ms);
                row.timer_bitmaps_pct = timer(&|s| s.bitmap_round_ms);
            }
            rows.push(row);
        }
    }
    rows
}

/// KiB to MB, to 0.01 MB (finer digits would only be sampling noise).
fn mb(kb: u64) -> f64 {
    (kb as f64 / 1024.0 * 100.0).round() / 100.0
}

/// SOR under every detector, and the kernels' verdicts.
pub fn peer_rows(ctx: &Context, runs: &[RunRecord]) -> Vec<PeerRow> {
    let sor_label = format!("sor {}", ctx.settings.peer_sor);
    let mut rows = c_sor_rows(ctx, runs, &sor_label);
    rows.extend(dsm_sor_rows(ctx, runs, &sor_label));
    rows.extend(c_app_rows(ctx, runs));
    rows.extend(kernel_rows(ctx, runs));
    rows
}

/// The C SOR runs of one tool in repetition order: their times (NaN where a run failed)
/// and their outcomes.
fn c_sor_runs(runs: &[RunRecord], tool: Tool) -> (Vec<f64>, Vec<&Outcome>) {
    let mut v: Vec<(usize, &Outcome)> = runs
        .iter()
        .filter_map(|r| match &r.job {
            Job::CSor { tool: t, rep, .. } if *t == tool => Some((*rep, &r.outcome)),
            _ => None,
        })
        .collect();
    v.sort_by_key(|(rep, _)| *rep);
    (
        v.iter()
            .map(|(_, o)| o.parallel_s.filter(|_| o.ok).unwrap_or(f64::NAN))
            .collect(),
        v.into_iter().map(|(_, o)| o).collect(),
    )
}

/// The C SOR plain and under each detector, each against the plain runs.
fn c_sor_rows(ctx: &Context, runs: &[RunRecord], sor_label: &str) -> Vec<PeerRow> {
    let mut rows = Vec::new();
    let (plain, _) = c_sor_runs(runs, Tool::Plain);
    for tool in [Tool::Plain, Tool::Tsan, Tool::Helgrind, Tool::Drd] {
        let mut row = PeerRow {
            tool: tool.label().into(),
            app: format!("{sor_label} (C, pthreads)"),
            threads: ctx.settings.peer_threads,
            ..PeerRow::default()
        };
        if let Some(why) = ctx.missing_tools.get(&tool) {
            row.status = format!("not run: {why}");
            rows.push(row);
            continue;
        }
        let (times, outs) = c_sor_runs(runs, tool);
        let failed = times.iter().filter(|t| t.is_nan()).count();
        row.status = status_of(times.len(), failed);
        row.base_s = median(&plain);
        row.tool_s = median(&times);
        let ratios = paired_ratios(&plain, &times);
        if let Some(r) = summary(&ratios) {
            row.slowdown = Some(r.median);
            row.slowdown_min = Some(r.min);
            row.slowdown_max = Some(r.max);
        }
        row.peak_rss_mb = outs.iter().filter_map(|o| o.max_rss_kb).max().map(mb);
        // Any report in any repetition counts: SOR is race-free, so one is a false alarm.
        row.found_race = outs
            .iter()
            .any(|o| o.ok)
            .then(|| outs.iter().any(|o| o.ok && o.found_race == Some(true)));
        row.expected_race = Some(false);
        rows.push(row);
    }
    rows
}

/// dsm's SOR at the same size and node count: the table's runs.
fn dsm_sor_rows(ctx: &Context, runs: &[RunRecord], sor_label: &str) -> Vec<PeerRow> {
    let threads = ctx.settings.peer_threads;
    let mut rows = Vec::new();
    for variant in [Variant::Off, Variant::On] {
        let mut row = PeerRow {
            tool: if variant == Variant::Off {
                "dsm (no --race)".into()
            } else {
                "dsm --race".into()
            },
            app: format!("{sor_label} (dsm, processes)"),
            threads,
            ..PeerRow::default()
        };
        if let Some(why) = ctx.missing_apps.get("sor") {
            row.status = format!("not run: {why}");
            rows.push(row);
            continue;
        }
        let off = times_by_rep(runs, "sor", threads, Variant::Off);
        let mine = times_by_rep(runs, "sor", threads, variant);
        let outs: Vec<&Outcome> = app_runs(runs, "sor", threads, variant)
            .map(|(_, o)| o)
            .collect();
        row.status = status_of(mine.len(), mine.iter().filter(|t| t.is_nan()).count());
        row.base_s = median(&off);
        row.tool_s = median(&mine);
        if let Some(r) = summary(&paired_ratios(&off, &mine)) {
            row.slowdown = Some(r.median);
            row.slowdown_min = Some(r.min);
            row.slowdown_max = Some(r.max);
        }
        let ok = || outs.iter().filter(|o| o.ok);
        row.peak_rss_mb = ok()
            .filter_map(|o| o.rank_rss_kb.iter().max().copied().or(o.max_rss_kb))
            .max()
            .map(mb);
        row.peak_rss_sum_mb = ok()
            .map(|o| o.rank_rss_kb.iter().sum::<u64>())
            .filter(|&s| s > 0)
            .max()
            .map(mb);
        if variant == Variant::On {
            row.found_race = ok().find_map(|o| o.races).map(|n| n > 0);
        }
        row.expected_race = Some(false);
        rows.push(row);
    }
    rows
}

/// The kernels: dsm and each thread-level detector.
fn kernel_rows(ctx: &Context, runs: &[RunRecord]) -> Vec<PeerRow> {
    let mut rows = Vec::new();
    for (kernel, racy) in &ctx.kernels {
        let dsm = runs.iter().find_map(|r| match &r.job {
            Job::DsmKernel { kernel: k, .. } if k == kernel => Some(&r.outcome),
            _ => None,
        });
        rows.push(kernel_row(
            "dsm --race",
            kernel,
            *racy,
            dsm,
            ctx.missing_apps.get("race-kernel"),
            ctx.settings.kernel_nodes,
        ));
        for tool in [Tool::Tsan, Tool::Helgrind, Tool::Drd] {
            let o = runs.iter().find_map(|r| match &r.job {
                Job::CKernel {
                    tool: t, kernel: k, ..
                } if *t == tool && k == kernel => Some(&r.outcome),
                _ => None,
            });
            rows.push(kernel_row(
                tool.label(),
                kernel,
                *racy,
                o,
                ctx.missing_tools.get(&tool),
                ctx.settings.peer_threads,
            ));
        }
    }
    rows
}

/// The C row (issue 33): the C SOR of `dsm-capi/c-apps` with threads, plain and under
/// ThreadSanitizer, and on dsm ranks, without and with `--race`; each detector's slowdown
/// over the same program without it, paired by repetition.
fn c_app_rows(ctx: &Context, runs: &[RunRecord]) -> Vec<PeerRow> {
    let s = &ctx.settings;
    let of = |runner: CRunner| -> (Vec<f64>, Vec<&Outcome>) {
        let mut v: Vec<(usize, &Outcome)> = runs
            .iter()
            .filter_map(|r| match &r.job {
                Job::CApp { runner: x, rep, .. } if *x == runner => Some((*rep, &r.outcome)),
                _ => None,
            })
            .collect();
        v.sort_by_key(|(rep, _)| *rep);
        let times = v
            .iter()
            .map(|(_, o)| o.parallel_s.filter(|_| o.ok).unwrap_or(f64::NAN))
            .collect();
        (times, v.into_iter().map(|(_, o)| o).collect())
    };
    let mut rows = Vec::new();
    for runner in CRunner::ALL {
        let program = if runner.dsm() {
            "sor.c on dsm, processes"
        } else {
            "sor_threads.c, pthreads"
        };
        let mut row = PeerRow {
            tool: runner.label().into(),
            app: format!("sor {} (C row: dsm-capi/c-apps/{program})", s.peer_sor),
            threads: s.peer_threads,
            expected_race: Some(false),
            ..PeerRow::default()
        };
        if let Some(why) = ctx.missing_c.get(&runner) {
            row.status = format!("not run: {why}");
            rows.push(row);
            continue;
        }
        let (base, _) = of(runner.baseline());
        let (times, outs) = of(runner);
        row.status = status_of(times.len(), times.iter().filter(|t| t.is_nan()).count());
        row.base_s = median(&base);
        row.tool_s = median(&times);
        if let Some(r) = summary(&paired_ratios(&base, &times)) {
            row.slowdown = Some(r.median);
            row.slowdown_min = Some(r.min);
            row.slowdown_max = Some(r.max);
        }
        row.peak_rss_mb = outs.iter().filter_map(|o| o.max_rss_kb).max().map(mb);
        row.found_race = outs
            .iter()
            .filter(|o| o.ok)
            .filter_map(|o| o.found_race)
            .reduce(|a, b| a || b);
        rows.push(row);
    }
    rows
}

fn kernel_row(
    tool: &str,
    kernel: &str,
    racy: bool,
    o: Option<&Outcome>,
    missing: Option<&String>,
    threads: usize,
) -> PeerRow {
    let mut row = PeerRow {
        tool: tool.into(),
        app: kernel.into(),
        threads,
        expected_race: Some(racy),
        ..PeerRow::default()
    };
    match (missing, o) {
        (Some(why), _) => row.status = format!("not run: {why}"),
        (None, None) => row.status = "not run".into(),
        (None, Some(o)) if !o.ok => row.status = "failed".into(),
        (None, Some(o)) => {
            row.status = "ok".into();
            row.found_race = o.found_race;
            row.peak_rss_mb = o.rank_rss_kb.iter().max().copied().or(o.max_rss_kb).map(mb);
            let sum: u64 = o.rank_rss_kb.iter().sum();
            row.peak_rss_sum_mb = (sum > 0).then(|| mb(sum));
        }
    }
    row
}

/// The primitives measured over one transport: the default (one common segment), shared-
/// memory rings or TCP.
pub fn primitives(
    runs: &[RunRecord],
    missing: Option<&String>,
    transport: BenchTransport,
) -> Primitives {
    if let Some(why) = missing {
        return Primitives {
            status: format!("not run: {why}"),
            ..Primitives::default()
        };
    }
    let outs: Vec<&Outcome> = runs
        .iter()
        .filter(|r| r.job.bench_transport() == Some(transport))
        .map(|r| &r.outcome)
        .collect();
    let figs: Vec<(BenchFigures, &serde_json::Value)> = outs
        .iter()
        .filter(|o| o.ok)
        .filter_map(|o| {
            let v = o.bench.as_ref()?;
            Some((parse_bench(v).ok()?, v))
        })
        .collect();
    if figs.is_empty() {
        return Primitives {
            status: if outs.is_empty() { "not run" } else { "failed" }.into(),
            ..Primitives::default()
        };
    }
    // Each figure: the median over the runs of each run's median.
    let med = |f: &dyn Fn(&BenchFigures) -> Option<f64>| {
        median(&figs.iter().filter_map(|(b, _)| f(b)).collect::<Vec<_>>())
    };
    let mut barrier_us = BTreeMap::new();
    for k in figs.iter().flat_map(|(b, _)| b.barrier_us.keys()) {
        if let Some(m) = med(&|b| b.barrier_us.get(k).copied()) {
            barrier_us.insert(k.clone(), m);
        }
    }
    let combined = BenchFigures {
        rtt_us: med(&|b| b.rtt_us),
        remote_fault_us: med(&|b| b.remote_fault_us),
        write_fault_us: med(&|b| b.write_fault_us),
        lock_acquire_us: med(&|b| b.lock_acquire_us),
        lock_handoff_us: med(&|b| b.lock_handoff_us),
        lock_handoff_page_us: med(&|b| b.lock_handoff_page_us),
        barrier_us,
    };
    let mut p = Primitives::from_figures(&combined, figs[0].1.clone());
    p.runs = figs.len();
    let failed = outs.len() - figs.len();
    if failed > 0 {
        p.status = format!("ok ({failed} of {} runs failed)", outs.len());
    }
    p
}

pub fn speedup_rows(ctx: &Context, runs: &[RunRecord]) -> Vec<SpeedupRow> {
    let mut rows = Vec::new();
    for app in &ctx.apps {
        // The sequential reference is timed in every verified run; its median over the
        // race-off runs is the baseline.
        let seq: Vec<f64> = runs
            .iter()
            .filter_map(|r| match &r.job {
                Job::App {
                    app: a,
                    variant: Variant::Off,
                    purpose,
                    ..
                } if a == app
                    && r.outcome.ok
                    && matches!(purpose, Purpose::Table | Purpose::Speedup) =>
                {
                    r.outcome.sequential_s
                }
                _ => None,
            })
            .collect();
        let sequential_s = median(&seq);
        let par_at = |n: usize| median(&times_by_rep(runs, app, n, Variant::Off));
        let one = par_at(1);
        for &n in &ctx.settings.speedup_nodes {
            let mut row = SpeedupRow {
                app: app.clone(),
                nodes: n,
                oversubscribed: n > ctx.machine.cores,
                ..SpeedupRow::default()
            };
            if let Some(why) = ctx.missing_apps.get(app) {
                row.status = format!("not run: {why}");
            } else {
                let times = times_by_rep(runs, app, n, Variant::Off);
                row.status = status_of(times.len(), times.iter().filter(|t| t.is_nan()).count());
                row.parallel_s = median(&times);
                row.sequential_s = sequential_s;
                row.speedup = row.parallel_s.zip(sequential_s).map(|(p, s)| s / p);
                row.self_relative = row.parallel_s.zip(one).map(|(p, o)| o / p);
            }
            rows.push(row);
        }
    }
    rows
}

/// The "dsm vs threads" table: for each scaled input in the settings, the threaded time
/// and dsm's under each transport (default, rings, TCP) by repetition, each dsm time's
/// ratios paired with the threads of the same repetition, and the sequential time (timed
/// in every run of every kind).
pub fn threads_rows(ctx: &Context, runs: &[RunRecord]) -> Vec<ThreadsRow> {
    let s = &ctx.settings;
    let mut rows = Vec::new();
    for (app, input) in &s.vs_threads {
        let mut row = ThreadsRow {
            app: app.clone(),
            input: input.clone(),
            nodes: s.vs_threads_nodes,
            oversubscribed: s.vs_threads_nodes > ctx.machine.cores,
            ..ThreadsRow::default()
        };
        if let Some(why) = ctx.missing_apps.get(app) {
            row.status = format!("not run: {why}");
            rows.push(row);
            continue;
        }
        let outs: Vec<(Runner, usize, &Outcome)> = runs
            .iter()
            .filter_map(|r| match &r.job {
                Job::VsThreads {
                    app: a,
                    args,
                    nodes,
                    runner,
                    rep,
                } if a == app && args.join(" ") == *input && *nodes == s.vs_threads_nodes => {
                    Some((*runner, *rep, &r.outcome))
                }
                _ => None,
            })
            .collect();
        let by_rep = |which: Runner| -> Vec<f64> {
            let mut v: Vec<(usize, f64)> = outs
                .iter()
                .filter(|(r, _, _)| *r == which)
                .map(|(_, rep, o)| (*rep, o.parallel_s.filter(|_| o.ok).unwrap_or(f64::NAN)))
                .collect();
            v.sort_by_key(|(rep, _)| *rep);
            v.into_iter().map(|(_, t)| t).collect()
        };
        let (threads, dsm, dsm_rings, dsm_tcp) = (
            by_rep(Runner::Threads),
            by_rep(Runner::Dsm),
            by_rep(Runner::DsmRings),
            by_rep(Runner::DsmTcp),
        );
        let seq: Vec<f64> = outs
            .iter()
            .filter(|(_, _, o)| o.ok)
            .filter_map(|(_, _, o)| o.sequential_s)
            .collect();
        row.status = status_of(outs.len(), outs.iter().filter(|(_, _, o)| !o.ok).count());
        row.sequential_s = median(&seq);
        row.threads = summary(&threads);
        row.dsm = summary(&dsm);
        row.ratio = summary(&paired_ratios(&threads, &dsm));
        row.dsm_rings = summary(&dsm_rings);
        row.ratio_rings = summary(&paired_ratios(&threads, &dsm_rings));
        row.dsm_tcp = summary(&dsm_tcp);
        row.ratio_tcp = summary(&paired_ratios(&threads, &dsm_tcp));
        row.threads_speedup = row.sequential_s.zip(row.threads).map(|(q, t)| q / t.median);
        row.dsm_speedup = row.sequential_s.zip(row.dsm).map(|(q, d)| q / d.median);
        rows.push(row);
    }
    rows
}

fn fmt_x(x: f64) -> String {
    format!("{x:.2}x")
}

pub fn targets(
    ctx: &Context,
    apps: &[AppRow],
    peers: &[PeerRow],
    prim: &Primitives,
) -> Vec<Target> {
    vec![
        slowdown_target(ctx, apps),
        tsan_target(ctx, peers),
        fault_floor_target(prim),
    ]
}

/// Geometric mean slowdown at N = 8.
fn slowdown_target(ctx: &Context, apps: &[AppRow]) -> Target {
    let at = |n: usize| -> (Vec<f64>, Vec<String>) {
        let rows: Vec<&AppRow> = apps.iter().filter(|r| r.nodes == n).collect();
        (
            rows.iter().filter_map(|r| r.race_ratio).collect(),
            rows.iter()
                .filter(|r| r.race_ratio.is_none())
                .map(|r| r.app.clone())
                .collect(),
        )
    };
    let (r8, miss8) = at(8);
    let mut t = Target {
        name: "race-detection slowdown, geometric mean over the apps at N = 8".into(),
        goal: "<= 1.3 (paper: 2.2)".into(),
        ..Target::default()
    };
    let Some(g) = geomean(&r8) else {
        let (r2, _) = at(2);
        t.measured = "not measured at N = 8".into();
        t.note = match geomean(&r2) {
            Some(g) => format!(
                "N = 8 not run in this mode; at N = 2 the geometric mean is {} over {} apps",
                fmt_x(g),
                r2.len()
            ),
            None => "no app has both race-off and race-on times".into(),
        };
        return t;
    };
    let names: Vec<&str> = apps
        .iter()
        .filter(|r| r.nodes == 8 && r.race_ratio.is_some())
        .map(|r| r.app.as_str())
        .collect();
    t.value = Some(g);
    t.measured = format!("{} over {}", fmt_x(g), names.join(", "));
    t.met = Some(g <= 1.3);
    if !miss8.is_empty() {
        t.note = format!("without {} (not measured)", miss8.join(", "));
        t.met = None;
    } else if names.len() < 4 {
        t.note = "the target is over the four apps".into();
        t.met = None;
    }
    if ctx.machine.cores < 8 {
        t.note = [
            t.note.clone(),
            format!("N = 8 is oversubscribed on {} cores", ctx.machine.cores),
        ]
        .iter()
        .filter(|s| !s.is_empty())
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    }
    t
}

/// dsm --race against ThreadSanitizer on SOR.
fn tsan_target(ctx: &Context, peers: &[PeerRow]) -> Target {
    let find = |tool: &str| {
        peers
            .iter()
            .find(|p| p.tool == tool && p.app.starts_with("sor"))
            .and_then(|p| p.slowdown)
    };
    let mut t = Target {
        name: "dsm --race vs ThreadSanitizer on SOR (ratio of slowdowns)".into(),
        goal: ">= 5x cheaper".into(),
        ..Target::default()
    };
    match (find("dsm --race"), find(Tool::Tsan.label())) {
        (Some(d), Some(ts)) => {
            let v = ts / d;
            t.value = Some(v);
            t.measured = format!(
                "{} cheaper (TSan {} vs dsm {})",
                fmt_x(v),
                fmt_x(ts),
                fmt_x(d)
            );
            t.met = Some(v >= 5.0);
            t.note = format!(
                "SOR {}, {} threads / nodes",
                ctx.settings.peer_sor, ctx.settings.peer_threads
            );
        }
        (d, ts) => {
            t.measured = "not measured".into();
            t.note = format!(
                "{}{}",
                if d.is_none() {
                    "no dsm SOR slowdown; "
                } else {
                    ""
                },
                if ts.is_none() {
                    "no ThreadSanitizer SOR slowdown"
                } else {
                    ""
                }
            );
        }
    }
    t
}

/// Remote fault against the physical floor.
fn fault_floor_target(prim: &Primitives) -> Target {
    let mut t = Target {
        name: "remote page fault vs loopback round trip + local fault".into(),
        goal: "<= 2x".into(),
        ..Target::default()
    };
    match (
        prim.remote_fault_vs_floor,
        prim.remote_fault_us,
        prim.rtt_us,
        prim.write_fault_us,
    ) {
        (Some(v), Some(rf), Some(rtt), Some(wf)) => {
            t.value = Some(v);
            t.measured = format!("{} ({rf:.1} us vs {rtt:.1} + {wf:.1} us)", fmt_x(v));
            t.met = Some(v <= 2.0);
        }
        _ => {
            t.measured = "not measured".into();
            t.note = prim.status.clone();
        }
    }
    t
}

/// The speed targets of the fault, lock and transport work: primitives (over rings and
/// over TCP) against the round trip of their transport, and dsm with the default
/// transport against plain threads on the scaled inputs.
pub fn speed_targets(
    prim: &Primitives,
    prim_tcp: &Primitives,
    threads: &[ThreadsRow],
) -> Vec<Target> {
    let mut out = Vec::new();
    let mut bound =
        |name: &str, goal: String, measured: Option<(f64, String)>, limit: f64, why: &str| {
            let mut t = Target {
                name: name.into(),
                goal,
                ..Target::default()
            };
            match measured {
                Some((v, words)) => {
                    t.value = Some(v);
                    t.measured = words;
                    t.met = Some(v <= limit);
                }
                None => {
                    t.measured = "not measured".into();
                    t.note = why.into();
                }
            }
            out.push(t);
        };
    bound(
        "remote page fault over TCP vs TCP round trip + 10 us",
        "<= 1x".into(),
        prim_tcp.remote_fault_us.zip(prim_tcp.rtt_us).map(|(f, r)| {
            (
                f / (r + 10.0),
                format!("{} ({f:.1} us vs {r:.1} + 10 us)", fmt_x(f / (r + 10.0))),
            )
        }),
        1.0,
        &prim_tcp.status,
    );
    bound(
        "remote page fault, shared-memory rings (`DSM_TRANSPORT=rings`)",
        "<= 15 us".into(),
        prim.remote_fault_us.map(|f| (f, format!("{f:.1} us"))),
        15.0,
        &prim.status,
    );
    bound(
        "barrier at N = 2, shared-memory rings (`DSM_TRANSPORT=rings`)",
        "< 10 us".into(),
        prim.barrier_us.get("2").map(|&b| (b, format!("{b:.1} us"))),
        10.0,
        &prim.status,
    );
    bound(
        "free lock acquire over TCP, in round trips",
        "<= 2".into(),
        prim_tcp
            .lock_acquire_us
            .zip(prim_tcp.rtt_us)
            .map(|(a, r)| (a / r, format!("{:.2} ({a:.1} us / {r:.1} us)", a / r))),
        2.0,
        &prim_tcp.status,
    );
    bound(
        "lock hand-off with one page of changes over TCP, in round trips",
        "<= 2.5".into(),
        prim_tcp
            .lock_handoff_page_us
            .zip(prim_tcp.rtt_us)
            .map(|(a, r)| (a / r, format!("{:.2} ({a:.1} us / {r:.1} us)", a / r))),
        2.5,
        &prim_tcp.status,
    );
    for t in threads {
        let limit = match (t.app.as_str(), t.input.as_str()) {
            ("sor", "--size 2048 --iters 50") => 1.10,
            ("sor", "--size 1024 --iters 100") => 1.20,
            ("fft", _) => 1.25,
            _ => continue,
        };
        bound(
            &format!("dsm / threads, {} `{}` at N = {}", t.app, t.input, t.nodes),
            format!("<= {limit:.2}"),
            t.ratio.map(|r| (r.median, fmt_x(r.median))),
            limit,
            &t.status,
        );
    }
    out
}

/// What a run ran, regardless of node count, variant and repetition: failures of the same
/// program with the same error are one entry, so a broken app does not bury the report.
fn failure_group(job: &Job) -> String {
    match job {
        Job::App { app, .. } => format!("app {app}"),
        Job::CSor { tool, .. } => format!("C sor {tool:?}"),
        Job::CApp { runner, .. } => format!("C sor (c-apps) {}", runner.label()),
        Job::CKernel { tool, .. } => format!("C kernel {tool:?}"),
        Job::DsmKernel { .. } => "race-kernel".into(),
        Job::Primitives { .. } => "dsm-bench".into(),
        Job::VsThreads { app, runner, .. } => format!("{app} {}", runner.label()),
    }
}

/// Failed runs, grouped, with the command of the first one.
pub fn failures(runs: &[RunRecord], command: &dyn Fn(&Job) -> String) -> Vec<Failure> {
    let mut out: Vec<(String, Failure)> = Vec::new();
    for r in runs.iter().filter(|r| !r.outcome.ok) {
        let error = r.outcome.error.clone().unwrap_or_default();
        let key = format!("{}\u{0}{error}", failure_group(&r.job));
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some((_, f)) => f.count += 1,
            None => out.push((
                key,
                Failure {
                    what: r.job.describe(),
                    count: 1,
                    command: command(&r.job),
                    error,
                    stderr_tail: r.outcome.stderr_tail.clone(),
                },
            )),
        }
    }
    out.into_iter().map(|(_, f)| f).collect()
}

/// One cell of the app tables: app, input, N and transport ("auto" for the default).
type AppCell = (String, String, usize, String);

fn app_cell(app: &str, args: &[String], nodes: usize, transport: Option<&str>) -> AppCell {
    (
        app.to_string(),
        args.join(" "),
        nodes,
        transport.unwrap_or("auto").to_string(),
    )
}

/// One app run with its cell, variant and repetition.
type CellRun<'a> = (AppCell, Variant, usize, &'a RunRecord);

/// The app runs of `purpose`, each with its cell, variant and repetition, and the cells in
/// the order they first appear.
fn runs_by_cell(runs: &[RunRecord], purpose: Purpose) -> (Vec<AppCell>, Vec<CellRun<'_>>) {
    let mut cells: Vec<AppCell> = Vec::new();
    let mut found = Vec::new();
    for r in runs {
        let Job::App {
            app,
            purpose: p,
            nodes,
            variant,
            rep,
            args,
            transport,
        } = &r.job
        else {
            continue;
        };
        if *p != purpose {
            continue;
        }
        let cell = app_cell(app, args, *nodes, transport.as_deref());
        if !cells.contains(&cell) {
            cells.push(cell.clone());
        }
        found.push((cell, *variant, *rep, r));
    }
    (cells, found)
}

/// The race-cost table: one row per input, N and transport that was run, in the order of
/// the runs, with the paired ratio of `--race` over the same command without it.
pub fn race_cost_rows(runs: &[RunRecord]) -> Vec<RaceCostRow> {
    let (cells, found) = runs_by_cell(runs, Purpose::RaceCost);
    let mut times: BTreeMap<(AppCell, Variant), Vec<(usize, f64)>> = BTreeMap::new();
    for (cell, variant, rep, r) in found {
        let t = r.outcome.parallel_s.filter(|_| r.outcome.ok);
        times
            .entry((cell, variant))
            .or_default()
            .push((rep, t.unwrap_or(f64::NAN)));
    }
    cells
        .into_iter()
        .map(|cell| {
            let by_rep = |v: Variant| -> Vec<f64> {
                let mut t = times.get(&(cell.clone(), v)).cloned().unwrap_or_default();
                t.sort_by_key(|(rep, _)| *rep);
                t.into_iter().map(|(_, x)| x).collect()
            };
            let (off, on) = (by_rep(Variant::Off), by_rep(Variant::On));
            let failed = off.iter().chain(&on).filter(|t| t.is_nan()).count();
            let (app, input, nodes, transport) = cell;
            RaceCostRow {
                app,
                input,
                nodes,
                transport,
                status: status_of(off.len() + on.len(), failed),
                off: summary(&off),
                on: summary(&on),
                ratio: summary(&paired_ratios(&off, &on)),
            }
        })
        .collect()
}

/// The round-trip model's rows: per input and N, the repetition whose critical rank
/// waited for the median number of delays (a run disturbed by load fetches no more than
/// another, but a race for a lock can change who waits), with the loss at each of
/// [`crate::delay::DELAYS_US`].
pub fn round_trip_rows(runs: &[RunRecord]) -> Vec<RoundTripRow> {
    let (cells, found) = runs_by_cell(runs, Purpose::RoundTrips);
    let mut reps: BTreeMap<AppCell, Vec<&RunRecord>> = BTreeMap::new();
    for (cell, _, _, r) in found {
        reps.entry(cell).or_default().push(r);
    }
    cells
        .into_iter()
        .map(|cell| {
            let runs = &reps[&cell];
            let ok: Vec<&RunRecord> = runs.iter().copied().filter(|r| r.outcome.ok).collect();
            let times: Vec<f64> = ok.iter().filter_map(|r| r.outcome.parallel_s).collect();
            let mut counted: Vec<&[crate::delay::RankWaits]> = ok
                .iter()
                .filter_map(|r| r.outcome.stats.as_ref())
                .map(|s| s.rank_waits.as_slice())
                .filter(|w| !w.is_empty())
                .collect();
            let critical = |w: &[crate::delay::RankWaits]| {
                crate::delay::critical_rank(w).map_or(0, |r| r.delays())
            };
            counted.sort_by_key(|w| critical(w));
            let ranks = counted
                .get(counted.len().saturating_sub(1) / 2)
                .map_or_else(Vec::new, |w| w.to_vec());
            let loss = crate::delay::DELAYS_US
                .iter()
                .filter_map(|&d| Some((d, crate::delay::projected_loss_s(&ranks, d)?)))
                .collect();
            let (app, input, nodes, transport) = cell;
            RoundTripRow {
                app,
                input,
                nodes,
                transport,
                status: status_of(runs.len(), runs.len() - ok.len()),
                time: summary(&times),
                ranks,
                loss,
            }
        })
        .collect()
}

/// Geometric mean of the race-cost ratios (medians) of one transport, with the number of
/// cells it covers; `None` when no cell of it has a ratio.
pub fn race_cost_geomean(rows: &[RaceCostRow], transport: &str) -> Option<(f64, usize)> {
    let ratios: Vec<f64> = rows
        .iter()
        .filter(|r| r.transport == transport)
        .filter_map(|r| r.ratio.map(|x| x.median))
        .collect();
    geomean(&ratios).map(|g| (g, ratios.len()))
}

/// The whole report except what only the caller knows (date, plots, duration).
pub fn analyze(ctx: &Context, runs: Vec<RunRecord>, command: &dyn Fn(&Job) -> String) -> Report {
    let apps = app_rows(ctx, &runs);
    let peers = peer_rows(ctx, &runs);
    let bench_missing = ctx.missing_apps.get("dsm-bench");
    let prim = primitives(&runs, bench_missing, BenchTransport::Rings);
    let prim_tcp = primitives(&runs, bench_missing, BenchTransport::Tcp);
    // Figures only: no target is judged on the common segment.
    let prim_common = primitives(&runs, bench_missing, BenchTransport::Common);
    let threads = threads_rows(ctx, &runs);
    let mut targets = targets(ctx, &apps, &peers, &prim);
    targets.extend(speed_targets(&prim, &prim_tcp, &threads));
    let mut not_run: Vec<String> = ctx
        .missing_apps
        .iter()
        .map(|(a, why)| format!("{a}: {why}"))
        .collect();
    not_run.extend(
        ctx.missing_tools
            .iter()
            .map(|(t, why)| format!("{}: {why}", t.label())),
    );
    not_run.extend(
        ctx.missing_c
            .iter()
            .map(|(r, why)| format!("{}: {why}", r.label())),
    );
    for n in &ctx.settings.skipped_nodes {
        not_run.push(format!(
            "application runs at N = {n}: skipped in --{}",
            ctx.settings.mode
        ));
    }
    let mut notes = Vec::new();
    if ctx.apps.iter().any(|a| a == "tsp") {
        notes.push(
            "TSP's sequential time is Held-Karp dynamic programming (its verifier), not the branch and bound: its speedup against it compares different algorithms; the self-relative column does not."
                .into(),
        );
    }
    Report {
        schema: 1,
        machine: ctx.machine.clone(),
        settings: ctx.settings.clone(),
        dynamic: dynamic_rows(ctx, &runs),
        breakdown: breakdown_rows(ctx, &runs),
        speedup: speedup_rows(ctx, &runs),
        threads: threads_rows(ctx, &runs),
        race_cost: race_cost_rows(&runs),
        round_trips: round_trip_rows(&runs),
        failures: failures(&runs, command),
        apps,
        peers,
        primitives: prim,
        primitives_tcp: prim_tcp,
        primitives_common: prim_common,
        targets,
        not_run,
        notes,
        runs,
        ..Report::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{Analysis, JobStats};

    #[test]
    fn race_cost_pairs_each_cell_by_repetition_and_keeps_other_tables_apart() {
        let run = |transport: &str, variant, rep, t: f64| RunRecord {
            job: Job::App {
                app: "sor".into(),
                purpose: Purpose::RaceCost,
                nodes: 2,
                variant,
                rep,
                args: vec!["--size".into(), "1024".into()],
                transport: Some(transport.into()),
            },
            outcome: Outcome {
                ok: true,
                parallel_s: Some(t),
                ..Outcome::default()
            },
        };
        let runs = vec![
            run("auto", Variant::Off, 0, 1.0),
            run("auto", Variant::On, 0, 1.5),
            run("auto", Variant::On, 1, 4.0),
            run("auto", Variant::Off, 1, 2.0),
            run("tcp", Variant::Off, 0, 1.0),
            run("tcp", Variant::On, 0, 3.0),
        ];
        let rows = race_cost_rows(&runs);
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (rows[0].transport.as_str(), rows[0].input.as_str()),
            ("auto", "--size 1024")
        );
        // Ratios 1.5 and 2.0, paired by repetition, not by order of the runs.
        assert_eq!(rows[0].ratio.map(|r| r.median), Some(1.75));
        let (g, cells) = race_cost_geomean(&rows, "tcp").unwrap();
        assert!((g - 3.0).abs() < 1e-12 && cells == 1);
        assert!(race_cost_geomean(&rows, "rings").is_none());
        // The race-cost runs stay out of the applications table.
        assert_eq!(app_runs(&runs, "sor", 2, Variant::Off).count(), 0);
        let mut report = Report {
            race_cost: rows,
            ..Report::default()
        };
        report.settings.mode = "quick".into();
        let text = crate::render::render(&report);
        assert!(
            text.contains("the default transport: geometric mean 1.75x over 1 cells"),
            "{text}"
        );
    }

    #[test]
    fn round_trip_rows_take_the_repetition_with_the_median_critical_rank() {
        use crate::delay::RankWaits;
        // Rank 1's fetches are the critical rank's in every repetition: 100, 300 and 200
        // fetches plus 10 barrier delays, so 210, 610 and 410 delays; the median is rep 2's.
        let run = |rep: usize, fetches: u64, t: f64| RunRecord {
            job: Job::App {
                app: "water".into(),
                purpose: Purpose::RoundTrips,
                nodes: 2,
                variant: Variant::Off,
                rep,
                args: vec!["--molecules".into(), "1000".into()],
                transport: Some("tcp".into()),
            },
            outcome: Outcome {
                ok: true,
                parallel_s: Some(t),
                stats: Some(JobStats {
                    rank_waits: (0..2)
                        .map(|rank| RankWaits {
                            rank,
                            fetch_requests: if rank == 1 { fetches } else { 1 },
                            barriers: 10,
                            barrier_delays: 10,
                            ..RankWaits::default()
                        })
                        .collect(),
                    ..JobStats::default()
                }),
                ..Outcome::default()
            },
        };
        let runs = vec![run(0, 100, 0.2), run(1, 300, 0.4), run(2, 200, 0.3)];
        let rows = round_trip_rows(&runs);
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!((row.transport.as_str(), row.status.as_str()), ("tcp", "ok"));
        assert_eq!(row.ranks[1].fetch_requests, 200);
        assert_eq!(row.time.map(|t| t.median), Some(0.3));
        // 410 delays: 10.25 ms at 25 us, 41 ms at 100 us, 205 ms at 500 us.
        let want = [(25.0, 0.01025), (100.0, 0.041), (500.0, 0.205)];
        assert_eq!(row.loss.len(), 3);
        for ((d, l), (wd, wl)) in row.loss.iter().zip(want) {
            assert_eq!(*d, wd);
            assert!((l - wl).abs() < 1e-12, "{d}: {l}");
        }
        // Kept out of the applications table and the speedups.
        assert_eq!(app_runs(&runs, "water", 2, Variant::Off).count(), 0);
        let report = Report {
            round_trips: rows,
            ..Report::default()
        };
        let text = crate::render::render(&report);
        // Rank 0: 2 + 10 = 12 delays, 6 round trips; rank 1: 205.
        assert!(text.contains("| 6 / 205 |"), "{text}");
        assert!(text.contains("+0.0410 (14%)"), "{text}");
    }

    #[test]
    fn c_row_pairs_each_detector_with_its_own_program_and_says_why_one_did_not_run() {
        let run = |runner, rep, t: f64, race: Option<bool>| RunRecord {
            job: Job::CApp {
                runner,
                size: 64,
                iters: 5,
                nodes: 2,
                rep,
            },
            outcome: Outcome {
                ok: true,
                parallel_s: Some(t),
                found_race: race,
                ..Outcome::default()
            },
        };
        let runs = vec![
            run(CRunner::Threads, 0, 0.1, None),
            run(CRunner::ThreadsTsan, 0, 3.0, Some(false)),
            run(CRunner::Dsm, 0, 0.5, None),
            run(CRunner::DsmRace, 0, 0.6, Some(false)),
            run(CRunner::DsmRace, 1, 1.4, Some(false)),
            run(CRunner::Dsm, 1, 1.0, None),
            run(CRunner::ThreadsTsan, 1, 5.0, Some(false)),
            run(CRunner::Threads, 1, 0.2, None),
        ];
        let rows = c_app_rows(&ctx(), &runs);
        let row = |label: &str| rows.iter().find(|r| r.tool == label).unwrap();
        // Ratios paired by repetition: TSan 30 and 25 over threads, dsm 1.2 and 1.4.
        let tsan = row("ThreadSanitizer (C row)");
        assert_eq!(tsan.slowdown, Some(27.5));
        assert_eq!(
            (tsan.slowdown_min, tsan.slowdown_max),
            (Some(25.0), Some(30.0))
        );
        assert_eq!(tsan.found_race, Some(false));
        let dsm = row("dsm --race (C row)");
        assert!((dsm.slowdown.unwrap() - 1.3).abs() < 1e-12, "{dsm:?}");
        assert_eq!((dsm.base_s, dsm.tool_s), (Some(0.75), Some(1.0)));
        assert!(
            dsm.app.starts_with("sor --size 64 --iters 5 (C row"),
            "{}",
            dsm.app
        );
        assert_eq!(row("plain (C row)").slowdown, Some(1.0));

        let mut c = ctx();
        c.missing_c
            .insert(CRunner::ThreadsTsan, "gcc -fsanitize=thread failed".into());
        let rows = c_app_rows(&c, &runs);
        let tsan = rows
            .iter()
            .find(|r| r.tool == "ThreadSanitizer (C row)")
            .unwrap();
        assert_eq!(tsan.status, "not run: gcc -fsanitize=thread failed");
        assert_eq!(tsan.slowdown, None);
    }

    fn app_run(app: &str, nodes: usize, variant: Variant, rep: usize, t: Option<f64>) -> RunRecord {
        RunRecord {
            job: Job::App {
                app: app.into(),
                purpose: Purpose::Table,
                nodes,
                variant,
                rep,
                args: vec![],
                transport: None,
            },
            outcome: Outcome {
                ok: t.is_some(),
                error: t.is_none().then(|| "exit status 1".to_string()),
                parallel_s: t,
                sequential_s: Some(1.0),
                stats: Some(JobStats {
                    ranks: nodes,
                    shared_bytes: 4096,
                    allocations: 1,
                    barriers: 12,
                    intervals_closed: 24,
                    lock_acquires: 0,
                    bytes_sent: 1000,
                    race_notice_bytes: if variant == Variant::Off { 0 } else { 10 },
                    analysis: (variant == Variant::On).then(|| Analysis {
                        intervals: 20,
                        intervals_in_overlap: 5,
                        bitmaps_wanted: 1,
                        bitmaps_total: 50,
                        ..Analysis::default()
                    }),
                    ..JobStats::default()
                }),
                races: (variant == Variant::On).then_some(0),
                ..Outcome::default()
            },
        }
    }

    fn ctx() -> Context {
        Context {
            settings: Settings {
                mode: "normal".into(),
                table_nodes: vec![2, 8],
                breakdown_nodes: vec![2],
                speedup_nodes: vec![2, 8],
                peer_sor: "--size 64 --iters 5".into(),
                peer_threads: 2,
                ..Settings::default()
            },
            machine: Machine {
                cores: 2,
                ..Machine::default()
            },
            apps: vec!["sor".into()],
            ..Context::default()
        }
    }

    #[test]
    fn table_pairs_off_and_on_by_repetition() {
        let runs = vec![
            app_run("sor", 2, Variant::Off, 0, Some(1.0)),
            app_run("sor", 2, Variant::On, 0, Some(1.2)),
            app_run("sor", 2, Variant::Off, 1, Some(2.0)),
            app_run("sor", 2, Variant::On, 1, None),
            app_run("sor", 2, Variant::Off, 2, Some(1.0)),
            app_run("sor", 2, Variant::On, 2, Some(1.4)),
        ];
        let rows = app_rows(&ctx(), &runs);
        let r = rows.iter().find(|r| r.nodes == 2).unwrap();
        assert_eq!(r.status, "ok (1 of 6 runs failed)");
        assert_eq!(r.race_off_s, Some(1.0));
        assert!((r.race_ratio.unwrap() - 1.3).abs() < 1e-12);
        assert_eq!(r.ratio.unwrap().n, 2);
        // 24 intervals over 12 barriers and 2 ranks.
        assert_eq!(r.intervals_per_barrier, Some(1.0));
        assert_eq!(r.sync, vec!["barrier".to_string()]);
        let r8 = rows.iter().find(|r| r.nodes == 8).unwrap();
        assert!(r8.oversubscribed);
        assert_eq!(r8.status, "not run");
        assert_eq!(r8.race_ratio, None);
    }

    #[test]
    fn breakdown_differences_of_consecutive_phases() {
        let mut runs = Vec::new();
        for (v, t) in [
            (Variant::Off, 1.0),
            (Variant::Record, 1.1),
            (Variant::Notices, 1.15),
            (Variant::Compare, 1.2),
            (Variant::On, 1.3),
        ] {
            runs.push(app_run("sor", 2, v, 0, Some(t)));
        }
        let b = &breakdown_rows(&ctx(), &runs)[0];
        assert_eq!(b.status, "ok");
        assert!((b.recording_pct.unwrap() - 10.0).abs() < 1e-9);
        assert!((b.protocol_pct.unwrap() - 5.0).abs() < 1e-9);
        assert!((b.intervals_pct.unwrap() - 5.0).abs() < 1e-9);
        assert!((b.bitmaps_pct.unwrap() - 10.0).abs() < 1e-9);
        assert!((b.total_pct.unwrap() - 30.0).abs() < 1e-9);
        // A repetition missing a phase is left out of the differences.
        runs.push(app_run("sor", 2, Variant::Off, 1, Some(1.0)));
        runs.push(app_run("sor", 2, Variant::On, 1, None));
        let b2 = &breakdown_rows(&ctx(), &runs)[0];
        assert_eq!(b2.status, "ok (1 of 2 repetitions complete)");
        let d = &dynamic_rows(&ctx(), &runs)[0];
        assert_eq!(d.intervals_in_overlap_pct, Some(25.0));
        assert_eq!(d.bitmaps_fetched_pct, Some(2.0));
        assert_eq!(d.notice_bytes_pct, Some(1.0));
    }

    #[test]
    fn targets_report_what_is_missing() {
        let mut c = ctx();
        c.settings.skipped_nodes = vec![8];
        c.settings.table_nodes = vec![2];
        let runs = vec![
            app_run("sor", 2, Variant::Off, 0, Some(1.0)),
            app_run("sor", 2, Variant::On, 0, Some(1.1)),
        ];
        let apps = app_rows(&c, &runs);
        let t = targets(&c, &apps, &[], &Primitives::default());
        assert_eq!(t[0].met, None);
        assert!(t[0].note.contains("at N = 2"), "{}", t[0].note);
        assert_eq!(t[1].met, None);
        assert_eq!(t[2].measured, "not measured");
        let prim = Primitives::from_figures(
            &crate::parse::BenchFigures {
                rtt_us: Some(40.0),
                remote_fault_us: Some(90.0),
                write_fault_us: Some(5.0),
                ..Default::default()
            },
            serde_json::Value::Null,
        );
        let t = targets(&c, &apps, &[], &prim);
        assert_eq!(t[2].met, Some(true));
        assert!((t[2].value.unwrap() - 2.0).abs() < 1e-12);
    }

    fn vs_run(app: &str, input: &str, runner: Runner, rep: usize, t: Option<f64>) -> RunRecord {
        RunRecord {
            job: Job::VsThreads {
                app: app.into(),
                args: input.split(' ').map(String::from).collect(),
                nodes: 2,
                runner,
                rep,
            },
            outcome: Outcome {
                ok: t.is_some(),
                parallel_s: t,
                sequential_s: t.map(|_| 1.0),
                ..Outcome::default()
            },
        }
    }

    #[test]
    fn dsm_vs_threads_pairs_repetitions() {
        let mut c = ctx();
        c.settings.vs_threads = vec![
            ("sor".into(), "--size 2048 --iters 50".into()),
            ("fft".into(), "--dims 128x128x64".into()),
            ("water".into(), "--big".into()),
        ];
        c.settings.vs_threads_nodes = 2;
        c.missing_apps
            .insert("water".into(), "binary not found".into());
        let sor = "--size 2048 --iters 50";
        let runs = vec![
            vs_run("sor", sor, Runner::Threads, 0, Some(0.5)),
            vs_run("sor", sor, Runner::Dsm, 0, Some(0.6)),
            vs_run("sor", sor, Runner::Dsm, 1, Some(1.0)),
            vs_run("sor", sor, Runner::Threads, 1, Some(0.5)),
            vs_run("sor", sor, Runner::Threads, 2, None),
            vs_run("sor", sor, Runner::Dsm, 2, Some(9.0)),
            // Over TCP: paired with the threads of the same repetition, apart from dsm.
            vs_run("sor", sor, Runner::DsmTcp, 0, Some(0.75)),
            vs_run("sor", sor, Runner::DsmTcp, 1, Some(2.0)),
            // Over rings likewise; rep 2 has no threads time to pair with.
            vs_run("sor", sor, Runner::DsmRings, 0, Some(0.65)),
            vs_run("sor", sor, Runner::DsmRings, 1, Some(1.5)),
            vs_run("sor", sor, Runner::DsmRings, 2, Some(0.7)),
            // Another input of the same app is another row.
            vs_run("sor", "--size 1024 --iters 100", Runner::Dsm, 0, Some(7.0)),
            // The app table's runs are not this table's.
            app_run("sor", 2, Variant::Off, 0, Some(5.0)),
        ];
        let rows = threads_rows(&c, &runs);
        assert_eq!(rows.len(), 3);
        let r = &rows[0];
        assert_eq!(r.status, "ok (1 of 11 runs failed)");
        assert_eq!(r.sequential_s, Some(1.0));
        assert_eq!(r.threads.unwrap().median, 0.5);
        assert_eq!(r.dsm.unwrap().median, 1.0);
        let ratio = r.ratio.unwrap();
        assert_eq!(ratio.n, 2);
        assert!((ratio.median - 1.6).abs() < 1e-12);
        assert!((ratio.min - 1.2).abs() < 1e-12 && (ratio.max - 2.0).abs() < 1e-12);
        assert_eq!(r.threads_speedup, Some(2.0));
        assert_eq!(r.dsm_speedup, Some(1.0));
        let tcp = r.ratio_tcp.unwrap();
        assert_eq!(tcp.n, 2);
        assert!((tcp.min - 1.5).abs() < 1e-12 && (tcp.max - 4.0).abs() < 1e-12);
        assert!((r.dsm_tcp.unwrap().median - 1.375).abs() < 1e-12);
        // The rings runs land in their own columns, apart from dsm and TCP.
        let rings = r.ratio_rings.unwrap();
        assert_eq!(rings.n, 2);
        assert!((rings.min - 1.3).abs() < 1e-12 && (rings.max - 3.0).abs() < 1e-12);
        assert!((rings.median - 2.15).abs() < 1e-12);
        let dsm_rings = r.dsm_rings.unwrap();
        assert_eq!((dsm_rings.n, dsm_rings.median), (3, 0.7));
        assert_eq!(rows[1].status, "not run");
        assert_eq!(rows[1].ratio, None);
        assert_eq!((rows[1].dsm_rings, rows[1].ratio_rings), (None, None));
        assert!(rows[2].status.starts_with("not run: binary"));
    }

    #[test]
    fn failures_are_grouped_by_program_and_error() {
        let runs = vec![
            app_run("sor", 2, Variant::Off, 0, None),
            app_run("sor", 8, Variant::On, 1, None),
            app_run("sor", 2, Variant::On, 0, Some(1.0)),
            app_run("fft", 2, Variant::Off, 0, None),
        ];
        let f = failures(&runs, &|j| j.describe());
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].count, 2);
        assert!(f[0].what.starts_with("sor"));
        assert_eq!(f[1].count, 1);
    }

    #[test]
    fn speed_targets_judge_each_transport_against_its_own_floor() {
        let shm = Primitives {
            status: "ok".into(),
            remote_fault_us: Some(12.0),
            barrier_us: [("2".to_string(), 11.0)].into(),
            ..Primitives::default()
        };
        let tcp = Primitives {
            status: "ok".into(),
            rtt_us: Some(14.0),
            remote_fault_us: Some(30.0),
            lock_acquire_us: Some(28.0),
            ..Primitives::default()
        };
        let sum = |m: f64| crate::stats::Summary {
            median: m,
            min: m,
            max: m,
            n: 1,
        };
        let rows = [
            ThreadsRow {
                app: "sor".into(),
                input: "--size 2048 --iters 50".into(),
                nodes: 2,
                ratio: Some(sum(1.05)),
                ..ThreadsRow::default()
            },
            ThreadsRow {
                app: "fft".into(),
                input: "--dims 128x128x64".into(),
                nodes: 2,
                status: "failed".into(),
                ..ThreadsRow::default()
            },
        ];
        let t = speed_targets(&shm, &tcp, &rows);
        let met = |name: &str| {
            t.iter()
                .find(|t| t.name.starts_with(name))
                .unwrap_or_else(|| panic!("no target {name}"))
                .met
        };
        assert_eq!(met("remote page fault over TCP"), Some(false)); // 30 > 14 + 10
        assert_eq!(met("remote page fault, shared-memory rings"), Some(true));
        assert_eq!(met("barrier at N = 2"), Some(false));
        assert_eq!(met("free lock acquire"), Some(true)); // exactly 2 round trips
        assert_eq!(met("lock hand-off"), None);
        assert_eq!(met("dsm / threads, sor"), Some(true));
        let fft = t.iter().find(|t| t.name.contains("fft")).unwrap();
        assert_eq!((fft.met, fft.note.as_str()), (None, "failed"));
    }

    #[test]
    fn primitives_are_medians_over_runs() {
        let run_on = |transport, rep: usize, rtt: f64, fault: f64| RunRecord {
            job: Job::primitives(10, rep, transport),
            outcome: Outcome {
                ok: true,
                bench: Some(serde_json::json!({
                    "rtt_us": {"median": rtt}, "remote_fault_us": {"median": fault},
                    "write_fault_us": {"median": 5.0}, "barrier_us": {"2": {"median": rtt * 2.0}}})),
                ..Outcome::default()
            },
        };
        let run = |rep, rtt, fault| run_on(BenchTransport::Rings, rep, rtt, fault);
        let runs = [
            run_on(BenchTransport::Common, 0, 13.0, 0.02),
            run(0, 10.0, 30.0),
            run(1, 12.0, 90.0),
            run(2, 11.0, 31.0),
            run_on(BenchTransport::Tcp, 0, 20.0, 60.0),
            run_on(BenchTransport::Common, 1, 15.0, 0.04),
        ];
        let p = primitives(&runs, None, BenchTransport::Rings);
        assert_eq!(p.runs, 3);
        assert!(runs[1]
            .job
            .describe()
            .starts_with("DSM_TRANSPORT=rings dsm-bench"));
        assert_eq!(p.rtt_us, Some(11.0));
        assert_eq!(p.remote_fault_us, Some(31.0));
        assert_eq!(p.barrier_us.get("2"), Some(&22.0));
        assert!((p.remote_fault_vs_floor.unwrap() - 31.0 / 16.0).abs() < 1e-12);
        // The TCP runs and the common segment runs are figures of their own.
        let tcp = primitives(&runs, None, BenchTransport::Tcp);
        assert_eq!((tcp.runs, tcp.rtt_us), (1, Some(20.0)));
        let common = primitives(&runs, None, BenchTransport::Common);
        assert_eq!((common.runs, common.rtt_us), (2, Some(14.0)));
        assert!((common.remote_fault_us.unwrap() - 0.03).abs() < 1e-12);
        assert_eq!(
            primitives(&[], None, BenchTransport::Common).status,
            "not run"
        );
        // analyze() files each transport's runs under its own field, and judges no target
        // on the common segment.
        let report = analyze(&ctx(), runs.to_vec(), &|j| j.describe());
        assert_eq!(report.primitives.runs, 3);
        assert_eq!(report.primitives_tcp.runs, 1);
        assert_eq!(report.primitives_common.runs, 2);
        assert_eq!(report.primitives_common.rtt_us, Some(14.0));
        assert_eq!(report.primitives.rtt_us, Some(11.0));
        let mut no_common = runs.to_vec();
        no_common.retain(|r| r.job.bench_transport() != Some(BenchTransport::Common));
        let without = analyze(&ctx(), no_common, &|j| j.describe());
        assert_eq!(without.primitives_common.status, "not run");
        assert_eq!(without.targets, report.targets);
    }

    #[test]
    fn missing_app_is_not_run() {
        let mut c = ctx();
        c.apps.push("fft".into());
        c.missing_apps
            .insert("fft".into(), "binary not found".into());
        let rows = app_rows(&c, &[]);
        assert!(rows
            .iter()
            .filter(|r| r.app == "fft")
            .all(|r| r.status == "not run: binary not found"));
        let s = speedup_rows(&c, &[]);
        assert!(s
            .iter()
            .any(|r| r.app == "fft" && r.status.starts_with("not run")));
    }
}
