//! A child process of the chaos run: one `Locks` client shared by several tokio runtimes,
//! whose worker tasks take locks and call an idempotent fn until the stop time, logging
//! every step to the shared event log.
//!
//! Strict children never cancel a call before it has the lock (their timeouts start once
//! the lock is held), so every token of theirs found in Redis belongs to a call that held
//! the lock or gave up waiting; child 0 is not strict and cancels anywhere, acquisition
//! included.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use distlock::{Error, LockGuard, Locks, idempotent};
use serde::{Deserialize, Serialize};

use crate::cfg;
use crate::events::{EventLog, now_ms};

/// What a child is told by its parent (environment variables).
pub(crate) mod env {
    pub(crate) const URL: &str = "DISTLOCK_CHAOS_URL";
    pub(crate) const EVENTS: &str = "DISTLOCK_CHAOS_EVENTS";
    pub(crate) const CHILD: &str = "DISTLOCK_CHAOS_CHILD";
    pub(crate) const SEED: &str = "DISTLOCK_CHAOS_CHILD_SEED";
    pub(crate) const STRICT: &str = "DISTLOCK_CHAOS_STRICT";
    pub(crate) const START_MS: &str = "DISTLOCK_CHAOS_START_MS";
    pub(crate) const STOP_MS: &str = "DISTLOCK_CHAOS_STOP_MS";
    /// Replicas every lock and record waits for (the cluster run: 1; else unset).
    pub(crate) const REPLICAS: &str = "DISTLOCK_CHAOS_REPLICAS";
    /// A bug planted in the children, to check that the analysis catches it (see
    /// `plant` below): read here, in the test's children, never by the library.
    pub(crate) const PLANT: &str = "DISTLOCK_CHAOS_PLANT";
}

/// The bugs [`env::PLANT`] can plant in every child.
///
/// `renewal-ignores-token`: holders act as if lease keeping's renewal ignored the token
/// (extended the key whoever held it, and said "renewed"): they are never told their
/// lock is lost (no `lost()` wake-up logged, `is_held()` read as true), and where lease
/// keeping did find it lost they work on, to their body's planned end and
/// [`PLANT_WORK_ON`] more, as a holder told "renewed" would, while another holder has
/// the key. The analysis must report it (unreported loss: two holders, one of them lost
/// but told it held). The library is untouched: the plant sits where the children read
/// what the library tells them.
pub(crate) fn plant() -> Option<&'static str> {
    static PLANT: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    *PLANT.get_or_init(|| match std::env::var(env::PLANT).ok()?.as_str() {
        "" => None,
        "renewal-ignores-token" => Some("renewal-ignores-token"),
        other => panic!(
            "{}: unknown plant `{other}` (renewal-ignores-token)",
            env::PLANT
        ),
    })
}

/// How long a planted holder works on past its body's planned end once its lock was
/// lost (longer than the analysis's tolerance of command timeout + 150 ms: a renewed
/// lock is lost near its body's end, when the key expires after its last renewal, so
/// without it the overlaps the plant makes are mostly near misses).
const PLANT_WORK_ON: Duration = Duration::from_secs(1);

/// Whether holders are never told of a loss (the `renewal-ignores-token` plant).
fn told_nothing() -> bool {
    plant() == Some("renewal-ignores-token")
}

/// The holder id of child `i`: tokens are `<uuid>:<holder id>`.
pub(crate) fn holder_id(child: usize) -> String {
    format!("chaos-c{child}")
}

