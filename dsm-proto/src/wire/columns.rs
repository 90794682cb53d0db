//! Access bitmaps in columns, as a race batch carries them ([`BitmapColumns`]).
//!
//! A lock-only program ships every bitmap it records to the race master between barriers,
//! and the master holds each until every node has seen its interval; most are never
//! compared. One [`EncodedBitmap`](super::EncodedBitmap) per bitmap cost an allocation or
//! two on each side and a serde visit per field, about 3 000 instructions a bitmap from
//! the sender's store to the master's. In columns a batch is three arrays of plain values
//! and travels as three byte strings of fixed-width little-endian fields: the sender
//! appends, the master reads each column in one pass and keeps the words as they came.

use super::{AccessKind, BitmapKey, SiteSpan, SourceSite};
use serde::{Deserialize, Serialize};

/// Words of the longest bitmap: a page of one-byte granules, a bit each.
pub const MAX_PAGE_WORDS: usize = crate::PAGE_SIZE / 64;

/// Access bitmaps in columns: entry `i` owns the next `words` words of `words` and the
/// next `sites` spans of `sites`, after those of the entries before it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct BitmapColumns {
    /// One entry per bitmap.
    #[serde(with = "fixed")]
    pub entries: Vec<ColumnEntry>,
    /// The bitmaps' words, entry after entry (one bit per granule of the page); a uniform
    /// bitmap holds its one word (see [`ColumnEntry::uniform`]).
    #[serde(with = "fixed")]
    pub words: Vec<u64>,
    /// The bitmaps' site spans, entry after entry (see `EncodedBitmap::sites`).
    #[serde(with = "fixed")]
    pub sites: Vec<SiteSpan>,
    /// The sites of `sites` that this batch is the first of its node's messages to name,
    /// defined (see `EncodedBitmap::defs`).
    pub defs: Vec<(u32, SourceSite)>,
}

/// One bitmap of [`BitmapColumns`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnEntry {
    /// Which bitmap.
    pub key: BitmapKey,
    /// How many words of the words column are its own.
    pub words: u32,
    /// 0, or the page's word count when every word of the bitmap is its one word (the
    /// column then holds that word once).
    pub uniform: u32,
    /// How many spans of the sites column are its own.
    pub sites: u32,
}

impl ColumnEntry {
    /// Appends the bitmap's words (`words`, its part of the words column) to `out`, a
    /// uniform one's word once per word of its page (at most [`MAX_PAGE_WORDS`]).
    pub fn spread_into(&self, words: &[u64], out: &mut Vec<u64>) {
        match (self.uniform, words) {
            (0, _) => out.extend_from_slice(words),
            (count, &[one]) => out.resize(out.len() + (count as usize).min(MAX_PAGE_WORDS), one),
            // Not consistent (see `BitmapColumns::is_consistent`): nothing.
            _ => {}
        }
    }
}

impl BitmapColumns {
    /// Whether the entries account for the words and the site spans exactly, no bitmap is
    /// longer than a page of one-byte granules, and every uniform entry holds one word:
    /// what a receiver checks before taking a batch.
    pub fn is_consistent(&self) -> bool {
        let (mut words, mut sites) = (0u64, 0u64);
        for e in &self.entries {
            if (e.uniform != 0 && e.words != 1)
                || e.words as usize > MAX_PAGE_WORDS
                || e.uniform as usize > MAX_PAGE_WORDS
            {
                return false;
            }
            words += u64::from(e.words);
            sites += u64::from(e.sites);
        }
        words == self.words.len() as u64 && sites == self.sites.len() as u64
    }

    /// Each entry with its words and site spans (stops early, never panics, on columns
    /// that are not [consistent](Self::is_consistent)).
    pub fn iter(&self) -> impl Iterator<Item = (&ColumnEntry, &[u64], &[SiteSpan])> + '_ {
        let (mut w, mut s) = (0usize, 0usize);
        self.entries.iter().map_while(move |e| {
            let words = self.words.get(w..w.checked_add(e.words as usize)?)?;
            let sites = self.sites.get(s..s.checked_add(e.sites as usize)?)?;
            w += e.words as usize;
            s += e.sites as usize;
            Some((e, words, sites))
        })
    }

    /// Number of bitmaps.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A value written as a fixed number of little-endian bytes.
trait Fixed: Sized {
    const BYTES: usize;
    fn put(&self, out: &mut Vec<u8>);
    /// From exactly `BYTES` bytes; `None` if they name no value.
    fn get(bytes: &[u8]) -> Option<Self>;
}

impl Fixed for u64 {
    const BYTES: usize = 8;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(bytes: &[u8]) -> Option<Self> {
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }
}

impl Fixed for SiteSpan {
    const BYTES: usize = 8;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.site.to_le_bytes());
        out.extend_from_slice(&self.first.to_le_bytes());
        out.extend_from_slice(&self.last.to_le_bytes());
    }
    fn get(b: &[u8]) -> Option<Self> {
        Some(SiteSpan {
            site: u32::from_le_bytes(b.get(0..4)?.try_into().ok()?),
            first: u16::from_le_bytes(b.get(4..6)?.try_into().ok()?),
            last: u16::from_le_bytes(b.get(6..8)?.try_into().ok()?),
        })
    }
}

