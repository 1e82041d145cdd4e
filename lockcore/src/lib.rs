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
//! let fence = guard.fence().await?; // assigned when asked for, above every earlier one
//! assert!(fence > 0);
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Layers
//!
//! Each module imports only from the modules listed before it:
//!
//! 1. `error`, `events`, `key`, `util`: errors, the [`Event`] type and its one emit
//!    point, key escaping, the clock and mutex helpers.
//! 2. `notify`: Pub/Sub wake-ups (a hub per tokio runtime; in-process channels for the
//!    in-memory backend).
//! 3. `backend`: where locks and records live (the scripts, standalone Redis over
//!    multiplexed and direct connections, process memory). The seam a new topology
//!    implements (`Locking`, `Records`, `Acknowledging`, one dispatch macro): see its
//!    module docs. Nothing above it names a topology.
//! 4. `contention`, `watchdog`, `local`: the one contention loop (subscribe, try once
//!    more, wait for a release or the deadline), lease renewal, and the per-client
//!    queues of local waiters.
//! 5. `client`: the [`Locks`] handle and its builder.
//! 6. `lock`, `fencing`: requests, guards and releases; writes the storage checks
//!    against fences.
//! 7. `idempotency`: records, fingerprints, fns and handlers.
//! 8. `integrations`: axum and actix-web.
//! 9. `__private`: what the attribute macros expand to (re-exports and entry points).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod error;
mod events;
pub mod key;
mod metrics;
mod util;

mod notify;

mod backend;

mod contention;
mod local;
mod watchdog;

mod client;

pub mod fencing;
mod lock;

pub mod idempotency;

mod integrations;

#[doc(hidden)]
pub mod __private;

pub use client::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FENCE_IDLE_WINDOW, DEFAULT_PREFIX,
    DEFAULT_YIELD_WINDOW, Locks, LocksBuilder,
};
pub use error::{BackendError, BackendErrorKind, Error, Result};
pub use events::Event;
pub use idempotency::http::{IdemRequest, IdemResponse, MAX_KEY_LEN, RECORDED_METHODS};
pub use idempotency::record::{Captured, REPLAYED_HEADER};
pub use lock::{
    DEFAULT_TTL, Holder, LockGuard, LockInfo, LockRequest, LockState, MultiLockGuard,
    MultiLockRequest, Share, current_lock,
};

/// Makes `locks` the client that attributes without `client = ...` use, replacing any
/// earlier one; returns the one it replaced.
///
/// Without it, the attributes connect lazily to `REDIS_URL`
/// (default `redis://127.0.0.1:6379/`; a Redis Cluster as
/// `redis+cluster://host1:7000,host2:7001`, see [`Locks::cluster`]; a `rediss://` or
/// `rediss+cluster://` URL needs the `tls` feature, which also reads `REDIS_TLS_CA_FILE`,
/// `REDIS_TLS_CERT_FILE` and `REDIS_TLS_KEY_FILE`, see `LocksBuilder::tls_from_env`).
///
/// ```
/// lockcore::install(lockcore::Locks::in_memory());
/// ```
pub fn install(locks: Locks) -> Option<Locks> {
    __private::install(locks)
}