struct Ctx {
    locks: Locks,
    log: Arc<EventLog>,
    child: usize,
    strict: bool,
    start_ms: u64,
    stop_ms: u64,
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

fn var_u64(name: &str) -> u64 {
    var(name).parse().unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Mixes a seed with a stream number (splitmix64).
pub(crate) fn derive(seed: u64, stream: u64) -> u64 {
    let mut z = seed
        .wrapping_add(stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub(crate) fn main() {
    let child = var_u64(env::CHILD) as usize;
    let seed = var_u64(env::SEED);
    let stop_ms = var_u64(env::STOP_MS);
    // Never outlive a vanished parent for long.
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_secs(1));
            if now_ms() > stop_ms + 180_000 {
                eprintln!("chaos child {child}: parent gone? exiting");
                std::process::exit(3);
            }
        }
    });
    let mut builder = Locks::builder(var(env::URL))
        .command_timeout(cfg::COMMAND_TIMEOUT)
        .holder_id(holder_id(child));
    if let Ok(n) = std::env::var(env::REPLICAS) {
        builder = builder.replicas(n.parse().expect("a replica count"));
    }
    let locks = builder.build().expect("Locks::build");
    let ctx = Arc::new(Ctx {
        locks,
        log: Arc::new(EventLog::open(var(env::EVENTS).as_ref())),
        child,
        strict: var_u64(env::STRICT) == 1,
        start_ms: var_u64(env::START_MS),
        stop_ms,
    });
    let stdin = {
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut line = String::new();
            while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
                if tx.send(line.trim().to_owned()).is_err() {
                    break;
                }
                line.clear();
            }
        });
        rx
    };

    // The runtimes, each on a thread of its own, all using `ctx.locks`.
    let (report_tx, reports) = mpsc::channel::<(usize, usize, usize)>();
    let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
    let mut threads = Vec::new();
    let runtimes = cfg::runtimes();
    for rt in 0..runtimes {
        let (ctx, report_tx, mut shutdown_rx) =
            (ctx.clone(), report_tx.clone(), shutdown_rx.clone());
        threads.push(std::thread::spawn(move || {
            let runtime = if rt == 0 {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
            } else {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
            }
            .expect("tokio runtime");
            runtime.block_on(async {
                let workers = if rt == runtimes - 1 { 1 } else { cfg::WORKERS };
                let tasks: Vec<_> = (0..workers)
                    .map(|w| {
                        let seed = derive(seed, (rt * 16 + w) as u64);
                        tokio::spawn(worker(ctx.clone(), rt, w, seed))
                    })
                    .collect();
                let mut panics = 0;
                for t in tasks {
                    if let Err(e) = t.await {
                        eprintln!("chaos child {}: worker task failed: {e}", ctx.child);
                        panics += 1;
                    }
                }
                // Releases left to background tasks (cancelled calls) finish meanwhile.
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _ = report_tx.send((rt, ctx.locks.waiting_channels(), panics));
                // Keep the runtime (and whatever it still runs) alive until the end.
                let _ = shutdown_rx.wait_for(|stop| *stop).await;
            });
        }));
    }
    drop(report_tx);
    let mut waiting = vec![0; runtimes];
    let mut panics = 0;
    // Calls in flight at the stop time end within their wait, body and release.
    let drained = stop_ms + 60_000;
    for _ in 0..runtimes {
        let left = Duration::from_millis(drained.saturating_sub(now_ms()));
        let (rt, channels, p) = reports
            .recv_timeout(left)
            .expect("a runtime did not finish its calls within 60 s of the stop time");
        waiting[rt] = channels;
        panics += p;
    }
    println!(
        "@@idle waiting_channels={} panics={panics}",
        waiting
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    // Final check, when the parent says so (one child at a time): every key can be taken
    // at once (no stale local queue, nothing held), and nobody is subscribed.
    while let Ok(cmd) = stdin.recv() {
        if cmd == "final" {
            final_check(&ctx);
        }
    }
    let _ = shutdown.send(true);
    for t in threads {
        let _ = t.join();
    }
}

fn final_check(ctx: &Ctx) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (busy, slowest) = rt.block_on(async {
        let mut busy = Vec::new();
        let mut slowest = Duration::ZERO;
        for name in cfg::LOCK_KEYS {
            let started = Instant::now();
            let taken = ctx
                .locks
                .lock(name)
                .ttl(Duration::from_secs(2))
                .acquire()
                .await;
            match taken {
                Ok(g) => drop(g.release().await),
                Err(e) => {
                    // Not at once: how long until it can be had?
                    let again = ctx
                        .locks
                        .lock(name)
                        .ttl(Duration::from_secs(2))
                        .wait(Duration::from_secs(3))
                        .acquire()
                        .await;
                    let after = started.elapsed();
                    let outcome = match again {
                        Ok(g) => {
                            drop(g.release().await);
                            format!("taken_after_{}ms", after.as_millis())
                        }
                        Err(e) => kind(&e).to_owned(),
                    };
                    busy.push(format!("{name}:{}:{outcome}", kind(&e)));
                }
            }
            slowest = slowest.max(started.elapsed());
        }
        (busy, slowest)
    });
    let channels = rt.block_on(async { ctx.locks.waiting_channels() });
    println!(
        "@@final busy={} slowest_ms={} waiting_channels={channels}",
        if busy.is_empty() {
            "-".to_owned()
        } else {
            busy.join(",")
        },
        slowest.as_millis()
    );
}

