//! Multi-key locks: `locks.multi_lock([..])` and `#[distributed_lock(keys = [..])]`.
//! Every key or none (a key held elsewhere leaves the others free); no deadlock
//! whatever the order callers name the keys in (control: two plain locks taken in the
//! caller's order do deadlock until their wait runs out); one guard that renews, reports
//! the set lost when any key is, and releases every key; the one-script way where the
//! keys are on one server, the ordered way once a key is found held.
use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::Duration;

use common::*;
use distlock::{Error, Locks, distributed_lock};

both!(
    every_key_or_none,
    no_deadlock_whatever_the_order,
    the_set_is_lost_when_any_key_is,
    renewal_keeps_every_key,
    a_key_named_twice_is_taken_once,
    one_script_when_free_in_order_once_one_is_held,
    the_attribute_moves_money_without_losing_any,
    a_task_holding_some_of_the_keys_is_refused,
);

const LONG: Duration = Duration::from_secs(10);

async fn every_key_or_none(locks: Locks) {
    let b = locks.lock("acct:b").acquire().await.unwrap();
    let both = locks.multi_lock(["acct:a", "acct:b"]).acquire().await;
    assert!(matches!(both, Err(Error::Busy { .. })), "{both:?}");
    // Nothing left held: `a` is free at once.
    let a = locks.lock("acct:a").acquire().await.unwrap();
    a.release().await.unwrap();
    // The same after waiting, when the ordered way took `a` first and gave it back.
    let both = locks
        .multi_lock(["acct:b", "acct:a"])
        .wait(Duration::from_millis(200))
        .acquire()
        .await;
    assert!(matches!(both, Err(Error::Busy { .. })), "{both:?}");
    let a = locks.lock("acct:a").acquire().await.unwrap();
    a.release().await.unwrap();
    b.release().await.unwrap();
    let both = locks
        .multi_lock(["acct:b", "acct:a"])
        .acquire()
        .await
        .unwrap();
    assert_eq!(both.keys(), ["lock:acct:a", "lock:acct:b"]);
    both.release().await.unwrap();
}

