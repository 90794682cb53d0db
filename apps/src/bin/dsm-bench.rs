//! `dsm-bench`: micro-benchmarks of the DSM primitives, printed as JSON.
//!
//! Run without arguments it is a driver: it starts itself under `dsmrun` at N = 2 (all
//! primitives) and N = 4 and 8 (barriers), and prints one JSON object with the figures and
//! their ratios to the loopback TCP round trip measured in the same run. These are
//! figures, not pass/fail checks. Arguments after `--` go to every `dsmrun` it starts, so
//! `dsm-bench -- --hostfile hosts --map-by node` measures between hosts (the round trip
//! then goes between rank 0's host and rank 1's).

use anyhow::{bail, Context};
use clap::Parser;
use dsm_core::{Distribution, Dsm};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

/// Measures loopback round trip, remote page fault, write fault with twin, remote lock
/// acquire (time and messages), lock hand-off (polling, and carrying one page of changes),
/// semaphore wait, signal and hand-off, and barriers, and prints JSON.
#[derive(Parser, Debug)]
#[command(name = "dsm-bench", version)]
struct Args {
    /// Repetitions per measurement (at least 1).
    #[arg(long, default_value_t = 1000,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000_000))]
    reps: usize,
    /// Node counts for the barrier measurement (the driver runs one job per count), each
    /// 2 to 256.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=256))]
    barrier_nodes: Vec<usize>,
    /// Internal: run as a worker inside a dsmrun job ("all" or "barrier").
    #[arg(long, hide = true)]
    worker: Option<String>,
    /// Arguments for every dsmrun the driver starts, after `--` (e.g. `-- --hostfile
    /// hosts --map-by node` to measure between hosts).
    #[arg(last = true)]
    dsmrun_args: Vec<String>,
}

/// How long the benchmark's own socket between ranks 0 and 1 may take to connect.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(10);

