//! Lock semantics, run against a real redis-server and against the in-memory backend.
//!
//! Each check is an `async fn(Locks)`; `both!` makes one test per backend: busy, wait and
//! its deadline, fencing, tokens, expiry and theft reported as `Lost`, every exit path,
//! panic and cancellation releasing long before the ttl, escaping.
//!
//! Then faults on Redis alone: Redis killed and restarted (errors within the timeout, then
//! scripts reloaded), paused (a timeout, not a hang), unreachable; a call that timed out
//! never leaves its late reply to the next call (control: a reused raw connection does
//! read it); a connection Redis closed for idleness is not used (control: a plain one
//! fails); a `unix://` URL; password, ACL user and database taken from the URL (control:
//! refused without them).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use distlock::{Error, Locks, distributed_lock};

both!(
    busy_fails_fast_and_body_does_not_run,
    wait_takes_the_lock_once_released,
    wait_deadline_is_respected,
    fence_grows_with_every_acquisition,
    a_paused_holder_gets_a_smaller_fence_or_lost,
    a_handed_lock_asks_for_its_own_fence,
    token_is_uuid_plus_holder,
    expired_lock_reports_lost,
    stolen_lock_reports_lost_and_body_error_wins,
    every_exit_path_releases,
    panic_releases,
    cancelled_future_releases_at_once,
    current_lock_is_task_local,
    placeholders_are_escaped,
    distinct_keys_do_not_contend,
);

#[distributed_lock(key = "job:<id>", ttl = "10s", client = locks)]
async fn hold(locks: &Locks, id: u32, for_ms: u64, ran: &AtomicU32) -> Result<u64, AppError> {
    ran.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(for_ms)).await;
    Ok(distlock::current_lock().unwrap().fence().await?)
}

fn lock_err(r: Result<impl std::fmt::Debug, AppError>) -> Error {
    match r {
        Err(AppError::Lock(e)) => e,
        other => panic!("expected a lock error, got {other:?}"),
    }
}

async fn busy_fails_fast_and_body_does_not_run(locks: Locks) {
    let guard = locks.lock("job:1").acquire().await.unwrap();
    let ran = AtomicU32::new(0);
    let started = Instant::now();
    let e = lock_err(hold(&locks, 1, 0, &ran).await);
    assert!(
        matches!(&e, Error::Busy { key, .. } if key == "lock:job:1"),
        "{e:?}"
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the body must not run when busy"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "wait defaults to zero"
    );
    guard.release().await.unwrap();
    assert!(hold(&locks, 1, 0, &ran).await.is_ok());
}

#[distributed_lock(key = "job:<id>", ttl = "10s", wait = "5s", client = locks)]
async fn hold_waiting(locks: &Locks, id: u32) -> Result<u64, AppError> {
    Ok(distlock::current_lock().unwrap().fence().await?)
}

async fn wait_takes_the_lock_once_released(locks: Locks) {
    let guard = locks.lock("job:2").acquire().await.unwrap();
    let first = guard.fence().await.unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move { hold_waiting(&locks, 2).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter must wait while the lock is held"
    );
    let released = Instant::now();
    guard.release().await.unwrap();
    let fence = waiter.await.unwrap().unwrap();
    assert!(fence > first);
    // Bound with a wide margin: far below the 5 s wait, far above the backoff cap.
    assert!(released.elapsed() < Duration::from_millis(500));
}

async fn wait_deadline_is_respected(locks: Locks) {
    let _guard = locks.lock("dl").acquire().await.unwrap();
    let started = Instant::now();
    let e = locks
        .lock("dl")
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(e, Error::Busy { waited, .. } if waited >= Duration::from_millis(300)));
    assert!(
        took >= Duration::from_millis(300),
        "gave up early: {took:?}"
    );
    assert!(
        took < Duration::from_millis(800),
        "overshot the deadline: {took:?}"
    );
}

