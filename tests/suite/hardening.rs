//! Regression tests for faults found between the lines, each against a real redis-server
//! (and the in-memory backend where the fault is not about Redis), each with the check
//! that shows the fault's condition really arose:
//!
//! 1. one client used from a second tokio runtime stopped the first runtime's renewals;
//! 2. a local handoff whose reply the releaser never saw stalled the key for a ttl;
//! 3. a `release()` cancelled before its script was written released nothing;
//! 4. an expired in-progress idempotency claim was taken over by another payload;
//! 5. an `acquire()` cancelled while its try was in flight left the lock to nobody for
//!    its ttl (the server had run the `SET`);
//! 6. a connection that took longer to make than one command timeout (TLS and the
//!    sentinels' answer on a loaded machine) was begun again, and given up, by every call;
//! 7. a multiplexed connection the server closed while it was idle (`CLIENT KILL`, an
//!    idle `timeout`) failed the calls made after it with "broken pipe";
//! 8. (kept since handlers claim in the caller's task) a handler call dropped while its
//!    claim was in flight must give the claim back;
//! 9. an idempotency call that timed out dropped the runtime's shared connection, so
//!    the calls after it (renewals, busy locks, records) paid its reconnect;
//!
//! and what came with them: `on_lost` for `#[idempotent]`, the eviction-policy warning,
//! `release()` cancelled at every point, and a claim that reaches Redis only after its
//! give-back (the give-back's second try removes it).
use crate::common;
use crate::http;

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::proxy::FaultProxy;
use common::*;
use distlock::{Error, Locks, idempotent};
use redis::AsyncCommands;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Polls `fut` once, with a waker that does nothing: a caller that gives up at its first
/// await.
fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(std::task::Waker::noop()))
}

fn get(url: &str, key: &str) -> Option<String> {
    let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
    redis::cmd("GET").arg(key).query(&mut c).unwrap()
}

// ---------------------------------------------------------------------------------------
// 1. Renewals whatever runtime registers next.
// ---------------------------------------------------------------------------------------

/// One client takes a renewed lock from runtime 1, then another from runtime 2 (as actix
/// workers sharing the default client do); both stay held well past their ttl. Then
/// runtime 1 shuts down while its lock is still held: renewal goes on.
#[test]
fn renewals_go_on_whatever_runtime_registers_next() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = Locks::builder(&url).build().unwrap();
    let ttl = Duration::from_millis(500);
    let (rt1, rt2) = (runtime(), runtime());
    let a = rt1
        .block_on(locks.lock("a").ttl(ttl).renew(true).acquire())
        .unwrap();
    let b = rt2
        .block_on(locks.lock("b").ttl(ttl).renew(true).acquire())
        .unwrap();
    std::thread::sleep(ttl * 4);
    assert!(a.info().is_held() && b.info().is_held());
    assert_eq!(
        get(&url, "lock:a").as_deref(),
        Some(a.token()),
        "a still held"
    );
    assert_eq!(
        get(&url, "lock:b").as_deref(),
        Some(b.token()),
        "b still held"
    );
    drop(rt1); // the runtime a was taken on is gone
    std::thread::sleep(ttl * 3);
    let other = Locks::builder(&url).build().unwrap();
    let stolen = rt2.block_on(other.lock("a").acquire());
    assert!(
        matches!(stolen, Err(Error::Busy { .. })),
        "another client took a: {stolen:?}"
    );
    rt2.block_on(a.release()).unwrap();
    rt2.block_on(b.release()).unwrap();
}

/// Control: the same hold without renewal is lost: the sleeps above do outlast the ttl.
#[test]
fn control_without_renewal_the_lock_expires() {
    let server = RedisServer::start();
    let locks = Locks::builder(server.url()).build().unwrap();
    let rt = runtime();
    let a = rt
        .block_on(locks.lock("a").ttl(Duration::from_millis(500)).acquire())
        .unwrap();
    std::thread::sleep(Duration::from_millis(2000));
    assert_eq!(get(&server.url(), "lock:a"), None);
    assert!(matches!(rt.block_on(a.release()), Err(Error::Lost { .. })));
}

// ---------------------------------------------------------------------------------------
// 2. A handoff that lands after the releaser gave up.
// ---------------------------------------------------------------------------------------

