//! Replica acknowledgement (`replicas = n`): a primary and a replica the harness starts
//! (`--replicaof`), the replica paused (SIGSTOP) or the primary killed and the replica
//! promoted (`REPLICAOF NO ONE`), as in a failover. Each safety test has its control
//! without `replicas`, which shows the failure it prevents.
use crate::common;
use crate::http;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::FaultProxy;
use common::*;
use distlock::{Error, Locks};

/// A primary and a replica of it, linked.
fn pair() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let replica = replica_of(primary.port);
    (primary, replica)
}

/// A primary and a replica that replicates through a proxy: dropping the proxy's
/// replies cuts the replica off (it receives nothing more, and acknowledges nothing).
fn pair_via_proxy() -> (RedisServer, RedisServer, FaultProxy) {
    let primary = RedisServer::start();
    let proxy = FaultProxy::start(primary.port);
    let replica = replica_of(proxy.port());
    (primary, replica, proxy)
}

fn replica_of(port: u16) -> RedisServer {
    let port = port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !info(&replica, "replication").contains("master_link_status:up") {
        assert!(Instant::now() < deadline, "the replica linked");
        std::thread::sleep(Duration::from_millis(20));
    }
    replica
}

fn info(server: &RedisServer, section: &str) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &server.port.to_string(), "info", section])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The replica becomes a primary (what a failover does).
async fn promote(replica: &RedisServer) {
    let mut conn = replica.raw().await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// `WAIT` gets half the command timeout: 1 s here, wide enough for a loaded machine.
const TIMEOUT: Duration = Duration::from_secs(2);

async fn client(server: &RedisServer) -> Locks {
    Locks::builder(server.url())
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .unwrap()
}

/// Acknowledged: the lock and its fence; asking for more replicas than there are gives
/// the lock back with `NotReplicated` within the timeout, and the key is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_its_fence_wait_for_replicas() {
    let (primary, replica) = pair();
    let locks = client(&primary).await;
    let g = locks.lock("acked").replicas(1).acquire().await.unwrap();
    let fence = g.fence().await.unwrap();
    let on_replica: u64 = redis::AsyncCommands::get(&mut replica.raw().await, "{lock:acked}:fence")
        .await
        .unwrap();
    assert_eq!(
        on_replica, fence,
        "the replica had the fence when it was given"
    );
    g.release().await.unwrap();

    let started = Instant::now();
    let e = locks.lock("acked").replicas(2).acquire().await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::NotReplicated {
                acked: 1,
                wanted: 2,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let next = locks.lock("acked").acquire().await.unwrap();
    next.release().await.unwrap();

    // The client's default, and a fence of a lock taken with it.
    let strict = Locks::builder(primary.url())
        .command_timeout(TIMEOUT)
        .replicas(1)
        .connect()
        .await
        .unwrap();
    let g = strict.lock("acked").acquire().await.unwrap();
    replica.signal("STOP");
    let e = g.fence().await.unwrap_err();
    replica.signal("CONT");
    assert!(matches!(e, Error::NotReplicated { acked: 0, .. }), "{e:?}");
    assert_eq!(g.info().cached_fence(), None, "no fence given");
    g.release().await.unwrap();
}

/// The failover the field warns about: the replica misses the lock (cut off), the
/// primary dies, the replica is promoted, and another client takes the lock there.
/// Control, without `replicas`: both hold it at once. With `replicas = 1`: the first
/// acquire already failed with `NotReplicated`, so no two holders ever overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_never_makes_two_holders_with_replicas() {
    for replicas in [0u32, 1] {
        let (mut primary, replica, link) = pair_via_proxy();
        let first = client(&primary).await;
        link.drop_replies(true);
        let taken = first.lock("order:1").replicas(replicas).acquire().await;
        primary.kill();
        promote(&replica).await;
        let second = client(&replica).await;
        let other = second.lock("order:1").acquire().await;
        match replicas {
            0 => {
                assert!(
                    taken.is_ok(),
                    "control: the first client took it: {taken:?}"
                );
                assert!(
                    other.is_ok(),
                    "control: the promoted replica never saw the lock, so a second holder got it: {other:?}"
                );
            }
            _ => {
                assert!(
                    matches!(
                        taken,
                        Err(Error::NotReplicated {
                            acked: 0,
                            wanted: 1,
                            ..
                        })
                    ),
                    "{taken:?}"
                );
                assert!(other.is_ok(), "{other:?}");
            }
        }
    }
}

