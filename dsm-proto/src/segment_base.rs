//! Agreeing on the shared segment's address across hosts. Every rank maps the segment at
//! the same address, and on another host that address may already hold a library, the heap
//! or a launcher's shared memory. So before mapping, each rank checks which candidate
//! bases it could map ([`SegmentProbe`]), rank 0 collects the probes over the freshly
//! built mesh and decides ([`choose`]): the first candidate free on every rank, or a stop
//! that names the rank, its host, the address and the way out ([`SegmentChoice`]). A base
//! the user chose (`--segment-base`, `DSM_SEGMENT_ADDR`) is the only candidate: dsm never
//! moves it behind the user's back. The same exchange decides whether the ranks map one common
//! segment file (every rank on one host, see [`SegmentProbe::common_memory`]) or one file per
//! host (see [`SegmentProbe::host_memory`]). Pure
//! decision logic; the exchange is dsm-net's and the probing dsm-core's.

use serde::{Deserialize, Serialize};

/// Candidate bases when the user chose none, in order of preference: the default first,
/// then ranges far from where Linux puts the heap, libraries and stacks. Each leaves room
/// for the largest segment (16 TiB) below the 128 TiB user address space limit.
pub const CANDIDATE_BASES: [u64; 5] = [
    0x3d00_0000_0000,
    0x2d00_0000_0000,
    0x4d00_0000_0000,
    0x1d00_0000_0000,
    0x5d00_0000_0000,
];

/// One rank's answer: which candidate bases it could map the segment at.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SegmentProbe {
    /// The rank's host name, for messages.
    pub host: String,
    /// The segment length in bytes every rank must use.
    pub len: u64,
    /// The candidates, in order, each with `None` if free here or why not.
    pub bases: Vec<(u64, Option<String>)>,
    /// Whether this rank could map the job's common segment: it holds rank 0's segment
    /// file, shares memory with every other rank, and its configuration allows it
    /// (`DSM_TRANSPORT=auto`, race detection off).
    pub common_memory: bool,
    /// Whether this rank could take its locks in a common segment: nothing of its
    /// configuration orders the protocol's lock grants (recording, replay, chaos).
    pub host_locks: bool,
    /// Whether this rank could map its host's memory file (it holds one and its
    /// configuration allows, as for `common_memory`), shared with `shm_peers`.
    pub host_memory: bool,
    /// The ranks this one shares memory with (its co-located peers).
    pub shm_peers: Vec<u32>,
}

/// Rank 0's decision, sent to every rank.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum SegmentChoice {
    /// Map the segment here.
    Use {
        /// The base address.
        base: u64,
        /// When the first candidate was not free everywhere: which rank and host could
        /// not take it and why (for a note).
        moved_because: Option<String>,
        /// Every rank maps rank 0's segment file: one memory for the whole job, no page
        /// ever travels (every probe said it could).
        common_memory: bool,
        /// With `common_memory`: every rank takes its locks in that memory (every probe
        /// said it could), so no lock is taken both ways.
        host_locks: bool,
        /// Without `common_memory`: the ranks of each host map its lowest rank's file, and
        /// the page protocol runs between hosts only (every probe said it could, the
        /// ranks sharing memory fall into hosts, and some host has two of them).
        host_memory: bool,
    },
    /// The job cannot start: the reason names the rank, host, address and the way out.
    Stop {
        /// The message every rank prints.
        reason: String,
    },
}

