//! What a node reports about its run: the protocol counters ([`Stats`]) and, at finish,
//! the JSON summary written to `DSM_STATS_FILE` for the benchmark driver.

use super::Dsm;
use crate::engine::Stats;
use crate::error::DsmError;
use dsm_proto::PAGE_SIZE;

impl Dsm {
    /// Writes the run's counters where `DSM_STATS_FILE` says (`%r` becomes the rank).
    pub(super) fn write_stats_file(&self) -> Result<(), DsmError> {
        let Some(path) = &self.stats_file else {
            return Ok(());
        };
        let path = path.to_string_lossy().replace("%r", &self.rank.to_string());
        let stats = self.stats();
        std::fs::write(&path, self.stats_json(&stats).to_string()).map_err(|e| {
            DsmError::Io(std::io::Error::new(
                e.kind(),
                format!("cannot write DSM_STATS_FILE {path}: {e}"),
            ))
        })
    }

    /// Everything a benchmark wants to know about this node's run (`DSM_STATS_FILE`).
    fn stats_json(&self, stats: &Stats) -> serde_json::Value {
        let shared_bytes: usize = self.next_page * PAGE_SIZE;
        let race = self.race.as_ref().map(|r| {
            let rs = r.recorder.stats();
            let m = r.master();
            let m = m.as_deref();
            serde_json::json!({
                "phases": format!("{:?}", r.phases).to_lowercase(),
                "intervals_with_accesses": rs.intervals_with_accesses,
                "read_notices": rs.read_notices,
                "write_notices": rs.write_notices,
                "bitmaps_stored": rs.bitmaps_stored,
                "bitmaps_served": rs.bitmaps_served,
                "peak_store_bytes": rs.peak_store_bytes,
                "interval_close_ms": r.close_time.as_secs_f64() * 1e3,
                "interval_comparison_ms": r.plan_time.as_secs_f64() * 1e3,
                "bitmap_round_ms": r.bitmap_time.as_secs_f64() * 1e3,
                "analysis": r.sum,
                "analysis_notice_bytes": r.notice_bytes,
                "bitmaps_fetched_in_extra_round": r.fetched_late,
                // Rank 0 reports; the other ranks count nothing.
                "races_reported": m.map_or(0, |m| m.reporter.total()),
                "lock_order_dependences_reported": m.map_or(0, |m| m.reporter.lock_order_total()),
                "races_silenced": m.map_or(0, |m| m.reporter.silenced()),
                "check_findings_reported": m.map_or(0, |m| m.reporter.check_total()),
                "race_batches_absorbed": m.map_or(0, |m| m.incremental.batches),
                "peak_pending_intervals": m.map_or(0, |m| m.incremental.peak_pending),
                "incremental_analysis_ms": m.map_or(0.0, |m| m.time.as_secs_f64() * 1e3),
            })
        });
        let peak_rss_kib = super::proc_kib("/proc/self/status", "VmHWM");
        serde_json::json!({
            "rank": self.rank,
            "size": self.size,
            "wall_s": self.started.elapsed().as_secs_f64(),
            "peak_rss_kib": peak_rss_kib,
            "shared_bytes": shared_bytes,
            "allocations": self.allocs.iter().map(|a| a.name.clone()).collect::<Vec<_>>(),
            "protocol": stats,
            "waits": {
                "spin_budget_us": crate::spin::current().as_micros() as u64,
                "polled": crate::spin::waits().0,
                "slept": crate::spin::waits().1,
                "frames_followed": crate::spin::FRAMES_FOLLOWED.load(std::sync::atomic::Ordering::Relaxed),
                "sockets_caught": crate::spin::SOCKETS_CAUGHT.load(std::sync::atomic::Ordering::Relaxed),
            },
            "common_memory": {
                "segment": self.common_memory,
                "host_mates": self.host_mates,
                "host_lock_acquires": self.host_lock_acquires,
                "host_lock_acquires_left_interval_open": self.race.as_ref().map_or(0, |r| r.elided_acquires),
            },
            "race": race,
        })
    }
}