/// The holder releases while a task of the same client waits: the release script hands
/// the lock to the waiter, but every reply is held past the command timeout, so the
/// release (and its retry) fail and the waiter is told to contend. It finds its own
/// token in the key and holds the lock, long before the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_that_finds_its_own_token_holds_the_lock() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let locks = proxy.locks(Duration::from_millis(150));
    let ttl = Duration::from_secs(20);
    // Scripts loaded first: a held NOSCRIPT reply would keep the release from running.
    let warm = locks.lock("warm").acquire().await.unwrap();
    warm.release().await.unwrap();
    let handoff = redis::Script::new(include_str!("../../lockcore/src/scripts/release.lua"));
    let _: String = handoff
        .prepare_invoke()
        .load_async(&mut server.raw().await)
        .await
        .unwrap();
    let holder = locks.lock("k").ttl(ttl).acquire().await.unwrap();
    let handed_token = Arc::new(Mutex::new(None));
    let waiter = tokio::spawn({
        let (locks, handed_token) = (locks.clone(), handed_token.clone());
        async move {
            let started = Instant::now();
            let g = locks
                .lock("k")
                .ttl(ttl)
                .wait(Duration::from_secs(10))
                .acquire()
                .await;
            let took = started.elapsed();
            let g = g.expect("the waiter takes the lock");
            *handed_token.lock().unwrap() = Some(g.token().to_owned());
            let fence = g.fence().await.unwrap();
            g.release().await.unwrap();
            (took, fence)
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await; // the waiter queues locally
    let (fence, holder_token) = (holder.fence().await.unwrap(), holder.token().to_owned());
    proxy.hold_replies();
    let released = holder.release().await;
    assert!(
        matches!(released, Err(Error::Backend { .. })),
        "the releaser saw no reply: {released:?}"
    );
    // The condition of the fault: the script ran, the key holds the waiter's token.
    let mut raw = server.raw().await;
    let held: Option<String> = raw.get("lock:k").await.unwrap();
    assert!(
        held.as_deref()
            .is_some_and(|t| t != holder_token && !t.starts_with("yield")),
        "handed over: {held:?}"
    );
    proxy.release_replies();
    let (took, new_fence) = waiter.await.unwrap();
    assert!(took < Duration::from_secs(5), "stalled: {took:?}");
    assert_eq!(handed_token.lock().unwrap().as_deref(), held.as_deref());
    assert!(new_fence > fence);
}

// ---------------------------------------------------------------------------------------
// 3. `release()` cancelled at any point.
// ---------------------------------------------------------------------------------------

/// `release()` polled once on a runtime with no connection yet, then dropped: cancelled
/// before its script is written (the key is still held right after). The release goes
/// on by itself, long before the 30 s ttl.
#[test]
fn a_release_cancelled_before_it_is_sent_still_releases() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = Locks::builder(&url).build().unwrap();
    let guard = runtime()
        .block_on(locks.lock("k").ttl(Duration::from_secs(30)).acquire())
        .unwrap();
    let token = guard.token().to_owned();
    // A runtime of its own: no connection to reuse, so the first poll waits to connect.
    let fresh = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    fresh.block_on(async {
        let mut release = std::pin::pin!(guard.release());
        assert!(poll_once(release.as_mut()).is_pending());
    });
    assert_eq!(
        get(&url, "lock:k").as_deref(),
        Some(token.as_str()),
        "cancelled before anything was sent"
    );
    let gone = fresh.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if get(&url, "lock:k").is_none() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    });
    assert!(gone, "the cancelled release went on and released the lock");
}

/// `release()` under timeouts from 0 to 3 ms, with a local waiter and another client
/// waiting: whatever point the cancellation lands at, both get the lock in turn, long
/// before the 30 s ttl, and no two hold it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_cancelled_at_every_point_never_strands_the_lock() {
    release_cancelled_at_every_point(true).await;
}

/// The same with only the other client waiting, once its mark is on the value: the
/// holder's release is then uncontended here, so on a server with a native
/// compare-and-delete (Valkey 9, Redis 8.4) it is `DELIFEQ` (or `DELEX`), which answers
/// 0 for the marked value, then `release.lua`, and the cancellation also lands between
/// the two calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_release_cancelled_at_every_point_never_strands_the_lock() {
    release_cancelled_at_every_point(false).await;
}