/// Rank 0's decision from every rank's probe (`probes[r]` is rank `r`'s). `explicit`: the
/// user chose the base, so it is not moved.
pub fn choose(probes: &[SegmentProbe], explicit: bool) -> SegmentChoice {
    let Some(first) = probes.first() else {
        return SegmentChoice::Stop {
            reason: "no segment probes".into(),
        };
    };
    let way_out = "choose a range free on every host with dsmrun --segment-base ADDR \
                   (DSM_SEGMENT_ADDR), or use a smaller segment (dsmrun --segment)";
    for (rank, p) in probes.iter().enumerate() {
        let bases: Vec<u64> = p.bases.iter().map(|b| b.0).collect();
        let first_bases: Vec<u64> = first.bases.iter().map(|b| b.0).collect();
        if p.len != first.len || bases != first_bases {
            return SegmentChoice::Stop {
                reason: format!(
                    "ranks disagree on the shared segment: rank 0 (host {}) wants {} bytes at \
                     {}, rank {rank} (host {}) {} bytes at {}; set the same DSM_SEGMENT and \
                     DSM_SEGMENT_ADDR for every rank (dsmrun does)",
                    first.host,
                    first.len,
                    hex_list(&first_bases),
                    p.host,
                    p.len,
                    hex_list(&bases)
                ),
            };
        }
    }
    let blocked = |i: usize| {
        probes
            .iter()
            .enumerate()
            .find_map(|(rank, p)| p.bases[i].1.as_ref().map(|why| (rank, &p.host, why)))
    };
    let first_problem = blocked(0).map(|(rank, host, why)| {
        format!(
            "rank {rank} (host {host}) cannot map the {} MiB shared segment at {:#x}: {why}",
            first.len >> 20,
            first.bases[0].0
        )
    });
    let common_memory = probes.len() > 1 && probes.iter().all(|p| p.common_memory);
    let host_locks = common_memory && probes.iter().all(|p| p.host_locks);
    let host_memory = !common_memory && ranks_fall_into_hosts(probes);
    let Some(problem) = first_problem else {
        return SegmentChoice::Use {
            base: first.bases[0].0,
            moved_because: None,
            common_memory,
            host_locks,
            host_memory,
        };
    };
    if explicit {
        return SegmentChoice::Stop {
            reason: format!("{problem}; {way_out}"),
        };
    }
    match (1..first.bases.len()).find(|&i| blocked(i).is_none()) {
        Some(i) => SegmentChoice::Use {
            base: first.bases[i].0,
            moved_because: Some(problem),
            common_memory,
            host_locks,
            host_memory,
        },
        None => SegmentChoice::Stop {
            reason: format!(
                "{problem}, and none of the other candidate bases ({}) is free on every host; \
                 {way_out}",
                hex_list(&first.bases[1..].iter().map(|b| b.0).collect::<Vec<_>>())
            ),
        },
    }
}

/// Whether one memory per host works: every rank can map its host's file, the ranks
/// sharing memory with each other fall into disjoint groups (each rank shares with
/// exactly the rest of its group, so a group's ranks all hold its lowest rank's file),
/// and some group has two ranks or more.
fn ranks_fall_into_hosts(probes: &[SegmentProbe]) -> bool {
    let group = |r: usize| -> Option<Vec<u32>> {
        let mut g = probes.get(r)?.shm_peers.clone();
        g.push(r as u32);
        g.sort_unstable();
        g.dedup();
        Some(g)
    };
    probes.iter().all(|p| p.host_memory)
        && probes.iter().any(|p| !p.shm_peers.is_empty())
        && (0..probes.len()).all(|r| {
            let mine = group(r);
            probes[r]
                .shm_peers
                .iter()
                .all(|&peer| group(peer as usize).is_some() && group(peer as usize) == mine)
        })
}

