//! Redis Cluster: 3 primaries and 3 replicas the harness starts on free ports
//! (`redis-server --cluster-enabled yes`, then `redis-cli --cluster create`). Locks and
//! idempotency records on keys spread over every primary, waking by sharded Pub/Sub, a
//! slot migrated under a held and contended lock, a replica promoted by
//! `CLUSTER FAILOVER`, and two processes sharing counters. Each safety test has its
//! control.
mod common;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::*;
use distlock::{Error, Locks, idempotent};
use redis::AsyncCommands;
use testkit::RedisCluster;

/// One cluster for the tests that change nothing in its topology.
fn shared() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 1))
}

/// `redis+cluster://` URL of the cluster's nodes (the default client's form).
fn cluster_url(cluster: &RedisCluster) -> String {
    let hosts: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    format!("redis+cluster://{}", hosts.join(","))
}

/// Fenced writes on every primary: the value and its highest fence share a slot, so the
/// check and the write are one script wherever the key lives; a stale fence is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_on_every_primary() {
    let cluster = shared();
    let locks = Locks::cluster(cluster.urls()).connect().await.unwrap();
    for key in spread_keys(cluster, "fenced", 2) {
        // In the slot of the lock `key` (on its primary), through a hash tag.
        let data = format!("{{lock:{key}}}:balance");
        locks.set_fenced(&data, "second", 2).await.unwrap();
        let late = locks.set_fenced(&data, "first", 1).await;
        assert!(
            matches!(late, Err(Error::StaleFence { seen: 2, .. })),
            "{late:?}"
        );
        assert_eq!(
            locks.fenced_value(&data).await.unwrap(),
            (Some("second".to_owned()), 2)
        );
    }
}

/// A semaphore on every primary: the set, its channel and its scripts in one slot; two
/// permits taken, a third refused, a freed one taken by a waiter woken on the cluster's
/// sharded channel long before the 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_on_every_primary() {
    let cluster = shared();
    let locks = Locks::cluster(cluster.urls()).connect().await.unwrap();
    for key in spread_keys(cluster, "permits", 1) {
        let a = locks.semaphore(&key, 2).acquire().await.unwrap();
        let b = locks.semaphore(&key, 2).acquire().await.unwrap();
        let third = locks.semaphore(&key, 2).acquire().await;
        assert!(matches!(third, Err(Error::Busy { .. })), "{third:?}");
        let waiter = {
            let (locks, key) = (locks.clone(), key.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let g = locks
                    .semaphore(&key, 2)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .unwrap();
                g.release().await.unwrap();
                started.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        a.release().await.unwrap();
        let waited = waiter.await.unwrap();
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        b.release().await.unwrap();
    }
}

/// A read/write lock on every primary: the key, its readers and the writer's mark in
/// one slot (`{key}:readers`, `{key}:writer`); readers share, a writer waits for the
/// last one and is woken on the cluster's sharded channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_locks_on_every_primary() {
    let cluster = shared();
    let locks = Locks::cluster(cluster.urls()).connect().await.unwrap();
    for key in spread_keys(cluster, "rw", 1) {
        let a = locks.read_lock(&key).acquire().await.unwrap();
        let b = locks.read_lock(&key).acquire().await.unwrap();
        let writer = {
            let (locks, key) = (locks.clone(), key.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let w = locks
                    .write_lock(&key)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .unwrap();
                let fence = w.fence().await.unwrap();
                w.release().await.unwrap();
                (started.elapsed(), fence)
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The waiting writer keeps new readers out.
        let late = locks.read_lock(&key).acquire().await;
        assert!(matches!(late, Err(Error::Busy { .. })), "{late:?}");
        a.release().await.unwrap();
        b.release().await.unwrap();
        let (waited, fence) = writer.await.unwrap();
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        assert!(fence >= 1);
    }
}

/// A multi-lock on a cluster: keys in several slots (on different primaries) are taken
/// one by one in order, keys sharing a hash tag in one script; both exclude a plain lock
/// of any of their keys and leave nothing held when one key is busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_locks_across_slots_and_in_one() {
    let cluster = shared();
    let locks = Locks::cluster(cluster.urls()).connect().await.unwrap();
    let apart = spread_keys(cluster, "multi", 1);
    let together = [
        "{acct}:1".to_owned(),
        "{acct}:2".to_owned(),
        "{acct}:3".to_owned(),
    ];
    for (keys, at_once) in [(apart, false), (together.to_vec(), true)] {
        let all = locks.multi_lock(keys.clone()).acquire().await.unwrap();
        assert_eq!(all.taken_at_once(), at_once, "{keys:?}");
        for key in &keys {
            let one = locks.lock(key).acquire().await;
            assert!(matches!(one, Err(Error::Busy { .. })), "{one:?}");
        }
        all.release().await.unwrap();
        let last = locks.lock(&keys[2]).acquire().await.unwrap();
        let busy = locks.multi_lock(keys.clone()).acquire().await;
        assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
        for key in &keys[..2] {
            let free = locks.lock(key).acquire().await.unwrap();
            free.release().await.unwrap();
        }
        last.release().await.unwrap();
    }
}

/// Inspecting and releasing by force on every primary: the script runs on the key's
/// node, counting the listeners of its sharded channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_force_release_on_every_primary() {
    let cluster = shared();
    let locks = Locks::cluster(cluster.urls()).connect().await.unwrap();
    for key in spread_keys(cluster, "ops", 1) {
        let g = locks.lock(&key).acquire().await.unwrap();
        let fence = g.fence().await.unwrap();
        let state = locks.inspect(&key).await.unwrap();
        assert_eq!(state.holder.unwrap().token, g.token());
        assert_eq!(state.last_fence, fence);
        assert!(locks.force_release(&key).await.unwrap());
        assert!(!locks.inspect(&key).await.unwrap().is_held());
        assert!(matches!(g.release().await, Err(Error::Lost { .. })));
    }
}