async fn release_cancelled_at_every_point(local_waiter: bool) {
    let server = RedisServer::start();
    let mut raw = server.raw().await;
    let locks = Locks::connect(&server.url()).await.unwrap();
    let other = Locks::connect(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(30);
    let holding = Arc::new(AtomicU32::new(0));
    let take = |locks: &Locks| {
        let (locks, holding) = (locks.clone(), holding.clone());
        tokio::spawn(async move {
            let g = locks
                .lock("k")
                .ttl(ttl)
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .expect("a waiter gets the lock long before the ttl");
            assert_eq!(holding.fetch_add(1, Ordering::SeqCst), 0, "two holders");
            tokio::time::sleep(Duration::from_millis(1)).await;
            holding.fetch_sub(1, Ordering::SeqCst);
            g.release().await.unwrap();
        })
    };
    for step in 0..30u64 {
        // With a wait: the last step's cancelled release goes on in a task of its own and
        // keeps this client's local turn until its reply is read, which on a loaded
        // machine can come after the other client has taken and released the key.
        let g = locks
            .lock("k")
            .ttl(ttl)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        holding.fetch_add(1, Ordering::SeqCst);
        let local = local_waiter.then(|| take(&locks));
        let remote = take(&other);
        tokio::time::sleep(Duration::from_millis(3)).await;
        if !local_waiter {
            common::wait_for_mark(&mut raw, "lock:k", Duration::from_secs(5)).await;
        }
        holding.fetch_sub(1, Ordering::SeqCst);
        let _ = tokio::time::timeout(Duration::from_micros(step * 100), g.release()).await;
        if let Some(local) = local {
            local.await.unwrap();
        }
        remote.await.unwrap();
    }
    let left: Option<String> = raw.get("lock:k").await.unwrap();
    assert_eq!(left, None);
}

// ---------------------------------------------------------------------------------------
// 4. Taking over an expired claim needs the same payload.
// ---------------------------------------------------------------------------------------

both!(
    an_expired_claim_is_taken_over_only_with_the_same_payload,
    a_takeover_given_up_keeps_the_payload_it_took_over,
);

#[idempotent(key = "refund:<id>", client = locks, lease = "300ms", fingerprint = [id, amount])]
async fn refund(
    locks: &Locks,
    id: u32,
    amount: u64,
    hang: bool,
    fail: bool,
    runs: &Runs,
) -> Result<u64, AppError> {
    runs.bump();
    if hang {
        std::future::pending::<()>().await;
    }
    if fail {
        return Err(AppError::App("declined"));
    }
    Ok(amount)
}

/// Polls `call` until its body has started (`runs` counts it), then leaves it: never
/// polled or dropped again, like a claimer whose process stopped (no renewal, no
/// release).
async fn stop_mid_body<F: Future>(call: F, runs: &Runs) {
    let mut call = Box::pin(call);
    let deadline = Instant::now() + Duration::from_secs(3);
    while runs.get() == 0 {
        assert!(Instant::now() < deadline, "the first body started");
        assert!(poll_once(call.as_mut()).is_pending());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    std::mem::forget(call);
}

/// A call with payload 100 claims and starts its body, then its process stops (the
/// future is never polled or dropped again: no renewal, no release). After its lease,
/// payload 200 under the same key is `PayloadMismatch` and does not run; payload 100
/// takes the claim over and runs.
async fn an_expired_claim_is_taken_over_only_with_the_same_payload(locks: Locks) {
    let runs = Arc::new(Runs::default());
    stop_mid_body(refund(&locks, 1, 100, true, false, &runs), &runs).await;
    let live = refund(&locks, 1, 200, false, false, &runs).await;
    assert!(
        matches!(live, Err(AppError::Lock(Error::PayloadMismatch { .. }))),
        "{live:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await; // past the 300 ms lease
    let other = refund(&locks, 1, 200, false, false, &runs).await;
    assert!(
        matches!(other, Err(AppError::Lock(Error::PayloadMismatch { .. }))),
        "another payload after the lease: {other:?}"
    );
    assert_eq!(runs.get(), 1, "the other payload never ran");
    // Control: the same payload takes the expired claim over and runs.
    assert_eq!(
        refund(&locks, 1, 100, false, false, &runs).await.unwrap(),
        100
    );
    assert_eq!(runs.get(), 2);
}

/// The first claimer (payload 100) stops mid-body; after its lease a retry with the same
/// payload takes the claim over and fails (`Err`: the claim is given up). The record
/// keeps payload 100: the first body may have run with it. Another payload is still
/// `PayloadMismatch` and does not run; payload 100 runs at once (no lease to wait for).
async fn a_takeover_given_up_keeps_the_payload_it_took_over(locks: Locks) {
    let runs = Arc::new(Runs::default());
    stop_mid_body(refund(&locks, 1, 100, true, false, &runs), &runs).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // past the 300 ms lease
    let failed = refund(&locks, 1, 100, false, true, &runs).await;
    assert!(matches!(failed, Err(AppError::App(_))), "{failed:?}");
    assert_eq!(runs.get(), 2, "the takeover ran");
    let other = refund(&locks, 1, 200, false, false, &runs).await;
    assert!(
        matches!(other, Err(AppError::Lock(Error::PayloadMismatch { .. }))),
        "another payload after a takeover was given up: {other:?}"
    );
    assert_eq!(runs.get(), 2, "the other payload never ran");
    let started = Instant::now();
    assert_eq!(
        refund(&locks, 1, 100, false, false, &runs).await.unwrap(),
        100
    );
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "no lease to wait for"
    );
    assert_eq!(runs.get(), 3);
}

#[idempotent(key = "quick:<id>", client = locks, lease = "300ms", skip = [runs])]
async fn quick(locks: &Locks, id: u32, runs: &Runs) -> Result<u32, AppError> {
    runs.bump();
    tokio::time::sleep(Duration::from_millis(60)).await; // shorter than a renewal period
    Ok(id)
}

/// A claim taken over while its body runs (before any renewal could see it), whose
/// taker has not stored a result: this call's result is stored first and kept (the
/// store appends; the first result is the one repeats get). Control: a result another
/// call stored first makes the store return `Lost`, and the stored result stays. A key
/// gone meanwhile is written whole, with a ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_after_a_takeover_keeps_the_first_result() {
    #[derive(PartialEq)]
    enum Meanwhile {
        TakenOver,
        OtherStoredFirst,
        KeyGone,
    }
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let runs = Arc::new(Runs::default());
    for (id, meanwhile) in [
        (1u32, Meanwhile::TakenOver),
        (2, Meanwhile::OtherStoredFirst),
        (3, Meanwhile::KeyGone),
    ] {
        let call = tokio::spawn({
            let (locks, runs) = (locks.clone(), runs.clone());
            async move { quick(&locks, id, &runs).await }
        });
        while runs.get() < id {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let keys: Vec<String> = raw.keys(format!("*idem:*quick:{id}")).await.unwrap();
        let rec: String = raw.get(&keys[0]).await.unwrap();
        let mut taken = rec.replacen("\"owner\":\"", "\"owner\":\"someone-else-", 1);
        assert_ne!(rec, taken);
        if meanwhile == Meanwhile::OtherStoredFirst {
            let fp = taken
                .split("\"fp\":\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            taken.push_str(&format!(
                r#"{{"status":"completed","fp":"{fp}","completed_at_ms":1,"value":77}}"#
            ));
        }
        if meanwhile == Meanwhile::KeyGone {
            taken.clear();
            let _: () = raw.del(&keys[0]).await.unwrap();
        } else {
            let _: () = raw.set(&keys[0], &taken).await.unwrap();
        }
        let out = call.await.unwrap();
        let after: String = raw.get(&keys[0]).await.unwrap();
        assert!(after.starts_with(&taken), "nothing written over: {after}");
        match meanwhile {
            Meanwhile::OtherStoredFirst => assert!(
                matches!(out, Err(AppError::Lock(Error::Lost { .. }))),
                "{out:?}"
            ),
            Meanwhile::TakenOver => {
                assert_eq!(out.unwrap(), id);
                assert!(after.len() > taken.len(), "the result appended: {after}");
            }
            Meanwhile::KeyGone => {
                assert_eq!(out.unwrap(), id);
                assert!(after.starts_with(r#"{"status":"completed""#), "{after}");
                let ttl: i64 = raw.pttl(&keys[0]).await.unwrap();
                assert!(ttl > 0, "written with a ttl: {ttl}");
            }
        }
        // A repeat gets the first result in the value.
        let before = runs.get();
        let replay = quick(&locks, id, &runs).await.unwrap();
        let first = if meanwhile == Meanwhile::OtherStoredFirst {
            77
        } else {
            id
        };
        assert_eq!(replay, first);
        assert_eq!(runs.get(), before, "a repeat replays");
    }
}

#[idempotent(key = "charge:<id>", client = locks, lease = "300ms", fingerprint = [id, amount])]
async fn charge(
    locks: &Locks,
    id: u32,
    amount: u64,
    body_ms: u64,
    runs: &Runs,
) -> Result<u64, AppError> {
    runs.bump();
    tokio::time::sleep(Duration::from_millis(body_ms)).await;
    Ok(amount)
}

/// The record is lost while a body runs (a failover, an eviction, a `FLUSHDB`), and a
/// call with another payload claims the key anew and runs. The first call's result
/// lands on that claim: it is not stored (`Lost`), the new claim keeps its record and
/// stores its own result, and the first payload then gets `PayloadMismatch`. (The first
/// body is shorter than a renewal period: its store is what meets the new claim.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_for_a_key_claimed_again_by_another_payload_is_not_stored() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let runs = Arc::new(Runs::default());
    let first = tokio::spawn({
        let (locks, runs) = (locks.clone(), runs.clone());
        async move { charge(&locks, 1, 10, 80, &runs).await }
    });
    while runs.get() < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let keys: Vec<String> = raw.keys("*idem:*charge:1").await.unwrap();
    let _: () = raw.del(&keys[0]).await.unwrap();
    let second = tokio::spawn({
        let (locks, runs) = (locks.clone(), runs.clone());
        async move { charge(&locks, 1, 20, 400, &runs).await }
    });
    let out = first.await.unwrap();
    assert!(
        matches!(out, Err(AppError::Lock(Error::Lost { .. }))),
        "{out:?}"
    );
    assert_eq!(
        runs.get(),
        2,
        "the second payload ran while the first stored"
    );
    let value: String = raw.get(&keys[0]).await.unwrap();
    assert!(
        !value.contains(r#""value":10"#),
        "the first result taken out again: {value}"
    );
    assert_eq!(second.await.unwrap().unwrap(), 20);
    assert_eq!(
        charge(&locks, 1, 20, 0, &runs).await.unwrap(),
        20,
        "replayed"
    );
    let again = charge(&locks, 1, 10, 0, &runs).await;
    assert!(
        matches!(again, Err(AppError::Lock(Error::PayloadMismatch { .. }))),
        "{again:?}"
    );
    assert_eq!(runs.get(), 2);
}

// ---------------------------------------------------------------------------------------
// `on_lost` for `#[idempotent]`.
// ---------------------------------------------------------------------------------------

#[idempotent(key = "job:<id>", client = locks, lease = "300ms", skip = [runs, ends])]
async fn job_cancelled(locks: &Locks, id: u32, runs: &Runs, ends: &Runs) -> Result<u32, AppError> {
    runs.bump();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ends.bump();
    Ok(id)
}

#[idempotent(key = "job:<id>", client = locks, lease = "300ms", on_lost = "continue", skip = [runs, ends])]
async fn job_continued(locks: &Locks, id: u32, runs: &Runs, ends: &Runs) -> Result<u32, AppError> {
    runs.bump();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ends.bump();
    Ok(id)
}

/// Writes over the record at `*idem*job:<id>` what a takeover writes: the same payload,
/// another owner, a fresh lease.
async fn take_over(server: &RedisServer, id: u32) -> String {
    let mut raw = server.raw().await;
    let keys: Vec<String> = raw.keys(format!("*idem:*job:{id}")).await.unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let rec: String = raw.get(&keys[0]).await.unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&rec).unwrap();
    assert_eq!(v["status"], "in_progress");
    v["owner"] = "someone-else".into();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    v["lease_until_ms"] = (now + 60_000).into();
    let _: () = raw.set(&keys[0], v.to_string()).await.unwrap();
    keys[0].clone()
}

async fn lost_claim(cancel: bool) {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let (runs, ends) = (Arc::new(Runs::default()), Arc::new(Runs::default()));
    let call = tokio::spawn({
        let (locks, runs, ends) = (locks.clone(), runs.clone(), ends.clone());
        async move {
            let started = Instant::now();
            let out = if cancel {
                job_cancelled(&locks, 1, &runs, &ends).await
            } else {
                job_continued(&locks, 1, &runs, &ends).await
            };
            (out, started.elapsed())
        }
    });
    while runs.get() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let key = take_over(&server, 1).await;
    let (out, took) = call.await.unwrap();
    assert!(
        matches!(out, Err(AppError::Lock(Error::Lost { .. }))),
        "{out:?}"
    );
    if cancel {
        assert_eq!(ends.get(), 0, "the body was cancelled");
        assert!(
            took < Duration::from_millis(1000),
            "cancelled at once: {took:?}"
        );
    } else {
        assert_eq!(ends.get(), 1, "the body ran to its end");
    }
    // Nothing stored from the lost claim: the record is still the takeover's.
    let mut raw = server.raw().await;
    let rec: String = raw.get(&key).await.unwrap();
    assert!(
        rec.contains("someone-else") && rec.contains("in_progress"),
        "{rec}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claim_cancels_its_body_by_default() {
    lost_claim(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claim_with_continue_finishes_its_body_and_stores_nothing() {
    lost_claim(false).await;
}

// ---------------------------------------------------------------------------------------
// The eviction-policy warning.
// ---------------------------------------------------------------------------------------

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a client logs (target `distlock`) around its first lock on a server started with
/// `policy`.
fn logs_with_policy(policy: &str) -> String {
    let server = RedisServer::start_with(&["--maxmemory-policy", policy]);
    let out = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let out = out.clone();
            move || out.clone()
        })
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .with_ansi(false)
        .finish();
    let _default = tracing_subscriber::util::SubscriberInitExt::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let locks = Locks::builder(server.url()).build().unwrap();
        let g = locks.lock("k").acquire().await.unwrap();
        g.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    });
    String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
}

#[test]
fn an_evicting_policy_is_warned_about_once() {
    if least_privilege() {
        // `CONFIG GET` is refused: the client says once that the policy is unchecked,
        // whatever it is.
        for policy in ["allkeys-lru", "noeviction"] {
            let logs = logs_with_policy(policy);
            assert_eq!(
                logs.matches("cannot read redis maxmemory-policy").count(),
                1,
                "{policy}: {logs}"
            );
        }
        return;
    }
    for policy in ["allkeys-lru", "volatile-lru"] {
        let logs = logs_with_policy(policy);
        assert_eq!(
            logs.matches("may evict keys under memory pressure").count(),
            1,
            "{policy}: {logs}"
        );
    }
    // Control: the default policy evicts nothing, and says nothing.
    let logs = logs_with_policy("noeviction");
    assert!(!logs.contains("may evict"), "{logs}");
}

// ---------------------------------------------------------------------------------------
// A result being stored when its runtime shuts down.
// ---------------------------------------------------------------------------------------

#[idempotent(key = "shutdown:<id>", client = locks, lease = "1s", skip = [delay_ms])]
async fn stored_at_shutdown(locks: Locks, id: u32, delay_ms: u64) -> Result<u32, AppError> {
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    Ok(id)
}

/// The runtime shuts down while a result is being stored (the store stalled on its way
/// to Redis). The store, resumed in a task of its own when the first was dropped, is
/// dropped with the runtime and not resumed again (it used to be resumed without end,
/// until the stack overflowed and the process aborted). The claim ends with its lease,
/// and then a call takes it over.
#[test]
fn a_store_cut_by_runtime_shutdown_ends_with_its_lease() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let locks = proxy.locks(Duration::from_secs(30));
    // Scripts loaded and the connection made before the fault.
    assert_eq!(
        rt.block_on(stored_at_shutdown(locks.clone(), 0, 0))
            .unwrap(),
        0
    );
    rt.spawn(stored_at_shutdown(locks.clone(), 1, 300));
    std::thread::sleep(Duration::from_millis(150)); // claimed; the body runs
    proxy.stall(common::proxy::Dir::ToServer, true);
    std::thread::sleep(Duration::from_millis(400)); // the store is written, and waits
    rt.shutdown_timeout(Duration::from_secs(1));
    proxy.reset_all(); // the stalled store never reaches Redis
    proxy.stall(common::proxy::Dir::ToServer, false);
    let check = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    check.block_on(async {
        let mut raw = server.raw().await;
        let record: String = raw
            .get("lock:idem:suite::hardening::stored_at_shutdown:shutdown:1")
            .await
            .unwrap();
        assert!(record.contains("in_progress"), "{record}");
        let locks = Locks::connect(&server.url()).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match stored_at_shutdown(locks.clone(), 1, 0).await {
                Ok(v) => break assert_eq!(v, 1),
                Err(AppError::Lock(Error::InProgress { .. })) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("{e:?}"),
            }
        }
    });
}

