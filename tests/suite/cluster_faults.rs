//! Redis Cluster between the lines: each test starts its own cluster (3 primaries, with
//! a replica each where `replicas = n` is tested), and hangs a node with SIGSTOP or
//! leaves a slot migrating.
//!
//! 3. one renewal acknowledgement covered one primary only: renewals of locks on other
//!    primaries counted as acknowledged;
//! 5. during a slot migration, the release and the fence scripts declared companion keys
//!    that did not exist (`{k}:turns`, `{k}:fence`): Redis answered `TRYAGAIN` until the
//!    timeout, and the lock stayed until its ttl;
//! 6. `WAIT` ran on the connection every call to its primary shares, so one lagging
//!    replica stalled them all;
//! 7. while one node hung, a runtime without a cluster connection could not make one:
//!    the renewal task, which made its own at its first renewal, lost a healthy lock;
//! 8. (b) each `TRYAGAIN` round redirected by `ASK` to a node redis-rs has no connection
//!    to opened a new connection to it;
//! 9. a new client could not connect while one node hung (each node's handshake was
//!    bounded by the whole connect timeout);
//! 10. a fence that waits for replicas failed with `Backend` while its slot was split by
//!     a migration (and a pipeline's `ASK` was not followed).
use crate::common;

use std::time::Duration;

use common::*;
use distlock::Locks;
use testkit::RedisCluster;

/// Two renewed locks with `replicas = 1` on two primaries; the second primary's replica
/// is paused. The second lock's renewals are never acknowledged: it must be lost at its
/// lease end, not kept "held" by the acknowledgement the first primary's replica answered.
/// Control: the first lock, on a primary whose replica answers, stays held throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_primary_acknowledges_its_own_renewals() {
    let cluster = RedisCluster::start(3, 1);
    let locks = Locks::cluster(cluster.urls())
        .command_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let ps = cluster.primaries();
    let (healthy, lagging) = (ps[0], ps[1]);
    let (a, b) = (
        cluster.key_on(healthy, "lock:", "a"),
        cluster.key_on(lagging, "lock:", "b"),
    );
    let take = |key: String| {
        let locks = locks.clone();
        async move {
            locks
                .lock(key)
                .ttl(Duration::from_millis(1500))
                .renew(true)
                .replicas(1)
                .acquire()
                .await
                .unwrap()
        }
    };
    let ga = take(a).await;
    let gb = take(b).await;
    // The renewal task's own connection is made (its first renewals are acknowledged)
    // before any node hangs.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let replica = cluster.replicas_of(lagging)[0];
    cluster.signal(replica, "STOP");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (held_a, held_b) = (ga.info().is_held(), gb.info().is_held());
    cluster.signal(replica, "CONT");
    assert!(held_a, "control: the lock whose replica answers stays held");
    assert!(
        !held_b,
        "no renewal of the lock on the lagging primary was acknowledged for a whole lease"
    );
    ga.release().await.unwrap();
    let _ = gb.release().await;
}

