//! The semaphore trace file (`dsmrun --sem-trace FILE`): JSON lines, versioned.
//!
//! The first line is a header `{"format":"dsm-semtrace","version":3,"nodes":N,"rank":R}`
//! (`rank` is present in the per-rank part files a run writes, `null` in the merged file
//! dsmrun makes of them). Every further line is one record:
//!
//! - `{"sem":{"name":"slots","initial":4}}`: a semaphore and its initial count;
//! - `{"op":{"node":1,"kind":"signal","sem":"slots","seq":0,"signal":null,"vt":[..]}}`: a
//!   completed operation, in the node's program order. A signal carries its number `seq`
//!   (0, 1, ... per node and semaphore); a wait carries the signal it consumed as
//!   `[node, seq]`, or `null` for an initial token. `vt` is the node's vector time after
//!   the operation (informative: the analysis recomputes clocks from the pairing);
//! - `{"barrier":{"node":1,"number":2}}`: the node passed its `number`-th barrier (1, 2,
//!   ... in program order among its operations). A barrier orders everything before it
//!   before everything after it, so the trace is analysed one epoch (the operations
//!   between two barriers) at a time ([`crate::Trace::epochs`]);
//! - `{"end":{"records":N}}`: the last line of a merged trace, after its `N` records, so
//!   that a file cut short at a line boundary is known to be incomplete (version 3).
//!
//! Versions 1 (no barrier records) and 2 (no end record) are still read. [`read_trace`]
//! checks everything a later analysis relies on (known semaphores, signal numbers in
//! order, every wait paired with an existing, unconsumed signal of its semaphore from its
//! own or an earlier epoch, no more initial tokens used than there are, barriers numbered
//! in order and passed by every node alike, the end record) and names the line of the
//! first problem.

use crate::{Op, Trace, TraceEvent};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use thiserror::Error;

/// The `format` field of every header.
pub const FORMAT_NAME: &str = "dsm-semtrace";
/// The version this crate writes (2 added barrier records, 3 the end record).
pub const FORMAT_VERSION: u32 = 3;
/// The oldest version this crate reads (1: no barrier records).
pub const MIN_FORMAT_VERSION: u32 = 1;

/// The first line of a trace file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// [`FORMAT_VERSION`] when written by this version.
    pub version: u32,
    /// Nodes in the job.
    pub nodes: usize,
    /// The writing rank for a part file; `None` in a merged trace.
    pub rank: Option<usize>,
}

/// One completed semaphore operation as stored.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct OpRecord {
    /// The node that performed it.
    pub node: usize,
    /// `"wait"` or `"signal"`.
    pub kind: Op,
    /// The semaphore's name.
    pub sem: String,
    /// For a signal, its number among the node's signals of this semaphore.
    #[serde(default)]
    pub seq: Option<u32>,
    /// For a wait, the signal it consumed as `(node, seq)`; `None` for an initial token.
    #[serde(default)]
    pub signal: Option<(usize, u32)>,
    /// The node's vector time after the operation.
    #[serde(default)]
    pub vt: Vec<u32>,
}

/// A semaphore declaration as stored.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SemRecord {
    /// The semaphore's name.
    pub name: String,
    /// Its initial count.
    pub initial: u32,
}

/// A barrier a node passed, as stored.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct BarrierRecord {
    /// The node that passed it.
    pub node: usize,
    /// How many barriers the node has passed, this one included (1, 2, ...).
    pub number: u32,
}

/// A line after the header.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Record {
    /// A semaphore declaration.
    Sem(SemRecord),
    /// A completed operation.
    Op(OpRecord),
    /// A barrier passed (version 2).
    Barrier(BarrierRecord),
    /// The end of a merged trace (version 3).
    End(EndRecord),
}

/// The last line of a merged trace, as stored.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct EndRecord {
    /// The records between the header and this line.
    pub records: usize,
}

impl Record {
    /// The node of an operation or barrier record.
    fn node(&self) -> Option<usize> {
        match self {
            Record::Sem(_) | Record::End(_) => None,
            Record::Op(o) => Some(o.node),
            Record::Barrier(b) => Some(b.node),
        }
    }
}

