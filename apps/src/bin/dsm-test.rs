//! `dsm-test`: small SPMD programs that exercise one property of the runtime each, for the
//! multi-process tests (and for users checking an installation). Each verifies its own
//! outcome, prints `verified: ...` on rank 0 and exits non-zero on a wrong result.

use anyhow::Context;
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
    /// Return success from main whatever `finish` reports, as a program that ignores the
    /// race status does (the status must reach dsmrun anyway).
    #[arg(long)]
    ignore_outcome: bool,
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
        #[arg(long, default_value = "u64", value_parser = ["u64", "u8"])]
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
    /// Rank `rank` takes lock 1 and exits with status 3 holding it, while the others wait
    /// for it: the job must stop, naming that rank, not hang (in a common segment the
    /// waiters sleep on the lock's word in shared memory, not on a message).
    LockLost {
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
    /// Every rank allocates two arrays under one name: refused, since reports name elements
    /// by their allocation's name.
    AllocTwice,
    /// Rank 1 calls one barrier fewer than the others before finishing.
    BarrierMismatch,
    /// Prints each rank's pid, then does barriers until killed (or `seconds` pass).
    Hang {
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// A program for `dsmrun --check`: every rank writes its band of `field` (its declared
    /// region) and, under a lock, rank 0 hands a message to rank 1 within the epoch; then
    /// every rank reads the whole field. `--bug uninit` leaves `field[3..6]` unwritten
    /// (uninitialised reads); `--bug region` has the last rank write `field[0]`, in rank 0's
    /// band, after another barrier (a write outside its region); `--bug none` is clean.
    Checks {
        #[arg(long, default_value = "none", value_parser = ["none", "uninit", "region"])]
        bug: String,
    },
    /// A program that synchronizes through locks alone (no barrier until `finish`): each
    /// rank closes `intervals / N` intervals with its own lock, every 64 iterations meets
    /// the others under a shared lock, and every 1024 waits for them at a rendezvous built
    /// from that lock. With `--plant`, halfway through, rank 0 writes `planted[0]` outside
    /// any lock while rank 1 polls it, also outside any lock, after every lock operation
    /// (a data race whatever the lock order). Prints each rank's peak resident memory.
    LockOnly {
        #[arg(long, default_value_t = 100_000)]
        intervals: u64,
        #[arg(long)]
        plant: bool,
    },
    /// A lock-only program as a user writes one (issue 36): no barrier until `finish`,
    /// no rendezvous. Each rank makes `iters` updates of its own slots under its own lock,
    /// and every 100th time adds 1 to a shared counter under a shared lock; rank 0 writes
    /// `planted[3]` and the last rank reads it right after the allocations, unsynchronized
    /// (one race). Rank 0 checks the counter; every rank prints its peak resident memory.
    OwnLocks {
        #[arg(long, default_value_t = 50_000)]
        iters: u64,
    },
    /// Prints the order in which the nodes took one lock: every node takes the lock
    /// `rounds` times and appends its rank to a shared list; after the last barrier rank 0
    /// prints the list (`order: 0 2 1 ...`). The list is the lock's schedule, which is what
    /// `--chaos` changes and `--replay` reproduces. After each critical section every node
    /// also writes `last[0] = 1` without the lock (a deliberate write-write race, so a race
    /// log under `--race` depends on the order too; the same value from every node, so the
    /// race changes no result).
    LockOrder {
        #[arg(long, default_value_t = 8)]
        rounds: u64,
        /// Busy-work (loop iterations) between critical sections.
        #[arg(long, default_value_t = 2000)]
        work: u64,
    },
    /// After a barrier, rank 0 computes for `seconds` without touching the network or
    /// shared memory while the others wait at the next barrier: a long computation must
    /// not look like a silent rank to the liveness check.
    Compute {
        #[arg(long, default_value_t = 2.5)]
        seconds: f64,
    },
}

fn main() -> ExitCode {
    apps::main_with(run)
}

fn run() -> anyhow::Result<ExitCode> {
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
            other => unreachable!("clap accepts u64 and u8 only, not {other:?}"),
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
        Test::LockLost { rank } => {
            if dsm.rank() == rank {
                let mut held = dsm.lock(1)?;
                held.barrier()?;
                eprintln!("rank {rank}: exiting with status 3 holding lock 1");
                std::process::exit(3);
            }
            dsm.barrier()?;
            let _g = dsm.lock(1)?;
            fail("a lock whose holder died was taken");
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
        Test::AllocTwice => {
            let _a = dsm.alloc::<u64>("table", 8)?;
            let _b = dsm.alloc::<u64>("table", 8)?;
            fail("a second allocation named 'table' was accepted");
        }
        Test::BarrierMismatch => {
            // An allocation first, so that the protocol's barrier count (which includes
            // allocations) differs from the program's, which messages must use.
            let _a = dsm.alloc::<u64>("before", 8)?;
            if dsm.rank() != 1 {
                dsm.barrier()?;
                fail("a barrier completed without rank 1");
            }
        }
        Test::Compute { seconds } => compute(&mut dsm, seconds)?,
        Test::Checks { bug } => checks(&mut dsm, &bug)?,
        Test::LockOnly { intervals, plant } => lock_only(&mut dsm, intervals, plant)?,
        Test::OwnLocks { iters } => own_locks(&mut dsm, iters)?,
        Test::LockOrder { rounds, work } => lock_order(&mut dsm, rounds, work)?,
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
    let outcome = dsm.finish()?;
    if args.ignore_outcome {
        return Ok(ExitCode::SUCCESS);
    }
    Ok(outcome.exit_code())
}

fn lock_only(dsm: &mut Dsm, intervals: u64, plant: bool) -> anyhow::Result<()> {
    const MEET_EVERY: u64 = 64;
    const ROUND: u64 = 1024;
    /// u64s per page: each rank's counter on a page of its own.
    const STRIDE: usize = dsm_core::PAGE_SIZE / 8;
    let (rank, n) = (dsm.rank(), dsm.size());
    // Each iteration closes two intervals (the acquire and the release of the rank's lock).
    let iters = (intervals / (2 * n as u64)).max(1);
    let counters = dsm.alloc::<u64>("counters", n * STRIDE)?;
    let meetings = dsm.alloc::<u64>("meetings", 2)?;
    let planted = dsm.alloc::<u64>("planted", 1)?;
    dsm.assume_initialised(&meetings);
    dsm.assume_initialised(&planted);
    let start = Instant::now();
    // Rank 1 reads `planted` without a lock after every lock operation, as a server loop
    // polls a flag: whatever the lock order, the read just before its first lock operation
    // that follows rank 0's first release after the write is concurrent with the write.
    let poll = |dsm: &Dsm| {
        if plant && rank == 1 {
            std::hint::black_box(dsm.view(&planted).get(0));
        }
    };
    for it in 0..iters {
        {
            // Lock `rank` is managed by this rank: taking it sends no message.
            let g = dsm.lock(rank as u64)?;
            g.view(&counters).set(rank * STRIDE, it + 1);
        }
        poll(dsm);
        if it % MEET_EVERY == MEET_EVERY - 1 {
            let g = dsm.lock_named("meet")?;
            let m = g.view(&meetings);
            m.set(0, m.get(0) + 1);
            drop(g);
            poll(dsm);
        }
        if it % ROUND == ROUND - 1 {
            // A rendezvous built from the lock (no dsm barrier): keeps the ranks within a
            // round of each other, so the detector can discard what all have seen.
            let round = it / ROUND + 1;
            {
                let g = dsm.lock_named("meet")?;
                let m = g.view(&meetings);
                m.set(1, m.get(1) + 1);
            }
            poll(dsm);
            loop {
                let g = dsm.lock_named("meet")?;
                let arrived = g.view(&meetings).get(1);
                drop(g);
                poll(dsm);
                if arrived >= n as u64 * round {
                    break;
                }
                // A polite poll: spinning flat out on a lock this node holds closes
                // intervals faster than rank 0's race analysis takes them in (README,
                // "Programs without barriers").
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        if plant && rank == 0 && it == iters / 2 {
            dsm.view(&planted).set(0, it);
            println!(
                "planted: rank 0 wrote planted[0] at iteration {it}, {:.3} s after start",
                start.elapsed().as_secs_f64()
            );
        }
    }
    poll(dsm);
    let peak = peak_rss_kib()?;
    println!("rank {rank}: {iters} iterations, peak RSS {peak} KiB");
    dsm.barrier()?;
    if rank == 0 {
        let met = dsm.view(&meetings).get(0);
        let want = n as u64 * (iters / MEET_EVERY);
        if met != want {
            fail(&format!("{met} meetings under the lock, expected {want}"));
        }
        println!(
            "verified: lock-only, {n} ranks x {iters} iterations ({} intervals), {met} meetings, {:.3} s",
            2 * iters * n as u64,
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn own_locks(dsm: &mut Dsm, iters: u64) -> anyhow::Result<()> {
    const SLOTS: usize = 512;
    const SHARE_EVERY: u64 = 100;
    let (rank, n) = (dsm.rank(), dsm.size());
    let planted = dsm.alloc::<u64>("planted", 8)?;
    let own = dsm.alloc::<u64>("own", SLOTS * n)?;
    let shared = dsm.alloc::<u64>("shared", 8)?;
    dsm.assume_initialised(&shared);
    if rank == 0 {
        dsm.view(&planted).set(3, 1);
    } else if rank == n - 1 {
        std::hint::black_box(dsm.view(&planted).get(3));
    }
    let start = Instant::now();
    for i in 0..iters {
        {
            let g = dsm.lock(100 + rank as u64)?;
            g.view(&own).set(rank * SLOTS + (i as usize % SLOTS), i);
        }
        if i % SHARE_EVERY == SHARE_EVERY - 1 {
            let g = dsm.lock(7)?;
            let v = g.view(&shared);
            v.set(0, v.get(0) + 1);
        }
    }
    println!(
        "rank {rank}: {iters} iterations, peak RSS {} KiB",
        peak_rss_kib()?
    );
    dsm.barrier()?;
    if rank == 0 {
        let sum = dsm.view(&shared).get(0);
        let want = n as u64 * (iters / SHARE_EVERY);
        if sum != want {
            fail(&format!("shared counter {sum}, expected {want}"));
        }
        println!(
            "verified: own-locks, {n} ranks x {iters} iterations, {:.3} s",
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// This process's peak resident memory (VmHWM), in KiB.
fn peak_rss_kib() -> anyhow::Result<usize> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM in /proc/self/status")
}

fn checks(dsm: &mut Dsm, bug: &str) -> anyhow::Result<()> {
    const LEN: usize = 1024;
    let (rank, n) = (dsm.rank(), dsm.size());
    let field = dsm.alloc::<u64>("field", LEN)?;
    let message = dsm.alloc::<u64>("message", 4)?;
    let posted = dsm.alloc::<u64>("posted", 1)?;
    // `posted` starts at zero on purpose: rank 1 polls it before rank 0 sets it.
    dsm.assume_initialised(&posted);
    dsm.declare_region(&field, dsm_core::RegionRule::Writes, |r| {
        dsm_core::band(LEN, n, r)
    });
    {
        let v = dsm.view(&field);
        for i in dsm_core::band(LEN, n, rank) {
            if !(bug == "uninit" && (3..6).contains(&i)) {
                v.set(i, i as u64 * 3);
            }
        }
    }
    // A hand-off inside the epoch: the message is initialised before rank 1 reads it,
    // ordered only by the lock.
    if rank == 0 {
        let g = dsm.lock_named("post")?;
        g.view(&message).set(0, 42);
        g.view(&posted).set(0, 1);
    } else if rank == 1 {
        loop {
            let g = dsm.lock_named("post")?;
            if g.view(&posted).get(0) == 1 {
                anyhow::ensure!(g.view(&message).get(0) == 42, "hand-off lost the message");
                break;
            }
            drop(g);
            std::thread::yield_now();
        }
    }
    dsm.barrier()?;
    let sum: u64 = (0..LEN).map(|i| dsm.view(&field).get(i)).sum();
    dsm.barrier()?;
    if bug == "region" && rank == n - 1 && n > 1 {
        dsm.view(&field).set(0, 7);
    }
    dsm.barrier()?;
    if rank == 0 {
        println!("verified: checks kernel ran (--bug {bug}), field sum {sum}");
    }
    Ok(())
}

fn lock_order(dsm: &mut Dsm, rounds: u64, work: u64) -> anyhow::Result<()> {
    let n = dsm.size() as u64;
    let total = (n * rounds) as usize;
    let order = dsm.alloc_with::<u64>("order", total + 1, Distribution::OnNode(0))?;
    let last = dsm.alloc_with::<u64>("last", 1, Distribution::OnNode(0))?;
    let me = dsm.rank() as u64;
    let mut x = me + 1;
    for _ in 0..rounds {
        for _ in 0..work {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        {
            let g = dsm.lock_named("lock-order")?;
            let v = g.view(&order);
            let next = v.get(total);
            v.set(next as usize, me);
            v.set(total, next + 1);
        }
        // Every node writes the same value: the race shows in the race log, but which
        // write lands last (a matter of timing, not of lock order) changes no value, so a
        // replay must end with the recorded values.
        dsm.view(&last).set(0, 1);
    }
    dsm.barrier()?;
    if dsm.rank() == 0 {
        let v = dsm.view(&order);
        let taken: Vec<u64> = (0..total).map(|i| v.get(i)).collect();
        if v.get(total) != total as u64 {
            fail(&format!("{} entries, expected {total}", v.get(total)));
        }
        for r in 0..n {
            let count = taken.iter().filter(|&&t| t == r).count() as u64;
            if count != rounds {
                fail(&format!(
                    "rank {r} appears {count} times, expected {rounds}"
                ));
            }
        }
        let list: Vec<String> = taken.iter().map(u64::to_string).collect();
        println!("order: {}", list.join(" "));
        println!("verified: {n} nodes took the lock {rounds} times each, {total} entries",);
    }
    Ok(())
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
