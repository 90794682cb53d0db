//! `dsmrun-agent`, what dsmrun's launch agent (`ssh HOST`) starts on another host for each
//! rank: `dsmrun-agent -- PROGRAM [ARGS]...`. It reads the rank's configuration (secret
//! included) from stdin, never from its command line, and stops the rank when stdin
//! closes. Not meant to be run by hand; see `dsm_launch::agent`.

#![forbid(unsafe_code)]

use clap::Parser;
use std::ffi::OsString;
use std::process::ExitCode;

/// Runs one rank of a dsmrun job on this host. Started by dsmrun through its launch agent
/// (`ssh HOST`, ...); it reads the rank's job from stdin and is not meant to be run by
/// hand.
#[derive(Parser, Debug)]
#[command(name = "dsmrun-agent", version)]
struct Args {
    /// The rank's program and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        value_name = "PROGRAM [ARGS]"
    )]
    command: Vec<OsString>,
}

fn main() -> ExitCode {
    let mut command = Args::parse().command.into_iter();
    let program = command.next().expect("clap requires the program");
    let code = dsm_launch::agent::agent_main(program, command.collect());
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