fn main() -> std::process::ExitCode {
    apps::main_with(|| run().map(|()| std::process::ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    apps::init_logging();
    let args = Args::parse();
    match args.worker.as_deref() {
        None => driver(&args),
        Some("all") => worker(&args, true),
        Some("barrier") => worker(&args, false),
        Some(w) => bail!("unknown worker kind {w:?}"),
    }
}

/// Messages a rank sends for one barrier of a 2-node job (all-to-all: its arrival), taken
/// off message counts whose window must end after a barrier so that the other rank's
/// answers are in it.
const BARRIER_ARRIVALS_N2: u64 = 1;

fn stats(mut v: Vec<f64>) -> Value {
    v.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    json!({"median": round(pct(0.5)), "mean": round(mean), "p10": round(pct(0.1)), "p90": round(pct(0.9)), "samples": v.len()})
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn us(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// Times `op(i)` for `i` in `0..reps`, one sample (us) each.
fn time_each(
    reps: usize,
    mut op: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<f64>> {
    let mut samples = Vec::with_capacity(reps);
    for i in 0..reps {
        let t = Instant::now();
        op(i)?;
        samples.push(us(t));
    }
    Ok(samples)
}

fn run_job(nodes: usize, kind: &str, args: &Args) -> anyhow::Result<Value> {
    let reps = args.reps;
    let exe = std::env::current_exe()?;
    let dsmrun = exe.with_file_name("dsmrun");
    let out = Command::new(&dsmrun)
        .args(["-n", &nodes.to_string(), "--timeout", "300"])
        .args(&args.dsmrun_args)
        .arg("--")
        .arg(&exe)
        .args(["--worker", kind, "--reps", &reps.to_string()])
        .output()
        .with_context(|| format!("running {}", dsmrun.display()))?;
    if !out.status.success() {
        bail!(
            "benchmark job at N={nodes} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("[0] BENCH "))
        .context("worker printed no result")?;
    Ok(serde_json::from_str(line)?)
}

fn driver(args: &Args) -> anyhow::Result<()> {
    let mut all = run_job(2, "all", args)?;
    let mut barriers = serde_json::Map::new();
    for &n in &args.barrier_nodes {
        let r = if n == 2 {
            all["barrier_us"].clone()
        } else {
            run_job(n, "barrier", args)?["barrier_us"].clone()
        };
        barriers.insert(n.to_string(), r);
    }
    let rtt = all["rtt_us"]["median"].as_f64().unwrap_or(f64::NAN);
    let fault = all["remote_fault_us"]["median"]
        .as_f64()
        .unwrap_or(f64::NAN);
    let local = all["write_fault_us"]["median"].as_f64().unwrap_or(f64::NAN);
    let lock = all["lock_acquire_us"]["median"]
        .as_f64()
        .unwrap_or(f64::NAN);
    let b2 = barriers
        .get("2")
        .and_then(|b| b["median"].as_f64())
        .unwrap_or(f64::NAN);
    let num = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let sem_initial = num(&all["sem_wait_initial_us"]["median"]) / lock;
    let sem_signalled = num(&all["sem_wait_signalled_us"]["median"]) / lock;
    let sem_handoff = num(&all["sem_handoff_us"]["mean"]) / num(&all["lock_handoff_us"]["mean"]);
    let handoff_page = num(&all["lock_handoff_page_us"]["median"]);
    let obj = all.as_object_mut().expect("object");
    obj.insert("barrier_us".into(), Value::Object(barriers));
    obj.insert(
        "ratios".into(),
        json!({
            "remote_fault_over_rtt_plus_local_fault": round(fault / (rtt + local)),
            "lock_acquire_in_rtts": round(lock / rtt),
            "lock_handoff_page_in_rtts": round(handoff_page / rtt),
            "sem_wait_initial_over_lock_acquire": round(sem_initial),
            "sem_wait_signalled_over_lock_acquire": round(sem_signalled),
            "sem_handoff_over_lock_handoff": round(sem_handoff),
            "barrier_n2_in_rtts": round(b2 / rtt),
        }),
    );
    // A reader that stops early (`dsm-bench | head`) is not an error of the benchmark.
    let text = serde_json::to_string_pretty(&all)?;
    if let Err(e) = writeln!(std::io::stdout(), "{text}") {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e.into());
        }
    }
    Ok(())
}

/// Lock hand-off carrying one page of changes: the two ranks take turns acquiring a lock
/// whose token is at the other rank, which rewrote a whole page (homed at rank 1) under it
/// and released it. Turns are passed over a plain TCP connection, outside the DSM, so
/// nothing but the lock orders the ranks (no polling through the lock, no barrier that
/// would carry the write notices first). A sample is the time from `lock` until the lock
/// is held and the other rank's page contents have been read. Also counts both ranks'
/// DSM messages per hand-off (`lock_handoff_page_messages`).
fn lock_handoff_with_page(
    dsm: &mut Dsm,
    reps: usize,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    const WORDS: usize = 4096 / 8;
    const LOCK: u64 = 7; // managed by rank 1, like the page's home
    let page = dsm.alloc_with::<u64>("bench_handoff_page", WORDS, Distribution::OnNode(1))?;
    let me = dsm.rank();
    let mut turns = plain_socket_pair(dsm, "bench_handoff_port")?;
    let sent = dsm.stats().messages_sent;
    let mut samples = Vec::with_capacity(reps);
    for round in 0..2 * reps as u64 + 1 {
        if round % 2 != me as u64 {
            continue;
        }
        if round > 0 {
            let mut b = [0u8; 1];
            turns.read_exact(&mut b)?;
        }
        let t = Instant::now();
        let g = dsm.lock(LOCK)?;
        let v = g.view(&page);
        let (first, last) = (v.get(0), v.get(WORDS - 1));
        if round > 0 {
            samples.push(us(t));
            if first != round - 1 || last != round - 1 {
                bail!("hand-off benchmark: round {round} read {first}/{last}");
            }
        }
        v.write_from(0, &[round; WORDS]);
        g.unlock()?;
        turns.write_all(&[1])?;
    }
    dsm.barrier()?;
    let msgs = dsm.stats().messages_sent - sent - BARRIER_ARRIVALS_N2;
    out.insert(format!("lock_handoff_page_us_rank{me}"), stats(samples));
    out.insert(format!("lock_handoff_page_messages_rank{me}"), json!(msgs));
    Ok(())
}

/// A semaphore name whose manager is `rank` in a 2-node job.
fn sem_managed_by(rank: u64, base: &str) -> String {
    (0..)
        .map(|i| format!("{base}{i}"))
        .find(|n| dsm_core::semaphore_id(n) % 2 == rank)
        .expect("some name hashes to each rank")
}

/// Semaphore latencies beside the lock figures: a wait whose token is one of the initial
/// count at the other node (the analogue of acquiring a free lock managed there), a wait
/// whose token is the other node's signal (forwarded to the signaller, which grants), a
/// signal (a release: never waits), and a hand-off back and forth through two semaphores
/// (the analogue of the lock hand-off, without its polling).
fn semaphores(
    dsm: &mut Dsm,
    reps: usize,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let initial = dsm.semaphore(&sem_managed_by(0, "bench_init"), reps as u32)?;
    let signalled = dsm.semaphore(&sem_managed_by(0, "bench_sig"), 0)?;
    let ping = dsm.semaphore(&sem_managed_by(0, "bench_ping"), 0)?;
    let pong = dsm.semaphore(&sem_managed_by(1, "bench_pong"), 0)?;
    if dsm.rank() == 1 {
        let waits = time_each(reps, |_| Ok(dsm.wait(&initial)?))?;
        out.insert("sem_wait_initial_us".into(), stats(waits));
    } else {
        let signals = time_each(reps, |_| Ok(dsm.signal(&signalled)?))?;
        out.insert("sem_signal_us".into(), stats(signals));
    }
    dsm.barrier()?;
    if dsm.rank() == 1 {
        let waits = time_each(reps, |_| Ok(dsm.wait(&signalled)?))?;
        out.insert("sem_wait_signalled_us".into(), stats(waits));
    }
    dsm.barrier()?;
    let t = Instant::now();
    for _ in 0..reps {
        if dsm.rank() == 0 {
            dsm.signal(&ping)?;
            dsm.wait(&pong)?;
        } else {
            dsm.wait(&ping)?;
            dsm.signal(&pong)?;
        }
    }
    let total = us(t);
    dsm.barrier()?;
    out.insert(
        "sem_handoff_us".into(),
        json!({"mean": round(total / (2 * reps) as f64)}),
    );
    Ok(())
}

/// Where rank 0 listens for the benchmark's own socket: the address the job's ranks
/// reach it at (its rendezvous host; loopback in a one-host job).
fn rank0_ip() -> IpAddr {
    dsm_core::JobConfig::from_env()
        .ok()
        .and_then(|c| c.coord)
        .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |a| a.ip())
}

/// A TCP connection between ranks 0 and 1 (collective; rank 0 listens where the job
/// reaches it and publishes its port in the shared allocation `name`), with Nagle off, for
/// the benchmarks' own signalling outside the DSM. Waits at most [`SOCKET_TIMEOUT`] on
/// either side, so a rank that cannot reach the other fails naming the address.
fn plain_socket_pair(dsm: &mut Dsm, name: &str) -> anyhow::Result<TcpStream> {
    let port = dsm.alloc_with::<u64>(name, 1, Distribution::OnNode(0))?;
    let ip = rank0_ip();
    let listener = if dsm.rank() == 0 {
        let l = TcpListener::bind((ip, 0))
            .with_context(|| format!("rank 0: cannot listen on {ip} for the round trip"))?;
        dsm.view(&port).set(0, l.local_addr()?.port() as u64);
        Some(l)
    } else {
        None
    };
    dsm.barrier()?;
    let s = match listener {
        Some(l) => accept_within(&l, SOCKET_TIMEOUT)?,
        None => {
            let at = SocketAddr::new(ip, dsm.view(&port).get(0) as u16);
            TcpStream::connect_timeout(&at, SOCKET_TIMEOUT).with_context(|| {
                format!(
                    "rank {}: cannot connect to rank 0's round-trip socket at {at}",
                    dsm.rank()
                )
            })?
        }
    };
    s.set_nodelay(true)?;
    Ok(s)
}

/// The first connection to `l` within `timeout`, as a blocking stream.
fn accept_within(l: &TcpListener, timeout: Duration) -> anyhow::Result<TcpStream> {
    l.set_nonblocking(true)?;
    let deadline = Instant::now() + timeout;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    bail!(
                        "rank 0: no rank connected to the round-trip socket at {} within {} s",
                        l.local_addr()?,
                        timeout.as_secs()
                    );
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Loopback TCP round trip between rank 0 and rank 1 over a plain socket: the physical
/// floor every remote DSM operation pays.
fn measure_rtt(dsm: &mut Dsm, reps: usize) -> anyhow::Result<Option<Value>> {
    let mut s = plain_socket_pair(dsm, "bench_port")?;
    let result = match dsm.rank() {
        0 => {
            let mut b = [0u8; 1];
            let mut samples = Vec::with_capacity(reps);
            for _ in 0..reps + 100 {
                let t = Instant::now();
                s.write_all(&b)?;
                s.read_exact(&mut b)?;
                samples.push(us(t));
            }
            s.write_all(&[0xff])?;
            Some(stats(samples.split_off(100)))
        }
        1 => {
            let mut b = [0u8; 1];
            loop {
                s.read_exact(&mut b)?;
                if b[0] == 0xff {
                    break;
                }
                s.write_all(&b)?;
            }
            None
        }
        _ => None,
    };
    dsm.barrier()?;
    Ok(result)
}

fn worker(args: &Args, everything: bool) -> anyhow::Result<()> {
    let mut dsm = Dsm::init()?;
    let reps = args.reps;
    let mut out = serde_json::Map::new();
    out.insert("nodes".into(), json!(dsm.size()));
    if everything {
        primitives(&mut dsm, reps, &mut out)?;
    }
    // Barriers.
    dsm.barrier()?;
    let bars = time_each(reps, |_| Ok(dsm.barrier()?))?;
    out.insert("barrier_us".into(), stats(bars));
    let s = dsm.stats();
    out.insert(
        "rank0_counters".into(),
        json!({"pages_fetched": s.pages_fetched, "pages_served": s.pages_served, "twins": s.twins_made, "barriers": s.barriers}),
    );
    // Rank 1's figures come back through shared memory.
    let rank1 = collect_rank1(&mut dsm, &out)?;
    if dsm.rank() == 0 {
        println!("BENCH {}", Value::Object(merge_ranks(rank1, out, reps)));
    }
    // Benchmarks run without race detection: the outcome has nothing to say.
    let _outcome = dsm.finish()?;
    Ok(())
}

/// The two-node benchmarks: round trip, faults, locks and semaphores.
fn primitives(
    dsm: &mut Dsm,
    reps: usize,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    if dsm.size() != 2 {
        bail!("the primitive benchmarks run on exactly 2 nodes");
    }
    if let Some(r) = measure_rtt(dsm, reps)? {
        out.insert("rtt_us".into(), r);
    }
    faults(dsm, reps, out)?;
    free_lock_acquire(dsm, reps, out)?;
    lock_handoff_with_page(dsm, reps, out)?;
    alternating_lock_handoff(dsm, reps, out)?;
    semaphores(dsm, reps, out)
}

/// Remote read fault: rank 1 touches pages homed on rank 0, one fault each; then a write
/// fault on each now read-only page.
fn faults(
    dsm: &mut Dsm,
    reps: usize,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let per_page = 4096 / 8;
    let pages = dsm.alloc_with::<f64>("bench_pages", reps * per_page, Distribution::OnNode(0))?;
    if dsm.rank() == 0 {
        let v = dsm.view(&pages);
        for p in 0..reps {
            v.set(p * per_page, p as f64);
        }
    }
    dsm.barrier()?;
    if dsm.rank() == 1 {
        let v = dsm.view(&pages).unrecorded();
        let mut sum = 0.0;
        let reads = time_each(reps, |p| {
            sum += v.get(p * per_page);
            Ok(())
        })?;
        // Write fault on a now read-only page: twin creation, handled locally.
        let writes = time_each(reps, |p| {
            v.set(p * per_page + 1, sum);
            Ok(())
        })?;
        out.insert("remote_fault_us".into(), stats(reads));
        out.insert("write_fault_us".into(), stats(writes));
    }
    dsm.barrier()?;
    Ok(())
}

/// Acquire of a free lock whose manager is the other node (lock ids 2k+0 are managed by
/// rank 0; each is used once, so the manager holds its token), and the messages it took.
fn free_lock_acquire(
    dsm: &mut Dsm,
    reps: usize,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let sent = dsm.stats().messages_sent;
    if dsm.rank() == 1 {
        let mut acq = Vec::with_capacity(reps);
        for k in 0..reps as u64 {
            let t = Instant::now();
            let g = dsm.lock(1000 + 2 * k)?;
            acq.push(us(t));
            drop(g);
        }
        out.insert("lock_acquire_us".into(), stats(acq));
    }
    dsm.barrier()?;
    let msgs = dsm.stats().messages_sent - sent - BARRIER_ARRIVALS_N2;
    out.insert(
        format!("lock_acquire_messages_rank{}", dsm.rank()),
        json!(msgs),
    );
    Ok(())
}

/// Hand-off: the lock alternates between the two nodes (a shared turn variable says whose
/// turn it is).
fn alternating_lock_handoff(
    dsm: &mut Dsm,
    reps: usize,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let turn = dsm.alloc_with::<u64>("bench_turn", 1, Distribution::OnNode(1))?;
    let me = dsm.rank() as u64;
    let t = Instant::now();
    let mut mine = 0;
    let mut attempts = 0u64;
    while mine < reps {
        let g = dsm.lock(1)?;
        attempts += 1;
        let v = g.view(&turn);
        if v.get(0) % 2 == me {
            v.set(0, v.get(0) + 1);
            mine += 1;
        }
    }
    let total = us(t);
    dsm.barrier()?;
    out.insert(
        "lock_handoff_us".into(),
        json!({"mean": round(total / (2 * reps) as f64), "acquires_per_handoff": round(attempts as f64 / reps as f64)}),
    );
    Ok(())
}

/// Rank 0's figures with rank 1's (rank 1's first where both have a key), and the
/// per-operation figures that need both ranks' counts.
fn merge_ranks(
    rank1: serde_json::Map<String, Value>,
    out: serde_json::Map<String, Value>,
    reps: usize,
) -> serde_json::Map<String, Value> {
    let mut merged = rank1;
    for (k, v) in out {
        merged.entry(k).or_insert(v);
    }
    // Messages per operation, both ranks' counts together.
    let per_op = |m: &serde_json::Map<String, Value>, key: &str, ops: usize| {
        let sum: f64 = (0..2)
            .filter_map(|r| m.get(&format!("{key}_rank{r}")).and_then(Value::as_f64))
            .sum();
        round(sum / ops as f64)
    };
    if merged.contains_key("lock_acquire_messages_rank0") {
        let a = per_op(&merged, "lock_acquire_messages", reps);
        let h = per_op(&merged, "lock_handoff_page_messages", 2 * reps);
        merged.insert("lock_acquire_messages".into(), json!(a));
        merged.insert("lock_handoff_page_messages".into(), json!(h));
        // Both directions: rank 0 acquires from rank 1, the page's home, and the
        // other way round.
        let med = |r: usize| {
            merged[&format!("lock_handoff_page_us_rank{r}")]["median"]
                .as_f64()
                .unwrap_or(f64::NAN)
        };
        let both = round((med(0) + med(1)) / 2.0);
        merged.insert("lock_handoff_page_us".into(), json!({"median": both}));
    }
    merged
}

/// Moves rank 1's JSON to rank 0 through a shared byte array.
fn collect_rank1(
    dsm: &mut Dsm,
    mine: &serde_json::Map<String, Value>,
) -> anyhow::Result<serde_json::Map<String, Value>> {
    const CAP: usize = 16 << 10;
    let buf = dsm.alloc_with::<u8>("bench_report", CAP, Distribution::OnNode(0))?;
    if dsm.rank() == 1 {
        let text = serde_json::to_vec(mine)?;
        if text.len() + 8 > CAP {
            bail!("report too large");
        }
        let v = dsm.view(&buf);
        v.write_from(0, &(text.len() as u64).to_le_bytes());
        v.write_from(8, &text);
    }
    dsm.barrier()?;
    let mut result = serde_json::Map::new();
    if dsm.rank() == 0 && dsm.size() > 1 {
        let v = dsm.view(&buf);
        let mut len = [0u8; 8];
        v.read_into(0, &mut len);
        let len = u64::from_le_bytes(len) as usize;
        let mut text = vec![0u8; len];
        v.read_into(8, &mut text);
        if let Value::Object(m) = serde_json::from_slice(&text)? {
            result = m;
        }
    }
    Ok(result)
}
