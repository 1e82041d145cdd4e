//! Redis behind Sentinel: one primary, one replica and 3 sentinels the harness starts
//! (`redis-sentinel`, quorum 2, down after 1 s). The primary killed, or demoted by
//! `SENTINEL FAILOVER`: calls fail with `Backend` within their timeouts meanwhile, then
//! work on the promoted replica with the same client. The control: a client pinned to
//! the old primary's address does not recover. The same over TLS, and from a client
//! shared by two runtimes, the first shut down before the failover. A `+switch-master`
//! listener that subscribes again keeps the connection to an unchanged primary.
use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use distlock::{Error, Locks};
use testkit::{RedisCluster, RedisSentinel};

const TIMEOUT: Duration = Duration::from_millis(500);

struct Setup {
    primary: RedisServer,
    replica: RedisServer,
    sentinels: Vec<RedisSentinel>,
}

impl Setup {
    fn start() -> Setup {
        let primary = RedisServer::start();
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
        let sentinels: Vec<RedisSentinel> =
            (0..3).map(|_| RedisSentinel::start(primary.port)).collect();
        for s in &sentinels {
            s.wait_ready(3, 1, Duration::from_secs(30));
        }
        Setup {
            primary,
            replica,
            sentinels,
        }
    }

    fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisSentinel::url).collect()
    }

    fn url_form(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!(
            "redis+sentinel://{}/{}",
            hosts.join(","),
            RedisSentinel::MASTER
        )
    }

    /// Demotes the primary with `SENTINEL FAILOVER`; returns once the replica is promoted.
    async fn demote(&self) {
        let out = RedisCluster::cli(
            self.sentinels[0].port,
            &["SENTINEL", "FAILOVER", RedisSentinel::MASTER],
        );
        assert_eq!(out, "OK");
        self.wait_promoted().await;
    }

    /// Waits until every sentinel names the replica as the primary.
    async fn wait_promoted(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self
            .sentinels
            .iter()
            .all(|s| s.primary_port() == Some(self.replica.port))
        {
            assert!(
                Instant::now() < deadline,
                "the sentinels promoted the replica"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Lock cycles on `key` while `failover` runs (it returns once the replica is promoted)
/// and 1.5 s more (past the cycles' 1 s ttl, so a lock whose release failed meanwhile has
/// expired), checked by `check_failover`: acquire, fence and release, each within the
/// timeout (and the sentinels' answer within it too).
async fn cycles_across(locks: &Locks, key: &str, failover: impl std::future::Future<Output = ()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = cycle_until(locks, key, &stop);
    tokio::time::sleep(Duration::from_millis(200)).await;
    failover.await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::SeqCst);
    check_failover(
        &cycles.await.unwrap(),
        6 * TIMEOUT + Duration::from_millis(500),
        true,
    );
}

/// The promoted replica holds what the client writes now.
async fn lands_on(locks: &Locks, server: &RedisServer) {
    let g = locks.lock("where").acquire().await.unwrap();
    let mut raw = server.raw().await;
    let held: Option<String> = redis::cmd("GET")
        .arg("lock:where")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        held.as_deref(),
        Some(g.token()),
        "the lock is on the new primary"
    );
    g.release().await.unwrap();
}

/// A user refused `@dangerous` commands (`ROLE`, `INFO`: the way redis-rs checked the
/// primary a sentinel names) locks behind Sentinel, and follows a failover: the
/// sentinels are trusted where `ROLE` is refused, and a demoted server is left at its
/// first `READONLY`. Every call failed with `NOPERM` before. Control: that user is
/// refused `ROLE` on the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_refused_role_locks_and_follows_a_failover() {
    let setup = Setup::start();
    let user = [
        "ACL", "SETUSER", "limited", "on", ">limited", "~*", "&*", "+@all",
    ];
    for server in [&setup.primary, &setup.replica] {
        assert_eq!(
            RedisCluster::cli(server.port, &[&user[..], &["-@dangerous"]].concat()),
            "OK"
        );
    }
    for sentinel in &setup.sentinels {
        assert_eq!(RedisCluster::cli(sentinel.port, &user), "OK");
    }
    let role = RedisCluster::cli(
        setup.primary.port,
        &["--user", "limited", "--pass", "limited", "ROLE"],
    );
    assert!(role.contains("NOPERM"), "control: ROLE refused: {role}");
    let urls: Vec<String> = setup
        .sentinels
        .iter()
        .map(|s| format!("redis://limited:limited@127.0.0.1:{}/", s.port))
        .collect();
    let locks = Locks::sentinel(RedisSentinel::MASTER, urls)
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    lands_on(&locks, &setup.primary).await;
    cycles_across(&locks, "limited", setup.demote()).await;
    lands_on(&locks, &setup.replica).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_without_a_new_client() {
    let mut setup = Setup::start();
    let locks = Locks::sentinel(RedisSentinel::MASTER, setup.urls())
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    lands_on(&locks, &setup.primary).await;
    cycles_across(&locks, "killed", async {
        setup.primary.kill();
        setup.wait_promoted().await;
    })
    .await;
    lands_on(&locks, &setup.replica).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_demoted_by_sentinel_failover() {
    let setup = Setup::start();
    // The default client's URL form.
    let locks = Locks::builder(setup.url_form())
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let other = Locks::sentinel(RedisSentinel::MASTER, setup.urls())
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    // The control: a client pinned to the primary's address.
    let pinned = Locks::builder(setup.primary.url())
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    lands_on(&locks, &setup.primary).await;
    cycles_across(&locks, "demoted", setup.demote()).await;
    lands_on(&locks, &setup.replica).await;
    // Waiters are woken by messages on the new primary.
    let g = locks.lock("wake").acquire().await.unwrap();
    let w = take_and_release(&other, "wake", Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(150)).await;
    let gap = handoff_gap(g, w).await;
    assert!(
        gap < Duration::from_millis(60),
        "handoff after {gap:?}: no message"
    );
    // The control: the old primary is a replica now, and refuses the pinned client's
    // writes.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !RedisCluster::cli(setup.primary.port, &["ROLE"]).starts_with("slave") {
        assert!(
            Instant::now() < deadline,
            "the old primary was made a replica"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(matches!(
        pinned.lock("pinned").acquire().await,
        Err(Error::Backend { .. })
    ));
}

/// One client from two runtimes, as actix workers share one: connected, and its
/// `+switch-master` listener started, on the first; the first shuts down; the primary is
/// demoted by `SENTINEL FAILOVER` (it stays up, as a replica, so only the switch or its
/// `READONLY` replies tell). Calls from the second runtime fail within their timeouts at
/// most, then land on the promoted replica.
#[test]
fn one_client_from_two_runtimes_follows_a_failover() {
    let setup = Setup::start();
    let rt = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let (rt1, rt2) = (rt(), rt());
    let locks = rt1
        .block_on(
            Locks::sentinel(RedisSentinel::MASTER, setup.urls())
                .command_timeout(TIMEOUT)
                .connect(),
        )
        .unwrap();
    rt1.block_on(lands_on(&locks, &setup.primary));
    rt2.block_on(lands_on(&locks, &setup.primary));
    drop(rt1);
    rt2.block_on(async {
        cycles_across(&locks, "two-runtimes", setup.demote()).await;
        lands_on(&locks, &setup.replica).await;
    });
}

/// The ids of the primary's clients whose last command took or released a lock: the
/// client's own connection (the tests' other connections only `GET`, or are `redis-cli`).
fn lock_connections(server: &RedisServer) -> Vec<String> {
    RedisCluster::cli(server.port, &["CLIENT", "LIST"])
        .lines()
        .filter(|l| {
            l.split(' ')
                .any(|f| matches!(f, "cmd=set" | "cmd=evalsha" | "cmd=eval"))
        })
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_owned)
        .collect()
}

/// The `+switch-master` listener's connection cut on every sentinel (`CLIENT KILL TYPE
/// pubsub`): it subscribes again, and asks whether the primary changed meanwhile. It did
/// not, so the client keeps its connection: the calls after that run on the same one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_subscribes_again_keeps_the_connection() {
    let setup = Setup::start();
    let locks = Locks::sentinel(RedisSentinel::MASTER, setup.urls())
        .command_timeout(TIMEOUT)
        .notify_waiters(false)
        .connect()
        .await
        .unwrap();
    lands_on(&locks, &setup.primary).await;
    // The listener subscribed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = lock_connections(&setup.primary);
    assert_eq!(before.len(), 1, "{before:?}");
    let mut killed = 0;
    for s in &setup.sentinels {
        let out = RedisCluster::cli(s.port, &["CLIENT", "KILL", "TYPE", "pubsub"]);
        killed += out.trim().parse::<u32>().unwrap_or(0);
    }
    assert!(killed >= 1, "the listener's connection was cut");
    // It subscribes again within its 1 s pause.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for _ in 0..5 {
        lands_on(&locks, &setup.primary).await;
    }
    assert_eq!(
        lock_connections(&setup.primary),
        before,
        "the same connection to an unchanged primary"
    );
}

