//! The exact sequential reference: Held-Karp dynamic programming over subsets, O(2^n n^2)
//! time and O(2^n n) memory, and a brute-force enumeration to test it on tiny instances.
//!
//! `best[S][k]` is the length of the shortest path that starts at city 0, visits exactly
//! the set S of other cities and ends at k in S; `best[S][k] = min over j in S\{k} of
//! best[S\{k}][j] + d(j, k)`, and the tour length is `min over k of best[all][k] + d(k, 0)`.

use super::Instance;

/// Larger than any path length, and small enough that adding an edge cannot overflow: it
/// stands for "no such path" so the inner loop needs no membership test.
const NONE: i64 = i64::MAX / 4;

/// The optimal tour length of `inst`. Memory is `2^(n-1) * (n-1)` words: keep n <= ~24.
pub fn held_karp(inst: &Instance) -> i64 {
    let n = inst.n;
    if n <= 2 {
        return if n == 2 {
            inst.d(0, 1) + inst.d(1, 0)
        } else {
            0
        };
    }
    // Cities 1..n are bits 0..m of a subset.
    let m = n - 1;
    let subsets = 1usize << m;
    // into[k * m + j] = d(j, k), so the inner loop reads two contiguous rows.
    let mut into = vec![NONE; m * m];
    for k in 0..m {
        for j in 0..m {
            if j != k {
                into[k * m + j] = inst.d(j + 1, k + 1);
            }
        }
    }
    let mut best = vec![NONE; subsets * m];
    for k in 0..m {
        best[(1 << k) * m + k] = inst.d(0, k + 1);
    }
    for set in 1..subsets {
        if set.is_power_of_two() {
            continue;
        }
        let mut rest = set;
        while rest != 0 {
            let k = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let prev = set & !(1 << k);
            let from = &best[prev * m..prev * m + m];
            let cost = &into[k * m..k * m + m];
            // Cities outside `prev` hold NONE, so they never win the minimum.
            let v = from
                .iter()
                .zip(cost)
                .map(|(a, b)| a + b)
                .min()
                .unwrap_or(NONE);
            best[set * m + k] = v;
        }
    }
    let all = subsets - 1;
    (0..m)
        .map(|k| best[all * m + k] + inst.d(k + 1, 0))
        .min()
        .unwrap_or(NONE)
}

/// The optimal tour length by trying every tour that starts at city 0 ((n-1)! of them).
pub fn brute_force(inst: &Instance) -> i64 {
    fn go(inst: &Instance, path: &mut Vec<usize>, used: &mut [bool], len: i64, best: &mut i64) {
        let last = *path.last().unwrap_or(&0);
        if path.len() == inst.n {
            *best = (*best).min(len + inst.close_cost(last));
            return;
        }
        for c in 1..inst.n {
            if !used[c] {
                used[c] = true;
                path.push(c);
                go(inst, path, used, len + inst.d(last, c), best);
                path.pop();
                used[c] = false;
            }
        }
    }
    let mut best = i64::MAX;
    let mut used = vec![false; inst.n];
    used[0] = true;
    go(inst, &mut vec![0], &mut used, 0, &mut best);
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tsp::input::{random, SplitMix64};

    #[test]
    fn agrees_with_brute_force_on_random_instances() {
        for n in 1..=8 {
            for seed in 0..6 {
                for asym in [false, true] {
                    let inst = random(n, seed * 31 + n as u64, asym);
                    assert_eq!(
                        held_karp(&inst),
                        brute_force(&inst),
                        "n {n} seed {seed} asym {asym}"
                    );
                }
            }
        }
    }

    #[test]
    fn handles_negative_and_zero_weights() {
        let mut rng = SplitMix64::new(99);
        for n in 3..=7 {
            let dist = (0..n * n)
                .map(|_| rng.below(21) as i64 - 10)
                .collect::<Vec<_>>();
            let inst = Instance::new("neg", n, dist);
            assert_eq!(held_karp(&inst), brute_force(&inst), "n {n}");
        }
    }

    #[test]
    fn tiny_cases() {
        assert_eq!(held_karp(&Instance::new("1", 1, vec![5])), 0);
        assert_eq!(held_karp(&Instance::new("2", 2, vec![0, 3, 4, 0])), 7);
        assert_eq!(brute_force(&Instance::new("2", 2, vec![0, 3, 4, 0])), 7);
        assert_eq!(brute_force(&Instance::new("1", 1, vec![5])), 0);
    }
}
