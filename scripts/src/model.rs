//! The data of a benchmark run: the jobs the suite plans, what each run produced, and the
//! report (`latest.json`) derived from them. Everything here is plain serde data so the
//! report can be re-rendered, and tested, from JSON alone.

use crate::parse::{Analysis, BenchFigures, JobStats, Tool};
use crate::stats::Summary;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How much of the race detector runs in an app job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// No `--race`.
    Off,
    /// `--race` with `DSM_RACE_PHASES=record`: accesses recorded, no notices sent.
    Record,
    /// `DSM_RACE_PHASES=notices`: read/write notices travel too.
    Notices,
    /// `DSM_RACE_PHASES=compare`: the master also compares intervals.
    Compare,
    /// `--race` as a user runs it (bitmap round included).
    On,
}

impl Variant {
    pub fn race(self) -> bool {
        self != Variant::Off
    }

    /// Value of `DSM_RACE_PHASES`, for the partial detector variants only.
    pub fn phases_env(self) -> Option<&'static str> {
        match self {
            Variant::Record => Some("record"),
            Variant::Notices => Some("notices"),
            Variant::Compare => Some("compare"),
            Variant::Off | Variant::On => None,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Variant::Off => "off",
            Variant::Record => "race:record",
            Variant::Notices => "race:notices",
            Variant::Compare => "race:compare",
            Variant::On => "race",
        }
    }
}

/// Why an app job is run (the same app and N can serve several tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Purpose {
    /// Tables 1 and 3 and the breakdown (the apps' benchmark input).
    Table,
    /// Extra node counts for the speedup plot.
    Speedup,
    /// The cost of `--race` as a user sees it: the same command with and without it, on
    /// the default transport (and, beside it, over rings and TCP).
    RaceCost,
    /// The round-trip model's counts: every link over TCP, each rank its own copy of the
    /// pages, as across hosts (and the apps' locking options beside their defaults).
    #[serde(rename = "roundtrips")]
    RoundTrips,
}

/// How a "dsm vs threads" job runs its kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runner {
    /// `app --threads N args`: plain threads of one process, no DSM.
    Threads,
    /// `dsmrun -n N app args`: the default transport (`DSM_TRANSPORT=auto`). On one host,
    /// race detection off, every rank maps one common segment: no page travels, only
    /// synchronization messages, through shared-memory rings.
    Dsm,
    /// `DSM_TRANSPORT=rings dsmrun -n N app args`: messages through shared-memory rings,
    /// but each rank its own copy of the pages, moved by the coherence protocol.
    DsmRings,
    /// `DSM_TRANSPORT=tcp dsmrun -n N app args`: every link over loopback TCP, each rank
    /// its own copy of the pages.
    DsmTcp,
}

impl Runner {
    pub fn label(self) -> &'static str {
        match self {
            Runner::Threads => "threads",
            Runner::Dsm => "dsm",
            Runner::DsmRings => "dsm-rings",
            Runner::DsmTcp => "dsm-tcp",
        }
    }
}

/// How a job of the C row runs the C SOR of `dsm-capi/c-apps`: the same kernel as C on dsm
/// (`sor.c`, built by `dsmcc`) and with POSIX threads (`sor_threads.c`, built by gcc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CRunner {
    /// `sor_threads T N ITERS`, plain `gcc -O2`.
    Threads,
    /// The same under ThreadSanitizer (`gcc -O2 -g -fsanitize=thread`, libtsan).
    ThreadsTsan,
    /// `dsmrun -n T sor N ITERS` (instrumented, hooks returning at once).
    Dsm,
    /// `dsmrun -n T --race sor N ITERS`.
    DsmRace,
}

impl CRunner {
    /// In the order of a repetition (rotated from one to the next).
    pub const ALL: [CRunner; 4] = [
        CRunner::Threads,
        CRunner::ThreadsTsan,
        CRunner::Dsm,
        CRunner::DsmRace,
    ];

    /// Its tool column in the report: marked "(C row)", so that it is told from the rows
    /// of the same tools above it (and the plot, which skips baselines by "plain" and "no
    /// --race", does not merge bars of one name).
    pub fn label(self) -> &'static str {
        match self {
            CRunner::Threads => "plain (C row)",
            CRunner::ThreadsTsan => "ThreadSanitizer (C row)",
            CRunner::Dsm => "dsm no --race (C row)",
            CRunner::DsmRace => "dsm --race (C row)",
        }
    }

    /// Whether it runs on dsm (ranks) rather than threads.
    pub fn dsm(self) -> bool {
        matches!(self, CRunner::Dsm | CRunner::DsmRace)
    }

    /// The runner it is compared with: the same program without the detector.
    pub fn baseline(self) -> CRunner {
        if self.dsm() {
            CRunner::Dsm
        } else {
            CRunner::Threads
        }
    }
}