pub(crate) fn kind(e: &Error) -> &'static str {
    match e {
        Error::Busy { .. } => "busy",
        Error::Lost { .. } => "lost",
        Error::Backend { .. } => "backend",
        Error::InvalidKey { .. } => "invalid",
        Error::InProgress { .. } => "inprogress",
        Error::PayloadMismatch { .. } => "mismatch",
        _ => "other",
    }
}

fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

/// Where a call is cut short: after a (short) time, or right after its n-th suspension
/// (tokio timers tick in milliseconds, longer than one round trip to a local redis: only
/// counting polls lands a cancellation at every await).
#[derive(Clone, Copy, Debug)]
enum Cut {
    After(Duration),
    Polls(u32),
}

impl Cut {
    fn render(cut: Option<Cut>) -> String {
        match cut {
            None => "-".to_owned(),
            Some(Cut::After(d)) => format!("t{}", us(d)),
            Some(Cut::Polls(n)) => format!("p{n}"),
        }
    }
}

/// Runs `fut`, dropping it where `cut` says; `None` when it was cut.
async fn cut<F: Future>(cut: Option<Cut>, fut: F) -> Option<F::Output> {
    match cut {
        None => Some(fut.await),
        Some(Cut::After(d)) => tokio::time::timeout(d, fut).await.ok(),
        Some(Cut::Polls(n)) => {
            Polls {
                inner: Box::pin(fut),
                left: n,
            }
            .await
        }
    }
}

/// Polls `inner` until it is ready or has been suspended `left` times.
struct Polls<F> {
    inner: Pin<Box<F>>,
    left: u32,
}

impl<F: Future> Future for Polls<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.inner.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(Some(out)),
            Poll::Pending if self.left <= 1 => Poll::Ready(None),
            Poll::Pending => {
                self.left -= 1;
                Poll::Pending
            }
        }
    }
}

async fn worker(ctx: Arc<Ctx>, rt: usize, w: usize, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut n = 0u64;
    while now_ms() < ctx.stop_ms {
        n += 1;
        let call = format!("c{}r{rt}w{w}n{n}", ctx.child);
        if rt == cfg::runtimes() - 1 {
            idem_op(&ctx, &mut rng, &call, true).await;
        } else {
            match rng.u8(..100) {
                0..60 => lock_op(&ctx, &mut rng, &call).await,
                60..70 => burst_op(&ctx, &mut rng, &call).await,
                _ => idem_op(&ctx, &mut rng, &call, false).await,
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(0..=15))).await;
    }
}

// ---------------------------------------------------------------------------------------
// Locks.
// ---------------------------------------------------------------------------------------

struct LockPlan {
    key: &'static str,
    renew: bool,
    ttl: Duration,
    wait: Duration,
    body: Duration,
    /// A nested acquisition of the same key inside `guard.scope` halfway through.
    nested: bool,
    /// Cancels the whole call (strict children: from acquisition on).
    outer: Option<Cut>,
    /// Cancels `release()` alone.
    release_cut: Option<Cut>,
}

/// A short cut: right after the first suspension (before or after the first command is
/// written, depending on the connection at hand), after 2-3, or a 0-2 ms (sometimes
/// 0-20 ms) timeout.
fn short(rng: &mut fastrand::Rng) -> Cut {
    match rng.u8(..100) {
        0..40 => Cut::Polls(1),
        40..60 => Cut::Polls(rng.u32(2..=3)),
        60..85 => Cut::After(Duration::from_micros(rng.u64(0..=2_000))),
        _ => Cut::After(Duration::from_micros(rng.u64(0..=20_000))),
    }
}

/// A cut of a whole call expected to take about `span_ms`.
fn whole(rng: &mut fastrand::Rng, span_ms: u64) -> Cut {
    match rng.u8(..100) {
        0..35 => Cut::Polls(rng.u32(1..=5)),
        35..55 => Cut::After(Duration::from_micros(rng.u64(0..=2_000))),
        55..70 => Cut::After(Duration::from_millis(rng.u64(0..=50))),
        _ => Cut::After(Duration::from_millis(rng.u64(0..=span_ms + 200))),
    }
}

