//! Travelling salesman by parallel branch and bound on the DSM: the problem instance
//! (a dense integer distance matrix, symmetric or not) and the limits every part agrees
//! on. Submodules own the rest: [`input`] builds instances (random generator, matrix
//! files, TSPLIB files), [`search`] is the parallel search with its shared queue, pool
//! and global bound, and [`heldkarp`] is the exact sequential solver the result is
//! verified against.

pub mod heldkarp;
pub mod input;
pub mod search;

/// Most cities an instance may have: visited sets are `u32` bit masks and tour prefixes
/// fixed-size arrays of this many entries.
pub const MAX_CITIES: usize = 32;

/// Above this many cities the search may take very long; the binary warns.
pub const COMFORTABLE_CITIES: usize = 24;

/// Largest instance Held-Karp verifies by default (O(2^n n^2) time, O(2^n n) memory).
pub const VERIFY_MAX_CITIES: usize = 20;

/// Largest absolute edge weight accepted, so that a tour of [`MAX_CITIES`] edges, and
/// every bound computed from them, stays far from `i64` overflow.
pub const MAX_WEIGHT: i64 = 1 << 40;

/// A TSP instance: `n` cities and the weight `dist[i * n + j]` of the edge from `i` to
/// `j`. The diagonal is never used. Tours start and end at city 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    pub name: String,
    pub n: usize,
    pub dist: Vec<i64>,
}

impl Instance {
    /// An instance from a row-major `n x n` matrix.
    pub fn new(name: impl Into<String>, n: usize, dist: Vec<i64>) -> Instance {
        assert_eq!(dist.len(), n * n, "distance matrix must be n x n");
        Instance {
            name: name.into(),
            n,
            dist,
        }
    }

    #[inline(always)]
    pub fn d(&self, i: usize, j: usize) -> i64 {
        self.dist[i * self.n + j]
    }

    /// Cost of returning from `last` to city 0. A one-city tour has no edges at all,
    /// whatever the matrix's diagonal says.
    #[inline(always)]
    pub fn close_cost(&self, last: usize) -> i64 {
        if self.n == 1 {
            0
        } else {
            self.d(last, 0)
        }
    }

    /// Length of the closed tour visiting `tour` in order and returning to its start.
    pub fn tour_length(&self, tour: &[usize]) -> i64 {
        if tour.len() <= 1 {
            return 0;
        }
        let inner: i64 = tour.windows(2).map(|w| self.d(w[0], w[1])).sum();
        inner + self.d(tour[tour.len() - 1], tour[0])
    }

    /// Whether `tour` visits every city exactly once, starting at city 0.
    pub fn is_tour(&self, tour: &[usize]) -> bool {
        let mut seen = vec![false; self.n];
        tour.len() == self.n
            && tour.first() == Some(&0)
            && tour
                .iter()
                .all(|&c| c < self.n && !std::mem::replace(&mut seen[c], true))
    }

    pub fn is_symmetric(&self) -> bool {
        (0..self.n).all(|i| (0..i).all(|j| self.d(i, j) == self.d(j, i)))
    }

    /// A fingerprint of the instance (size and off-diagonal weights), so nodes can check
    /// they all read the same one. Never 0.
    pub fn fingerprint(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |x: u64| {
            for b in x.to_le_bytes() {
                h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
            }
        };
        mix(self.n as u64);
        for i in 0..self.n {
            for j in 0..self.n {
                if i != j {
                    mix(self.d(i, j) as u64);
                }
            }
        }
        h | 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tour_length_and_validity() {
        let inst = Instance::new("t", 3, vec![0, 1, 2, 3, 0, 4, 5, 6, 0]);
        assert_eq!(inst.tour_length(&[0, 1, 2]), 1 + 4 + 5);
        assert_eq!(inst.tour_length(&[0, 2, 1]), 2 + 6 + 3);
        assert!(inst.is_tour(&[0, 2, 1]));
        assert!(!inst.is_tour(&[1, 2, 0]));
        assert!(!inst.is_tour(&[0, 1, 1]));
        assert!(!inst.is_tour(&[0, 1]));
        assert!(!inst.is_symmetric());
        let one = Instance::new("one", 1, vec![7]);
        assert_eq!(one.tour_length(&[0]), 0);
        assert_eq!(one.close_cost(0), 0);
        assert!(one.is_tour(&[0]));
    }
}
