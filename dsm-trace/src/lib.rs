//! Value traces of dsm runs and their comparison, sans-I/O apart from the generic
//! `Read`/`Write` the file format is written through.
//!
//! A trace records, at every barrier of a run (epochs numbered as the program counts its
//! `barrier()` calls, like race reports) and once at `finish()`, every named shared
//! allocation as a hash per block of [`BLOCK_BYTES`] bytes *in allocation coordinates*
//! (allocations start on a page boundary, so block `k` is the allocation's `k`-th page),
//! optionally with the values. Nothing in a trace depends on the number of nodes, so the
//! trace of a 1-node run compares with that of an 8-node run.
//!
//! File format (version [`FORMAT_VERSION`]): the 8 bytes [`MAGIC`], a little-endian `u32`
//! version, then records, each a little-endian `u64` length followed by that many bytes of
//! a postcard-encoded [`Record`]: first a [`Record::Header`] (program and arguments; the
//! node count is deliberately not part of it), then one [`Record::Epoch`] per trace point,
//! and last [`Record::End`], which carries a checksum of every record before it (version
//! 2). A file without the end record is reported as truncated, one whose records do not
//! match the checksum as corrupt; [`check_whole`] reads a file through to say which.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::{self, Read, Write};
use thiserror::Error;

/// First bytes of every trace file.
pub const MAGIC: [u8; 8] = *b"DSMTRACE";
/// Version of the file format this crate writes and reads.
pub const FORMAT_VERSION: u32 = 2;
/// Bytes per hashed block (one page of the allocation).
pub const BLOCK_BYTES: usize = 4096;
/// Suffix of [`AllocTrace::type_name`] for allocations whose elements are declared to be
/// made of `f64` fields only (`Dsm::trace_as_f64`): they are compared field by field, within
/// the tolerance, and printed as numbers.
pub const F64_FIELDS: &str = " (f64 fields)";
/// Largest record accepted when reading (guards against corrupt lengths).
const MAX_RECORD: u64 = 1 << 40;

/// What can go wrong reading or writing a trace.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The underlying file failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The file does not start with the trace magic.
    #[error("not a dsm value trace (no DSMTRACE header)")]
    NotATrace,
    /// The file was written by another format version.
    #[error("trace format version {found}, this dsm reads version {FORMAT_VERSION}")]
    Version {
        /// The version found.
        found: u32,
    },
    /// The file ends in the middle of a record or without its end record.
    #[error("trace is truncated: {0} (was the run that wrote it stopped?)")]
    Truncated(String),
    /// A record does not decode.
    #[error("trace is corrupt: {0}")]
    Corrupt(String),
}

/// The run a trace describes. The node count is not part of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The program's name (file name of `argv[0]`).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
}

/// One shared allocation at one trace point.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocTrace {
    /// The allocation's name.
    pub name: String,
    /// The element type as Rust names it (`f64`, `apps::water::Sites`, ...).
    pub type_name: String,
    /// Bytes per element.
    pub elem_size: u32,
    /// Elements.
    pub len: u64,
    /// Columns of a 2-D array, 0 for 1-D.
    pub cols: u64,
    /// Hash of each [`BLOCK_BYTES`] block of the allocation's bytes.
    pub hashes: Vec<u64>,
    /// The allocation's bytes, when values are traced.
    pub values: Option<Vec<u8>>,
}

/// Every allocation at one trace point.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochTrace {
    /// Barriers the program had called (the trace point is barrier `epoch`, or `finish()`
    /// after `epoch` barriers when `at_exit`).
    pub epoch: u32,
    /// Recorded in `finish()`.
    pub at_exit: bool,
    /// The allocations, in allocation order.
    pub allocs: Vec<AllocTrace>,
}

impl EpochTrace {
    /// The epoch that ends at this trace point, numbered as race reports number them:
    /// epoch 7 ends at barrier 7, and after 12 barriers `finish()` ends epoch 13.
    pub fn ended_epoch(&self) -> u32 {
        self.epoch + u32::from(self.at_exit)
    }

    /// `barrier 7` or `finish (after 12 barriers)`.
    pub fn label(&self) -> String {
        if self.at_exit {
            format!("finish (after {} barriers)", self.epoch)
        } else {
            format!("barrier {}", self.epoch)
        }
    }
}

