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
    if case == "chained" {
        install_own_handler();
    }
    if case == "chained-twice" {
        install_guard_page_handler();
    }
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
        "chained" => {
            // Outside the segment: dsm must pass the fault to the handler installed
            // before it, which exits with status 42.
            let wild = std::hint::black_box(24usize) as *const u64;
            // SAFETY: deliberately invalid, as in "outside".
            let v = unsafe { std::ptr::read_volatile(wild) };
            println!("after crash: {v}");
        }
        "chained-twice" => {
            // A fault the earlier handler resolves (as a GC or JIT does with guard pages),
            // then a fault dsm must still serve: its handler stays installed.
            let own = OWN_PAGE.load(std::sync::atomic::Ordering::Relaxed) as *mut u64;
            // SAFETY: our own mapping; the first write faults and the earlier handler makes
            // the page writable before the write is retried.
            unsafe { std::ptr::write_volatile(own, 7) };
            let b = dsm.alloc::<u64>("y", 1024).unwrap();
            dsm.view(&b).set(1000, 5);
            // SAFETY: as above; the page is writable now.
            let own_value = unsafe { std::ptr::read_volatile(own) };
            println!("both served: {own_value} {}", dsm.view(&b).get(1000));
        }
        "in-engine" => {
            // Unallocated, so it faults; but this thread holds the engine lock, which the
            // fault handler must refuse loudly instead of waiting for the comm thread.
            let offset = 1000 * dsm_core::PAGE_SIZE;
            let v = dsm_core::read_segment_word_holding_the_engine(&dsm, offset);
            println!("after crash: {v:?}");
        }
        "kill" => {
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGSEGV).unwrap();
            println!("after crash");
        }
        other => panic!("unknown case {other}"),
    }
}

extern "C" fn own_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let msg = b"own handler called\n";
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is valid.
    unsafe {
        libc::write(1, msg.as_ptr().cast(), msg.len());
        libc::_exit(42);
    }
}

static OWN_PAGE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn guard_page_handler(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let page = OWN_PAGE.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: the kernel passes a valid siginfo; mprotect, write and _exit are
    // async-signal-safe.
    unsafe {
        let addr = (*info).si_addr() as usize;
        if addr >= page && addr < page + 4096 {
            libc::mprotect(
                page as *mut libc::c_void,
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
            );
            return;
        }
        let msg = b"guard handler got a fault that is not its own\n";
        libc::write(1, msg.as_ptr().cast(), msg.len());
        libc::_exit(43);
    }
}

/// A handler that owns one inaccessible page and makes it accessible when touched.
fn install_guard_page_handler() {
    // SAFETY: an anonymous mapping of our own and a zeroed sigaction for an
    // async-signal-safe handler.
    unsafe {
        let page = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(page, libc::MAP_FAILED);
        OWN_PAGE.store(page as usize, std::sync::atomic::Ordering::Relaxed);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = guard_page_handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut()), 0);
    }
}

#[test]
fn dsm_keeps_serving_after_chaining_a_fault() {
    let out = run_child("chained-twice");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}\n{stdout}", out.status);
    assert!(stdout.contains("both served: 7 5"), "{stdout}");
}

/// What a program (or a library such as a profiler or a JIT) does before dsm starts.
fn install_own_handler() {
    // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = own_handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut()), 0);
    }
}

#[test]
fn faults_outside_the_segment_reach_the_previous_handler() {
    let out = run_child("chained");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(42), "{:?}\n{stdout}", out.status);
    assert!(stdout.contains("before crash: 41"), "{stdout}");
    assert!(stdout.contains("own handler called"), "{stdout}");
    assert!(!stdout.contains("after crash"), "{stdout}");
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
fn a_fault_while_holding_the_engine_aborts_with_a_clear_message() {
    let out = run_child("in-engine");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "expected abort, got {:?}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    assert!(stdout.contains("before crash: 41"), "{stdout}");
    assert!(!stdout.contains("after crash"), "{stdout}");
    assert!(
        stderr.contains(
            "page fault on shared memory by a thread that holds the protocol engine's lock"
        ),
        "{stderr}"
    );
}

#[test]
fn sigsegv_from_kill_is_not_swallowed() {
    assert_segv("kill");
}
