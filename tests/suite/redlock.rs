//! Redlock over 5 independent masters the harness starts: locks exclude with 2 masters
//! killed; 3 killed is a `Backend` error within the timeout; a master paused with
//! SIGSTOP costs a call at most the per-node timeout; a holder whose renewals lose the
//! quorum is told `Lost`, and another client gets in. `#[idempotent]` over the same
//! masters: 50 concurrent calls from two clients run the body once, with 2 masters
//! killed too, replays and mismatches as on one Redis, and a lease that loses its
//! quorum lets a retry in (control: two clients each on one master of their own run the
//! body twice). Between the lines: replies held past the timeout on two masters and
//! delivered late, an idempotency claim that reaches three masters only after its
//! give-back, `acquire()` and `release()` cancelled at every point, one client used
//! from two runtimes. Fences and `replicas` are refused with an error that says why.
use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::proxy::FaultProxy;
use common::*;
use distlock::{Error, Locks, idempotent};

const TIMEOUT: Duration = Duration::from_millis(300);

fn masters() -> Vec<RedisServer> {
    (0..5).map(|_| RedisServer::start()).collect()
}

async fn client(masters: &[RedisServer]) -> Locks {
    Locks::redlock(masters.iter().map(RedisServer::url))
        .command_timeout(TIMEOUT)
        .build()
        .unwrap()
}

/// `GET key` on one master.
async fn get(raw: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(raw).await.unwrap()
}

