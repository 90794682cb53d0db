//! Write faults served inside the SIGSEGV handler, with real page faults and real ranks over
//! loopback: SOR writes its own boundary rows after serving them (home pages, handler
//! write notices), Water updates molecules homed elsewhere under locks after reading them
//! (handler twins). Results
//! must match the sequential reference and the counters must show which path served the
//! faults, with the fast path on (the default) and off (`DSM_FAST_FAULTS=0`).
//!
//! (FFT's transposes take no write faults at all: its bulk copies prefetch their pages
//! writable in one request per home.)

use std::path::Path;

const SOR: &str = env!("CARGO_BIN_EXE_sor");
const WATER: &str = env!("CARGO_BIN_EXE_water");

/// `(write_faults, handler_write_faults, twins_made)` summed over the ranks.
fn fault_counters(stats: &Path, n: usize) -> (u64, u64, u64) {
    let get = |k: &str| dsm_testkit::counter_sum(stats, n, "protocol", k);
    (
        get("write_faults"),
        get("handler_write_faults"),
        get("twins_made"),
    )
}

fn run(program: &str, args: &[&str], fast: Option<&str>, stats: &Path) -> (u64, u64, u64) {
    dsm_testkit::dsmrun_with_stats(2, program, args, ("DSM_FAST_FAULTS", fast), stats)
        .assert_verified(&format!("{program} {args:?} (DSM_FAST_FAULTS={fast:?})"));
    fault_counters(stats, 2)
}

#[test]
fn sor_home_write_faults_are_served_in_the_handler() {
    let args = ["--size", "256", "--iters", "20"];
    let on = tempfile::tempdir().unwrap();
    let (writes, handler, _) = run(SOR, &args, None, on.path());
    assert!(writes > 0, "SOR re-writes served boundary pages");
    assert_eq!(
        handler, writes,
        "every write fault of SOR is on a valid page, so the handler serves all of them"
    );
    let off = tempfile::tempdir().unwrap();
    let (writes_off, handler_off, _) = run(SOR, &args, Some("0"), off.path());
    assert_eq!(
        handler_off, 0,
        "DSM_FAST_FAULTS=0 sends every fault to the comm thread"
    );
    assert!(writes_off > 0);
}

#[test]
fn water_twins_are_made_in_the_handler() {
    let args: [&str; 0] = [];
    let on = tempfile::tempdir().unwrap();
    let (writes, handler, twins) = run(WATER, &args, Some("1"), on.path());
    assert!(
        twins > 0 && writes > 0,
        "Water writes pages homed elsewhere"
    );
    assert!(
        handler > 0,
        "the handler made twins ({handler} of {writes} write faults)"
    );
    let off = tempfile::tempdir().unwrap();
    let (_, handler_off, twins_off) = run(WATER, &args, Some("0"), off.path());
    assert_eq!(handler_off, 0);
    assert!(twins_off > 0);
}

#[test]
fn a_bad_fast_faults_setting_is_a_clear_error() {
    let stats = tempfile::tempdir().unwrap();
    let out = dsm_testkit::dsmrun_with_stats(
        2,
        SOR,
        &["--size", "64"],
        ("DSM_FAST_FAULTS", Some("yes")),
        stats.path(),
    );
    assert_ne!(out.code, Some(0), "{out:?}");
    // dsmrun reads job-wide settings as a rank will and refuses before starting any.
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        out.all_output()
            .contains("DSM_FAST_FAULTS=\"yes\" is not valid"),
        "{out:?}"
    );
}

/// Sums counter `key` of the `protocol` section over ranks `0..n`.
fn protocol_sum(stats: &Path, n: usize, key: &str) -> u64 {
    dsm_testkit::counter_sum(stats, n, "protocol", key)
}

/// Over TCP the faulting thread writes the page request to the home's socket itself
/// (`handler_fetches`), and takes the reply out of the socket itself
/// (`socket_pages`) unless the comm thread's reader takes it in first and resolves
/// the fault: SOR (boundary rows) and Water (molecules under locks) verify at 2 and 3
/// ranks, also with race detection, and nothing is asked or taken that way with
/// `DSM_FAST_FAULTS=0`.
#[test]
fn a_faulting_thread_asks_a_remote_home_over_its_socket() {
    let sor: &[&str] = &["--size", "256", "--iters", "10"];
    let water: &[&str] = &[];
    let mut taken_in_all = 0;
    for (program, args, n, fast, race) in [
        (SOR, sor, 2, true, false),
        (SOR, sor, 3, true, false),
        (SOR, sor, 2, false, false),
        (SOR, sor, 2, true, true),
        (WATER, water, 3, true, false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let flags: &[&str] = if race { &["--race"] } else { &[] };
        let mut cmd = dsm_testkit::dsmrun_command(n, flags, program, args);
        // Pushes off: every invalidated page is fetched on a fault.
        cmd.env("DSM_TRANSPORT", "tcp")
            .env("DSM_SPIN", "200")
            .env("DSM_PUSH", "off")
            .env("DSM_FAST_FAULTS", if fast { "1" } else { "0" })
            .env("DSM_STATS_FILE", dir.path().join("rank-%r.json"));
        let what = format!("{program} at N={n} over TCP, fast faults {fast}, race {race}");
        dsm_testkit::run(cmd).assert_verified(&what);
        let asked = protocol_sum(dir.path(), n, "handler_fetches");
        let requests = protocol_sum(dir.path(), n, "fetch_requests");
        let taken = protocol_sum(dir.path(), n, "socket_pages");
        eprintln!(
            "{what}: {asked} of {requests} page requests written by the handler, {taken} \
             replies taken out of the socket by it"
        );
        assert!(asked <= requests, "{what}");
        assert!(
            taken <= asked,
            "{what}: a reply taken for a request never written"
        );
        taken_in_all += taken;
        assert_eq!(
            protocol_sum(dir.path(), n, "lane_pages"),
            0,
            "{what}: no lanes over TCP"
        );
        if fast {
            assert!(
                asked > 0,
                "{what}: the handler never asked a home itself ({requests} requests)"
            );
        } else {
            assert_eq!(asked, 0, "{what}: asking needs the handler's paths");
        }
    }
    // Whether the handler or the reader gets a given reply first is the scheduler's call
    // (the reader waits 100 us for a handler that polls), so this holds over all runs.
    assert!(
        taken_in_all > 0,
        "no handler took a reply out of its socket"
    );
}