/// A primary, its replica and 3 sentinels, all on TLS ports (one CA; replication and the
/// sentinels' own links over TLS), and the `rediss://` URLs of the sentinels.
#[cfg(feature = "tls")]
struct TlsSetup {
    files: testkit::TlsFiles,
    primary: RedisServer,
    replica: RedisServer,
    replica_tls: u16,
    sentinels: Vec<RedisSentinel>,
    urls: Vec<String>,
}

#[cfg(feature = "tls")]
impl TlsSetup {
    fn start() -> TlsSetup {
        let (certs, files) = testkit::shared_tls();
        let (primary_tls, replica_tls) = (free_port(), free_port());
        let start = |args: Vec<String>| {
            RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let primary = start(testkit::tls_args(primary_tls, &certs));
        let mut replica_args = testkit::tls_args(replica_tls, &certs);
        replica_args.extend([
            "--replicaof".into(),
            "127.0.0.1".into(),
            primary_tls.to_string(),
        ]);
        let replica = start(replica_args);
        let sentinels: Vec<RedisSentinel> = (0..3)
            .map(|_| RedisSentinel::start_tls(primary_tls, &certs))
            .collect();
        for s in &sentinels {
            s.wait_ready(3, 1, Duration::from_secs(30));
        }
        let urls: Vec<String> = sentinels
            .iter()
            .map(|s| format!("rediss://127.0.0.1:{}/", s.tls_port().unwrap()))
            .collect();
        TlsSetup {
            files,
            primary,
            replica,
            replica_tls,
            sentinels,
            urls,
        }
    }
}

/// Over TLS: the sentinels, the primary and the replica all on TLS ports (one CA;
/// replication and the sentinels' own links over TLS), the client given `rediss://`
/// sentinels and the CA. The primary killed: calls work again on the promoted replica.
/// Control: without the CA the client cannot connect.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_killed_primary_is_replaced() {
    let TlsSetup {
        files,
        mut primary,
        replica,
        replica_tls,
        sentinels,
        urls,
    } = TlsSetup::start();
    let locks = Locks::sentinel(RedisSentinel::MASTER, &urls)
        .tls_root_cert(files.ca.clone())
        .command_timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    lands_on(&locks, &primary).await;
    cycles_across(&locks, "tls-killed", async {
        primary.kill();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !sentinels
            .iter()
            .all(|s| s.primary_port() == Some(replica_tls))
        {
            assert!(
                Instant::now() < deadline,
                "the sentinels promoted the replica"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    lands_on(&locks, &replica).await;
    // The control: without the CA, no connection.
    let untrusted = Locks::sentinel(RedisSentinel::MASTER, &urls)
        .command_timeout(TIMEOUT)
        .connect()
        .await;
    assert!(matches!(untrusted, Err(Error::Backend { .. })));
}

/// Lock cycles with `replicas = 1` behind Sentinel: each write that waits for the replica
/// goes on a connection no other call shares, kept for the next one; 50 cycles used to
/// open and close a connection each (about 100). After `SENTINEL FAILOVER` the waits
/// land on the promoted replica: the kept connections to the demoted primary answer
/// `READONLY` and are dropped, not used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_replicas_reuse_their_connections() {
    let setup = Setup::start();
    let locks = Locks::sentinel(RedisSentinel::MASTER, setup.urls())
        .command_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let cycle = |key: &'static str| {
        let locks = locks.clone();
        async move {
            let g = locks.lock(key).replicas(1).acquire().await?;
            g.release().await
        }
    };
    // The replica acknowledges once its first sync is done.
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = cycle("acked").await {
        assert!(
            Instant::now() < deadline,
            "the replica never acknowledged: {e:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = testkit::connections_received(setup.primary.port);
    for _ in 0..50 {
        cycle("acked").await.unwrap();
    }
    let made = testkit::connections_received(setup.primary.port) - before;
    assert!(made <= 6, "{made} connections for 50 cycles");
    setup.demote().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = cycle("after").await {
        assert!(
            Instant::now() < deadline,
            "no cycle after the failover: {e:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    lands_on(&locks, &setup.replica).await;
}

/// [`waits_for_replicas_reuse_their_connections`] over TLS: the writes that wait for the
/// replica go on direct connections that speak TLS, kept for the next one, as without
/// TLS; each such write used to open and close a TLS connection of its own (50 cycles:
/// about 100 connections). After `SENTINEL FAILOVER` the waits land on the promoted
/// replica: the kept connections to the demoted primary answer `READONLY` and are
/// dropped. Control: the cycles wait for the replica (the demoted primary, paused at the
/// end, fails them with `NotReplicated`).
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_waits_for_replicas_reuse_their_connections() {
    let setup = TlsSetup::start();
    let locks = Locks::sentinel(RedisSentinel::MASTER, &setup.urls)
        .tls_root_cert(setup.files.ca.clone())
        .command_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let cycle = |key: &'static str| {
        let locks = locks.clone();
        async move {
            let g = locks.lock(key).replicas(1).acquire().await?;
            g.release().await
        }
    };
    // The replica acknowledges once its first sync is done.
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = cycle("acked").await {
        assert!(
            Instant::now() < deadline,
            "the replica never acknowledged: {e:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = testkit::connections_received(setup.primary.port);
    for _ in 0..50 {
        cycle("acked").await.unwrap();
    }
    let made = testkit::connections_received(setup.primary.port) - before;
    eprintln!("over TLS: {made} connections for 50 cycles that wait for the replica");
    assert!(made <= 6, "{made} connections for 50 cycles");
    let out = RedisCluster::cli(
        setup.sentinels[0].port,
        &["SENTINEL", "FAILOVER", RedisSentinel::MASTER],
    );
    assert_eq!(out, "OK");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !setup
        .sentinels
        .iter()
        .all(|s| s.primary_port() == Some(setup.replica_tls))
    {
        assert!(
            Instant::now() < deadline,
            "the sentinels promoted the replica"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = cycle("after").await {
        assert!(
            Instant::now() < deadline,
            "no cycle after the failover: {e:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    lands_on(&locks, &setup.replica).await;
    // The control: the cycles wait for the replica (the demoted primary now).
    setup.primary.signal("STOP");
    let unacked = cycle("after").await;
    setup.primary.signal("CONT");
    assert!(
        matches!(unacked, Err(Error::NotReplicated { .. })),
        "control: a paused replica fails the cycle: {unacked:?}"
    );
}
