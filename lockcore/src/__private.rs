//! What the attribute macros expand to. Not a public API: it may change in any release.

use std::future::Future;

use std::sync::{Arc, RwLock};
use std::time::Duration;
use tracing::Instrument as _;

pub use crate::backend::scripts;
pub use crate::idempotency::private::*;
pub use crate::key::{KeyArg, KeyBuf};
use crate::{Error, Locks};

/// Redis URL used when no client was installed and `REDIS_URL` is not set.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/";

static DEFAULT: RwLock<Option<Locks>> = RwLock::new(None);

/// Replaces the process-wide client; see `distlock::install`.
pub fn install(locks: Locks) -> Option<Locks> {
    DEFAULT
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .replace(locks)
}

/// The installed client, else one made (once) from `REDIS_URL` (with the `tls` feature,
/// and the certificates of `LocksBuilder::tls_from_env`);
/// it connects on first use.
pub fn default_locks() -> Result<Locks, Error> {
    if let Some(locks) = DEFAULT.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return Ok(locks.clone());
    }
    let mut slot = DEFAULT.write().unwrap_or_else(|e| e.into_inner());
    if let Some(locks) = slot.as_ref() {
        return Ok(locks.clone());
    }
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| DEFAULT_REDIS_URL.to_owned());
    let builder = Locks::builder(url);
    #[cfg(feature = "tls")]
    let builder = builder.tls_from_env()?;
    let locks = builder.build()?;
    *slot = Some(locks.clone());
    Ok(locks)
}

/// What `client = <expr>` may evaluate to.
#[diagnostic::on_unimplemented(
    message = "`client = ...` must be a `distlock::Locks`, `&Locks` or `Arc<Locks>`, found `{Self}`",
    label = "not a `distlock::Locks`",
    note = "build one with `distlock::Locks::connect(url)` or `Locks::builder(url).build()`"
)]
pub trait AsLocks {
    /// The client.
    fn as_locks(&self) -> &Locks;
}

impl AsLocks for Locks {
    fn as_locks(&self) -> &Locks {
        self
    }
}

impl AsLocks for Arc<Locks> {
    fn as_locks(&self) -> &Locks {
        self
    }
}

impl<T: AsLocks + ?Sized> AsLocks for &T {
    fn as_locks(&self) -> &Locks {
        (**self).as_locks()
    }
}

/// The client given with `client = <expr>`, owned.
pub fn client_of<T: AsLocks + ?Sized>(client: &T) -> Result<Locks, Error> {
    Ok(client.as_locks().clone())
}

/// Settings fixed at compile time.
#[derive(Debug, Clone, Copy)]
pub struct LockSpec {
    /// Lease in milliseconds.
    pub ttl_ms: u64,
    /// Wait in milliseconds.
    pub wait_ms: u64,
    /// Keep the lease while the body runs.
    pub renew: bool,
    /// With `renew`: stop renewing after this long (0: never).
    pub max_hold_ms: u64,
    /// Keep the lock at least this long after it was taken (0: release at once).
    pub min_hold_ms: u64,
    /// With `renew`: cancel the body as soon as the lock is found lost.
    pub cancel_on_lost: bool,
    /// Replicas that must acknowledge; `None`: the client's default.
    pub replicas: Option<u32>,
    /// What is taken.
    pub kind: LockKind,
    /// The key's template as written (`"stock:<sku>"`; a multi-lock's, joined by `, `):
    /// the metrics' label and a span field.
    pub template: &'static str,
}

/// What `#[distributed_lock]` takes.
#[derive(Debug, Clone, Copy)]
pub enum LockKind {
    /// A lock (`key = ..` alone).
    Lock,
    /// One of a semaphore's permits (`permits = n`).
    Permits(u32),
    /// A share of a read lock (`mode = "read"`).
    Read,
    /// A write lock (`mode = "write"`).
    Write,
}

/// The return type of an annotated function: `Result<T, E>` with `E: From<Error>`.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` functions must return `Result<T, E>` where `E: From<distlock::Error>`, found `{Self}`",
    label = "expected `Result<T, E>` with `E: From<distlock::Error>`",
    note = "the lock reports `Busy`, `Lost` and `Backend` failures through the function's error type `E`, so `E` must implement `From<distlock::Error>`"
)]
pub trait LockOutput {
    /// A lock failure as this return value.
    fn from_lock_error(error: Error) -> Self;
    /// Whether the body succeeded.
    fn is_ok(&self) -> bool;
}

