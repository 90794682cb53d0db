//! Nodes on separate "hosts": each rank runs in its own network namespace, joined by veth
//! pairs through a bridge namespace, so the ranks reach each other only over those links
//! (not loopback), the way a job spread over machines does. Needs root and `ip`; without
//! them the test says so and checks nothing else.

use dsm_testkit::ip;
use std::process::Command;

const TEST: &str = env!("CARGO_BIN_EXE_dsm-test");
const SOR: &str = env!("CARGO_BIN_EXE_sor");
const WATER: &str = env!("CARGO_BIN_EXE_water");

/// Namespaces `<tag>-0..n` linked to a bridge in `<tag>-br`; removed on drop.
struct Hosts {
    tag: String,
    n: usize,
}

impl Hosts {
    fn new(n: usize) -> Option<Hosts> {
        // Tests of this file run in parallel in one process: each gets its own names.
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("dsm{}{made}", std::process::id() % 10_000);
        let h = Hosts { tag, n };
        let br = format!("{}-br", h.tag);
        if !ip(&["netns", "add", &br]) {
            return None;
        }
        let ok = ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])
            && ip(&["-n", &br, "link", "set", "br0", "up"]);
        if !ok {
            return None;
        }
        for k in 0..n {
            let ns = h.ns(k);
            let (a, b) = (format!("{}v{k}", h.tag), format!("{}p{k}", h.tag));
            let ok = ip(&["netns", "add", &ns])
                && ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])
                && ip(&["link", "set", &a, "netns", &ns])
                && ip(&["link", "set", &b, "netns", &br])
                && ip(&["-n", &br, "link", "set", &b, "master", "br0"])
                && ip(&["-n", &br, "link", "set", &b, "up"])
                && ip(&[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("10.77.0.{}/24", k + 1),
                    "dev",
                    &a,
                ])
                && ip(&["-n", &ns, "link", "set", &a, "up"])
                && ip(&["-n", &ns, "link", "set", "lo", "up"]);
            if !ok {
                return None;
            }
        }
        Some(h)
    }

    /// [`Hosts::new`], or a visible skip of `test` saying why there are none.
    fn or_skip(n: usize, test: &str) -> Option<Hosts> {
        let hosts = Hosts::new(n);
        if hosts.is_none() {
            dsm_testkit::skip(
                test,
                "cannot create network namespaces here (needs root and iproute2)",
            );
        }
        hosts
    }

    fn ns(&self, k: usize) -> String {
        format!("{}-{k}", self.tag)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for k in 0..self.n {
            ip(&["netns", "del", &self.ns(k)]);
        }
        ip(&["netns", "del", &format!("{}-br", self.tag)]);
    }
}

fn run_on_hosts(hosts: &Hosts, program: &str, args: &[&str]) -> Vec<std::process::Output> {
    run_on_hosts_with(hosts, program, args, &[])
}