/// A record of the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Record {
    /// The first record.
    Header(Header),
    /// One trace point.
    Epoch(EpochTrace),
    /// The last record: how many epoch records came before, and their checksum.
    End {
        /// Epoch records in the file.
        epochs: u64,
        /// [`Checksum`] of the header and epoch records, as encoded.
        checksum: u64,
    },
}

/// The running checksum of a trace's records (their encoded bytes, lengths included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checksum(u64);

impl Checksum {
    fn add(&mut self, record: &[u8]) {
        let h = hash_block(record) ^ (record.len() as u64).rotate_left(32);
        self.0 = (self.0.rotate_left(5) ^ h).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A 64-bit hash of a block: four independent lanes of 8-byte words (so the multiplies
/// overlap), folded together; fast and the same on every machine.
pub fn hash_block(bytes: &[u8]) -> u64 {
    const K: u64 = 0xff51_afd7_ed55_8ccd;
    let mut lanes = [
        0x9e37_79b9_7f4a_7c15 ^ bytes.len() as u64,
        0xc2b2_ae3d_27d4_eb4f,
        0x1656_67b1_9e37_79f9,
        0x85eb_ca77_c2b2_ae63,
    ];
    let mut chunks = bytes.chunks_exact(32);
    for c in &mut chunks {
        for (lane, w) in lanes.iter_mut().zip(c.chunks_exact(8)) {
            let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            *lane = (*lane ^ w).wrapping_mul(K).rotate_left(29);
        }
    }
    let mut h = lanes
        .iter()
        .fold(0u64, |h, &l| (h ^ l).wrapping_mul(K).rotate_left(31));
    for &b in chunks.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    }
    h ^ (h >> 31)
}

impl AllocTrace {
    /// Traces an allocation from its bytes, keeping them when `keep_values`.
    pub fn from_bytes(
        name: &str,
        type_name: &str,
        elem_size: usize,
        cols: usize,
        bytes: &[u8],
        keep_values: bool,
    ) -> AllocTrace {
        AllocTrace {
            name: name.to_string(),
            type_name: type_name.to_string(),
            elem_size: elem_size as u32,
            len: (bytes.len() / elem_size.max(1)) as u64,
            cols: cols as u64,
            hashes: bytes.chunks(BLOCK_BYTES).map(hash_block).collect(),
            values: keep_values.then(|| bytes.to_vec()),
        }
    }

    /// `(row, col)` of a 2-D array, or `[index]`.
    fn place(&self, index: u64) -> String {
        match index.checked_div(self.cols) {
            Some(row) => format!("({row}, {})", index - row * self.cols),
            None => format!("[{index}]"),
        }
    }

    fn elements_of_block(&self, block: usize) -> (u64, u64) {
        let es = u64::from(self.elem_size.max(1));
        let first = (block * BLOCK_BYTES) as u64 / es;
        let last = (((block + 1) * BLOCK_BYTES) as u64)
            .div_ceil(es)
            .min(self.len);
        (first, last)
    }
}

/// How far two floating-point values may be apart and still count as equal: `|a - b| <=
/// abs` or `|a - b| <= rel * max(|a|, |b|)`. Only `f64` and `f32` elements use it; other
/// types are compared bit for bit. It needs the reference's values: hashes cannot be
/// compared within a tolerance.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tolerance {
    /// Absolute tolerance.
    pub abs: f64,
    /// Relative tolerance.
    pub rel: f64,
}

impl PartialEq for Tolerance {
    fn eq(&self, other: &Self) -> bool {
        self.abs.to_bits() == other.abs.to_bits() && self.rel.to_bits() == other.rel.to_bits()
    }
}
impl Eq for Tolerance {}

impl Tolerance {
    fn accepts(&self, a: f64, b: f64) -> bool {
        if a.to_bits() == b.to_bits() {
            return true;
        }
        let d = (a - b).abs();
        d <= self.abs || d <= self.rel * a.abs().max(b.abs())
    }
}

/// Element types the comparison knows how to print (and, for floats, compare within a
/// tolerance).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    F64,
    F32,
    I64,
    U64,
    I32,
    U32,
    /// A struct of f64 fields.
    F64Fields,
    Bytes,
}