impl<T, E: From<Error>> LockOutput for Result<T, E> {
    fn from_lock_error(error: Error) -> Self {
        Err(error.into())
    }

    fn is_ok(&self) -> bool {
        Result::is_ok(self)
    }
}

/// The request `spec` describes for `key`, before its kind: ttl, wait, lease keeping,
/// `min_hold` and replicas set.
fn configured<'a>(request: crate::LockRequest<'a>, spec: &LockSpec) -> crate::LockRequest<'a> {
    let mut request = request
        .ttl(Duration::from_millis(spec.ttl_ms))
        .wait(Duration::from_millis(spec.wait_ms))
        .renew(spec.renew)
        .template(spec.template);
    if spec.max_hold_ms > 0 {
        request = request.max_hold(Duration::from_millis(spec.max_hold_ms));
    }
    if spec.min_hold_ms > 0 {
        request = request.min_hold(Duration::from_millis(spec.min_hold_ms));
    }
    if let Some(replicas) = spec.replicas {
        request = request.replicas(replicas);
    }
    request
}

/// What `run_held` needs of a guard: a lock's, or a multi-lock's.
trait Held: Sized {
    /// The key (or keys) for errors and logs.
    fn named(&self) -> String;
    /// The fence given while it was held, if any.
    fn fence(&self) -> Option<u64>;
    async fn scope<F: Future>(&self, fut: F) -> F::Output;
    async fn lost(&self);
    async fn release(self) -> Result<(), Error>;
}

impl Held for crate::LockGuard {
    fn named(&self) -> String {
        self.key().to_owned()
    }
    fn fence(&self) -> Option<u64> {
        self.fence_given()
    }
    async fn scope<F: Future>(&self, fut: F) -> F::Output {
        crate::LockGuard::scope(self, fut).await
    }
    async fn lost(&self) {
        crate::LockGuard::lost(self).await
    }
    async fn release(self) -> Result<(), Error> {
        crate::LockGuard::release(self).await
    }
}

impl Held for crate::MultiLockGuard {
    fn named(&self) -> String {
        self.keys().join(", ")
    }
    fn fence(&self) -> Option<u64> {
        None
    }
    async fn scope<F: Future>(&self, fut: F) -> F::Output {
        crate::MultiLockGuard::scope(self, fut).await
    }
    async fn lost(&self) {
        crate::MultiLockGuard::lost(self).await
    }
    async fn release(self) -> Result<(), Error> {
        crate::MultiLockGuard::release(self).await
    }
}

/// Runs `body` with `guard`'s locks visible to `current_lock()`, then releases them:
/// with `renew` and `on_lost = "cancel"`, a loss found while it runs drops the body at
/// its next await point.
async fn run_held<R, F, G>(
    acquired: Result<G, Error>,
    started: std::time::Instant,
    spec: &LockSpec,
    body: F,
) -> R
where
    R: LockOutput,
    F: Future<Output = R>,
    G: Held,
{
    // The annotated call's span (see `call_span`), current here; its times are taken
    // only when a subscriber wants it.
    let span = tracing::Span::current();
    let traced = !span.is_disabled();
    if traced {
        span.record("distlock.waited_ms", started.elapsed().as_secs_f64() * 1e3);
    }
    let guard = match acquired {
        Ok(guard) => guard,
        Err(e) => {
            let outcome = match e {
                Error::Busy { .. } => "busy",
                _ => "error",
            };
            span.record("distlock.outcome", outcome);
            return R::from_lock_error(e);
        }
    };
    let held = traced.then(std::time::Instant::now);
    let finish = |guard: &G, outcome: &'static str| {
        if let Some(held) = held {
            span.record("distlock.held_ms", held.elapsed().as_secs_f64() * 1e3);
            if let Some(fence) = guard.fence() {
                span.record("distlock.fence", fence);
            }
            span.record("distlock.outcome", outcome);
        }
    };
    let out = if spec.renew && spec.cancel_on_lost {
        tokio::select! {
            biased;
            out = guard.scope(body) => out,
            () = guard.lost() => {
                let key = guard.named();
                tracing::warn!(target: "distlock", key, "lock lost while held: the body was cancelled");
                finish(&guard, "lost");
                let _ = guard.release().await;
                return R::from_lock_error(Error::Lost { key });
            }
        }
    } else {
        guard.scope(body).await
    };
    finish(&guard, "released");
    match guard.release().await {
        Ok(()) => out,
        Err(e) => {
            let outcome = match e {
                Error::Lost { .. } => "lost",
                _ => "release_failed",
            };
            span.record("distlock.outcome", outcome);
            if out.is_ok() {
                return R::from_lock_error(e);
            }
            tracing::warn!(target: "distlock", error = %e, "the body failed and its lock was not held to the end");
            out
        }
    }
}

