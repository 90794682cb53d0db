//! Value tracing and comparison on a node (`dsmrun --trace-values FILE` / `--compare
//! FILE`): at every barrier and at `finish()`, every node hashes the 4 KiB blocks it homes
//! of every shared allocation (blocks are pages of the allocation, so hashes are in
//! allocation coordinates and traces do not depend on the node count) into a shared hash
//! array, dsm's own allocation `__dsm_trace_hashes`, which is not traced. An internal
//! barrier (not counted in the program's epochs) publishes the hashes; rank 0 reads them,
//! and records the trace point or compares it with the reference's next one
//! ([`dsm_trace::compare_epoch`]). Rank 0 reads values only for a trace that keeps them or
//! for allocations whose hashes differ from the reference; then a second internal barrier
//! keeps the others from writing the next epoch while it reads.
//!
//! The one place besides `comm::fatal` where the library ends the process: at the first
//! difference (without `--compare-continue`) rank 0 prints it and sets a stop word (one
//! slot past the hashes) before the second internal barrier; after it every rank sees the
//! word and exits with [`exit_codes::VALUES_DIFFER`], together, so that no rank mistakes
//! rank 0's exit for a crash. The launcher reports "values differ".

use super::{AllocMeta, Array, Dsm};
use crate::error::DsmError;
use dsm_proto::{exit_codes, TraceMode, TraceOptions, PAGE_SIZE};
use dsm_trace::{
    compare_epoch, hash_block, AllocTrace, EpochTrace, Header, Sides, Tolerance, TraceReader,
    TraceWriter, BLOCK_BYTES,
};

/// Names of dsm's own allocations start with this; they are not traced.
pub(super) const INTERNAL_PREFIX: &str = dsm_proto::INTERNAL_ALLOC_PREFIX;
/// The shared array of block hashes.
const HASHES_NAME: &str = "__dsm_trace_hashes";
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};

enum Sink {
    Record(Box<TraceWriter<BufWriter<File>>>),
    Compare(Box<TraceReader<BufReader<File>>>),
}

/// Tracing state of rank 0.
pub(super) struct TraceState {
    sink: Option<Sink>,
    options: TraceOptions,
    path: String,
    /// Trace points that differed (`--compare-continue`).
    pub(super) differing: u64,
    /// Bytes written to the trace.
    pub(super) bytes: u64,
    points: u64,
    /// Names of the allocations traced so far (to warn about `--trace-vars` typos).
    seen: std::collections::BTreeSet<String>,
    /// Print the trace's size at finish (`DebugOptions::trace_stats`).
    print_size: bool,
}

