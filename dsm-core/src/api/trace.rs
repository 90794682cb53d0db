//! Value tracing and comparison on a node (`dsmrun --trace-values FILE` / `--compare
//! FILE`): at every barrier and at `finish()`, rank 0 reads every shared allocation
//! (pages are coherent after a barrier; reading fetches the pages homed elsewhere) and
//! hashes it per 4 KiB block in allocation coordinates, so traces do not depend on the node
//! count. A second, internal barrier (not counted in the program's epochs) keeps the other
//! nodes from writing the next epoch while rank 0 reads. Recording appends the trace point
//! to the file; comparing reads the reference's next trace point and reports differences
//! ([`dsm_trace::compare_epoch`]).
//!
//! The one place besides `comm::fatal` where the library ends the process: at the first
//! difference (without `--compare-continue`) rank 0 prints it and exits with
//! [`exit_codes::VALUES_DIFFER`]; the launcher then stops the other ranks and reports
//! "values differ".

use super::Dsm;
use crate::error::DsmError;
use dsm_proto::{exit_codes, TraceMode, TraceOptions, PAGE_SIZE};
use dsm_trace::{
    compare_epoch, AllocTrace, EpochTrace, Header, Tolerance, TraceReader, TraceWriter,
};
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
    /// Opens the trace (rank 0 only); `None` when tracing is off.
    pub(super) fn open(options: &TraceOptions) -> Result<Option<TraceState>, DsmError> {
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

    /// Records or compares one trace point.
    fn point(&mut self, epoch: EpochTrace) -> Result<(), DsmError> {
        self.points += 1;
        let path = self.path.clone();
        let bad = |e: dsm_trace::TraceError| DsmError::Config(format!("value trace '{path}': {e}"));
        let tol = self.tolerance();
        match self.sink.as_mut() {
            None => Ok(()),
            Some(Sink::Record(w)) => {
                self.bytes += w.write_epoch(&epoch).map_err(bad)?;
                Ok(())
            }
            Some(Sink::Compare(r)) => {
                let diffs = match r.next_epoch().map_err(bad)? {
                    Some(reference) => compare_epoch(&reference, &epoch, tol),
                    None => vec![dsm_trace::Difference::Shape(format!(
                        "the reference trace ends before {}",
                        epoch.label()
                    ))],
                };
                if diffs.is_empty() {
                    return Ok(());
                }
                self.differing += 1;
                eprintln!(
                    "dsm: values differ from the reference trace at {} (epoch {}):",
                    epoch.label(),
                    epoch.epoch
                );
                for d in &diffs {
                    eprintln!("dsm:   {d}");
                }
                if !self.options.continue_all {
                    let _ = std::io::stdout().flush();
                    let _ = std::io::stderr().flush();
                    std::process::exit(i32::from(exit_codes::VALUES_DIFFER));
                }
                Ok(())
            }
        }
    }

    /// End of the run: closes a recorded trace; says whether a comparison found
    /// differences.
    pub(super) fn finish(&mut self) -> Result<bool, DsmError> {
        if let Some(Sink::Record(w)) = self.sink.take() {
            w.finish()
                .map_err(|e| DsmError::Config(format!("value trace '{}': {e}", self.path)))?;
            if std::env::var_os("DSM_TRACE_STATS").is_some() {
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

impl Dsm {
    /// After a barrier (or at finish, `at_exit`): rank 0 records or compares the trace
    /// point, then an internal barrier holds everyone until it has read the pages.
    pub(super) fn trace_point(&mut self, at_exit: bool) -> Result<(), DsmError> {
        if !self.tracing {
            return Ok(());
        }
        if let Some(mut state) = self.trace.take() {
            let mut allocs = Vec::with_capacity(self.allocs.len());
            for a in &self.allocs {
                let bytes = a.len * a.elem_size;
                let first = a.first_page as usize;
                let last = first + bytes.div_ceil(PAGE_SIZE) - 1;
                self.prefetch(first, last, false);
                let mem = crate::sys::AppSlice::<u8>::new(self.seg, first * PAGE_SIZE, bytes)
                    .expect("allocations lie inside the segment");
                let mut buf = vec![0u8; bytes];
                mem.read_into(0, &mut buf);
                let keep = state.keeps_values(&a.name);
                allocs.push(AllocTrace::from_bytes(
                    &a.name,
                    &a.type_name,
                    a.elem_size,
                    a.cols,
                    &buf,
                    keep,
                ));
            }
            let epoch = EpochTrace {
                epoch: self.barriers_called,
                at_exit,
                allocs,
            };
            let done = state.point(epoch);
            self.trace = Some(state);
            done?;
        }
        if self.size > 1 {
            self.internal_barrier()?;
        }
        Ok(())
    }
}
