//! The wire form of a list of interval records, as every message that carries intervals
//! sends it (`#[serde(with = "interval_list")]`): one byte string, record after record,
//! each field in declaration order, each list (vector time, page runs, extents) after its
//! length. Numbers are LEB128 varints, but for the extents' block masks (eight bytes,
//! little-endian: they are dense); a vector time entry is the zigzag difference from the
//! same entry of the record before (a node's records differ in a few entries).
//!
//! Why not the derived form: serde decodes a derived record through a nested sequence
//! visitor for each of its vector time, page runs and extents, about 1 900 instructions
//! for a record with race notices; and the barrier master decodes every node's intervals
//! of the epoch while the others wait for its release (with eight ranks on one host, most
//! of what race detection added to a barrier). Read straight off the bytes, with a
//! one-byte number taking a compare and a shift, a record costs a few hundred, and takes
//! fewer bytes than the derived form (a vector time of unchanged entries, a byte each).
//!
//! Decoding trusts what a derived form would trust (a peer's page runs are taken as
//! sorted) and checks what could hurt the reader: every count is bounded by the bytes left,
//! every value and tag by its type, and the string must be consumed exactly; anything else
//! is a decode error naming what was wrong.

use super::{Extents, IntervalRecord, PageExtent, PageRuns, RaceNotices, SyncCause, VectorTime};
use serde::{de, Deserializer, Serializer};
use smallvec::SmallVec;
use std::fmt;

/// Serializes `records` as one byte string (see the module's documentation).
pub fn serialize<S: Serializer>(
    records: &[IntervalRecord],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_bytes(&encode(records))
}

/// Deserializes what [`serialize`] wrote.
pub fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<IntervalRecord>, D::Error> {
    deserializer.deserialize_bytes(ListVisitor)
}

/// The byte string of `records`.
pub fn encode(records: &[IntervalRecord]) -> Vec<u8> {
    let mut w = Writer {
        out: Vec::with_capacity(4 + records.len() * 40),
        prev_vt: &[],
    };
    w.uint(records.len() as u64);
    for r in records {
        w.record(r);
    }
    w.out
}

/// The records in `bytes`, which must hold exactly what [`encode`] writes.
pub fn decode(bytes: &[u8]) -> Result<Vec<IntervalRecord>, Malformed> {
    let mut r = Reader { bytes };
    // A record takes at least five bytes (node, index, vector time length, write runs,
    // notice flag, cause).
    let count = r.count(5)?;
    let mut records: Vec<IntervalRecord> = Vec::with_capacity(count);
    for _ in 0..count {
        let prev = records.last().map_or(&[][..], |p| &p.vt.0[..]);
        let record = r.record(prev)?;
        records.push(record);
    }
    if !r.bytes.is_empty() {
        return Err(Malformed("bytes left after the last interval record"));
    }
    Ok(records)
}

/// Why an interval list could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(&'static str);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed interval list: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

fn unzigzag(z: u64) -> i64 {
    (z >> 1) as i64 ^ -((z & 1) as i64)
}

struct Writer<'a> {
    out: Vec<u8>,
    /// The vector time of the record written last (entries are sent as differences).
    prev_vt: &'a [u32],
}

