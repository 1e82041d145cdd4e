//! The integration tests on one topic each, as the modules of one test binary: each
//! binary links axum, actix-web and redis, so one binary instead of thirteen is most of
//! the suite's build time on a small machine. A module's own docs say what it covers.
//! Binaries of their own: the tests that run copies of their binary as separate processes
//! (`processes`, `cluster`, `chaos`, `idempotent_process`), those about process-wide state
//! (`default_client`, `drain`), the model checker, and the checks of the harness, the
//! crate's layers and the compile errors. Run one module with a filter: `cargo test --test suite -- redlock::`.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;
#[path = "../common/http.rs"]
mod http;

mod behaviour;
mod cluster_faults;
mod family_faults;
mod fencing;
mod hardening;
mod hardening_locks;
mod idempotent_examples;
mod idempotent_fns;
mod idempotent_http;
mod inspect;
mod jobs;
mod kinds;
mod multilocks;
mod proxy;
mod redlock;
mod replicas;
mod rwlocks;
mod semaphores;
mod sentinel;
mod spans;
mod tls;
mod waiting;