fn plan_lock(rng: &mut fastrand::Rng) -> LockPlan {
    let key = cfg::LOCK_KEYS[rng.usize(..cfg::LOCK_KEYS.len())];
    let renew = rng.u8(..100) < 45;
    let ttl = if renew {
        rng.u64(cfg::RENEW_TTL_MS.0..=cfg::RENEW_TTL_MS.1)
    } else {
        rng.u64(cfg::PLAIN_TTL_MS.0..=cfg::PLAIN_TTL_MS.1)
    };
    // Renewed bodies are often longer than the ttl (the lease must be kept); plain ones
    // are short, sometimes just past the ttl (the loss must be reported at release).
    let body = match (renew, rng.u8(..100)) {
        (true, 0..50) => rng.u64(0..=ttl / 2),
        (true, _) => rng.u64(ttl * 3 / 2..=ttl * 3),
        (false, 0..85) => rng.u64(0..=150),
        (false, _) => rng.u64(ttl * 9 / 10..=ttl * 13 / 10),
    };
    let wait = match rng.u8(..100) {
        0..20 => 0,
        20..55 => rng.u64(20..=400),
        _ => (ttl + rng.u64(100..=600)).min(cfg::MAX_WAIT_MS),
    };
    let (outer, release_cut) = match rng.u8(..100) {
        0..30 => (None, None),
        30..62 => (None, Some(short(rng))),
        62..80 => (Some(whole(rng, wait + body)), None),
        _ => {
            let o = whole(rng, wait + body);
            (Some(o), Some(short(rng)))
        }
    };
    LockPlan {
        key,
        renew,
        ttl: Duration::from_millis(ttl),
        wait: Duration::from_millis(wait),
        body: Duration::from_millis(body),
        nested: rng.u8(..100) < 30,
        outer,
        release_cut,
    }
}

const ACQUIRE: u8 = 0;
const BODY: u8 = 1;
const RELEASE: u8 = 2;
const DONE: u8 = 3;

fn phase_name(p: u8) -> &'static str {
    match p {
        ACQUIRE => "acquire",
        BODY => "body",
        RELEASE => "release",
        _ => "done",
    }
}

async fn lock_op(ctx: &Ctx, rng: &mut fastrand::Rng, call: &str) {
    run_plan(ctx, plan_lock(rng), call).await;
}

/// Several locks taken at once by one task (tasks of its own) and released together, so
/// that many lock scripts are in flight at once (past a few, they go over the multiplexed
/// connection, where a release cut after its first poll has not been written yet).
async fn burst_op(ctx: &Arc<Ctx>, rng: &mut fastrand::Rng, call: &str) {
    let mut keys = cfg::LOCK_KEYS.to_vec();
    rng.shuffle(&mut keys);
    let body = Duration::from_millis(rng.u64(0..=100));
    let count = rng.usize(4..=cfg::LOCK_KEYS.len());
    let tasks: Vec<_> = keys
        .into_iter()
        .take(count)
        .enumerate()
        .map(|(i, key)| {
            let plan = LockPlan {
                key,
                renew: false,
                ttl: Duration::from_millis(rng.u64(cfg::PLAIN_TTL_MS.0..=cfg::PLAIN_TTL_MS.1)),
                wait: Duration::from_millis(rng.u64(0..=300)),
                body,
                nested: false,
                outer: None,
                release_cut: (rng.u8(..100) < 60).then_some(Cut::Polls(1)),
            };
            let (ctx, call) = (ctx.clone(), format!("{call}b{i}"));
            tokio::spawn(async move { run_plan(&ctx, plan, &call).await })
        })
        .collect();
    for t in tasks {
        match t.await {
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            _ => {}
        }
    }
}