async fn fence_grows_with_every_acquisition(locks: Locks) {
    let mut last = 0;
    for _ in 0..5 {
        let g = locks.lock("fenced").acquire().await.unwrap();
        let fence = g.fence().await.unwrap();
        assert!(fence > last);
        assert_eq!(g.fence().await.unwrap(), fence, "one fence per acquisition");
        assert_eq!(g.info().cached_fence(), Some(fence));
        last = fence;
        g.release().await.unwrap();
    }
    // An acquisition that never asks takes no number: the counter still holds the last
    // fence given (fences follow the clock, so the next is not `last + 1`).
    let quiet = locks.lock("fenced").acquire().await.unwrap();
    assert_eq!(quiet.info().cached_fence(), None);
    quiet.release().await.unwrap();
    assert_eq!(
        locks.inspect("fenced").await.unwrap().last_fence,
        last,
        "no number taken unasked"
    );
    let g = locks.lock("fenced").acquire().await.unwrap();
    let last_fenced = g.fence().await.unwrap();
    assert!(last_fenced > last);
    g.release().await.unwrap();
    // A name's first fence starts from the clock (microseconds since the epoch), so a
    // counter made afresh never gives a fence an earlier counter of the name gave.
    let before = micros_now();
    let other = locks.lock("other-key").acquire().await.unwrap();
    let first = other.fence().await.unwrap();
    assert!(
        first > before - 5_000_000,
        "{first} from the clock ({before})"
    );
    assert!(first < micros_now() + 5_000_000, "{first} from the clock");
    other.release().await.unwrap();
    assert_eq!(
        locks.inspect("fenced").await.unwrap().last_fence,
        last_fenced,
        "fences count per key"
    );
    let asked = micros_now();
    let again = locks.lock("other-key").acquire().await.unwrap();
    let next = again.fence().await.unwrap();
    assert!(next > first);
    // Every fence follows the clock: at least the clock when it was asked for (1 ms
    // allowed for the two readings of the one clock).
    assert!(next + 1_000 >= asked, "{next} below the clock ({asked})");
    again.release().await.unwrap();
}

/// Microseconds since the epoch by this machine's clock (the server's is the same here).
fn micros_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// A holder paused past its ttl while another holder took the lock: it either got its
/// fence before (smaller than the next holder's) or gets `Lost` when it asks, and once
/// its lease has ended it gets `Lost` even where it had a number. Control: the fence
/// asked for while still held is the smaller one.
async fn a_paused_holder_gets_a_smaller_fence_or_lost(locks: Locks) {
    let ttl = Duration::from_millis(100);
    let early = locks.lock("paused").ttl(ttl).acquire().await.unwrap();
    let asked_in_time = early.fence().await.unwrap();
    let late = locks.lock("paused-late").ttl(ttl).acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await; // both leases run out
    let next = locks.lock("paused").acquire().await.unwrap();
    let next_late = locks.lock("paused-late").acquire().await.unwrap();
    let next_fence = next.fence().await.unwrap();
    assert!(asked_in_time < next_fence, "{asked_in_time} < {next_fence}");
    // Its lease has ended: the number cached while it ran vouches for nothing now.
    assert!(matches!(early.fence().await, Err(Error::Lost { .. })));
    let e = late.fence().await.unwrap_err();
    assert!(
        matches!(&e, Error::Lost { key } if key == "lock:paused-late"),
        "{e:?}"
    );
    // The next holder's fence is fine whatever the stale holder's failed ask consumed.
    assert!(next_late.fence().await.unwrap() >= 1);
    for g in [early, late] {
        assert!(matches!(g.release().await, Err(Error::Lost { .. })));
    }
    next.release().await.unwrap();
    next_late.release().await.unwrap();
}

/// A lock handed to the next local waiter has no fence until it asks; its fence is
/// larger than the previous holder's.
async fn a_handed_lock_asks_for_its_own_fence(locks: Locks) {
    let holder = locks.lock("handed").acquire().await.unwrap();
    let first = holder.fence().await.unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            let g = locks
                .lock("handed")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .unwrap();
            let unasked = g.info().cached_fence();
            let fence = g.fence().await.unwrap();
            g.release().await.unwrap();
            (unasked, fence)
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    holder.release().await.unwrap();
    let (unasked, fence) = waiter.await.unwrap();
    assert_eq!(unasked, None);
    assert!(fence > first);
}

