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
        let released = Instant::now();
        g.release().await.unwrap();
        gaps.push(w.await.unwrap().saturating_duration_since(released));
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