/// The transport of a `dsm-bench` run (section 5 of the report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchTransport {
    /// The default (`DSM_TRANSPORT=auto`): on one host, every rank maps one common
    /// segment, nothing faults and locks are ticket locks in shared memory.
    Common,
    /// `DSM_TRANSPORT=rings`: messages through shared-memory rings, each rank its own copy
    /// of the pages, moved by the coherence protocol.
    Rings,
    /// `DSM_TRANSPORT=tcp`: every link over loopback TCP, each rank its own copy of the
    /// pages.
    Tcp,
}

impl BenchTransport {
    /// In the order the suite runs them in each repetition.
    pub const ALL: [BenchTransport; 3] = [
        BenchTransport::Common,
        BenchTransport::Rings,
        BenchTransport::Tcp,
    ];

    /// The value of `DSM_TRANSPORT`.
    pub fn env(self) -> &'static str {
        match self {
            BenchTransport::Common => "auto",
            BenchTransport::Rings => "rings",
            BenchTransport::Tcp => "tcp",
        }
    }
}

/// One run the suite makes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Job {
    /// `dsmrun -n nodes [--race] app args`.
    App {
        app: String,
        purpose: Purpose,
        nodes: usize,
        variant: Variant,
        rep: usize,
        args: Vec<String>,
        /// `DSM_TRANSPORT` of the run; `None`: the default a user gets (`auto`).
        #[serde(default)]
        transport: Option<String>,
    },
    /// The C SOR under a tool (or plain).
    CSor {
        tool: Tool,
        size: usize,
        iters: usize,
        threads: usize,
        rep: usize,
    },
    /// The C SOR of `dsm-capi/c-apps` (the C row): `nodes` ranks or threads.
    CApp {
        runner: CRunner,
        size: usize,
        iters: usize,
        nodes: usize,
        rep: usize,
    },
    /// A C race kernel under a detector.
    CKernel {
        tool: Tool,
        kernel: String,
        threads: usize,
    },
    /// `dsmrun -n nodes --race race-kernel run kernel`.
    DsmKernel { kernel: String, nodes: usize },
    /// `dsm-bench --reps reps`, repeated: under `DSM_TRANSPORT=rings`, with `tcp` under
    /// `DSM_TRANSPORT=tcp`, or with `common` under the default (`DSM_TRANSPORT=auto`: on
    /// one host one common segment, where nothing faults). See [`Job::bench_transport`].
    Primitives {
        reps: usize,
        rep: usize,
        #[serde(default)]
        tcp: bool,
        #[serde(default)]
        common: bool,
    },
    /// An app on a scaled input, either over N plain threads or on dsm at N nodes (race
    /// detection off), for the "dsm vs threads" table.
    VsThreads {
        app: String,
        args: Vec<String>,
        nodes: usize,
        runner: Runner,
        rep: usize,
    },
}

impl Job {
    /// A `dsm-bench` run over `transport`.
    pub fn primitives(reps: usize, rep: usize, transport: BenchTransport) -> Job {
        Job::Primitives {
            reps,
            rep,
            tcp: transport == BenchTransport::Tcp,
            common: transport == BenchTransport::Common,
        }
    }