/// A fence never goes backwards across a failover. With `replicas = 1` the promoted
/// replica has the counter's last value; given while the replica missed it (`replicas =
/// 0`, the control), the promoted replica's counter is behind the last fence given, and
/// the next fence is still larger: fences follow the server's clock (before they did,
/// this fence went backwards).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_with_replicas_survives_a_failover() {
    for replicas in [0u32, 1] {
        let (mut primary, replica, link) = pair_via_proxy();
        let first = client(&primary).await;
        // Fences 1..=3 reach the replica.
        for _ in 0..3 {
            let g = first.lock("stock").acquire().await.unwrap();
            g.fence().await.unwrap();
            g.release().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if replicas == 0 {
            link.drop_replies(true);
        }
        let g = first
            .lock("stock")
            .ttl(Duration::from_millis(300))
            .replicas(replicas)
            .acquire()
            .await;
        let fence = match &g {
            Ok(g) => g.fence().await.unwrap(),
            Err(e) => panic!("{e:?}"),
        };
        primary.kill();
        link.drop_replies(true);
        promote(&replica).await;
        let second = client(&replica).await;
        // The replica may have the first lock too: it ends with its 300 ms lease.
        let next = second
            .lock("stock")
            .wait(Duration::from_secs(3))
            .acquire()
            .await
            .unwrap();
        let counter = second.inspect("stock").await.unwrap().last_fence;
        if replicas == 0 {
            assert!(
                counter < fence,
                "control: the replica missed the fence ({fence}, its counter {counter})"
            );
        } else {
            assert_eq!(counter, fence, "the replica had the fence");
        }
        let after = next.fence().await.unwrap();
        assert!(after > fence, "{fence} then {after}");
    }
}

#[distlock::idempotent(key = "pay:<id>", client = locks, replicas = 2, skip = [runs])]
async fn pay_two(locks: &Locks, id: u32, runs: &Runs) -> Result<u32, Error> {
    runs.bump();
    Ok(id)
}

#[distlock::idempotent(key = "pay:<id>", client = locks, replicas = 1, skip = [runs, replica])]
async fn pay_one(locks: &Locks, id: u32, runs: &Runs, replica: &RedisServer) -> Result<u32, Error> {
    runs.bump();
    if id == 2 {
        // The replica stops after the claim was acknowledged: the result is not.
        replica.signal("STOP");
    }
    Ok(id)
}