/// [`run_on_hosts`] with `env` set for every rank.
fn run_on_hosts_with(
    hosts: &Hosts,
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Vec<std::process::Output> {
    run_ranks_per_host(hosts, 1, program, args, env)
}

/// `per_host` ranks on each host, ranks `k * per_host..` on host `k`, with `env` set for
/// every rank.
fn run_ranks_per_host(
    hosts: &Hosts,
    per_host: usize,
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Vec<std::process::Output> {
    let size = hosts.n * per_host;
    let children: Vec<_> = (0..size)
        .map(|k| {
            dsm_testkit::as_rank(
                Command::new("ip")
                    .args(["netns", "exec", &hosts.ns(k / per_host), program])
                    .args(args)
                    .envs(env.iter().copied()),
                k,
                size,
                "10.77.0.1:7707",
                "netns-job",
                20,
            )
            .spawn()
            .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

#[test]
fn ranks_in_separate_network_namespaces() {
    let Some(hosts) = Hosts::or_skip(3, "ranks_in_separate_network_namespaces") else {
        return;
    };
    for (program, args) in [
        (TEST, &["counter", "--iters", "30"][..]),
        (SOR, &["--size", "64", "--iters", "6"][..]),
    ] {
        let outs = run_on_hosts(&hosts, program, args);
        assert_verified(program, &outs);
    }
}

const KERNEL: &str = env!("CARGO_BIN_EXE_race-kernel");

/// Race detection in a job whose ranks are on separate hosts (each pair over TCP, each
/// rank its own copy of the pages): a race between hosts is reported by rank 0 with the
/// race exit status, and a lock-ordered program on the same hosts reports none.
#[test]
fn races_between_hosts_are_found() {
    let Some(hosts) = Hosts::or_skip(3, "races_between_hosts_are_found") else {
        return;
    };
    for (kernel, racy) in [("missing-barrier", true), ("locked-counter", false)] {
        let outs = run_on_hosts_with(&hosts, KERNEL, &["run", kernel], &[("DSM_RACE", "1")]);
        let err0 = String::from_utf8_lossy(&outs[0].stderr);
        let ctx = format!("{kernel} on three hosts:\n{err0}");
        for (k, o) in outs.iter().enumerate().skip(1) {
            assert!(o.status.success(), "rank {k} of {ctx}");
        }
        if racy {
            assert_eq!(outs[0].status.code(), Some(66), "{ctx}");
            assert!(err0.contains("DATA RACE (read-write) on data["), "{ctx}");
        } else {
            assert!(outs[0].status.success(), "{ctx}");
            assert!(err0.contains("dsm: 0 data races"), "{ctx}");
        }
    }
}

/// Every rank of `program` succeeded and rank 0 verified its result.
fn assert_verified(program: &str, outs: &[std::process::Output]) {
    for (k, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "rank {k} of {program}: {:?}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let out0 = String::from_utf8_lossy(&outs[0].stdout);
    assert!(out0.contains("verified:"), "{out0}");
}

/// Each rank's counters from a stats file written with `%r` in its path.
fn rank_stats(pattern: &std::path::Path, ranks: usize) -> Vec<serde_json::Value> {
    (0..ranks)
        .map(|r| {
            let path = pattern.to_string_lossy().replace("%r", &r.to_string());
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
        })
        .collect()
}

/// Two hosts of two ranks each with `DSM_HOST_MEMORY=1`: the ranks of a host map one
/// memory and the protocol runs between the hosts. SOR and Water verify; a SOR rank whose
/// neighbour is on its host fetches nothing; with `--race` one job finds a race between
/// the two ranks of a host, in their one memory, and races between hosts; and without the
/// variable each rank keeps its own copy.
#[test]
fn two_ranks_per_host_share_their_hosts_memory() {
    let Some(hosts) = Hosts::or_skip(2, "two_ranks_per_host_share_their_hosts_memory") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.%r");
    let stats_env = stats.to_str().unwrap();
    for (program, args) in [
        (SOR, &["--size", "256", "--iters", "6"][..]),
        (WATER, &["--molecules", "64", "--steps", "2"][..]),
    ] {
        let outs = run_ranks_per_host(
            &hosts,
            2,
            program,
            args,
            &[("DSM_STATS_FILE", stats_env), ("DSM_HOST_MEMORY", "1")],
        );
        assert_verified(program, &outs);
        let stats = rank_stats(&stats, 4);
        for (r, s) in stats.iter().enumerate() {
            let mate = r ^ 1;
            assert_eq!(
                s["common_memory"]["host_mates"],
                serde_json::json!([mate]),
                "rank {r}"
            );
            assert_eq!(s["common_memory"]["segment"], false, "rank {r}");
        }
        let counter = |r: usize, key: &str| stats[r]["protocol"][key].as_u64().unwrap();
        if program == SOR {
            // Rank 3's only neighbour is rank 2, on its host: it reads rank 2's boundary
            // rows in their one memory and takes no fault; rank 2's other neighbour,
            // rank 1, is on the other host: their boundary rows travel.
            assert_eq!(
                (counter(3, "read_faults"), counter(3, "pages_fetched")),
                (0, 0)
            );
            assert!(counter(2, "pages_fetched") > 0 && counter(1, "pages_fetched") > 0);
        }
    }
    let outs = run_ranks_per_host(
        &hosts,
        2,
        SOR,
        &["--size", "256", "--iters", "6"],
        &[("DSM_STATS_FILE", stats_env)],
    );
    assert!(
        outs.iter().all(|o| o.status.success()),
        "SOR without host memory"
    );
    for (r, s) in rank_stats(&stats, 4).iter().enumerate() {
        assert_eq!(
            s["common_memory"]["host_mates"],
            serde_json::json!([]),
            "rank {r}"
        );
        assert!(
            s["protocol"]["pages_fetched"].as_u64().unwrap() > 0,
            "rank {r} copies"
        );
    }
    let log = dir.path().join("races.jsonl");
    let outs = run_ranks_per_host(
        &hosts,
        2,
        KERNEL,
        &["run", "missing-barrier"],
        &[
            ("DSM_RACE", "1"),
            ("DSM_RACE_LOG", log.to_str().unwrap()),
            ("DSM_HOST_MEMORY", "1"),
        ],
    );
    let err0 = String::from_utf8_lossy(&outs[0].stderr);
    assert_eq!(outs[0].status.code(), Some(66), "{err0}");
    let pairs: std::collections::BTreeSet<(u64, u64)> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            let race: serde_json::Value = serde_json::from_str(l).unwrap();
            let rank = |side: &str| race[side]["rank"].as_u64().unwrap();
            (
                rank("first").min(rank("second")),
                rank("first").max(rank("second")),
            )
        })
        .collect();
    let same_host = |&(a, b): &(u64, u64)| a / 2 == b / 2;
    assert!(
        pairs.iter().any(same_host),
        "no race within a host: {pairs:?}\n{err0}"
    );
    assert!(
        pairs.iter().any(|p| !same_host(p)),
        "no race between hosts: {pairs:?}\n{err0}"
    );
}
