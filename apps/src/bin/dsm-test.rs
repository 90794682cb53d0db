//! `dsm-test`: small SPMD programs that exercise one property of the runtime each, for the
//! multi-process tests (and for users checking an installation). Each verifies its own
//! outcome, prints `verified: ...` on rank 0 and exits non-zero on a wrong result.

use anyhow::{bail, Context};
use apps::fail;
use clap::{Parser, Subcommand};
use dsm_core::{Distribution, Dsm};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "dsm-test",
    version,
    about = "Runtime self-tests: run under dsmrun -n N"
)]
struct Args {
    #[command(subcommand)]
    test: Test,
}

#[derive(Subcommand, Debug)]
enum Test {
    /// Every node adds 1 to a shared counter K times under one lock: the result is N*K.
    Counter {
        #[arg(long, default_value_t = 200)]
        iters: u64,
    },
    /// Data written under a lock is seen by the next holder: nodes pass a multi-page
    /// message around in rank order, each checking the previous writer's message.
    Handoff {
        #[arg(long, default_value_t = 3)]
        rounds: u64,
    },
    /// Nodes write interleaved elements of the same pages between barriers (false sharing);
    /// after each barrier every node sees every write.
    Falseshare {
        #[arg(long, default_value_t = 4)]
        rounds: u64,
        /// Element type: u64, or u8 (neighbouring bytes written by different nodes).
        #[arg(long, default_value = "u64")]
        elem: String,
        #[arg(long, default_value_t = 3)]
        pages: usize,
    },
    /// A few scattered pages of a huge allocation are touched; memory stays small.
    Sparse {
        /// Size of the allocation in MiB.
        #[arg(long, default_value_t = 768)]
        mib: usize,
        /// Pages each node touches.
        #[arg(long, default_value_t = 32)]
        touches: usize,
        /// Fail if this node's resident memory exceeds this many MiB.
        #[arg(long, default_value_t = 96)]
        max_rss_mib: usize,
    },
    /// Every rank creates a semaphore with no token; rank `rank` then exits with status 3
    /// while the others wait on it: the job must stop, naming that rank, not hang.
    SemLost {
        #[arg(long, default_value_t = 1)]
        rank: usize,
    },
    /// Rank 1 creates a semaphore with another initial count than the others: the
    /// collective creation must fail loudly.
    SemMismatch,
    /// Rank `rank` exits with status `code` right after joining; the others wait at a
    /// barrier it never reaches.
    Fail {
        #[arg(long, default_value_t = 1)]
        rank: usize,
        #[arg(long, default_value_t = 3)]
        code: i32,
    },
    /// Rank `rank` touches shared-segment memory outside every allocation: a genuine
    /// segmentation fault, which must kill it with SIGSEGV.
    Segv {
        #[arg(long, default_value_t = 1)]
        rank: usize,
    },
    /// Rank 1 allocates a different size than the others: the job must stop with an error
    /// saying the ranks disagree, not run on with inconsistent memory.
    AllocMismatch,
    /// Rank 1 calls one barrier fewer than the others before finishing.
    BarrierMismatch,
    /// Prints each rank's pid, then does barriers until killed (or `seconds` pass).
    Hang {
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// After a barrier, rank 0 computes for `seconds` without touching the network or
    /// shared memory while the others wait at the next barrier: a long computation must
    /// not look like a silent rank to the liveness check.
    Compute {
        #[arg(long, default_value_t = 2.5)]
        seconds: f64,
    },
}

fn main() -> anyhow::Result<ExitCode> {
    apps::init_logging();
    let args = Args::parse();
    let mut dsm = Dsm::init().context("joining the DSM job")?;
    match args.test {
        Test::Counter { iters } => counter(&mut dsm, iters)?,
        Test::Handoff { rounds } => handoff(&mut dsm, rounds)?,
        Test::Falseshare {
            rounds,
            elem,
            pages,
        } => match elem.as_str() {
            "u64" => falseshare::<u64>(&mut dsm, rounds, pages, |i, r| (i as u64) * 1000 + r)?,
            "u8" => falseshare::<u8>(&mut dsm, rounds, pages, |i, r| {
                ((i as u64 * 7 + r * 13) % 251 + 1) as u8
            })?,
            other => bail!("--elem must be u64 or u8, not {other:?}"),
        },
        Test::Sparse {
            mib,
            touches,
            max_rss_mib,
        } => sparse(&mut dsm, mib, touches, max_rss_mib)?,
        Test::Fail { rank, code } => {
            if dsm.rank() == rank {
                eprintln!("rank {rank}: exiting with status {code} on purpose");
                std::process::exit(code);
            }
            dsm.barrier()?;
            fail("the failing rank reached the barrier?");
        }
        Test::Segv { rank } => {
            let a = dsm.alloc::<u64>("small", 4)?;
            dsm.view(&a).set(0, 1);
            if dsm.rank() == rank {
                // Far past the only allocation, still inside the segment.
                println!("rank {rank} reads unallocated shared memory");
                let v =
                    dsm_core::read_segment_word(64 << 20).context("segment smaller than 64 MiB")?;
                fail(&format!("read unallocated memory without crashing: {v}"));
            }
            dsm.barrier()?;
            fail("the crashing rank reached the barrier?");
        }
        Test::SemLost { rank } => {
            let s = dsm.semaphore("never-signalled", 0)?;
            if dsm.rank() == rank {
                eprintln!("rank {rank}: exiting with status 3 while the others wait");
                std::process::exit(3);
            }
            dsm.wait(&s)?;
            fail("a wait on a semaphore nobody signalled completed");
        }
        Test::SemMismatch => {
            let initial = if dsm.rank() == 1 { 2 } else { 1 };
            let _s = dsm.semaphore("slots", initial)?;
            fail("ranks with different semaphore counts passed the collective creation");
        }
        Test::AllocMismatch => {
            let len = if dsm.rank() == 1 { 100 } else { 200 };
            let _a = dsm.alloc::<u64>("table", len)?;
            fail("ranks with different allocations passed the collective allocation");
        }
        Test::BarrierMismatch => {
            if dsm.rank() != 1 {
                dsm.barrier()?;
                fail("a barrier completed without rank 1");
            }
        }
        Test::Compute { seconds } => compute(&mut dsm, seconds)?,
        Test::Hang { seconds } => {
            println!("pid {}", std::process::id());
            // Rank 0 alone decides when time is up and tells the others through shared
            // memory, so every rank stops after the same barrier whatever their clocks say.
            let stop = dsm.alloc_with::<u64>("stop", 1, Distribution::OnNode(0))?;
            let t = Instant::now();
            loop {
                if dsm.rank() == 0 && t.elapsed() >= Duration::from_secs(seconds) {
                    dsm.view(&stop).set(0, 1);
                }
                dsm.barrier()?;
                if dsm.view(&stop).get(0) == 1 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    Ok(dsm.finish()?.exit_code())
}

fn compute(dsm: &mut Dsm, seconds: f64) -> anyhow::Result<()> {
    let span = Duration::try_from_secs_f64(seconds).context("--seconds must be >= 0")?;
    let result = dsm.alloc_with::<u64>("result", 1, Distribution::OnNode(0))?;
    dsm.barrier()?;
    if dsm.rank() == 0 {
        // Pure CPU: no page fault, no message, no call into dsm.
        let t = Instant::now();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut steps = 0u64;
        while t.elapsed() < span {
            for _ in 0..10_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
            }
            steps += 1;
        }
        dsm.view(&result).set(0, std::hint::black_box(x) | 1);
        eprintln!(
            "rank 0 computed for {:.1} s ({steps} x 10000 steps) without the network",
            t.elapsed().as_secs_f64()
        );
    }
    dsm.barrier()?;
    if dsm.view(&result).get(0) == 0 {
        fail(&format!("rank {}: rank 0's result is missing", dsm.rank()));
    }
    dsm.barrier()?;
    if dsm.rank() == 0 {
        println!(
            "verified: rank 0 computed for {seconds} s while {} other ranks waited; no rank was taken for silent",
            dsm.size() - 1
        );
    }
    Ok(())
}

fn counter(dsm: &mut Dsm, iters: u64) -> anyhow::Result<()> {
    let c = dsm.alloc::<u64>("counter", 1)?;
    for _ in 0..iters {
        let g = dsm.lock(0)?;
        let v = g.view(&c);
        v.set(0, v.get(0) + 1);
    }
    dsm.barrier()?;
    let got = dsm.view(&c).get(0);
    let want = iters * dsm.size() as u64;
    if got != want {
        fail(&format!(
            "rank {}: counter is {got}, expected {want}",
            dsm.rank()
        ));
    }
    dsm.barrier()?;
    if dsm.rank() == 0 {
        println!(
            "verified: counter = {got} = {} nodes x {iters} increments under one lock",
            dsm.size()
        );
    }
    Ok(())
}

fn message_word(turn: u64, i: usize) -> u64 {
    turn.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i as u64)
}

fn handoff(dsm: &mut Dsm, rounds: u64) -> anyhow::Result<()> {
    let n = dsm.size() as u64;
    let me = dsm.rank() as u64;
    let turn = dsm.alloc::<u64>("turn", 1)?;
    // Three pages, homed across the nodes.
    let msg = dsm.alloc::<u64>("message", 3 * 512)?;
    let mut checked = 0;
    let total = rounds * n;
    loop {
        let g = dsm.lock(7)?;
        let t = g.view(&turn).get(0);
        if t >= total {
            break;
        }
        if t % n == me {
            let m = g.view(&msg);
            let mut buf = vec![0u64; 3 * 512];
            m.read_into(0, &mut buf);
            if t > 0 {
                if let Some(i) = (0..buf.len()).find(|&i| buf[i] != message_word(t - 1, i)) {
                    fail(&format!(
                        "rank {me}: message word {i} after hand-off {t} is {:#x}, expected {:#x}",
                        buf[i],
                        message_word(t - 1, i)
                    ));
                }
                checked += 1;
            }
            for (i, w) in buf.iter_mut().enumerate() {
                *w = message_word(t, i);
            }
            m.write_from(0, &buf);
            g.view(&turn).set(0, t + 1);
        } else {
            drop(g);
            std::thread::yield_now();
        }
    }
    dsm.barrier()?;
    if dsm.rank() == 0 {
        println!(
            "verified: {total} lock hand-offs of a 3-page message among {n} nodes; every acquirer saw the previous holder's data ({checked} checks on rank 0)"
        );
    }
    Ok(())
}

fn falseshare<T: bytemuck::Pod + PartialEq + std::fmt::Debug>(
    dsm: &mut Dsm,
    rounds: u64,
    pages: usize,
    value: impl Fn(usize, u64) -> T,
) -> anyhow::Result<()> {
    let n = dsm.size();
    let me = dsm.rank();
    let len = pages * 4096 / std::mem::size_of::<T>();
    // One home for all pages, so most writers are not the home (twins and diffs).
    let arr = dsm.alloc_with::<T>("shared", len, Distribution::OnNode(n - 1))?;
    for round in 1..=rounds {
        {
            let v = dsm.view(&arr);
            for i in (me..len).step_by(n) {
                v.set(i, value(i, round));
            }
        }
        dsm.barrier()?;
        {
            let v = dsm.view(&arr);
            let mut all = vec![T::zeroed(); len];
            v.read_into(0, &mut all);
            if let Some(i) = (0..len).find(|&i| all[i] != value(i, round)) {
                fail(&format!(
                    "rank {me}, round {round}: element {i} (written by rank {}) is {:?}, expected {:?}",
                    i % n,
                    all[i],
                    value(i, round)
                ));
            }
        }
        dsm.barrier()?;
    }
    if me == 0 {
        println!(
            "verified: {n} nodes wrote interleaved {}-byte elements of {pages} shared pages for {rounds} rounds; every node saw every write after each barrier",
            std::mem::size_of::<T>()
        );
    }
    Ok(())
}

fn rss_mib() -> anyhow::Result<usize> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS")?;
    let kib: usize = line
        .split_whitespace()
        .nth(1)
        .context("bad VmRSS")?
        .parse()?;
    Ok(kib / 1024)
}

fn sparse(dsm: &mut Dsm, mib: usize, touches: usize, max_rss: usize) -> anyhow::Result<()> {
    let n = dsm.size();
    let me = dsm.rank();
    let per_page = 512;
    let pages = mib * 256;
    let arr = dsm.alloc::<u64>("huge", pages * per_page)?;
    // Node r touches pages spread over the whole allocation (mostly homed elsewhere).
    let touched = |r: usize| -> Vec<usize> {
        (0..touches)
            .map(|k| ((k * n + r) * 7919 + r * 104_729) % pages)
            .collect()
    };
    {
        let v = dsm.view(&arr);
        for p in touched(me) {
            v.set(p * per_page + me, (p * 10 + me) as u64 + 1);
        }
    }
    dsm.barrier()?;
    {
        let v = dsm.view(&arr);
        for r in 0..n {
            for p in touched(r) {
                let got = v.get(p * per_page + r);
                if got != (p * 10 + r) as u64 + 1 {
                    fail(&format!("rank {me}: page {p} word {r} is {got}"));
                }
            }
        }
    }
    let rss = rss_mib()?;
    if rss > max_rss {
        fail(&format!(
            "rank {me}: resident memory {rss} MiB exceeds {max_rss} MiB after touching {} of {pages} pages",
            touches * n
        ));
    }
    dsm.barrier()?;
    if me == 0 {
        println!(
            "verified: sparse touch of {} pages spread over a {mib} MiB allocation by {n} nodes; rank 0 resident memory {rss} MiB",
            touches * n
        );
    }
    Ok(())
}