/// `#[idempotent(replicas = n)]`: a claim too few replicas acknowledged is given back
/// and the body does not run; a result too few acknowledged is stored on the primary
/// and the call is told (`NotReplicated`), so a retry replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_claims_and_results_wait_for_replicas() {
    let (primary, replica) = pair();
    let locks = client(&primary).await;
    let runs = Arc::new(Runs::default());
    let e = pay_two(&locks, 1, &runs).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::NotReplicated {
                acked: 1,
                wanted: 2,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(runs.get(), 0, "the body did not run");
    let records: Vec<String> = redis::AsyncCommands::keys(&mut primary.raw().await, "*pay:1")
        .await
        .unwrap();
    assert!(records.is_empty(), "the claim was given back: {records:?}");
    assert_eq!(pay_one(&locks, 1, &runs, &replica).await.unwrap(), 1);
    assert_eq!(runs.get(), 1);

    let e = pay_one(&locks, 2, &runs, &replica).await.unwrap_err();
    replica.signal("CONT");
    assert!(
        matches!(
            e,
            Error::NotReplicated {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(runs.get(), 2);
    assert_eq!(
        pay_one(&locks, 2, &runs, &replica).await.unwrap(),
        2,
        "replayed"
    );
    assert_eq!(runs.get(), 2, "from the primary, without running again");
}

#[distlock::idempotent(header = "Idempotency-Key", scope = "replicas", client = app.locks, replicas = 1, lease = "5s")]
async fn pay_handler(
    axum::extract::State(app): axum::extract::State<CountingApp>,
    body: String,
) -> String {
    format!("run {} of {}", app.runs.bump(), body.len())
}

/// A handler claims in the caller's task, then waits for the replica to acknowledge the
/// claim. The replica is paused, and a 300 ms timeout layer drops the call while it
/// waits: the body has not started, so the claim is given back at once (long before the
/// acknowledgement's 2 s wait ends). Once the replica runs again, the retry runs the
/// body, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_dropped_while_replicas_acknowledge_its_claim_gives_it_back() {
    let (primary, replica) = pair();
    let locks = Locks::builder(primary.url())
        .command_timeout(Duration::from_secs(4))
        .connect()
        .await
        .unwrap();
    let (addr, serving, runs) =
        serve_counting(locks, "/pay", pay_handler, Duration::from_millis(300)).await;
    let warm = http::post(addr, "/pay", Some("warm"), "{}").await;
    assert_eq!(warm.status, 200, "{}", warm.text());
    let mut raw = primary.raw().await;
    let waits = commandstat_calls(&mut raw, "wait").await;
    replica.signal("STOP");
    let started = Instant::now();
    let dropped = http::post(addr, "/pay", Some("k"), "{}").await;
    assert_eq!(dropped.status, 504, "{}", dropped.text());
    assert_eq!(
        commandstat_calls(&mut raw, "wait").await,
        waits + 1,
        "the call was dropped while the claim's acknowledgement waited"
    );
    let record = "lock:idem:suite::replicas::pay_handler:replicas:k";
    let gone = loop {
        let now: Option<String> = redis::AsyncCommands::get(&mut raw, record).await.unwrap();
        if now.is_none() {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "not given back while the acknowledgement waits: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    replica.signal("CONT");
    assert!(
        gone < Duration::from_millis(1500),
        "given back after {gone:?}"
    );
    assert_eq!(runs.get(), 1, "the dropped call never ran the body");
    let again = http::post(addr, "/pay", Some("k"), "{}").await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.text(), "run 2 of 2", "the retry ran the body");
    assert_eq!(runs.get(), 2, "the warm-up and the retry");
    serving.abort();
}

/// With `renew`, a renewal counts only once the replicas acknowledged it: a replica cut
/// off after the acquisition makes the lock lost when its lease ends. Control, without
/// `replicas`: still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_wait_for_replicas() {
    for replicas in [0u32, 1] {
        let (_primary, _replica, link) = pair_via_proxy();
        let locks = client(&_primary).await;
        let g = locks
            .lock("renewed")
            .ttl(Duration::from_millis(600))
            .renew(true)
            .replicas(replicas)
            .acquire()
            .await
            .unwrap();
        link.drop_replies(true);
        let lost = tokio::time::timeout(Duration::from_secs(4), g.lost()).await;
        if replicas == 0 {
            assert!(lost.is_err(), "control: renewed without replicas");
            assert!(g.info().is_held());
        } else {
            assert!(
                lost.is_ok(),
                "unacknowledged renewals: lost at the lease's end"
            );
        }
        drop(g);
    }
}

/// `WAIT` holds its connection: a call waiting for a paused replica does not hold up the
/// client's other calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_slows_only_the_calls_that_wait_for_it() {
    let (primary, replica) = pair();
    let locks = client(&primary).await;
    replica.signal("STOP");
    let waiting = tokio::spawn({
        let locks = locks.clone();
        async move {
            let started = Instant::now();
            let r = locks.lock("strict").replicas(1).acquire().await.map(drop);
            (r, started.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    let others: Vec<_> = (0..8)
        .map(|i| {
            let locks = locks.clone();
            tokio::spawn(async move {
                for _ in 0..5 {
                    let g = locks.lock(format!("free:{i}")).acquire().await.unwrap();
                    g.release().await.unwrap();
                }
            })
        })
        .collect();
    for o in others {
        o.await.unwrap();
    }
    let others_took = started.elapsed();
    let (r, waited) = waiting.await.unwrap();
    replica.signal("CONT");
    assert!(matches!(r, Err(Error::NotReplicated { .. })), "{r:?}");
    assert!(
        others_took < waited / 2,
        "40 other cycles took {others_took:?} while the replicated acquire waited {waited:?}"
    );
}

/// Between the lines of a replicated acquire: cancelled while it waits for a paused
/// replica, and its connection killed during the wait. Either way the lock is given
/// back (another client takes it long before its 30 s lease), and the caller sees an
/// error, never a lock. Used from a runtime of its own, the client works as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_acquire_cancelled_or_cut_gives_the_lock_back() {
    let (primary, replica) = pair();
    let proxy = FaultProxy::start(primary.port);
    let locks = proxy.locks(TIMEOUT);
    let other = client(&primary).await;
    let free_soon = |key: &'static str| time_to_take(&other, key, Duration::from_secs(5));

    // From another runtime: acknowledged, fenced, released.
    let from_thread = locks.clone();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let g = from_thread.lock("rt").replicas(1).acquire().await.unwrap();
                g.fence().await.unwrap();
                g.release().await.unwrap();
            })
    })
    .join()
    .unwrap();

    replica.signal("STOP");
    // Cancelled at the WAIT.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        locks.lock("c").replicas(1).acquire(),
    )
    .await;
    assert!(cancelled.is_err(), "still waiting for the replica");
    let took = free_soon("c").await;
    assert!(took < Duration::from_secs(5), "given back after {took:?}");

    // The connection killed during the WAIT.
    let waiting = tokio::spawn({
        let locks = locks.clone();
        async move { locks.lock("k").replicas(1).acquire().await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.reset_all();
    let cut = waiting.await.unwrap();
    assert!(
        matches!(
            cut,
            Err(Error::Backend { .. } | Error::NotReplicated { .. })
        ),
        "{cut:?}"
    );
    let took = free_soon("k").await;
    assert!(took < Duration::from_secs(5), "given back after {took:?}");
    replica.signal("CONT");
}

/// A semaphore's permit and a read share wait for replicas as a lock does: on the
/// replica when acquired; more replicas than there are give it back with
/// `NotReplicated`, and the permit is free at once. The write lock is a lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_and_read_shares_wait_for_replicas() {
    let (primary, replica) = pair();
    let locks = client(&primary).await;
    let mut on_replica = replica.raw().await;
    let p = locks
        .semaphore("acked:p", 1)
        .replicas(1)
        .acquire()
        .await
        .unwrap();
    let held: Vec<String> = redis::cmd("ZRANGE")
        .arg("lock:acked:p")
        .arg(0)
        .arg(-1)
        .query_async(&mut on_replica)
        .await
        .unwrap();
    assert_eq!(held, vec![p.token().to_owned(), "limit:1".to_owned()]);
    p.release().await.unwrap();
    let e = locks
        .semaphore("acked:p", 1)
        .replicas(2)
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::NotReplicated {
                acked: 1,
                wanted: 2,
                ..
            }
        ),
        "{e:?}"
    );
    let next = locks.semaphore("acked:p", 1).acquire().await.unwrap();
    next.release().await.unwrap();

    let r = locks
        .read_lock("acked:rw")
        .replicas(1)
        .acquire()
        .await
        .unwrap();
    let readers: Vec<String> = redis::cmd("ZRANGE")
        .arg("{lock:acked:rw}:readers")
        .arg(0)
        .arg(-1)
        .query_async(&mut on_replica)
        .await
        .unwrap();
    assert_eq!(readers, vec![r.token().to_owned()]);
    r.release().await.unwrap();
    let w = locks
        .write_lock("acked:rw")
        .replicas(1)
        .acquire()
        .await
        .unwrap();
    let writer: Option<String> = redis::AsyncCommands::get(&mut on_replica, "lock:acked:rw")
        .await
        .unwrap();
    assert_eq!(writer.as_deref(), Some(w.token()));
    w.release().await.unwrap();
}

