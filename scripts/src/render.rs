//! The Markdown report (`latest.md`), rendered from the [`Report`] alone, so that it can be
//! regenerated from `latest.json` and tested against a fixed one. Each table says how its
//! figures were obtained; cells that were not measured say so instead of showing zeros.

use crate::model::*;
use std::fmt::Write;

const DASH: &str = "–";

fn secs(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.1}")
    } else if x >= 0.1 {
        format!("{x:.3}")
    } else {
        format!("{x:.4}")
    }
}

fn opt<T>(x: Option<T>, f: impl Fn(T) -> String) -> String {
    x.map_or_else(|| DASH.to_string(), f)
}

/// A figure of the common segment's primitives, in us: most are hundredths of a microsecond
/// (dsm-bench rounds to 0.01 us).
fn common_us(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn times(s: Option<crate::stats::Summary>) -> String {
    opt(s, |s| {
        if s.n > 1 {
            format!("{} ({}{DASH}{})", secs(s.median), secs(s.min), secs(s.max))
        } else {
            secs(s.median)
        }
    })
}

fn ratio(s: Option<crate::stats::Summary>) -> String {
    opt(s, |s| {
        if s.n > 1 {
            format!("**{:.2}** ({:.2}{DASH}{:.2})", s.median, s.min, s.max)
        } else {
            format!("**{:.2}**", s.median)
        }
    })
}

fn pct(x: Option<f64>) -> String {
    opt(x, |x| {
        if x.abs() >= 10.0 {
            format!("{x:.0}%")
        } else {
            format!("{x:.1}%")
        }
    })
}

/// A phase difference with the master's own timer of the same component beside it.
fn with_timer(diff: Option<f64>, timer: Option<f64>) -> String {
    match timer {
        Some(t) => format!("{} (timer {})", pct(diff), pct(Some(t))),
        None => pct(diff),
    }
}

fn kb(bytes: u64) -> String {
    format!("{}", bytes / 1024)
}

fn nodes(n: usize, over: bool) -> String {
    if over {
        format!("{n}\\*")
    } else {
        n.to_string()
    }
}

fn yes_no(found: Option<bool>, expected: Option<bool>) -> String {
    match (found, expected) {
        (None, _) => DASH.into(),
        (Some(f), Some(e)) => {
            let word = if f { "race" } else { "none" };
            if f == e {
                format!("{word} ✓")
            } else if f {
                format!("{word} ✗ (false alarm)")
            } else {
                format!("{word} ✗ (missed)")
            }
        }
        (Some(f), None) => (if f { "race" } else { "none" }).into(),
    }
}

/// Escapes characters that would break a table cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The race-cost table: per input and N, the default transport's times with and without
/// `--race` and their ratio, the other transports' ratios beside it, and each transport's
/// geometric mean.
fn race_cost(o: &mut String, r: &Report) {
    let _ = writeln!(o, "## Cost of `--race` as a user sees it\n");
    if r.race_cost.is_empty() {
        let _ = writeln!(o, "Not measured.\n");
        return;
    }
    let transports: Vec<&str> = ["auto", "rings", "tcp"]
        .into_iter()
        .filter(|t| r.race_cost.iter().any(|c| c.transport == *t))
        .collect();
    let _ = write!(
        o,
        "| app | input | N | without `--race` (s) | with `--race` (s) | `--race` / without |"
    );
    for t in transports.iter().filter(|t| **t != "auto") {
        let _ = write!(o, " {t}: `--race` / without |");
    }
    let _ = writeln!(o, " status |");
    let _ = writeln!(
        o,
        "{}|",
        "|---".repeat(7 + transports.len().saturating_sub(1))
    );
    let mut seen: Vec<(&str, &str, usize)> = Vec::new();
    for c in &r.race_cost {
        let key = (c.app.as_str(), c.input.as_str(), c.nodes);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let of = |t: &str| {
            r.race_cost
                .iter()
                .find(|x| (x.app.as_str(), x.input.as_str(), x.nodes) == key && x.transport == t)
        };
        let default = of("auto");
        let _ = write!(
            o,
            "| {} | {} | {} | {} | {} | {} |",
            c.app,
            c.input,
            c.nodes,
            times(default.and_then(|d| d.off)),
            times(default.and_then(|d| d.on)),
            ratio(default.and_then(|d| d.ratio)),
        );
        for t in transports.iter().filter(|t| **t != "auto") {
            let _ = write!(o, " {} |", ratio(of(t).and_then(|x| x.ratio)));
        }
        let _ = writeln!(
            o,
            " {} |",
            cell(default.map_or("not run", |d| d.status.as_str()))
        );
    }
    o.push('\n');
    for t in &transports {
        let name = if *t == "auto" {
            "the default transport"
        } else {
            t
        };
        let worst = r
            .race_cost
            .iter()
            .filter(|c| c.transport == *t)
            .filter_map(|c| c.ratio.map(|x| (x.median, c)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        match crate::analysis::race_cost_geomean(&r.race_cost, t) {
            Some((g, cells)) => {
                let _ = write!(o, "- {name}: geometric mean {g:.2}x over {cells} cells");
                if let Some((w, c)) = worst {
                    let _ = write!(
                        o,
                        "; largest {w:.2}x ({} {} at N = {})",
                        c.app, c.input, c.nodes
                    );
                }
                let _ = writeln!(o);
            }
            None => {
                let _ = writeln!(o, "- {name}: no complete pair");
            }
        }
    }
    let reps = r
        .race_cost
        .iter()
        .filter_map(|c| c.ratio.as_ref().map(|s| s.n))
        .max()
        .unwrap_or(0);
    let _ = writeln!(
        o,
        "\nEach cell runs the same `dsmrun -n N app input` without and with `--race` (`--race-exit-code 0`), alternating, with the transport a user gets (`auto`: one common segment on this host) and, beside it, `DSM_TRANSPORT=rings` and `tcp`; the ratio is the median of the per-repetition ratios of the apps' own parallel times ({}).\n",
        repetitions(reps)
    );
}

/// A loss in seconds with its share of the measured time.
fn loss(seconds: f64, time: Option<f64>) -> String {
    match time.filter(|t| *t > 0.0) {
        Some(t) => format!("+{} ({:.0}%)", secs(seconds), 100.0 * seconds / t),
        None => format!("+{}", secs(seconds)),
    }
}

/// The round-trip model (see `crate::delay`): per input, the round trips each rank waited
/// for over TCP, the slowest rank's by kind, and the loss at each one-way delay.
fn round_trips(o: &mut String, r: &Report) {
    let _ = writeln!(o, "## 8. Round trips and larger network delays (a model)\n");
    if r.round_trips.is_empty() {
        let _ = writeln!(o, "Not measured.\n");
        return;
    }
    let ds: Vec<f64> = crate::delay::DELAYS_US.to_vec();
    let _ = write!(
        o,
        "| app | input | N | time over TCP (s) | round trips waited per rank | slowest rank: fetches, lock, semaphore, barrier delays |"
    );
    for d in &ds {
        let _ = write!(o, " loss at D = {d:.0} us |");
    }
    let _ = writeln!(o, " status |\n{}|", "|---".repeat(7 + ds.len()));
    for row in &r.round_trips {
        let per_rank = if row.ranks.is_empty() {
            "not counted".to_string()
        } else {
            row.ranks
                .iter()
                .map(|w| format!("{:.0}", w.round_trips()))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let slowest = crate::delay::critical_rank(&row.ranks).map_or_else(
            || DASH.to_string(),
            |w| format!("rank {}: {}", w.rank, w.breakdown()),
        );
        let _ = write!(
            o,
            "| {} | {} | {} | {} | {per_rank} | {slowest} |",
            row.app,
            row.input,
            row.nodes,
            times(row.time)
        );
        for d in &ds {
            let cell = row.loss.iter().find(|(x, _)| x == d).map_or_else(
                || DASH.to_string(),
                |(_, l)| loss(*l, row.time.map(|t| t.median)),
            );
            let _ = write!(o, " {cell} |");
        }
        let _ = writeln!(o, " {} |", cell(&row.status));
    }
    let floor = r
        .primitives_tcp
        .rtt_us
        .map_or_else(String::new, |rtt| {
            format!(
                " The measured times already include this machine's loopback delay (half the TCP round trip of the primitives table: {:.1} us one way), so the loss at D is what a network with that one-way delay adds on top of a loopback run, less about that much per delay.",
                rtt / 2.0
            )
        });
    let _ = writeln!(
        o,
        "\nEach app runs with `DSM_TRANSPORT=tcp` (every link a socket, each rank its own copy of the pages, as between hosts), without `--race`; the row is the repetition whose slowest rank waited the median number of delays, and its ranks' counts come from the stats file. The model charges a one-way delay D per message a rank waited for: 2 per page fetch, 2 per acquire of a lock whose token was elsewhere when the manager grants or hands the request to the holder (3 when the manager forwards it to a third rank), the same for a semaphore wait, 1 per all-to-all barrier and 2 per barrier through the master (allocations and `finish` included); a round trip is 2 delays. The job loses what its slowest rank loses, since the ranks meet at barriers. It does not credit delays hidden behind waiting for a held lock, nor charge a delay passed on to the ranks queued behind a holder.{floor} `water ... --locks block` takes one lock per rank's block of molecules instead of one per molecule (the default, as water-nsquared): far fewer acquires, each holding its block for longer.\n"
    );
}

pub fn render(r: &Report) -> String {
    let mut o = String::new();
    header(&mut o, r);
    targets(&mut o, r);
    race_cost(&mut o, r);
    applications(&mut o, r);
    dynamic_metrics(&mut o, r);
    breakdown(&mut o, r);
    peers(&mut o, r);
    primitives(&mut o, r);
    speedup(&mut o, r);
    versus_threads(&mut o, r);
    slowdown_plot_and_plots_note(&mut o, r);
    round_trips(&mut o, r);
    notes_and_failures(&mut o, r);
    o
}

fn has_plot(r: &Report, name: &str) -> bool {
    r.plots.iter().any(|p| p == name)
}

/// The title, the machine and the conventions every table follows.
fn header(o: &mut String, r: &Report) {
    let m = &r.machine;
    let s = &r.settings;
    let _ = writeln!(o, "# dsm benchmark report\n");
    let _ = writeln!(
        o,
        "{} · mode `{}` · {} cores (nproc), {} · {}{} · {}took {:.0} s\n",
        r.date,
        s.mode,
        m.cores,
        m.cpu_model,
        m.kernel,
        m.memory_gib
            .map_or_else(String::new, |g| format!(", {g} GiB")),
        r.git
            .as_ref()
            .map_or_else(String::new, |g| format!("commit `{g}` · ")),
        r.duration_s
    );
    let _ = writeln!(
        o,
        "Runs with N greater than the {} cores are marked \\* (oversubscribed: ranks share cores, so their times measure scheduling as much as dsm). All nodes run on this one machine. With dsm's default transport, with or without `--race`, every rank maps one common segment: no page travels, locks are ticket locks in that shared memory (with `--race` each carries its last releaser's vector time), and only barrier and semaphore messages pass, through shared-memory rings. The race-cost table, the application tables, the breakdown, the speedups, the *dsm* columns of the dsm-vs-threads table and the first column of the DSM primitives run so. Columns marked rings (`DSM_TRANSPORT=rings`) give each rank its own copy of the pages, moved by the coherence protocol through shared-memory rings. Columns marked TCP (`DSM_TRANSPORT=tcp`) send everything over loopback TCP, as between hosts, each rank with its own copy of the pages. Times are each program's own timing of its parallel part; medians of the repetitions, with min{DASH}max in parentheses.\n",
        m.cores
    );
}

fn targets(o: &mut String, r: &Report) {
    let _ = writeln!(o, "## Targets\n");
    let _ = writeln!(o, "| target | goal | measured | met |\n|---|---|---|---|");
    for t in &r.targets {
        let met = match t.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not measured",
        };
        let note = if t.note.is_empty() {
            String::new()
        } else {
            format!(" ({})", t.note)
        };
        let _ = writeln!(
            o,
            "| {} | {} | {}{} | {met} |",
            t.name,
            t.goal,
            cell(&t.measured),
            cell(&note)
        );
    }
    o.push('\n');
}

/// Section 1, the paper's Table 1.
fn applications(o: &mut String, r: &Report) {
    let s = &r.settings;
    let _ = writeln!(o, "## 1. Applications (the paper's Table 1)\n");
    let _ = writeln!(
        o,
        "| app | input | N | shared memory (KB) | synchronization | intervals per barrier | race off (s) | race on (s) | slowdown | races reported | status |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for a in &r.apps {
        let _ = writeln!(
            o,
            "| {} | `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            a.app,
            a.input,
            nodes(a.nodes, a.oversubscribed),
            opt(a.shared_bytes, kb),
            if a.sync.is_empty() {
                DASH.to_string()
            } else {
                a.sync.join(", ")
            },
            opt(a.intervals_per_barrier, |x| format!("{x:.1}")),
            times(a.off),
            times(a.on),
            ratio(a.ratio),
            opt(a.races, |x| x.to_string()),
            cell(&a.status)
        );
    }
    let _ = writeln!(
        o,
        "\n*Slowdown* is the median of the ratios race-on / race-off of runs made back to back ({} repetitions{}; the order of the variants rotates between repetitions). *Shared memory* is the size of the app's shared allocations. *Synchronization* is read from the protocol counters: `barrier` when the app calls barriers beyond the one in each allocation and in `finish`, `lock` when it acquires locks. *Intervals per barrier* is the number of intervals closed, summed over all ranks, divided by the barriers and by N (the paper's figure counts its barrier as two intervals, ours as one). *Races reported*: by `--race` (TSP reads its bound without the lock on purpose).\n",
        s.reps,
        if s.reps_oversubscribed > 0 && s.reps_oversubscribed != s.reps {
            format!(", {} where N exceeds the cores", s.reps_oversubscribed)
        } else {
            String::new()
        }
    );
}

/// Section 2, the paper's Table 3.
fn dynamic_metrics(o: &mut String, r: &Report) {
    let _ = writeln!(o, "## 2. Dynamic metrics (the paper's Table 3)\n");
    if r.dynamic.is_empty() {
        let _ = writeln!(o, "No `--race` run succeeded.\n");
        return;
    }
    let _ = writeln!(
        o,
        "| app | N | intervals in a concurrent overlapping pair | bitmaps fetched | read/write notice bytes | interval comparison (ms) | bitmap round (ms) |\n|---|---|---|---|---|---|---|"
    );
    for d in &r.dynamic {
        let over = d.nodes > r.machine.cores;
        let counts = d.analysis.as_ref();
        let _ = writeln!(
            o,
            "| {} | {} | {}{} | {}{} | {}{} | {} | {} |",
            d.app,
            nodes(d.nodes, over),
            pct(d.intervals_in_overlap_pct),
            opt(counts, |a| format!(
                " ({} of {})",
                a.intervals_in_overlap, a.intervals
            )),
            pct(d.bitmaps_fetched_pct),
            opt(counts, |a| format!(
                " ({} of {})",
                a.bitmaps_wanted, a.bitmaps_total
            )),
            pct(d.notice_bytes_pct),
            opt(d.race_notice_bytes.zip(d.bytes_sent), |(n, b)| format!(
                " ({n} of {b} B)"
            )),
            opt(d.interval_comparison_ms, |x| format!("{x:.2}")),
            opt(d.bitmap_round_ms, |x| format!("{x:.2}")),
        );
    }
    let _ = writeln!(
        o,
        "\nFrom the `--race` runs' `DSM_STATS_FILE` summaries (medians over repetitions; counts of the median run). *Intervals*: the share of all intervals the barrier master analysed that belong to at least one concurrent pair whose page lists overlap. *Bitmaps fetched*: access bitmaps the master asked for, of all bitmaps recorded. *Notice bytes*: bytes of read/write notices in all messages, over all bytes sent, summed over ranks. The two times are rank 0's, summed over the run.\n"
    );
}

/// Section 3, the paper's Figure 3.
fn breakdown(o: &mut String, r: &Report) {
    let _ = writeln!(
        o,
        "## 3. Where the race-detection time goes (the paper's Figure 3)\n"
    );
    if r.breakdown.is_empty() {
        let _ = writeln!(o, "Not measured.\n");
        return;
    }
    let _ = writeln!(
        o,
        "| app | N | race off (s) | recording | protocol extras | interval comparison | bitmap round | total | status |\n|---|---|---|---|---|---|---|---|---|"
    );
    for b in &r.breakdown {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | **{}** | {} |",
            b.app,
            nodes(b.nodes, b.nodes > r.machine.cores),
            opt(b.median_s.get("off").copied(), secs),
            pct(b.recording_pct),
            pct(b.protocol_pct),
            with_timer(b.intervals_pct, b.timer_intervals_pct),
            with_timer(b.bitmaps_pct, b.timer_bitmaps_pct),
            pct(b.total_pct),
            cell(&b.status)
        );
    }
    let _ = writeln!(
        o,
        "\nEach app also ran with `DSM_RACE_PHASES` = `record` (accesses recorded, notices kept home), `notices` (+ read/write notices on the wire), `compare` (+ interval comparison at the master) and with the full detector (+ bitmap round). Each component is the difference between two consecutive phases of the same repetition (they run back to back), as a percentage of that repetition's race-off time, and the median of that over the repetitions; the components need not add up to the total, which is computed the same way, and a negative value is noise. *Timer*: rank 0's own clock of the interval comparison and of the bitmap round in the full runs, over the race-off time, as a cross-check of the differences.\n"
    );
    if has_plot(r, "breakdown.png") {
        let _ = writeln!(o, "![overhead breakdown](breakdown.png)\n");
    }
}

/// Section 4: the SOR comparison with other detectors, then the planted-race kernels.
fn peers(o: &mut String, r: &Report) {
    let _ = writeln!(o, "## 4. Against other race detectors\n");
    peers_on_sor(o, r);
    kernel_verdicts(o, r);
    if has_plot(r, "peers.png") {
        let _ = writeln!(o, "![slowdown of race detectors on SOR](peers.png)\n");
    }
}

fn peers_on_sor(o: &mut String, r: &Report) {
    let s = &r.settings;
    let _ = writeln!(
        o,
        "Red-black SOR `{}` with {} threads (C, `scripts/c/sor.c`) or {} dsm nodes.\n",
        s.peer_sor, s.peer_threads, s.peer_threads
    );
    let _ = writeln!(
        o,
        "| tool | program | time (s) | baseline (s) | slowdown | peak RSS (MB) | race reported on SOR | status |\n|---|---|---|---|---|---|---|---|"
    );
    for p in r.peers.iter().filter(|p| p.app.starts_with("sor")) {
        let rss = match (p.peak_rss_mb, p.peak_rss_sum_mb) {
            (Some(mx), Some(sum)) => format!("{mx:.1} per rank, {sum:.1} all ranks"),
            (Some(mx), None) => format!("{mx:.1}"),
            _ => DASH.into(),
        };
        let slow = match (p.slowdown, p.slowdown_min, p.slowdown_max) {
            (Some(x), Some(lo), Some(hi)) if hi > lo => {
                format!("**{x:.2}** ({lo:.2}{DASH}{hi:.2})")
            }
            (Some(x), _, _) => format!("**{x:.2}**"),
            _ => DASH.into(),
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            p.tool,
            p.app,
            opt(p.tool_s, secs),
            opt(p.base_s, secs),
            slow,
            rss,
            yes_no(p.found_race, p.expected_race),
            cell(&p.status)
        );
    }
    let _ = writeln!(
        o,
        "\nSlowdowns compare like with like: each tool's time over the plain C program's (same size, same threads), dsm `--race` over dsm without it (same size, same nodes); medians of paired repetitions ({} for C plain and TSan, {} for valgrind). Times are the programs' own timings of the iterations, so tool start-up is excluded. Peak RSS is `ru_maxrss` of the process tree's largest process (valgrind included); for dsm it is given per rank (the largest) and summed over ranks (each rank is a process mapping only what it touches; sampled `VmHWM` unless the runtime reports it). TSan: `gcc -O2 -g -fsanitize=thread`; Helgrind and DRD run the plain `-O2 -g` build. The *C row* is one C kernel both ways, alternating: `dsm-capi/c-apps/sor_threads.c` with threads (plain, and under TSan with libtsan) and `dsm-capi/c-apps/sor.c` built by `dsmcc` (the same compiler instrumentation, linked against libdsm) under `dsmrun` without and with `--race`.\n",
        s.peer_reps,
        if s.valgrind_reps > 0 { s.valgrind_reps.to_string() } else { "none".into() }
    );
}

/// The planted-race kernels: one row per kernel, one column per detector that ran it.
fn kernel_verdicts(o: &mut String, r: &Report) {
    let kernel_rows = || r.peers.iter().filter(|p| !p.app.starts_with("sor"));
    let mut kernels: Vec<&str> = kernel_rows().map(|p| p.app.as_str()).collect();
    kernels.dedup();
    if kernels.is_empty() {
        return;
    }
    let mut tools: Vec<&str> = Vec::new();
    for p in kernel_rows() {
        if !tools.contains(&p.tool.as_str()) {
            tools.push(&p.tool);
        }
    }
    let _ = writeln!(
        o,
        "Planted races: dsm's `race-kernel` under `dsmrun -n {} --race` and the C translations in `scripts/c/kernels.c` ({} threads) under each detector. ✓ = the right verdict.\n",
        r.settings.kernel_nodes, r.settings.peer_threads
    );
    let _ = write!(o, "| kernel | has a race |");
    for t in &tools {
        let _ = write!(o, " {t} |");
    }
    let _ = write!(o, "\n|---|---|");
    for _ in &tools {
        o.push_str("---|");
    }
    o.push('\n');
    for k in &kernels {
        let rows: Vec<&PeerRow> = r.peers.iter().filter(|p| p.app == *k).collect();
        let expected = rows.iter().find_map(|p| p.expected_race);
        let _ = write!(
            o,
            "| `{k}` | {} |",
            opt(expected, |e| (if e { "yes" } else { "no" }).into())
        );
        for t in &tools {
            let c = match rows.iter().find(|p| p.tool == *t) {
                Some(p) if p.status == "ok" => yes_no(p.found_race, p.expected_race),
                Some(p) if p.status.starts_with("not run") => "not run".into(),
                Some(p) => cell(&p.status),
                None => DASH.into(),
            };
            let _ = write!(o, " {c} |");
        }
        o.push('\n');
    }
    let missing: Vec<String> = r
        .peers
        .iter()
        .filter(|p| p.status.starts_with("not run: "))
        .map(|p| format!("{}: {}", p.tool, p.status.trim_start_matches("not run: ")))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !missing.is_empty() {
        let _ = writeln!(o, "\nNot run: {}.", missing.join("; "));
    }
    o.push('\n');
}

/// The primitives table's rows other than the barriers: label, whether the common segment
/// times a plain access instead of a fault, and the figure.
type PrimitiveRow = (&'static str, bool, fn(&Primitives) -> Option<f64>);

const PRIMITIVE_ROWS: [PrimitiveRow; 6] = [
    (
        "loopback TCP round trip between two ranks (plain sockets)",
        false,
        |x| x.rtt_us,
    ),
    (
        "remote page fault (fetch a page from its home)",
        true,
        |x| x.remote_fault_us,
    ),
    ("local write fault (twin, no message)", true, |x| {
        x.write_fault_us
    }),
    ("lock acquire (free, remotely managed)", false, |x| {
        x.lock_acquire_us
    }),
    ("lock hand-off carrying one page of changes", false, |x| {
        x.lock_handoff_page_us
    }),
    (
        "lock hand-offs while both nodes poll one lock (mean)",
        false,
        |x| x.lock_handoff_us,
    ),
];

/// Writes primitives-table rows: the rings and TCP figures also in their own run's round
/// trips.
struct PrimitivesTable<'a> {
    o: &'a mut String,
    rtt: f64,
    tcp_rtt: f64,
}

impl PrimitivesTable<'_> {
    /// `no_fault`: in the common segment the page is already mapped, and the fault row
    /// times a plain access.
    fn row(
        &mut self,
        name: &str,
        common: Option<f64>,
        no_fault: bool,
        rings: Option<f64>,
        tcp: Option<f64>,
    ) {
        let _ = writeln!(
            self.o,
            "| {name} | {} | {} | {} | {} | {} |",
            opt(common, |x| format!(
                "{}{}",
                common_us(x),
                if no_fault { " (no fault)" } else { "" }
            )),
            opt(rings, |x| format!("{x:.1}")),
            opt(rings, |x| format!("{:.2}", x / self.rtt)),
            opt(tcp, |x| format!("{x:.1}")),
            opt(tcp, |x| format!("{:.2}", x / self.tcp_rtt))
        );
    }
}

/// Section 5.
fn primitives(o: &mut String, r: &Report) {
    let _ = writeln!(o, "## 5. DSM primitives\n");
    let p = &r.primitives;
    let t = &r.primitives_tcp;
    let c = &r.primitives_common;
    if [p, t, c].iter().all(|x| x.rtt_us.is_none()) {
        let _ = writeln!(o, "{}\n", cell(&p.status));
        return;
    }
    let _ = writeln!(
        o,
        "| operation | one common segment, default (us) | shared-memory rings, `DSM_TRANSPORT=rings` (us) | in TCP round trips | over TCP (us) | in TCP round trips |\n|---|---|---|---|---|---|"
    );
    let mut table = PrimitivesTable {
        o: &mut *o,
        rtt: p.rtt_us.unwrap_or(f64::NAN),
        tcp_rtt: t.rtt_us.unwrap_or(f64::NAN),
    };
    for (name, no_fault, figure) in PRIMITIVE_ROWS {
        table.row(name, figure(c), no_fault, figure(p), figure(t));
    }
    // Node counts in numeric order, each once, whichever run measured it.
    let mut counts: Vec<&String> = [p, c, t].iter().flat_map(|x| x.barrier_us.keys()).collect();
    counts.sort_by_key(|n| (n.parse::<usize>().unwrap_or(usize::MAX), n.as_str()));
    counts.dedup();
    for n in counts {
        let over = n.parse::<usize>().is_ok_and(|k| k > r.machine.cores);
        let label = format!("barrier, N = {n}{}", if over { "\\*" } else { "" });
        let at = |x: &Primitives| x.barrier_us.get(n).copied();
        table.row(&label, at(c), false, at(p), at(t));
    }
    let _ = writeln!(
        o,
        "\nFrom `dsm-bench --reps {}`, run three times in each repetition. First with the default transport (`DSM_TRANSPORT=auto`): every rank on this host maps one common segment, locks are ticket locks in that shared memory, and no page faults, so the remote fault and local write fault rows time a read and a write of a page that is already mapped, and a lock hand-off moves no page (the changes are already in the segment). Then over shared-memory rings (`DSM_TRANSPORT=rings`: messages through shared-memory rings, each rank its own copy of the pages, moved by the coherence protocol), and with `DSM_TRANSPORT=tcp` (every link over loopback TCP, as between hosts). Every run measures the plain loopback TCP round trip between the two ranks' processes. The rings and TCP columns are also given in the round trips of their own run; the default column in microseconds only. A round trip through a shared-memory ring is printed by `cargo run --release -p dsm-net --example ring_rtt` (on the development VM 4.6-5.5 us at quiet moments, about 48 us when its wake-ups were slow, with loopback TCP at 14-17 and 64-69 us). Each figure is the median over {} runs of each run's median (a run disturbed by other load is slow throughout). Over TCP a remote fault costs at least a round trip plus a local fault: over shared-memory rings it is {} of that floor.\n",
        r.settings.bench_reps,
        p.runs.max(c.runs).max(t.runs),
        opt(p.remote_fault_vs_floor, |x| format!("{x:.2}x"))
    );
}

/// Section 6.
fn speedup(o: &mut String, r: &Report) {
    let _ = writeln!(o, "## 6. Speedup\n");
    if r.speedup.is_empty() {
        let _ = writeln!(o, "Not measured.\n");
        return;
    }
    let _ = writeln!(
        o,
        "| app | N | parallel (s) | sequential (s) | speedup vs sequential | vs N = 1 | status |\n|---|---|---|---|---|---|---|"
    );
    for sp in &r.speedup {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} |",
            sp.app,
            nodes(sp.nodes, sp.oversubscribed),
            opt(sp.parallel_s, secs),
            opt(sp.sequential_s, secs),
            opt(sp.speedup, |x| format!("{x:.2}")),
            opt(sp.self_relative, |x| format!("{x:.2}")),
            cell(&sp.status)
        );
    }
    let _ = writeln!(
        o,
        "\nRace detection off; the sequential time is the app's own plain sequential implementation of the same computation (local memory, no DSM; for TSP, Held-Karp), timed in the same runs and, like the parallel time, without the setup. The paper's inputs are small for today's CPUs, so the DSM's per-barrier and per-fault costs weigh heavily.\n"
    );
    if has_plot(r, "speedup.png") {
        let _ = writeln!(o, "![speedup](speedup.png)\n");
    }
}