/// A replica of one primary paused: calls that wait for it (`replicas = 1`, four keys at
/// once) each wait half the command timeout and fail with `NotReplicated`; plain lock
/// cycles on another key of that primary meanwhile all succeed (they used to queue behind the `WAIT` on the
/// connection every call to that primary shares: 28 of 40 failed). Control: the calls
/// that wait for the replica did wait, and failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_slows_only_the_calls_that_wait_for_it() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let cluster = RedisCluster::start(3, 1);
    let locks = Locks::cluster(cluster.urls())
        .command_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let primary = cluster.primaries()[0];
    let (acked, plain) = (
        cluster.key_on(primary, "lock:", "acked"),
        cluster.key_on(primary, "lock:", "plain"),
    );
    cycles(&locks, &plain, 2).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match locks.lock(acked.as_str()).replicas(1).acquire().await {
            Ok(g) => break g.release().await.unwrap(),
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "the replica never acknowledged: {e:?}"
            ),
        }
    }
    let replica = cluster.replicas_of(primary)[0];
    cluster.signal(replica, "STOP");
    let (stop, refused) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU32::new(0)),
    );
    // Four keys of that primary, each taken over and over with `replicas = 1`.
    let waiting: Vec<_> = (0..4)
        .map(|i| {
            let key = cluster.key_on(primary, "lock:", &format!("acked{i}"));
            let (locks, stop, refused) = (locks.clone(), stop.clone(), refused.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match locks.lock(key.as_str()).replicas(1).acquire().await {
                        Err(distlock::Error::NotReplicated { .. }) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        other => panic!("the replica is paused: {other:?}"),
                    }
                }
            })
        })
        .collect();
    // Four tasks of plain cycles, as a loaded service runs them (some go over the shared
    // connection then): 40 cycles at least, and on until the calls that wait were refused
    // a few times.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let plain_tasks: Vec<_> = (0..4)
        .map(|_| {
            let (locks, key, refused) = (locks.clone(), plain.clone(), refused.clone());
            tokio::spawn(async move {
                let mut failed = Vec::new();
                let mut i = 0;
                while i < 10
                    || (refused.load(Ordering::Relaxed) < 4 && std::time::Instant::now() < until)
                {
                    i += 1;
                    let cycle = async {
                        let g = locks
                            .lock(key.as_str())
                            .wait(Duration::from_secs(5))
                            .acquire()
                            .await?;
                        g.release().await
                    };
                    if let Err(e) = cycle.await {
                        failed.push(e);
                    }
                }
                failed
            })
        })
        .collect();
    let mut failed = Vec::new();
    for t in plain_tasks {
        failed.extend(t.await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    for w in waiting {
        w.await.unwrap();
    }
    cluster.signal(replica, "CONT");
    assert!(
        refused.load(Ordering::Relaxed) >= 2,
        "control: the calls that wait for the replica waited and failed"
    );
    assert!(failed.is_empty(), "plain cycles failed: {failed:?}");
}

/// A reshard stuck at its start: the slot of a held lock is `MIGRATING` on its owner and
/// `IMPORTING` on another primary, no key moved. The lock key is on the owner; its
/// companions (`{k}:fence`, `{k}:turns`) exist nowhere yet, so a call that declares them
/// is split and Redis answers `TRYAGAIN` for as long as the migration stands. The
/// holder's first fence and its contended release still work, and the waiter of another
/// client gets the lock long before the ttl. Control: a raw two-key script on the owner
/// gets `TRYAGAIN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_while_their_slot_is_stuck_migrating() {
    let cluster = RedisCluster::start(3, 0);
    let ps = cluster.primaries();
    let key = cluster.key_on(ps[0], "lock:", "moving");
    let full = format!("lock:{key}");
    let slot = cluster.slot(&full).to_string();
    let (from, to) = (ps[0], ps[1]);
    let locks = Locks::cluster(cluster.urls())
        .command_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let other = Locks::cluster(cluster.urls())
        .command_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let g = locks
        .lock(key.as_str())
        .ttl(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    RedisCluster::start_migration(&slot, from, to);
    let control = RedisCluster::cli(
        from,
        &["EVAL", "return 1", "2", &full, &format!("{{{full}}}:turns")],
    );
    assert!(control.contains("TRYAGAIN"), "control: split: {control}");
    let started = std::time::Instant::now();
    let fence = g.fence().await.unwrap();
    assert!(fence >= 1);
    // The counter was made on the importing node (`fence_counter.lua`, the split path)
    // with the fence idle window (a day by default) as its ttl.
    let asked = {
        use std::io::Write as _;
        let mut cli = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &to.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let script = format!("ASKING\nPTTL {{{full}}}:fence\n");
        cli.stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        String::from_utf8(cli.wait_with_output().unwrap().stdout).unwrap()
    };
    let pttl: i64 = asked.lines().last().unwrap().trim().parse().unwrap();
    assert!(
        (86_000_000..=86_400_000).contains(&pttl),
        "the counter's ttl on the importing node: {asked:?}"
    );
    let waiter = {
        let (other, key) = (other.clone(), key.clone());
        tokio::spawn(async move {
            let g = other
                .lock(key.as_str())
                .wait(Duration::from_secs(15))
                .acquire()
                .await
                .unwrap();
            let at = std::time::Instant::now();
            let next = g.fence().await.unwrap();
            g.release().await.unwrap();
            (at, next)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    g.release().await.unwrap();
    let (taken, next) = waiter.await.unwrap();
    for port in [from, to] {
        RedisCluster::cli(port, &["CLUSTER", "SETSLOT", &slot, "STABLE"]);
    }
    assert!(next > fence, "fences grow: {next} > {fence}");
    assert!(
        taken - started < Duration::from_secs(5),
        "the waiter got the lock {:?} after the migration began (ttl 20 s)",
        taken - started
    );
}

/// A replica of one primary hangs (SIGSTOP) right after a renewed lock on another primary
/// is taken, before its first renewal: the renewal task, and a runtime the client has not
/// been used from, work on the healthy primaries all the same (the cluster connection
/// is made once per client and serves every runtime). Control: the node does not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_node_stops_no_runtime_from_using_the_cluster() {
    let cluster = RedisCluster::start(3, 1);
    let locks = Locks::cluster(cluster.urls())
        .command_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let ps = cluster.primaries();
    let (healthy, other) = (ps[0], ps[1]);
    let key = cluster.key_on(healthy, "lock:", "renewed");
    // Waiting for its replica: the renewal's `WAIT` runs on the cluster connection where
    // no direct connection to the slot's owner can be had.
    let g = locks
        .lock(key.as_str())
        .ttl(Duration::from_millis(1500))
        .renew(true)
        .replicas(1)
        .acquire()
        .await
        .unwrap();
    let hung = cluster.replicas_of(other)[0];
    cluster.signal(hung, "STOP");
    assert!(!testkit::ping(hung), "control: the node hangs");
    // Another runtime, on a thread of its own, that has not used the client yet.
    let fresh = {
        let (locks, key) = (locks.clone(), cluster.key_on(healthy, "lock:", "fresh"));
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    // Eight at once: beyond what direct connections take, the calls go
                    // over the cluster connection.
                    let tasks: Vec<_> = (0..8)
                        .map(|i| {
                            let (locks, key) = (locks.clone(), format!("{key}-{i}"));
                            tokio::spawn(async move {
                                for _ in 0..5 {
                                    let g = locks.lock(key.as_str()).acquire().await?;
                                    g.release().await?;
                                }
                                Ok::<_, distlock::Error>(())
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await.unwrap()?;
                    }
                    Ok::<_, distlock::Error>(())
                })
        })
    };
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let held = g.info().is_held();
    let fresh = fresh.join().unwrap();
    cluster.signal(hung, "CONT");
    assert!(fresh.is_ok(), "a new runtime: {fresh:?}");
    assert!(held, "renewed past its ttl on a healthy primary");
    g.release().await.unwrap();
}

/// A node joins after the client read the map (redis-rs has no connection to it), and a
/// slot migrates to it, stuck after its lock keys moved: each fence asked now is
/// redirected there by `ASK`, and answered `TRYAGAIN` there (the counter is not there
/// yet), round after round. The connection the client makes to the new node is kept:
/// six fences make at most two connections to it (they used to make one each round, 83
/// in 3 s). Control: the fences are redirected there (its keys and counters are).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_to_a_new_node_reuse_one_connection() {
    let mut cluster = RedisCluster::start(3, 0);
    let locks = Locks::cluster(cluster.urls())
        .command_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let names: Vec<String> = (0..6).map(|i| format!("x{{moving}}{i}")).collect();
    let slot = cluster.slot(&format!("lock:{}", names[0]));
    let from = cluster.primary_of(slot);
    let mut guards = Vec::new();
    for name in &names {
        guards.push(
            locks
                .lock(name.as_str())
                .ttl(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap(),
        );
    }
    let to = cluster.add_node();
    let slot = slot.to_string();
    RedisCluster::start_migration(&slot, from, to);
    let keys: Vec<String> = names.iter().map(|n| format!("lock:{n}")).collect();
    let mut migrate = vec!["MIGRATE", "127.0.0.1"];
    let port = to.to_string();
    migrate.extend([port.as_str(), "", "0", "5000", "KEYS"]);
    migrate.extend(keys.iter().map(String::as_str));
    assert_eq!(RedisCluster::cli(from, &migrate), "OK");
    let before = testkit::connections_received(to);
    let mut fences = Vec::new();
    for g in &guards {
        fences.push(g.fence().await.unwrap());
    }
    let made = testkit::connections_received(to) - before;
    // A key with a hash tag keeps it for its companions: `<key>{:fence}`. Asked with
    // `ASKING` (the slot is still the old owner's).
    let (counters,): (u32,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("EXISTS")
        .arg(format!("{}{{:fence}}", keys[0]))
        .query(
            &mut redis::Client::open(format!("redis://127.0.0.1:{to}/"))
                .unwrap()
                .get_connection()
                .unwrap(),
        )
        .unwrap();
    for port in [from, to] {
        RedisCluster::cli(port, &["CLUSTER", "SETSLOT", &slot, "STABLE"]);
    }
    assert_eq!(counters, 1, "control: the fences went to the new node");
    assert!(made <= 2, "{made} connections to the new node for 6 fences");
    assert!(fences.iter().all(|f| *f >= 1));
}

/// One primary hangs (SIGSTOP) while the client holds renewed locks on every primary:
/// the renewal batch judges each key on its own, so the locks on the healthy primaries
/// stay held through more than their ttl, and only the hung primary's lock is lost. A
/// batch once failed whole at the first error (one timer, one `try_join_all`), and every
/// due lease was retried until its lease ended: healthy locks were reported lost while
/// their keys were still held with fresh ttls. Control: the hung primary's lock is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_primary_costs_no_lock_on_the_others() {
    let cluster = RedisCluster::start(3, 0);
    let locks = Locks::cluster(cluster.urls())
        .command_timeout(Duration::from_millis(400))
        .connect()
        .await
        .unwrap();
    let ps = cluster.primaries();
    // Each renewal's answers (the hung primary's time out) come well within the lease.
    let ttl = Duration::from_millis(2400);
    let mut held = Vec::new();
    for &p in &ps {
        let key = cluster.key_on(p, "lock:", "batch");
        let g = locks
            .lock(key.as_str())
            .ttl(ttl)
            .renew(true)
            .acquire()
            .await
            .unwrap();
        held.push((p, g));
    }
    let hung = ps[0];
    cluster.signal(hung, "STOP");
    tokio::time::sleep(Duration::from_millis(4000)).await;
    let states: Vec<(u16, bool)> = held.iter().map(|(p, g)| (*p, g.info().is_held())).collect();
    cluster.signal(hung, "CONT");
    for (p, is_held) in &states {
        if *p == hung {
            assert!(
                !is_held,
                "control: the hung primary's lock is lost: {states:?}"
            );
        } else {
            assert!(is_held, "renewed on a healthy primary: {states:?}");
        }
    }
    // Released (the node just resumed may still be catching up: a release may time out,
    // never be called lost while it holds).
    for (p, g) in held {
        let released = g.release().await;
        if p != hung {
            assert!(
                matches!(released, Ok(()) | Err(distlock::Error::Backend { .. })),
                "{released:?}"
            );
        }
    }
}

/// A new client while one node hangs (a replica, SIGSTOP: the kernel still accepts its
/// connections, the server never answers them): `connect` and a lock cycle on a healthy
/// primary end well within the connect timeout (4 s here). Each node's handshake is
/// bounded by a quarter of the connect timeout, and redis-rs makes the cluster connection
/// from the nodes that answered (1.0 s here); it used to be bounded by the whole connect
/// timeout, so the first read of the nodes outlasted the attempt and the new client
/// could not connect while the node hung (`connect` failed after 4.0 s). Control: the node hangs, and a redis-rs cluster client whose
/// handshakes may take the whole connect timeout (as distlock's were) takes at least that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_client_does_not_wait_out_a_hung_node() {
    let cluster = RedisCluster::start(3, 1);
    let ps = cluster.primaries();
    let hung = cluster.replicas_of(ps[1])[0];
    let key = cluster.key_on(ps[0], "lock:", "fresh");
    let connect_timeout = Duration::from_secs(4);
    cluster.signal(hung, "STOP");
    assert!(!testkit::ping(hung), "control: the node hangs");
    let started = std::time::Instant::now();
    let locks = Locks::cluster(cluster.urls())
        .command_timeout(Duration::from_secs(1))
        .connect_timeout(connect_timeout)
        .connect()
        .await;
    let connected = started.elapsed();
    let cycle = match &locks {
        Ok(locks) => match locks.lock(key.as_str()).acquire().await {
            Ok(g) => g.release().await,
            Err(e) => Err(e),
        },
        Err(e) => Err(e.clone()),
    };
    let took = started.elapsed();
    // The control: handshakes bounded by the whole connect timeout.
    let raw = redis::cluster::ClusterClientBuilder::new(cluster.urls())
        .connection_timeout(connect_timeout)
        .retries(0)
        .build()
        .unwrap();
    let raw_started = std::time::Instant::now();
    let raw_made = tokio::time::timeout(connect_timeout * 3, raw.get_async_connection()).await;
    let raw_took = raw_started.elapsed();
    cluster.signal(hung, "CONT");
    eprintln!(
        "connect {connected:?}, with a lock cycle {took:?}; control: redis-rs {raw_took:?} ({})",
        match &raw_made {
            Ok(Ok(_)) => "connected",
            Ok(Err(_)) => "failed",
            Err(_) => "still connecting",
        }
    );
    assert!(
        cycle.is_ok(),
        "a new client works: {:?} {cycle:?}",
        locks.as_ref().err()
    );
    assert!(
        took < connect_timeout * 3 / 4,
        "connect and a lock cycle took {took:?} (connect timeout {connect_timeout:?})"
    );
    assert!(
        raw_took >= connect_timeout,
        "control: handshakes bounded by the connect timeout wait it out ({raw_took:?})"
    );
}

/// `replicas = 1` while a lock's slot is stuck migrating (`MIGRATING` on its owner,
/// `IMPORTING` on another primary, no key moved): the fence that waits for a replica is
/// split as the plain one is (the counter `{k}:fence` exists on neither node), and goes
/// the same way: the counter's step where the counter goes (the importing node, after
/// `ASKING`), with its `WAIT` on that connection, then the key. It used to fail with
/// `Backend` (`TRYAGAIN`) for as long as the migration stood. The next holder's fence,
/// from another client, is larger. Control: a raw two-key script on the owner gets
/// `TRYAGAIN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_that_waits_for_replicas_works_while_its_slot_is_stuck_migrating() {
    let cluster = RedisCluster::start(3, 1);
    let ps = cluster.primaries();
    let key = cluster.key_on(ps[0], "lock:", "acked");
    let full = format!("lock:{key}");
    let slot = cluster.slot(&full).to_string();
    let (from, to) = (ps[0], ps[1]);
    let client = || {
        Locks::cluster(cluster.urls())
            .command_timeout(Duration::from_secs(1))
            .connect()
    };
    let (locks, other) = (client().await.unwrap(), client().await.unwrap());
    let g = locks
        .lock(key.as_str())
        .ttl(Duration::from_secs(20))
        .replicas(1)
        .acquire()
        .await
        .unwrap();
    RedisCluster::start_migration(&slot, from, to);
    let control = RedisCluster::cli(
        from,
        &["EVAL", "return 1", "2", &full, &format!("{{{full}}}:fence")],
    );
    assert!(control.contains("TRYAGAIN"), "control: split: {control}");
    let fence = g.fence().await;
    let released = g.release().await;
    let next = match other
        .lock(key.as_str())
        .replicas(1)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
    {
        Ok(g) => {
            let next = g.fence().await;
            g.release().await.unwrap();
            next
        }
        Err(e) => Err(e),
    };
    for port in [from, to] {
        RedisCluster::cli(port, &["CLUSTER", "SETSLOT", &slot, "STABLE"]);
    }
    let fence = fence.expect("a fence acknowledged by a replica while the slot migrates");
    released.unwrap();
    let next = next.expect("the next holder's fence");
    assert!(fence >= 1 && next > fence, "fences grow: {next} > {fence}");
}

