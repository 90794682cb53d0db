//! The wire form of a list of interval records, as every message that carries intervals
//! sends it (`#[serde(with = "interval_list")]`): one byte string, record after record,
//! each field in declaration order as fixed-width little-endian integers, each list (vector
//! time, page runs, extents) after its length.
//!
//! Why not the derived form: serde decodes a derived record through a nested sequence
//! visitor for each of its vector time, page runs and extents, with a varint per number,
//! about 1 900 instructions for a record with race notices; and the barrier master decodes
//! every node's intervals of the epoch while the others wait for its release (with eight
//! ranks on one host, most of what race detection added to a barrier). Fixed-width fields
//! read straight off the bytes cost a few hundred; the bytes are more, but they cross a
//! ring or a socket at memory speed.
//!
//! Decoding trusts what a derived form would trust (a peer's page runs are taken as
//! sorted) and checks what could hurt the reader: every count is bounded by the bytes left,
//! every tag by its type, and the string must be consumed exactly; anything else is a
//! decode error naming what was wrong.

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

/// Bytes of an extent on the wire: page, blocks, start, end.
const EXTENT_BYTES: usize = 4 + 8 + 2 + 2;

/// The byte string of `records`.
pub fn encode(records: &[IntervalRecord]) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(4 + records.len() * 96));
    w.count(records.len());
    for r in records {
        w.record(r);
    }
    w.0
}

/// The records in `bytes`, which must hold exactly what [`encode`] writes.
pub fn decode(bytes: &[u8]) -> Result<Vec<IntervalRecord>, Malformed> {
    let mut r = Reader { bytes };
    // A record takes at least 2 + 4 + 4 + 4 + 1 + 1 bytes.
    let count = r.count(16)?;
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        records.push(r.record()?);
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

struct Writer(Vec<u8>);

impl Writer {
    fn count(&mut self, n: usize) {
        // Lists on the wire are far below 2^32 elements (a frame is at most 1 GiB).
        self.0.extend_from_slice(&(n as u32).to_le_bytes());
    }

    fn record(&mut self, r: &IntervalRecord) {
        self.0.extend_from_slice(&r.node.to_le_bytes());
        self.0.extend_from_slice(&r.index.to_le_bytes());
        self.count(r.vt.len());
        for &t in r.vt.0.iter() {
            self.0.extend_from_slice(&t.to_le_bytes());
        }
        self.runs(&r.writes);
        match &r.race {
            None => self.0.push(0),
            Some(n) => {
                self.0.push(1);
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
        self.0.push(tag);
        if let Some(v) = value {
            self.0.extend_from_slice(&v.to_le_bytes());
        }
    }

    fn runs(&mut self, runs: &PageRuns) {
        self.count(runs.runs().len());
        for &(first, count) in runs.runs() {
            self.0.extend_from_slice(&first.to_le_bytes());
            self.0.extend_from_slice(&count.to_le_bytes());
        }
    }

    fn extents(&mut self, extents: &Extents) {
        self.count(extents.len());
        for e in extents {
            self.0.extend_from_slice(&e.page.to_le_bytes());
            self.0.extend_from_slice(&e.blocks.to_le_bytes());
            self.0.extend_from_slice(&e.start.to_le_bytes());
            self.0.extend_from_slice(&e.end.to_le_bytes());
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    #[inline(always)]
    fn take<const N: usize>(&mut self) -> Result<[u8; N], Malformed> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<N>()
            .ok_or(Malformed("a record is cut short"))?;
        self.bytes = rest;
        Ok(*head)
    }

    fn u8(&mut self) -> Result<u8, Malformed> {
        self.take::<1>().map(|[b]| b)
    }

    fn u16(&mut self) -> Result<u16, Malformed> {
        self.take().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, Malformed> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, Malformed> {
        self.take().map(u64::from_le_bytes)
    }

    /// A count of elements that follow, each at least `bytes_each` bytes.
    fn count(&mut self, bytes_each: usize) -> Result<usize, Malformed> {
        let n = self.u32()? as usize;
        if n.saturating_mul(bytes_each) > self.bytes.len() {
            return Err(Malformed("a count exceeds the bytes left"));
        }
        Ok(n)
    }

    fn record(&mut self) -> Result<IntervalRecord, Malformed> {
        let node = self.u16()?;
        let index = self.u32()?;
        let nodes = self.count(4)?;
        let mut vt = SmallVec::with_capacity(nodes);
        for _ in 0..nodes {
            vt.push(self.u32()?);
        }
        let writes = self.runs()?;
        let race = match self.u8()? {
            0 => None,
            1 => Some(RaceNotices {
                reads: self.runs()?,
                writes: self.runs()?,
                read_extents: self.extents()?,
                write_extents: self.extents()?,
            }),
            _ => return Err(Malformed("a notice flag is neither 0 nor 1")),
        };
        let began_with = match self.u8()? {
            0 => SyncCause::Start,
            1 => SyncCause::Barrier(
                u32::try_from(self.u64()?)
                    .map_err(|_| Malformed("a barrier number is out of range"))?,
            ),
            2 => SyncCause::Acquire(self.u64()?),
            3 => SyncCause::Release(self.u64()?),
            4 => SyncCause::SemWait(self.u64()?),
            5 => SyncCause::SemSignal(self.u64()?),
            6 => SyncCause::SemTryFailed(self.u64()?),
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
        let n = self.count(8)?;
        let mut runs = SmallVec::with_capacity(n);
        for _ in 0..n {
            runs.push((self.u32()?, self.u32()?));
        }
        Ok(PageRuns(runs))
    }

    fn extents(&mut self) -> Result<Extents, Malformed> {
        let n = self.count(EXTENT_BYTES)?;
        let mut extents = Extents::with_capacity(n);
        for _ in 0..n {
            extents.push(PageExtent {
                page: self.u32()?,
                blocks: self.u64()?,
                start: self.u16()?,
                end: self.u16()?,
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
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(b) = seq.next_element::<u8>()? {
            bytes.push(b);
        }
        self.visit_bytes(&bytes)
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
            prop_assert_eq!(postcard::from_bytes::<crate::Msg>(&bytes).unwrap(), msg);
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
        // One record claimed, none there.
        let e = decode(&[1, 0, 0, 0]).unwrap_err();
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
        // The notice flag: after the count, node, index, vector time and write runs.
        let flag = 4 + 2 + 4 + (4 + 8) + 4;
        assert_eq!(bytes[flag], 0);
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
    }
}
