//! Looking at locks from the outside (`Locks::inspect`) and releasing a stuck one
//! (`Locks::force_release`): what an on-call engineer sees of a lock, a semaphore and a
//! read/write lock, and what the holder, the next holder and a waiter see after a
//! forced release (control: without it, the waiter would wait for the 30 s lease).
use crate::common;

use std::time::{Duration, Instant};

use common::*;
use distlock::{Error, Locks};

both!(
    a_held_lock_shows_its_holder_lease_and_fence,
    a_free_key_shows_nothing,
    a_semaphore_shows_its_permits,
    a_read_write_lock_shows_readers_and_a_waiting_writer,
    a_forced_release_makes_the_holder_lost,
    a_forced_release_frees_permits_and_readers,
);

const LONG: Duration = Duration::from_secs(10);

async fn a_held_lock_shows_its_holder_lease_and_fence(locks: Locks) {
    let g = locks
        .lock("ops:a")
        .ttl(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let fence = g.fence().await.unwrap();
    let state = locks.inspect("ops:a").await.unwrap();
    assert_eq!(state.key, "lock:ops:a");
    assert!(state.is_held());
    let holder = state.holder.clone().unwrap();
    assert_eq!(holder.token, g.token());
    assert_eq!(holder.pid, Some(std::process::id()));
    assert!(holder.host.is_some());
    let left = state.lease_left.unwrap();
    assert!(
        left > Duration::from_secs(15) && left <= Duration::from_secs(20),
        "{left:?}"
    );
    assert_eq!(state.last_fence, fence);
    assert!(state.permits.is_empty() && state.readers.is_empty());
    g.release().await.unwrap();
}

async fn a_free_key_shows_nothing(locks: Locks) {
    let state = locks.inspect("ops:b").await.unwrap();
    assert!(!state.is_held());
    assert_eq!(
        (state.holder, state.lease_left, state.last_fence),
        (None, None, 0)
    );
    assert!(!locks.force_release("ops:b").await.unwrap());
}

async fn a_semaphore_shows_its_permits(locks: Locks) {
    let a = locks.semaphore("ops:c", 3).acquire().await.unwrap();
    let b = locks.semaphore("ops:c", 3).acquire().await.unwrap();
    let state = locks.inspect("ops:c").await.unwrap();
    assert!(state.holder.is_none());
    let mut tokens: Vec<String> = state
        .permits
        .iter()
        .map(|s| s.holder.token.clone())
        .collect();
    tokens.sort();
    let mut want = vec![a.token().to_owned(), b.token().to_owned()];
    want.sort();
    assert_eq!(tokens, want);
    assert!(
        state
            .permits
            .iter()
            .all(|s| s.lease_left > Duration::from_secs(25))
    );
    a.release().await.unwrap();
    b.release().await.unwrap();
}

async fn a_read_write_lock_shows_readers_and_a_waiting_writer(locks: Locks) {
    let r = locks.read_lock("ops:d").acquire().await.unwrap();
    let writer = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let w = locks
                .write_lock("ops:d")
                .wait(LONG)
                .acquire()
                .await
                .unwrap();
            w.release().await.unwrap();
        })
    };
    let until = Instant::now() + Duration::from_secs(5);
    let state = loop {
        let state = locks.inspect("ops:d").await.unwrap();
        if state.writer_waiting.is_some() {
            break state;
        }
        assert!(Instant::now() < until, "no waiting writer seen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(state.readers.len(), 1);
    assert_eq!(state.readers[0].holder.token, r.token());
    assert!(state.holder.is_none());
    r.release().await.unwrap();
    writer.await.unwrap();
}

async fn a_forced_release_makes_the_holder_lost(locks: Locks) {
    let stuck = locks.lock("ops:e").acquire().await.unwrap();
    assert!(locks.force_release("ops:e").await.unwrap());
    assert!(!locks.inspect("ops:e").await.unwrap().is_held());
    assert!(matches!(stuck.release().await, Err(Error::Lost { .. })));
}

/// Another instance's waiter is woken by the forced release (control: the stuck
/// holder's lease is 30 s, the waiter gets in within 5). The stuck holder's own
/// client's waiters queue behind it until its lease ends or a renewal finds it lost,
/// as after any lost lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_wakes_another_clients_waiter() {
    let server = RedisServer::start();
    let (locks, other) = (
        Locks::connect(&server.url()).await.unwrap(),
        Locks::connect(&server.url()).await.unwrap(),
    );
    let stuck = locks
        .lock("ops:i")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        let g = other.lock("ops:i").wait(LONG).acquire().await.unwrap();
        let at = Instant::now();
        g.release().await.unwrap();
        at
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let forced = Instant::now();
    assert!(locks.force_release("ops:i").await.unwrap());
    let at = waiter.await.unwrap();
    assert!(at - forced < Duration::from_secs(5), "{:?}", at - forced);
    assert!(matches!(stuck.release().await, Err(Error::Lost { .. })));
}

async fn a_forced_release_frees_permits_and_readers(locks: Locks) {
    let p = locks.semaphore("ops:f", 1).acquire().await.unwrap();
    let r = locks.read_lock("ops:g").acquire().await.unwrap();
    assert!(locks.force_release("ops:f").await.unwrap());
    assert!(locks.force_release("ops:g").await.unwrap());
    let p2 = locks.semaphore("ops:f", 1).acquire().await.unwrap();
    let w = locks.write_lock("ops:g").acquire().await.unwrap();
    assert!(matches!(p.release().await, Err(Error::Lost { .. })));
    assert!(matches!(r.release().await, Err(Error::Lost { .. })));
    p2.release().await.unwrap();
    w.release().await.unwrap();
}

/// On Redis, a waiter that will be woken by a message marks the holder's value, and
/// its client listens on the key's channel: both show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_shows_as_a_mark_and_a_listener() {
    let server = RedisServer::start();
    let (locks, other) = (
        Locks::connect(&server.url()).await.unwrap(),
        Locks::connect(&server.url()).await.unwrap(),
    );
    let g = locks.lock("ops:h").acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        let w = other.lock("ops:h").wait(LONG).acquire().await.unwrap();
        w.release().await.unwrap();
    });
    let until = Instant::now() + Duration::from_secs(5);
    let state = loop {
        let state = locks.inspect("ops:h").await.unwrap();
        if state.marked_waiting && state.listening > 0 {
            break state;
        }
        assert!(Instant::now() < until, "{state:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(state.holder.unwrap().token, g.token());
    g.release().await.unwrap();
    waiter.await.unwrap();
}
