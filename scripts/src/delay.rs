//! The round-trip model: what an app would lose on a network whose one-way message delay
//! is D, from the waits each rank counted in its stats file. This machine's kernel cannot
//! add delay to a link (no netem), so the model is how the report plans for real networks.
//!
//! What it charges: every one-way message delay a rank sat waiting for costs D. A page
//! fetch is a round trip (2 delays); an acquire of a lock not held here is 2 delays when
//! its manager grants it or hands the request to the holder it is, 3 when the manager
//! forwards it to a third rank; a semaphore wait 0 to 3 in the same way; a barrier 1
//! all-to-all and 2 through the master. The runtime counts the delays of the last three
//! itself (`lock_acquire_delays`, `sem_wait_delays`, `barrier_delays`), since only it knows
//! who granted. The job's loss is the largest rank's total times D: the ranks meet at
//! barriers, so the slowest one sets the time. It ignores what can hide a delay (a rank
//! that waits for a held lock would have waited anyway, a prefetch to several homes waits
//! for their replies together) and what can add to it (one rank's delay passed on to the
//! ranks waiting for its lock), so it is a first-order estimate, checked against runs on
//! loopback and across network namespaces in `docs/measurements.md`.

use serde::{Deserialize, Serialize};

/// The one-way delays the report projects for, in microseconds: a fast cluster network,
/// a typical data-centre one, and a slow or virtualised one.
pub const DELAYS_US: [f64; 3] = [25.0, 100.0, 500.0];

/// What one rank waited for (its stats file's counters).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankWaits {
    pub rank: usize,
    /// Page requests sent (each a round trip).
    pub fetch_requests: u64,
    /// Acquires of locks whose token was elsewhere, and their one-way delays.
    pub remote_acquires: u64,
    pub lock_delays: u64,
    /// Semaphore waits (and try-waits) and their one-way delays.
    pub sem_waits: u64,
    pub sem_delays: u64,
    /// Barriers (allocations and `finish` included) and their one-way delays.
    pub barriers: u64,
    pub barrier_delays: u64,
}

impl RankWaits {
    /// One-way delays this rank waited for.
    pub fn delays(&self) -> u64 {
        2 * self.fetch_requests + self.lock_delays + self.sem_delays + self.barrier_delays
    }

    /// The same in round trips (a forwarded acquire is one and a half).
    pub fn round_trips(&self) -> f64 {
        self.delays() as f64 / 2.0
    }

    /// What the delays are made of, for the report and `dsm-bench-report round-trips`.
    pub fn breakdown(&self) -> String {
        format!(
            "{} fetches ({} delays), {} remote acquires ({}), {} semaphore waits ({}), {} barriers ({})",
            self.fetch_requests,
            2 * self.fetch_requests,
            self.remote_acquires,
            self.lock_delays,
            self.sem_waits,
            self.sem_delays,
            self.barriers,
            self.barrier_delays
        )
    }
}

/// The rank that waited for the most delays (the lowest rank on a tie).
pub fn critical_rank(ranks: &[RankWaits]) -> Option<&RankWaits> {
    ranks
        .iter()
        .max_by(|a, b| a.delays().cmp(&b.delays()).then(b.rank.cmp(&a.rank)))
}

/// Seconds the job would lose at one-way delay `d_us`: the critical rank's delays times D.
pub fn projected_loss_s(ranks: &[RankWaits], d_us: f64) -> Option<f64> {
    critical_rank(ranks).map(|r| r.delays() as f64 * d_us * 1e-6)
}

/// The difference the model predicts between two runs of the same job whose links have
/// one-way delays `d_us` and `base_us` (say across namespaces and on loopback), each half
/// of a measured round trip.
pub fn predicted_difference_s(ranks: &[RankWaits], d_us: f64, base_us: f64) -> Option<f64> {
    projected_loss_s(ranks, d_us - base_us)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: usize, fetches: u64, lock_delays: u64, barrier_delays: u64) -> RankWaits {
        RankWaits {
            rank,
            fetch_requests: fetches,
            lock_delays,
            barrier_delays,
            ..RankWaits::default()
        }
    }

    #[test]
    fn a_rank_is_charged_two_delays_per_fetch_and_its_counted_sync_delays() {
        // 10 fetches (20 delays), 3 acquires of 2 delays and one of 3 (9), 4 semaphore
        // waits of 2 (8), 5 barriers all-to-all (5): 42 delays, 21 round trips.
        let r = RankWaits {
            rank: 0,
            fetch_requests: 10,
            remote_acquires: 4,
            lock_delays: 9,
            sem_waits: 4,
            sem_delays: 8,
            barriers: 5,
            barrier_delays: 5,
        };
        assert_eq!(r.delays(), 42);
        assert_eq!(r.round_trips(), 21.0);
    }

    #[test]
    fn the_slowest_rank_sets_the_loss() {
        // Rank 0: 2*100 + 50 + 10 = 260 delays; rank 1: 2*10 + 300 + 10 = 330.
        let ranks = [rank(0, 100, 50, 10), rank(1, 10, 300, 10)];
        assert_eq!(critical_rank(&ranks).unwrap().rank, 1);
        // 330 delays x 100 us = 33 ms; x 25 us = 8.25 ms; x 500 us = 165 ms.
        let loss = |d| projected_loss_s(&ranks, d).unwrap();
        assert!((loss(100.0) - 0.033).abs() < 1e-12);
        assert!((loss(25.0) - 0.00825).abs() < 1e-12);
        assert!((loss(500.0) - 0.165).abs() < 1e-12);
    }

    #[test]
    fn ties_go_to_the_lowest_rank_and_no_ranks_no_loss() {
        let ranks = [rank(2, 5, 0, 0), rank(1, 0, 10, 0)];
        assert_eq!(critical_rank(&ranks).unwrap().rank, 1);
        assert_eq!(projected_loss_s(&[], 100.0), None);
    }

    #[test]
    fn the_check_charges_only_the_delay_the_two_links_differ_by() {
        // 1000 delays; across namespaces 40 us one way against 15 us on loopback:
        // 1000 x 25 us = 25 ms.
        let ranks = [rank(0, 400, 150, 50)];
        let d = predicted_difference_s(&ranks, 40.0, 15.0).unwrap();
        assert!((d - 0.025).abs() < 1e-12);
    }
}
