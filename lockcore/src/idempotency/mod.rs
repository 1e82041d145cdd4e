//! Idempotency: run a body once per key, and answer every repeat with the stored result.
//!
//! The state machine lives in Redis, one plain UTF-8 value per key:
//!
//! `{"status":"in_progress","owner":..,"fp":..,"lease_until_ms":..,"claimed_at_ms":..,"retention_ms":..}`
//! while the body runs; the store then appends `{"status":"completed","fp":..,"completed_at_ms":..,"value":..}`
//! (a fn's `Ok` value) or `..,"response":{"status":..,"headers":[[name,value],..],"body":..}`
//! (a handler's response; `"body_base64"` when it is not UTF-8). The first completed
//! record in the value (from its first `{"status":"completed"`) is the result that
//! repeats get; readable with `redis-cli GET`.
//!
//! ```text
//!              claim (no record)                     complete (append the result)
//!   (none) ───────────────────────▶ in_progress ─────────────────────────────────▶ completed
//!      ▲                              │   ▲  │                                      (kept `ttl`)
//!      └──── release (owner matches) ─┘   │  └─ lease ended: the next claim takes it over
//!            on Err / 5xx / panic / drop  └──── renew (owner matches) every lease / 3
//! ```
//!
//! A claim is one plain `SET key record NX GET PX lifetime` (lifetime = lease +
//! retention): the key was free (claimed), or it returns the record there, and a
//! completed one is decided from it (a replay costs that one command). A claim in
//! progress goes on in a Lua script, as do release and renew: each checks the claimer's
//! owner token; nothing is GET-then-SET. The store is one `MULTI` of plain commands
//! (`SET ... NX PX` for a key gone meanwhile, `APPEND`, and a `GETRANGE` showing whether
//! the claim's own record was in front; `idem_settle.lua` decides when it was not): a
//! result is never written over another, so the first stored result stays
//! the one repeats get, and a result stored by a claimer whose lease had ended (taken
//! over meanwhile) is kept when it comes first; the call that took over is then told
//! [`Error::Lost`] by its renewal or its store. The lease is the key's remaining ttl
//! minus the retention, by Redis's clock (`lease_until_ms` in the record says the same
//! for readers). A claim that finds a completed record with the
//! same payload fingerprint replays it; with another fingerprint it is
//! [`Error::PayloadMismatch`]; a live in-progress record is [`Error::InProgress`], or with
//! `wait` the caller waits (woken by a `PUBLISH` on `<record>:done` from the release
//! script, or from `idem_settle.lua` after the store, sent when a waiting repeat marked
//! the record; with a capped fallback
//! retry) until the first call finishes.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument as _;
use tracing::instrument::WithSubscriber as _;

use crate::backend::Locking;
use crate::backend::idem::{ClaimArgs, Claimed, Owner, Records, Renewal};
use crate::backend::replicas::{Acked, Acknowledging, StoreArgs};
use crate::client::Locks;
use crate::contention::{Contention, Next, in_flight};
use crate::error::{BackendError, Error};
use crate::events::Event;
use crate::key;

pub mod fingerprint;
pub(crate) mod fns;
pub(crate) mod http;
pub(crate) mod record;
mod recording;
pub(crate) mod show;

pub use fingerprint::Fingerprint;
pub(crate) use fns::{IdemFn, IdemSpec};
pub use show::{IdemRecord, RecordState};

/// Default lease of a claim: how long a crashed claimer blocks its key.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default retention of a completed record.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
/// Default cap on a stored response body.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// Longest sleep between claim tries while waiting: covers a missed message.
const CLAIM_RETRY_CAP: Duration = Duration::from_millis(250);

/// `<prefix>idem:<module::fn>[:<scope>]:<key>`; `scope` and `key` arrive escaped.
pub(crate) fn record_key(prefix: &str, function: &str, scope: Option<&str>, key: &str) -> String {
    match scope {
        Some(scope) => format!("{prefix}{}{function}:{scope}:{key}", key::RECORDS),
        None => format!("{prefix}{}{function}:{key}", key::RECORDS),
    }
}

/// The channel the complete and release scripts publish on (same hash slot as the record).
pub(crate) fn done_channel(record: &str) -> String {
    key::companion(record, ":done")
}

/// Detached idempotent work of this process still running: calls, stores and give-backs
/// spawned in tasks of their own (see [`Running`]).
static RUNNING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Woken whenever [`RUNNING`] drops to zero.
static DRAINED: std::sync::LazyLock<tokio::sync::Notify> =
    std::sync::LazyLock::new(tokio::sync::Notify::new);

