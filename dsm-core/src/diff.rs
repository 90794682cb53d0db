//! Diffs: the bytes of a page a node changed in an interval, found by comparing the page
//! with its twin (the copy taken at the first write). A diff names exactly the changed
//! bytes, never a neighbour that merely sits between two changes, so concurrent writers of
//! different bytes of one page (false sharing, even between neighbouring `u8` elements)
//! never overwrite each other at the home.
//!
//! Encoding: a sequence of runs, each `offset: u16 LE, len: u16 LE, bytes[len]`.

use dsm_proto::PAGE_SIZE;
use thiserror::Error;

/// Why an encoded diff was rejected. Diffs come from peers, so a malformed one is reported
/// rather than trusted.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DiffError {
    /// A run would write past the end of the page.
    #[error("diff run at offset {offset} with {len} bytes overruns the page")]
    Overrun {
        /// Where the run starts in the page.
        offset: usize,
        /// How many bytes it claims.
        len: usize,
    },
    /// The diff ends inside a run's header or bytes.
    #[error("diff is truncated")]
    Truncated,
}

/// Encodes the bytes where `current` differs from `twin` (both one page).
pub fn create(twin: &[u8], current: &[u8]) -> Vec<u8> {
    assert_eq!(twin.len(), PAGE_SIZE);
    assert_eq!(current.len(), PAGE_SIZE);
    let mut out = Vec::new();
    let mut run_start: Option<usize> = None;
    let flush = |out: &mut Vec<u8>, start: usize, end: usize| {
        out.extend_from_slice(&(start as u16).to_le_bytes());
        out.extend_from_slice(&((end - start) as u16).to_le_bytes());
        out.extend_from_slice(&current[start..end]);
    };
    for (chunk, (t, c)) in twin
        .chunks_exact(8)
        .zip(current.chunks_exact(8))
        .enumerate()
    {
        let base = chunk * 8;
        if t == c {
            if let Some(s) = run_start.take() {
                flush(&mut out, s, base);
            }
            continue;
        }
        for i in 0..8 {
            if t[i] != c[i] {
                if run_start.is_none() {
                    run_start = Some(base + i);
                }
            } else if let Some(s) = run_start.take() {
                flush(&mut out, s, base + i);
            }
        }
    }
    if let Some(s) = run_start {
        flush(&mut out, s, PAGE_SIZE);
    }
    out
}

/// Iterates the runs `(offset, bytes)` of an encoded diff, validating as it goes.
pub fn runs(diff: &[u8]) -> impl Iterator<Item = Result<(usize, &[u8]), DiffError>> {
    let mut rest = diff;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        if rest.len() < 4 {
            rest = &[];
            return Some(Err(DiffError::Truncated));
        }
        let offset = u16::from_le_bytes([rest[0], rest[1]]) as usize;
        let len = u16::from_le_bytes([rest[2], rest[3]]) as usize;
        if offset + len > PAGE_SIZE {
            rest = &[];
            return Some(Err(DiffError::Overrun { offset, len }));
        }
        if rest.len() < 4 + len {
            rest = &[];
            return Some(Err(DiffError::Truncated));
        }
        let bytes = &rest[4..4 + len];
        rest = &rest[4 + len..];
        Some(Ok((offset, bytes)))
    })
}

/// Checks a diff completely before any of it is applied, so a malformed diff changes
/// nothing.
pub fn validate(diff: &[u8]) -> Result<(), DiffError> {
    runs(diff).try_for_each(|r| r.map(|_| ()))
}

/// Applies a diff to a page buffer (used by tests and the in-memory protocol harness).
pub fn apply(page: &mut [u8], diff: &[u8]) -> Result<(), DiffError> {
    validate(diff)?;
    for run in runs(diff) {
        let (offset, bytes) = run?;
        page[offset..offset + bytes.len()].copy_from_slice(bytes);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn page_with(edits: &[(usize, u8)], base: u8) -> Vec<u8> {
        let mut p = vec![base; PAGE_SIZE];
        for &(i, v) in edits {
            p[i % PAGE_SIZE] = v;
        }
        p
    }

    proptest! {
        #[test]
        fn apply_of_create_reproduces_the_page(
            base in any::<u8>(),
            edits in proptest::collection::vec((0usize..PAGE_SIZE, any::<u8>()), 0..300),
        ) {
            let twin = vec![base; PAGE_SIZE];
            let current = page_with(&edits, base);
            let d = create(&twin, &current);
            let mut rebuilt = twin.clone();
            apply(&mut rebuilt, &d).unwrap();
            prop_assert_eq!(&rebuilt, &current);
        }

        #[test]
        fn diffs_touch_only_changed_bytes(
            edits_a in proptest::collection::vec((0usize..PAGE_SIZE / 2, 1u8..), 0..100),
            edits_b in proptest::collection::vec((PAGE_SIZE / 2..PAGE_SIZE, 1u8..), 0..100),
        ) {
            // Two writers change disjoint bytes of the same zero page; applying both diffs
            // in either order at the home yields both writes (multi-writer correctness).
            let twin = vec![0u8; PAGE_SIZE];
            let a = page_with(&edits_a, 0);
            let b = page_with(&edits_b, 0);
            let (da, db) = (create(&twin, &a), create(&twin, &b));
            let mut ab = twin.clone();
            apply(&mut ab, &da).unwrap();
            apply(&mut ab, &db).unwrap();
            let mut ba = twin.clone();
            apply(&mut ba, &db).unwrap();
            apply(&mut ba, &da).unwrap();
            prop_assert_eq!(&ab, &ba);
            for i in 0..PAGE_SIZE {
                let want = if i < PAGE_SIZE / 2 { a[i] } else { b[i] };
                prop_assert_eq!(ab[i], want);
            }
        }

        #[test]
        fn neighbouring_bytes_do_not_clobber(
            values in proptest::collection::vec(1u8.., PAGE_SIZE),
        ) {
            // Even bytes written by one node, odd bytes by another.
            let twin = vec![0u8; PAGE_SIZE];
            let mut even = twin.clone();
            let mut odd = twin.clone();
            for i in 0..PAGE_SIZE {
                if i % 2 == 0 { even[i] = values[i] } else { odd[i] = values[i] }
            }
            let mut home = twin.clone();
            apply(&mut home, &create(&twin, &even)).unwrap();
            apply(&mut home, &create(&twin, &odd)).unwrap();
            prop_assert_eq!(home, values);
        }

        #[test]
        fn malformed_diffs_are_rejected_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut page = vec![7u8; PAGE_SIZE];
            let before = page.clone();
            if apply(&mut page, &bytes).is_err() {
                prop_assert_eq!(page, before, "a rejected diff must change nothing");
            }
        }
    }

    #[test]
    fn identical_pages_give_empty_diff() {
        let p = vec![3u8; PAGE_SIZE];
        assert!(create(&p, &p).is_empty());
    }

    #[test]
    fn overrun_is_an_error() {
        let mut d = Vec::new();
        d.extend_from_slice(&4090u16.to_le_bytes());
        d.extend_from_slice(&10u16.to_le_bytes());
        d.extend_from_slice(&[0; 10]);
        assert_eq!(
            validate(&d),
            Err(DiffError::Overrun {
                offset: 4090,
                len: 10
            })
        );
    }
}