fn hex_list(bases: &[u64]) -> String {
    bases
        .iter()
        .map(|b| format!("{b:#x}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(host: &str, taken: &[usize]) -> SegmentProbe {
        SegmentProbe {
            host: host.into(),
            len: 1 << 30,
            bases: CANDIDATE_BASES
                .iter()
                .enumerate()
                .map(|(i, &b)| (b, taken.contains(&i).then(|| "File exists".to_string())))
                .collect(),
            common_memory: true,
            host_locks: true,
            host_memory: true,
            shm_peers: Vec::new(),
        }
    }

    /// Probes of ranks on hosts `hosts[r]`, none of which can map a common segment.
    fn on_hosts(hosts: &[usize]) -> Vec<SegmentProbe> {
        (0..hosts.len())
            .map(|r| SegmentProbe {
                common_memory: false,
                shm_peers: (0..hosts.len())
                    .filter(|&p| p != r && hosts[p] == hosts[r])
                    .map(|p| p as u32)
                    .collect(),
                ..probe(&format!("h{}", hosts[r]), &[])
            })
            .collect()
    }

    fn host_memory(c: &SegmentChoice) -> bool {
        matches!(
            c,
            SegmentChoice::Use {
                host_memory: true,
                ..
            }
        )
    }

    #[test]
    fn ranks_sharing_memory_by_hosts_map_one_memory_per_host() {
        assert!(host_memory(&choose(&on_hosts(&[0, 0, 1, 1]), false)));
        assert!(host_memory(&choose(&on_hosts(&[0, 1, 0, 2]), false)));
        // Nobody shares: each rank its own memory.
        assert!(!host_memory(&choose(&on_hosts(&[0, 1, 2]), false)));
        // One rank that cannot map its host's file keeps every rank on its own copy.
        let mut probes = on_hosts(&[0, 0, 1, 1]);
        probes[3].host_memory = false;
        assert!(!host_memory(&choose(&probes, false)));
        // Sharing that does not fall into hosts (0-1 and 1-2 but not 0-2): none.
        let mut probes = on_hosts(&[0, 0, 0]);
        probes[0].shm_peers = vec![1];
        probes[2].shm_peers = vec![1];
        assert!(!host_memory(&choose(&probes, false)));
        // A peer the job does not have: none.
        let mut probes = on_hosts(&[0, 0]);
        probes[0].shm_peers = vec![1, 7];
        assert!(!host_memory(&choose(&probes, false)));
        // Every rank on one host is one common segment, not host memory.
        let c = choose(&[probe("a", &[]), probe("a", &[])], false);
        assert!(!host_memory(&c), "{c:?}");
    }

    #[test]
    fn the_default_wins_when_free_everywhere() {
        let c = choose(&[probe("a", &[]), probe("b", &[2])], false);
        assert_eq!(
            c,
            SegmentChoice::Use {
                base: CANDIDATE_BASES[0],
                moved_because: None,
                common_memory: true,
                host_locks: true,
                host_memory: false,
            }
        );
    }

    #[test]
    fn one_memory_only_when_every_rank_can_map_it() {
        let mut b = probe("b", &[]);
        b.common_memory = false;
        let c = choose(&[probe("a", &[]), b, probe("c", &[])], false);
        assert!(
            matches!(
                c,
                SegmentChoice::Use {
                    common_memory: false,
                    ..
                }
            ),
            "{c:?}"
        );
        // One rank that records (or replays) keeps every rank's locks in the protocol.
        let mut b = probe("b", &[]);
        b.host_locks = false;
        let c = choose(&[probe("a", &[]), b], false);
        assert!(
            matches!(
                c,
                SegmentChoice::Use {
                    common_memory: true,
                    host_locks: false,
                    ..
                }
            ),
            "{c:?}"
        );
        // A single rank has nobody to share with: its segment stays its own.
        let c = choose(&[probe("a", &[])], false);
        assert!(
            matches!(
                c,
                SegmentChoice::Use {
                    common_memory: false,
                    ..
                }
            ),
            "{c:?}"
        );
    }

    #[test]
    fn a_clash_moves_to_the_first_base_free_everywhere() {
        let c = choose(
            &[probe("a", &[1]), probe("b", &[0]), probe("c", &[])],
            false,
        );
        match c {
            SegmentChoice::Use {
                base,
                moved_because: Some(why),
                ..
            } => {
                assert_eq!(base, CANDIDATE_BASES[2]);
                assert!(why.contains("rank 1 (host b)") && why.contains("0x3d0000000000"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_common_base_or_an_explicit_one_stops_naming_the_way_out() {
        let c = choose(&[probe("a", &[0, 1, 2]), probe("b", &[3, 4])], false);
        let SegmentChoice::Stop { reason } = c else {
            panic!("{c:?}")
        };
        assert!(reason.contains("rank 0 (host a)") && reason.contains("--segment-base"));
        let mut one = probe("b", &[0]);
        one.bases.truncate(1);
        let mut zero = probe("a", &[]);
        zero.bases.truncate(1);
        let c = choose(&[zero, one], true);
        let SegmentChoice::Stop { reason } = c else {
            panic!("{c:?}")
        };
        assert!(reason.contains("rank 1 (host b)") && reason.contains("0x3d0000000000"));
    }

    #[test]
    fn ranks_that_disagree_are_stopped() {
        let mut b = probe("b", &[]);
        b.len = 1 << 20;
        let SegmentChoice::Stop { reason } = choose(&[probe("a", &[]), b], false) else {
            panic!()
        };
        assert!(reason.contains("disagree"), "{reason}");
    }
}