/// Section 7: dsm against plain threads.
fn versus_threads(o: &mut String, r: &Report) {
    let _ = writeln!(o, "## 7. dsm vs threads\n");
    if r.threads.is_empty() {
        let _ = writeln!(o, "Not measured.\n");
        return;
    }
    let _ = writeln!(
        o,
        "| app | input | N | sequential (s) | threads (s) | dsm (s) | dsm / threads | dsm, rings (s) | dsm rings / threads | dsm over TCP (s) | TCP / threads | speedup: threads, dsm | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for t in &r.threads {
        let _ = writeln!(
            o,
            "| {} | `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}, {} | {} |",
            t.app,
            cell(&t.input),
            nodes(t.nodes, t.oversubscribed),
            opt(t.sequential_s, secs),
            times(t.threads),
            times(t.dsm),
            ratio(t.ratio),
            times(t.dsm_rings),
            ratio(t.ratio_rings),
            times(t.dsm_tcp),
            ratio(t.ratio_tcp),
            opt(t.threads_speedup, |x| format!("{x:.2}")),
            opt(t.dsm_speedup, |x| format!("{x:.2}")),
            cell(&t.status)
        );
    }
    let _ = writeln!(
        o,
        "\nScaled inputs, race detection off, measured in the same run with the four kinds alternating ({} each). *threads* is the same kernel split over N plain threads of one process (`--threads N`: rows or planes banded as across dsm's nodes, a barrier between phases, bitwise the sequential result): the limit for N ranks on one host. *dsm* is `dsmrun -n N` with the default transport: on one host every rank maps one common segment, so no page travels, and only synchronization messages pass, through shared-memory rings. *dsm, rings* is the same with `DSM_TRANSPORT=rings`: each rank its own copy of the pages, moved by the coherence protocol through shared-memory rings. *dsm over TCP* is the same with `DSM_TRANSPORT=tcp`: each rank its own copy of the pages, and every link over loopback TCP, as between hosts. *sequential* is the app's plain optimised sequential code, timed in every run of every kind. **dsm / threads** is the ratio that matters: the median of the per-repetition ratios, with min{DASH}max; the rings and TCP ratios are taken the same way. *speedup* is the sequential time over the threads' and over dsm's with the default transport.\n",
        repetitions(r.settings.vs_threads_reps)
    );
}