/// Why a trace file could not be read or written.
#[derive(Debug, Error)]
pub enum FormatError {
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The file is empty.
    #[error("empty file: not a semaphore trace")]
    Empty,
    /// The first line is not a header of this format.
    #[error("line 1: not a dsm semaphore trace header ({0})")]
    BadHeader(String),
    /// A version this build does not read.
    #[error("semaphore trace version {found}; this build reads versions {MIN_FORMAT_VERSION} to {FORMAT_VERSION}")]
    Version {
        /// The version in the file.
        found: u32,
    },
    /// A line that is not a record, or a record inconsistent with what came before.
    #[error("line {line}: {why}")]
    Bad {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// Part files that do not belong together.
    #[error("{0}")]
    Parts(String),
    /// Nodes that passed different numbers of barriers (a trace of a run that stopped
    /// early, or a corrupt one).
    #[error("{0}")]
    Barriers(String),
    /// A merged trace without its end record: the file was cut short.
    #[error("the trace ends after line {lines} without its end record: the file was cut short")]
    Truncated {
        /// Lines in the file.
        lines: usize,
    },
}

/// Writes one rank's part of a trace, a record per line, flushed as it goes so a crash
/// loses at most the record being written.
pub struct PartWriter<W: Write> {
    out: W,
    node: usize,
}

impl<W: Write> PartWriter<W> {
    /// Starts a part file of rank `node` of an `nodes`-node job.
    pub fn new(mut out: W, nodes: usize, node: usize) -> Result<Self, FormatError> {
        let h = Header {
            format: FORMAT_NAME.into(),
            version: FORMAT_VERSION,
            nodes,
            rank: Some(node),
        };
        write_line(&mut out, &h)?;
        Ok(PartWriter { out, node })
    }

    /// Records a semaphore's creation.
    pub fn create(&mut self, name: &str, initial: u32) -> Result<(), FormatError> {
        let r = Record::Sem(SemRecord {
            name: name.into(),
            initial,
        });
        write_line(&mut self.out, &r)
    }

    /// Records a completed signal (`signal == Some((this node, seq))`) or wait.
    pub fn op(
        &mut self,
        kind: Op,
        sem: &str,
        signal: Option<(usize, u32)>,
        vt: Vec<u32>,
    ) -> Result<(), FormatError> {
        let (seq, signal) = match kind {
            Op::Signal => (signal.map(|s| s.1), None),
            Op::Wait => (None, signal),
        };
        let r = Record::Op(OpRecord {
            node: self.node,
            kind,
            sem: sem.into(),
            seq,
            signal,
            vt,
        });
        write_line(&mut self.out, &r)
    }

    /// Records that the node passed its `number`-th barrier (1-based).
    pub fn barrier(&mut self, number: u32) -> Result<(), FormatError> {
        let r = Record::Barrier(BarrierRecord {
            node: self.node,
            number,
        });
        write_line(&mut self.out, &r)
    }
}

fn write_line<T: Serialize>(out: &mut (impl Write + ?Sized), v: &T) -> Result<(), FormatError> {
    let mut line = serde_json::to_vec(v).map_err(std::io::Error::from)?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()?;
    Ok(())
}

/// The part file rank `rank` writes for a trace requested at `path`: `path.rank<R>`.
pub fn part_path(path: &std::path::Path, rank: usize) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".rank{rank}"));
    p.into()
}

