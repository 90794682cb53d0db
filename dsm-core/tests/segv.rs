//! A genuine segmentation fault must still crash the program with SIGSEGV when dsm's
//! handler is installed: a wild access outside the segment, an access inside the segment
//! but outside every allocation, and a SIGSEGV sent with kill(2). Each case runs in a
//! child process (this test binary re-executed), because the crash is the point.
//!
//! The wild access outside the segment needs a raw pointer dereference; that `unsafe` is
//! confined to this test, which exists to prove such bugs are not swallowed.
#![allow(unsafe_code)]

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

fn run_child(case: &str) -> std::process::Output {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env("DSM_SEGV_CASE", case)
        .env_remove("DSM_RANK")
        .output()
        .unwrap()
}

/// Entry point of the child processes (a no-op in the normal test run).
#[test]
fn child_entry() {
    let Ok(case) = std::env::var("DSM_SEGV_CASE") else {
        return;
    };
    let mut dsm = dsm_core::Dsm::init().expect("single-node init");
    let a = dsm.alloc::<u64>("x", 8).unwrap();
    dsm.view(&a).set(0, 41);
    println!("before crash: {}", dsm.view(&a).get(0));
    match case.as_str() {
        "outside" => {
            let wild = std::hint::black_box(24usize) as *const u64;
            // SAFETY: deliberately invalid: this child exists to crash on it.
            let v = unsafe { std::ptr::read_volatile(wild) };
            println!("after crash: {v}");
        }
        "unallocated" => {
            // Inside the segment, far past the only allocation.
            let seg_page = 1000;
            let addr = dsm_core::DEFAULT_SEGMENT_ADDR + seg_page * dsm_core::PAGE_SIZE;
            // SAFETY: deliberately unallocated (no access rights): this child exists to
            // crash on it, and dsm must pass the fault on instead of serving it.
            let v = unsafe { std::ptr::read_volatile(addr as *const u64) };
            println!("after crash: {v}");
        }
        "kill" => {
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGSEGV).unwrap();
            println!("after crash");
        }
        other => panic!("unknown case {other}"),
    }
}

fn assert_segv(case: &str) {
    let out = run_child(case);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "case {case}: expected death by SIGSEGV, got {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("before crash: 41"), "{stdout}");
    assert!(!stdout.contains("after crash"), "{stdout}");
}

#[test]
fn wild_access_outside_the_segment_crashes() {
    assert_segv("outside");
}

#[test]
fn access_to_unallocated_segment_memory_crashes() {
    assert_segv("unallocated");
}

#[test]
fn sigsegv_from_kill_is_not_swallowed() {
    assert_segv("kill");
}