/// A failover behind one endpoint name, of a primary `P` whose replica `R1` has a
/// replica of its own (`R2`): `R1` is promoted (it stops following `P`, and `R2` goes
/// on following it), then the name moves to it and every connection through the name is
/// reset, as a managed failover does. Returns the name, `P`, `R1`, `R2`.
struct Failover {
    name: Arc<FaultProxy>,
    old: RedisServer,
    new: RedisServer,
    _new_replica: RedisServer,
}

impl Failover {
    fn start() -> Failover {
        let old = RedisServer::start();
        let new = replica_of(old.port);
        let new_replica = replica_of(new.port);
        Failover {
            name: Arc::new(FaultProxy::start(old.port)),
            old,
            new,
            _new_replica: new_replica,
        }
    }

    /// A client through the name that, at the first event called `at`, moves the name
    /// to the new primary and resets every connection through it (the failover's
    /// second half: its first, the promotion, is the caller's).
    async fn client_moving_at(&self, at: &'static str) -> Locks {
        let (name, port) = (self.name.clone(), self.new.port);
        let moved = std::sync::atomic::AtomicBool::new(false);
        Locks::builder(self.name.url())
            .command_timeout(TIMEOUT)
            .observer(move |e: &distlock::Event<'_>| {
                if e.name() == at && !moved.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    name.move_to(port);
                    name.reset_all();
                    // The client's connections see their ends closed.
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
            .connect()
            .await
            .unwrap()
    }
}

#[distlock::idempotent(key = "ship:<id>", client = locks, replicas = 1, skip = [runs, new])]
async fn ship_acked(locks: &Locks, id: u32, runs: &Runs, new: &RedisServer) -> Result<u32, Error> {
    runs.bump();
    // The failover begins while the body runs: the result stored next reaches the old
    // primary alone.
    promote(new).await;
    Ok(id)
}

#[distlock::idempotent(key = "ship:<id>", client = locks, skip = [runs, new])]
async fn ship_plain(locks: &Locks, id: u32, runs: &Runs, new: &RedisServer) -> Result<u32, Error> {
    runs.bump();
    promote(new).await;
    Ok(id)
}

/// A failover between a stored result and its replicas' acknowledgement: the result
/// reached the old primary alone, and the acknowledgement goes to the new one. It is
/// the stored result made sure of and the `WAIT`, in one pipeline: the new primary is
/// found lacking the result, writes it, and its replica acknowledges it; a retry
/// replays it, and the body ran once. (A barrier written on another connection was
/// acknowledged by the new primary's replica without the result: the call said the
/// result was replicated, and the retry found the claim in progress.) Control: the
/// same failover without `replicas` loses the result: the retry is not replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_lost_in_a_failover_before_its_acknowledgement_is_written_again() {
    for acked in [true, false] {
        let f = Failover::start();
        let locks = f.client_moving_at("stored").await;
        let runs = Runs::default();
        let first = match acked {
            true => ship_acked(&locks, 1, &runs, &f.new).await,
            false => ship_plain(&locks, 1, &runs, &f.new).await,
        };
        assert_eq!(first.unwrap(), 1, "acked: {acked}");
        let on_old: Vec<String> =
            redis::AsyncCommands::keys(&mut f.old.raw().await, "*ship_acked:ship:1")
                .await
                .unwrap();
        let on_old: Option<String> = match on_old.first() {
            Some(key) => redis::AsyncCommands::get(&mut f.old.raw().await, key)
                .await
                .unwrap(),
            None => None,
        };
        let retry = match acked {
            true => ship_acked(&locks, 1, &runs, &f.new).await,
            false => ship_plain(&locks, 1, &runs, &f.new).await,
        };
        if acked {
            assert!(
                on_old.is_some_and(|r| r.contains("completed")),
                "stored on the old primary first"
            );
            assert_eq!(retry.unwrap(), 1, "replayed from the new primary");
            assert_eq!(runs.get(), 1, "the body ran once");
        } else {
            assert!(
                !(retry.is_ok() && runs.get() == 1),
                "control: the failover lost the result, and the retry is not replayed: {retry:?}, {} runs",
                runs.get()
            );
        }
    }
}