fn kind(type_name: &str, elem_size: u32) -> Kind {
    if type_name.ends_with(F64_FIELDS) && elem_size.is_multiple_of(8) {
        return Kind::F64Fields;
    }
    match (type_name, elem_size) {
        ("f64", 8) => Kind::F64,
        ("f32", 4) => Kind::F32,
        ("i64", 8) | ("isize", 8) => Kind::I64,
        ("u64", 8) | ("usize", 8) => Kind::U64,
        ("i32", 4) => Kind::I32,
        ("u32", 4) => Kind::U32,
        _ => Kind::Bytes,
    }
}

fn show(kind: Kind, b: &[u8]) -> String {
    let arr8 = || <[u8; 8]>::try_from(b).ok();
    let arr4 = || <[u8; 4]>::try_from(b).ok();
    match kind {
        Kind::F64 => arr8().map(|a| format!("{:e}", f64::from_le_bytes(a))),
        Kind::F32 => arr4().map(|a| format!("{:e}", f32::from_le_bytes(a))),
        Kind::I64 => arr8().map(|a| i64::from_le_bytes(a).to_string()),
        Kind::U64 => arr8().map(|a| u64::from_le_bytes(a).to_string()),
        Kind::I32 => arr4().map(|a| i32::from_le_bytes(a).to_string()),
        Kind::U32 => arr4().map(|a| u32::from_le_bytes(a).to_string()),
        Kind::F64Fields | Kind::Bytes => None,
    }
    .unwrap_or_else(|| {
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        format!("0x{hex}")
    })
}

/// Whether two elements are equal (within `tol` for floats).
fn same(kind: Kind, a: &[u8], b: &[u8], tol: Option<Tolerance>) -> bool {
    if a == b {
        return true;
    }
    let Some(tol) = tol else { return false };
    match kind {
        Kind::F64 => match (<[u8; 8]>::try_from(a), <[u8; 8]>::try_from(b)) {
            (Ok(x), Ok(y)) => tol.accepts(f64::from_le_bytes(x), f64::from_le_bytes(y)),
            _ => false,
        },
        Kind::F32 => match (<[u8; 4]>::try_from(a), <[u8; 4]>::try_from(b)) {
            (Ok(x), Ok(y)) => tol.accepts(
                f64::from(f32::from_le_bytes(x)),
                f64::from(f32::from_le_bytes(y)),
            ),
            _ => false,
        },
        Kind::F64Fields => a
            .chunks_exact(8)
            .zip(b.chunks_exact(8))
            .all(|(x, y)| same(Kind::F64, x, y, Some(tol))),
        _ => false,
    }
}

/// One difference between a reference trace point and a run's.
#[derive(Debug, Clone, PartialEq)]
pub enum Difference {
    /// The first element of an allocation that differs, with both values.
    Element {
        /// The allocation.
        alloc: String,
        /// Element index.
        index: u64,
        /// `(row, col)` or `[index]`.
        place: String,
        /// The reference's value, printed.
        reference: String,
        /// The other side's value, printed.
        run: String,
        /// What the two sides are called ([`Sides`]).
        names: [String; 2],
        /// Further differing elements in the allocation.
        more: u64,
    },
    /// A block whose hash differs, when the reference has no values to localise further.
    Block {
        /// The allocation.
        alloc: String,
        /// Element range of the first differing block.
        elements: (u64, u64),
        /// Where it starts and ends, as `(row, col)` or `[index]`.
        span: (String, String),
        /// Further differing blocks.
        more_blocks: u64,
        /// The side that has hashes only, as [`Sides`] calls it.
        hashes_only: String,
    },
    /// Allocations or their shapes differ, or one trace has a point the other lacks.
    Shape(String),
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Difference::Element {
                alloc,
                index,
                place,
                reference,
                run,
                more,
                names,
            } => {
                write!(
                    f,
                    "'{alloc}' element {place} (index {index}): {} {reference}, {} {run}",
                    names[0], names[1]
                )?;
                if *more > 0 {
                    write!(f, " ({more} more elements of '{alloc}' differ)")?;
                }
                Ok(())
            }
            Difference::Block {
                alloc,
                elements,
                span,
                more_blocks,
                hashes_only,
            } => {
                write!(
                    f,
                    "'{alloc}' elements {}..{} ({} to {}) differ",
                    elements.0, elements.1, span.0, span.1
                )?;
                if *more_blocks > 0 {
                    write!(f, " ({more_blocks} more blocks of 4 KiB differ)")?;
                }
                write!(f, "; {hashes_only} has hashes only: trace it with --trace-values-full (or --trace-vars {alloc}) to see the element and its values")
            }
            Difference::Shape(s) => f.write_str(s),
        }
    }
}