/// Counts one piece of detached work in [`RUNNING`] while it lives: made when the work is
/// spawned, dropped when it ends, also when its runtime drops it unfinished.
pub(crate) struct Running(());

impl Running {
    pub(crate) fn start() -> Running {
        RUNNING.fetch_add(1, Ordering::AcqRel);
        Running(())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if RUNNING.fetch_sub(1, Ordering::AcqRel) == 1 {
            DRAINED.notify_waiters();
        }
    }
}

/// `fut`, counted as detached work (see [`drain`]) from now until it ends or is dropped.
pub(crate) fn counted<F: Future>(fut: F) -> impl Future<Output = F::Output> {
    let running = Running::start();
    async move {
        let out = fut.await;
        drop(running);
        out
    }
}

/// Waits until every detached idempotent call of this process (a call whose caller went
/// away, or an axum / actix-web handler's claimed body), every store of a result and every
/// give-back of a claim has finished, or `within` has passed; returns how many were
/// still running then (0: all finished).
///
/// Call it after the server stopped taking requests and before the runtime that runs the
/// handlers shuts down: a runtime that shuts down drops the tasks still running, and a
/// body dropped mid-run leaves its claim in progress until its lease ends, after which a
/// retry runs the body again.
///
/// - axum: after `axum::serve(..).with_graceful_shutdown(..)` returns (it returns once its
///   connections are closed, even while a body whose client went away still runs), and
///   before `main` returns.
/// - actix-web: the handlers run on the workers' runtimes, which stop with the server:
///   `ServerHandle::pause()`, then `drain`, then `ServerHandle::stop(true)` (build the
///   server with `disable_signals()` and stop it on the signal yourself).
///
/// `examples/axum_orders.rs` and `examples/actix_orders.rs` do so.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// // ... the server stopped (graceful shutdown) ...
/// let left = lockcore::idempotency::drain(Duration::from_secs(10)).await;
/// if left > 0 {
///     eprintln!("{left} idempotent calls still running at shutdown: their keys stay in progress until their leases end");
/// }
/// # }
/// ```
pub async fn drain(within: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let notified = DRAINED.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let running = RUNNING.load(Ordering::Acquire);
        if running == 0 {
            return 0;
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return RUNNING.load(Ordering::Acquire);
        }
    }
}

/// Runs `fut` in a task of its own on the current tokio runtime, so it runs to its end
/// even when the caller's future is dropped (a client that went away, a timeout around
/// the call); the task keeps the caller's span and subscriber. A panic in it is resumed
/// where the returned future is awaited. `None` when the runtime shut down before it
/// ended. Without a runtime, `fut` runs where the returned future is awaited.
///
/// The task is spawned here, not when the returned future is first polled: that future
/// only waits for it, so it stays small however large `fut` is (a large future is not
/// copied again into it).
pub(crate) fn detached<F>(fut: F) -> impl Future<Output = Option<F::Output>> + Send
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let spawned = match tokio::runtime::Handle::try_current() {
        Ok(handle) => Ok(handle.spawn(counted(
            fut.instrument(tracing::Span::current())
                .with_current_subscriber(),
        ))),
        Err(_) => Err(Box::pin(fut)),
    };
    async move {
        match spawned {
            Ok(task) => joined(task.await),
            Err(here) => Some(here.await),
        }
    }
}

/// [`detached`] for a future that is not `Send`: spawned on the current `LocalSet`,
/// which the caller must be running on.
pub(crate) fn detached_local<F>(fut: F) -> impl Future<Output = Option<F::Output>>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let task = tokio::task::spawn_local(counted(
        fut.instrument(tracing::Span::current())
            .with_current_subscriber(),
    ));
    async move { joined(task.await) }
}

/// What a detached call returns when the runtime shut down before it ended.
pub(crate) fn runtime_gone() -> Error {
    Error::backend(
        "",
        crate::error::BackendError::new(
            crate::error::BackendErrorKind::Config,
            "the runtime shut down while the idempotent call ran",
        ),
    )
}

fn joined<T>(out: Result<T, tokio::task::JoinError>) -> Option<T> {
    match out {
        Ok(v) => Some(v),
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => None,
        },
    }
}