fn header() -> Header {
    let mut args = std::env::args();
    let program = args
        .next()
        .map(|p| {
            std::path::Path::new(&p)
                .file_name()
                .map_or(p.clone(), |f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    Header {
        program,
        args: args.collect(),
    }
}

impl TraceState {
    /// Opens the trace (rank 0 only); `None` when tracing is off. `print_size`: say how
    /// large the trace became at finish.
    pub(super) fn open(
        options: &TraceOptions,
        print_size: bool,
    ) -> Result<Option<TraceState>, DsmError> {
        let bad = |path: &std::path::Path, e: &dyn std::fmt::Display| {
            DsmError::Config(format!("value trace '{}': {e}", path.display()))
        };
        let (sink, path) = match &options.mode {
            TraceMode::Off => return Ok(None),
            TraceMode::Record(path) => {
                let f = File::create(path).map_err(|e| bad(path, &e))?;
                let w =
                    TraceWriter::new(BufWriter::new(f), &header()).map_err(|e| bad(path, &e))?;
                (Sink::Record(Box::new(w)), path)
            }
            TraceMode::Compare(path) => {
                let f = File::open(path).map_err(|e| bad(path, &e))?;
                let r = TraceReader::new(BufReader::new(f)).map_err(|e| bad(path, &e))?;
                let mine = header();
                if r.header().program != mine.program {
                    return Err(bad(
                        path,
                        &format!(
                            "it traces program '{}', this is '{}'",
                            r.header().program,
                            mine.program
                        ),
                    ));
                }
                if r.header().args != mine.args {
                    eprintln!(
                        "dsm: note: the reference trace was made with arguments '{}', this run has '{}'",
                        r.header().args.join(" "),
                        mine.args.join(" ")
                    );
                }
                (Sink::Compare(Box::new(r)), path)
            }
        };
        Ok(Some(TraceState {
            sink: Some(sink),
            path: path.display().to_string(),
            options: options.clone(),
            differing: 0,
            bytes: 0,
            points: 0,
            seen: Default::default(),
            print_size,
        }))
    }

    fn keeps_values(&self, name: &str) -> bool {
        match self.sink {
            // Comparing needs this run's values to name the element.
            Some(Sink::Compare(_)) => true,
            _ => self.options.full || self.options.vars.iter().any(|v| v == name),
        }
    }

    fn tolerance(&self) -> Option<Tolerance> {
        let t = Tolerance {
            abs: self.options.abs_tolerance(),
            rel: self.options.rel_tolerance(),
        };
        (t.abs > 0.0 || t.rel > 0.0).then_some(t)
    }

    /// Appends a trace point to a recorded trace.
    fn record(&mut self, epoch: &EpochTrace) -> Result<(), DsmError> {
        self.points += 1;
        for a in &epoch.allocs {
            if !self.seen.contains(&a.name) {
                self.seen.insert(a.name.clone());
            }
        }
        if let Some(Sink::Record(w)) = self.sink.as_mut() {
            self.bytes += w
                .write_epoch(epoch)
                .map_err(|e| DsmError::Config(format!("value trace '{}': {e}", self.path)))?;
        }
        Ok(())
    }

    /// The reference's next trace point, when comparing.
    fn next_reference(&mut self) -> Result<Option<EpochTrace>, DsmError> {
        self.points += 1;
        match self.sink.as_mut() {
            Some(Sink::Compare(r)) => r
                .next_epoch()
                .map_err(|e| DsmError::Config(format!("value trace '{}': {e}", self.path))),
            _ => Ok(None),
        }
    }

    fn comparing(&self) -> bool {
        matches!(self.sink, Some(Sink::Compare(_)))
    }

    /// Prints the differences of a trace point; says whether the job must stop (the first
    /// difference, unless `--compare-continue`).
    fn report(&mut self, label: &str, epoch: u32, diffs: &[dsm_trace::Difference]) -> bool {
        if diffs.is_empty() {
            return false;
        }
        self.differing += 1;
        eprintln!("dsm: values differ from the reference trace at {label} (epoch {epoch}):");
        for d in diffs {
            eprintln!("dsm:   {d}");
        }
        !self.options.continue_all
    }

    /// End of the run: closes a recorded trace; says whether a comparison found
    /// differences.
    pub(super) fn finish(&mut self) -> Result<bool, DsmError> {
        for v in &self.options.vars {
            if !self.seen.contains(v) {
                eprintln!(
                    "dsm: note: --trace-vars names '{v}', but no shared allocation has that name (traced: {})",
                    self.seen.iter().cloned().collect::<Vec<_>>().join(", ")
                );
            }
        }
        if let Some(Sink::Record(w)) = self.sink.take() {
            w.finish()
                .map_err(|e| DsmError::Config(format!("value trace '{}': {e}", self.path)))?;
            if self.print_size {
                eprintln!(
                    "dsm: value trace: {} trace points, {} bytes ({} per point)",
                    self.points,
                    self.bytes,
                    self.bytes / self.points.max(1)
                );
            }
        }
        Ok(self.differing > 0)
    }
}

/// Blocks of an allocation of `bytes` bytes.
fn blocks(bytes: usize) -> usize {
    bytes.div_ceil(BLOCK_BYTES)
}

impl Dsm {
    fn alloc_bytes(&self, a: &AllocMeta) -> Vec<u8> {
        let bytes = a.len * a.elem_size;
        let first = a.first_page as usize;
        let last = first + bytes.div_ceil(PAGE_SIZE) - 1;
        self.prefetch(first, last, false);
        let mem = crate::sys::AppSlice::<u8>::new(self.seg, first * PAGE_SIZE, bytes)
            .expect("allocations lie inside the segment");
        let mut buf = vec![0u8; bytes];
        mem.read_into(0, &mut buf);
        buf
    }

    /// Hashes of the blocks of allocation `a` this node homes (all of them when `all`), as
    /// `(block, hash)`. A block is a page of the allocation, so its home is the page's.
    fn home_block_hashes(&self, a: &AllocMeta, all: bool) -> Vec<(usize, u64)> {
        let bytes = a.len * a.elem_size;
        let first = a.first_page as usize;
        let mut out = Vec::new();
        let mut buf = vec![0u8; BLOCK_BYTES];
        for &(run_first, count, home) in &a.homes {
            if !all && home as usize != self.rank {
                continue;
            }
            for page in run_first as usize..run_first as usize + count as usize {
                let k = page - first;
                let lo = k * BLOCK_BYTES;
                let len = BLOCK_BYTES.min(bytes - lo);
                let mem = crate::sys::AppSlice::<u8>::new(self.seg, page * PAGE_SIZE, len)
                    .expect("allocations lie inside the segment");
                mem.read_into(0, &mut buf[..len]);
                out.push((k, hash_block(&buf[..len])));
            }
        }
        out
    }

    /// A digest of the values in this node's home pages of every allocation the program
    /// made (a replay compares it with the recorded run's at finish).
    pub(super) fn home_values_digest(&self) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for a in self.allocs.iter().filter(|a| !a.internal) {
            for (block, hash) in self.home_block_hashes(a, false) {
                for v in [block as u64, hash] {
                    h = (h ^ v).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(17);
                }
            }
        }
        h
    }

    /// Makes sure the hash array holds `blocks` hashes (a collective allocation, made at
    /// the same trace point on every node since all know the same allocations).
    fn trace_hash_array(&mut self, blocks: usize) -> Result<Array<u64>, DsmError> {
        if let Some((array, cap)) = self.trace_hashes {
            if cap >= blocks {
                return Ok(array);
            }
        }
        let point = self.sync_point.clone();
        self.allocating_internal = true;
        let made = self.alloc::<u64>(HASHES_NAME, blocks.max(1));
        self.allocating_internal = false;
        self.sync_point = point;
        let array = made?;
        self.trace_hashes = Some((array, blocks));
        Ok(array)
    }

    /// After a barrier (or at finish, `at_exit`): every node hashes the blocks it homes
    /// into a shared hash array (no page moves), an internal barrier makes them visible,
    /// and rank 0 records or compares the trace point. When rank 0 needs values (a trace
    /// with values, or a comparison, which reads the values of differing allocations), a
    /// second internal barrier holds everyone until it has read them.
    pub(super) fn trace_point(&mut self, at_exit: bool) -> Result<(), DsmError> {
        if !self.tracing {
            return Ok(());
        }
        let traced: Vec<usize> = (0..self.allocs.len())
            .filter(|&i| !self.allocs[i].internal)
            .collect();
        // Where each traced allocation's block hashes start, and how many there are in all.
        let mut total = 0;
        let firsts: Vec<usize> = traced
            .iter()
            .map(|&i| {
                let at = total;
                total += blocks(self.allocs[i].len * self.allocs[i].elem_size);
                at
            })
            .collect();
        // Every traced block's hash, in trace order (rank 0 only).
        let mut hashes = Vec::new();
        // The shared hash array: `total` hashes, then the stop word.
        let mut shared = None;
        if self.size == 1 {
            for &i in &traced {
                let mut h = self.home_block_hashes(&self.allocs[i], true);
                h.sort_unstable();
                hashes.extend(h.into_iter().map(|(_, x)| x));
            }
        } else {
            let array = self.trace_hash_array(total + 1)?;
            shared = Some(array);
            {
                let v = self.view(&array).unrecorded();
                for (&i, &at) in traced.iter().zip(&firsts) {
                    for (k, h) in self.home_block_hashes(&self.allocs[i], false) {
                        v.set(at + k, h);
                    }
                }
            }
            self.internal_barrier()?;
            if self.rank == 0 {
                hashes = vec![0u64; total];
                self.view(&array).unrecorded().read_into(0, &mut hashes);
            }
        }
        let mut stop = false;
        if let Some(mut state) = self.trace.take() {
            let done = self.trace_point_rank0(&mut state, at_exit, &traced, &firsts, &hashes);
            self.trace = Some(state);
            stop = done?;
        }
        if let (Some(array), true) = (shared, self.trace_reads_values) {
            if self.rank == 0 {
                self.view(&array).unrecorded().set(total, u64::from(stop));
            }
            self.internal_barrier()?;
            stop = self.view(&array).unrecorded().get(total) != 0;
        }
        if stop {
            // Leave the way finish() does (the closing barrier tells every peer this is
            // the end, so no one takes the closed connections for a crash), then exit.
            self.finished = true;
            let left = self.finishing_barrier();
            if let Some(comm) = self.comm.take() {
                comm.shutdown();
            }
            left?;
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().flush();
            std::process::exit(i32::from(exit_codes::VALUES_DIFFER));
        }
        Ok(())
    }

    fn trace_point_rank0(
        &self,
        state: &mut TraceState,
        at_exit: bool,
        traced: &[usize],
        firsts: &[usize],
        hashes: &[u64],
    ) -> Result<bool, DsmError> {
        let comparing = state.comparing();
        let mut epoch = EpochTrace {
            epoch: self.barriers_called,
            at_exit,
            allocs: Vec::with_capacity(traced.len()),
        };
        for (&i, &at) in traced.iter().zip(firsts) {
            let a = &self.allocs[i];
            let n = blocks(a.len * a.elem_size);
            let keep = !comparing && state.keeps_values(&a.name);
            epoch.allocs.push(AllocTrace {
                name: a.name.clone(),
                type_name: a.type_name.clone(),
                elem_size: a.elem_size as u32,
                len: a.len as u64,
                cols: a.cols as u64,
                hashes: hashes[at..at + n].to_vec(),
                values: keep.then(|| self.alloc_bytes(a)),
            });
        }
        if !comparing {
            state.record(&epoch)?;
            return Ok(false);
        }
        let tol = state.tolerance();
        let diffs = match state.next_reference()? {
            Some(reference) => {
                // Hashes first; the values of an allocation are read only when it differs.
                if compare_epoch(&reference, &epoch, tol, Sides::RUN).is_empty() {
                    Vec::new()
                } else {
                    for (k, &i) in traced.iter().enumerate() {
                        let differs = reference
                            .allocs
                            .get(k)
                            .is_none_or(|r| r.hashes != epoch.allocs[k].hashes);
                        if differs {
                            epoch.allocs[k].values = Some(self.alloc_bytes(&self.allocs[i]));
                        }
                    }
                    compare_epoch(&reference, &epoch, tol, Sides::RUN)
                }
            }
            None => vec![dsm_trace::Difference::Shape(format!(
                "the reference trace ends before {}",
                epoch.label()
            ))],
        };
        Ok(state.report(&epoch.label(), epoch.ended_epoch(), &diffs))
    }
}
