//! The protocol engine under hostile input: several engines run a legal program (collective
//! allocation, locked writes, reads, barriers) while the network between them corrupts
//! messages (their encoded bytes are flipped or truncated, as a broken or malicious peer
//! would send them) and peers are declared lost at random moments. Whatever arrives, an
//! engine must answer with messages or a fatal output, never panic: the comm thread turns a
//! fatal output into a clear message and an orderly exit, while a panic would take the
//! node down without one. Every engine lets the (simulated) SIGSEGV handler serve write
//! faults on write-protected pages, so hostile traffic also meets pages the handler holds.
//! Runs are seeded by proptest; `PROPTEST_CASES` runs more.

use dsm_core::engine::{Command, Engine, FastFaults, Output, Prot, Reply, VecMemory};
use dsm_proto::{Msg, NodeId, PageNo};
use proptest::prelude::*;
use std::collections::VecDeque;
use std::sync::Arc;

const PAGES: usize = 6;

#[derive(Clone, Copy, Debug)]
enum Step {
    Alloc,
    Acquire(u64),
    Release(u64),
    Write(usize),
    Read(usize),
    Barrier,
}

struct Node {
    eng: Engine<VecMemory>,
    script: VecDeque<Step>,
    /// Waiting for a reply or a fault resolution.
    waiting: bool,
    /// Stopped by a fatal output, a peer loss or a crash verdict.
    dead: bool,
}

struct Net {
    nodes: Vec<Node>,
    links: Vec<VecDeque<Msg>>,
    rng: u64,
    /// Out of 1000 deliveries, how many are corrupted.
    corrupt_per_mille: usize,
    /// Out of 10000 steps, how many declare a random peer lost.
    loss_per_10k: usize,
    fatal_outputs: usize,
    /// Corrupted messages that still decoded and were handed to an engine.
    corrupted_delivered: usize,
}

