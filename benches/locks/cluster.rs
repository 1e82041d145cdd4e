//! `DISTLOCK_BENCH_ONLY=cluster`: W1, W2 and W3 on a local Redis Cluster of 3 primaries
//! (started here, no replicas), distlock against the raw baseline on the same cluster, in
//! one run. redis-server CPU is summed over the nodes.
#![allow(clippy::wildcard_imports)]
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::*;

pub(crate) async fn run_cluster(cfg: &Config) {
    let cluster = testkit::RedisCluster::start(3, 0);
    let urls = cluster.urls();
    println!("  cluster: 3 primaries on {urls:?}\n");
    let clients = [
        Arc::new(Client::connect_cluster(Kind::Distlock, &urls).await),
        Arc::new(Client::connect_cluster(Kind::Raw, &urls).await),
        Arc::new(Client::connect_cluster(Kind::RawLua, &urls).await),
    ];
    let w1 = run_w1(cfg, &urls, &clients).await;
    println!("  W1 done");
    let w2 = run_w2(cfg, &urls, &clients, false).await;
    println!("  W2 done");
    drop(clients);
    let pings = ping_rtts(&urls[0], cfg.ping_samples).await;
    let rtt = pct(&pings, 0.5).unwrap_or(0) as f64;
    let w3d = w3_on_cluster(cfg, &urls, Kind::Distlock, rtt).await;
    let w3r = w3_on_cluster(cfg, &urls, Kind::Raw, rtt).await;
    println!(
        "\n  {:<4} {:>30} {:>10} {:>10} {:>10}",
        "", "", "raw", "raw+lua", "distlock"
    );
    for (name, [d, r, l]) in [("W1", &w1), ("W2", &w2)] {
        print_rate_row(name, d, r, l);
        print_cpu_rows(name, d, r, l);
        let (mid, lo, hi) = round_ratios(d, r);
        println!("  {name} distlock / raw per round: median {mid:.2}x, range {lo:.2}x-{hi:.2}x");
    }
    println!(
        "  W3 handoff gap p50/p99/max us: distlock {}/{}/{}, raw {}/{}/{}; acquisitions/s distlock {:.0}, raw {:.0}; overlaps {} / {}",
        opt(w3d.gap_p50_us),
        opt(w3d.gap_p99_us),
        opt(w3d.gap_max_us),
        opt(w3r.gap_p50_us),
        opt(w3r.gap_p99_us),
        opt(w3r.gap_max_us),
        w3d.rate,
        w3r.rate,
        w3d.overlaps,
        w3r.overlaps
    );
    println!("\nTargets on the cluster (informational; a bench never fails):");
    println!(
        "  W1 (sequential pairs) >= 1.0x raw:   {:.2}x {}",
        w1[0].rate() / w1[1].rate(),
        verdict(w1[0].rate() >= w1[1].rate())
    );
    println!(
        "  W2 (64 tasks, own keys) >= 0.95x raw: {:.2}x {}",
        w2[0].rate() / w2[1].rate(),
        verdict(w2[0].rate() >= 0.95 * w2[1].rate())
    );
    println!(
        "  W3 handoff p99 < 1 ms:                distlock {} us {}",
        opt(w3d.gap_p99_us),
        verdict(w3d.handoff_ok())
    );
}

/// W3 (16 tasks of one process on one key) on the cluster.
async fn w3_on_cluster(cfg: &Config, urls: &[String], kind: Kind, rtt: f64) -> Contended {
    let client = Arc::new(Client::connect_cluster(kind, urls).await);
    warm_up_cluster(&client, kind, urls).await;
    let tickets = Arc::new(Tickets::Local {
        taken: AtomicU64::new(0),
        total: cfg.w3_acquisitions,
    });
    analyze(
        contend(client, "w3", cfg.w3_tasks, 0, tickets).await,
        cfg.w3_tasks,
        cfg.w3_tasks,
        rtt,
    )
}

/// A few pairs, then one wait behind a second client (distlock opens its Pub/Sub
/// connection then, and keeps it).
async fn warm_up_cluster(client: &Arc<Client>, kind: Kind, urls: &[String]) {
    let key = format!("w3:warm:{}", kind.name());
    for _ in 0..3 {
        let h = client.acquire(&key, WAIT).await.expect("warm-up acquire");
        client.release(h).await.expect("warm-up release");
    }
    let other = Client::connect_cluster(kind, urls).await;
    let held = other.acquire(&key, WAIT).await.expect("warm-up acquire");
    let (me, k) = (client.clone(), key.clone());
    let waiter = tokio::spawn(async move {
        let h = me
            .acquire(&k, std::time::Duration::from_secs(2))
            .await
            .expect("warm-up wait");
        me.release(h).await.expect("warm-up release");
    });
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    other.release(held).await.expect("warm-up release");
    waiter.await.expect("warm-up waiter");
}