/// How a call begins.
// Returned once per call and matched at once: boxing the claim would only add an
// allocation.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Begin {
    /// Claimed: run the body, then complete or release.
    Run(Claim),
    /// Completed before with the same payload: the stored record.
    Replay(String),
}

/// What a repeat that finds the key in progress is told to wait (`Retry-After`) when
/// nothing is known yet of how long a body of its fn takes.
pub(crate) const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What this process knows of each record namespace: which fn uses it (where it is
/// defined), and about how long its completed bodies took lately (a moving average, each
/// new run counting for a quarter).
static NAMESPACES: std::sync::LazyLock<Mutex<HashMap<&'static str, Namespace>>> =
    std::sync::LazyLock::new(Mutex::default);

struct Namespace {
    site: &'static str,
    typical: Option<Duration>,
}

fn namespaces() -> std::sync::MutexGuard<'static, HashMap<&'static str, Namespace>> {
    crate::util::lock(&NAMESPACES)
}

/// `Err` when another fn already uses `f`'s namespace: their records would answer each
/// other's calls (say, methods named alike of two types in one module).
fn check_namespace(f: IdemFn, key: &str) -> Result<(), Error> {
    let first = namespaces()
        .entry(f.namespace)
        .or_insert(Namespace {
            site: f.site,
            typical: None,
        })
        .site;
    if first == f.site {
        return Ok(());
    }
    let detail = format!(
        "the idempotent fns at {first} and {} share the record namespace `{}`: their records \
         would answer each other's calls; give one of them `name = \"...\"`",
        f.site, f.namespace
    );
    tracing::error!(target: "distlock", namespace = f.namespace, first, second = f.site, "{detail}");
    Err(Error::backend(
        key,
        crate::error::BackendError::new(crate::error::BackendErrorKind::Config, detail),
    ))
}

/// Records that a body in `namespace` completed after `took`.
fn observe(namespace: &'static str, took: Duration) {
    if let Some(ns) = namespaces().get_mut(namespace) {
        ns.typical = Some(ns.typical.map_or(took, |avg| (avg * 3 + took) / 4));
    }
}

/// How long a repeat should wait before retrying: how long a body in `namespace` takes
/// (else [`DEFAULT_RETRY_AFTER`]), never more than the running claim's lease `left`.
fn retry_after(namespace: &'static str, left: Duration) -> Duration {
    let typical = namespaces().get(namespace).and_then(|ns| ns.typical);
    typical.unwrap_or(DEFAULT_RETRY_AFTER).min(left)
}

/// Claims `key` for fn `f` (records in its namespace), replays it, or waits up to
/// `spec.wait_ms` for a running call to end.
pub(crate) async fn begin(
    locks: &Locks,
    f: IdemFn,
    key: String,
    fp: &Fingerprint,
    digest: &str,
    spec: &IdemSpec,
) -> Result<Begin, Error> {
    check_namespace(f, &key)?;
    key::checked(&key)?;
    let (function, inner) = (f.namespace, &locks.inner);
    let new_owner = || format!("{}:{}", uuid::Uuid::new_v4(), inner.holder);
    let mut owner = new_owner();
    let channel = done_channel(&key);
    let lease = spec.lease();
    let lifetime = lease + spec.retention();
    let started = Instant::now();
    let deadline = started + Duration::from_millis(spec.wait_ms);
    let mut contention = Contention::new(
        &inner.wakeups,
        (&channel, str::to_owned),
        started,
        deadline,
        CLAIM_RETRY_CAP,
        false,
    );
    let plan = ClaimPlan {
        locks,
        function,
        key: &key,
        fp: digest,
        channel: &channel,
        lease,
        lifetime,
        replicas: spec.replicas.unwrap_or(inner.replicas),
    };
    loop {
        let args = ClaimArgs {
            key: &key,
            owner: &owner,
            fp: digest,
            lease,
            lifetime,
            will_wait: Instant::now() < deadline,
        };
        let sent = Instant::now();
        // Dropped while the claim is in flight (the caller cancelled), the claim may
        // still land: it is given back.
        let found = in_flight(inner.backend.idem_claim(&args), || {
            tracing::trace!(target: "distlock", key, "idempotency claim cancelled in flight; giving it back");
            plan.claim(sent, None, &owner).spawn_give_back(true);
        })
        .await;
        let found = match found {
            Ok(found) => found,
            Err(source) => return Err(plan.failed(source, sent, &owner)),
        };
        tracing::trace!(target: "distlock", key, fingerprint = &digest[..12], skipped = ?fp.skipped(), "idempotency claim's fingerprint");
        let left = match plan.settle(found, sent, &owner, started) {
            Settled::Done(outcome) => return outcome,
            Settled::Claimed(claim) => return claimed(claim).await,
            Settled::InProgress(left) => left,
        };
        if inner.backend.independent_writes() {
            // Its claims given back (see `RedlockBackend::idem_claim`): the next try is
            // another claim, which a late give-back cannot remove.
            owner = new_owner();
        }
        if let Next::GiveUp(waited) = contention.refused(Some(left)).await {
            inner
                .events
                .emit(Event::InProgress { key: &key, waited }, function);
            return Err(Error::InProgress {
                key,
                retry_after: retry_after(function, left),
            });
        }
    }
}

/// What a claim's answer means for the call (see [`ClaimPlan::settle`]).
enum Settled {
    /// Its outcome: a replay or an error.
    Done(Result<Begin, Error>),
    /// Claimed: the body runs once replicas acknowledge the claim.
    Claimed(Claim),
    /// In progress elsewhere, with this much of its lease left: wait and try again.
    InProgress(Duration),
}

/// What every claim of one call shares: the [`Claim`] a try makes is this plus its
/// owner, when it was sent and the record it wrote.
struct ClaimPlan<'a> {
    locks: &'a Locks,
    function: &'static str,
    key: &'a str,
    fp: &'a str,
    channel: &'a str,
    lease: Duration,
    lifetime: Duration,
    replicas: u32,
}