/// A list walks every primary: locks held on each come once each, read locks held by
/// readers alone too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_walks_every_primary() {
    use futures_util::TryStreamExt;
    let cluster = shared();
    let locks = Locks::cluster(cluster.urls()).connect().await.unwrap();
    let keys = spread_keys(cluster, "listed", 3);
    let mut guards = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        guards.push(match i % 3 {
            0 => locks.lock(key).acquire().await.unwrap(),
            1 => locks.read_lock(key).acquire().await.unwrap(),
            _ => locks.semaphore(key, 2).acquire().await.unwrap(),
        });
    }
    let listed: Vec<distlock::LockState> = locks.list("listed-*").try_collect().await.unwrap();
    let mut found: Vec<String> = listed
        .iter()
        .map(|s| s.key["lock:".len()..].to_owned())
        .collect();
    found.sort();
    let mut want = keys.clone();
    want.sort();
    assert_eq!(found, want);
    for g in guards {
        g.release().await.unwrap();
    }
    assert!(
        locks
            .list("listed-*")
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
            .is_empty()
    );
}

/// `per_primary` keys on each primary's slots, named `<tag>-<i>` (the lock key as the
/// client writes it has the default prefix `lock:`).
fn spread_keys(cluster: &RedisCluster, tag: &str, per_primary: usize) -> Vec<String> {
    let primaries: HashSet<u16> = (0..16384u16)
        .step_by(2000)
        .map(|s| cluster.primary_of(s))
        .collect();
    assert_eq!(primaries.len(), 3);
    let mut by_primary: HashMap<u16, Vec<String>> = HashMap::new();
    let mut i = 0;
    while by_primary.len() < primaries.len() || by_primary.values().any(|k| k.len() < per_primary) {
        let key = format!("{tag}-{i}");
        let slot = cluster.slot(&format!("lock:{key}"));
        let keys = by_primary.entry(cluster.primary_of(slot)).or_default();
        if keys.len() < per_primary {
            keys.push(key);
        }
        i += 1;
    }
    by_primary.into_values().flatten().collect()
}