async fn run_plan(ctx: &Ctx, p: LockPlan, call: &str) {
    ctx.log.emit(
        "lk_try",
        format_args!(
            "call={call} child={} key={} renew={} ttl={} wait={} body={} nested={} outer={} relto={} strict={}",
            ctx.child,
            p.key,
            u8::from(p.renew),
            p.ttl.as_millis(),
            p.wait.as_millis(),
            p.body.as_millis(),
            u8::from(p.nested),
            Cut::render(p.outer),
            Cut::render(p.release_cut),
            u8::from(ctx.strict),
        ),
    );
    let phase = AtomicU8::new(ACQUIRE);
    match (p.outer, ctx.strict) {
        (Some(outer), false) => {
            if cut(Some(outer), locked(ctx, &p, call, &phase, None))
                .await
                .is_none()
            {
                let at = phase_name(phase.load(Ordering::SeqCst));
                ctx.log
                    .emit("lk_cancel", format_args!("call={call} phase={at}"));
            }
        }
        (after_acquire, _) => locked(ctx, &p, call, &phase, after_acquire).await,
    }
}

/// Acquire, body, release. `after_acquire` bounds body and release together.
async fn locked(ctx: &Ctx, p: &LockPlan, call: &str, phase: &AtomicU8, after_acquire: Option<Cut>) {
    let started = Instant::now();
    let taken = ctx
        .locks
        .lock(p.key)
        .ttl(p.ttl)
        .wait(p.wait)
        .renew(p.renew)
        .acquire()
        .await;
    let took = us(started.elapsed());
    let guard = match taken {
        Ok(g) => g,
        Err(e) => {
            ctx.log.emit(
                "lk_fail",
                format_args!("call={call} err={} dur={took}", kind(&e)),
            );
            phase.store(DONE, Ordering::SeqCst);
            return;
        }
    };
    // The fence, asked for on entry (a round trip; `Lost` or a backend error is logged).
    let fence = match guard.fence().await {
        Ok(f) => f.to_string(),
        Err(e) => kind(&e).to_owned(),
    };
    ctx.log.emit(
        "lk_enter",
        format_args!(
            "call={call} key={} token={} fence={fence} dur={took} reentrant={}",
            p.key,
            guard.token(),
            u8::from(guard.is_reentrant())
        ),
    );
    phase.store(BODY, Ordering::SeqCst);
    let holding = Holding {
        log: &ctx.log,
        call,
        guard: Some(guard),
        lost: false,
    };
    let rest = hold_and_release(ctx, p, call, phase, holding);
    match after_acquire {
        Some(after) => {
            if cut(Some(after), rest).await.is_none() {
                let at = phase_name(phase.load(Ordering::SeqCst));
                ctx.log
                    .emit("lk_cancel", format_args!("call={call} phase={at}"));
            }
        }
        None => rest.await,
    }
}

/// A held lock inside its body: leaving the body (or being dropped, cancelled) logs
/// `lk_exit` BEFORE the guard goes (and with it, the release starts).
struct Holding<'a> {
    log: &'a EventLog,
    call: &'a str,
    guard: Option<LockGuard>,
    lost: bool,
}

impl Holding<'_> {
    fn log_exit(&self, g: &LockGuard, how: &str) {
        let lost = !told_nothing() && (self.lost || !g.info().is_held());
        self.log.emit(
            "lk_exit",
            format_args!("call={} lost={} how={how}", self.call, u8::from(lost)),
        );
    }

    fn leave(mut self) -> LockGuard {
        let g = self.guard.take().expect("held");
        self.log_exit(&g, "done");
        g
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        if let Some(g) = &self.guard {
            self.log_exit(g, "cancelled");
        }
        // `guard` is dropped after this: its release starts only now.
    }
}

async fn hold_and_release(
    ctx: &Ctx,
    p: &LockPlan,
    call: &str,
    phase: &AtomicU8,
    mut holding: Holding<'_>,
) {
    let lost = body(ctx, p, call, holding.guard.as_ref().expect("held")).await;
    holding.lost |= lost;
    let guard = holding.leave();
    phase.store(RELEASE, Ordering::SeqCst);
    let started = Instant::now();
    let released = cut(p.release_cut, guard.release()).await;
    let res = match released {
        None => "cancelled",
        Some(Ok(())) => "ok",
        Some(Err(e)) => kind(&e),
    };
    ctx.log.emit(
        "lk_rel",
        format_args!("call={call} res={res} dur={}", us(started.elapsed())),
    );
    phase.store(DONE, Ordering::SeqCst);
}

