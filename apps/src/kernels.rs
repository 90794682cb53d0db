//! Labelled race kernels: small SPMD programs with a known answer, each either racy (and
//! then exactly which variable and elements race is known) or race-free. They exercise the
//! detector's precision (false sharing, neighbouring bytes, strided access, ordering through
//! locks held by third nodes) and recall (missing barriers, unlocked updates, racy reads).
//!
//! Every kernel ends with the caller's `finish`, so races after the last barrier are found
//! by the analysis at exit.
//!
//! In the racy kernels, every line with an access that takes part in a race ends with a
//! `// RACE` comment: `apps/tests/pinpoint.rs` finds them by grep and checks that pinpoint
//! mode (`dsmrun --pinpoint-log`) reports exactly those lines as the races' two sides.

use dsm_core::{band, Distribution, Dsm, DsmError};
use std::collections::BTreeSet;

/// What the detector must report for a kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// No race at all.
    NoRace,
    /// Races on exactly these variables; `Some(indices)` pins the element indices exactly,
    /// `None` accepts any element of the variable (the set depends on lock order).
    Races(Vec<(&'static str, Option<BTreeSet<usize>>)>),
}

#[derive(Clone, Copy)]
pub struct Kernel {
    pub name: &'static str,
    pub about: &'static str,
    /// Fewest nodes the kernel needs.
    pub min_nodes: usize,
    pub run: fn(&mut Dsm) -> Result<(), DsmError>,
    pub expect: fn(usize) -> Expect,
}

fn set(it: impl IntoIterator<Item = usize>) -> Option<BTreeSet<usize>> {
    Some(it.into_iter().collect())
}

const K: usize = 8;

/// Waits (polling under `lock`) until `flag[0] >= value`.
fn wait_flag(
    dsm: &mut Dsm,
    lock: u64,
    flag: &dsm_core::Array<u64>,
    value: u64,
) -> Result<(), DsmError> {
    loop {
        let g = dsm.lock(lock)?;
        if g.view(flag).get(0) >= value {
            return Ok(());
        }
        drop(g);
        std::thread::yield_now();
    }
}

fn set_flag(
    dsm: &mut Dsm,
    lock: u64,
    flag: &dsm_core::Array<u64>,
    value: u64,
) -> Result<(), DsmError> {
    let g = dsm.lock(lock)?;
    g.view(flag).set(0, value);
    Ok(())
}

fn missing_barrier(dsm: &mut Dsm) -> Result<(), DsmError> {
    let data = dsm.alloc::<u64>("data", K)?;
    let sink = dsm.alloc::<u64>("sink", dsm.size())?;
    let v = dsm.view(&data);
    if dsm.rank() == 0 {
        for i in 0..K {
            v.set(i, i as u64 + 1); // RACE
        }
    } else {
        let s: u64 = (0..K).map(|i| v.get(i)).sum(); // RACE
        dsm.view(&sink).set(dsm.rank(), s);
    }
    Ok(())
}

fn with_barrier(dsm: &mut Dsm) -> Result<(), DsmError> {
    let data = dsm.alloc::<u64>("data", K)?;
    let sink = dsm.alloc::<u64>("sink", dsm.size())?;
    if dsm.rank() == 0 {
        let v = dsm.view(&data);
        for i in 0..K {
            v.set(i, i as u64 + 1);
        }
    }
    dsm.barrier()?;
    if dsm.rank() != 0 {
        let v = dsm.view(&data);
        let s: u64 = (0..K).map(|i| v.get(i)).sum();
        dsm.view(&sink).set(dsm.rank(), s);
    }
    Ok(())
}

fn unprotected_counter(dsm: &mut Dsm) -> Result<(), DsmError> {
    let c = dsm.alloc::<u64>("counter", 1)?;
    let v = dsm.view(&c);
    for _ in 0..10 {
        v.set(0, v.get(0) + 1); // RACE
    }
    Ok(())
}

fn locked_counter(dsm: &mut Dsm) -> Result<(), DsmError> {
    let c = dsm.alloc::<u64>("counter", 1)?;
    for _ in 0..10 {
        let g = dsm.lock(1)?;
        let v = g.view(&c);
        v.set(0, v.get(0) + 1);
    }
    dsm.barrier()?;
    if dsm.view(&c).get(0) != 10 * dsm.size() as u64 {
        return Err(DsmError::Protocol("locked counter lost updates".into()));
    }
    Ok(())
}

/// Node 0 publishes a flag under lock 1, then (the bug) writes `x` after unlocking; node 1
/// waits for the flag and reads `x` under the lock.
fn handoff_write_after_unlock(dsm: &mut Dsm) -> Result<(), DsmError> {
    let x = dsm.alloc::<u64>("x", 4)?;
    let flag = dsm.alloc::<u64>("flag", 1)?;
    match dsm.rank() {
        0 => {
            set_flag(dsm, 1, &flag, 1)?;
            dsm.view(&x).set(2, 42); // RACE
        }
        1 => {
            wait_flag(dsm, 1, &flag, 1)?;
            let g = dsm.lock(1)?;
            let _ = g.view(&x).get(2); // RACE
        }
        _ => {}
    }
    Ok(())
}

fn handoff_write_before_unlock(dsm: &mut Dsm) -> Result<(), DsmError> {
    let x = dsm.alloc::<u64>("x", 4)?;
    let flag = dsm.alloc::<u64>("flag", 1)?;
    match dsm.rank() {
        0 => {
            let g = dsm.lock(1)?;
            g.view(&x).set(2, 42);
            g.view(&flag).set(0, 1);
        }
        1 => {
            wait_flag(dsm, 1, &flag, 1)?;
            // Ordered after node 0's release by the acquire that saw the flag.
            if dsm.view(&x).get(2) != 42 {
                return Err(DsmError::Protocol("hand-off lost the write".into()));
            }
        }
        _ => {}
    }
    Ok(())
}

/// A barrier built from a lock-protected arrival counter, polled under the lock.
fn lock_barrier(dsm: &mut Dsm, broken: bool) -> Result<(), DsmError> {
    let n = dsm.size();
    let count = dsm.alloc::<u64>("count", 1)?;
    let data = dsm.alloc::<u64>("data", n)?;
    let me = dsm.rank();
    dsm.view(&data).set(me, me as u64 + 100); // RACE
    {
        let g = dsm.lock(2)?;
        let v = g.view(&count);
        v.set(0, v.get(0) + 1); // RACE
    }
    if broken {
        // The bug: polling the counter without the lock. Under lazy release consistency
        // the poll may never see the final count, so it gives up after a while.
        for _ in 0..200 {
            let seen = dsm.view(&count).get(0); // RACE
            if seen == n as u64 {
                break;
            }
            std::thread::yield_now();
        }
    } else {
        wait_flag(dsm, 2, &count, n as u64)?;
    }
    let v = dsm.view(&data);
    let s: u64 = (0..n).filter(|&k| k != me).map(|k| v.get(k)).sum(); // RACE
    if !broken
        && s != (0..n)
            .filter(|&k| k != me)
            .map(|k| k as u64 + 100)
            .sum::<u64>()
    {
        return Err(DsmError::Protocol("lock barrier lost data".into()));
    }
    Ok(())
}

fn false_sharing(dsm: &mut Dsm) -> Result<(), DsmError> {
    let n = dsm.size();
    let a = dsm.alloc_with::<f64>("cells", 512, Distribution::OnNode(0))?;
    let v = dsm.view(&a);
    for i in (dsm.rank()..512).step_by(n) {
        v.set(i, i as f64);
    }
    Ok(())
}

fn byte_neighbours(dsm: &mut Dsm) -> Result<(), DsmError> {
    let n = dsm.size();
    let a = dsm.alloc_with::<u8>("bytes", 4096, Distribution::OnNode(n - 1))?;
    let v = dsm.view(&a);
    for i in (dsm.rank()..4096).step_by(n) {
        v.set(i, (i % 250) as u8 + 1);
    }
    Ok(())
}

fn boundary_read(dsm: &mut Dsm) -> Result<(), DsmError> {
    let n = dsm.size();
    let len = 64 * n;
    let a = dsm.alloc::<f64>("field", len)?;
    let mine = band(len, n, dsm.rank());
    let v = dsm.view(&a);
    for i in mine.clone() {
        v.set(i, i as f64); // RACE
    }
    // The bug: reading the left neighbour's last element without a barrier first.
    if mine.start > 0 {
        let _ = v.get(mine.start - 1); // RACE
    }
    Ok(())
}

fn reduction_unlocked(dsm: &mut Dsm) -> Result<(), DsmError> {
    let sum = dsm.alloc::<f64>("sum", 1)?;
    let partial: f64 = (0..100).map(|i| (i * (dsm.rank() + 1)) as f64).sum();
    let v = dsm.view(&sum);
    v.set(0, v.get(0) + partial); // RACE
    Ok(())
}

fn reduction_locked(dsm: &mut Dsm) -> Result<(), DsmError> {
    let sum = dsm.alloc::<f64>("sum", 1)?;
    let partial: f64 = (0..100).map(|i| (i * (dsm.rank() + 1)) as f64).sum();
    let g = dsm.lock(3)?;
    let v = g.view(&sum);
    v.set(0, v.get(0) + partial);
    Ok(())
}

const BIG: usize = 64 * 512;
const HOT: usize = 1234;

fn one_element(dsm: &mut Dsm) -> Result<(), DsmError> {
    let n = dsm.size();
    let a = dsm.alloc::<u64>("big", BIG)?;
    let v = dsm.view(&a);
    let mine = band(BIG, n, dsm.rank());
    let block: Vec<u64> = mine.clone().map(|i| i as u64).collect();
    v.write_from(mine.start, &block); // RACE
    if dsm.rank() == n - 1 {
        // The bug: one stray write into rank 0's block.
        v.set(HOT, 7); // RACE
    }
    Ok(())
}

fn indirect_targets(rank: usize, n: usize, collide: bool) -> Vec<usize> {
    // Each node updates 6 histogram bins through an index array; in the colliding variant
    // ranks 0 and 1 both hit bin 17.
    let mut t: Vec<usize> = (0..6).map(|k| 3 + (k * n + rank) * 5).collect();
    if collide && rank <= 1 {
        t[3] = 17;
    }
    t
}

fn indirect(dsm: &mut Dsm, collide: bool) -> Result<(), DsmError> {
    let n = dsm.size();
    let idx = dsm.alloc::<u32>("index", 6 * n)?;
    let hist = dsm.alloc::<u32>("hist", 512)?;
    {
        let v = dsm.view(&idx);
        for (k, t) in indirect_targets(dsm.rank(), n, collide)
            .into_iter()
            .enumerate()
        {
            v.set(dsm.rank() * 6 + k, t as u32);
        }
    }
    dsm.barrier()?;
    let iv = dsm.view(&idx);
    let hv = dsm.view(&hist);
    for k in 0..6 {
        let t = iv.get(dsm.rank() * 6 + k) as usize;
        hv.set(t, hv.get(t) + 1); // RACE
    }
    Ok(())
}

fn tsp_bound(dsm: &mut Dsm) -> Result<(), DsmError> {
    let bound = dsm.alloc::<u64>("bound", 1)?;
    let work = dsm.alloc::<u64>("found", dsm.size())?;
    if dsm.rank() == 0 {
        dsm.view(&bound).set(0, u64::MAX);
    }
    dsm.barrier()?;
    let me = dsm.rank() as u64;
    for step in 0..20u64 {
        let candidate = 1000 - step * 7 - me;
        // The racy read, as in TSP: prune against the bound without the lock.
        let seen = dsm.view(&bound).get(0); // RACE
        if candidate < seen {
            let g = dsm.lock(4)?;
            let v = g.view(&bound);
            if candidate < v.get(0) {
                v.set(0, candidate); // RACE
            }
        }
    }
    dsm.view(&work).set(dsm.rank(), 1);
    Ok(())
}

/// Node 0 writes `x`, then signals node 2 through lock 5; node 2 signals node 1 through
/// lock 6; node 1 then writes `x`. The two writes are ordered only through node 2.
fn third_node_lock(dsm: &mut Dsm) -> Result<(), DsmError> {
    let x = dsm.alloc::<u64>("x", 1)?;
    let fa = dsm.alloc::<u64>("flag_a", 1)?;
    let fb = dsm.alloc::<u64>("flag_b", 1)?;
    match dsm.rank() {
        0 => {
            dsm.view(&x).set(0, 1);
            set_flag(dsm, 5, &fa, 1)?;
        }
        2 => {
            wait_flag(dsm, 5, &fa, 1)?;
            set_flag(dsm, 6, &fb, 1)?;
        }
        1 => {
            wait_flag(dsm, 6, &fb, 1)?;
            let v = dsm.view(&x);
            if v.get(0) != 1 {
                return Err(DsmError::Protocol(
                    "transitive ordering lost the write".into(),
                ));
            }
            v.set(0, 2);
        }
        _ => {}
    }
    Ok(())
}

fn read_only_table(dsm: &mut Dsm) -> Result<(), DsmError> {
    let t = dsm.alloc::<u32>("table", 1024)?;
    if dsm.rank() == 0 {
        let v = dsm.view(&t);
        for i in 0..1024 {
            v.set(i, i as u32 * 3);
        }
    }
    dsm.barrier()?;
    let v = dsm.view(&t);
    let s: u64 = (0..1024).map(|i| v.get(i) as u64).sum();
    if s != (0..1024u64).map(|i| i * 3).sum::<u64>() {
        return Err(DsmError::Protocol("table read wrong".into()));
    }
    Ok(())
}

fn write_write(dsm: &mut Dsm) -> Result<(), DsmError> {
    let a = dsm.alloc::<i32>("cell", 16)?;
    if dsm.rank() <= 1 {
        dsm.view(&a).set(9, dsm.rank() as i32 + 1); // RACE
    }
    Ok(())
}

fn different_locks(dsm: &mut Dsm) -> Result<(), DsmError> {
    let a = dsm.alloc::<u64>("total", 2)?;
    // The bug: each node protects the same variable with its own lock.
    let g = dsm.lock(100 + dsm.rank() as u64)?;
    let v = g.view(&a);
    v.set(1, v.get(1) + 1); // RACE
    Ok(())
}

/// Each node re-takes its own lock many times (with race detection, the releases that no
/// other node observed continue one interval), and one critical section of each touches
/// a variable the other nodes touch under their own locks.
fn own_lock_sections(dsm: &mut Dsm) -> Result<(), DsmError> {
    const SECTIONS: usize = 64;
    let (rank, n) = (dsm.rank(), dsm.size());
    let own = dsm.alloc::<u64>("own", SECTIONS * n)?;
    let shared = dsm.alloc::<u64>("common", 4)?;
    let lock = 200 + rank as u64;
    let section = |dsm: &mut Dsm, i: usize| -> Result<(), DsmError> {
        let g = dsm.lock(lock)?;
        g.view(&own).set(rank * SECTIONS + i, i as u64);
        Ok(())
    };
    for i in 0..SECTIONS / 2 {
        section(dsm, i)?;
    }
    let g = dsm.lock(lock)?;
    let v = g.view(&shared);
    v.set(3, v.get(3) + 1); // RACE
    drop(g);
    for i in SECTIONS / 2..SECTIONS {
        section(dsm, i)?;
    }
    Ok(())
}

/// Node 0 writes `late` after releasing a lock that node 1 then takes, and only later
/// takes that lock again: the write is not ordered before node 1's read, and the
/// re-acquire must not fold it into the interval node 1 learned of.
fn relock_after_handoff(dsm: &mut Dsm) -> Result<(), DsmError> {
    let late = dsm.alloc::<u64>("late", 2)?;
    let flag = dsm.alloc::<u64>("flag", 1)?;
    match dsm.rank() {
        0 => {
            set_flag(dsm, 1, &flag, 1)?;
            dsm.view(&late).set(1, 9); // RACE
                                       // Node 1 takes the lock meanwhile (it waits for the flag).
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(dsm.lock(1)?);
        }
        1 => {
            wait_flag(dsm, 1, &flag, 1)?;
            let _ = dsm.view(&late).get(1); // RACE
        }
        _ => {}
    }
    Ok(())
}

/// Node 0 writes `x[0]` and the flag under a lock, then `x[1]` (the same page) after the
/// unlock; node 1 takes the lock once the flag is set and reads both. Only the write after
/// the unlock races: the page's accesses before and after the unlock must be told apart.
fn write_after_unlock_same_page(dsm: &mut Dsm) -> Result<(), DsmError> {
    let x = dsm.alloc::<u64>("x", 4)?;
    let flag = dsm.alloc::<u64>("flag", 1)?;
    match dsm.rank() {
        0 => {
            {
                let g = dsm.lock(1)?;
                g.view(&x).set(0, 7);
                g.view(&flag).set(0, 1);
            }
            dsm.view(&x).set(1, 9); // RACE
            let g = dsm.lock(2)?;
            g.view(&x).set(2, 5);
        }
        1 => {
            wait_flag(dsm, 1, &flag, 1)?;
            if dsm.view(&x).get(0) != 7 {
                return Err(DsmError::Protocol(
                    "the critical section's write was lost".into(),
                ));
            }
            let _ = dsm.view(&x).get(1); // RACE
        }
        _ => {}
    }
    Ok(())
}

fn strided_disjoint(dsm: &mut Dsm) -> Result<(), DsmError> {
    let n = dsm.size();
    let a = dsm.alloc_with::<f64>("lattice", 4 * 512, Distribution::OnNode(0))?;
    let v = dsm.view(&a);
    let count = 4 * 512 / n;
    let out = v.strided_mut(dsm.rank(), n, count);
    for k in 0..count {
        out.set(k, k as f64);
    }
    Ok(())
}

fn bulk_overlap(dsm: &mut Dsm) -> Result<(), DsmError> {
    let a = dsm.alloc::<u32>("buffer", 4096)?;
    match dsm.rank() {
        0 => dsm.view(&a).write_from(100, &[5u32; 50]), // RACE
        1 => {
            let mut out = [0u32; 40];
            dsm.view(&a).read_into(130, &mut out); // RACE
        }
        _ => {}
    }
    Ok(())
}

const COLS: usize = 16;

fn grid_cell(dsm: &mut Dsm) -> Result<(), DsmError> {
    let n = dsm.size();
    let g = dsm.alloc_2d::<f64>("grid", 4 * n, COLS)?;
    let v = dsm.view(&g);
    for r in band(4 * n, n, dsm.rank()) {
        for c in 0..COLS {
            v.set2(r, c, (r * COLS + c) as f64); // RACE
        }
    }
    if dsm.rank() == 1 {
        // The bug: a write into rank 0's rows.
        v.set2(2, 7, -1.0); // RACE
    }
    Ok(())
}

fn after_last_barrier(dsm: &mut Dsm) -> Result<(), DsmError> {
    let a = dsm.alloc::<u64>("late", 4)?;
    dsm.barrier()?;
    dsm.barrier()?;
    // Racy writes after the last barrier: only the analysis at exit can see them.
    dsm.view(&a).set(3, dsm.rank() as u64); // RACE
    Ok(())
}

fn lock_protected_structs(dsm: &mut Dsm) -> Result<(), DsmError> {
    let n = dsm.size();
    let a = dsm.alloc::<[f64; 3]>("particles", 8 * n)?;
    // Each particle has its own lock; nodes add into all particles.
    for round in 0..2 {
        for p in 0..8 * n {
            let g = dsm.lock(200 + p as u64)?;
            let v = g.view(&a);
            let mut x = v.get(p);
            x[round % 3] += 1.0;
            v.set(p, x);
        }
    }
    Ok(())
}

fn two_epochs(dsm: &mut Dsm) -> Result<(), DsmError> {
    let first = dsm.alloc::<u64>("first", 2)?;
    let second = dsm.alloc::<u64>("second", 2)?;
    // Epoch 1: everyone writes first[0]; epoch 2: everyone writes second[1]. With
    // --race-first only the epoch-1 races are reported: they affect everything after.
    dsm.view(&first).set(0, dsm.rank() as u64); // RACE
    dsm.barrier()?;
    dsm.view(&second).set(1, dsm.rank() as u64); // RACE
    dsm.barrier()?;
    Ok(())
}

/// A token passed around a ring of semaphores: rank i waits on `ring{i}`, reads what rank
/// i-1 wrote, writes its own slot and signals `ring{i+1}`; rank 0 starts and ends it.
fn sem_ring(dsm: &mut Dsm) -> Result<(), DsmError> {
    let n = dsm.size();
    let me = dsm.rank();
    let token = dsm.alloc::<u64>("token", n)?;
    let mut sems = Vec::new();
    for i in 0..n {
        sems.push(dsm.semaphore(&format!("ring{i}"), 0)?);
    }
    if me == 0 {
        dsm.view(&token).set(0, 1);
        dsm.signal(&sems[1 % n])?;
        dsm.wait(&sems[0])?;
        let got = dsm.view(&token).get(n - 1);
        assert_eq!(got, n as u64, "the ring's last value");
    } else {
        dsm.wait(&sems[me])?;
        let prev = dsm.view(&token).get(me - 1);
        assert_eq!(prev, me as u64, "value from rank {}", me - 1);
        dsm.view(&token).set(me, prev + 1);
        dsm.signal(&sems[(me + 1) % n])?;
    }
    Ok(())
}

const SLOTS: usize = 4;
const ITEMS: u64 = 24;

/// A bounded buffer of 4 slots between a producer (rank 0) and a consumer (rank 1) with
/// the classic `empty` (4 initial tokens) and `full` (0) semaphores.
fn sem_bounded_buffer(dsm: &mut Dsm) -> Result<(), DsmError> {
    let buf = dsm.alloc::<u64>("buffer", SLOTS)?;
    let empty = dsm.semaphore("empty", SLOTS as u32)?;
    let full = dsm.semaphore("full", 0)?;
    match dsm.rank() {
        0 => {
            for i in 0..ITEMS {
                dsm.wait(&empty)?;
                dsm.view(&buf).set(i as usize % SLOTS, 1000 + i);
                dsm.signal(&full)?;
            }
        }
        1 => {
            for i in 0..ITEMS {
                dsm.wait(&full)?;
                let got = dsm.view(&buf).get(i as usize % SLOTS);
                assert_eq!(got, 1000 + i, "item {i}");
                dsm.signal(&empty)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// A semaphore with one token used as a lock around a shared counter.
fn sem_as_lock(dsm: &mut Dsm) -> Result<(), DsmError> {
    let counter = dsm.alloc::<u64>("counter", 1)?;
    let mutex = dsm.semaphore("mutex", 1)?;
    for _ in 0..3 {
        dsm.wait(&mutex)?;
        let v = dsm.view(&counter);
        v.set(0, v.get(0) + 1);
        dsm.signal(&mutex)?;
    }
    dsm.barrier()?;
    let total = dsm.view(&counter).get(0);
    assert_eq!(total, 3 * dsm.size() as u64, "counter under the semaphore");
    Ok(())
}

/// Rank 0 hands x[2] to rank 1 through a semaphore; `write_first` puts the write before
/// the signal (ordered), otherwise after it (a race with rank 1's read).
fn sem_handoff(dsm: &mut Dsm, write_first: bool) -> Result<(), DsmError> {
    let x = dsm.alloc::<u64>("x", 4)?;
    let s = dsm.semaphore("handoff", 0)?;
    match dsm.rank() {
        0 => {
            if write_first {
                dsm.view(&x).set(2, 42);
                dsm.signal(&s)?;
            } else {
                dsm.signal(&s)?;
                dsm.view(&x).set(2, 42); // RACE
            }
        }
        1 => {
            dsm.wait(&s)?;
            let got = dsm.view(&x).get(2); // RACE
            if write_first {
                assert_eq!(got, 42, "data written before the signal");
            }
        }
        _ => {}
    }
    Ok(())
}

/// Two signals of one semaphore, one of them after a write: which signal the reader's wait
/// consumes decides whether its read races. Rank 2 signals at once (writing nothing);
/// rank 0 writes d[0] and signals a second later, so in practice rank 1's first wait
/// consumes rank 2's signal and its read of d[0] races with rank 0's write. A detector
/// that orders a wait after every earlier signal would hide it whenever rank 0's signal
/// happened to come first in real time; this one orders the wait after its own signal.
fn sem_pairing_dependent(dsm: &mut Dsm) -> Result<(), DsmError> {
    let d = dsm.alloc::<u64>("d", 2)?;
    let s = dsm.semaphore("either", 0)?;
    match dsm.rank() {
        0 => {
            std::thread::sleep(std::time::Duration::from_secs(1));
            dsm.view(&d).set(0, 7); // RACE
            dsm.signal(&s)?;
        }
        1 => {
            dsm.wait(&s)?;
            let _ = dsm.view(&d).get(0); // RACE
            dsm.wait(&s)?;
        }
        2 => dsm.signal(&s)?,
        _ => {}
    }
    Ok(())
}

/// The mirror image of [`sem_pairing_dependent`]: rank 0 writes d[0] and signals at once,
/// rank 2 signals a second later without writing, so the run pairs rank 1's first wait
/// with rank 0's signal and its read of d[0] is ordered: no race under the observed order.
/// Had rank 2's signal come first, the read would race; `--sem-order=safe` reports it.
fn sem_pairing_hidden(dsm: &mut Dsm) -> Result<(), DsmError> {
    let d = dsm.alloc::<u64>("d", 2)?;
    let s = dsm.semaphore("either", 0)?;
    match dsm.rank() {
        0 => {
            dsm.view(&d).set(0, 7);
            dsm.signal(&s)?;
        }
        1 => {
            dsm.wait(&s)?;
            let _ = dsm.view(&d).get(0);
            dsm.wait(&s)?;
        }
        2 => {
            std::thread::sleep(std::time::Duration::from_secs(1));
            dsm.signal(&s)?;
        }
        _ => {}
    }
    Ok(())
}

/// Many hand-offs in one job: ranks 0 and 1 ping-pong a value through two semaphores, each
/// checking it sees the other's last write (visibility under LRC).
pub fn sem_pingpong(dsm: &mut Dsm, rounds: u64) -> Result<(), DsmError> {
    let cell = dsm.alloc::<u64>("cell", 1)?;
    let ping = dsm.semaphore("ping", 0)?;
    let pong = dsm.semaphore("pong", 0)?;
    match dsm.rank() {
        0 => {
            for r in 0..rounds {
                dsm.view(&cell).set(0, 2 * r + 1);
                dsm.signal(&ping)?;
                dsm.wait(&pong)?;
                let got = dsm.view(&cell).get(0);
                if got != 2 * r + 2 {
                    return Err(DsmError::Config(format!(
                        "round {r}: rank 0 saw {got}, expected {}",
                        2 * r + 2
                    )));
                }
            }
        }
        1 => {
            for r in 0..rounds {
                dsm.wait(&ping)?;
                let got = dsm.view(&cell).get(0);
                if got != 2 * r + 1 {
                    return Err(DsmError::Config(format!(
                        "round {r}: rank 1 saw {got}, expected {}",
                        2 * r + 1
                    )));
                }
                dsm.view(&cell).set(0, 2 * r + 2);
                dsm.signal(&pong)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Semaphores in three barrier epochs: rank 0 writes a value and signals `epoch-s` once per
/// rank, each other rank waits once and reads it (one token is left over); after a barrier
/// rank 1 takes the leftover token, and every rank but 0 writes its slot and signals
/// `epoch-t`, which rank 0 waits on once per rank before reading every slot; a last barrier
/// ends with nothing. The `--sem-trace` test reads the barriers back.
fn sem_barrier_epochs(dsm: &mut Dsm) -> Result<(), DsmError> {
    let n = dsm.size();
    let me = dsm.rank();
    let data = dsm.alloc::<u64>("epoch-data", n)?;
    let s = dsm.semaphore("epoch-s", 0)?;
    let t = dsm.semaphore("epoch-t", 0)?;
    if me == 0 {
        dsm.view(&data).set(0, 7);
        for _ in 0..n {
            dsm.signal(&s)?;
        }
    } else {
        dsm.wait(&s)?;
        let got = dsm.view(&data).get(0);
        assert_eq!(got, 7, "rank 0's value after the wait");
    }
    dsm.barrier()?;
    if me == 1 {
        dsm.wait(&s)?;
    }
    if me == 0 {
        for _ in 1..n {
            dsm.wait(&t)?;
        }
        let v = dsm.view(&data);
        for i in 1..n {
            assert_eq!(v.get(i), 100 + i as u64, "rank {i}'s slot after its signal");
        }
    } else {
        dsm.view(&data).set(me, 100 + me as u64);
        dsm.signal(&t)?;
    }
    dsm.barrier()?;
    Ok(())
}

/// Every kernel, in the order `race-kernel list` prints them.
pub fn all() -> Vec<Kernel> {
    KERNELS.to_vec()
}

/// The labelled kernels, as data: `race_lines` in the apps' tests finds a kernel's function
/// from the `run:` line of its entry here.
static KERNELS: &[Kernel] = &[
    Kernel {
        name: "sem-ring",
        about: "a token passed around a ring of semaphores, each rank reading its predecessor's write",
        min_nodes: 2,
        run: sem_ring,
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "sem-bounded-buffer",
        about: "a 4-slot bounded buffer with empty/full semaphores between a producer and a consumer",
        min_nodes: 2,
        run: sem_bounded_buffer,
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "sem-as-lock",
        about: "a semaphore with one token used as a lock around a shared counter",
        min_nodes: 2,
        run: sem_as_lock,
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "sem-handoff-write-after-signal",
        about: "a semaphore hand-off where the data is written after the signal",
        min_nodes: 2,
        run: |d| sem_handoff(d, false),
        expect: |_| Expect::Races(vec![("x", set([2]))]),
    },
    Kernel {
        name: "sem-handoff-write-before-signal",
        about: "a semaphore hand-off where the data is written before the signal",
        min_nodes: 2,
        run: |d| sem_handoff(d, true),
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "sem-pairing-hidden",
        about: "a read after a wait the run paired with the writer's signal; another pairing races (--sem-order=safe)",
        min_nodes: 3,
        run: sem_pairing_hidden,
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "sem-pairing-dependent",
        about: "a read after a wait whose race depends on which of two signals it consumed",
        min_nodes: 3,
        run: sem_pairing_dependent,
        expect: |_| Expect::Races(vec![("d", set([0]))]),
    },
    Kernel {
        name: "sem-barrier-epochs",
        about: "semaphore hand-offs in two barrier epochs, a token left over across the barrier",
        min_nodes: 2,
        run: sem_barrier_epochs,
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "missing-barrier",
        about: "rank 0 produces data that the others consume with no barrier in between",
        min_nodes: 2,
        run: missing_barrier,
        expect: |_| Expect::Races(vec![("data", set(0..K))]),
    },
    Kernel {
        name: "with-barrier",
        about: "the same producer/consumer with a barrier in between",
        min_nodes: 2,
        run: with_barrier,
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "unprotected-counter",
        about: "every node increments a shared counter without a lock",
        min_nodes: 2,
        run: unprotected_counter,
        expect: |_| Expect::Races(vec![("counter", set([0]))]),
    },
    Kernel {
        name: "locked-counter",
        about: "every node increments a shared counter under one lock",
        min_nodes: 2,
        run: locked_counter,
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "handoff-write-after-unlock",
        about: "a lock hand-off where the data is written after the unlock",
        min_nodes: 2,
        run: handoff_write_after_unlock,
        expect: |_| Expect::Races(vec![("x", set([2]))]),
    },
    Kernel {
        name: "handoff-write-before-unlock",
        about: "a lock hand-off where the data is written before the unlock",
        min_nodes: 2,
        run: handoff_write_before_unlock,
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "lock-barrier",
        about: "a barrier built correctly from a lock-protected counter",
        min_nodes: 2,
        run: |d| lock_barrier(d, false),
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "broken-lock-barrier",
        about: "a barrier built from locks whose counter is polled without the lock",
        min_nodes: 2,
        run: |d| lock_barrier(d, true),
        expect: |_| Expect::Races(vec![("count", set([0])), ("data", None)]),
    },
    Kernel {
        name: "false-sharing",
        about: "neighbouring f64 elements of one page written by different nodes",
        min_nodes: 2,
        run: false_sharing,
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "byte-neighbours",
        about: "neighbouring bytes of a u8 array written by different nodes",
        min_nodes: 2,
        run: byte_neighbours,
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "boundary-read",
        about: "each node reads its left neighbour's boundary element without a barrier",
        min_nodes: 2,
        run: boundary_read,
        expect: |n| {
            Expect::Races(vec![(
                "field",
                set((1..n).map(|k| band(64 * n, n, k).start - 1)),
            )])
        },
    },
    Kernel {
        name: "reduction-unlocked",
        about: "a reduction into one shared sum without a lock",
        min_nodes: 2,
        run: reduction_unlocked,
        expect: |_| Expect::Races(vec![("sum", set([0]))]),
    },
    Kernel {
        name: "reduction-locked",
        about: "private partial sums combined under a lock",
        min_nodes: 2,
        run: reduction_locked,
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "one-element",
        about: "a race on one element of a 64-page array",
        min_nodes: 2,
        run: one_element,
        expect: |_| Expect::Races(vec![("big", set([HOT]))]),
    },
    Kernel {
        name: "indirect-collide",
        about: "histogram updates through index arrays whose targets collide",
        min_nodes: 2,
        run: |d| indirect(d, true),
        expect: |_| Expect::Races(vec![("hist", set([17]))]),
    },
    Kernel {
        name: "indirect-disjoint",
        about: "histogram updates through index arrays whose targets are disjoint",
        min_nodes: 2,
        run: |d| indirect(d, false),
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "tsp-bound",
        about: "a global bound read without the lock that guards its updates (as in TSP)",
        min_nodes: 2,
        run: tsp_bound,
        expect: |_| Expect::Races(vec![("bound", set([0]))]),
    },
    Kernel {
        name: "third-node-lock",
        about: "two writes ordered only through a lock chain via a third node",
        min_nodes: 3,
        run: third_node_lock,
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "read-only-table",
        about: "a table written before a barrier and only read after it",
        min_nodes: 2,
        run: read_only_table,
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "write-write",
        about: "two nodes write the same element with no synchronization",
        min_nodes: 2,
        run: write_write,
        expect: |_| Expect::Races(vec![("cell", set([9]))]),
    },
    Kernel {
        name: "different-locks",
        about: "one variable updated under a different lock on each node",
        min_nodes: 2,
        run: different_locks,
        expect: |_| Expect::Races(vec![("total", set([1]))]),
    },
    Kernel {
        name: "own-lock-sections",
        about: "each node re-takes its own lock; one section of each updates a shared cell",
        min_nodes: 2,
        run: own_lock_sections,
        expect: |_| Expect::Races(vec![("common", set([3]))]),
    },
    Kernel {
        name: "relock-after-handoff",
        about: "a write after an unlock another node followed, before the lock is re-taken",
        min_nodes: 2,
        run: relock_after_handoff,
        expect: |_| Expect::Races(vec![("late", set([1]))]),
    },
    Kernel {
        name: "write-after-unlock-same-page",
        about: "a write after an unlock to the page the critical section wrote, read by the next holder",
        min_nodes: 2,
        run: write_after_unlock_same_page,
        expect: |_| Expect::Races(vec![("x", set([1]))]),
    },
    Kernel {
        name: "strided-disjoint",
        about: "interleaved strided writes by all nodes to the same pages",
        min_nodes: 2,
        run: strided_disjoint,
        expect: |_| Expect::NoRace,
    },
    Kernel {
        name: "bulk-overlap",
        about: "a bulk write and a bulk read overlapping in 20 elements, unsynchronized",
        min_nodes: 2,
        run: bulk_overlap,
        expect: |_| Expect::Races(vec![("buffer", set(130..150))]),
    },
    Kernel {
        name: "grid-cell",
        about: "a stray write into another node's rows of a 2-D grid",
        min_nodes: 2,
        run: grid_cell,
        expect: |_| Expect::Races(vec![("grid", set([2 * COLS + 7]))]),
    },
    Kernel {
        name: "after-last-barrier",
        about: "racy writes after the last barrier (found by the analysis at exit)",
        min_nodes: 2,
        run: after_last_barrier,
        expect: |_| Expect::Races(vec![("late", set([3]))]),
    },
    Kernel {
        name: "two-epochs",
        about: "write-write races in two consecutive barrier epochs",
        min_nodes: 2,
        run: two_epochs,
        expect: |_| Expect::Races(vec![("first", set([0])), ("second", set([1]))]),
    },
    Kernel {
        name: "locked-structs",
        about: "3-field structs each updated under its own lock by every node",
        min_nodes: 2,
        run: lock_protected_structs,
        expect: |_| Expect::NoRace,
    },
];