impl ClaimPlan<'_> {
    /// What a claim's answer means for the call.
    fn settle(&self, found: Claimed, sent: Instant, owner: &str, started: Instant) -> Settled {
        let (events, key) = (&self.locks.inner.events, self.key);
        let (written, took_over) = match found {
            Claimed::New(written) => (written, false),
            Claimed::TookOver { previous } => {
                tracing::debug!(target: "distlock", key, previous_owner = previous, "idempotency claim taken over");
                (None, true)
            }
            Claimed::Completed(raw) => {
                events.emit(Event::Replayed { key }, self.function);
                return Settled::Done(Ok(Begin::Replay(raw)));
            }
            Claimed::Mismatch { .. } => {
                events.emit(Event::Mismatch { key }, self.function);
                return Settled::Done(Err(Error::PayloadMismatch {
                    key: key.to_owned(),
                }));
            }
            Claimed::InProgress(left) => return Settled::InProgress(left),
        };
        events.emit(
            Event::Claimed {
                key,
                waited: started.elapsed(),
                took_over,
            },
            self.function,
        );
        Settled::Claimed(self.claim(sent, written, owner))
    }

    /// A claim that failed: given back when it may have landed with its reply lost.
    fn failed(&self, source: BackendError, sent: Instant, owner: &str) -> Error {
        if source.is_transient() {
            self.claim(sent, None, owner).spawn_give_back(true);
        }
        let error = Error::backend(self.key, source);
        self.locks.inner.events.emit(
            Event::ClaimFailed {
                key: self.key,
                error: &error,
            },
            self.function,
        );
        error
    }

    fn claim(&self, sent: Instant, written: Option<String>, owner: &str) -> Claim {
        Claim {
            replicas: self.replicas,
            locks: self.locks.clone(),
            function: self.function,
            key: self.key.to_owned(),
            owner: owner.to_owned(),
            fp: self.fp.to_owned(),
            channel: self.channel.to_owned(),
            lease: self.lease,
            lifetime: self.lifetime,
            claimed: sent,
            renewed: Mutex::new(sent),
            written: Mutex::new(written),
            pending: None,
            started: AtomicBool::new(false),
            releasing: false,
            resumed: false,
            done: false,
        }
    }
}