impl Net {
    fn rand(&mut self, m: usize) -> usize {
        self.rng = self
            .rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.rng >> 33) as usize) % m.max(1)
    }

    fn n(&self) -> usize {
        self.nodes.len()
    }

    fn outputs(&mut self, k: usize, outs: Vec<Output>) {
        for o in outs {
            match o {
                Output::Send { to, msg } => {
                    if !self.nodes[k].dead {
                        let n = self.n();
                        self.links[k * n + to as usize].push_back(msg);
                    }
                }
                // No lanes here: the runtime's fallback, a plain reply.
                Output::LaneReply { to, copy } => {
                    if !self.nodes[k].dead {
                        let n = self.n();
                        let msg = dsm_proto::Msg::PageReply { pages: vec![copy] };
                        self.links[k * n + to as usize].push_back(msg);
                    }
                }
                Output::Reply(Reply::AnalyzeEpoch { .. })
                | Output::Reply(Reply::BitmapsWanted { .. })
                | Output::Reply(Reply::BitmapsArrived { .. }) => {
                    // Race rounds are not run here; the node stops waiting for good.
                    self.nodes[k].dead = true;
                }
                Output::Reply(_) | Output::FaultResolved => self.nodes[k].waiting = false,
                Output::FaultCrash
                | Output::Fatal(_)
                | Output::PeerLost(_)
                | Output::Diverged(_) => {
                    self.fatal_outputs += 1;
                    self.nodes[k].dead = true;
                }
                // A (possibly corrupted, yet well-formed) race batch reached the master:
                // its app thread would analyse it; nothing to do here.
                Output::PageStates { .. } | Output::PagesShared { .. } | Output::RaceBatch(_) => {}
            }
        }
    }

    fn step_node(&mut self, k: usize) {
        let Some(&step) = self.nodes[k].script.front() else {
            return;
        };
        let n = self.n();
        let outs = match step {
            Step::Alloc => {
                let homes = (0..PAGES)
                    .map(|p| (p as PageNo, 1, (p * n / PAGES) as NodeId))
                    .collect();
                self.nodes[k].waiting = true;
                self.nodes[k].eng.on_command(Command::Alloc {
                    homes,
                    digest: 7,
                    race: None,
                    at: dsm_proto::SyncPoint::Allocation {
                        name: "pages".into(),
                        after: 0,
                    },
                })
            }
            Step::Acquire(lock) => {
                self.nodes[k].waiting = true;
                self.nodes[k]
                    .eng
                    .on_command(Command::Acquire { lock, race: None })
            }
            Step::Release(lock) => {
                self.nodes[k].waiting = true;
                self.nodes[k]
                    .eng
                    .on_command(Command::Release { lock, race: None })
            }
            Step::Barrier => {
                self.nodes[k].waiting = true;
                self.nodes[k].eng.on_command(Command::Barrier {
                    finishing: false,
                    race: None,
                    bitmaps: Vec::new(),
                    at: dsm_proto::SyncPoint::Barrier(1),
                })
            }
            Step::Write(page) | Step::Read(page) => {
                let write = matches!(step, Step::Write(_));
                if write && self.nodes[k].eng.memory().prot[page] == Prot::Read {
                    // The SIGSEGV handler's fast path, as the real handler would take it
                    // between two engine events (see `engine::fast`).
                    let fast = self.nodes[k].eng.fast_faults().cloned();
                    if let Some(fast) = fast {
                        let VecMemory { data, prot, .. } = self.nodes[k].eng.memory_mut();
                        let _ = fast.handler_write_fault(
                            page,
                            || {
                                prot[page] = Prot::ReadWrite;
                                true
                            },
                            |slot| {
                                let at = page * dsm_proto::PAGE_SIZE;
                                let bytes = &data[at..at + dsm_proto::PAGE_SIZE];
                                for (w, b) in slot.iter().zip(bytes.chunks_exact(8)) {
                                    w.store(
                                        u64::from_ne_bytes(b.try_into().unwrap()),
                                        std::sync::atomic::Ordering::Relaxed,
                                    );
                                }
                            },
                        );
                    }
                }
                let allowed = match self.nodes[k].eng.memory().prot[page] {
                    Prot::None => false,
                    Prot::Read => !write,
                    Prot::ReadWrite => true,
                };
                if allowed {
                    if write {
                        let at = page * dsm_proto::PAGE_SIZE + k * 8;
                        self.nodes[k].eng.memory_mut().data[at] ^= 1;
                    }
                    self.nodes[k].script.pop_front();
                    return;
                }
                self.nodes[k].waiting = true;
                let outs = self.nodes[k]
                    .eng
                    .on_fault(Some(page as PageNo), Some(write));
                // The access is retried after the fault is resolved.
                self.outputs(k, outs);
                return;
            }
        };
        self.nodes[k].script.pop_front();
        self.outputs(k, outs);
    }

    /// What a broken or hostile peer might put on the wire instead of `msg`.
    fn corrupt(&mut self, msg: &Msg) -> Option<Msg> {
        let mut bytes = dsm_net::encode(msg).expect("engine messages encode");
        match self.rand(3) {
            0 if !bytes.is_empty() => {
                let keep = self.rand(bytes.len());
                bytes.truncate(keep);
            }
            _ => {
                for _ in 0..=self.rand(3) {
                    if bytes.is_empty() {
                        break;
                    }
                    let at = self.rand(bytes.len());
                    bytes[at] ^= 1 << self.rand(8);
                }
            }
        }
        dsm_net::decode(&bytes).ok()
    }

    fn run(&mut self) {
        for _ in 0..200_000 {
            let n = self.n();
            if self.rand(10_000) < self.loss_per_10k {
                let (k, peer) = (self.rand(n), self.rand(n));
                if k != peer && !self.nodes[k].dead {
                    let outs = self.nodes[k]
                        .eng
                        .on_peer_lost(peer as NodeId, "injected peer loss");
                    self.outputs(k, outs);
                }
            }
            let runnable: Vec<usize> = (0..n)
                .filter(|&k| {
                    let node = &self.nodes[k];
                    !node.dead && !node.waiting && !node.script.is_empty()
                })
                .collect();
            let links: Vec<usize> = (0..self.links.len())
                .filter(|&i| !self.links[i].is_empty())
                .collect();
            if runnable.is_empty() && links.is_empty() {
                return;
            }
            let pick = self.rand(runnable.len() + links.len());
            if pick < runnable.len() {
                self.step_node(runnable[pick]);
                continue;
            }
            let li = links[pick - runnable.len()];
            let msg = self.links[li].pop_front().expect("non-empty link");
            let (from, to) = (li / n, li % n);
            if self.nodes[to].dead {
                continue;
            }
            let delivered = if self.rand(1000) < self.corrupt_per_mille {
                let bad = self.corrupt(&msg);
                self.corrupted_delivered += usize::from(bad.is_some());
                bad
            } else {
                Some(msg)
            };
            let outs = match delivered {
                Some(m) => self.nodes[to].eng.on_peer_message(from as NodeId, m),
                // The transport drops a connection whose frame does not decode.
                None => self.nodes[to]
                    .eng
                    .on_peer_lost(from as NodeId, "malformed message"),
            };
            self.outputs(to, outs);
        }
    }

    fn all_done(&self) -> bool {
        self.nodes
            .iter()
            .all(|n| !n.dead && !n.waiting && n.script.is_empty())
    }
}

