//! An out-of-bounds access through a view panics at the caller's line, not inside dsm:
//! the message a user reads points at their code. One single-node `Dsm` per process, so
//! the cases run in one test, each under `catch_unwind`.

use std::panic::{self, AssertUnwindSafe};
use std::sync::Mutex;

/// Where the last panic happened and what it said.
static LAST_PANIC: Mutex<Option<(String, u32, String)>> = Mutex::new(None);

/// Runs `f`, which must panic, and returns the panic's file, line and message.
fn panic_site<R>(f: impl FnOnce() -> R) -> (String, u32, String) {
    *LAST_PANIC.lock().unwrap() = None;
    let outcome = panic::catch_unwind(AssertUnwindSafe(f));
    assert!(outcome.is_err(), "the access did not panic");
    LAST_PANIC
        .lock()
        .unwrap()
        .take()
        .expect("the hook saw the panic")
}

#[test]
fn out_of_bounds_accesses_panic_at_the_callers_line() {
    panic::set_hook(Box::new(|info| {
        let loc = info.location().expect("panics carry a location");
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        *LAST_PANIC.lock().unwrap() = Some((loc.file().to_string(), loc.line(), msg));
    }));
    // Without dsmrun a program is a single node.
    std::env::remove_var("DSM_RANK");
    let mut dsm = dsm_core::Dsm::init().expect("single-node init");
    let a = dsm.alloc::<u64>("a", 8).unwrap();
    let grid = dsm.alloc_2d::<f64>("grid", 4, 4).unwrap();
    let v = dsm.view(&a);
    let g = dsm.view(&grid);
    // A 1-D array is one row of `len` columns to both the array and its view.
    assert_eq!((a.rows(), a.cols()), (1, 8));
    assert_eq!((v.cols(), g.cols(), grid.cols()), (8, 4, 4));
    // In this file (rustfmt may put the call and `line!()` on different lines, so the
    // line is only checked to be one of this test's).
    let here = |line: u32, (file, at, msg): (String, u32, String), what: &str| {
        assert!(
            file.ends_with("view_panics.rs") && at.abs_diff(line) <= 3,
            "{what}: panicked at {file}:{at} ({msg}), not in the caller near line {line}"
        );
        assert!(msg.contains("out of bounds"), "{what}: {msg}");
    };
    here(line!(), panic_site(|| v.get(8)), "View::get");
    here(line!(), panic_site(|| v.set(9, 1)), "View::set");
    here(
        line!(),
        panic_site(|| v.strided(0, 2, 5).len()),
        "View::strided",
    );
    here(line!(), panic_site(|| g.get2(4, 0)), "View::get2");
    let s = v.strided(0, 2, 4);
    here(line!(), panic_site(|| s.get(4)), "Strided::get");
    let w = v.strided_mut(1, 2, 4);
    here(line!(), panic_site(|| w.set(4, 0)), "StridedMut::set");
    let _ = panic::take_hook();
    dsm.finish().expect("finish");
}