/// A claim just made, once `replicas` acknowledged it: else given back, and
/// [`Error::NotReplicated`] (the body does not run). Dropped meanwhile (its caller went
/// away while the replicas acknowledge, or while it is given back), the claim is given
/// back by its `Drop`: its body has not started.
async fn claimed(claim: Claim) -> Result<Begin, Error> {
    if claim.replicas == 0 {
        return Ok(Begin::Run(claim));
    }
    // The claim confirmed and `WAIT` in one pipeline on one connection: a failover since
    // the claim makes the confirmation find it on the new primary (or write it there,
    // when nobody claimed the key since) before the replicas count it.
    let error = match claim.renew().await {
        Ok(a) if a.value != Renewal::Lost && a.replicas >= claim.replicas => {
            return Ok(Begin::Run(claim));
        }
        // Another call claimed the key first (this claim was lost before replicas had
        // it): in progress elsewhere; the body did not run.
        Ok(a) if a.value == Renewal::Lost => Error::InProgress {
            key: claim.key.clone(),
            retry_after: retry_after(claim.function, claim.lease),
        },
        Ok(a) => {
            tracing::warn!(target: "distlock", key = claim.key, acked = a.replicas, wanted = claim.replicas, "idempotency claim not acknowledged by enough replicas: given back");
            Error::NotReplicated {
                key: claim.key.clone(),
                acked: a.replicas,
                wanted: claim.replicas,
            }
        }
        Err(e) => Error::backend(&claim.key, e),
    };
    claim.release_boxed().await;
    Err(error)
}

/// A claimed record. Complete or release it; see its `Drop` for what a drop does.
pub(crate) struct Claim {
    /// Replicas that must acknowledge the claim and the stored result.
    replicas: u32,
    locks: Locks,
    /// The fn whose body runs (how long it takes is remembered, see [`retry_after`]).
    function: &'static str,
    key: String,
    owner: String,
    /// The payload's fingerprint: a renewal that finds the record gone writes it again.
    fp: String,
    channel: String,
    lease: Duration,
    lifetime: Duration,
    /// When the claim was sent (how long the body took is counted from it).
    claimed: Instant,
    /// When the claim, or its last successful renewal, was sent: its lease runs from no
    /// earlier, by this client's clock.
    renewed: Mutex<Instant>,
    /// The exact in-progress record this claim wrote, while nothing else has rewritten
    /// it since (a renewal does): lets the store skip `idem_settle.lua`.
    written: Mutex<Option<String>>,
    /// The record being stored and its retention, while `complete` runs.
    pending: Option<(String, Duration)>,
    /// Whether the body began (set when `keep` is first polled): a claim dropped before
    /// is given back, since nothing of the body ran.
    started: AtomicBool,
    /// Whether `release` is under way: dropped meanwhile, the release goes on in a task.
    releasing: bool,
    /// This claim is the resumed store of a dropped one: dropped again (its runtime
    /// shutting down), it is not resumed again.
    resumed: bool,
    done: bool,
}

impl Claim {
    /// How long a completed (or kept) record stays: its key's lifetime minus the lease.
    fn retention(&self) -> Duration {
        self.lifetime.saturating_sub(self.lease)
    }

    /// When the lease ends by this client's clock, unless renewed.
    fn lease_end(&self) -> Instant {
        *crate::util::lock(&self.renewed) + self.lease
    }

    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// Whether `replicas` acknowledged the stored `record`: made sure of and waited for
    /// in one pipeline (`confirm_store`: written again where a failover lost it), so no
    /// new primary's replicas acknowledge a result it lacks.
    async fn acked(&self, record: &str, retention: Duration) -> Result<(), Error> {
        if self.replicas == 0 {
            return Ok(());
        }
        let store = StoreArgs {
            key: &self.key,
            record,
            owner: &self.owner,
            retention,
            channel: &self.channel,
        };
        let backend = &self.locks.inner.backend;
        // A failover under way fails the first tries (the old primary's connections cut,
        // `READONLY`, no primary yet): tried again while the lease lasts, since the
        // script is safe to repeat and its point is to write the result on the new
        // primary. Given up, a repeat finds the claim in progress until its lease ends.
        let mut retried = false;
        let confirmed = loop {
            // Boxed as a trait object: not the usual path, and a handler's future would
            // otherwise carry its type (deep enough to overflow the compiler's `Send`
            // check).
            let once: std::pin::Pin<Box<dyn Future<Output = _> + Send + '_>> =
                Box::pin(backend.confirm_store(&store, self.replicas));
            match once.await {
                Err(e) if e.is_transient() && (!retried || Instant::now() < self.lease_end()) => {
                    if retried {
                        let pause = (self.lease / 10).max(Duration::from_millis(10));
                        tokio::time::sleep_until((Instant::now() + pause).min(self.lease_end()))
                            .await;
                    }
                    tracing::debug!(target: "distlock", key = self.key, error = %e, "stored result's acknowledgement failed; trying again");
                    retried = true;
                }
                done => break done,
            }
        };
        match confirmed {
            Ok(a) if a.value && a.replicas >= self.replicas => Ok(()),
            Ok(a) if a.value => {
                tracing::warn!(target: "distlock", key = self.key, acked = a.replicas, wanted = self.replicas, "stored result not acknowledged by enough replicas");
                Err(Error::NotReplicated {
                    key: self.key.clone(),
                    acked: a.replicas,
                    wanted: self.replicas,
                })
            }
            // Another call's claim or result where this one was stored: a failover lost
            // it, and the key was claimed again meanwhile.
            Ok(_) => Err(Error::Lost {
                key: self.key.clone(),
            }),
            Err(e) => Err(Error::backend(&self.key, e)),
        }
    }