async fn raw_cluster(cluster: &RedisCluster) -> redis::cluster_async::ClusterConnection {
    redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_fences_on_every_primary() {
    let cluster = shared();
    let locks = Locks::cluster(cluster.urls()).connect().await.unwrap();
    for key in spread_keys(cluster, "every", 2) {
        let g = locks.lock(key.as_str()).acquire().await.unwrap();
        assert!(matches!(
            locks.lock(key.as_str()).acquire().await,
            Err(Error::Busy { .. })
        ));
        let f1 = g.fence().await.unwrap();
        g.release().await.unwrap();
        let g = locks.lock(key.as_str()).acquire().await.unwrap();
        assert!(g.fence().await.unwrap() > f1);
        g.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_form_and_renewal_work_on_a_cluster() {
    let cluster = shared();
    let locks = Locks::builder(cluster_url(cluster))
        .connect()
        .await
        .unwrap();
    let keys = spread_keys(cluster, "renew", 1);
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(
            locks
                .lock(key.as_str())
                .ttl(Duration::from_millis(300))
                .renew(true)
                .acquire()
                .await
                .unwrap(),
        );
    }
    // Held three ttls: renewed on every primary (one call per key).
    tokio::time::sleep(Duration::from_millis(900)).await;
    for (key, g) in keys.iter().zip(guards) {
        assert!(matches!(
            locks.lock(key.as_str()).acquire().await,
            Err(Error::Busy { .. })
        ));
        g.release().await.unwrap();
    }
}

/// How long a waiter on another client takes to get `key` after its release, on each
/// primary's keys.
async fn handoffs(holder: &Locks, waiter: &Locks, keys: &[String]) -> Vec<Duration> {
    let mut gaps = Vec::new();
    for key in keys {
        let g = holder.lock(key.as_str()).acquire().await.unwrap();
        let w = take_and_release(waiter, key, Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(150)).await;
        gaps.push(handoff_gap(g, w).await);
    }
    gaps.sort();
    gaps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_sharded_messages() {
    let cluster = shared();
    let keys = spread_keys(cluster, "wake", 2);
    let holder = Locks::cluster(cluster.urls()).connect().await.unwrap();
    let waiter = Locks::cluster(cluster.urls()).connect().await.unwrap();
    let gaps = handoffs(&holder, &waiter, &keys).await;
    let median = gaps[gaps.len() / 2];
    assert!(
        median < Duration::from_millis(40),
        "handoffs {gaps:?}: this close to the 100 ms fallback, no message woke the waiter"
    );
}

/// Control: without messages the same handoffs wait for the fallback timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_messages_handoffs_wait_for_the_fallback() {
    let cluster = shared();
    let keys = spread_keys(cluster, "nowake", 2);
    let holder = Locks::cluster(cluster.urls()).connect().await.unwrap();
    let waiter = Locks::cluster(cluster.urls())
        .notify_waiters(false)
        .connect()
        .await
        .unwrap();
    let gaps = handoffs(&holder, &waiter, &keys).await;
    assert!(
        gaps[gaps.len() / 2] > Duration::from_millis(40),
        "handoffs {gaps:?}"
    );
}

#[idempotent(key = "cluster-pay:<id>", client = locks, lease = "5s", skip = [runs])]
async fn pay(locks: &Locks, id: &str, runs: &Runs) -> Result<u32, AppError> {
    let n = runs.bump();
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_idempotent_calls_run_once_on_every_primary() {
    let cluster = shared();
    let locks = Locks::cluster(cluster.urls()).connect().await.unwrap();
    // One id whose record (`lock:idem:<module::fn>:<key>`) lives on each primary.
    let mut ids: HashMap<u16, String> = HashMap::new();
    for i in 0.. {
        let id = format!("p{i}");
        let slot = cluster.slot(&format!("lock:idem:cluster::pay:cluster-pay:{id}"));
        ids.entry(cluster.primary_of(slot)).or_insert(id);
        if ids.len() == 3 {
            break;
        }
    }
    let ids: Vec<String> = ids.into_values().collect();
    for id in ids {
        let runs = Arc::new(Runs::default());
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (locks, runs, id) = (locks.clone(), runs.clone(), id.clone());
            tasks.push(tokio::spawn(async move { pay(&locks, &id, &runs).await }));
        }
        let mut firsts = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(n) => assert_eq!(n, 1),
                Err(AppError::Lock(Error::InProgress { .. })) => firsts += 1,
                Err(e) => panic!("{e:?}"),
            }
        }
        assert_eq!(
            runs.get(),
            1,
            "one execution for {id} ({firsts} saw it in progress)"
        );
        let again = Arc::new(Runs::default());
        assert_eq!(pay(&locks, &id, &again).await.unwrap(), 1, "replayed");
        assert_eq!(again.get(), 0);
    }
}