/// What the two sides of a comparison are called in its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sides<'a> {
    /// The reference (the first trace).
    pub reference: &'a str,
    /// The other side (a run, or a second trace).
    pub other: &'a str,
}

impl Sides<'static> {
    /// A run compared with its reference trace (`dsmrun --compare`).
    pub const RUN: Sides<'static> = Sides {
        reference: "the reference",
        other: "this run",
    };
}

/// Compares one allocation of this run (`run`, which must carry values for element-level
/// reports) with the reference's. Returns the first difference, if any.
pub fn compare_alloc(
    reference: &AllocTrace,
    run: &AllocTrace,
    tol: Option<Tolerance>,
    sides: Sides<'_>,
) -> Option<Difference> {
    if reference.name != run.name
        || reference.elem_size != run.elem_size
        || reference.len != run.len
        || reference.cols != run.cols
    {
        return Some(Difference::Shape(format!(
            "allocation '{}' ({} elements of {} bytes, {} columns) in {} is '{}' ({} elements of {} bytes, {} columns) in {}",
            reference.name, reference.len, reference.elem_size, reference.cols, sides.reference,
            run.name, run.len, run.elem_size, run.cols, sides.other
        )));
    }
    let bad_blocks: Vec<usize> = reference
        .hashes
        .iter()
        .zip(&run.hashes)
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(k, _)| k)
        .collect();
    if bad_blocks.is_empty() {
        return None;
    }
    let k = kind(&reference.type_name, reference.elem_size);
    match (&reference.values, &run.values) {
        (Some(rv), Some(mv)) => {
            let es = reference.elem_size.max(1) as usize;
            let mut first: Option<u64> = None;
            let mut count = 0u64;
            for &b in &bad_blocks {
                let (lo, hi) = reference.elements_of_block(b);
                for i in lo..hi {
                    let r = i as usize * es..(i as usize + 1) * es;
                    if !same(k, &rv[r.clone()], &mv[r], tol) {
                        first.get_or_insert(i);
                        count += 1;
                    }
                }
            }
            let i = first?;
            let mut r = i as usize * es..(i as usize + 1) * es;
            let mut place = reference.place(i);
            let mut shown = k;
            if k == Kind::F64Fields {
                // Name the first field that differs.
                let field = (0..es / 8)
                    .find(|f| {
                        let lane = r.start + f * 8..r.start + f * 8 + 8;
                        !same(Kind::F64, &rv[lane.clone()], &mv[lane], tol)
                    })
                    .unwrap_or(0);
                place = format!("{place} field {field}");
                r = r.start + field * 8..r.start + field * 8 + 8;
                shown = Kind::F64;
            }
            Some(Difference::Element {
                alloc: reference.name.clone(),
                index: i,
                place,
                reference: show(shown, &rv[r.clone()]),
                run: show(shown, &mv[r]),
                more: count - 1,
                names: [sides.reference.to_string(), sides.other.to_string()],
            })
        }
        _ => {
            let (lo, hi) = reference.elements_of_block(bad_blocks[0]);
            Some(Difference::Block {
                alloc: reference.name.clone(),
                elements: (lo, hi),
                span: (reference.place(lo), reference.place(hi.saturating_sub(1))),
                more_blocks: bad_blocks.len() as u64 - 1,
                hashes_only: if reference.values.is_none() {
                    sides.reference
                } else {
                    sides.other
                }
                .to_string(),
            })
        }
    }
}