/// "1 repetition", "7 repetitions".
fn repetitions(n: usize) -> String {
    match n {
        1 => "1 repetition".to_string(),
        n => format!("{n} repetitions"),
    }
}

fn slowdown_plot_and_plots_note(o: &mut String, r: &Report) {
    if has_plot(r, "slowdown.png") {
        let _ = writeln!(o, "![race-detection slowdown per app](slowdown.png)\n");
    }
    if let Some(n) = &r.plots_note {
        let _ = writeln!(o, "**Plots not produced:** {}\n", cell(n));
    }
}

/// The closing section, present only when there is something to list.
fn notes_and_failures(o: &mut String, r: &Report) {
    if !r.notes.is_empty() || !r.not_run.is_empty() || !r.failures.is_empty() {
        let _ = writeln!(o, "## Notes, parts not run, failures\n");
    }
    for n in &r.notes {
        let _ = writeln!(o, "- {n}");
    }
    for n in &r.not_run {
        let _ = writeln!(o, "- Not run: {n}");
    }
    if !r.notes.is_empty() || !r.not_run.is_empty() {
        o.push('\n');
    }
    if r.failures.is_empty() {
        return;
    }
    let total: usize = r.failures.iter().map(|f| f.count.max(1)).sum();
    let _ = writeln!(o, "{total} run(s) failed:\n");
    for f in &r.failures {
        let more = match f.count {
            0 | 1 => String::new(),
            n => format!(" (and {} more runs of it with the same error)", n - 1),
        };
        let _ = writeln!(
            o,
            "- **{}**{more}: {}\n\n  ```text\n  $ {}",
            f.what, f.error, f.command
        );
        for l in f.stderr_tail.lines() {
            let _ = writeln!(o, "  {l}");
        }
        let _ = writeln!(o, "  ```\n");
    }
}

