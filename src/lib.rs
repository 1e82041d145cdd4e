//! Distributed locks for async Rust, one attribute away.
//!
//! ```no_run
//! use distlock::distributed_lock;
//!
//! #[derive(Debug)]
//! enum AppError {
//!     Lock(distlock::Error),
//! }
//! impl From<distlock::Error> for AppError {
//!     fn from(e: distlock::Error) -> Self {
//!         AppError::Lock(e)
//!     }
//! }
//!
//! /// Runs alone across every process that shares the Redis at `REDIS_URL`.
//! #[distributed_lock(key = "stock:<sku>", ttl = "10s", wait = "3s")]
//! async fn deduct(sku: u64, n: u32) -> Result<u32, AppError> {
//!     // read stock, write stock - no other holder of `lock:stock:<sku>` runs meanwhile
//!     Ok(n)
//! }
//! ```
//!
//! - The lock lives at Redis key `lock:stock:7` (prefix `lock:` plus the template), holding a
//!   plain UTF-8 token `uuid:host:pid`. A fencing counter at `{lock:stock:7}:fence` grows
//!   with every acquisition; read it inside the body with [`current_lock`].
//! - `ttl` is the lease (default 30 s), `wait` how long to keep trying when the lock is
//!   held (default zero: one try, then [`Error::Busy`]).
//! - Every exit releases: return, `?`, panic and a dropped future. A release that finds
//!   the lock expired or taken turns an `Ok` into `Err(Error::Lost)`.
//! - Without `client = ...`, the attribute uses the client given to [`install`], or one
//!   connected lazily to `REDIS_URL` (default `redis://127.0.0.1:6379/`).
//!
//! The same logic without the attribute is [`Locks::lock`].
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub use lockcore::{
    BackendError, BackendErrorKind, DEFAULT_COMMAND_TIMEOUT, DEFAULT_PREFIX, DEFAULT_TTL, Error,
    LockGuard, LockInfo, LockRequest, Locks, LocksBuilder, Result, current_lock, install, key,
};

/// Runs an `async fn` alone across every process that shares one Redis.
///
/// ```no_run
/// # #[derive(Debug)] struct AppError;
/// # impl From<distlock::Error> for AppError { fn from(_: distlock::Error) -> Self { AppError } }
/// #[distlock::distributed_lock(key = "order:<id>", ttl = "30s", wait = "3s")]
/// async fn ship(id: u64) -> Result<(), AppError> {
///     Ok(())
/// }
/// ```
///
/// expands to about what you would write by hand:
///
/// ```no_run
/// # #[derive(Debug)] struct AppError;
/// # impl From<distlock::Error> for AppError { fn from(_: distlock::Error) -> Self { AppError } }
/// # use std::time::Duration;
/// async fn ship(id: u64) -> Result<(), AppError> {
///     let key = format!("order:{id}"); // placeholders are escaped, see below
///     let locks = distlock::__private::default_locks()?;
///     let guard = locks
///         .lock(key)
///         .ttl(Duration::from_secs(30))
///         .wait(Duration::from_secs(3))
///         .acquire()
///         .await?; // Err(Busy) without running the body
///     let out: Result<(), AppError> = guard.scope(async move { Ok(()) }).await;
///     match guard.release().await {
///         Ok(()) => out,
///         Err(lost) if out.is_ok() => Err(lost.into()),
///         Err(_) => out, // the body's own error wins; the loss is logged
///     }
/// }
/// ```
///
/// # Arguments
///
/// | argument | default | meaning |
/// |---|---|---|
/// | `key = "order:<id>"` | required | the lock name; `<binding>` or `<binding.field>` interpolates a parameter |
/// | `ttl = "30s"` | `30s` | lease: how long the lock stays if never released |
/// | `wait = "3s"` | none | how long to keep trying while someone else holds it |
/// | `renew = true` | `false` | keep the lease while the body runs (renewed every `ttl / 3`) |
/// | `max_hold = "5m"` | none | with `renew`: stop renewing after this long |
/// | `on_lost = "continue"` | `"cancel"` | with `renew`: when a renewal finds the lock lost, cancel the body at its next await (`"cancel"`) or let it finish (`"continue"`); either way the call returns `Lost` |
/// | `client = expr` | installed / `REDIS_URL` | a `Locks`, `&Locks` or `Arc<Locks>` to use instead |
/// | `crate = "path"` | `::distlock` | where the `distlock` crate is, if renamed |
///
/// Durations are whole numbers with units `ms`, `s`, `m`, `h`, `d`, combinable (`1m30s`).
///
/// # Keys
///
/// A placeholder names any binding the parameter patterns introduce, including
/// destructured ones (`Path(id): Path<u64>`, `Json(order): Json<Order>`) and `self`; field
/// paths (`<order.customer.id>`, `<path.0>` for actix's `path: web::Path<(u32, u32)>`,
/// whose field is private and cannot be destructured) work. The value is formatted with `Display` and escaped so it
/// cannot change the key's shape: `%`, `:`, `{`, `}`, whitespace and control characters
/// become `%XX` (see [`key`]). Literal `{...}` in the template is a Redis Cluster hash tag.
///
/// # Errors
///
/// The function must return `Result<T, E>` (or an alias) with `E: From<distlock::Error>`.
/// `Busy`: not acquired within `wait`, the body did not run. `Lost`: the body returned
/// `Ok` but the lock had expired or been taken before release. `Backend`: Redis failed
/// within the command timeout.
///
/// # Waiting, fairness, reentrancy
///
/// Waiters are woken by a message published in the release script (one Pub/Sub
/// connection per client), with a fallback retry at most 100 ms apart. Tasks of one
/// process queue for a key in FIFO order; only the head contends in Redis. A nested call
/// on a key the task already holds through the same client runs without a round trip,
/// and only the outermost exit releases. See [`Locks::lock`].
///
/// Mistakes are compile errors: an unknown placeholder (with the available bindings),
/// a malformed template, a bad or zero duration, a missing `key`, an unknown or repeated
/// argument, a non-async fn, a return type that is not a suitable `Result`, and a
/// placeholder whose type is not `Display`.
pub use lockmacro::distributed_lock;

#[doc(hidden)]
pub mod __private {
    pub use lockcore::__private::*;
}