/// Compares a trace point of this run with the reference's: the first difference of
/// each allocation, in allocation order.
pub fn compare_epoch(
    reference: &EpochTrace,
    run: &EpochTrace,
    tol: Option<Tolerance>,
    sides: Sides<'_>,
) -> Vec<Difference> {
    let mut out = Vec::new();
    if reference.epoch != run.epoch || reference.at_exit != run.at_exit {
        out.push(Difference::Shape(format!(
            "the next trace point of {} is {}, of {} {}",
            sides.reference,
            reference.label(),
            sides.other,
            run.label()
        )));
        return out;
    }
    for (k, r) in reference.allocs.iter().enumerate() {
        match run.allocs.get(k) {
            Some(m) => out.extend(compare_alloc(r, m, tol, sides)),
            None => out.push(Difference::Shape(format!(
                "allocation '{}' of {} does not exist in {}",
                r.name, sides.reference, sides.other
            ))),
        }
    }
    for m in run.allocs.iter().skip(reference.allocs.len()) {
        out.push(Difference::Shape(format!(
            "allocation '{}' of {} does not exist in {}",
            m.name, sides.other, sides.reference
        )));
    }
    out
}

/// Writes a trace.
pub struct TraceWriter<W: Write> {
    out: W,
    epochs: u64,
    sum: Checksum,
}

fn write_record<W: Write>(
    out: &mut W,
    record: &Record,
    sum: &mut Checksum,
) -> Result<u64, TraceError> {
    let bytes = postcard::to_stdvec(record).map_err(|e| TraceError::Corrupt(e.to_string()))?;
    out.write_all(&(bytes.len() as u64).to_le_bytes())?;
    out.write_all(&bytes)?;
    sum.add(&bytes);
    Ok(bytes.len() as u64 + 8)
}

impl<W: Write> TraceWriter<W> {
    /// Starts a trace: magic, version and header.
    pub fn new(mut out: W, header: &Header) -> Result<Self, TraceError> {
        out.write_all(&MAGIC)?;
        out.write_all(&FORMAT_VERSION.to_le_bytes())?;
        let mut sum = Checksum::default();
        write_record(&mut out, &Record::Header(header.clone()), &mut sum)?;
        Ok(TraceWriter {
            out,
            epochs: 0,
            sum,
        })
    }

    /// Appends a trace point; returns the bytes written.
    pub fn write_epoch(&mut self, epoch: &EpochTrace) -> Result<u64, TraceError> {
        self.epochs += 1;
        // Serialising clones nothing big: the record borrows through a helper enum.
        let n = write_record(&mut self.out, &Record::Epoch(epoch.clone()), &mut self.sum)?;
        Ok(n)
    }