// ---------------------------------------------------------------------------------------
// The claim's lease read from the key's ttl.
// ---------------------------------------------------------------------------------------

#[idempotent(key = "ship:<id>", client = locks, lease = "30s", ttl = "24h", wait = "5s", skip = [delay_ms, runs])]
async fn ship(locks: Locks, id: u32, delay_ms: u64, runs: Arc<Runs>) -> Result<u32, AppError> {
    let n = runs.bump();
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    Ok(n)
}

/// A claim written by a caller with a shorter retention (another version of the service,
/// `ttl = "1h"`) is judged by the retention it was written with: a repeat whose own
/// retention is 24 h sees it in progress, and does not take it over while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_judged_by_the_retention_it_was_written_with() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let runs = Arc::new(Runs::default());
    let first = tokio::spawn(ship(locks.clone(), 1, 1_000, runs.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let key = "lock:idem:suite::hardening::ship:ship:1";
    let mut raw = server.raw().await;
    let record: String = raw.get(key).await.unwrap();
    // As a writer with a 1 h retention would have left it: its lease still runs.
    let shorter = record.replace("\"retention_ms\":86400000", "\"retention_ms\":3600000");
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(&shorter)
        .arg("PX")
        .arg(3_600_000 + 29_000)
        .query_async(&mut raw)
        .await
        .unwrap();
    let repeat = ship(locks.clone(), 1, 0, runs.clone()).await;
    assert_eq!(repeat.unwrap(), 1, "waited for the first call's result");
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(runs.get(), 1, "the body ran once");
}

/// A holder id with a character JSON may escape (`/` as `\/`): once a waiting repeat has
/// rewritten the record (marking it waited), the claimer still renews and completes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_spelled_with_escapes_still_completes() {
    let server = RedisServer::start();
    let locks = Locks::builder(server.url())
        .holder_id("orders/api-1")
        .connect()
        .await
        .unwrap();
    let runs = Arc::new(Runs::default());
    let (first, repeat) = tokio::join!(ship(locks.clone(), 2, 500, runs.clone()), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        ship(locks.clone(), 2, 0, runs.clone()).await
    });
    assert_eq!(first.unwrap(), 1);
    assert_eq!(
        repeat.unwrap(),
        1,
        "the waiting repeat gets the first result"
    );
    assert_eq!(runs.get(), 1);
}