    /// One renewal of the claim (`idem_renew.lua`); with `replicas`, the `WAIT` for them
    /// follows it in one pipeline on one connection (`replicas` is then how many
    /// acknowledged it).
    async fn renew(&self) -> Result<Acked<Renewal>, crate::error::BackendError> {
        let owner = Owner {
            token: &self.owner,
            fp: &self.fp,
        };
        let backend = &self.locks.inner.backend;
        if self.replicas == 0 {
            let value = backend
                .idem_renew(&self.key, &owner, self.lease, self.lifetime)
                .await?;
            return Ok(Acked { value, replicas: 0 });
        }
        let lease = (self.lease, self.lifetime);
        backend
            .confirm_claim(&self.key, &owner, lease, self.replicas)
            .await
    }

    /// Runs `body`, renewing the lease every `lease / 3` meanwhile (in this task, so the
    /// body keeps its task-locals and need not be `Send` beyond what it already is).
    ///
    /// `Err(Lost)` when a renewal found the claim taken over (its lease had ended), or no
    /// renewal succeeded for a whole lease (another call may have taken it over): with
    /// `cancel_on_lost` the body is dropped at once, else it runs to its end first.
    /// Nothing may be stored then: the caller releases the claim (a no-op when another
    /// call owns it).
    pub(crate) async fn keep<F: Future>(
        &self,
        body: F,
        cancel_on_lost: bool,
    ) -> Result<F::Output, Error> {
        self.started.store(true, Ordering::Relaxed);
        let beat = async {
            let every = (self.lease / 3).max(Duration::from_millis(1));
            loop {
                tokio::time::sleep(every).await;
                let sent = Instant::now();
                // The renewal rewrites the record (landed or not, its text is unknown now).
                crate::util::lock(&self.written).take();
                let renewed = self.renew().await;
                if matches!(renewed, Ok(ref a) if a.value == Renewal::Recreated) {
                    // Gone, and nobody claimed it since: this claim again, so the body
                    // finishes and its result is stored for the retries to replay.
                    tracing::warn!(target: "distlock", key = self.key, "idempotency record gone while the body ran (a restart, a failover, eviction or a forget): written again as this call's claim");
                }
                match renewed.map(|a| (a.value != Renewal::Lost, a.replicas)) {
                    // With `replicas`, a renewal counts once they acknowledged it.
                    Ok((true, acked)) if acked >= self.replicas => {
                        *crate::util::lock(&self.renewed) = sent;
                    }
                    Ok((true, acked)) => {
                        tracing::warn!(target: "distlock", key = self.key, acked, wanted = self.replicas, "idempotency lease renewal not acknowledged by replicas; retrying");
                    }
                    Ok((false, _)) => {
                        tracing::warn!(target: "distlock", key = self.key, cancel = cancel_on_lost, "idempotency claim lost while the body ran (another call took it over, or stored its result)");
                        return;
                    }
                    Err(e) if Instant::now() >= self.lease_end() => {
                        tracing::warn!(target: "distlock", key = self.key, error = %e, cancel = cancel_on_lost, "idempotency claim lost: no renewal succeeded for a whole lease");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(target: "distlock", key = self.key, error = %e, "idempotency lease renewal failed; retrying");
                    }
                }
            }
        };
        tokio::pin!(body);
        tokio::select! {
            biased;
            out = &mut body => return Ok(out),
            () = beat => {}
        }
        if !cancel_on_lost {
            drop(body.await);
        }
        Err(Error::Lost {
            key: self.key.clone(),
        })
    }