    /// The transport of a `dsm-bench` run (`None` for other jobs): `common` wins over
    /// `tcp`, which the suite never sets together.
    pub fn bench_transport(&self) -> Option<BenchTransport> {
        match self {
            Job::Primitives { common: true, .. } => Some(BenchTransport::Common),
            Job::Primitives { tcp: true, .. } => Some(BenchTransport::Tcp),
            Job::Primitives { .. } => Some(BenchTransport::Rings),
            _ => None,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Job::App {
                app,
                nodes,
                variant,
                rep,
                args,
                ..
            } => format!(
                "{app} {} N={nodes} {} (rep {})",
                args.join(" "),
                variant.label(),
                rep + 1
            )
            .replace("  ", " "),
            Job::CSor {
                tool,
                size,
                iters,
                threads,
                rep,
            } => format!(
                "C sor {size}x{size} {iters} iters T={threads} under {} (rep {})",
                tool.label(),
                rep + 1
            ),
            Job::CApp {
                runner,
                size,
                iters,
                nodes,
                rep,
            } => format!(
                "C sor (c-apps) {size}x{size} {iters} iters N={nodes} {} (rep {})",
                runner.label(),
                rep + 1
            ),
            Job::CKernel {
                tool,
                kernel,
                threads,
            } => format!("C kernel {kernel} T={threads} under {}", tool.label()),
            Job::DsmKernel { kernel, nodes } => {
                format!("race-kernel {kernel} N={nodes} --race")
            }
            Job::Primitives { reps, rep, .. } => format!(
                "DSM_TRANSPORT={} dsm-bench --reps {reps} (run {})",
                self.bench_transport()
                    .unwrap_or(BenchTransport::Rings)
                    .env(),
                rep + 1
            ),
            Job::VsThreads {
                app,
                args,
                nodes,
                runner,
                rep,
            } => format!(
                "{app} {} N={nodes} {} (rep {})",
                args.join(" "),
                runner.label(),
                rep + 1
            ),
        }
    }
}

/// What one run produced.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub ok: bool,
    /// Why the run counts as failed (exit status, missing line, timeout...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The end of its stderr, kept for failed runs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stderr_tail: String,
    pub wall_s: f64,
    /// The program's own timing of its parallel part (apps: `parallel X s`; C: `time X s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequential_s: Option<f64>,
    /// Peak RSS over the whole process tree (the largest single process), KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rss_kb: Option<u64>,
    /// Peak RSS of each dsm rank, KiB (from the stats file, or sampled).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_rss_kb: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<JobStats>,
    /// Races dsm reported (its end-of-job summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub races: Option<u64>,
    /// A detector's verdict (peers and kernels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found_race: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bench: Option<serde_json::Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub job: Job,
    pub outcome: Outcome,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
    pub kernel: String,
    #[serde(default)]
    pub memory_gib: Option<f64>,
}

/// The inputs and repetition counts a run used.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub mode: String,
    /// Repetitions (off/on pairs) per app at N within the core count...
    pub reps: usize,
    /// ...and at larger N.
    #[serde(default)]
    pub reps_oversubscribed: usize,
    /// Node counts of the application table.
    pub table_nodes: Vec<usize>,
    /// Node counts of the table that this mode skips (their rows say so).
    pub skipped_nodes: Vec<usize>,
    /// Node counts at which the detector's phases are timed (overhead breakdown).
    pub breakdown_nodes: Vec<usize>,
    pub speedup_nodes: Vec<usize>,
    /// App name -> its arguments in the table.
    pub inputs: BTreeMap<String, String>,
    pub peer_sor: String,
    pub peer_threads: usize,
    pub peer_reps: usize,
    pub valgrind_sor: String,
    pub valgrind_reps: usize,
    pub kernel_nodes: usize,
    pub bench_reps: usize,
    /// The "dsm vs threads" table: app and its scaled input (arguments)...
    #[serde(default)]
    pub vs_threads: Vec<(String, String)>,
    /// ...at this N (threads and nodes)...
    #[serde(default)]
    pub vs_threads_nodes: usize,
    /// ...with this many alternating repetitions of each.
    #[serde(default)]
    pub vs_threads_reps: usize,
}

/// One row of the application table (Table 1), with the race-detection slowdown.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AppRow {
    pub app: String,
    pub nodes: usize,
    pub oversubscribed: bool,
    pub input: String,
    /// `"ok"`, `"failed"` or `"not run: <reason>"`.
    pub status: String,
    pub race_off_s: Option<f64>,
    pub race_on_s: Option<f64>,
    /// Median of the paired on/off ratios.
    pub race_ratio: Option<f64>,
    pub off: Option<Summary>,
    pub on: Option<Summary>,
    pub ratio: Option<Summary>,
    pub shared_bytes: Option<u64>,
    pub sync: Vec<String>,
    pub barriers: Option<u64>,
    pub lock_acquires: Option<u64>,
    /// Intervals closed, summed over ranks, per barrier per node.
    pub intervals_per_barrier: Option<f64>,
    /// Races reported with `--race` (median over repetitions).
    pub races: Option<u64>,
}

/// Table 3: the detector's dynamic metrics, from the `--race` runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DynamicRow {
    pub app: String,
    pub nodes: usize,
    pub intervals_in_overlap_pct: Option<f64>,
    pub bitmaps_fetched_pct: Option<f64>,
    pub notice_bytes_pct: Option<f64>,
    pub analysis: Option<Analysis>,
    pub race_notice_bytes: Option<u64>,
    pub bytes_sent: Option<u64>,
    pub interval_comparison_ms: Option<f64>,
    pub bitmap_round_ms: Option<f64>,
}