/// The short summary printed on stdout at the end of a run.
pub fn summary(r: &Report) -> String {
    let mut o = String::from("dsm benchmark targets:\n");
    for t in &r.targets {
        let met = match t.met {
            Some(true) => "MET",
            Some(false) => "NOT MET",
            None => "NOT MEASURED",
        };
        let note = if t.note.is_empty() {
            String::new()
        } else {
            format!(" [{}]", t.note)
        };
        let _ = writeln!(
            o,
            "  {met:<12} {}: {} (goal {}){note}",
            t.name, t.measured, t.goal
        );
    }
    let ratios: Vec<String> = r
        .threads
        .iter()
        .filter_map(|t| {
            t.ratio.map(|x| {
                let others: Vec<String> = [("rings", t.ratio_rings), ("TCP", t.ratio_tcp)]
                    .into_iter()
                    .filter_map(|(name, y)| Some(format!("{name} {:.2}x", y?.median)))
                    .collect();
                let others = if others.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", others.join(", "))
                };
                format!("{} {} {:.2}x{others}", t.app, t.input, x.median)
            })
        })
        .collect();
    if !ratios.is_empty() {
        let n = r.threads.first().map_or(0, |t| t.nodes);
        let _ = writeln!(o, "  dsm / threads at N = {n}: {}", ratios.join("; "));
    }
    if !r.failures.is_empty() {
        let total: usize = r.failures.iter().map(|f| f.count.max(1)).sum();
        let _ = writeln!(o, "  {total} run(s) failed: see the report");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> Report {
        serde_json::from_str(include_str!("../tests/data/report.json")).expect("fixture parses")
    }

    #[test]
    fn renders_every_section() {
        let md = render(&fixture());
        for h in [
            "# dsm benchmark report",
            "## Targets",
            "## 1. Applications",
            "## 2. Dynamic metrics",
            "## 3. Where the race-detection time goes",
            "## 4. Against other race detectors",
            "## 5. DSM primitives",
            "## 6. Speedup",
            "## 7. dsm vs threads",
        ] {
            assert!(md.contains(h), "missing {h}");
        }
    }

    #[test]
    fn dsm_vs_threads_table_and_summary() {
        let r = fixture();
        let md = render(&r);
        assert!(
            md.contains("| sor | `--size 2048 --iters 50` | 2 | 0.420 | 0.230 (0.220–0.250) | 0.310 (0.290–0.360) | **1.35** (1.20–1.50) | 0.330 (0.300–0.380) | **1.43** (1.30–1.60) | 0.400 (0.380–0.450) | **1.74** (1.60–1.90) | 1.83, 1.35 | ok |"),
            "{md}"
        );
        assert!(md.contains(
            "| fft | `--dims 128x128x64` | 2 | – | – | – | – | – | – | – | – | –, – | failed |"
        ));
        assert!(md.contains(
            "| dsm / threads | dsm, rings (s) | dsm rings / threads | dsm over TCP (s) |"
        ));
        assert!(md.contains("with the four kinds alternating (5 repetitions each)"));
        let s = summary(&r);
        assert!(
            s.contains(
                "dsm / threads at N = 2: sor --size 2048 --iters 50 1.35x (rings 1.43x, TCP 1.74x)\n"
            ),
            "{s}"
        );
        // A report from before the rings column: the row renders with dashes there.
        let mut old = r.clone();
        old.threads[0].dsm_rings = None;
        old.threads[0].ratio_rings = None;
        assert!(render(&old).contains("| **1.35** (1.20–1.50) | – | – | 0.400 (0.380–0.450) |"));
        assert!(summary(&old).contains(" 1.35x (TCP 1.74x)\n"));
        let mut empty = r.clone();
        empty.threads.clear();
        assert!(render(&empty).contains("## 7. dsm vs threads\n\nNot measured."));
        assert!(!summary(&empty).contains("dsm / threads"));
    }

    #[test]
    fn race_cost_note_says_how_many_repetitions() {
        let mut r = fixture();
        let s = |median: f64| crate::stats::Summary {
            median,
            min: median,
            max: median,
            n: 7,
        };
        r.race_cost = vec![RaceCostRow {
            app: "sor".into(),
            input: "--size 1024 --iters 50".into(),
            nodes: 2,
            transport: "tcp".into(),
            off: Some(s(0.05)),
            on: Some(s(0.06)),
            ratio: Some(s(1.2)),
            status: "ok".into(),
        }];
        let md = render(&r);
        assert!(
            md.contains("apps' own parallel times (7 repetitions)."),
            "{md}"
        );
    }

    #[test]
    fn primitives_with_the_common_segment_first() {
        let mut r = fixture();
        // The fixture predates the common segment column: dashes there.
        assert_eq!(r.primitives_common, Primitives::default());
        let md = render(&r);
        assert!(
            md.contains("| operation | one common segment, default (us) | shared-memory rings, `DSM_TRANSPORT=rings` (us) | in TCP round trips | over TCP (us) | in TCP round trips |\n|---|---|---|---|---|---|\n"),
            "{md}"
        );
        assert!(
            md.contains(
                "| remote page fault (fetch a page from its home) | – | 47.4 | 1.17 | – | – |"
            ),
            "{md}"
        );
        assert!(md.contains("| barrier, N = 8\\* | – | 262.4 | 6.46 | – | – |"));
        assert!(md.contains("run three times in each repetition"));
        assert!(md.contains("median over 3 runs"));
        r.primitives_common = Primitives {
            status: "ok".into(),
            rtt_us: Some(38.2),
            remote_fault_us: Some(0.02),
            write_fault_us: Some(0.01),
            lock_acquire_us: Some(0.04),
            lock_handoff_page_us: Some(0.06),
            barrier_us: [("2".to_string(), 4.5), ("16".to_string(), 30.0)].into(),
            runs: 3,
            ..Primitives::default()
        };
        let md = render(&r);
        for line in [
            "| loopback TCP round trip between two ranks (plain sockets) | 38.2 | 40.6 | 1.00 | – | – |",
            "| remote page fault (fetch a page from its home) | 0.02 (no fault) | 47.4 | 1.17 | – | – |",
            "| local write fault (twin, no message) | 0.01 (no fault) | 16.9 | 0.42 | – | – |",
            "| lock acquire (free, remotely managed) | 0.04 | 31.1 | 0.77 | – | – |",
            "| lock hand-off carrying one page of changes | 0.06 | – | – | – | – |",
            "| lock hand-offs while both nodes poll one lock (mean) | – | 79.3 | 1.95 | – | – |",
            // A count only the common segment run measured still gets its row, in order.
            "| barrier, N = 2 | 4.50 | 51.1 | 1.26 | – | – |\n| barrier, N = 4\\* | – | 94.4 | 2.33 | – | – |\n| barrier, N = 8\\* | – | 262.4 | 6.46 | – | – |\n| barrier, N = 16\\* | 30.0 | – | – | – | – |\n",
        ] {
            assert!(md.contains(line), "missing {line}\n{md}");
        }
        // Only the common segment measured: the table still shows.
        r.primitives = Primitives {
            status: "failed".into(),
            ..Primitives::default()
        };
        let md = render(&r);
        assert!(md.contains("| remote page fault (fetch a page from its home) | 0.02 (no fault) | – | – | – | – |"), "{md}");
        r.primitives_common = Primitives::default();
        assert!(render(&r).contains("## 5. DSM primitives\n\nfailed\n"));
    }

    #[test]
    fn machine_and_oversubscription_are_stated() {
        let md = render(&fixture());
        assert!(md.contains("2 cores (nproc), AMD EPYC 7B13 · Linux 6.1.0"));
        assert!(md.contains("2024-05-01 12:00:00 UTC"));
        // N = 8 on 2 cores is marked.
        assert!(md.contains("| sor | `--size 512 --iters 100` | 8\\* |"));
        assert!(md.contains("| barrier, N = 8\\* |"));
    }

    #[test]
    fn app_rows_show_median_and_spread() {
        let md = render(&fixture());
        assert!(
            md.contains("| sor | `--size 512 --iters 100` | 2 | 2048 | barrier | 1.0 | 0.0700 (0.0650–0.0800) | 0.0850 (0.0800–0.0900) | **1.21** (1.10–1.30) | 0 | ok |"),
            "{md}"
        );
        assert!(md.contains("| fft | `--dims 64x64x16` | 2 | – | – | – | – | – | – | – | not run: binary not found (target/release/fft) |"));
    }

    #[test]
    fn targets_and_failures() {
        let r = fixture();
        let md = render(&r);
        assert!(md.contains("| remote page fault vs loopback round trip + local fault | <= 2x | 0.82x (47.4 us vs 40.6 + 16.9 us) | yes |"));
        assert!(md.contains("not measured"));
        assert!(md.contains("- **water N=2 race (rep 1)** (and 2 more runs of it with the same error): no `verified:` line from rank 0"));
        assert!(md.contains("3 run(s) failed:"));
        assert!(md.contains("median over 3 runs"));
        assert!(md.contains("| sor | 2 | 0.0700 | 7.1% | 2.9% | 1.4% (timer 0.8%) | 10% (timer 15%) | **21%** | ok |"), "{md}");
        assert!(md.contains("  $ dsmrun -n 2 --race water"));
        let s = summary(&r);
        assert!(s.contains("MET"));
        assert!(s.contains("NOT MEASURED"));
        assert!(s.contains("3 run(s) failed"));
    }

    #[test]
    fn kernel_matrix_marks_verdicts() {
        let md = render(&fixture());
        assert!(
            md.contains("| kernel | has a race | dsm --race | ThreadSanitizer |"),
            "{md}"
        );
        assert!(md.contains("| `tsp-bound` | yes | race ✓ | race ✓ |"));
        assert!(md.contains("| `false-sharing` | no | none ✓ | race ✗ (false alarm) |"));
        assert!(md.contains("| ThreadSanitizer | sor --size 512 --iters 100 (C, pthreads) | 2.000 | 0.0400 | **50.00** (45.00–55.00) | 30.0 | none ✓ | ok |"));
        assert!(md.contains("4.0 per rank, 7.5 all ranks"));
    }

    #[test]
    fn plots_or_the_reason_they_are_missing() {
        let mut r = fixture();
        assert!(render(&r).contains("![overhead breakdown](breakdown.png)"));
        r.plots.clear();
        r.plots_note = Some("matplotlib is not installed".into());
        let md = render(&r);
        assert!(!md.contains("breakdown.png"));
        assert!(md.contains("**Plots not produced:** matplotlib is not installed"));
    }

    #[test]
    fn report_json_round_trips() {
        let r = fixture();
        let text = serde_json::to_string(&r).unwrap();
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        // The fields other tools read.
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let a = &v["apps"][0];
        for k in ["app", "nodes", "race_off_s", "race_on_s", "race_ratio"] {
            assert!(a.get(k).is_some(), "apps[].{k}");
        }
        for k in ["rtt_us", "remote_fault_us", "lock_acquire_us", "barrier_us"] {
            assert!(v["primitives"].get(k).is_some(), "primitives.{k}");
        }
        for k in ["tool", "app", "slowdown", "peak_rss_mb", "found_race"] {
            assert!(v["peers"][0].get(k).is_some(), "peers[].{k}");
        }
        assert!(v["primitives_common"].get("remote_fault_us").is_some());
        // Rows written before the rings column (the fixture's fft row) still load.
        assert_eq!(
            (r.threads[1].dsm_rings, r.threads[1].ratio_rings),
            (None, None)
        );
        assert!(v["threads"][0].get("ratio_rings").is_some());
    }
}