    /// Stores `record` (retained `ttl`) and wakes waiters. Transient Redis failures are
    /// retried while the claim's lease lasts; past it, or on another failure, it is
    /// logged: the body has run, and the caller still gets its result (the claim ends
    /// with its lease). `Err(Lost)` when another call's result was stored first (this
    /// claim was taken over, and the call that took it over finished first): this result
    /// is not the one repeats get. A result stored first is kept, even one whose claim
    /// was taken over while it ran.
    ///
    /// Dropped before it finished (the caller went away), the store goes on in a task of
    /// its own: the body has run, so its result is stored rather than the key left in
    /// progress for the rest of the lease.
    pub(crate) async fn complete(
        mut self,
        record: String,
        retention: Duration,
    ) -> Result<(), Error> {
        self.pending = Some((record, retention));
        let out = self.store().await;
        self.pending = None;
        self.done = true;
        out
    }

    /// The loop of [`complete`](Self::complete), over `self.pending`.
    async fn store(&mut self) -> Result<(), Error> {
        let Some((record, retention)) = &self.pending else {
            return Ok(());
        };
        let inner = &self.locks.inner;
        let mut retried = false;
        let written = crate::util::lock(&self.written).clone();
        loop {
            let lease_end = self.lease_end();
            match inner
                .backend
                .idem_complete(
                    &self.key,
                    record,
                    *retention,
                    &self.channel,
                    written.as_deref(),
                )
                .await
            {
                Ok(true) => {
                    inner.events.emit(
                        Event::Stored {
                            key: &self.key,
                            bytes: record.len(),
                        },
                        self.function,
                    );
                    observe(self.function, self.claimed.elapsed());
                    // Stored: a caller dropped from here on must not make it stored again.
                    let Some((record, retention)) = self.pending.take() else {
                        return Ok(());
                    };
                    // Stored on the primary either way: the caller learns whether a
                    // failover could lose it.
                    return self.acked(&record, retention).await;
                }
                Ok(false) => {
                    inner.events.emit(Event::NotStored {
                        key: &self.key,
                        reason: "the claim was lost (its lease ended, another call took it over and stored its result first)",
                    }, self.function);
                    return Err(Error::Lost {
                        key: self.key.clone(),
                    });
                }
                Err(e) if e.is_transient() && (!retried || Instant::now() < lease_end) => {
                    if retried {
                        let pause = (self.lease / 10).max(Duration::from_millis(10));
                        tokio::time::sleep_until((Instant::now() + pause).min(lease_end)).await;
                    }
                    // A failed try that landed makes the next one answer "stored": its
                    // record is the first result in the value.
                    retried = true;
                }
                Err(e) => {
                    inner.events.emit(
                        Event::NotStored {
                            key: &self.key,
                            reason: &e.to_string(),
                        },
                        self.function,
                    );
                    return Ok(());
                }
            }
        }
    }

    /// Gives the claim up so a retry runs the body.
    pub(crate) async fn release(mut self) {
        // Dropped before the release ended, the claim's `Drop` releases it in a task.
        self.releasing = true;
        release(
            &self.locks,
            &self.key,
            &self.owner,
            &self.channel,
            self.retention(),
        )
        .await;
        self.done = true;
    }

    /// [`release`](Self::release) on the paths where it is the exception: boxed, so that
    /// the futures of the usual paths do not carry its state.
    pub(crate) fn release_boxed(self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(self.release())
    }

    fn spawn_release(self) {
        self.spawn_give_back(false);
    }

    /// Releases the claim in a task of its own. With `in_flight` (the claim's command was
    /// sent and its caller went away, or its reply was lost) the claim may land after
    /// the release, which then finds nothing: the command may have gone on another
    /// connection, or still be queued on its own. When the release was answered and
    /// found nothing (on Redlock: whatever it found, since some masters may not have
    /// the claim yet), it is tried once more a command timeout later; the owner token
    /// is unique, so a late try removes nobody else's claim. Best effort: a claim held
    /// up longer than that (a server busy with a long script) still ends with its lease.
    /// A release that failed is not tried again (Redis is failing: no added load).
    fn spawn_give_back(mut self, in_flight: bool) {
        self.done = true;
        let Claim {
            locks,
            key,
            owner,
            channel,
            ..
        } = &self;
        let (locks, key, owner, channel) =
            (locks.clone(), key.clone(), owner.clone(), channel.clone());
        let retention = self.retention();
        let spawned = crate::util::spawn_here(counted({
            let key = key.clone();
            async move {
                let found = release(&locks, &key, &owner, &channel, retention).await;
                let again = match found {
                    Some(false) => in_flight,
                    Some(true) => in_flight && locks.inner.backend.independent_writes(),
                    None => false,
                };
                if again {
                    tokio::time::sleep(locks.inner.backend.command_timeout()).await;
                    release(&locks, &key, &owner, &channel, retention).await;
                }
            }
        }));
        if !spawned {
            tracing::warn!(target: "distlock", key, "idempotency claim dropped outside a tokio runtime; it ends with its lease");
        }
    }
}