/// Id [`FAILS`] fails, which gives its claim back; any other runs.
#[idempotent(key = "late:<id>", client = locks, lease = "5s", skip = [runs])]
async fn late_claim(locks: Locks, id: u32, runs: Arc<Runs>) -> Result<u32, AppError> {
    if id == FAILS {
        return Err(AppError::App("an error gives the claim back"));
    }
    Ok(runs.bump())
}

const FAILS: u32 = 99;

/// The claim's `SET ... NX GET` runs, but its reply is held past the 150 ms command
/// timeout: the call (in a task of its own) returns `Backend` without running the body,
/// and gives the claim that landed back. Once replies flow, the retry claims the key at
/// once (not after the 5 s lease) and runs the body, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_reply_comes_late_is_given_back() {
    let (server, proxy, locks, runs) = late_claim_setup(Duration::from_millis(150)).await;
    proxy.hold_replies();
    let e = late_claim(locks.clone(), 1, runs.clone()).await;
    assert!(
        matches!(e, Err(AppError::Lock(Error::Backend { .. }))),
        "{e:?}"
    );
    let mut raw = server.raw().await;
    let landed: Option<String> = raw
        .get("lock:idem:suite::hardening::late_claim:late:1")
        .await
        .unwrap();
    assert!(
        landed.as_deref().is_some_and(|r| r.contains("in_progress")),
        "the claim ran in Redis: {landed:?}"
    );
    proxy.release_replies();
    retry_runs_it_within_3s(&locks, &runs, Instant::now()).await;
}

