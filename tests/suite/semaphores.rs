//! Semaphores: `locks.semaphore(name, permits)` and `#[distributed_lock(permits = n)]`.
//! Never more holders than permits, whatever the clients, runtimes and tasks; every
//! permit a lease of its own (a dead holder's frees itself at its ttl, a lost one is
//! `Lost` at release, a renewed one stays); a freed permit wakes a waiter; local waiters
//! are served in order; and the faults of a lock: a try cancelled in flight, a reply
//! after its timeout, a restart. Each bound has its control: the same run with more
//! permits, or without the semaphore, crosses it.
use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::*;
use distlock::{Error, Locks, distributed_lock};

both!(
    never_more_holders_than_permits,
    a_freed_permit_wakes_a_waiter,
    a_dead_holders_permit_frees_at_its_ttl,
    a_permit_that_ran_out_is_lost_at_release,
    a_renewed_permit_stays_held,
    a_smaller_count_applies_as_permits_are_given_back,
    misuse_is_refused_before_redis,
    local_waiters_are_served_in_order,
    a_task_holding_a_permit_reenters_it,
    the_attribute_runs_at_most_permits_bodies_at_once,
);

const LONG: Duration = Duration::from_secs(10);

/// Most holders seen at once among `tasks` tasks that each take a permit of `name`
/// (`permits`; `None`: no semaphore at all) through `locks` and hold it 20 ms.
async fn most_at_once(locks: &Locks, name: &str, permits: Option<u32>, tasks: usize) -> u32 {
    let (now, most) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let runs = (0..tasks).map(|_| {
        let (locks, name) = (locks.clone(), name.to_owned());
        let (now, most) = (now.clone(), most.clone());
        tokio::spawn(async move {
            let guard = match permits {
                Some(n) => Some(locks.semaphore(name, n).wait(LONG).acquire().await.unwrap()),
                None => None,
            };
            let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(at_once, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            if let Some(guard) = guard {
                guard.release().await.unwrap();
            }
        })
    });
    for run in futures_util::future::join_all(runs).await {
        run.unwrap();
    }
    most.load(Ordering::SeqCst)
}

async fn never_more_holders_than_permits(locks: Locks) {
    let most = most_at_once(&locks, "gpu:a", Some(4), 16).await;
    assert!(
        (2..=4).contains(&most),
        "{most} holders at once with 4 permits"
    );
    // Control: without the semaphore the same tasks overlap past 4.
    let most = most_at_once(&locks, "gpu:a", None, 16).await;
    assert!(most > 4, "{most}");
}

async fn a_freed_permit_wakes_a_waiter(locks: Locks) {
    let held = locks
        .semaphore("gpu:b", 1)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let g = locks.semaphore("gpu:b", 1).wait(LONG).acquire().await;
            (Instant::now(), g.unwrap().release().await)
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (woke, again) = waiter.await.unwrap();
    again.unwrap();
    // Long before the holder's 30 s lease could have ended.
    assert!(
        woke - released < Duration::from_secs(5),
        "{:?}",
        woke - released
    );
}

async fn a_dead_holders_permit_frees_at_its_ttl(locks: Locks) {
    let ttl = Duration::from_millis(300);
    let taken = Instant::now();
    let dead = locks
        .semaphore("gpu:c", 1)
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    std::mem::forget(dead); // its holder died: nothing gives the permit back
    let next = locks
        .semaphore("gpu:c", 1)
        .wait(LONG)
        .acquire()
        .await
        .unwrap();
    let at = taken.elapsed();
    assert!(at >= ttl - Duration::from_millis(20) && at < LONG, "{at:?}");
    next.release().await.unwrap();
}

async fn a_permit_that_ran_out_is_lost_at_release(locks: Locks) {
    let late = locks
        .semaphore("gpu:d", 1)
        .ttl(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!late.info().is_held());
    let other = locks.semaphore("gpu:d", 1).acquire().await.unwrap();
    assert!(matches!(late.release().await, Err(Error::Lost { .. })));
    // The other holder's permit is untouched: a third is refused until it gives it back.
    assert!(matches!(
        locks.semaphore("gpu:d", 1).acquire().await,
        Err(Error::Busy { .. })
    ));
    other.release().await.unwrap();
    // Control: released within its ttl, a permit is given back without error.
    let on_time = locks.semaphore("gpu:d", 1).acquire().await.unwrap();
    on_time.release().await.unwrap();
}

async fn a_renewed_permit_stays_held(locks: Locks) {
    let ttl = Duration::from_millis(300);
    let renewed = locks
        .semaphore("gpu:e", 1)
        .ttl(ttl)
        .renew(true)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(ttl * 3).await;
    assert!(renewed.info().is_held());
    assert!(matches!(
        locks.semaphore("gpu:e", 1).acquire().await,
        Err(Error::Busy { .. })
    ));
    renewed.release().await.unwrap();
    // Control: the same wait without renewal frees the permit.
    let plain = locks
        .semaphore("gpu:e", 1)
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(ttl * 3).await;
    let next = locks.semaphore("gpu:e", 1).acquire().await.unwrap();
    assert!(matches!(plain.release().await, Err(Error::Lost { .. })));
    next.release().await.unwrap();
}

async fn a_smaller_count_applies_as_permits_are_given_back(locks: Locks) {
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(locks.semaphore("gpu:f", 3).acquire().await.unwrap());
    }
    // A client that counts 2 permits finds 3 taken, then 2: no room.
    for _ in 0..2 {
        assert!(matches!(
            locks.semaphore("gpu:f", 2).acquire().await,
            Err(Error::Busy { .. })
        ));
        held.pop().unwrap().release().await.unwrap();
    }
    // One holder left: room for the second of 2.
    let g = locks.semaphore("gpu:f", 2).acquire().await.unwrap();
    g.release().await.unwrap();
    held.pop().unwrap().release().await.unwrap();
}

