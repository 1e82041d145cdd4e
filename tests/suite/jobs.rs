//! Jobs that must run on one instance (ShedLock's use): `min_hold` keeps a lock by its
//! lease until that long after it was taken, however soon the job ends, so an instance
//! whose timer fires a little late skips the run instead of repeating it. Each test
//! runs the same without `min_hold` as its control, where the late run gets the lock.
use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::*;
use distlock::{Error, Locks, distributed_lock};

both!(
    a_short_job_keeps_the_lock_for_its_min_hold,
    a_job_longer_than_min_hold_releases_at_once,
    a_local_waiter_is_not_handed_a_kept_lock,
    the_attribute_skips_a_late_run,
);

const MIN_HOLD: Duration = Duration::from_millis(600);

async fn a_short_job_keeps_the_lock_for_its_min_hold(locks: Locks) {
    let taken = Instant::now();
    let job = locks
        .lock("job:a")
        .min_hold(MIN_HOLD)
        .acquire()
        .await
        .unwrap();
    job.release().await.unwrap();
    // Another instance right after: the job already ran in this window.
    assert!(matches!(
        locks.lock("job:a").acquire().await,
        Err(Error::Busy { .. })
    ));
    // Free once `min_hold` has passed, long before the 30 s ttl.
    let next = locks
        .lock("job:a")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let at = taken.elapsed();
    assert!(at >= MIN_HOLD && at < Duration::from_secs(10), "{at:?}");
    next.release().await.unwrap();
    // Control: released without `min_hold`, the lock is free at once.
    locks
        .lock("job:a")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

async fn a_job_longer_than_min_hold_releases_at_once(locks: Locks) {
    let job = locks
        .lock("job:b")
        .min_hold(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    job.release().await.unwrap();
    locks
        .lock("job:b")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// When `waiter` (queued behind the holder on the same client) got the lock, counted
/// from the holder's acquisition; the holder releases 50 ms after it.
async fn local_waiter_gets_it(locks: &Locks, min_hold: Option<Duration>) -> Duration {
    let taken = Instant::now();
    let mut request = locks.lock("job:c");
    if let Some(min_hold) = min_hold {
        request = request.min_hold(min_hold);
    }
    let job = request.acquire().await.unwrap();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let g = locks
                .lock("job:c")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap();
            let at = taken.elapsed();
            g.release().await.unwrap();
            at
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    job.release().await.unwrap();
    waiter.await.unwrap()
}

async fn a_local_waiter_is_not_handed_a_kept_lock(locks: Locks) {
    let at = local_waiter_gets_it(&locks, Some(MIN_HOLD)).await;
    assert!(at >= MIN_HOLD, "the waiter got a kept lock after {at:?}");
    // Control: without `min_hold` the release hands it over at once.
    let at = local_waiter_gets_it(&locks, None).await;
    assert!(at < MIN_HOLD, "{at:?}");
}

#[distributed_lock(key = "job:<name>", ttl = "10s", min_hold = "600ms", client = locks)]
async fn nightly(locks: &Locks, name: &str, runs: &AtomicU32) -> Result<(), AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "job:<name>", ttl = "10s", client = locks)]
async fn nightly_without_min_hold(
    locks: &Locks,
    name: &str,
    runs: &AtomicU32,
) -> Result<(), AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

async fn the_attribute_skips_a_late_run(locks: Locks) {
    let runs = AtomicU32::new(0);
    nightly(&locks, "report", &runs).await.unwrap();
    // A second instance whose timer fired a little late: the run is skipped.
    let late = nightly(&locks, "report", &runs).await;
    assert!(
        matches!(late, Err(AppError::Lock(Error::Busy { .. }))),
        "{late:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Control: without `min_hold` the late instance runs the job a second time.
    let runs = AtomicU32::new(0);
    nightly_without_min_hold(&locks, "cleanup", &runs)
        .await
        .unwrap();
    nightly_without_min_hold(&locks, "cleanup", &runs)
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A release that finds the lock taken by another holder is `Lost`, `min_hold` or not,
/// and leaves the other holder's key as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lock_that_was_lost_is_lost() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let job = locks
        .lock("job:d")
        .min_hold(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let _: () = redis::AsyncCommands::set(&mut raw, "lock:job:d", "another")
        .await
        .unwrap();
    assert!(matches!(job.release().await, Err(Error::Lost { .. })));
    let left: Option<String> = redis::AsyncCommands::get(&mut raw, "lock:job:d")
        .await
        .unwrap();
    assert_eq!(left.as_deref(), Some("another"));
    let pttl: i64 = redis::AsyncCommands::pttl(&mut raw, "lock:job:d")
        .await
        .unwrap();
    assert_eq!(pttl, -1, "the other holder's key was given a lease");
}

/// A release cancelled in flight still keeps the lock: the task that finishes it keeps
/// it for what is left of `min_hold` (control: the lease it had, 30 s, is far longer).
/// Replies come through the fault proxy 30 ms late, so the cancellation comes while the
/// release is in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_release_still_keeps_the_lock() {
    let server = RedisServer::start();
    let proxy = common::proxy::FaultProxy::start(server.port);
    let locks = Locks::connect(&proxy.url()).await.unwrap();
    let mut raw = server.raw().await;
    let job = locks
        .lock("job:e")
        .min_hold(MIN_HOLD)
        .acquire()
        .await
        .unwrap();
    proxy.set_latency(common::proxy::Dir::ToClient, Duration::from_millis(30));
    assert!(
        cancelled_in_flight(job.release()).await,
        "the release was not in flight when cancelled"
    );
    let until = Instant::now() + Duration::from_secs(5);
    let pttl = loop {
        let pttl: i64 = redis::AsyncCommands::pttl(&mut raw, "lock:job:e")
            .await
            .unwrap();
        if pttl <= MIN_HOLD.as_millis() as i64 || Instant::now() > until {
            break pttl;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(
        pttl > 0 && pttl <= MIN_HOLD.as_millis() as i64,
        "the key's lease after a cancelled release: {pttl} ms"
    );
}

/// The observer hears a release before `min_hold` as `kept`, one after it as `released`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_release_is_heard_as_kept() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    let locks = Locks::in_memory_observed(move |e: &distlock::Event<'_>| {
        log.lock().unwrap().push(e.name().to_owned())
    });
    let job = locks
        .lock("job:f")
        .min_hold(MIN_HOLD)
        .acquire()
        .await
        .unwrap();
    job.release().await.unwrap();
    let job = locks
        .lock("job:g")
        .min_hold(Duration::from_millis(10))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    job.release().await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        ["acquired", "kept", "acquired", "released"]
    );
}

/// A lock given back for want of replicas (`replicas = 1` on a server without one) is
/// released at once, `min_hold` or not: the caller never had it, and keeping it would
/// make every instance skip the job. (Before, the give-back kept it for `min_hold`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_given_back_for_want_of_replicas_is_not_kept() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let got = locks
        .lock("job:h")
        .min_hold(Duration::from_secs(10))
        .replicas(1)
        .acquire()
        .await;
    assert!(matches!(got, Err(Error::NotReplicated { .. })), "{got:?}");
    let until = Instant::now() + Duration::from_secs(5);
    let left: Option<String> = loop {
        let left: Option<String> = redis::AsyncCommands::get(&mut raw, "lock:job:h")
            .await
            .unwrap();
        if left.is_none() || Instant::now() > until {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(left, None, "the given-back lock was kept");
}