/// How many masters hold `token` at `lock:<name>`.
async fn holding(masters: &[RedisServer], name: &str, token: &str) -> usize {
    let mut n = 0;
    for m in masters.iter().filter(|m| m.pid().is_some()) {
        let held = get(&mut m.raw().await, &format!("lock:{name}")).await;
        n += usize::from(held.as_deref() == Some(token));
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_on_a_quorum_of_five_masters() {
    let masters = masters();
    let locks = client(&masters).await;
    locks.ping().await.unwrap();
    let g = locks.lock("a").acquire().await.unwrap();
    assert_eq!(holding(&masters, "a", g.token()).await, 5);
    assert!(matches!(
        locks.lock("a").acquire().await,
        Err(Error::Busy { .. })
    ));
    // No fence that is not safe: an error that says why.
    match g.fence().await {
        Err(Error::Backend { source, .. }) => {
            assert!(source.to_string().contains("Redlock"), "{source}")
        }
        other => panic!("expected a Backend error, got {other:?}"),
    }
    g.release().await.unwrap();
    assert_eq!(holding(&masters, "a", "").await, 0);
    // Renewed on the quorum while held past its ttl.
    let g = locks
        .lock("renewed")
        .ttl(Duration::from_millis(300))
        .renew(true)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(matches!(
        locks.lock("renewed").acquire().await,
        Err(Error::Busy { .. })
    ));
    g.release().await.unwrap();
    // `replicas` is refused at build.
    assert!(
        Locks::redlock(masters.iter().map(RedisServer::url))
            .replicas(1)
            .build()
            .is_err()
    );
}

/// Tasks on two clients take `name` in turn (or, unlocked, just run) and count how often
/// two were inside at once.
async fn overlaps(clients: &[Locks], name: &'static str, locked: bool) -> usize {
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for locks in clients {
        for _ in 0..3 {
            let (locks, inside, overlaps) = (locks.clone(), inside.clone(), overlaps.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let g = if locked {
                        Some(
                            locks
                                .lock(name)
                                .wait(Duration::from_secs(20))
                                .acquire()
                                .await
                                .unwrap(),
                        )
                    } else {
                        None
                    };
                    if inside.fetch_add(1, Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    if let Some(g) = g {
                        g.release().await.unwrap();
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    overlaps.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_masters_killed_locks_still_exclude() {
    let mut masters = masters();
    masters[0].kill();
    masters[3].kill();
    let clients = [client(&masters).await, client(&masters).await];
    assert_eq!(overlaps(&clients, "two-down", true).await, 0);
    // The control: the same work without the lock overlaps.
    assert!(overlaps(&clients, "two-down", false).await > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_masters_killed_is_a_backend_error() {
    let mut masters = masters();
    for i in [0, 2, 4] {
        masters[i].kill();
    }
    let locks = client(&masters).await;
    let started = Instant::now();
    let got = locks
        .lock("three-down")
        .wait(Duration::from_secs(2))
        .acquire()
        .await;
    assert!(matches!(got, Err(Error::Backend { .. })), "{got:?}");
    assert!(
        started.elapsed() < 3 * TIMEOUT,
        "took {:?}",
        started.elapsed()
    );
    // And nothing is left behind on the two that answered.
    assert_eq!(holding(&masters, "three-down", "").await, 0);
    let mut left = 0;
    for m in masters.iter().filter(|m| m.pid().is_some()) {
        let mut raw = m.raw().await;
        let n: usize = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
        left += n;
    }
    assert_eq!(left, 0, "the partial lock was given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_costs_a_call_the_node_timeout_at_most() {
    let masters = masters();
    let locks = client(&masters).await;
    locks.ping().await.unwrap();
    masters[1].signal("STOP");
    for _ in 0..5 {
        let started = Instant::now();
        let g = locks.lock("paused").acquire().await.unwrap();
        g.release().await.unwrap();
        // Two calls, each waiting at most for the paused master's timeout.
        assert!(
            started.elapsed() < 2 * TIMEOUT + Duration::from_millis(300),
            "took {:?}",
            started.elapsed()
        );
    }
    masters[1].signal("CONT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_renewals_lose_the_quorum_is_told_lost() {
    let masters = masters();
    let holder = client(&masters).await;
    let other = client(&masters).await;
    let g = holder
        .lock("quorum")
        .ttl(Duration::from_millis(600))
        .renew(true)
        .acquire()
        .await
        .unwrap();
    // Three masters paused past the ttl: renewals reach two, not a quorum.
    for m in &masters[..3] {
        m.signal("STOP");
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for m in &masters[..3] {
        m.signal("CONT");
    }
    assert!(
        !g.info().is_held(),
        "the lease ended without a quorum's renewal"
    );
    // Expired on the three: another client gets in (on a quorum of them).
    let g2 = other
        .lock("quorum")
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    assert!(matches!(g.release().await, Err(Error::Lost { .. })));
    g2.release().await.unwrap();
}

#[idempotent(key = "charge:<id>", client = locks, wait = "20s", skip = [runs], fingerprint = [id, amount])]
async fn charge(locks: &Locks, id: &str, amount: u64, runs: &Runs) -> Result<String, AppError> {
    let n = runs.bump();
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(format!("charged {amount} as run {n}"))
}

/// 50 calls at once, half on each of two clients, for one key: the body runs once and
/// every call gets its result.
async fn fifty_calls(clients: &[Locks; 2], id: &'static str, runs: &Arc<Runs>) -> Vec<String> {
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (locks, runs) = (clients[i % 2].clone(), runs.clone());
        tasks.push(tokio::spawn(
            async move { charge(&locks, id, 100, &runs).await },
        ));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap().unwrap());
    }
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_calls_over_five_masters_run_once() {
    let mut masters = masters();
    let clients = [client(&masters).await, client(&masters).await];
    let runs = Arc::new(Runs::default());
    let results = fifty_calls(&clients, "all-up", &runs).await;
    assert_eq!(runs.get(), 1, "the body ran once");
    assert!(results.iter().all(|r| *r == results[0]));
    // A replay, and another payload under the same key.
    assert_eq!(
        charge(&clients[0], "all-up", 100, &runs).await.unwrap(),
        results[0]
    );
    let other = charge(&clients[1], "all-up", 999, &runs).await;
    assert!(
        matches!(other, Err(AppError::Lock(Error::PayloadMismatch { .. }))),
        "{other:?}"
    );
    assert_eq!(runs.get(), 1);

    // Two masters killed: still once.
    masters[1].kill();
    masters[4].kill();
    let runs = Arc::new(Runs::default());
    let results = fifty_calls(&clients, "two-down", &runs).await;
    assert_eq!(runs.get(), 1, "the body ran once with two masters down");
    assert!(results.iter().all(|r| *r == results[0]));
    assert_eq!(
        charge(&clients[1], "two-down", 100, &runs).await.unwrap(),
        results[0]
    );

    // Three down: a `Backend` error, and the body does not run.
    masters[2].kill();
    let got = charge(&clients[0], "three-down", 100, &runs).await;
    assert!(
        matches!(got, Err(AppError::Lock(Error::Backend { .. }))),
        "{got:?}"
    );
    assert_eq!(runs.get(), 1);
}

/// The control: two clients, each on a master of its own (no quorum between them), run
/// the body once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_independent_masters_without_a_quorum_run_twice() {
    let masters = masters();
    let clients = [
        Locks::builder(masters[0].url()).build().unwrap(),
        Locks::builder(masters[1].url()).build().unwrap(),
    ];
    let runs = Arc::new(Runs::default());
    let mut tasks = Vec::new();
    for i in 0..10 {
        let (locks, runs) = (clients[i % 2].clone(), runs.clone());
        tasks.push(tokio::spawn(async move {
            charge(&locks, "apart", 100, &runs).await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(runs.get(), 2);
}

#[idempotent(key = "slow:<id>", client = locks, lease = "600ms", skip = [runs])]
async fn slow(locks: &Locks, id: &str, runs: &Runs) -> Result<u32, AppError> {
    let n = runs.bump();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    Ok(n)
}

/// A claim whose renewals reach only two masters (three paused past its lease) is lost:
/// the call is told so and stores nothing; a retry on another client then runs the body
/// again, on a quorum of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_claim_that_loses_its_quorum_lets_a_retry_in() {
    let masters = masters();
    let (holder, other) = (client(&masters).await, client(&masters).await);
    let runs = Arc::new(Runs::default());
    let first = tokio::spawn({
        let (holder, runs) = (holder.clone(), runs.clone());
        async move { slow(&holder, "quorum", &runs).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    for m in &masters[..3] {
        m.signal("STOP");
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for m in &masters[..3] {
        m.signal("CONT");
    }
    let lost = first.await.unwrap();
    assert!(
        matches!(lost, Err(AppError::Lock(Error::Lost { .. }))),
        "{lost:?}"
    );
    // The masters just resumed may answer late on a loaded machine: a try that found no
    // quorum is `InProgress` for at most the 600 ms lease, never for the retention.
    let retried = Instant::now();
    let again = loop {
        match slow(&other, "quorum", &runs).await {
            Err(AppError::Lock(Error::InProgress { .. }))
                if retried.elapsed() < Duration::from_secs(3) =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            again => break again,
        }
    };
    assert_eq!(again.unwrap(), 2, "the retry ran the body");
    assert_eq!(runs.get(), 2);
}

#[idempotent(key = "late:<id>", client = locks, lease = "5s", skip = [runs])]
async fn late(locks: &Locks, id: &str, runs: &Runs) -> Result<u32, AppError> {
    if id == "fail" {
        return Err(AppError::App("an error releases the claim"));
    }
    Ok(runs.bump())
}

/// The claim's `SET`s are held on their way to three masters past the 600 ms command
/// timeout: no quorum answered, so the call is a `Backend` error, and the claim is given
/// back on every master (by the claim itself, then by the give-back), finding nothing on
/// the three. The held `SET`s then land there, after the give-back. Its second try, a
/// command timeout later (on Redlock whatever the first found), removes them: another
/// client's retry runs the body long before the 5 s lease ends. (Checked by hand:
/// without that second try the retry gets `InProgress` until the lease ends, and the
/// test fails on "not given back".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_claim_that_reaches_masters_after_its_give_back_is_given_back_again() {
    let masters = masters();
    let proxies: Vec<FaultProxy> = masters.iter().map(|m| FaultProxy::start(m.port)).collect();
    let locks = Locks::redlock(proxies.iter().map(FaultProxy::url))
        .command_timeout(Duration::from_millis(600))
        .build()
        .unwrap();
    let other = client(&masters).await;
    let runs = Runs::default();
    // Connections made, and the release script loaded on every master (an `Err` gives
    // its claim back), so that each give-back below is one `EVALSHA` per master.
    let warm = late(&locks, "fail", &runs).await;
    assert!(matches!(warm, Err(AppError::App(_))), "{warm:?}");
    let key = "lock:idem:suite::redlock::late:late:1";
    let mut held = Vec::new();
    for m in &masters[..3] {
        let mut raw = m.raw().await;
        let releases = commandstat_calls(&mut raw, "evalsha").await;
        held.push((raw, releases));
    }
    // The claim's `SET` of the key, and nothing else (a give-back is a script).
    let claim = format!("SET\r\n${}\r\n{key}", key.len());
    for p in &proxies[..3] {
        p.hold_commands_containing(Some(claim.as_bytes()));
    }
    let e = late(&locks, "1", &runs).await;
    assert!(
        matches!(e, Err(AppError::Lock(Error::Backend { .. }))),
        "{e:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    for (raw, releases) in &mut held {
        while commandstat_calls(raw, "evalsha").await < *releases + 2 {
            assert!(Instant::now() < deadline, "the give-back was not sent");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(get(raw, key).await, None, "the claim is still held");
    }
    // The fault's condition: the claim lands on the three after its give-back.
    for p in &proxies[..3] {
        p.hold_commands_containing(None);
    }
    let landed = Instant::now();
    for (raw, _) in &mut held {
        // Well before the second try, 600 ms after the first.
        wait_for_claim(raw, key, landed, Duration::from_millis(500)).await;
    }
    let again =
        retry_while_in_progress(|| late(&other, "1", &runs), landed, Duration::from_secs(3)).await;
    assert_eq!(again.unwrap(), 1, "the retry ran the body");
    assert!(landed.elapsed() < Duration::from_secs(3));
    assert_eq!(runs.get(), 1);
}

/// 5 masters, each behind a fault proxy, and a client through the proxies.
fn proxied(masters: &[RedisServer]) -> (Vec<FaultProxy>, Locks) {
    let proxies: Vec<FaultProxy> = masters.iter().map(|m| FaultProxy::start(m.port)).collect();
    let locks = Locks::redlock(proxies.iter().map(FaultProxy::url))
        .command_timeout(TIMEOUT)
        .build()
        .unwrap();
    (proxies, locks)
}

/// Waits up to `within` until no master holds `lock:<name>`; whether none did.
async fn freed(masters: &[RedisServer], name: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let mut held = 0;
        for m in masters {
            let v = get(&mut m.raw().await, &format!("lock:{name}")).await;
            held += usize::from(v.is_some());
        }
        if held == 0 {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two masters run the holder's commands but its replies from them are held past the
/// timeout: the holder takes the lock on the other three and releases it there; the
/// next holder gets in at once (a quorum of three is free). When the held replies are
/// delivered, late, the holder's token is also taken off the two masters, long before
/// its 30 s ttl (so a later outage of two other masters does not leave no quorum for
/// the ttl).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_held_past_the_timeout_on_two_masters() {
    let masters = masters();
    let (proxies, locks) = proxied(&masters);
    let other = client(&masters).await;
    locks.ping().await.unwrap();
    proxies[0].hold_replies();
    proxies[1].hold_replies();
    let g = locks
        .lock("held")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    assert_eq!(
        holding(&masters, "held", g.token()).await,
        5,
        "the two held masters ran the SET too"
    );
    g.release().await.unwrap();
    let next = other
        .lock("held")
        .acquire()
        .await
        .expect("the next holder gets in on the three free masters");
    next.release().await.unwrap();
    proxies[0].release_replies();
    proxies[1].release_replies();
    assert!(
        freed(&masters, "held", Duration::from_secs(5)).await,
        "the late masters were cleared long before the ttl"
    );
}

/// `acquire()` and then `release()` cancelled after 0 to 15 ms, with 2 ms of latency
/// each way on every master: wherever the cancellation lands, another client gets the
/// lock long before its 30 s ttl, and then no master holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_and_release_cancelled_at_every_point() {
    use common::proxy::Dir;
    let masters = masters();
    let (proxies, locks) = proxied(&masters);
    let other = client(&masters).await;
    locks.ping().await.unwrap();
    for p in &proxies {
        p.set_latency(Dir::ToServer, Duration::from_millis(2));
        p.set_latency(Dir::ToClient, Duration::from_millis(2));
    }
    let ttl = Duration::from_secs(30);
    let next = |what: &'static str, cut: Duration| {
        let other = other.clone();
        async move {
            let g = other
                .lock("cut")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .unwrap_or_else(|e| panic!("{what} cancelled after {cut:?}: {e}"));
            g.release().await.unwrap();
        }
    };
    for step in 0..16u64 {
        let cut = Duration::from_millis(step);
        let _ = tokio::time::timeout(cut, locks.lock("cut").ttl(ttl).acquire()).await;
        next("an acquire", cut).await;
        assert!(freed(&masters, "cut", Duration::from_secs(1)).await);
        let g = locks
            .lock("cut")
            .ttl(ttl)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        let _ = tokio::time::timeout(cut, g.release()).await;
        next("a release", cut).await;
        assert!(freed(&masters, "cut", Duration::from_secs(1)).await);
    }
}

/// One client from two runtimes, as actix workers share one: locks taken on each, the
/// first runtime shut down while its lock is held; both stay renewed past their ttl, and
/// the client goes on working from the second.
#[test]
fn one_client_from_two_runtimes() {
    let masters = masters();
    let rt = |_| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let (rt1, rt2) = (rt(1), rt(2));
    let locks = rt1.block_on(client(&masters));
    let ttl = Duration::from_millis(400);
    let g1 = rt1
        .block_on(locks.lock("rt-1").ttl(ttl).renew(true).acquire())
        .unwrap();
    let g2 = rt2
        .block_on(locks.lock("rt-2").ttl(ttl).renew(true).acquire())
        .unwrap();
    drop(rt1);
    rt2.block_on(async {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let other = client(&masters).await;
        for name in ["rt-1", "rt-2"] {
            assert!(
                matches!(other.lock(name).acquire().await, Err(Error::Busy { .. })),
                "{name} renewed past its ttl"
            );
        }
        assert_eq!(holding(&masters, "rt-1", g1.token()).await, 5);
        g1.release().await.unwrap();
        g2.release().await.unwrap();
        let g = locks.lock("rt-1").acquire().await.unwrap();
        g.release().await.unwrap();
    });
}

/// Semaphores and read/write locks need one place that counts every holder: over
/// independent masters they are refused with a clear error, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_and_read_write_locks_are_refused() {
    let masters = masters();
    let locks = client(&masters).await;
    for request in [
        locks.semaphore("gpu", 2),
        locks.read_lock("cfg"),
        locks.write_lock("cfg"),
    ] {
        match request.acquire().await {
            Err(Error::Backend { source, .. }) => {
                assert!(source.to_string().contains("Redlock"), "{source}");
            }
            other => panic!("{other:?}"),
        }
    }
    for m in &masters {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut m.raw().await)
            .await
            .unwrap();
        assert!(keys.is_empty(), "{keys:?}");
    }
}