/// Figure 3: where the race-detection time goes, as % of the race-off time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BreakdownRow {
    pub app: String,
    pub nodes: usize,
    pub status: String,
    /// Median parallel time of each variant ("off", "record", "notices", "compare", "on").
    pub median_s: BTreeMap<String, f64>,
    pub recording_pct: Option<f64>,
    pub protocol_pct: Option<f64>,
    pub intervals_pct: Option<f64>,
    pub bitmaps_pct: Option<f64>,
    pub total_pct: Option<f64>,
    /// Rank 0's own timers of the interval comparison and of the bitmap round in the
    /// full `--race` runs, as % of the race-off time (a cross-check of the differences).
    #[serde(default)]
    pub timer_intervals_pct: Option<f64>,
    #[serde(default)]
    pub timer_bitmaps_pct: Option<f64>,
}

/// A row of the comparison with other race detectors.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerRow {
    /// "dsm", "ThreadSanitizer", "Helgrind", "DRD".
    pub tool: String,
    /// "sor NxN K iters" or a kernel name.
    pub app: String,
    pub status: String,
    pub threads: usize,
    pub base_s: Option<f64>,
    pub tool_s: Option<f64>,
    pub slowdown: Option<f64>,
    pub slowdown_min: Option<f64>,
    pub slowdown_max: Option<f64>,
    /// Peak RSS in MB: the largest process (for dsm: the largest rank).
    pub peak_rss_mb: Option<f64>,
    /// For dsm: the sum over ranks (each rank is a process with its own copy of what it
    /// touches).
    pub peak_rss_sum_mb: Option<f64>,
    pub found_race: Option<bool>,
    pub expected_race: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Primitives {
    pub status: String,
    pub rtt_us: Option<f64>,
    pub remote_fault_us: Option<f64>,
    pub write_fault_us: Option<f64>,
    pub lock_acquire_us: Option<f64>,
    pub lock_handoff_us: Option<f64>,
    /// A hand-off carrying one page of changes (see `BenchFigures`).
    #[serde(default)]
    pub lock_handoff_page_us: Option<f64>,
    pub barrier_us: BTreeMap<String, f64>,
    /// remote_fault_us / (rtt_us + write_fault_us).
    pub remote_fault_vs_floor: Option<f64>,
    /// How many `dsm-bench` runs the figures are the median of.
    #[serde(default)]
    pub runs: usize,
    #[serde(default)]
    pub raw: Option<serde_json::Value>,
}