impl<'a> Writer<'a> {
    fn uint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.out.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.out.push(v as u8);
    }

    fn record(&mut self, r: &'a IntervalRecord) {
        self.uint(r.node.into());
        self.uint(r.index.into());
        self.uint(r.vt.len() as u64);
        for (k, &t) in r.vt.0.iter().enumerate() {
            let prev = self.prev_vt.get(k).copied().unwrap_or(0);
            self.uint(zigzag(i64::from(t) - i64::from(prev)));
        }
        self.prev_vt = &r.vt.0;
        self.runs(&r.writes);
        match &r.race {
            None => self.out.push(0),
            Some(n) => {
                self.out.push(1);
                self.runs(&n.reads);
                self.runs(&n.writes);
                self.extents(&n.read_extents);
                self.extents(&n.write_extents);
            }
        }
        let (tag, value) = match r.began_with {
            SyncCause::Start => (0, None),
            SyncCause::Barrier(e) => (1, Some(e.into())),
            SyncCause::Acquire(l) => (2, Some(l)),
            SyncCause::Release(l) => (3, Some(l)),
            SyncCause::SemWait(s) => (4, Some(s)),
            SyncCause::SemSignal(s) => (5, Some(s)),
            SyncCause::SemTryFailed(s) => (6, Some(s)),
        };
        self.out.push(tag);
        if let Some(v) = value {
            self.uint(v);
        }
    }

    fn runs(&mut self, runs: &PageRuns) {
        self.uint(runs.runs().len() as u64);
        for &(first, count) in runs.runs() {
            self.uint(first.into());
            self.uint(count.into());
        }
    }

    fn extents(&mut self, extents: &Extents) {
        self.uint(extents.len() as u64);
        for e in extents {
            self.uint(e.page.into());
            self.out.extend_from_slice(&e.blocks.to_le_bytes());
            self.uint(e.start.into());
            self.uint(e.end.into());
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    /// A varint: one byte for values below 128 and two below 16 384 (indices, lock
    /// numbers, offsets in a page), tested first.
    #[inline(always)]
    fn uint(&mut self) -> Result<u64, Malformed> {
        match *self.bytes {
            [b, ref rest @ ..] if b < 0x80 => {
                self.bytes = rest;
                Ok(u64::from(b))
            }
            [b0, b1, ref rest @ ..] if b1 < 0x80 => {
                self.bytes = rest;
                Ok(u64::from(b0 & 0x7f) | u64::from(b1) << 7)
            }
            _ => self.long_uint(),
        }
    }

    #[inline(never)]
    fn long_uint(&mut self) -> Result<u64, Malformed> {
        let mut v = 0u64;
        for (i, &b) in self.bytes.iter().enumerate().take(10) {
            let bits = u64::from(b & 0x7f);
            if i == 9 && b > 1 {
                break;
            }
            v |= bits << (7 * i);
            if b < 0x80 {
                self.bytes = &self.bytes[i + 1..];
                return Ok(v);
            }
        }
        Err(Malformed("a number is cut short or too long"))
    }

    #[inline(always)]
    fn small<T: TryFrom<u64>>(&mut self, what: &'static str) -> Result<T, Malformed> {
        T::try_from(self.uint()?).map_err(|_| Malformed(what))
    }

    fn byte(&mut self) -> Result<u8, Malformed> {
        let (&b, rest) = self
            .bytes
            .split_first()
            .ok_or(Malformed("a record is cut short"))?;
        self.bytes = rest;
        Ok(b)
    }

    fn u64_le(&mut self) -> Result<u64, Malformed> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<8>()
            .ok_or(Malformed("a record is cut short"))?;
        self.bytes = rest;
        Ok(u64::from_le_bytes(*head))
    }

    /// A count of elements that follow, each at least `bytes_each` bytes.
    fn count(&mut self, bytes_each: usize) -> Result<usize, Malformed> {
        let n = self.uint()?;
        if n.saturating_mul(bytes_each as u64) > self.bytes.len() as u64 {
            return Err(Malformed("a count exceeds the bytes left"));
        }
        Ok(n as usize)
    }

    fn record(&mut self, prev_vt: &[u32]) -> Result<IntervalRecord, Malformed> {
        let node = self.small("a node id is out of range")?;
        let index = self.small("an interval index is out of range")?;
        let nodes = self.count(1)?;
        let mut vt = SmallVec::with_capacity(nodes);
        for k in 0..nodes {
            let prev = i64::from(prev_vt.get(k).copied().unwrap_or(0));
            let t = u32::try_from(prev + unzigzag(self.uint()?))
                .map_err(|_| Malformed("a vector time entry is out of range"))?;
            vt.push(t);
        }
        let writes = self.runs()?;
        let race = match self.byte()? {
            0 => None,
            1 => Some(RaceNotices {
                reads: self.runs()?,
                writes: self.runs()?,
                read_extents: self.extents()?,
                write_extents: self.extents()?,
            }),
            _ => return Err(Malformed("a notice flag is neither 0 nor 1")),
        };
        let began_with = match self.byte()? {
            0 => SyncCause::Start,
            1 => SyncCause::Barrier(self.small("a barrier number is out of range")?),
            2 => SyncCause::Acquire(self.uint()?),
            3 => SyncCause::Release(self.uint()?),
            4 => SyncCause::SemWait(self.uint()?),
            5 => SyncCause::SemSignal(self.uint()?),
            6 => SyncCause::SemTryFailed(self.uint()?),
            _ => return Err(Malformed("an unknown synchronization cause")),
        };
        Ok(IntervalRecord {
            node,
            index,
            vt: VectorTime(vt),
            writes,
            race,
            began_with,
        })
    }

    fn runs(&mut self) -> Result<PageRuns, Malformed> {
        let n = self.count(2)?;
        let mut runs = SmallVec::with_capacity(n);
        for _ in 0..n {
            let first = self.small("a page number is out of range")?;
            let count = self.small("a run length is out of range")?;
            runs.push((first, count));
        }
        Ok(PageRuns(runs))
    }

    fn extents(&mut self) -> Result<Extents, Malformed> {
        // Page, eight bytes of blocks, start, end.
        let n = self.count(11)?;
        let mut extents = Extents::with_capacity(n);
        for _ in 0..n {
            extents.push(PageExtent {
                page: self.small("a page number is out of range")?,
                blocks: self.u64_le()?,
                start: self.small("an extent's start is out of range")?,
                end: self.small("an extent's end is out of range")?,
            });
        }
        Ok(extents)
    }
}

struct ListVisitor;

