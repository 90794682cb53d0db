//! `race-kernel`: runs one labelled race kernel (see `race-kernel list`). Run it under
//! `dsmrun -n N --race` to see what the detector reports for a program whose answer is
//! known.

use anyhow::{bail, Context};
use apps::kernels::{self, Expect};
use clap::{Parser, Subcommand};
use dsm_core::Dsm;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "race-kernel",
    version,
    about = "Labelled race/no-race kernels for the detector"
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Lists the kernels with their expected outcome.
    List,
    /// Runs one kernel (under `dsmrun -n N --race`).
    Run { name: String },
    /// Ranks 0 and 1 hand a value back and forth ROUNDS times through two semaphores,
    /// each checking it sees the other's last write; exits non-zero on the first miss.
    Pingpong {
        /// Hand-offs in each direction.
        #[arg(default_value_t = 1000)]
        rounds: u64,
    },
}

fn main() -> ExitCode {
    apps::main_with(run)
}

fn run() -> anyhow::Result<ExitCode> {
    apps::init_logging();
    match Args::parse().cmd {
        Cmd::List => {
            for k in kernels::all() {
                let expect = match (k.expect)(4) {
                    Expect::NoRace => "no race".to_string(),
                    Expect::Races(v) => format!(
                        "races on {}",
                        v.iter()
                            .map(|(name, _)| *name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                println!("{:<28} {:<22} {}", k.name, expect, k.about);
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run { name } => {
            let all = kernels::all();
            let Some(k) = all.iter().find(|k| k.name == name) else {
                apps::usage_error::<Args>(format!(
                    "no kernel named {name:?}; `race-kernel list` shows them"
                ));
            };
            // A job too small for the kernel is a usage error, found before it forms.
            let config = Dsm::job_config().context("reading the DSM job")?;
            if config.size < k.min_nodes {
                apps::usage_error::<Args>(format!(
                    "kernel {} needs at least {} nodes, not {}",
                    k.name, k.min_nodes, config.size
                ));
            }
            let mut dsm = Dsm::init_with(config).context("joining the DSM job")?;
            (k.run)(&mut dsm).with_context(|| format!("kernel {}", k.name))?;
            if dsm.rank() == 0 {
                println!("kernel {} done on {} nodes", k.name, dsm.size());
            }
            Ok(dsm.finish()?.exit_code())
        }
        Cmd::Pingpong { rounds } => {
            let mut dsm = Dsm::init().context("joining the DSM job")?;
            if dsm.size() < 2 {
                bail!("pingpong needs at least 2 nodes");
            }
            let t = std::time::Instant::now();
            kernels::sem_pingpong(&mut dsm, rounds).context("pingpong")?;
            if dsm.rank() == 0 {
                println!(
                    "pingpong: {rounds} round trips, every value seen, {:.1} us per hand-off",
                    t.elapsed().as_secs_f64() * 1e6 / (2 * rounds) as f64
                );
            }
            Ok(dsm.finish()?.exit_code())
        }
    }
}