/// Tasks that each take `x` and `y`, half naming `x` first and half `y`, with `wait`:
/// how many gave up. `multi` false: each takes its two locks one after the other in its
/// own order (the control).
async fn crossing(locks: &Locks, multi: bool, wait: Duration) -> u32 {
    let gave_up = Arc::new(AtomicU32::new(0));
    let tasks = (0..8).map(|t| {
        let (locks, gave_up) = (locks.clone(), gave_up.clone());
        tokio::spawn(async move {
            let order = if t % 2 == 0 { ["x", "y"] } else { ["y", "x"] };
            for _ in 0..5 {
                if multi {
                    match locks.multi_lock(order).wait(wait).acquire().await {
                        Ok(g) => {
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            g.release().await.unwrap();
                        }
                        Err(Error::Busy { .. }) => {
                            gave_up.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => panic!("{e}"),
                    }
                    continue;
                }
                let Ok(first) = locks.lock(order[0]).wait(wait).acquire().await else {
                    gave_up.fetch_add(1, Ordering::SeqCst);
                    continue;
                };
                tokio::time::sleep(Duration::from_millis(2)).await;
                match locks.lock(order[1]).wait(wait).acquire().await {
                    Ok(second) => second.release().await.unwrap(),
                    Err(Error::Busy { .. }) => {
                        gave_up.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => panic!("{e}"),
                }
                first.release().await.unwrap();
            }
        })
    });
    for t in futures_util::future::join_all(tasks).await {
        t.unwrap();
    }
    gave_up.load(Ordering::SeqCst)
}

async fn no_deadlock_whatever_the_order(locks: Locks) {
    assert_eq!(crossing(&locks, true, LONG).await, 0);
    // Control: the same tasks taking their two locks in their own order deadlock (each
    // holds one and waits for the other) until the wait runs out.
    assert!(crossing(&locks, false, Duration::from_millis(100)).await > 0);
}

async fn the_set_is_lost_when_any_key_is(locks: Locks) {
    let both = locks
        .multi_lock(["acct:c", "acct:d"])
        .ttl(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!both.is_held());
    let other = locks.lock("acct:d").acquire().await.unwrap();
    assert!(matches!(both.release().await, Err(Error::Lost { .. })));
    other.release().await.unwrap();
    // Control: released in time, the set was held to the end.
    let both = locks
        .multi_lock(["acct:c", "acct:d"])
        .acquire()
        .await
        .unwrap();
    assert!(both.is_held());
    both.release().await.unwrap();
}

async fn renewal_keeps_every_key(locks: Locks) {
    let ttl = Duration::from_millis(300);
    let both = locks
        .multi_lock(["acct:e", "acct:f"])
        .ttl(ttl)
        .renew(true)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(ttl * 3).await;
    for key in ["acct:e", "acct:f"] {
        assert!(matches!(
            locks.lock(key).acquire().await,
            Err(Error::Busy { .. })
        ));
    }
    both.release().await.unwrap();
}

async fn a_key_named_twice_is_taken_once(locks: Locks) {
    let g = locks
        .multi_lock(["acct:g", "acct:g"])
        .acquire()
        .await
        .unwrap();
    assert_eq!(g.keys(), ["lock:acct:g"]);
    g.release().await.unwrap();
    let none = locks.multi_lock(Vec::<String>::new()).acquire().await;
    assert!(matches!(none, Err(Error::Unsupported { .. })), "{none:?}");
}

async fn one_script_when_free_in_order_once_one_is_held(locks: Locks) {
    let g = locks
        .multi_lock(["acct:h", "acct:i"])
        .acquire()
        .await
        .unwrap();
    assert!(g.taken_at_once());
    g.release().await.unwrap();
    let i = locks.lock("acct:i").acquire().await.unwrap();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let g = locks
                .multi_lock(["acct:h", "acct:i"])
                .wait(LONG)
                .acquire()
                .await
                .unwrap();
            let at_once = g.taken_at_once();
            g.release().await.unwrap();
            at_once
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    i.release().await.unwrap();
    assert!(!waiter.await.unwrap(), "found held, it takes them in order");
}

#[distributed_lock(keys = ["bank:<from>", "bank:<to>"], wait = "10s", client = locks)]
async fn transfer(
    locks: &Locks,
    from: usize,
    to: usize,
    balances: &[AtomicI64; 3],
) -> Result<(), AppError> {
    // A read-modify-write of both accounts with a pause between: two transfers that
    // overlap on an account lose one's update.
    let (a, b) = (
        balances[from].load(Ordering::SeqCst),
        balances[to].load(Ordering::SeqCst),
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    balances[from].store(a - 1, Ordering::SeqCst);
    balances[to].store(b + 1, Ordering::SeqCst);
    Ok(())
}

async fn the_attribute_moves_money_without_losing_any(locks: Locks) {
    let balances = [
        AtomicI64::new(100),
        AtomicI64::new(100),
        AtomicI64::new(100),
    ];
    let moves = (0..30).map(|i| {
        let (from, to) = (i % 3, (i + 1 + i / 3 % 2) % 3);
        transfer(&locks, from, to, &balances)
    });
    for m in futures_util::future::join_all(moves).await {
        m.unwrap();
    }
    let total: i64 = balances.iter().map(|b| b.load(Ordering::SeqCst)).sum();
    assert_eq!(total, 300);
}

/// Cancelled with its one-script try in flight, a caller keeps none of the locks it may
/// have been given: every key is taken back at once (control: the ttl is 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_cancelled_in_flight_gives_every_key_back() {
    let server = RedisServer::start();
    let proxy = common::proxy::FaultProxy::start(server.port);
    let locks = Locks::connect(&proxy.url()).await.unwrap();
    let mut raw = server.raw().await;
    let warm = locks
        .multi_lock(["acct:j", "acct:k"])
        .acquire()
        .await
        .unwrap();
    warm.release().await.unwrap();
    proxy.set_latency(common::proxy::Dir::ToClient, Duration::from_millis(50));
    assert!(cancelled_in_flight(locks.multi_lock(["acct:j", "acct:k"]).acquire()).await);
    nothing_left_after_cleanups(
        &mut raw,
        redis::cmd("EXISTS").arg("lock:acct:j").arg("lock:acct:k"),
    )
    .await;
}

/// A task holding some of the keys is refused (it would wait for the others while
/// holding those); holding all of them, it re-enters every one.
async fn a_task_holding_some_of_the_keys_is_refused(locks: Locks) {
    let a = locks.lock("acct:l").acquire().await.unwrap();
    let some = a
        .scope(async { locks.multi_lock(["acct:l", "acct:m"]).acquire().await })
        .await;
    assert!(matches!(some, Err(Error::Unsupported { .. })), "{some:?}");
    a.release().await.unwrap();
    let all = locks
        .multi_lock(["acct:l", "acct:m"])
        .acquire()
        .await
        .unwrap();
    let again = all
        .scope(async { locks.multi_lock(["acct:m", "acct:l"]).acquire().await })
        .await
        .unwrap();
    assert!(again.guards().iter().all(|g| g.is_reentrant()));
    again.release().await.unwrap();
    all.release().await.unwrap();
}