/// Reads a header and records, unchecked against each other.
fn read_lines(input: impl BufRead) -> Result<(Header, Vec<(usize, Record)>), FormatError> {
    let mut lines = input.lines();
    let first = lines.next().ok_or(FormatError::Empty)??;
    let header: Header =
        serde_json::from_str(&first).map_err(|e| FormatError::BadHeader(e.to_string()))?;
    if header.format != FORMAT_NAME {
        return Err(FormatError::BadHeader(format!(
            "format is '{}', expected '{FORMAT_NAME}'",
            header.format
        )));
    }
    if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&header.version) {
        return Err(FormatError::Version {
            found: header.version,
        });
    }
    // A node is a `NodeId`: a larger count is a damaged header, not a trace to size
    // tables for.
    let max_nodes = usize::from(dsm_proto::NodeId::MAX) + 1;
    if header.nodes == 0
        || header.nodes > max_nodes
        || header.rank.is_some_and(|r| r >= header.nodes)
    {
        return Err(FormatError::BadHeader(format!(
            "{} nodes, rank {:?}",
            header.nodes, header.rank
        )));
    }
    let mut records = Vec::new();
    let mut ended = false;
    let mut last_line = 1;
    for (i, line) in lines.enumerate() {
        let line = line?;
        last_line = i + 2;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: String| FormatError::Bad { line: i + 2, why };
        let r: Record = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
        if ended {
            return Err(bad("a record after the end record".into()));
        }
        match &r {
            Record::Barrier(_) if header.version < 2 => {
                return Err(bad(format!(
                    "a barrier record in a version {} trace",
                    header.version
                )))
            }
            Record::End(_) if header.version < 3 || header.rank.is_some() => {
                return Err(bad(
                    "an end record in a part file or before version 3".into()
                ))
            }
            Record::End(e) if e.records != records.len() => {
                return Err(bad(format!(
                    "the end record counts {} records, the file has {}",
                    e.records,
                    records.len()
                )))
            }
            Record::End(_) => ended = true,
            _ => records.push((i + 2, r)),
        }
    }
    // A merged trace ends with its end record; parts are merged only after every rank
    // finished, and traces before version 3 had none.
    if header.version >= 3 && header.rank.is_none() && !ended {
        return Err(FormatError::Truncated { lines: last_line });
    }
    Ok((header, records))
}

/// Reads and checks a merged trace (or a single part of a one-node job).
pub fn read_trace(input: impl BufRead) -> Result<Trace, FormatError> {
    let (header, records) = read_lines(input)?;
    build(header.nodes, records)
}

fn build(nodes: usize, records: Vec<(usize, Record)>) -> Result<Trace, FormatError> {
    let mut builder = TraceBuilder {
        nodes,
        trace: Trace::new(nodes),
        sem_index: HashMap::new(),
        signals: HashMap::new(),
        signal_epoch: HashMap::new(),
    };
    let ops = builder.declarations_and_barriers(records)?;
    builder.check_barrier_counts()?;
    builder.number_signals(&ops)?;
    builder.pair_waits(ops)?;
    Ok(builder.trace)
}

/// A trace being checked and built from its records.
struct TraceBuilder {
    nodes: usize,
    trace: Trace,
    sem_index: HashMap<String, usize>,
    /// Signals made so far: (sem, node, seq) -> consumed?
    signals: HashMap<(usize, usize, u32), bool>,
    /// Each signal's epoch.
    signal_epoch: HashMap<(usize, usize, u32), usize>,
}

impl TraceBuilder {
    /// Takes the semaphore declarations and the barriers into the trace; returns the
    /// operation records with their lines.
    fn declarations_and_barriers(
        &mut self,
        records: Vec<(usize, Record)>,
    ) -> Result<Vec<(usize, OpRecord)>, FormatError> {
        let nodes = self.nodes;
        let trace = &mut self.trace;
        let mut ops = Vec::new();
        let mut counted = vec![0usize; nodes];
        for (line, r) in records {
            let bad = |why: String| FormatError::Bad { line, why };
            match r {
                Record::End(_) => {}
                Record::Sem(s) => match self.sem_index.get(&s.name) {
                    Some(&i) if trace.initial[i] != s.initial => {
                        return Err(bad(format!(
                            "semaphore '{}' declared with initial counts {} and {}",
                            s.name, trace.initial[i], s.initial
                        )))
                    }
                    Some(_) => {}
                    None => {
                        self.sem_index.insert(s.name.clone(), trace.sem_names.len());
                        trace.sem_names.push(s.name);
                        trace.initial.push(s.initial);
                    }
                },
                Record::Op(o) => {
                    if let Some(c) = counted.get_mut(o.node) {
                        *c += 1;
                    }
                    ops.push((line, o))
                }
                Record::Barrier(b) => {
                    if b.node >= nodes {
                        return Err(bad(format!("node {} in a {nodes}-node trace", b.node)));
                    }
                    let passed = &mut trace.barriers[b.node];
                    if b.number as usize != passed.len() + 1 {
                        return Err(bad(format!(
                            "barrier {} of node {}, expected barrier {}",
                            b.number,
                            b.node,
                            passed.len() + 1
                        )));
                    }
                    // The node's operations before it: its operation records so far.
                    passed.push(counted[b.node]);
                }
            }
        }
        Ok(ops)
    }