/// Two renewed locks with `replicas = 1` in one slot (one hash tag), the slot migrating
/// with one of the two keys moved: their renewals go in one pipeline with its `WAIT`; the
/// moved key's extend is answered `ASK`, the other's ran on the owner. The pipeline is
/// not run again on the importing node (where the other key is not, which made it
/// "lost" while its key was held and just extended): the renewals go lease by lease,
/// and both locks stay held past several leases. Control: the moved key is on the
/// importing node, the other on its owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_of_one_slot_split_by_a_migration_keep_both_locks() {
    let cluster = RedisCluster::start(3, 1);
    let ps = cluster.primaries();
    let (from, to) = (ps[0], ps[1]);
    let tag = cluster.key_on(from, "", "tag");
    let (a, b) = (format!("{{{tag}}}:a"), format!("{{{tag}}}:b"));
    let slot = cluster.slot(&tag).to_string();
    let locks = Locks::cluster(cluster.urls())
        .command_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let ttl = Duration::from_millis(1500);
    let mut guards = Vec::new();
    for name in [&a, &b] {
        guards.push(
            locks
                .lock(name.as_str())
                .ttl(ttl)
                .renew(true)
                .replicas(1)
                .acquire()
                .await
                .unwrap(),
        );
    }
    RedisCluster::start_migration(&slot, from, to);
    let (port, moved) = (to.to_string(), format!("lock:{a}"));
    assert_eq!(
        RedisCluster::cli(
            from,
            &[
                "MIGRATE",
                "127.0.0.1",
                &port,
                "",
                "0",
                "5000",
                "KEYS",
                &moved
            ]
        ),
        "OK"
    );
    // The control: the keys are split.
    assert_eq!(
        RedisCluster::cli(from, &["EXISTS", &format!("lock:{b}")]),
        "1",
        "control: the other key on its owner"
    );
    tokio::time::sleep(3 * ttl).await;
    let held: Vec<bool> = guards.iter().map(|g| g.info().is_held()).collect();
    for port in [from, to] {
        RedisCluster::cli(port, &["CLUSTER", "SETSLOT", &slot, "STABLE"]);
    }
    assert_eq!(held, [true, true], "both locks held through the migration");
    for g in guards {
        let _ = g.release().await;
    }
}