    /// Writes the end record and flushes.
    pub fn finish(mut self) -> Result<W, TraceError> {
        let end = Record::End {
            epochs: self.epochs,
            checksum: self.sum.0,
        };
        write_record(&mut self.out, &end, &mut self.sum)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Reads a trace, one trace point at a time.
pub struct TraceReader<R: Read> {
    input: R,
    header: Header,
    epochs: u64,
    ended: bool,
    sum: Checksum,
}

fn read_record<R: Read>(
    input: &mut R,
    what: &str,
    sum: &mut Checksum,
) -> Result<Record, TraceError> {
    let mut len = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        match input.read(&mut len[got..]) {
            Ok(0) => {
                return Err(TraceError::Truncated(format!(
                    "the file ends where {what} should start"
                )))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = u64::from_le_bytes(len);
    if len > MAX_RECORD {
        return Err(TraceError::Corrupt(format!("{what} claims {len} bytes")));
    }
    let mut buf = Vec::new();
    input.by_ref().take(len).read_to_end(&mut buf)?;
    if (buf.len() as u64) < len {
        return Err(TraceError::Truncated(format!(
            "{what} has {} of its {len} bytes",
            buf.len()
        )));
    }
    let record =
        postcard::from_bytes(&buf).map_err(|e| TraceError::Corrupt(format!("{what}: {e}")))?;
    if !matches!(record, Record::End { .. }) {
        sum.add(&buf);
    }
    Ok(record)
}

impl<R: Read> TraceReader<R> {
    /// Checks magic and version and reads the header.
    pub fn new(mut input: R) -> Result<Self, TraceError> {
        let mut magic = [0u8; 12];
        let mut got = 0;
        while got < magic.len() {
            match input.read(&mut magic[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        if got < 8 || magic[..8] != MAGIC {
            return Err(TraceError::NotATrace);
        }
        if got < 12 {
            return Err(TraceError::Truncated(
                "the file ends inside its header".into(),
            ));
        }
        let version = u32::from_le_bytes(magic[8..12].try_into().expect("4 bytes"));
        if version != FORMAT_VERSION {
            return Err(TraceError::Version { found: version });
        }
        let mut sum = Checksum::default();
        match read_record(&mut input, "the header", &mut sum)? {
            Record::Header(header) => Ok(TraceReader {
                input,
                header,
                epochs: 0,
                ended: false,
                sum,
            }),
            _ => Err(TraceError::Corrupt(
                "the first record is not the header".into(),
            )),
        }
    }

    /// The run the trace describes.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The next trace point; `None` after the last one.
    pub fn next_epoch(&mut self) -> Result<Option<EpochTrace>, TraceError> {
        if self.ended {
            return Ok(None);
        }
        let what = format!("trace point {}", self.epochs + 1);
        match read_record(&mut self.input, &what, &mut self.sum)? {
            Record::Epoch(e) => {
                self.epochs += 1;
                Ok(Some(e))
            }
            Record::End { epochs, .. } if epochs != self.epochs => {
                Err(TraceError::Corrupt(format!(
                    "the end record counts {epochs} trace points, the file has {}",
                    self.epochs
                )))
            }
            Record::End { checksum, .. } if checksum != self.sum.0 => Err(TraceError::Corrupt(
                "its records do not match their checksum (the file was changed or damaged)".into(),
            )),
            Record::End { .. } => {
                let mut byte = [0u8; 1];
                loop {
                    match self.input.read(&mut byte) {
                        Ok(0) => break,
                        Ok(_) => {
                            return Err(TraceError::Corrupt(
                                "bytes follow its end record (the file was changed or damaged)"
                                    .into(),
                            ))
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                self.ended = true;
                Ok(None)
            }
            Record::Header(_) => Err(TraceError::Corrupt(format!("{what} is a second header"))),
        }
    }
}

/// What a whole trace holds (see [`check_whole`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceSummary {
    /// The run it describes.
    pub header: Header,
    /// Its trace points.
    pub points: u64,
    /// Whether any allocation at any point carries its values (else hashes only).
    pub has_values: bool,
}

/// Reads a trace through to its end record and checks its checksum: a file that is not a
/// trace, of another version, truncated, or changed anywhere is an error here, before a
/// comparison starts, rather than a difference or a failure half-way through a run.
pub fn check_whole<R: Read>(input: R) -> Result<TraceSummary, TraceError> {
    let mut reader = TraceReader::new(input)?;
    let mut has_values = false;
    while let Some(point) = reader.next_epoch()? {
        has_values |= point.allocs.iter().any(|a| a.values.is_some());
    }
    Ok(TraceSummary {
        header: reader.header().clone(),
        points: reader.epochs,
        has_values,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_points_name_the_epoch_they_end_as_race_reports_do() {
        let at = |epoch, at_exit| EpochTrace {
            epoch,
            at_exit,
            allocs: Vec::new(),
        };
        assert_eq!(
            (at(7, false).label(), at(7, false).ended_epoch()),
            ("barrier 7".into(), 7)
        );
        let finish = at(12, true);
        assert_eq!(finish.label(), "finish (after 12 barriers)");
        assert_eq!(finish.ended_epoch(), 13);
    }

    fn grid(n: usize, bump: Option<usize>) -> Vec<u8> {
        (0..n * n)
            .flat_map(|k| {
                let v = k as f64 + if Some(k) == bump { 1e-9 } else { 0.0 };
                v.to_le_bytes()
            })
            .collect()
    }

    fn epoch(bytes: &[u8], values: bool) -> EpochTrace {
        EpochTrace {
            epoch: 3,
            at_exit: false,
            allocs: vec![AllocTrace::from_bytes("grid", "f64", 8, 100, bytes, values)],
        }
    }

    #[test]
    fn write_read_round_trip_and_truncation() {
        let h = Header {
            program: "sor".into(),
            args: vec!["--size".into(), "100".into()],
        };
        let e = epoch(&grid(100, None), true);
        let mut w = TraceWriter::new(Vec::new(), &h).unwrap();
        w.write_epoch(&e).unwrap();
        let file = w.finish().unwrap();
        let mut r = TraceReader::new(&file[..]).unwrap();
        assert_eq!(r.header(), &h);
        assert_eq!(r.next_epoch().unwrap(), Some(e));
        assert_eq!(r.next_epoch().unwrap(), None);
        for cut in [0, 5, 10, 15, 40, file.len() - 3, file.len() - 12] {
            let err = TraceReader::new(&file[..cut])
                .and_then(|mut r| {
                    while r.next_epoch()?.is_some() {}
                    Ok(())
                })
                .unwrap_err();
            assert!(
                matches!(err, TraceError::Truncated(_) | TraceError::NotATrace),
                "cut {cut}: {err}"
            );
        }
        let mut bad = file.clone();
        bad[8] = 9;
        assert!(matches!(
            TraceReader::new(&bad[..]),
            Err(TraceError::Version { found: 9 })
        ));
        let mut bad = file.clone();
        for b in &mut bad[12..40] {
            *b = 0xff;
        }
        assert!(TraceReader::new(&bad[..]).is_err());
        // Bytes after the end record: zeros, or a record's worth.
        for tail in [&[0u8; 9][..], &file[12..40]] {
            let mut longer = file.clone();
            longer.extend_from_slice(tail);
            let err = check_whole(&longer[..]).unwrap_err();
            assert!(
                matches!(&err, TraceError::Corrupt(m) if m.contains("bytes follow its end record")),
                "{err}"
            );
        }
    }

    #[test]
    fn a_changed_byte_anywhere_is_found_by_the_whole_check() {
        let h = Header {
            program: "water".into(),
            args: Vec::new(),
        };
        let mut w = TraceWriter::new(Vec::new(), &h).unwrap();
        w.write_epoch(&epoch(&grid(100, None), true)).unwrap();
        w.write_epoch(&epoch(&grid(100, Some(7)), false)).unwrap();
        let file = w.finish().unwrap();
        let whole = check_whole(&file[..]).unwrap();
        assert_eq!(
            (&whole.header, whole.points, whole.has_values),
            (&h, 2, true)
        );
        // Two bytes flipped inside the values of the first point: the records still decode,
        // so only the checksum can tell.
        let mut bad = file.clone();
        let mid = file.len() / 3;
        bad[mid] ^= 0x10;
        bad[mid + 1] ^= 0x01;
        let err = check_whole(&bad[..]).unwrap_err();
        assert!(matches!(err, TraceError::Corrupt(_)), "{err}");
        assert!(err.to_string().contains("checksum"), "{err}");
        // Hashes only.
        let mut w = TraceWriter::new(Vec::new(), &h).unwrap();
        w.write_epoch(&epoch(&grid(100, None), false)).unwrap();
        let file = w.finish().unwrap();
        assert!(!check_whole(&file[..]).unwrap().has_values);
    }

    #[test]
    fn difference_is_located_with_values_and_blocked_without() {
        let a = epoch(&grid(100, None), true);
        let b = epoch(&grid(100, Some(1234)), true);
        assert!(compare_epoch(&a, &a, None, Sides::RUN).is_empty());
        let d = compare_epoch(&a, &b, None, Sides::RUN);
        match &d[..] {
            [Difference::Element { index, place, .. }] => {
                assert_eq!((*index, place.as_str()), (1234, "(12, 34)"))
            }
            other => panic!("{other:?}"),
        }
        assert!(compare_epoch(
            &a,
            &b,
            Some(Tolerance {
                abs: 1e-6,
                rel: 0.0
            }),
            Sides::RUN
        )
        .is_empty());
        let hashes_only = epoch(&grid(100, None), false);
        match &compare_epoch(&hashes_only, &b, None, Sides::RUN)[..] {
            [Difference::Block { elements, .. }] => assert_eq!(*elements, (1024, 1536)),
            other => panic!("{other:?}"),
        }
    }
}
