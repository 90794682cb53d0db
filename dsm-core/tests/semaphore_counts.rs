//! A semaphore may start with any `u32` count: initial tokens are a count, not one queue
//! entry each (`u32::MAX` of them asked for 32 GiB and aborted the rank). One single-node
//! `Dsm` per process.

#[test]
fn a_semaphore_starts_with_four_billion_tokens_in_little_memory() {
    std::env::remove_var("DSM_RANK");
    let mut dsm = dsm_core::Dsm::init().expect("single-node init");
    let big = dsm.semaphore("big", u32::MAX).expect("a semaphore");
    for _ in 0..3 {
        dsm.wait(&big).expect("an initial token");
    }
    // Initial tokens are taken before signals', and a signal's token after them.
    dsm.signal(&big).expect("signal");
    assert!(dsm.try_wait(&big).expect("try_wait"));
    let none = dsm.semaphore("none", 0).expect("an empty semaphore");
    assert!(!dsm.try_wait(&none).expect("try_wait on nothing"));
    dsm.signal(&none).expect("signal");
    assert!(dsm.try_wait(&none).expect("the signal's token"));
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    assert!(rss_kib < 512 * 1024, "peak RSS {rss_kib} KiB");
    dsm.finish().expect("finish");
}