/// The claim's `SET` itself is held on its way to Redis past the 600 ms command timeout:
/// the call returns `Backend`, and its give-back (on another connection) runs first and
/// finds nothing. The held `SET` then lands, after the give-back: the claim is in Redis
/// with nobody to release it. The give-back's second try, a command timeout after the
/// first, removes it: a retry claims the key long before the 5 s lease ends, and runs the
/// body once. (Checked by hand: with the second try left out, the retry gets
/// `InProgress` until the lease ends, and the test fails on "not given back".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_reaches_redis_after_its_give_back_is_given_back_again() {
    let (server, proxy, locks, runs) = late_claim_setup(Duration::from_millis(600)).await;
    let mut raw = server.raw().await;
    let releases_before = commandstat_calls(&mut raw, "evalsha").await;
    let key = "lock:idem:suite::hardening::late_claim:late:1";
    // The claim's `SET` of the key, and nothing else (the give-back is a script).
    let claim = format!("SET\r\n${}\r\n{key}", key.len());
    proxy.hold_commands_containing(Some(claim.as_bytes()));
    let e = late_claim(locks.clone(), 1, runs.clone()).await;
    assert!(
        matches!(e, Err(AppError::Lock(Error::Backend { .. }))),
        "{e:?}"
    );
    // The first give-back reaches Redis while the claim is still held in the proxy.
    let deadline = Instant::now() + Duration::from_secs(5);
    while commandstat_calls(&mut raw, "evalsha").await == releases_before {
        assert!(Instant::now() < deadline, "no give-back was sent");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let absent: Option<String> = raw.get(key).await.unwrap();
    assert_eq!(absent, None, "the claim had not reached Redis yet");
    // The fault's condition: the claim lands after its give-back.
    proxy.hold_commands_containing(None);
    let landed = Instant::now();
    // Well before the second try, 600 ms after the first.
    wait_for_claim(&mut raw, key, landed, Duration::from_millis(500)).await;
    retry_runs_it_within_3s(&locks, &runs, landed).await;
}

/// A server, a fault proxy before it, a client through the proxy whose calls time out
/// after `timeout`, and `late_claim` called twice: once to run (id 0), so that its
/// connections are made, and once to fail, so that the release script is loaded (a
/// give-back is then one `EVALSHA`, not a refused one and a load first).
async fn late_claim_setup(timeout: Duration) -> (RedisServer, FaultProxy, Locks, Arc<Runs>) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let locks = proxy.locks(timeout);
    let runs = Arc::new(Runs::default());
    assert_eq!(late_claim(locks.clone(), 0, runs.clone()).await.unwrap(), 1);
    let failed = late_claim(locks.clone(), FAILS, runs.clone()).await;
    assert!(matches!(failed, Err(AppError::App(_))), "{failed:?}");
    (server, proxy, locks, runs)
}

