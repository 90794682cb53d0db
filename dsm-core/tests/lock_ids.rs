//! Lock ids of 2^63 and above belong to named locks: taking one by number, or naming one
//! in a hint of the locks taken next, is an error that says so (as `dsm_lock` and
//! `dsm_prefetch_locks` return `DSM_EINVAL` in C). One single-node `Dsm` per process, so
//! the cases run in one test.

#[test]
fn reserved_lock_ids_are_refused_by_locks_and_hints() {
    // Without dsmrun a program is a single node.
    std::env::remove_var("DSM_RANK");
    let mut dsm = dsm_core::Dsm::init().expect("single-node init");
    let reserved = 1u64 << 63;
    let refused = |e: dsm_core::DsmError| {
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("lock id {reserved} is reserved for named locks")),
            "{msg}"
        );
    };
    refused(dsm.lock(reserved).err().expect("a reserved id is refused"));
    refused(
        dsm.prefetch_locks([1, reserved, 2])
            .expect_err("a hint naming a reserved id is refused"),
    );
    dsm.prefetch_locks([1, 2, 3]).expect("ordinary ids");
    dsm.prefetch_locks([]).expect("an empty hint");
    // The hinted locks are taken as usual.
    for id in [1, 2, 3] {
        dsm.lock(id).expect("hinted lock").unlock().expect("unlock");
    }
    dsm.finish().expect("finish");
}