#[distlock::idempotent(key = "post:<id>", client = locks, replicas = 1, skip = [runs])]
async fn post_one(locks: &Locks, id: u32, runs: &Runs) -> Result<u32, Error> {
    runs.bump();
    Ok(id)
}

/// The stored result's acknowledgement counts the result even when its confirmation
/// finds it there and has nothing to write again: it writes its expiry again, so the
/// `WAIT` behind it has a write of its connection's to count (a `WAIT` after a script
/// that only read counts nothing new and answered at once with every replica, a paused
/// one included). The replica pauses just after the store: the call is told
/// `NotReplicated`, and a retry replays the result once the replica is back. Control:
/// before the pause, the same call is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_result_found_there_is_still_counted_by_its_wait() {
    let (primary, replica) = pair();
    let replica = Arc::new(replica);
    let pause = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let locks = {
        let (replica, pause) = (replica.clone(), pause.clone());
        Locks::builder(primary.url())
            .command_timeout(TIMEOUT)
            .observer(move |e: &distlock::Event<'_>| {
                if e.name() == "stored" && pause.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    replica.signal("STOP");
                }
            })
            .connect()
            .await
            .unwrap()
    };
    let runs = Runs::default();
    assert_eq!(post_one(&locks, 1, &runs).await.unwrap(), 1, "control");
    pause.store(true, std::sync::atomic::Ordering::SeqCst);
    let e = post_one(&locks, 2, &runs).await.unwrap_err();
    replica.signal("CONT");
    assert!(
        matches!(
            e,
            Error::NotReplicated {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(post_one(&locks, 2, &runs).await.unwrap(), 2, "replayed");
    assert_eq!(runs.get(), 2);
}

#[distlock::idempotent(key = "book:<id>", client = locks, replicas = 1, skip = [runs, other])]
async fn book_acked(locks: &Locks, id: u32, runs: &Runs, other: &Locks) -> Result<u32, Error> {
    runs.bump();
    // Another instance, on the new primary, sends the same key while the body runs.
    if let Ok(id) = Box::pin(book_acked(other, id, runs, other)).await {
        return Ok(id + 100);
    }
    Ok(id)
}

#[distlock::idempotent(key = "book:<id>", client = locks, skip = [runs, other])]
async fn book_plain(locks: &Locks, id: u32, runs: &Runs, other: &Locks) -> Result<u32, Error> {
    runs.bump();
    if let Ok(id) = Box::pin(book_plain(other, id, runs, other)).await {
        return Ok(id + 100);
    }
    Ok(id)
}

/// A failover between a claim and its replicas' acknowledgement: the claim reached the
/// old primary alone (the new one had stopped following it), and the acknowledgement
/// goes to the new one. It is the claim's renewal and the `WAIT` in one pipeline: the
/// new primary is found lacking the claim, writes it again under the same owner, and
/// its replica acknowledges it before the body runs; another instance that sends the
/// same key to the new primary meanwhile gets `InProgress`, and the body ran once.
/// Control: the same failover without `replicas`: the other instance claims the key on
/// the new primary and the body runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lost_in_a_failover_before_its_acknowledgement_is_written_again() {
    for acked in [true, false] {
        let f = Failover::start();
        promote(&f.new).await;
        let locks = f.client_moving_at("claimed").await;
        let other = client(&f.new).await;
        let runs = Runs::default();
        let first = match acked {
            true => book_acked(&locks, 1, &runs, &other).await,
            false => book_plain(&locks, 1, &runs, &other).await,
        };
        if acked {
            assert_eq!(first.unwrap(), 1, "the other instance got InProgress");
            assert_eq!(runs.get(), 1, "the body ran once");
            assert_eq!(
                book_acked(&other, 1, &runs, &other).await.unwrap(),
                1,
                "replayed on the new primary"
            );
            assert_eq!(runs.get(), 1);
        } else {
            // The first call's result then finds the other's stored first (`Lost`).
            assert_eq!(
                runs.get(),
                2,
                "control: the other instance ran the body too ({first:?})"
            );
        }
    }
}

/// A claim's acknowledgement is its confirmation and `WAIT` in one pipeline on one
/// connection, as a lock's is: a barrier sent on another connection after the claim
/// (`{record}:acked`, then `WAIT`) could be acknowledged by a new primary's replicas
/// after a failover that lost the claim. Read from `MONITOR` on the primary (which does
/// not show `WAIT` itself): before the result is stored, the claim is confirmed by the
/// renewal script naming the record, and after it the result by `idem_confirm_store`;
/// no barrier (`{record}:acked`) is written anywhere. Control: the same `MONITOR`
/// shows the store itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_and_its_wait_go_in_one_pipeline() {
    let (primary, replica) = pair();
    let locks = client(&primary).await;
    let mut monitor = std::process::Command::new("redis-cli")
        .args(["-p", &primary.port.to_string(), "monitor"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = {
        use std::io::BufRead;
        let stdout = monitor.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        rx
    };
    std::thread::sleep(Duration::from_millis(200));
    let runs = Arc::new(Runs::default());
    assert_eq!(pay_one(&locks, 7, &runs, &replica).await.unwrap(), 7);
    std::thread::sleep(Duration::from_millis(200));
    let _ = monitor.kill();
    let _ = monitor.wait();
    let seen: Vec<String> = lines.try_iter().collect();
    let record = "pay_one:pay:7";
    let stored = seen
        .iter()
        .position(|l| l.contains(record) && l.contains("completed") && !l.contains("EVAL"))
        .expect("the result stored");
    let confirmed = seen[..stored]
        .iter()
        .any(|l| l.contains("\"EVAL\"") && l.contains("idem_renew") && l.contains(record));
    assert!(confirmed, "the claim confirmed by its renewal: {seen:#?}");
    let barrier = |l: &&String| l.contains(record) && l.contains(":acked");
    assert!(!seen.iter().any(|l| barrier(&l)), "no barrier: {seen:#?}");
    let confirmed = seen[stored..].iter().any(|l| {
        l.contains("\"EVAL\"") && l.contains("A stored result made sure of") && l.contains(record)
    });
    assert!(confirmed, "the result confirmed by its script: {seen:#?}");
}

/// A failover behind one endpoint name (as managed Redis does it): the name moves to the
/// new primary, the old one is demoted and keeps its clients, answering `READONLY`. Every
/// kind of connection the client has to the old one (the direct ones that serve lone
/// lock calls, the multiplexed one) is dropped at its first `READONLY` with its idle
/// siblings, and the next connection reaches the new primary: a direct connection that
/// answered `READONLY` once went back to the pool, and 20 of 20 lock cycles failed.
/// Control: the same cycles before the move, on the old primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_behind_a_moved_name_is_left() {
    let old = RedisServer::start();
    let new = RedisServer::start();
    let name = FaultProxy::start(old.port);
    let locks = Locks::builder(name.url())
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let cycle = |n: u32| {
        let locks = locks.clone();
        async move {
            let mut ok = 0;
            for i in 0..n {
                if let Ok(g) = locks.lock(format!("moved:{i}")).acquire().await
                    && g.release().await.is_ok()
                {
                    ok += 1;
                }
            }
            ok
        }
    };
    assert_eq!(cycle(20).await, 20, "control: on the old primary");
    // The failover: the name moves to the new primary, the old one follows it.
    name.move_to(new.port);
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(new.port)
        .query_async(&mut old.raw().await)
        .await
        .unwrap();
    let done = cycle(20).await;
    assert!(done >= 17, "{done} of 20 cycles after the failover");
    let mut raw = new.raw().await;
    let keys: Vec<String> = redis::AsyncCommands::keys(&mut raw, "lock:*")
        .await
        .unwrap();
    assert!(keys.is_empty(), "released on the new primary: {keys:?}");
    let g = locks.lock("moved:last").acquire().await.unwrap();
    let on_new: Option<String> = redis::AsyncCommands::get(&mut raw, "lock:moved:last")
        .await
        .unwrap();
    assert_eq!(on_new.as_deref(), Some(g.token()));
    g.release().await.unwrap();
}