fn net(n: usize, rounds: usize, race: bool, seed: u64, corrupt: usize, loss: usize) -> Net {
    let nodes = (0..n)
        .map(|k| {
            let mut script = VecDeque::from([Step::Alloc]);
            for r in 0..rounds {
                let lock = ((k + r) % 3) as u64;
                let page = (k * 7 + r * 3) % PAGES;
                script.extend([
                    Step::Acquire(lock),
                    Step::Write(page),
                    Step::Release(lock),
                    Step::Read((page + 1) % PAGES),
                    Step::Barrier,
                ]);
            }
            Node {
                eng: Engine::new(k as NodeId, n, PAGES, VecMemory::new(PAGES), race)
                    .with_fast_faults(Arc::new(FastFaults::new(PAGES, 64))),
                script,
                waiting: false,
                dead: false,
            }
        })
        .collect();
    Net {
        nodes,
        links: (0..n * n).map(|_| VecDeque::new()).collect(),
        rng: seed | 1,
        corrupt_per_mille: corrupt,
        loss_per_10k: loss,
        fatal_outputs: 0,
        corrupted_delivered: 0,
    }
}

/// The harness is only worth something if, left alone, the program completes.
#[test]
fn without_corruption_every_program_completes() {
    let mut handler_writes = 0;
    for seed in 0..50 {
        let mut net = net(3, 4, false, seed, 0, 0);
        net.run();
        assert!(net.all_done(), "seed {seed} did not complete");
        handler_writes += net
            .nodes
            .iter()
            .map(|node| node.eng.stats().handler_write_faults)
            .sum::<u64>();
    }
    assert!(handler_writes > 0, "the handler's fast path was taken");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, .. ProptestConfig::default() })]

    #[test]
    fn corrupted_messages_and_lost_peers_never_panic_an_engine(
        n in 2usize..5,
        rounds in 1usize..5,
        seed in any::<u64>(),
        corrupt in 0usize..300,
        loss in 0usize..20,
    ) {
        let mut net = net(n, rounds, false, seed, corrupt, loss);
        net.run();
        // Reaching here is the property; the counter shows the hostile paths were taken.
        let _ = net.fatal_outputs;
    }
}

/// Corrupted messages that still decode reach the engine's checks, and some runs end in a
/// fatal output: the hostile paths are really taken, not just survived by luck.
#[test]
fn hostile_paths_are_exercised() {
    let (mut delivered, mut fatal) = (0, 0);
    for seed in 0..200 {
        let mut net = net(3, 4, false, seed, 200, 5);
        net.run();
        delivered += net.corrupted_delivered;
        fatal += net.fatal_outputs;
    }
    assert!(
        delivered > 40,
        "only {delivered} corrupted messages decoded"
    );
    assert!(fatal > 10, "only {fatal} fatal outputs");
}