async fn token_is_uuid_plus_holder(locks: Locks) {
    let g = locks.lock("tok").acquire().await.unwrap();
    let token = g.token().to_owned();
    let (uuid, holder) = token.split_once(':').unwrap();
    assert_eq!(uuid.len(), 36);
    assert_eq!(holder, locks.holder_id());
    assert!(holder.ends_with(&format!(":{}", std::process::id())));
    let g2 = {
        g.release().await.unwrap();
        locks.lock("tok").acquire().await.unwrap()
    };
    assert_ne!(
        g2.token()[..36],
        uuid[..],
        "every acquisition gets a fresh token"
    );
    g2.release().await.unwrap();
}

async fn expired_lock_reports_lost(locks: Locks) {
    let g = locks
        .lock("short")
        .ttl(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let e = g.release().await.unwrap_err();
    assert!(
        matches!(&e, Error::Lost { key } if key == "lock:short"),
        "{e:?}"
    );
}

#[distributed_lock(key = "stolen", ttl = "100ms", client = locks)]
async fn outlives_ttl(locks: &Locks, fail: bool, fence_seen: &AtomicU64) -> Result<(), AppError> {
    fence_seen.store(
        distlock::current_lock().unwrap().fence().await?,
        Ordering::SeqCst,
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    if fail {
        return Err(AppError::App("body failed"));
    }
    Ok(())
}

async fn stolen_lock_reports_lost_and_body_error_wins(locks: Locks) {
    for fail in [false, true] {
        let fence = Arc::new(AtomicU64::new(0));
        let call = tokio::spawn({
            let (locks, fence) = (locks.clone(), fence.clone());
            async move { outlives_ttl(&locks, fail, &fence).await }
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        // The lease ran out: another holder takes the lock while the body still runs.
        let thief = locks.lock("stolen").acquire().await.unwrap();
        let before = fence.load(Ordering::SeqCst);
        assert!(before > 0 && before < thief.fence().await.unwrap());
        let result = call.await.unwrap();
        if fail {
            assert!(
                matches!(result, Err(AppError::App("body failed"))),
                "{result:?}"
            );
        } else {
            assert!(matches!(lock_err(result), Error::Lost { .. }));
        }
        // The thief's lock was not touched by the loser's release.
        thief.release().await.unwrap();
    }
}

#[distributed_lock(key = "exit:<how>", client = locks)]
async fn exits(locks: &Locks, how: &str) -> Result<u32, AppError> {
    let parsed: u32 = match how {
        "question" => "not a number".parse().map_err(|_| AppError::App("parse"))?,
        "early" => return Ok(7),
        "err" => return Err(AppError::App("err")),
        _ => 1,
    };
    Ok(parsed)
}

async fn every_exit_path_releases(locks: Locks) {
    for how in ["question", "early", "err", "ok"] {
        let _ = exits(&locks, how).await;
        let g = locks.lock(format!("exit:{how}")).acquire().await;
        assert!(g.is_ok(), "exit path `{how}` left the lock held");
        g.unwrap().release().await.unwrap();
    }
}

#[distributed_lock(key = "boom", ttl = "30s", client = locks)]
async fn panics(locks: &Locks) -> Result<(), AppError> {
    panic!("body panicked");
}

async fn panic_releases(locks: Locks) {
    let joined = tokio::spawn({
        let locks = locks.clone();
        async move { panics(&locks).await }
    })
    .await;
    assert!(joined.unwrap_err().is_panic());
    let g = locks
        .lock("boom")
        .wait(Duration::from_millis(100))
        .acquire()
        .await
        .expect("a panic must release the lock long before its 30 s ttl");
    g.release().await.unwrap();
}

async fn cancelled_future_releases_at_once(locks: Locks) {
    let ran = AtomicU32::new(0);
    let body = hold(&locks, 3, 60_000, &ran);
    assert!(
        tokio::time::timeout(Duration::from_millis(100), body)
            .await
            .is_err()
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    let g = locks
        .lock("job:3")
        .wait(Duration::from_millis(100))
        .acquire()
        .await
        .expect("a dropped future must release within 100 ms, not after its 10 s ttl");
    g.release().await.unwrap();
}

async fn current_lock_is_task_local(locks: Locks) {
    assert!(distlock::current_lock().is_none());
    let seen = Arc::new(AtomicBool::new(false));
    #[distributed_lock(key = "tl", client = locks)]
    async fn inner(locks: &Locks, seen: Arc<AtomicBool>) -> Result<(), AppError> {
        let info = distlock::current_lock().unwrap();
        assert_eq!(info.key(), "lock:tl");
        let other_task = tokio::spawn(async { distlock::current_lock().is_none() });
        seen.store(other_task.await.unwrap(), Ordering::SeqCst);
        Ok(())
    }
    inner(&locks, seen.clone()).await.unwrap();
    assert!(
        seen.load(Ordering::SeqCst),
        "a spawned task does not inherit the lock"
    );
    assert!(distlock::current_lock().is_none());
}

#[distributed_lock(key = "user:{<tenant>}:<name>", client = locks)]
async fn escaped(locks: &Locks, tenant: &str, name: &str) -> Result<String, AppError> {
    Ok(distlock::current_lock().unwrap().key().to_owned())
}

async fn placeholders_are_escaped(locks: Locks) {
    let key = escaped(&locks, "acme}x{", "a:b c%").await.unwrap();
    assert_eq!(key, "lock:user:{acme%7Dx%7B}:a%3Ab%20c%25");
}

async fn distinct_keys_do_not_contend(locks: Locks) {
    let a = locks.lock("k:a").acquire().await.unwrap();
    let b = locks.lock("k:b").acquire().await.unwrap();
    a.release().await.unwrap();
    b.release().await.unwrap();
}

// ---- Redis only ----

#[tokio::test]
async fn value_is_plain_utf8_readable_by_any_client() {
    use redis::AsyncCommands;
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let g = locks.lock("order:42").acquire().await.unwrap();
    let mut raw = server.raw().await;
    let stored: String = raw.get("lock:order:42").await.unwrap();
    assert_eq!(stored, g.token());
    let unasked: Option<u64> = raw.get("{lock:order:42}:fence").await.unwrap();
    assert_eq!(unasked, None, "no fence until asked for");
    let fence = g.fence().await.unwrap();
    let counter: u64 = raw.get("{lock:order:42}:fence").await.unwrap();
    assert_eq!(counter, fence);
    let pttl: i64 = raw.pttl("lock:order:42").await.unwrap();
    assert!(
        pttl > 0 && pttl <= 30_000,
        "default ttl 30 s, got {pttl} ms"
    );
    g.release().await.unwrap();
    let gone: Option<String> = raw.get("lock:order:42").await.unwrap();
    assert!(gone.is_none());
}

#[tokio::test]
async fn release_by_another_token_never_deletes() {
    use redis::AsyncCommands;
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let g = locks
        .lock("cas")
        .ttl(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut raw = server.raw().await;
    let _: () = raw.set("lock:cas", "someone-else").await.unwrap();
    assert!(matches!(g.release().await, Err(Error::Lost { .. })));
    let still: String = raw.get("lock:cas").await.unwrap();
    assert_eq!(
        still, "someone-else",
        "compare-and-delete must not delete another holder's key"
    );
}

#[tokio::test]
async fn redis_restart_fails_within_timeout_then_recovers() {
    let mut server = RedisServer::start();
    let locks = Locks::builder(server.url())
        .command_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let ran = AtomicU32::new(0);
    let before_restart = hold(&locks, 9, 0, &ran).await.unwrap();
    server.kill();
    let started = Instant::now();
    let e = lock_err(hold(&locks, 9, 0, &ran).await);
    assert!(matches!(e, Error::Backend { .. }), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "an outage must not hang"
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the body must not run without the lock"
    );
    server.restart();
    // The new server has no scripts cached: EVALSHA answers NOSCRIPT and the script is
    // reloaded. It kept nothing, the fence counter included: the new counter starts from
    // the clock, above every fence the old one gave.
    let fence = hold(&locks, 9, 0, &ran).await.unwrap();
    assert!(fence > before_restart, "{fence} after {before_restart}");
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn hung_redis_is_a_timeout_not_a_hang() {
    let server = RedisServer::start();
    let locks = Locks::builder(server.url())
        .command_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let stop = |sig: &str| {
        let pid = server.pid().expect("running").to_string();
        std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap();
    };
    stop("-STOP");
    let started = Instant::now();
    let e = locks.lock("hung").acquire().await.unwrap_err();
    let took = started.elapsed();
    stop("-CONT");
    assert!(
        matches!(e, Error::Backend { ref source, .. } if source.kind() == distlock::BackendErrorKind::Timeout),
        "{e:?}"
    );
    assert!(took < Duration::from_secs(2), "took {took:?}");
    // The lock may have been written before the reply was lost; it is cleaned up, and
    // the client works again.
    let g = locks
        .lock("hung")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    g.release().await.unwrap();
}

#[tokio::test]
async fn unreachable_redis_is_a_backend_error() {
    let port = free_port();
    let locks = Locks::builder(format!("redis://127.0.0.1:{port}/"))
        .build()
        .unwrap();
    let ran = AtomicU32::new(0);
    let e = lock_err(hold(&locks, 1, 0, &ran).await);
    assert!(matches!(e, Error::Backend { .. }));
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// The release scripts themselves. A first try on a foreign token (or a second try after
/// the first released) answers "not ours", which the client reads by time (see
/// `tests/proxy.rs`); a handoff found already made answers "handed".
#[tokio::test]
async fn release_scripts_answer_by_what_the_key_holds() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let g = locks.lock("retry").acquire().await.unwrap();
    let token = g.token().to_owned();
    std::mem::forget(g);
    let unlock = redis::Script::new(include_str!("../../lockcore/src/scripts/unlock.lua"));
    let script = redis::Script::new(include_str!("../../lockcore/src/scripts/release.lua"));
    let mut raw = server.raw().await;
    let fast = |token: &str| {
        let mut inv = unlock.prepare_invoke();
        inv.key("lock:retry").arg(token);
        inv
    };
    let first: i64 = fast(&token).invoke_async(&mut raw).await.unwrap();
    let again: i64 = fast(&token).invoke_async(&mut raw).await.unwrap();
    assert_eq!((first, again), (1, 0));
    // Another client waits: its try marks the holder's value, and the fast path leaves
    // the lock held for the full release, which wakes it. (A client of its own each
    // time: a forgotten guard keeps its client's local turn.)
    let locks = Locks::connect(&server.url()).await.unwrap();
    let g = locks.lock("retry").acquire().await.unwrap();
    let token = g.token().to_owned();
    std::mem::forget(g);
    let other = Locks::connect(&server.url()).await.unwrap();
    let waiter = tokio::spawn(async move {
        let g = other
            .lock("retry")
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        let taken = Instant::now();
        g.release().await.unwrap();
        taken
    });
    let marked = format!("{token} waiting");
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let held: Option<String> = redis::AsyncCommands::get(&mut raw, "lock:retry")
            .await
            .unwrap();
        if held.as_deref() == Some(marked.as_str()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter never marked: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waited: i64 = fast(&token).invoke_async(&mut raw).await.unwrap();
    assert_eq!(waited, 2, "marked: the full release must run");
    let full = |token: &str, next: &str| {
        let mut inv = script.prepare_invoke();
        inv.key("lock:retry")
            .key("{lock:retry}:turns")
            .arg(token)
            .arg("{lock:retry}:released")
            .arg(&["test:client", "10"][..])
            .arg(next)
            .arg(&["30000", "", "0"][..]);
        inv
    };
    let released_at = Instant::now();
    let released: i64 = full(&token, "").invoke_async(&mut raw).await.unwrap();
    assert_eq!(released, 5, "another client listens: left to it (yield)");
    let taken = waiter.await.unwrap();
    assert!(
        taken.duration_since(released_at) < Duration::from_millis(80),
        "woken by the message, not the 100 ms fallback: {:?}",
        taken.duration_since(released_at)
    );
    // A handoff to a local waiter whose reply was lost: the retry finds the waiter's
    // token and reports the handoff; a call without that waiter is "not ours".
    let locks = Locks::connect(&server.url()).await.unwrap();
    let g = locks.lock("retry").acquire().await.unwrap();
    let token = g.token().to_owned();
    std::mem::forget(g);
    let handed: i64 = full(&token, "next-token")
        .invoke_async(&mut raw)
        .await
        .unwrap();
    let again: i64 = full(&token, "next-token")
        .invoke_async(&mut raw)
        .await
        .unwrap();
    let plain: i64 = full(&token, "").invoke_async(&mut raw).await.unwrap();
    assert_eq!((handed, again, plain), (4, 4, 0));
    let holder: String = redis::cmd("GET")
        .arg("lock:retry")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(holder, "next-token");
    let _: () = redis::cmd("DEL")
        .arg("lock:retry")
        .query_async(&mut raw)
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*retry*")
        .query_async(&mut raw)
        .await
        .unwrap();
    // The yield above recorded its turn; nothing else is written beside the lock key.
    assert_eq!(
        keys,
        vec!["{lock:retry}:turns".to_owned()],
        "no fence counter unasked, no marker keys"
    );
}

/// Lock calls go over direct connections, which authenticate and select the database
/// from the URL like the multiplexed one.
#[tokio::test]
async fn password_user_and_database_from_the_url_are_used() {
    let server = RedisServer::start();
    let mut admin = server.raw().await;
    redis::cmd("ACL")
        .arg(&["SETUSER", "app", "on", ">app-secret", "~*", "&*", "+@all"])
        .exec_async(&mut admin)
        .await
        .unwrap();
    redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "admin-secret"])
        .exec_async(&mut admin)
        .await
        .unwrap();
    let at = |userinfo: &str| format!("redis://{userinfo}@127.0.0.1:{}/3", server.port);

    // Control: without the password every call is refused.
    let anonymous = Locks::builder(format!("redis://127.0.0.1:{}/3", server.port))
        .command_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let e = anonymous.lock("db").acquire().await.unwrap_err();
    assert!(matches!(e, Error::Backend { .. }), "{e:?}");

    let mut check = redis::Client::open(at(":admin-secret"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for userinfo in [":admin-secret", "app:app-secret"] {
        let locks = Locks::connect(&at(userinfo)).await.unwrap();
        for _ in 0..3 {
            let g = locks.lock("db").acquire().await.unwrap();
            let held: Option<String> = redis::cmd("GET")
                .arg("lock:db")
                .query_async(&mut check)
                .await
                .unwrap();
            assert_eq!(
                held.as_deref(),
                Some(g.token()),
                "{userinfo}: in database 3"
            );
            g.release().await.unwrap();
        }
    }
    let mut db0 = redis::Client::open(format!("redis://:admin-secret@127.0.0.1:{}/0", server.port))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let in_db0: i64 = redis::cmd("DBSIZE").query_async(&mut db0).await.unwrap();
    assert_eq!(in_db0, 0, "nothing written to database 0");
}

/// A call that timed out may still get its reply later; that reply must never be read
/// as the answer to the next call (the connection it was sent on is closed, not reused).
#[tokio::test]
async fn a_timed_out_call_never_leaves_its_reply_to_the_next() {
    let server = RedisServer::start();
    let locks = Locks::builder(server.url())
        .command_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    cycles(&locks, "busy-key", 5).await;
    let other = Locks::connect(&server.url()).await.unwrap();
    let held = other.lock("busy-key").acquire().await.unwrap();
    let pid = server.pid().expect("running").to_string();
    let signal = |sig: &str| {
        std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
    };
    signal("-STOP");
    let e = locks.lock("fresh-key").acquire().await.unwrap_err();
    signal("-CONT");
    assert!(matches!(e, Error::Backend { .. }), "{e:?}");
    // The late reply to `fresh-key` says "taken"; `busy-key` is held by another client.
    let e = locks.lock("busy-key").acquire().await.unwrap_err();
    assert!(
        matches!(e, Error::Busy { .. }),
        "the answer must be this call's own: {e:?}"
    );
    held.release().await.unwrap();

    // Control: on a connection that is reused after a timeout, the next read does get
    // the late reply of the call that gave up.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    signal("-STOP");
    raw.write_all(b"INCR late\r\n").await.unwrap();
    let mut buf = [0u8; 64];
    let gave_up = tokio::time::timeout(Duration::from_millis(300), raw.read(&mut buf)).await;
    assert!(gave_up.is_err(), "redis is stopped: no reply yet");
    signal("-CONT");
    raw.write_all(b"SET other x\r\n").await.unwrap();
    let n = raw.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n.min(4)], b":1\r\n", "the stale reply came first");
}

/// Redis closes connections idle past its `timeout` setting; the next lock call must not
/// fail on one of them. Control: a plain connection left idle as long is closed.
#[tokio::test]
async fn connections_closed_while_idle_are_not_used() {
    let server = RedisServer::start();
    let mut admin = server.raw().await;
    let locks = Locks::connect(&server.url()).await.unwrap();
    locks
        .lock("idle")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut plain = server.raw().await;
    redis::cmd("CONFIG")
        .arg(&["SET", "timeout", "1"])
        .exec_async(&mut admin)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let control = redis::cmd("PING").query_async::<String>(&mut plain).await;
    assert!(control.is_err(), "control: the idle connection is closed");
    for _ in 0..3 {
        locks
            .lock("idle")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
}

/// A `unix://` URL: the direct connections speak over the socket too.
#[tokio::test]
async fn unix_socket_url_works() {
    let sock = std::env::temp_dir().join(format!(
        "distlock-{}-{}.sock",
        std::process::id(),
        free_port()
    ));
    let path = sock.to_str().unwrap();
    let server = RedisServer::start_with(&["--unixsocket", path, "--unixsocketperm", "700"]);
    let locks = Locks::connect(&format!("unix://{path}")).await.unwrap();
    let other = Locks::connect(&format!("unix://{path}")).await.unwrap();
    let mut raw = server.raw().await;
    for _ in 0..3 {
        let g = locks.lock("sock").acquire().await.unwrap();
        let held: Option<String> = redis::cmd("GET")
            .arg("lock:sock")
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(held.as_deref(), Some(g.token()));
        // A waiter in another client is woken over the socket's Pub/Sub too.
        let waiter = take_and_release(&other, "sock", Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(20)).await;
        g.release().await.unwrap();
        waiter.await.unwrap();
    }
    // The scripts went over direct connections on the socket (they name themselves).
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut raw)
        .await
        .unwrap();
    let direct_on_socket = clients
        .lines()
        // Valkey writes a socket's address as `[<path>:0]:0`.
        .filter(|l| {
            l.contains("name=distlock-direct ")
                && (l.contains(&format!("laddr={path}:")) || l.contains(&format!("laddr=[{path}:")))
        })
        .count();
    assert!(direct_on_socket >= 2, "{clients}");
    drop(server);
    let _ = std::fs::remove_file(&sock);
}

/// Redis restarts (without persistence) while a lock is held, and another client takes
/// the key on the new server. The holder's release is never a silent `Ok`: its first try
/// fails on the broken connection, and the retry's "not ours" cannot be trusted across a
/// restart (the client saw a broken connection and a new `run_id`). Control: the same
/// release without the restart succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_across_a_restart_is_never_a_silent_ok() {
    let mut server = RedisServer::start();
    let locks = Locks::builder(server.url())
        .command_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let control = locks.lock("restarted").acquire().await.unwrap();
    control.release().await.unwrap();
    // Every connection of the client is open and warm before the restart.
    cycles(&locks, "warm", 3).await;
    let g = locks
        .lock("restarted")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    server.restart();
    let other = Locks::connect(&server.url()).await.unwrap();
    let thief = other.lock("restarted").acquire().await.unwrap();
    let released = g.release().await;
    assert!(
        matches!(released, Err(Error::Backend { .. } | Error::Lost { .. })),
        "the lock was lost in the restart and taken: {released:?}"
    );
    thief.release().await.unwrap();
}

/// Redis restarted without persistence while a lock is held: the holder's first
/// `fence()` after it is `Lost` (after at most one `Backend` error while it reconnects),
/// never a number; the next holder's fence is above every fence given before the restart
/// (the new counter starts from the server's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_asked_after_a_restart_is_lost() {
    let mut server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let earlier = locks.lock("fenced").acquire().await.unwrap();
    let first = earlier.fence().await.unwrap();
    earlier.release().await.unwrap();
    let g = locks.lock("fenced").acquire().await.unwrap();
    server.restart();
    let mut asked = g.fence().await;
    let mut calls = 1;
    if matches!(asked, Err(Error::Backend { .. })) {
        asked = g.fence().await;
        calls += 1;
    }
    assert!(matches!(asked, Err(Error::Lost { .. })), "{asked:?}");
    assert!(
        matches!(
            g.release().await,
            Err(Error::Lost { .. } | Error::Backend { .. })
        ),
        "never a silent Ok"
    );
    let next = locks.lock("fenced").acquire().await.unwrap();
    // The counter went with the data; the new one starts from the clock, so the fences
    // go on growing across the restart (a call that finds the lock lost takes no number).
    let _ = calls;
    assert!(next.fence().await.unwrap() > first);
    next.release().await.unwrap();
}