async fn misuse_is_refused_before_redis(locks: Locks) {
    let none = locks.semaphore("gpu:g", 0).acquire().await;
    assert!(matches!(none, Err(Error::Unsupported { .. })), "{none:?}");
    let kept = locks
        .semaphore("gpu:g", 2)
        .min_hold(Duration::from_secs(1))
        .acquire()
        .await;
    assert!(matches!(kept, Err(Error::Unsupported { .. })), "{kept:?}");
    let g = locks.semaphore("gpu:g", 2).acquire().await.unwrap();
    assert_eq!(g.info().permits(), Some(2));
    assert!(matches!(g.fence().await, Err(Error::Unsupported { .. })));
    g.release().await.unwrap();
}

async fn local_waiters_are_served_in_order(locks: Locks) {
    let held = locks.semaphore("gpu:h", 1).acquire().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..5 {
        let (locks, order) = (locks.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let g = locks
                .semaphore("gpu:h", 1)
                .wait(LONG)
                .acquire()
                .await
                .unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            g.release().await.unwrap();
        }));
        // Each waiter in line before the next comes.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
}

async fn a_task_holding_a_permit_reenters_it(locks: Locks) {
    let outer = locks.semaphore("gpu:i", 1).acquire().await.unwrap();
    let inner = outer
        .scope(async { locks.semaphore("gpu:i", 1).acquire().await })
        .await
        .unwrap();
    assert!(inner.is_reentrant());
    inner.release().await.unwrap();
    // Another task gets no permit: the one there is is still the outer guard's.
    let other = tokio::spawn({
        let locks = locks.clone();
        async move { locks.semaphore("gpu:i", 1).acquire().await.map(drop) }
    });
    assert!(matches!(other.await.unwrap(), Err(Error::Busy { .. })));
    outer.release().await.unwrap();
}

#[distributed_lock(key = "render:<farm>", permits = 2, wait = "10s", client = locks)]
async fn render(
    locks: &Locks,
    farm: &str,
    now: &AtomicU32,
    most: &AtomicU32,
) -> Result<(), AppError> {
    let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(at_once, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(20)).await;
    now.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

async fn the_attribute_runs_at_most_permits_bodies_at_once(locks: Locks) {
    let (now, most) = (AtomicU32::new(0), AtomicU32::new(0));
    let calls = (0..8).map(|_| render(&locks, "north", &now, &most));
    for call in futures_util::future::join_all(calls).await {
        call.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!((1..=2).contains(&most), "{most}");
}

/// What `redis-cli` shows: one sorted set, each holder's token scored by when its lease
/// ends (ms since the epoch, by the server's clock), and the limit, `limit:<n>` scored
/// `+inf`, as the latest acquire that took a permit counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_semaphore_is_a_sorted_set_redis_cli_can_read() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let g = locks
        .semaphore("gpu:j", 3)
        .ttl(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let held: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg("lock:gpu:j")
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut raw)
        .await
        .unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64;
    assert_eq!(held.len(), 2, "{held:?}");
    assert_eq!(held[0].0, g.token());
    let left = held[0].1 - now_ms;
    assert!((15_000.0..=21_000.0).contains(&left), "{left}");
    assert_eq!(held[1], ("limit:3".to_owned(), f64::INFINITY));
    let state = locks.inspect("gpu:j").await.unwrap();
    assert_eq!((state.permits.len(), state.permit_limit), (1, Some(3)));
    // A client that counts 5: the limit is the latest acquire's.
    let other = locks.semaphore("gpu:j", 5).acquire().await.unwrap();
    let state = locks.inspect("gpu:j").await.unwrap();
    assert_eq!((state.permits.len(), state.permit_limit), (2, Some(5)));
    let limits: Vec<String> = redis::cmd("ZRANGEBYSCORE")
        .arg("lock:gpu:j")
        .arg("+inf")
        .arg("+inf")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(limits, ["limit:5"], "one limit at a time");
    other.release().await.unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg("lock:gpu:j")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(pttl > 15_000, "{pttl}");
    g.release().await.unwrap();
    let exists: bool = redis::cmd("EXISTS")
        .arg("lock:gpu:j")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(!exists, "the last release leaves no key behind");
}

/// Cancelled with its try in flight, a caller does not keep a permit it may have been
/// given: the permit is taken back at once (control: the ttl is 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_cancelled_in_flight_gives_its_permit_back() {
    let server = RedisServer::start();
    let proxy = common::proxy::FaultProxy::start(server.port);
    let locks = Locks::connect(&proxy.url()).await.unwrap();
    let mut raw = server.raw().await;
    // Connected, and the script loaded, before replies are slowed.
    locks
        .semaphore("gpu:k", 1)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.set_latency(common::proxy::Dir::ToClient, Duration::from_millis(50));
    let cancelled = cancelled_in_flight(locks.semaphore("gpu:k", 1).acquire()).await;
    assert!(cancelled, "the try was not in flight when cancelled");
    nothing_left_after_cleanups(&mut raw, redis::cmd("ZCARD").arg("lock:gpu:k")).await;
}

