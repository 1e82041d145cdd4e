//! Read/write locks: `locks.read_lock(name)`, `locks.write_lock(name)` and
//! `#[distributed_lock(mode = "read" | "write")]`. Readers share, a writer is alone; a
//! waiting writer keeps new readers out, so a stream of readers never starves it; every
//! reader's share is a lease of its own; the last reader wakes a waiting writer and a
//! writer's release wakes the readers; what a task may take again. Each bound has its
//! control: the same run without the locks crosses it, or a writer that does not wait
//! shows the readers never leave on their own.
use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::*;
use distlock::{Error, Locks, distributed_lock};

both!(
    readers_share_and_a_writer_is_alone,
    never_a_writer_beside_a_reader,
    a_waiting_writer_is_not_starved_by_readers,
    a_crashed_readers_share_frees_at_its_ttl,
    the_last_reader_wakes_a_waiting_writer,
    a_writers_release_wakes_the_readers,
    a_reader_that_ran_out_is_lost_at_release,
    a_renewed_reader_keeps_writers_out,
    what_a_task_may_take_again,
    misuse_is_refused_before_redis,
    the_attribute_takes_either_side,
    readers_that_waited_go_before_the_next_writer,
);

const LONG: Duration = Duration::from_secs(10);

async fn readers_share_and_a_writer_is_alone(locks: Locks) {
    let a = locks.read_lock("cfg:a").acquire().await.unwrap();
    let b = locks.read_lock("cfg:a").acquire().await.unwrap();
    assert_eq!(a.info().is_read(), Some(true));
    let w = locks.write_lock("cfg:a").acquire().await;
    assert!(matches!(w, Err(Error::Busy { .. })), "{w:?}");
    a.release().await.unwrap();
    b.release().await.unwrap();
    let w = locks.write_lock("cfg:a").acquire().await.unwrap();
    assert_eq!(w.info().is_read(), Some(false));
    assert!(matches!(
        locks.read_lock("cfg:a").acquire().await,
        Err(Error::Busy { .. })
    ));
    assert!(matches!(
        locks.write_lock("cfg:a").acquire().await,
        Err(Error::Busy { .. })
    ));
    w.release().await.unwrap();
    locks
        .read_lock("cfg:a")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Who is inside, counted by every task of a run (of every runtime that shares it).
#[derive(Default)]
struct Seen {
    readers: AtomicI32,
    writers: AtomicI32,
    /// A writer beside anyone, seen this many times.
    bad: AtomicU32,
    /// Most readers at once.
    most: AtomicI32,
}

/// Readers and writers counted as they enter: (a writer beside anyone seen, most readers
/// at once). `locked` false: the same tasks without the locks.
async fn mixed(locks: &Locks, name: &str, locked: bool) -> (bool, i32) {
    let seen = Arc::new(Seen::default());
    mixed_into(locks, name, locked, &seen).await;
    (
        seen.bad.load(Ordering::SeqCst) > 0,
        seen.most.load(Ordering::SeqCst),
    )
}

async fn mixed_into(locks: &Locks, name: &str, locked: bool, seen: &Arc<Seen>) {
    let tasks = (0..12).map(|t| {
        let (locks, name, seen) = (locks.clone(), name.to_owned(), seen.clone());
        tokio::spawn(async move {
            let Seen {
                readers,
                writers,
                bad,
                most,
            } = &*seen;
            let writer = t % 4 == 0;
            for _ in 0..6 {
                let request = if writer {
                    locks.write_lock(name.clone())
                } else {
                    locks.read_lock(name.clone())
                };
                let guard = match locked {
                    true => Some(request.wait(LONG).acquire().await.unwrap()),
                    false => None,
                };
                if writer {
                    let w = writers.fetch_add(1, Ordering::SeqCst) + 1;
                    if w > 1 || readers.load(Ordering::SeqCst) > 0 {
                        bad.fetch_add(1, Ordering::SeqCst);
                    }
                } else {
                    let r = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(r, Ordering::SeqCst);
                    if writers.load(Ordering::SeqCst) > 0 {
                        bad.fetch_add(1, Ordering::SeqCst);
                    }
                }
                tokio::time::sleep(Duration::from_millis(4)).await;
                match writer {
                    true => writers.fetch_sub(1, Ordering::SeqCst),
                    false => readers.fetch_sub(1, Ordering::SeqCst),
                };
                if let Some(guard) = guard {
                    guard.release().await.unwrap();
                }
            }
        })
    });
    for t in futures_util::future::join_all(tasks).await {
        t.unwrap();
    }
}

async fn never_a_writer_beside_a_reader(locks: Locks) {
    let (overlap, most) = mixed(&locks, "cfg:b", true).await;
    assert!(!overlap, "a writer ran beside a reader or another writer");
    assert!(most > 1, "readers never shared ({most} at most)");
    // Control: the same tasks without the locks.
    let (overlap, _) = mixed(&locks, "cfg:b", false).await;
    assert!(
        overlap,
        "the control never overlapped: the workload does not race"
    );
}

/// Four readers in a stream that overlaps (each holds 30 ms, a new one every 10 ms)
/// for 1.5 s; `writer_wait` for a writer that comes after 100 ms. When it got the lock,
/// counted from its start.
async fn writer_in_a_stream(locks: &Locks, name: &str, writer_wait: Duration) -> Option<Duration> {
    let until = Instant::now() + Duration::from_millis(1500);
    let readers: Vec<_> = (0..4)
        .map(|i| {
            let (locks, name) = (locks.clone(), name.to_owned());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(10 * i)).await;
                while Instant::now() < until {
                    let r = locks
                        .read_lock(name.clone())
                        .wait(LONG)
                        .acquire()
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    r.release().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let got = match locks.write_lock(name).wait(writer_wait).acquire().await {
        Ok(w) => {
            let at = started.elapsed();
            w.release().await.unwrap();
            Some(at)
        }
        Err(Error::Busy { .. }) => None,
        Err(e) => panic!("{e}"),
    };
    for r in readers {
        r.await.unwrap();
    }
    got
}

async fn a_waiting_writer_is_not_starved_by_readers(locks: Locks) {
    let at = writer_in_a_stream(&locks, "cfg:c", LONG).await;
    let at = at.expect("the waiting writer never got the lock");
    // Long before the stream ends (1.4 s after the writer came).
    assert!(at < Duration::from_millis(1000), "{at:?}");
    // Control: a writer that does not wait finds the stream holding.
    assert_eq!(
        writer_in_a_stream(&locks, "cfg:c", Duration::ZERO).await,
        None
    );
}

async fn a_crashed_readers_share_frees_at_its_ttl(locks: Locks) {
    let ttl = Duration::from_millis(300);
    let taken = Instant::now();
    std::mem::forget(locks.read_lock("cfg:d").ttl(ttl).acquire().await.unwrap());
    let w = locks
        .write_lock("cfg:d")
        .wait(LONG)
        .acquire()
        .await
        .unwrap();
    let at = taken.elapsed();
    assert!(at >= ttl - Duration::from_millis(20) && at < LONG, "{at:?}");
    w.release().await.unwrap();
}

async fn the_last_reader_wakes_a_waiting_writer(locks: Locks) {
    let r1 = locks.read_lock("cfg:e").acquire().await.unwrap();
    let r2 = locks.read_lock("cfg:e").acquire().await.unwrap();
    let writer = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let w = locks
                .write_lock("cfg:e")
                .wait(LONG)
                .acquire()
                .await
                .unwrap();
            let at = Instant::now();
            w.release().await.unwrap();
            at
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    r1.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!writer.is_finished(), "the writer got in beside a reader");
    let released = Instant::now();
    r2.release().await.unwrap();
    let at = writer.await.unwrap();
    // Long before the readers' 30 s leases could have ended.
    assert!(
        at - released < Duration::from_secs(5),
        "{:?}",
        at - released
    );
}

async fn a_writers_release_wakes_the_readers(locks: Locks) {
    let w = locks.write_lock("cfg:f").acquire().await.unwrap();
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let locks = locks.clone();
            tokio::spawn(async move {
                let r = locks.read_lock("cfg:f").wait(LONG).acquire().await.unwrap();
                let at = Instant::now();
                tokio::time::sleep(Duration::from_millis(50)).await;
                r.release().await.unwrap();
                at
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    w.release().await.unwrap();
    for r in readers {
        let at = r.await.unwrap();
        assert!(
            at - released < Duration::from_secs(5),
            "{:?}",
            at - released
        );
    }
}

async fn a_reader_that_ran_out_is_lost_at_release(locks: Locks) {
    let late = locks
        .read_lock("cfg:g")
        .ttl(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let w = locks.write_lock("cfg:g").acquire().await.unwrap();
    assert!(matches!(late.release().await, Err(Error::Lost { .. })));
    w.release().await.unwrap();
    // Control: released within its ttl, a share is given back without error.
    let r = locks.read_lock("cfg:g").acquire().await.unwrap();
    r.release().await.unwrap();
}

async fn a_renewed_reader_keeps_writers_out(locks: Locks) {
    let ttl = Duration::from_millis(300);
    let r = locks
        .read_lock("cfg:h")
        .ttl(ttl)
        .renew(true)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(ttl * 3).await;
    assert!(matches!(
        locks.write_lock("cfg:h").acquire().await,
        Err(Error::Busy { .. })
    ));
    r.release().await.unwrap();
    // Control: not renewed, the share ends and a writer gets in.
    let r = locks.read_lock("cfg:h").ttl(ttl).acquire().await.unwrap();
    tokio::time::sleep(ttl * 3).await;
    let w = locks.write_lock("cfg:h").acquire().await.unwrap();
    assert!(matches!(r.release().await, Err(Error::Lost { .. })));
    w.release().await.unwrap();
}

async fn what_a_task_may_take_again(locks: Locks) {
    let w = locks.write_lock("cfg:i").acquire().await.unwrap();
    let inner = w
        .scope(async { locks.read_lock("cfg:i").acquire().await })
        .await
        .unwrap();
    assert!(inner.is_reentrant());
    inner.release().await.unwrap();
    w.release().await.unwrap();
    let r = locks.read_lock("cfg:i").acquire().await.unwrap();
    let again = r
        .scope(async { locks.read_lock("cfg:i").acquire().await })
        .await
        .unwrap();
    assert!(again.is_reentrant());
    again.release().await.unwrap();
    let upgrade = r
        .scope(async { locks.write_lock("cfg:i").acquire().await })
        .await;
    assert!(
        matches!(upgrade, Err(Error::Unsupported { .. })),
        "{upgrade:?}"
    );
    r.release().await.unwrap();
}

async fn misuse_is_refused_before_redis(locks: Locks) {
    for request in [locks.read_lock("cfg:j"), locks.write_lock("cfg:j")] {
        let kept = request.min_hold(Duration::from_secs(1)).acquire().await;
        assert!(matches!(kept, Err(Error::Unsupported { .. })), "{kept:?}");
    }
    let r = locks.read_lock("cfg:j").acquire().await.unwrap();
    assert!(matches!(r.fence().await, Err(Error::Unsupported { .. })));
    r.release().await.unwrap();
    let w = locks.write_lock("cfg:j").acquire().await.unwrap();
    let fence = w.fence().await.unwrap();
    w.release().await.unwrap();
    let w = locks.write_lock("cfg:j").acquire().await.unwrap();
    assert!(w.fence().await.unwrap() > fence);
    w.release().await.unwrap();
}

#[distributed_lock(key = "catalog:<shop>", mode = "read", wait = "10s", client = locks)]
async fn read_catalog(locks: &Locks, shop: u32, inside: &AtomicI32) -> Result<i32, AppError> {
    let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(30)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(n)
}

#[distributed_lock(key = "catalog:<shop>", mode = "write", wait = "10s", client = locks)]
async fn write_catalog(locks: &Locks, shop: u32, inside: &AtomicI32) -> Result<i32, AppError> {
    Ok(inside.load(Ordering::SeqCst))
}

async fn the_attribute_takes_either_side(locks: Locks) {
    let inside = AtomicI32::new(0);
    let (a, b, w) = tokio::join!(
        read_catalog(&locks, 1, &inside),
        read_catalog(&locks, 1, &inside),
        async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            write_catalog(&locks, 1, &inside).await
        }
    );
    assert_eq!(a.unwrap().max(b.unwrap()), 2, "the readers did not share");
    assert_eq!(w.unwrap(), 0, "the writer ran beside a reader");
}

/// What `redis-cli` shows: the writer's token at the key, the readers' tokens in
/// `{key}:readers` scored by their leases' ends, a waiting writer's mark in
/// `{key}:writer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keys_are_what_redis_cli_can_read() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let r = locks.read_lock("cfg:k").acquire().await.unwrap();
    let readers: Vec<String> = redis::cmd("ZRANGE")
        .arg("{lock:cfg:k}:readers")
        .arg(0)
        .arg(-1)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(readers, vec![r.token().to_owned()]);
    let writer = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let w = locks
                .write_lock("cfg:k")
                .wait(LONG)
                .acquire()
                .await
                .unwrap();
            let token = w.token().to_owned();
            w.release().await.unwrap();
            token
        })
    };
    let until = Instant::now() + Duration::from_secs(5);
    let mark: String = loop {
        let mark: Option<String> = redis::cmd("GET")
            .arg("{lock:cfg:k}:writer")
            .query_async(&mut raw)
            .await
            .unwrap();
        if let Some(mark) = mark {
            break mark;
        }
        assert!(Instant::now() < until, "no writer-waiting mark");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(matches!(
        locks.read_lock("cfg:k").acquire().await,
        Err(Error::Busy { .. })
    ));
    r.release().await.unwrap();
    assert_eq!(writer.await.unwrap(), mark);
    for key in ["lock:cfg:k", "{lock:cfg:k}:readers", "{lock:cfg:k}:writer"] {
        let exists: bool = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(!exists, "{key} left behind");
    }
}

/// Cancelled with its try in flight, a reader does not keep a share it may have been
/// given: it is taken back at once (control: the ttl is 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_try_cancelled_in_flight_gives_its_share_back() {
    let server = RedisServer::start();
    let proxy = common::proxy::FaultProxy::start(server.port);
    let locks = Locks::connect(&proxy.url()).await.unwrap();
    let mut raw = server.raw().await;
    locks
        .read_lock("cfg:l")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.set_latency(common::proxy::Dir::ToClient, Duration::from_millis(50));
    assert!(cancelled_in_flight(locks.read_lock("cfg:l").acquire()).await);
    nothing_left_after_cleanups(&mut raw, redis::cmd("ZCARD").arg("{lock:cfg:l}:readers")).await;
}

