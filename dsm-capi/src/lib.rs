//! dsm for C and C++ programs: the C API of `include/dsm.h` ([`api`]) and a runtime for
//! the ThreadSanitizer instrumentation ABI ([`tsan`]), in one library (`libdsm.a`,
//! `libdsm.so`).
//!
//! A C program compiled with `-fsanitize=thread -g` calls `__tsan_read4(addr)` and the
//! like before each load and store; linked against this library instead of libtsan, those
//! calls come here: accesses inside dsm's shared segment are recorded by dsm's race
//! recorder, with the instrumented instruction's address as their site, which rank 0
//! turns into `file:line:column` from the executable's debug information when it reports a
//! race. Coherence needs no instrumentation: the program's loads and stores take the same
//! page faults a Rust program's do. Without `--race` every access hook returns after one
//! compare of a static flag.
//!
//! # Unsafe code
//!
//! The workspace denies `unsafe_code`; this crate allows it in [`api`] and [`tsan`], because
//! a C API cannot be written without it: the functions are `#[no_mangle] extern "C"`,
//! they take C strings and hand out raw pointers into the shared segment, the hooks are
//! entered from assembly stubs that pass the caller's return address, and the atomic
//! hooks operate on addresses the compiler passes. Every `unsafe` block says why it is
//! sound. No panic crosses the FFI boundary: each API call runs under `catch_unwind` and
//! turns a panic into an error code.
//!
//! # Threads
//!
//! A dsm node is one process; its C program calls the API from the thread that called
//! `dsm_init`, and only that thread's accesses are recorded (other threads' hooks return
//! at once, as without `--race`).
#![warn(missing_docs)]

#[allow(unsafe_code)]
pub mod api;
#[allow(unsafe_code)]
pub mod tsan;