/// The span of one annotated call (OpenTelemetry's conventions: `otel.kind`, and the
/// outcome and times once known); the arguments are never recorded, the key is (its
/// text made only when a subscriber wants the span).
fn call_span(prefix: &str, keys: &[&str], spec: &LockSpec) -> tracing::Span {
    struct Keys<'a>(&'a str, &'a [&'a str]);
    impl std::fmt::Display for Keys<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            for (i, key) in self.1.iter().enumerate() {
                let sep = if i == 0 { "" } else { ", " };
                write!(f, "{sep}{}{key}", self.0)?;
            }
            Ok(())
        }
    }
    tracing::info_span!(
        target: "distlock",
        "distlock.lock",
        otel.name = "distlock.lock",
        otel.kind = "internal",
        distlock.key.template = spec.template,
        distlock.key = %Keys(prefix, keys),
        distlock.fence = tracing::field::Empty,
        distlock.outcome = tracing::field::Empty,
        distlock.waited_ms = tracing::field::Empty,
        distlock.held_ms = tracing::field::Empty,
    )
}

/// [`run_locked`] for `keys = [..]`: every lock, or none, through `Locks::multi_lock`.
pub fn run_multi_locked<R, F>(
    client: Result<Locks, Error>,
    keys: Vec<String>,
    spec: LockSpec,
    body: F,
) -> impl Future<Output = R>
where
    R: LockOutput,
    F: Future<Output = R>,
{
    let span = match &client {
        Ok(locks) => {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            call_span(locks.prefix(), &keys, &spec)
        }
        Err(_) => tracing::Span::none(),
    };
    multi_locked(client, keys, spec, body).instrument(span)
}

async fn multi_locked<R, F>(
    client: Result<Locks, Error>,
    keys: Vec<String>,
    spec: LockSpec,
    body: F,
) -> R
where
    R: LockOutput,
    F: Future<Output = R>,
{
    let locks = match client {
        Ok(locks) => locks,
        Err(e) => return R::from_lock_error(e),
    };
    let started = std::time::Instant::now();
    let request = configured(locks.lock(String::new()), &spec);
    let acquired = crate::MultiLockRequest::like(request, keys).acquire().await;
    run_held(acquired, started, &spec, body).await
}

/// Acquire, run `body` with the lock visible to `current_lock()`, always release.
///
/// A loss found at release replaces an `Ok` with `Err(Lost)`; an `Err` from the body is
/// kept (the loss is logged). Panics and cancellation release through the guard's `Drop`.
pub fn run_locked<R, F>(
    client: Result<Locks, Error>,
    key: String,
    spec: LockSpec,
    body: F,
) -> impl Future<Output = R>
where
    R: LockOutput,
    F: Future<Output = R>,
{
    // The span wraps the call from outside: one layer, where an `async` block inside
    // would be two (deep futures overflow the compiler's trait solving in handlers).
    let span = match &client {
        Ok(locks) => call_span(locks.prefix(), &[&key], &spec),
        Err(_) => tracing::Span::none(),
    };
    locked(client, key, spec, body).instrument(span)
}

async fn locked<R, F>(client: Result<Locks, Error>, key: String, spec: LockSpec, body: F) -> R
where
    R: LockOutput,
    F: Future<Output = R>,
{
    let locks = match client {
        Ok(locks) => locks,
        Err(e) => return R::from_lock_error(e),
    };
    let request = match spec.kind {
        LockKind::Lock => locks.lock(key),
        LockKind::Permits(permits) => locks.semaphore(key, permits),
        LockKind::Read => locks.read_lock(key),
        LockKind::Write => locks.write_lock(key),
    };
    let started = std::time::Instant::now();
    let acquired = configured(request, &spec).acquire().await;
    run_held(acquired, started, &spec, body).await
}
