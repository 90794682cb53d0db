//! The segment base agreement at start-up: every rank checks which candidate bases it can
//! map the shared segment at, and rank 0 picks one free on every rank, or stops the job
//! naming the rank, its host, the address and the way out. A clash is injected with
//! `DSM_TEST_OCCUPY_BASE=R` (rank R maps a page at the default base first, as a library
//! or another program's shared memory might on another host).

use dsm_testkit as kit;

fn sor_with(occupy: Option<&str>, flags: &[&str]) -> kit::Run {
    let mut cmd = kit::dsmrun_command(3, flags, "sor", &["--size", "128", "--iters", "4"]);
    cmd.env_remove("DSM_SEGMENT_ADDR");
    if let Some(rank) = occupy {
        cmd.env("DSM_TEST_OCCUPY_BASE", rank);
    }
    kit::run(cmd)
}

#[test]
fn a_base_taken_on_one_rank_moves_the_job_to_one_free_everywhere() {
    let r = sor_with(Some("1"), &["--timeout", "60"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.contains("[0] verified: sor 128x128"), "{r:?}");
    assert!(
        r.stderr.contains("rank 1 (host ")
            && r.stderr
                .contains("cannot map the 1024 MiB shared segment at 0x3d0000000000")
            && r.stderr.contains("at 0x2d0000000000 instead"),
        "{r:?}"
    );
}

#[test]
fn a_chosen_base_taken_on_one_rank_stops_the_job_naming_it() {
    let r = sor_with(
        Some("2"),
        &["--timeout", "60", "--segment-base", "0x3d0000000000"],
    );
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(
        r.stderr.contains("rank 2 (host ")
            && r.stderr
                .contains("at 0x3d0000000000: something is already mapped")
            && r.stderr.contains("--segment-base ADDR"),
        "{r:?}"
    );
    assert!(!r.stdout.contains("verified"), "{r:?}");
}

#[test]
fn a_chosen_free_base_is_used_and_bad_ones_are_usage_errors() {
    let r = sor_with(
        None,
        &["--timeout", "60", "--segment-base", "0x2e0000000000"],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.contains("[0] verified"), "{r:?}");
    for bad in ["0x123", "zz", "0x900000000000"] {
        let r = sor_with(None, &["--segment-base", bad]);
        assert_eq!(r.code, Some(2), "{bad}: {r:?}");
        assert!(r.stderr.contains("--segment-base"), "{bad}: {r:?}");
    }
}