/// The critical section: sleeps, leaving early when told the lock is lost. Returns
/// whether it was told.
async fn body(ctx: &Ctx, p: &LockPlan, call: &str, g: &LockGuard) -> bool {
    let first = if p.nested { p.body / 2 } else { p.body };
    let mut lost = hold(ctx, call, g, first).await;
    if p.nested && !lost {
        lost = g.scope(nested(ctx, p, call, g, p.body - first)).await;
    }
    !told_nothing() && (lost || !g.info().is_held())
}

async fn hold(ctx: &Ctx, call: &str, g: &LockGuard, d: Duration) -> bool {
    if told_nothing() {
        // The plant: as if every renewal had said "renewed".
        let until = tokio::time::Instant::now() + d;
        tokio::select! {
            () = tokio::time::sleep_until(until) => {}
            () = g.lost() => tokio::time::sleep_until(until + PLANT_WORK_ON).await,
        }
        return false;
    }
    tokio::select! {
        () = tokio::time::sleep(d) => !g.info().is_held(),
        () = g.lost() => {
            ctx.log.emit("lk_lost", format_args!("call={call}"));
            true
        }
    }
}

/// The same key again, in the same task: must re-enter (same token and fence, no round
/// trip), and its release must release nothing.
async fn nested(ctx: &Ctx, p: &LockPlan, call: &str, outer: &LockGuard, d: Duration) -> bool {
    match ctx
        .locks
        .lock(p.key)
        .ttl(p.ttl)
        .renew(p.renew)
        .acquire()
        .await
    {
        Ok(inner) => {
            let (fence, outer_fence) = (inner.info().cached_fence(), outer.info().cached_fence());
            if !inner.is_reentrant() || fence != outer_fence || inner.token() != outer.token() {
                ctx.log.emit(
                    "lk_bad",
                    format_args!(
                        "call={call} what=nested_not_reentrant reentrant={} fence={fence:?} outer_fence={outer_fence:?}",
                        u8::from(inner.is_reentrant()),
                    ),
                );
            }
            let lost = hold(ctx, call, outer, d).await;
            let res = match inner.release().await {
                Ok(()) => "ok",
                Err(e) => kind(&e),
            };
            ctx.log
                .emit("lk_nested", format_args!("call={call} res={res}"));
            lost
        }
        Err(e) => {
            ctx.log.emit(
                "lk_bad",
                format_args!("call={call} what=nested_failed err={}", kind(&e)),
            );
            false
        }
    }
}

// ---------------------------------------------------------------------------------------
// Idempotency.
// ---------------------------------------------------------------------------------------

/// What the idempotent fn returns (and a replay returns): whose body ran, with what.
#[derive(Debug, Serialize, Deserialize)]
struct Charged {
    payload: u32,
    run: String,
}

#[derive(Debug)]
enum IdemErr {
    Lock(Error),
    App,
}

impl From<Error> for IdemErr {
    fn from(e: Error) -> Self {
        IdemErr::Lock(e)
    }
}

/// Logs the body's entry and exit for one call (not `Serialize`: not in the payload).
struct Probe {
    log: Arc<EventLog>,
    call: String,
}

struct InBody<'a> {
    probe: &'a Probe,
    left: bool,
}

impl<'a> InBody<'a> {
    fn enter(probe: &'a Probe, key: &str, payload: u32) -> Self {
        probe.log.emit(
            "id_enter",
            format_args!("call={} key={key} payload={payload}", probe.call),
        );
        InBody { probe, left: false }
    }

    fn leave(mut self, how: &str) {
        self.left = true;
        self.probe.log.emit(
            "id_exit",
            format_args!("call={} how={how}", self.probe.call),
        );
    }
}

impl Drop for InBody<'_> {
    fn drop(&mut self) {
        if !self.left {
            self.probe.log.emit(
                "id_exit",
                format_args!("call={} how=dropped", self.probe.call),
            );
        }
    }
}

/// Keep `lease` and `wait` in step with `cfg::IDEM_LEASE_MS` / `cfg::IDEM_WAIT_MS`.
///
/// `block_ms` blocks the thread (no await) halfway through the body: the heartbeat that
/// renews the claim's lease cannot run meanwhile.
#[idempotent(key = "<id>", client = locks, lease = "450ms", wait = "800ms", ttl = "1h", fingerprint = [id, payload])]
async fn charge(
    locks: &Locks,
    id: &str,
    payload: u32,
    work_ms: u64,
    block_ms: u64,
    fail: bool,
    probe: &Probe,
) -> Result<Charged, IdemErr> {
    charge_body(id, payload, work_ms, block_ms, fail, probe).await
}

