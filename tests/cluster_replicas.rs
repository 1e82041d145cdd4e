//! Redis Cluster with `replicas = n`, between the lines: each test starts its own cluster
//! (3 primaries, 1 replica each) and pauses a replica with SIGSTOP.
//!
//! 3. one renewal barrier covered one primary only: renewals of locks on other
//!    primaries counted as acknowledged.
#[macro_use]
mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use distlock::Locks;
use testkit::RedisCluster;

/// A key (without the `lock:` prefix) whose slot `primary` serves, named `<tag>-<i>`.
fn key_on(cluster: &RedisCluster, primary: u16, tag: &str) -> String {
    (0..)
        .map(|i| format!("{tag}-{i}"))
        .find(|k| cluster.primary_of(cluster.slot(&format!("lock:{k}"))) == primary)
        .unwrap()
}

/// Sends `sig` (`-STOP`, `-CONT`) to the node on `port`.
fn signal(cluster: &RedisCluster, port: u16, sig: &str) {
    let pid = cluster
        .nodes
        .iter()
        .find(|n| n.port == port)
        .and_then(RedisServer::pid)
        .unwrap();
    Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
}

/// The primaries, in slot order.
fn primaries(cluster: &RedisCluster) -> Vec<u16> {
    let mut found = Vec::new();
    for slot in (0..16384u16).step_by(1000) {
        let p = cluster.primary_of(slot);
        if !found.contains(&p) {
            found.push(p);
        }
    }
    found
}

/// Two renewed locks with `replicas = 1` on two primaries; the second primary's replica
/// is paused. The second lock's renewals are never acknowledged: it must be lost at its
/// lease end, not kept "held" by the barrier the first primary's replica answered.
/// Control: the first lock, on a primary whose replica answers, stays held throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_primary_acknowledges_its_own_renewals() {
    let cluster = RedisCluster::start(3, 1);
    let locks = Locks::cluster(cluster.urls())
        .command_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let ps = primaries(&cluster);
    let (healthy, lagging) = (ps[0], ps[1]);
    let (a, b) = (
        key_on(&cluster, healthy, "a"),
        key_on(&cluster, lagging, "b"),
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
    signal(&cluster, replica, "-STOP");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (held_a, held_b) = (ga.info().is_held(), gb.info().is_held());
    signal(&cluster, replica, "-CONT");
    assert!(held_a, "control: the lock whose replica answers stays held");
    assert!(
        !held_b,
        "no renewal of the lock on the lagging primary was acknowledged for a whole lease"
    );
    ga.release().await.unwrap();
    let _ = gb.release().await;
}
