//! `dsmrun-agent`, what dsmrun's launch agent (`ssh HOST`) starts on another host for each
//! rank: `dsmrun-agent -- PROGRAM [ARGS]...`. It reads the rank's configuration (secret
//! included) from stdin, never from its command line, and stops the rank when stdin
//! closes. Not meant to be run by hand; see `dsm_launch::agent`.

#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let first = args.next();
    let program = match first {
        Some(sep) if sep == "--" => args.next(),
        other => other,
    };
    let Some(program) = program else {
        eprintln!(
            "usage: dsmrun-agent -- PROGRAM [ARGS]...\n\
             (started by dsmrun on other hosts; it reads the job from stdin)"
        );
        return ExitCode::from(2);
    };
    let code = dsm_launch::agent::agent_main(program, args.collect());
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