/// `charge` with owned parameters: the call runs in a task of its own, so a caller
/// cancelled by its timeout leaves the body running to its end and storing its result (its
/// own record namespace: `charge_owned`).
#[idempotent(key = "<id>", client = locks, lease = "450ms", wait = "800ms", ttl = "1h", fingerprint = [id, payload])]
async fn charge_owned(
    locks: Locks,
    id: String,
    payload: u32,
    work_ms: u64,
    block_ms: u64,
    fail: bool,
    probe: Probe,
) -> Result<Charged, IdemErr> {
    charge_body(&id, payload, work_ms, block_ms, fail, &probe).await
}

/// The body of `charge` and `charge_owned`.
async fn charge_body(
    id: &str,
    payload: u32,
    work_ms: u64,
    block_ms: u64,
    fail: bool,
    probe: &Probe,
) -> Result<Charged, IdemErr> {
    let inside = InBody::enter(probe, id, payload);
    tokio::time::sleep(Duration::from_millis(work_ms / 2)).await;
    if block_ms > 0 {
        std::thread::sleep(Duration::from_millis(block_ms));
    }
    tokio::time::sleep(Duration::from_millis(work_ms - work_ms / 2)).await;
    inside.leave(if fail { "err" } else { "ok" });
    if fail {
        return Err(IdemErr::App);
    }
    Ok(Charged {
        payload,
        run: probe.call.clone(),
    })
}

/// One idempotent call; `may_block`: on the idempotency-only runtime, where a body may
/// block its thread past the lease.
async fn idem_op(ctx: &Ctx, rng: &mut fastrand::Rng, call: &str, may_block: bool) {
    let generation = now_ms().saturating_sub(ctx.start_ms) / cfg::IDEM_GENERATION_MS;
    let id = format!("g{generation}-{}", rng.u64(..cfg::IDEM_KEYS));
    let payload: u32 = if rng.u8(..100) < 55 { 1 } else { 2 };
    let work = if rng.u8(..100) < 15 {
        0
    } else {
        rng.u64(50..=600)
    };
    let block = if may_block && rng.u8(..100) < 35 {
        cfg::IDEM_LEASE_MS + rng.u64(200..=900)
    } else {
        0
    };
    let fail = rng.u8(..100) < 15;
    let limit = (rng.u8(..100) < 25).then(|| whole(rng, work + block + cfg::IDEM_WAIT_MS));
    // A third of the calls go through the owned fn (its records apart: `o` keys).
    let owned = rng.u8(..100) < 33;
    let id = if owned { format!("o{id}") } else { id };
    ctx.log.emit(
        "id_try",
        format_args!(
            "call={call} child={} key={id} payload={payload} work={} block={block} fail={} to={} owned={}",
            ctx.child,
            work + block,
            u8::from(fail),
            Cut::render(limit),
            u8::from(owned)
        ),
    );
    let probe = Probe {
        log: ctx.log.clone(),
        call: call.to_owned(),
    };
    let started = Instant::now();
    let out = if owned {
        let fut = charge_owned(ctx.locks.clone(), id, payload, work, block, fail, probe);
        cut(limit, fut).await
    } else {
        let fut = charge(&ctx.locks, &id, payload, work, block, fail, &probe);
        cut(limit, fut).await
    };
    let dur = us(started.elapsed());
    match out {
        None => ctx.log.emit(
            "id_ret",
            format_args!("call={call} res=cancelled dur={dur}"),
        ),
        Some(Ok(c)) if c.run == call => ctx
            .log
            .emit("id_ret", format_args!("call={call} res=ran dur={dur}")),
        Some(Ok(c)) => ctx.log.emit(
            "id_ret",
            format_args!(
                "call={call} res=replay rp={} rrun={} dur={dur}",
                c.payload, c.run
            ),
        ),
        Some(Err(IdemErr::App)) => ctx
            .log
            .emit("id_ret", format_args!("call={call} res=err dur={dur}")),
        Some(Err(IdemErr::Lock(e))) => ctx.log.emit(
            "id_ret",
            format_args!("call={call} res={} dur={dur}", kind(&e)),
        ),
    }
}