/// Tasks on two clients take `key` in turn, each checking that nobody else is inside and
/// that its fence is larger than every earlier holder's; until `stop`, then `rounds`
/// more each. Returns (cycles, overlaps, fences that went backwards, errors).
async fn contend(
    clients: &[Locks],
    key: &str,
    tasks_per_client: usize,
    stop: Arc<AtomicBool>,
) -> (u64, u64, u64, Vec<String>) {
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let backwards = Arc::new(AtomicU64::new(0));
    let last_fence = Arc::new(AtomicU64::new(0));
    let cycles = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for locks in clients {
        for _ in 0..tasks_per_client {
            let (locks, key, stop) = (locks.clone(), key.to_owned(), stop.clone());
            let (inside, overlaps, backwards, last_fence, cycles, errors) = (
                inside.clone(),
                overlaps.clone(),
                backwards.clone(),
                last_fence.clone(),
                cycles.clone(),
                errors.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut after_stop = 0;
                while after_stop < 3 {
                    if stop.load(Ordering::SeqCst) {
                        after_stop += 1;
                    }
                    let g = match locks
                        .lock(key.as_str())
                        .ttl(Duration::from_secs(10))
                        .wait(Duration::from_secs(20))
                        .acquire()
                        .await
                    {
                        Ok(g) => g,
                        Err(e) => {
                            errors.lock().unwrap().push(format!("acquire: {e}"));
                            continue;
                        }
                    };
                    if inside.fetch_add(1, Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    match g.fence().await {
                        Ok(f) => {
                            if last_fence.fetch_max(f, Ordering::SeqCst) >= f {
                                backwards.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        Err(Error::Lost { .. }) => {
                            errors.lock().unwrap().push("fence: LOST".into())
                        }
                        Err(e) => errors.lock().unwrap().push(format!("fence: {e}")),
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    match g.release().await {
                        Ok(()) => {}
                        Err(Error::Lost { .. }) => {
                            errors.lock().unwrap().push("release: LOST".into())
                        }
                        Err(e) => errors.lock().unwrap().push(format!("release: {e}")),
                    }
                    cycles.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let errors = errors.lock().unwrap().clone();
    (
        cycles.load(Ordering::SeqCst),
        overlaps.load(Ordering::SeqCst),
        backwards.load(Ordering::SeqCst),
        errors,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_under_a_held_contended_lock() {
    migrated_under_a_held_contended_lock(false).await;
}

/// The same, the slot moving to a node that joined after the clients connected (it owned
/// no slot, so the clients' cluster connections have no connection to it when its first
/// `ASK` comes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_to_a_new_node() {
    migrated_under_a_held_contended_lock(true).await;
}

async fn migrated_under_a_held_contended_lock(to_new_node: bool) {
    let mut cluster = RedisCluster::start(3, 0);
    let key = "moving";
    let slot = cluster.slot("lock:moving");
    let from = cluster.primary_of(slot);
    let clients = [
        Locks::cluster(cluster.urls()).connect().await.unwrap(),
        Locks::cluster(cluster.urls()).connect().await.unwrap(),
    ];
    // Connections made first.
    for locks in &clients {
        cycles_ok(locks, key).await;
    }
    let to = if to_new_node {
        cluster.add_node()
    } else {
        (0..16384u16)
            .step_by(2000)
            .map(|s| cluster.primary_of(s))
            .find(|p| *p != from)
            .unwrap()
    };
    let cluster = Arc::new(cluster);
    // The counter exists before the move, so it moves too.
    let g = clients[0].lock(key).acquire().await.unwrap();
    let first = g.fence().await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let run = {
        let (clients, stop) = (clients.clone(), stop.clone());
        tokio::spawn(async move { contend(&clients, key, 3, stop).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Held and waited for while its keys move one by one (each `MIGRATE` 300 ms apart,
    // so calls meet ASK and TRYAGAIN), then the slot is the other primary's (MOVED).
    let moving = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || {
            cluster.migrate_slot(slot, to, 1, Duration::from_millis(300))
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    g.release().await.unwrap();
    moving.await.unwrap();
    assert_eq!(cluster.primary_of(slot), to, "the slot moved");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let (cycles, overlaps, backwards, errors) = run.await.unwrap();
    eprintln!("{cycles} cycles, errors: {errors:?}");
    assert_eq!(overlaps, 0, "two holders at once");
    assert_eq!(backwards, 0, "a fence went backwards");
    assert!(
        errors.is_empty(),
        "calls failed through the move: {errors:?}"
    );
    assert!(
        cycles >= 18,
        "every task took the lock after the move ({cycles})"
    );
    let g = clients[1].lock(key).acquire().await.unwrap();
    assert!(g.fence().await.unwrap() > first);
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_promoted_by_cluster_failover() {
    failover(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_and_its_replica_promoted() {
    failover(true).await;
}

/// Lock cycles on a primary's keys while its replica takes over: `CLUSTER FAILOVER`
/// (coordinated: nothing is lost), or the primary SIGKILLed (the cluster promotes the
/// replica after the node timeout, 2 s). Calls fail with `Backend` within their timeouts
/// meanwhile, and work afterwards without a new client.
async fn failover(kill: bool) {
    let mut cluster = RedisCluster::start(3, 1);
    let timeout = Duration::from_millis(500);
    let locks = Locks::cluster(cluster.urls())
        .command_timeout(timeout)
        .connect()
        .await
        .unwrap();
    let held_key = "failing";
    let slot = cluster.slot("lock:failing");
    let primary = cluster.primary_of(slot);
    let replica = cluster.replicas_of(primary)[0];
    // Another key on the same primary for the cycles.
    let key = (0..)
        .map(|i| format!("busy-{i}"))
        .find(|k| cluster.primary_of(cluster.slot(&format!("lock:{k}"))) == primary)
        .unwrap();
    let held = locks
        .lock(held_key)
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let first = held.fence().await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let cycles = cycle_until(&locks, &key, &stop);
    tokio::time::sleep(Duration::from_millis(200)).await;
    if kill {
        let node = cluster
            .nodes
            .iter_mut()
            .find(|n| n.port == primary)
            .unwrap();
        node.kill();
    } else {
        assert_eq!(RedisCluster::cli(replica, &["CLUSTER", "FAILOVER"]), "OK");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster.primary_of(slot) != replica {
        assert!(Instant::now() < deadline, "the replica was promoted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Past the cycles' 1 s ttl: a lock whose release failed meanwhile has expired.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::SeqCst);
    let cycles = cycles.await.unwrap();
    // acquire, fence and release: each call bounded by the command timeout. Lost only
    // where a primary died: a coordinated failover loses nothing.
    check_failover(&cycles, 3 * timeout + Duration::from_millis(500), kill);
    // Then every call works, on the promoted replica.
    for _ in 0..20 {
        let g = locks.lock("busy-after").acquire().await.unwrap();
        g.release().await.unwrap();
    }
    if kill {
        // What the replica had received of the lock is what is left; fences go on.
        drop(held);
        return;
    }
    // A coordinated failover loses nothing: the held lock is still held, its fences go on.
    assert!(matches!(
        locks.lock(held_key).acquire().await,
        Err(Error::Busy { .. })
    ));
    held.release().await.unwrap();
    let again = locks.lock(held_key).acquire().await.unwrap();
    assert!(again.fence().await.unwrap() > first);
    again.release().await.unwrap();
}

/// Environment of a child process: its role (`locked` or `unlocked`), the cluster's URL,
/// the keys.
const ROLE_VAR: &str = "DISTLOCK_CLUSTER_CHILD";
const URL_VAR: &str = "DISTLOCK_CLUSTER_URL";
const KEYS_VAR: &str = "DISTLOCK_CLUSTER_KEYS";
/// When both children start their rounds (ms since the Unix epoch): together, so that
/// without the lock their read-modify-writes interleave.
const START_VAR: &str = "DISTLOCK_CLUSTER_START_AT";

fn unix_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}
/// Read-modify-write rounds per key and child.
const ROUNDS: u64 = 25;

/// Entry point of child processes; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(120));
        std::process::exit(3);
    });
    let url = std::env::var(URL_VAR).unwrap();
    let keys: Vec<String> = std::env::var(KEYS_VAR)
        .unwrap()
        .split(',')
        .map(str::to_owned)
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // The default client's URL form.
        let locks = Locks::builder(url.as_str()).connect().await.unwrap();
        let nodes: Vec<String> = url
            .trim_start_matches("redis+cluster://")
            .split(',')
            .map(|h| format!("redis://{h}/"))
            .collect();
        let mut data = redis::cluster::ClusterClient::new(nodes)
            .unwrap()
            .get_async_connection()
            .await
            .unwrap();
        let start_at: u64 = std::env::var(START_VAR).unwrap().parse().unwrap();
        tokio::time::sleep(Duration::from_millis(start_at.saturating_sub(unix_ms()))).await;
        for _ in 0..ROUNDS {
            for key in &keys {
                let guard = if role == "locked" {
                    Some(
                        locks
                            .lock(key.as_str())
                            .wait(Duration::from_secs(30))
                            .acquire()
                            .await
                            .unwrap(),
                    )
                } else {
                    None
                };
                let counter = format!("count:{key}");
                let n: u64 = data
                    .get::<_, Option<u64>>(&counter)
                    .await
                    .unwrap()
                    .unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(1)).await;
                let _: () = data.set(&counter, n + 1).await.unwrap();
                if let Some(g) = guard {
                    g.release().await.unwrap();
                }
            }
        }
    });
    println!("@@done");
}

/// Two processes add 1 to each key's counter `ROUNDS` times, with or without the lock;
/// returns how many additions were lost over all keys.
async fn two_processes(cluster: &RedisCluster, tag: &str, role: &str) -> u64 {
    let keys = spread_keys(cluster, tag, 2);
    let start_at = (unix_ms() + 3_000).to_string();
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
                .env(ROLE_VAR, role)
                .env(URL_VAR, cluster_url(cluster))
                .env(KEYS_VAR, keys.join(","))
                .env(START_VAR, &start_at)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        let out = BufReader::new(child.stdout.take().unwrap());
        let lines: Vec<String> = out.lines().map_while(Result::ok).collect();
        let status = child.wait().unwrap();
        assert!(
            status.success() && lines.iter().any(|l| l.contains("@@done")),
            "a child failed ({status}): {lines:?}"
        );
    }
    let mut data = raw_cluster(cluster).await;
    let mut lost = 0;
    for key in &keys {
        let n: u64 = data.get(format!("count:{key}")).await.unwrap();
        lost += 2 * ROUNDS - n;
    }
    lost
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_across_processes_on_every_primary() {
    let lost = two_processes(shared(), "procs", "locked").await;
    assert_eq!(lost, 0, "updates lost under the lock");
}

/// Control: without the lock the same work loses updates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_the_lock_processes_lose_updates() {
    let lost = two_processes(shared(), "noprocs", "unlocked").await;
    assert!(lost > 0, "no update lost: the workload shows no race");
}

#[test]
fn one_client_from_several_runtimes() {
    let cluster = shared();
    let keys = spread_keys(cluster, "runtimes", 1);
    let others = spread_keys(cluster, "runtimes-b", 1);
    let locks = Locks::cluster(cluster.urls()).build().unwrap();
    let rt = |locks: Locks, keys: Vec<String>| {
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                for key in &keys {
                    cycles(&locks, key, 5).await;
                    // A waiter woken on this runtime's Pub/Sub connection.
                    let g = locks.lock(key.as_str()).acquire().await.unwrap();
                    let w = take_and_release(&locks.clone(), key, Duration::from_secs(10));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    g.release().await.unwrap();
                    w.await.unwrap();
                }
            });
            // The runtime, its connections and their tasks end here.
        })
    };
    // One after another (a runtime that ended leaves dead connections behind), then
    // two at once.
    rt(locks.clone(), keys.clone()).join().unwrap();
    rt(locks.clone(), keys.clone()).join().unwrap();
    let (a, b) = (rt(locks.clone(), keys), rt(locks, others));
    a.join().unwrap();
    b.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_at_every_await_leaves_the_lock_free() {
    let cluster = shared();
    let locks = Locks::cluster(cluster.urls()).connect().await.unwrap();
    let other = Locks::cluster(cluster.urls()).connect().await.unwrap();
    for key in spread_keys(cluster, "cancel", 1) {
        for step in 0..40u64 {
            // Dropped somewhere in acquire, fence or release (or after).
            let _ = tokio::time::timeout(Duration::from_micros(step * 50), async {
                let g = locks
                    .lock(key.as_str())
                    .ttl(Duration::from_secs(30))
                    .acquire()
                    .await?;
                g.fence().await?;
                g.release().await
            })
            .await;
            // Free long before the 30 s ttl: a cancelled acquire gives back what it took,
            // a cancelled release finishes in a task of its own.
            let g = other
                .lock(key.as_str())
                .wait(Duration::from_secs(3))
                .acquire()
                .await
                .unwrap_or_else(|e| panic!("{key}, cancelled after {}µs: {e}", step * 50));
            g.release().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_killed_under_contention() {
    // Its own cluster: the kills would cut the other tests' connections too.
    let cluster = &RedisCluster::start(3, 0);
    let key = "killed";
    let clients = [
        Locks::cluster(cluster.urls()).connect().await.unwrap(),
        Locks::cluster(cluster.urls()).connect().await.unwrap(),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let run = {
        let (clients, stop) = (clients.clone(), stop.clone());
        tokio::spawn(async move { contend(&clients, key, 2, stop).await })
    };
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        for port in &ports {
            RedisCluster::cli(*port, &["CLIENT", "KILL", "TYPE", "normal"]);
            RedisCluster::cli(*port, &["CLIENT", "KILL", "TYPE", "pubsub"]);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let (cycles, overlaps, backwards, errors) = run.await.unwrap();
    eprintln!("{cycles} cycles, errors: {errors:?}");
    assert_eq!(overlaps, 0, "two holders at once");
    assert_eq!(backwards, 0, "a fence went backwards");
    for e in &errors {
        assert!(
            e.contains("backend") && !e.contains("LOST"),
            "a killed connection is a backend error, never a lost lock: {e}"
        );
    }
    // Working again, with the same clients.
    for locks in &clients {
        cycles_ok(locks, key).await;
    }
}

async fn cycles_ok(locks: &Locks, key: &str) {
    for _ in 0..5 {
        let g = locks
            .lock(key)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        g.fence().await.unwrap();
        g.release().await.unwrap();
    }
}

/// A waiter subscribed on the slot's node when the slot moves: the node drops its
/// channel, and the client subscribes again on the new node, so the release there still
/// wakes it by message (three times: far below the 100 ms fallback each time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_follows_its_channel_to_the_new_node() {
    let cluster = RedisCluster::start(3, 0);
    let holder = Locks::cluster(cluster.urls()).connect().await.unwrap();
    let waiter = Locks::cluster(cluster.urls()).connect().await.unwrap();
    let primaries: Vec<u16> = {
        let mut p: Vec<u16> = (0..16384u16)
            .step_by(2000)
            .map(|s| cluster.primary_of(s))
            .collect();
        p.sort_unstable();
        p.dedup();
        p
    };
    let mut gaps = Vec::new();
    for round in 0..3 {
        let key = format!("follow-{round}");
        let slot = cluster.slot(&format!("lock:{key}"));
        let g = holder.lock(key.as_str()).acquire().await.unwrap();
        let w = take_and_release(&waiter, &key, Duration::from_secs(20));
        let deadline = Instant::now() + Duration::from_secs(5);
        while waiter.waiting_channels() == 0 {
            assert!(Instant::now() < deadline, "the waiter subscribed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let to = *primaries
            .iter()
            .find(|p| **p != cluster.primary_of(slot))
            .unwrap();
        cluster.migrate_slot(slot, to, 10, Duration::ZERO);
        // The client learns the new owner (a call meets MOVED) and subscribes there.
        let probe = holder.lock(format!("{key}-probe")).acquire().await;
        drop(probe);
        tokio::time::sleep(Duration::from_millis(500)).await;
        gaps.push(handoff_gap(g, w).await);
    }
    gaps.sort();
    eprintln!("handoffs after the move: {gaps:?}");
    assert!(
        gaps[1] < Duration::from_millis(40),
        "handoffs after the move {gaps:?}: no message woke the waiter"
    );
}

/// Sequential calls go over direct connections to the primary that owns each key's slot
/// (`CLIENT LIST` there names them), not only through the cluster connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_connections_go_to_the_slot_owner() {
    let cluster = shared();
    let locks = Locks::cluster(cluster.urls()).connect().await.unwrap();
    for key in spread_keys(cluster, "direct", 1) {
        cycles(&locks, &key, 3).await;
        let owner = cluster.primary_of(cluster.slot(&format!("lock:{key}")));
        let clients = RedisCluster::cli(owner, &["CLIENT", "LIST"]);
        assert!(
            clients.contains("name=distlock-direct"),
            "no direct connection on {owner}: {clients}"
        );
    }
}

/// `locks` takes `key` within 5 s (far below the 30 s ttl of what held it), and gives it
/// back.
async fn gets_in_soon(locks: &Locks, key: &str) {
    let took = time_to_take(locks, key, Duration::from_secs(10)).await;
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// A primary paused past the command timeout (SIGSTOP for about 700 ms, well within the
/// cluster's 2 s node timeout: no failover), then resumed: it runs the commands that
/// timed out, their replies too late. What each party sees:
/// - the caller whose `acquire()` timed out gets a `Backend` error within the timeout,
///   and its token, written late, is taken back: the next holder gets in long before
///   the 30 s ttl;
/// - the holder whose `release()` timed out gets a `Backend` error (it cannot tell), never
///   `Lost`, and the lock is free once the server runs the release;
/// - calls on the other primaries' keys work meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_primary_runs_late_what_timed_out() {
    let cluster = RedisCluster::start(3, 0);
    let timeout = Duration::from_millis(300);
    let locks = Locks::cluster(cluster.urls())
        .command_timeout(timeout)
        .connect()
        .await
        .unwrap();
    let other = Locks::cluster(cluster.urls()).connect().await.unwrap();
    let keys = spread_keys(&cluster, "paused", 2);
    let on = |key: &str| cluster.primary_of(cluster.slot(&format!("lock:{key}")));
    let paused = on(&keys[0]);
    let (same, elsewhere): (Vec<&String>, Vec<&String>) =
        keys.iter().partition(|k| on(k) == paused);
    let (key, key2, free) = (same[0].as_str(), same[1].as_str(), elsewhere[0].as_str());
    // Connections made first.
    cycles(&locks, key, 1).await;
    cycles(&locks, free, 1).await;
    let ttl = Duration::from_secs(30);

    cluster.signal(paused, "STOP");
    let started = Instant::now();
    let got = locks.lock(key).ttl(ttl).acquire().await;
    assert!(matches!(got, Err(Error::Backend { .. })), "{got:?}");
    assert!(started.elapsed() < 3 * timeout, "{:?}", started.elapsed());
    cycles(&locks, free, 1).await;
    tokio::time::sleep(Duration::from_millis(700).saturating_sub(started.elapsed())).await;
    cluster.signal(paused, "CONT");
    gets_in_soon(&other, key).await;

    let held = locks.lock(key2).ttl(ttl).acquire().await.unwrap();
    cluster.signal(paused, "STOP");
    let paused_at = Instant::now();
    let released = held.release().await;
    tokio::time::sleep(Duration::from_millis(700).saturating_sub(paused_at.elapsed())).await;
    cluster.signal(paused, "CONT");
    assert!(
        matches!(released, Ok(()) | Err(Error::Backend { .. })),
        "a release that timed out is never told Lost: {released:?}"
    );
    gets_in_soon(&other, key2).await;
}