/// Retries `late_claim` of id 1 while it is `InProgress`: it must run the body (the
/// second run, after the warm-up) within 3 s of `from`, long before the claim's 5 s
/// lease ends; the claim given back never ran it.
async fn retry_runs_it_within_3s(locks: &Locks, runs: &Arc<Runs>, from: Instant) {
    let again = retry_while_in_progress(
        || late_claim(locks.clone(), 1, runs.clone()),
        from,
        Duration::from_secs(3),
    )
    .await;
    assert_eq!(again.unwrap(), 2, "the retry ran the body");
    assert!(from.elapsed() < Duration::from_secs(3));
    assert_eq!(
        runs.get(),
        2,
        "the warm-up and the retry; the claim given back never ran it"
    );
}

/// 5. The try reaches the server and its reply is held; the caller gives up; its
/// clean-up is held back until the check that the key holds the cancelled try's token
/// (the fault's condition). Then the lock is free long before its 30 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cancelled_with_its_try_in_flight_gives_the_lock_back() {
    use common::proxy::Dir;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let locks = proxy.locks(Duration::from_secs(2));
    let other = Locks::connect(&server.url()).await.unwrap();
    // Connections made (the try then needs no handshake through the held replies).
    cycles(&locks, "in-flight", 1).await;
    proxy.hold_replies();
    let cancelled = tokio::time::timeout(
        Duration::from_millis(300),
        locks
            .lock("in-flight")
            .ttl(Duration::from_secs(30))
            .acquire(),
    );
    let stall = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        proxy.stall(Dir::ToServer, true);
    };
    let (cancelled, ()) = tokio::join!(cancelled, stall);
    assert!(cancelled.is_err(), "the caller gave up");
    let held = get(&server.url(), "lock:in-flight");
    assert!(held.is_some(), "the cancelled try's SET ran on the server");
    proxy.stall(Dir::ToServer, false);
    proxy.release_replies();
    let took = time_to_take(&other, "in-flight", Duration::from_secs(10)).await;
    assert!(took < Duration::from_secs(5), "free after {took:?}");
}

/// 6. Every reply takes 300 ms through the proxy and calls time out after 500 ms: making
/// a connection (its handshake, then reading what the server has) takes longer than one
/// call may wait, so the first call fails with a timeout (the fault's condition), and so
/// does a call cancelled at its first await. The connection goes on being made in the
/// background: later calls use it (direct connections too are opened in the background,
/// never within a call). `connect()` waits for it within the connect timeout. Before
/// this, none of the 10 calls worked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_slower_than_one_call_is_still_made() {
    use common::proxy::Dir;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    proxy.set_latency(Dir::ToClient, Duration::from_millis(300));
    let timeout = Duration::from_millis(500);
    // Scripts loaded first (a call that met NOSCRIPT would take two round trips).
    cycles(&Locks::connect(&server.url()).await.unwrap(), "slow", 1).await;

    let locks = proxy.locks(timeout);
    {
        let mut cancelled = std::pin::pin!(locks.lock("slow").acquire());
        assert!(
            poll_once(cancelled.as_mut()).is_pending(),
            "cancelled first"
        );
    }
    let first = locks.lock("slow").acquire().await;
    assert!(
        matches!(&first, Err(Error::Backend { source, .. }) if source.kind() == distlock::BackendErrorKind::Timeout),
        "the first call gave up: {first:?}"
    );
    let mut worked = 0;
    for _ in 0..10 {
        match locks.lock("slow").acquire().await {
            Ok(g) => worked += u32::from(g.release().await.is_ok()),
            Err(e) => eprintln!("{e}"),
        }
    }
    assert!(worked >= 5, "{worked} of 10 calls worked once connected");

    let connected = Locks::builder(proxy.url())
        .command_timeout(timeout)
        .connect()
        .await
        .unwrap();
    let g = connected.lock("slow").acquire().await.unwrap();
    g.release().await.unwrap();
}

