//! Runtime of [distlock](https://docs.rs/distlock): Redis-backed distributed locks with
//! fencing tokens, compare-and-delete release and loss reporting.
//!
//! Idempotency records (run once per key, replay the stored result) live in
//! [`idempotency`]; with features `axum` / `actix` they serve web handlers.
//!
//! Use the `distlock` crate: it re-exports this one together with the attributes.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockcore::Error> {
//! use std::time::Duration;
//! let locks = lockcore::Locks::in_memory(); // Locks::connect("redis://...") in production
//! let guard = locks.lock("stock:7").ttl(Duration::from_secs(10)).acquire().await?;
//! assert_eq!(guard.fence(), 1);
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod backend;
mod client;
mod error;
pub mod idempotency;
mod integrations;
pub mod key;
mod local;
mod lock;
mod notify;
mod watchdog;

#[doc(hidden)]
pub mod __private;

pub use client::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_PREFIX, DEFAULT_YIELD_WINDOW, Locks, LocksBuilder,
};
pub use error::{BackendError, BackendErrorKind, Error, Result};
pub use idempotency::http::{IdemRequest, IdemResponse, MAX_KEY_LEN, RECORDED_METHODS};
pub use idempotency::record::{Captured, REPLAYED_HEADER};
pub use lock::{DEFAULT_TTL, LockGuard, LockInfo, LockRequest, current_lock};

/// Makes `locks` the client that attributes without `client = ...` use, replacing any
/// earlier one; returns the one it replaced.
///
/// Without it, the attributes connect lazily to `REDIS_URL`
/// (default `redis://127.0.0.1:6379/`).
///
/// ```
/// lockcore::install(lockcore::Locks::in_memory());
/// ```
pub fn install(locks: Locks) -> Option<Locks> {
    __private::install(locks)
}