    fn check_barrier_counts(&self) -> Result<(), FormatError> {
        let barriers = &self.trace.barriers;
        if let Some(i) = (1..self.nodes).find(|&i| barriers[i].len() != barriers[0].len()) {
            return Err(FormatError::Barriers(format!(
                "node 0 passed {} barriers and node {i} {}: every node passes every barrier \
                 (a trace of a run that stopped early?)",
                barriers[0].len(),
                barriers[i].len()
            )));
        }
        Ok(())
    }

    /// An operation's epoch: the barriers its node passed before it.
    fn epoch_of(&self, node: usize, pos: usize) -> usize {
        self.trace.barriers[node].partition_point(|&b| b <= pos)
    }

    /// Checks every operation's node and semaphore and every signal's number, and records
    /// the signals. Signals first (any order of nodes), so waits can name signals of nodes
    /// listed later.
    fn number_signals(&mut self, ops: &[(usize, OpRecord)]) -> Result<(), FormatError> {
        let nodes = self.nodes;
        let mut op_pos = vec![0usize; nodes];
        let mut next_seq: HashMap<(usize, usize), u32> = HashMap::new();
        for (line, o) in ops {
            let bad = |why: String| FormatError::Bad { line: *line, why };
            if o.node >= nodes {
                return Err(bad(format!("node {} in a {nodes}-node trace", o.node)));
            }
            let pos = op_pos[o.node];
            op_pos[o.node] += 1;
            let Some(&sem) = self.sem_index.get(&o.sem) else {
                return Err(bad(format!("semaphore '{}' was never declared", o.sem)));
            };
            if o.kind == Op::Signal {
                let expected = next_seq.entry((sem, o.node)).or_insert(0);
                if o.seq != Some(*expected) {
                    return Err(bad(format!(
                        "signal number {:?} of node {} on '{}', expected {}",
                        o.seq, o.node, o.sem, expected
                    )));
                }
                self.signals.insert((sem, o.node, *expected), false);
                let epoch = self.epoch_of(o.node, pos);
                self.signal_epoch.insert((sem, o.node, *expected), epoch);
                *expected += 1;
            }
        }
        Ok(())
    }

    /// Appends every operation to its node's events, pairing each wait with its signal.
    fn pair_waits(&mut self, ops: Vec<(usize, OpRecord)>) -> Result<(), FormatError> {
        let mut initial_used = vec![0u32; self.trace.initial.len()];
        for (line, o) in ops {
            let sem = self.sem_index[&o.sem];
            let epoch = self.epoch_of(o.node, self.trace.events[o.node].len());
            let pairing = match o.kind {
                Op::Signal => None,
                Op::Wait => self.pair_wait(line, &o, sem, epoch, &mut initial_used)?,
            };
            self.trace.events[o.node].push(TraceEvent {
                op: o.kind,
                sem,
                seq: o.seq,
                paired: pairing,
            });
        }
        Ok(())
    }

    /// The signal a wait consumed (`None` for an initial token), checked: it exists, is
    /// not consumed twice and is not from a later epoch; and no more initial tokens are
    /// taken than there are.
    fn pair_wait(
        &mut self,
        line: usize,
        o: &OpRecord,
        sem: usize,
        epoch: usize,
        initial_used: &mut [u32],
    ) -> Result<Option<(usize, u32)>, FormatError> {
        let bad = |why: String| FormatError::Bad { line, why };
        let Some((node, seq)) = o.signal else {
            initial_used[sem] += 1;
            if initial_used[sem] > self.trace.initial[sem] {
                return Err(bad(format!(
                    "more waits on '{}' took an initial token than its initial count {}",
                    o.sem, self.trace.initial[sem]
                )));
            }
            return Ok(None);
        };
        match self.signals.get_mut(&(sem, node, seq)) {
            None => Err(bad(format!(
                "wait paired with signal {seq} of node {node} on '{}', which is not in the trace",
                o.sem
            ))),
            Some(true) => Err(bad(format!(
                "signal {seq} of node {node} on '{}' consumed twice",
                o.sem
            ))),
            Some(_) if self.signal_epoch[&(sem, node, seq)] > epoch => Err(bad(format!(
                "wait before barrier {} paired with signal {seq} of node {node} \
                 on '{}', which is after it",
                epoch + 1,
                o.sem
            ))),
            Some(used) => {
                *used = true;
                Ok(Some((node, seq)))
            }
        }
    }
}