impl Fixed for ColumnEntry {
    const BYTES: usize = 4 + 4 + 1 + 4 + 4 + 4;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.key.interval.to_le_bytes());
        out.extend_from_slice(&self.key.page.to_le_bytes());
        out.push(match self.key.kind {
            AccessKind::Read => 0,
            AccessKind::Write => 1,
        });
        out.extend_from_slice(&self.words.to_le_bytes());
        out.extend_from_slice(&self.uniform.to_le_bytes());
        out.extend_from_slice(&self.sites.to_le_bytes());
    }
    fn get(b: &[u8]) -> Option<Self> {
        let u32_at = |at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
        Some(ColumnEntry {
            key: BitmapKey {
                interval: u32_at(0)?,
                page: u32_at(4)?,
                kind: match b.get(8)? {
                    0 => AccessKind::Read,
                    1 => AccessKind::Write,
                    _ => return None,
                },
            },
            words: u32_at(9)?,
            uniform: u32_at(13)?,
            sites: u32_at(17)?,
        })
    }
}

/// A column as one byte string of its values' fixed-width forms.
mod fixed {
    use super::Fixed;
    use serde::{de, Deserializer, Serializer};
    use std::fmt;
    use std::marker::PhantomData;

    pub(super) fn serialize<T: Fixed, S: Serializer>(
        values: &[T],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut out = Vec::with_capacity(values.len() * T::BYTES);
        for v in values {
            v.put(&mut out);
        }
        serializer.serialize_bytes(&out)
    }

    pub(super) fn deserialize<'de, T: Fixed, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<T>, D::Error> {
        deserializer.deserialize_bytes(Column(PhantomData))
    }

    struct Column<T>(PhantomData<T>);

    impl<'de, T: Fixed> de::Visitor<'de> for Column<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a bitmap column of {}-byte values", T::BYTES)
        }

        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<T>, E> {
            if !v.len().is_multiple_of(T::BYTES) {
                return Err(E::custom(
                    "a bitmap column's length is not a whole number of values",
                ));
            }
            v.chunks_exact(T::BYTES)
                .map(|c| {
                    T::get(c).ok_or_else(|| E::custom("a bitmap column holds an invalid value"))
                })
                .collect()
        }

        /// Self-describing formats without a bytes type (JSON) give the bytes as a sequence.
        fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Vec<T>, A::Error> {
            self.visit_bytes(&super::super::seq_bytes(seq)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry() -> impl Strategy<Value = (ColumnEntry, Vec<u64>, Vec<SiteSpan>)> {
        (
            any::<u32>(),
            any::<u32>(),
            any::<bool>(),
            proptest::collection::vec(any::<u64>(), 1..9),
            any::<bool>(),
            proptest::collection::vec((any::<u32>(), any::<u16>(), any::<u16>()), 0..3),
        )
            .prop_map(|(interval, page, write, words, uniform, sites)| {
                let words = if uniform { words[..1].to_vec() } else { words };
                let e = ColumnEntry {
                    key: BitmapKey {
                        interval,
                        page,
                        kind: if write {
                            AccessKind::Write
                        } else {
                            AccessKind::Read
                        },
                    },
                    words: words.len() as u32,
                    uniform: if uniform { 8 } else { 0 },
                    sites: sites.len() as u32,
                };
                let sites = sites
                    .into_iter()
                    .map(|(site, first, last)| SiteSpan { site, first, last })
                    .collect();
                (e, words, sites)
            })
    }

    fn columns(parts: Vec<(ColumnEntry, Vec<u64>, Vec<SiteSpan>)>) -> BitmapColumns {
        let mut c = BitmapColumns::default();
        for (e, w, s) in parts {
            c.entries.push(e);
            c.words.extend(w);
            c.sites.extend(s);
        }
        c
    }

    proptest! {
        #[test]
        fn columns_come_back_as_they_went(parts in proptest::collection::vec(entry(), 0..12)) {
            let c = columns(parts.clone());
            prop_assert!(c.is_consistent());
            let back: BitmapColumns = postcard::from_bytes(&postcard::to_stdvec(&c).unwrap()).unwrap();
            prop_assert_eq!(&back, &c);
            let json: BitmapColumns = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
            prop_assert_eq!(&json, &c);
            let seen: Vec<_> = back.iter().map(|(e, w, s)| (*e, w.to_vec(), s.to_vec())).collect();
            prop_assert_eq!(seen, parts);
        }

        #[test]
        fn any_bytes_decode_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(c) = postcard::from_bytes::<BitmapColumns>(&bytes) {
                let _ = c.is_consistent();
                let _ = c.iter().count();
            }
        }
    }

    #[test]
    fn inconsistent_columns_are_told_and_iterate_safely() {
        let mut c = columns(vec![(
            ColumnEntry {
                key: BitmapKey {
                    interval: 1,
                    page: 2,
                    kind: AccessKind::Read,
                },
                words: 2,
                uniform: 0,
                sites: 0,
            },
            vec![1, 2],
            vec![],
        )]);
        assert!(c.is_consistent());
        c.words.pop();
        assert!(!c.is_consistent());
        assert_eq!(c.iter().count(), 0);
        c.words.push(2);
        c.entries[0].words = 65;
        assert!(!c.is_consistent(), "longer than a page");
        c.entries[0].words = 2;
        c.entries[0].uniform = 8;
        assert!(!c.is_consistent(), "a uniform entry holds one word");
        // A column cut inside a value is an error, not a shorter column.
        #[derive(Deserialize, Debug)]
        struct Words(#[serde(with = "fixed")] Vec<u64>);
        let mut bytes = vec![16];
        bytes.extend([7; 16]);
        assert_eq!(postcard::from_bytes::<Words>(&bytes).unwrap().0.len(), 2);
        bytes[0] = 15;
        bytes.truncate(16);
        let e = postcard::from_bytes::<Words>(&bytes).unwrap_err();
        assert!(matches!(e, postcard::Error::SerdeDeCustom), "{e:?}");
    }
}