/// A reply that comes after the command timeout: the caller is told `Backend` within the
/// timeout, and the permit the late try took is given back (control: the next caller
/// finds the permit free long before the 30 s ttl).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_after_its_timeout_leaves_no_permit_taken() {
    let server = RedisServer::start();
    let proxy = common::proxy::FaultProxy::start(server.port);
    let locks = proxy.locks(Duration::from_millis(200));
    locks
        .semaphore("gpu:l", 1)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.set_latency(common::proxy::Dir::ToClient, Duration::from_millis(400));
    let started = Instant::now();
    let late = locks.semaphore("gpu:l", 1).acquire().await;
    assert!(matches!(late, Err(Error::Backend { .. })), "{late:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    proxy.set_latency(common::proxy::Dir::ToClient, Duration::ZERO);
    let other = Locks::connect(&server.url()).await.unwrap();
    let next = other
        .semaphore("gpu:l", 1)
        .wait(LONG)
        .acquire()
        .await
        .unwrap();
    next.release().await.unwrap();
}

/// A restart that loses the semaphore: the holder is told `Lost` at release (its permit
/// is gone), and the next holder is let in (a restart without persistence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_loses_the_permit_and_says_so() {
    let mut server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let g = locks.semaphore("gpu:m", 1).acquire().await.unwrap();
    server.restart();
    let until = Instant::now() + Duration::from_secs(10);
    let next = loop {
        match locks.semaphore("gpu:m", 1).acquire().await {
            Ok(next) => break next,
            Err(Error::Backend { .. }) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(matches!(g.release().await, Err(Error::Lost { .. })));
    next.release().await.unwrap();
}

/// One client shared by more current-thread runtimes than cores, each running tasks on
/// one semaphore: never more holders than permits in all (control: 4 runtimes' tasks
/// without it overlap past 2).
#[test]
fn runtimes_sharing_a_client_share_the_permits() {
    let server = RedisServer::start();
    let locks = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(Locks::connect(&server.url()))
        .unwrap();
    let run = |permits: Option<u32>| {
        let (now, most) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (locks, now, most) = (locks.clone(), now.clone(), most.clone());
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async move {
                        let tasks = (0..3).map(|_| {
                            let (locks, now, most) = (locks.clone(), now.clone(), most.clone());
                            tokio::spawn(async move {
                                for _ in 0..5 {
                                    let g = match permits {
                                        Some(n) => Some(
                                            locks
                                                .semaphore("gpu:n", n)
                                                .wait(LONG)
                                                .acquire()
                                                .await
                                                .unwrap(),
                                        ),
                                        None => None,
                                    };
                                    let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
                                    most.fetch_max(at_once, Ordering::SeqCst);
                                    tokio::time::sleep(Duration::from_millis(3)).await;
                                    now.fetch_sub(1, Ordering::SeqCst);
                                    if let Some(g) = g {
                                        g.release().await.unwrap();
                                    }
                                }
                            })
                        });
                        for t in futures_util::future::join_all(tasks).await {
                            t.unwrap();
                        }
                    });
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        most.load(Ordering::SeqCst)
    };
    let most = run(Some(2));
    assert!((1..=2).contains(&most), "{most}");
    assert!(run(None) > 2);
}