/// Merges the part files of one run (any order) into a trace file, checking that they
/// are the parts `0..nodes` of one job.
pub fn merge_parts(parts: Vec<impl BufRead>, mut out: impl Write) -> Result<Trace, FormatError> {
    let mut nodes = None;
    let mut seen = HashSet::new();
    let mut all = Vec::new();
    for p in parts {
        let (h, recs) = read_lines(p)?;
        let rank = h
            .rank
            .ok_or_else(|| FormatError::Parts("a merged trace among the parts".into()))?;
        if *nodes.get_or_insert(h.nodes) != h.nodes {
            return Err(FormatError::Parts(
                "parts of jobs of different sizes".into(),
            ));
        }
        if !seen.insert(rank) {
            return Err(FormatError::Parts(format!("two parts of rank {rank}")));
        }
        if let Some((line, _)) = recs
            .iter()
            .find(|(_, r)| r.node().is_some_and(|n| n != rank))
        {
            return Err(FormatError::Parts(format!(
                "part of rank {rank}, line {line}: an operation or barrier of another node"
            )));
        }
        all.extend(recs);
    }
    let nodes = nodes.ok_or_else(|| FormatError::Parts("no part files".into()))?;
    if seen.len() != nodes {
        return Err(FormatError::Parts(format!(
            "{} of {nodes} part files",
            seen.len()
        )));
    }
    // Declarations first (deduplicated), then operations node by node.
    let mut lines: Vec<(usize, Record)> = Vec::new();
    let mut declared = HashSet::new();
    for (l, r) in &all {
        if let Record::Sem(s) = r {
            if declared.insert((s.name.clone(), s.initial)) {
                lines.push((*l, r.clone()));
            }
        }
    }
    lines.extend(all.into_iter().filter(|(_, r)| r.node().is_some()));
    let header = Header {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        nodes,
        rank: None,
    };
    write_line(&mut out, &header)?;
    for (_, r) in &lines {
        write_line(&mut out, r)?;
    }
    let end = EndRecord {
        records: lines.len(),
    };
    write_line(&mut out, &Record::End(end))?;
    build(nodes, lines)
}

/// Writes a trace (for generated traces and tests); vector times are left empty.
pub fn write_trace(trace: &Trace, mut out: impl Write) -> Result<(), FormatError> {
    let header = Header {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        nodes: trace.nodes(),
        rank: None,
    };
    write_line(&mut out, &header)?;
    let mut records = 0;
    let mut put = |out: &mut dyn Write, r: &Record| {
        records += 1;
        write_line(out, r)
    };
    for (name, &initial) in trace.sem_names.iter().zip(&trace.initial) {
        put(
            &mut out,
            &Record::Sem(SemRecord {
                name: name.clone(),
                initial,
            }),
        )?;
    }
    for (node, evs) in trace.events.iter().enumerate() {
        let mut passed = 0;
        for (pos, e) in evs.iter().enumerate() {
            while trace.barriers[node].get(passed) == Some(&pos) {
                passed += 1;
                put(
                    &mut out,
                    &Record::Barrier(BarrierRecord {
                        node,
                        number: passed as u32,
                    }),
                )?;
            }
            put(
                &mut out,
                &Record::Op(OpRecord {
                    node,
                    kind: e.op,
                    sem: trace.sem_names[e.sem].clone(),
                    seq: e.seq,
                    signal: e.paired,
                    vt: Vec::new(),
                }),
            )?;
        }
        for number in passed + 1..=trace.barriers[node].len() {
            put(
                &mut out,
                &Record::Barrier(BarrierRecord {
                    node,
                    number: number as u32,
                }),
            )?;
        }
    }
    write_line(&mut out, &Record::End(EndRecord { records }))
}