impl Primitives {
    pub fn from_figures(b: &BenchFigures, raw: serde_json::Value) -> Self {
        let floor = b.rtt_us.zip(b.write_fault_us).map(|(r, w)| r + w);
        Primitives {
            status: "ok".into(),
            rtt_us: b.rtt_us,
            remote_fault_us: b.remote_fault_us,
            write_fault_us: b.write_fault_us,
            lock_acquire_us: b.lock_acquire_us,
            lock_handoff_us: b.lock_handoff_us,
            lock_handoff_page_us: b.lock_handoff_page_us,
            barrier_us: b.barrier_us.clone(),
            remote_fault_vs_floor: b
                .remote_fault_us
                .zip(floor)
                .filter(|(_, f)| *f > 0.0)
                .map(|(r, f)| r / f),
            raw: Some(raw),
            runs: 1,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SpeedupRow {
    pub app: String,
    pub nodes: usize,
    pub oversubscribed: bool,
    pub status: String,
    pub parallel_s: Option<f64>,
    pub sequential_s: Option<f64>,
    /// sequential / parallel.
    pub speedup: Option<f64>,
    /// parallel at N = 1 / parallel at N.
    pub self_relative: Option<f64>,
}

/// A row of the "dsm vs threads" table: one app on a scaled input, sequential, over N
/// plain threads of one process and on dsm at N nodes, measured in the same run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadsRow {
    pub app: String,
    /// The app's arguments.
    pub input: String,
    pub nodes: usize,
    pub oversubscribed: bool,
    pub status: String,
    /// Median of the sequential times timed in every run (every kind).
    pub sequential_s: Option<f64>,
    /// The threaded kernel's time.
    pub threads: Option<Summary>,
    /// dsm's parallel time (race detection off, default transport).
    pub dsm: Option<Summary>,
    /// dsm over threads, paired by repetition: the ratio that matters.
    pub ratio: Option<Summary>,
    /// dsm's parallel time with private page copies moved through shared-memory rings
    /// (`DSM_TRANSPORT=rings`).
    #[serde(default)]
    pub dsm_rings: Option<Summary>,
    /// dsm over rings over threads, paired by repetition.
    #[serde(default)]
    pub ratio_rings: Option<Summary>,
    /// dsm's parallel time with every link over TCP (`DSM_TRANSPORT=tcp`).
    #[serde(default)]
    pub dsm_tcp: Option<Summary>,
    /// dsm over TCP over threads, paired by repetition.
    #[serde(default)]
    pub ratio_tcp: Option<Summary>,
    /// sequential / threads (median).
    pub threads_speedup: Option<f64>,
    /// sequential / dsm (median).
    pub dsm_speedup: Option<f64>,
}

/// One of the targets the report checks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub name: String,
    pub goal: String,
    pub value: Option<f64>,
    /// The measured figure in words.
    pub measured: String,
    /// `None` when it could not be measured.
    pub met: Option<bool>,
    pub note: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// The first failed run of its group.
    pub what: String,
    /// Runs that failed the same way (same program, same error); 1 for a lone failure.
    #[serde(default)]
    pub count: usize,
    pub command: String,
    pub error: String,
    pub stderr_tail: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema: u32,
    pub date: String,
    pub machine: Machine,
    #[serde(default)]
    pub git: Option<String>,
    pub settings: Settings,
    pub duration_s: f64,
    pub apps: Vec<AppRow>,
    pub dynamic: Vec<DynamicRow>,
    pub breakdown: Vec<BreakdownRow>,
    pub peers: Vec<PeerRow>,
    /// The primitives over shared-memory rings (`DSM_TRANSPORT=rings`; reports from before
    /// the common segment measured them with the default transport).
    pub primitives: Primitives,
    /// The same primitives with every link over TCP (`DSM_TRANSPORT=tcp`).
    #[serde(default)]
    pub primitives_tcp: Primitives,
    /// The same primitives with the default transport (`DSM_TRANSPORT=auto`): one common
    /// segment on this host, so the fault rows time accesses to pages already mapped. No
    /// target is judged on them.
    #[serde(default)]
    pub primitives_common: Primitives,
    pub speedup: Vec<SpeedupRow>,
    /// `--race` over the same command without it, per input, N and transport.
    #[serde(default)]
    pub race_cost: Vec<RaceCostRow>,
    /// dsm against plain threads on scaled inputs.
    #[serde(default)]
    pub threads: Vec<ThreadsRow>,
    /// The round-trip model: per app, the round trips each rank waited for and the time
    /// the app would lose at larger one-way delays.
    #[serde(default)]
    pub round_trips: Vec<RoundTripRow>,
    pub targets: Vec<Target>,
    /// PNG files written next to the report (file names).
    pub plots: Vec<String>,
    /// Why plots are missing, if they are.
    #[serde(default)]
    pub plots_note: Option<String>,
    /// Parts that were not run, with the reason.
    pub not_run: Vec<String>,
    pub failures: Vec<Failure>,
    pub notes: Vec<String>,
    pub runs: Vec<RunRecord>,
}

/// One cell of the race-cost table: an app and input at N nodes over one transport, with
/// and without `--race`, alternating.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RaceCostRow {
    pub app: String,
    pub input: String,
    pub nodes: usize,
    /// `auto` (the default: one common segment on one host), `rings` or `tcp`.
    pub transport: String,
    pub off: Option<crate::stats::Summary>,
    pub on: Option<crate::stats::Summary>,
    /// `--race` over the run without it, paired by repetition.
    pub ratio: Option<crate::stats::Summary>,
    pub status: String,
}

/// One row of the round-trip model (see [`crate::delay`]): an app and input at N nodes
/// over TCP, from its repetition with the median critical rank.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoundTripRow {
    pub app: String,
    pub input: String,
    pub nodes: usize,
    pub transport: String,
    pub status: String,
    /// The app's parallel time over the repetitions.
    pub time: Option<crate::stats::Summary>,
    /// Every rank's waits in that repetition, in rank order.
    pub ranks: Vec<crate::delay::RankWaits>,
    /// Per one-way delay D (us), the seconds the model says the app would lose.
    pub loss: Vec<(f64, f64)>,
}