impl<'de> de::Visitor<'de> for ListVisitor {
    type Value = Vec<IntervalRecord>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the bytes of an interval list")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
        decode(v).map_err(E::custom)
    }

    /// Self-describing formats without a bytes type (JSON) give the bytes as a sequence.
    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.visit_bytes(&super::seq_bytes(seq)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn runs() -> impl Strategy<Value = PageRuns> {
        proptest::collection::vec(0u32..5000, 0..6).prop_map(PageRuns::from_pages)
    }

    fn extents() -> impl Strategy<Value = Extents> {
        proptest::collection::vec(
            (any::<u32>(), any::<u64>(), any::<u16>(), any::<u16>()),
            0..3,
        )
        .prop_map(|v| {
            v.into_iter()
                .map(|(page, blocks, start, end)| PageExtent {
                    page,
                    blocks,
                    start,
                    end,
                })
                .collect()
        })
    }

    fn cause() -> impl Strategy<Value = SyncCause> {
        prop_oneof![
            Just(SyncCause::Start),
            any::<u32>().prop_map(SyncCause::Barrier),
            any::<u64>().prop_map(SyncCause::Acquire),
            any::<u64>().prop_map(SyncCause::Release),
            any::<u64>().prop_map(SyncCause::SemWait),
            any::<u64>().prop_map(SyncCause::SemSignal),
            any::<u64>().prop_map(SyncCause::SemTryFailed),
        ]
    }

    fn record() -> impl Strategy<Value = IntervalRecord> {
        let notices =
            (runs(), runs(), extents(), extents()).prop_map(|(r, w, re, we)| RaceNotices {
                reads: r,
                writes: w,
                read_extents: re,
                write_extents: we,
            });
        (
            any::<u16>(),
            any::<u32>(),
            proptest::collection::vec(any::<u32>(), 0..12),
            runs(),
            proptest::option::of(notices),
            cause(),
        )
            .prop_map(
                |(node, index, vt, writes, race, began_with)| IntervalRecord {
                    node,
                    index,
                    vt: VectorTime::from(vt),
                    writes,
                    race,
                    began_with,
                },
            )
    }

    proptest! {
        #[test]
        fn a_list_comes_back_as_it_went(records in proptest::collection::vec(record(), 0..20)) {
            prop_assert_eq!(decode(&encode(&records)).unwrap(), records.clone());
            // Inside a message, through the transport's own format.
            let msg = crate::Msg::BarrierRelease {
                epoch: 3,
                known: VectorTime::zero(2),
                intervals: records,
                races: 1,
            };
            let bytes = postcard::to_stdvec(&msg).unwrap();
            prop_assert_eq!(postcard::from_bytes::<crate::Msg>(&bytes).unwrap(), msg.clone());
            // A format without a bytes type carries the string as a sequence.
            let json = serde_json::to_string(&msg).unwrap();
            prop_assert_eq!(serde_json::from_str::<crate::Msg>(&json).unwrap(), msg);
        }

        #[test]
        fn a_cut_list_is_an_error(records in proptest::collection::vec(record(), 1..6), cut in 1usize..64) {
            let bytes = encode(&records);
            let keep = bytes.len().saturating_sub(cut);
            prop_assert!(decode(&bytes[..keep]).is_err());
            let mut longer = bytes.clone();
            longer.push(0);
            prop_assert!(decode(&longer).is_err());
        }

        #[test]
        fn any_bytes_decode_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
        }
    }

    #[test]
    fn errors_say_what_was_wrong() {
        // Two records claimed, one byte there.
        let e = decode(&[2, 0]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "malformed interval list: a count exceeds the bytes left"
        );
        let one = IntervalRecord {
            node: 1,
            index: 2,
            vt: VectorTime::zero(2),
            writes: PageRuns::new(),
            race: None,
            began_with: SyncCause::Acquire(7),
        };
        let mut bytes = encode(&[one]);
        // Count, node, index, vector time (length, two entries), write runs (none), the
        // notice flag, the cause, its lock.
        assert_eq!(bytes, [1, 1, 2, 2, 0, 0, 0, 0, 2, 7]);
        let flag = 7;
        bytes[flag] = 2;
        assert_eq!(
            decode(&bytes).unwrap_err().0,
            "a notice flag is neither 0 nor 1"
        );
        bytes[flag] = 0;
        bytes[flag + 1] = 9;
        assert_eq!(
            decode(&bytes).unwrap_err().0,
            "an unknown synchronization cause"
        );
        // Node 70 000 does not fit a node id.
        let mut big = vec![1];
        big.extend([0xf0, 0xa2, 0x04, 0, 0]);
        assert_eq!(decode(&big).unwrap_err().0, "a node id is out of range");
        // Eleven continuation bytes are no number.
        let mut long = vec![1];
        long.extend([0xff; 11]);
        assert_eq!(
            decode(&long).unwrap_err().0,
            "a number is cut short or too long"
        );
    }
}
