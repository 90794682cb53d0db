//! Chaos mode (`dsmrun --chaos SEED`), after rr's: random but seeded delays around
//! synchronization, so that runs take lock orders a quiet machine rarely shows. Before
//! an acquire a node may pause (it asks later), while holding a lock it may pause (the
//! grant to the next node comes later), and before a barrier it may pause (it leaves
//! later relative to the others); the comm thread may pause before handling a lock
//! message (a request, forward or grant is handled later). The delays are drawn from a generator seeded by the
//! seed and the rank, so a seed names one perturbation; since timing also depends on the
//! machine, a seed does not fix the order: record a run (`--record`) to keep one.

use std::time::Duration;

/// The seeded generator and the delay policy.
pub(crate) struct Chaos {
    state: u64,
}

/// Longest pause, in microseconds; a lock hand-off over loopback takes tens.
const MAX_PAUSE_US: u64 = 2_000;

impl Chaos {
    pub(crate) fn new(seed: u64, rank: usize) -> Chaos {
        let mut c = Chaos {
            state: seed ^ (rank as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        };
        c.next();
        c
    }

    /// splitmix64.
    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Pauses with probability `percent`%, for up to `max_us` microseconds.
    fn maybe_pause(&mut self, percent: u64, max_us: u64) {
        let r = self.next();
        if r % 100 < percent {
            let us = (r >> 8) % (max_us + 1);
            std::thread::sleep(Duration::from_micros(us));
        }
    }

    pub(super) fn before_acquire(&mut self) {
        self.maybe_pause(50, MAX_PAUSE_US);
    }

    pub(super) fn while_holding(&mut self) {
        self.maybe_pause(25, MAX_PAUSE_US / 2);
    }

    pub(super) fn before_barrier(&mut self) {
        self.maybe_pause(50, MAX_PAUSE_US);
    }

    /// On the comm thread, before a lock request, forward or grant is handled.
    pub(crate) fn before_lock_message(&mut self) {
        self.maybe_pause(25, MAX_PAUSE_US / 4);
    }
}

#[cfg(test)]
mod tests {
    use super::Chaos;

    #[test]
    fn a_seed_names_one_sequence_per_rank() {
        let draw = |seed, rank| {
            let mut c = Chaos::new(seed, rank);
            (0..8).map(|_| c.next()).collect::<Vec<_>>()
        };
        assert_eq!(draw(17, 2), draw(17, 2));
        assert_ne!(draw(17, 2), draw(17, 3));
        assert_ne!(draw(17, 2), draw(18, 2));
    }
}