/// A restart that loses the lock: the reader and the writer are told `Lost` at release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_loses_readers_and_writers_and_says_so() {
    let mut server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let r = locks.read_lock("cfg:m").acquire().await.unwrap();
    let w = locks.write_lock("cfg:n").acquire().await.unwrap();
    server.restart();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match locks.write_lock("cfg:m").acquire().await {
            Ok(next) => {
                next.release().await.unwrap();
                break;
            }
            Err(Error::Backend { .. }) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(matches!(r.release().await, Err(Error::Lost { .. })));
    assert!(matches!(w.release().await, Err(Error::Lost { .. })));
}

/// One client shared by four current-thread runtimes on their own threads, each running
/// readers and a writer on one lock: never a writer beside anyone (control: the same
/// without the locks overlaps).
#[test]
fn runtimes_sharing_a_client_keep_writers_alone() {
    let server = RedisServer::start();
    let locks = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(Locks::connect(&server.url()))
        .unwrap();
    let run = |locked: bool| {
        let seen = Arc::new(Seen::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (locks, seen) = (locks.clone(), seen.clone());
                std::thread::spawn(move || {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                        .block_on(async move { mixed_into(&locks, "cfg:o", locked, &seen).await })
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        seen.bad.load(Ordering::SeqCst) > 0
    };
    assert!(!run(true), "a writer ran beside someone");
    assert!(run(false), "the control never overlapped");
}

/// Readers that waited behind a writer go before the next writer, even one of the same
/// client queued before them: turns alternate.
async fn readers_that_waited_go_before_the_next_writer(locks: Locks) {
    let w1 = locks.write_lock("cfg:p").acquire().await.unwrap();
    let took = |write: bool| {
        let locks = locks.clone();
        tokio::spawn(async move {
            let request = match write {
                true => locks.write_lock("cfg:p"),
                false => locks.read_lock("cfg:p"),
            };
            let g = request.wait(LONG).acquire().await.unwrap();
            let at = Instant::now();
            tokio::time::sleep(Duration::from_millis(30)).await;
            g.release().await.unwrap();
            at
        })
    };
    let w2 = took(true);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let readers: Vec<_> = (0..3).map(|_| took(false)).collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    w1.release().await.unwrap();
    let w2 = w2.await.unwrap();
    for r in readers {
        let r = r.await.unwrap();
        assert!(r < w2, "a reader that waited came after the next writer");
    }
}