/// 7. Every connection of the client is closed by the server while idle (`CLIENT KILL`,
/// as an idle cut by the server's `timeout` or a load balancer does): calls made after
/// that, many at once (so that most go over the multiplexed connection rather than the
/// direct ones), work: a closed connection is never used again. The kill's effect is
/// checked: the client's connections were there, and were closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_closed_by_the_server_are_not_used_again() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut admin = server.raw().await;
    for round in 0..3 {
        // Connections made: the multiplexed one and direct ones.
        let warm: Vec<_> = (0..8)
            .map(|i| {
                let locks = locks.clone();
                tokio::spawn(async move { cycles(&locks, &format!("warm-{i}"), 3).await })
            })
            .collect();
        for w in warm {
            w.await.unwrap();
        }
        let killed: i64 = redis::cmd("CLIENT")
            .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(
            killed >= 2,
            "round {round}: the client's connections were killed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let calls: Vec<_> = (0..16)
            .map(|i| {
                let locks = locks.clone();
                tokio::spawn(async move {
                    let g = locks.lock(format!("after-{i}")).acquire().await?;
                    g.release().await
                })
            })
            .collect();
        for (i, c) in calls.into_iter().enumerate() {
            let r = c.await.unwrap();
            assert!(r.is_ok(), "round {round}, call {i}: {r:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// 8. A handler call dropped while its claim is in flight.
// ---------------------------------------------------------------------------------------

#[idempotent(header = "Idempotency-Key", scope = "hardening", client = app.locks, lease = "5s")]
async fn claim_in_flight(
    axum::extract::State(app): axum::extract::State<CountingApp>,
    body: String,
) -> String {
    format!("run {} of {}", app.runs.bump(), body.len())
}

/// An axum handler claims in the caller's task. Its claim's `SET ... NX GET` runs, but
/// the reply is held, and a 500 ms timeout layer drops the call: the body has not run,
/// so the claim is given back (not completed: with the whole call in a task, as before,
/// the dropped call would go on and store its own result). Once replies flow, the retry
/// claims the key at once (not after the 5 s lease) and runs the body, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_dropped_while_its_claim_is_in_flight_gives_it_back() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let (addr, serving, runs) = serve_counting(
        proxy.locks(Duration::from_secs(2)),
        "/claim",
        claim_in_flight,
        Duration::from_millis(500),
    )
    .await;
    let warm = http::post(addr, "/claim", Some("warm"), "{}").await;
    assert_eq!(warm.status, 200, "{}", warm.text());
    let mut raw = server.raw().await;
    let sets = commandstat_calls(&mut raw, "set").await;
    proxy.hold_replies();
    let dropped = http::post(addr, "/claim", Some("k"), "{}").await;
    assert_eq!(dropped.status, 504, "{}", dropped.text());
    assert_eq!(
        commandstat_calls(&mut raw, "set").await,
        sets + 1,
        "the claim ran in Redis"
    );
    proxy.release_replies();
    let record = "lock:idem:suite::hardening::claim_in_flight:hardening:k";
    let started = Instant::now();
    loop {
        let now: Option<String> = raw.get(record).await.unwrap();
        let Some(now) = now else { break };
        assert!(
            !now.contains("completed"),
            "the dropped call went on and stored its result: {now}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "not given back: {now}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(runs.get(), 1, "the dropped call never ran the body");
    let again = http::post(addr, "/claim", Some("k"), "{}").await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.text(), "run 2 of 2", "the retry ran the body");
    assert_eq!(runs.get(), 2, "the warm-up and the retry");
    serving.abort();
}

#[idempotent(key = "stalled:<id>", client = locks)]
async fn stalled_record(locks: &Locks, id: u32) -> Result<u32, Error> {
    Ok(id)
}

/// Idempotency calls, and the renewals of a lock, over the connection a client's runtime
/// shares, made before and after a call that ran out of its command timeout (1 s).
async fn calls_around(locks: &Locks, from: u32) -> Result<(), Error> {
    for id in from..from + 5 {
        assert_eq!(stalled_record(locks, id).await?, id);
    }
    let g = locks
        .lock("stalled")
        .ttl(Duration::from_millis(1200))
        .renew(true)
        .acquire()
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(g.info().is_held(), "renewed");
    g.release().await
}

/// An idempotency call that times out (the server stalled 1.3 s by `DEBUG SLEEP`,
/// command timeout 1 s) leaves the runtime's shared connection in place: its late
/// reply is dropped, not read as another call's, and the connection answers its check
/// (a `PING`, within half the command timeout) after the stall. The idempotency calls and the renewals after it open no connection
/// (the timeout used to drop the shared connection: they paid its reconnect, 1 new
/// connection). Control: the call did time out; and a connection that answers no
/// `PING` either (the server stopped by SIGSTOP past the timeout and the check) is
/// replaced: the calls after it open a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_call_keeps_the_shared_connection_that_still_answers() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let locks = Locks::builder(server.url())
        .command_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    // No response timeout of its own: the stall outlasts redis-rs's default.
    let mut admin = redis::Client::open(server.admin_url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new().set_response_timeout(None),
        )
        .await
        .unwrap();
    calls_around(&locks, 0).await.unwrap();
    // The count includes the connection that reads it (`INFO`).
    let before = testkit::connections_received(server.port);
    let stall = tokio::spawn(async move {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("1.3")
            .query_async::<()>(&mut admin)
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let timed_out = stalled_record(&locks, 100).await;
    stall.await.unwrap().unwrap();
    calls_around(&locks, 10).await.unwrap();
    let made = testkit::connections_received(server.port) - before - 1;
    eprintln!("after a call that timed out in a 1.3 s stall: {made} new connections");
    assert!(
        matches!(&timed_out, Err(Error::Backend { source, .. }) if source.kind() == distlock::BackendErrorKind::Timeout),
        "control: the call timed out: {timed_out:?}"
    );
    assert_eq!(made, 0, "the shared connection was kept");
    // The control: a connection that answers nothing is replaced.
    let before = testkit::connections_received(server.port);
    server.signal("STOP");
    let hung = stalled_record(&locks, 200).await;
    // Past the check (half the command timeout after the call's).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    server.signal("CONT");
    calls_around(&locks, 20).await.unwrap();
    let made = testkit::connections_received(server.port) - before - 1;
    eprintln!("after a call that timed out on a stopped server: {made} new connections");
    assert!(hung.is_err(), "control: the server was stopped");
    assert!(
        made >= 1,
        "control: a connection that answered no PING is replaced"
    );
}