/// Whether the claim was there to release; `None` when the release failed.
async fn release(
    locks: &Locks,
    key: &str,
    owner: &str,
    channel: &str,
    retention: Duration,
) -> Option<bool> {
    match locks
        .inner
        .backend
        .idem_release(key, owner, channel, retention)
        .await
    {
        Ok(true) => {
            tracing::debug!(target: "distlock", key, "idempotency claim released");
            Some(true)
        }
        Ok(false) => {
            tracing::debug!(target: "distlock", key, "idempotency claim already gone");
            Some(false)
        }
        Err(e) => {
            tracing::warn!(target: "distlock", key, error = %e, "idempotency claim release failed; it ends with its lease");
            None
        }
    }
}

/// A claim dropped before it was completed or released:
/// - while its result was being stored (the caller went away during `complete`): the
///   store goes on in a task of its own;
/// - while unwinding from a panic in the body: released, so a retry runs the body;
/// - before its body started (the caller went away while the replicas acknowledged the
///   claim, or before the spawned call first ran), or while it was being released:
///   released in a task of its own, so a retry runs the body at once (waiting for a
///   `#[distributed_lock]` under the claim counts as the body: it runs inside `keep`);
/// - otherwise (the caller's future was dropped mid-body, and the body with it): left in
///   progress until its lease ends, since the body may have done part of its work; a
///   repeat meanwhile gets `InProgress`, and after the lease takes the claim over.
impl Drop for Claim {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let rest = Claim {
            replicas: self.replicas,
            locks: self.locks.clone(),
            function: self.function,
            key: std::mem::take(&mut self.key),
            owner: std::mem::take(&mut self.owner),
            fp: std::mem::take(&mut self.fp),
            channel: std::mem::take(&mut self.channel),
            lease: self.lease,
            lifetime: self.lifetime,
            claimed: self.claimed,
            renewed: Mutex::new(self.lease_end() - self.lease),
            written: Mutex::new(crate::util::lock(&self.written).take()),
            pending: self.pending.take(),
            started: AtomicBool::new(self.started.load(Ordering::Relaxed)),
            releasing: self.releasing,
            resumed: true,
            done: false,
        };
        if self.resumed {
            tracing::warn!(target: "distlock", key = rest.key, "idempotent result not stored (the runtime shut down); the claim ends with its lease");
            let mut rest = rest;
            rest.done = true;
        } else if let Some((record, retention)) = rest.pending.clone() {
            // Outside a runtime the resumed store is dropped at once, and says so.
            crate::util::spawn_here(counted(async move {
                let _ = rest.complete(record, retention).await;
            }));
        } else if std::thread::panicking() {
            rest.spawn_release();
        } else if !rest.started.load(Ordering::Relaxed) || rest.releasing {
            tracing::debug!(target: "distlock", key = rest.key, "idempotency claim dropped before its body started, or while it was given back: giving it back");
            rest.spawn_release();
        } else {
            tracing::debug!(target: "distlock", key = rest.key, "idempotent call dropped while its body ran: the claim stays in progress until its lease ends");
            let mut rest = rest;
            rest.done = true;
        }
    }
}

/// What `#[idempotent]` expands to (re-exported by `crate::__private`).
pub(crate) mod private {
    pub use super::Fingerprint;
    pub use super::fingerprint::{
        Fingerprintable, FpArg, FpChecked, FpNonPayload, FpNone, FpSerialize, FpSet, NonPayload,
        assert_non_payload,
    };
    pub use super::fns::{
        DetachFn, DetachFnInline, DetachFnSend, IdemCall, IdemError, IdemFn, IdemOutput, IdemSpec,
        IdemTarget, IdemValue, IntoSame, NoSame, Same, SameByEq, SameBySerde, SameProbe,
        run_idempotent,
    };
    pub use super::http::{
        BodyFp, BodySeen, Capture, CaptureActix, CaptureAxum, CaptureBoth, CaptureFuture,
        CaptureNone, Detach, DetachLocal, DetachMode, DetachSend, HandlerReturn, HandlerRun,
        IdemRequest, IdemResponse, LocalCapture, Reply, SendCapture,
    };
    pub use super::record::Captured;
}
