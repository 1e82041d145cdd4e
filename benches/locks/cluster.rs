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

/// `DISTLOCK_BENCH_ONLY=redlock`: W1 (sequential pairs) over Redlock on 5 local masters
/// against distlock on one of them, in alternating blocks of one run; the ratio of the
/// latencies is the cost of the fan-out.
pub(crate) async fn run_redlock(cfg: &Config) {
    let masters: Vec<testkit::RedisServer> =
        (0..5).map(|_| testkit::RedisServer::start()).collect();
    let urls: Vec<String> = masters.iter().map(testkit::RedisServer::url).collect();
    let redlock = Client::Distlock(
        distlock::Locks::redlock(&urls)
            .connect()
            .await
            .expect("redlock connects"),
    );
    let one = Client::Distlock(
        distlock::Locks::connect(&urls[0])
            .await
            .expect("one master connects"),
    );
    let (mut lat_redlock, mut lat_one) = (Vec::new(), Vec::new());
    let mut sink = Vec::new();
    for client in [&redlock, &one] {
        w1_block(client, 0, cfg.w1_warmup, &mut sink).await;
    }
    let per_block = cfg.w1_pairs / ROUNDS;
    let (mut errors, mut from) = (0, 0);
    for round in 0..ROUNDS {
        let order = if round.is_multiple_of(2) {
            [(&redlock, &mut lat_redlock), (&one, &mut lat_one)]
        } else {
            [(&one, &mut lat_one), (&redlock, &mut lat_redlock)]
        };
        for (client, lat) in order {
            errors += w1_block(client, from, per_block, lat).await.1;
        }
        from += per_block;
    }
    // The floor on this machine: raw redis-rs sending the same fan-out by hand (SET NX
    // PX on all 5 at once, then the compare-and-delete on all 5), against the same pair
    // on one master.
    let mut conns = Vec::new();
    for url in &urls {
        conns.push(raw_connection(url).await);
    }
    let release = redis::Script::new(RAW_RELEASE);
    for conn in &mut conns {
        release
            .prepare_invoke()
            .load_async(conn)
            .await
            .expect("SCRIPT LOAD");
    }
    let raw_pair = |conns: &[redis::aio::MultiplexedConnection], i: usize| {
        let conns = conns.to_vec();
        let release = release.clone();
        async move {
            let key = format!("w1raw:{}", i % 100);
            let token = raw_token();
            let sets = conns.iter().map(|c| {
                let mut c = c.clone();
                let (key, token) = (key.clone(), token.clone());
                async move {
                    redis::cmd("SET")
                        .arg(&key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(30_000)
                        .query_async::<Option<String>>(&mut c)
                        .await
                }
            });
            futures_util::future::join_all(sets).await;
            let dels = conns.iter().map(|c| {
                let mut c = c.clone();
                let mut inv = release.prepare_invoke();
                inv.key(&key).arg(&token);
                async move { inv.invoke_async::<i64>(&mut c).await }
            });
            futures_util::future::join_all(dels).await;
        }
    };
    let (mut lat_fan, mut lat_raw1) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        for which in if round.is_multiple_of(2) {
            [0, 1]
        } else {
            [1, 0]
        } {
            let (set, lat) = if which == 0 {
                (&conns[..], &mut lat_fan)
            } else {
                (&conns[..1], &mut lat_raw1)
            };
            for i in 0..per_block {
                let t = tokio::time::Instant::now();
                raw_pair(set, i).await;
                lat.push(t.elapsed().as_nanos() as u64);
            }
        }
    }
    lat_fan.sort_unstable();
    lat_raw1.sort_unstable();
    lat_redlock.sort_unstable();
    lat_one.sort_unstable();
    let us = |v: &[u64], q: f64| pct(v, q).unwrap_or(0) as f64 / 1e3;
    println!(
        "\n  W1 over Redlock (5 masters) vs one master, distlock both: p50 {:.1} / {:.1} us ({:.2}x), p99 {:.1} / {:.1} us ({:.2}x); errors {errors}",
        us(&lat_redlock, 0.5),
        us(&lat_one, 0.5),
        us(&lat_redlock, 0.5) / us(&lat_one, 0.5),
        us(&lat_redlock, 0.99),
        us(&lat_one, 0.99),
        us(&lat_redlock, 0.99) / us(&lat_one, 0.99),
    );
    println!(
        "  the floor, raw redis-rs fanning out by hand: p50 {:.1} / {:.1} us ({:.2}x)",
        us(&lat_fan, 0.5),
        us(&lat_raw1, 0.5),
        us(&lat_fan, 0.5) / us(&lat_raw1, 0.5),
    );
    println!(
        "  Redlock W1 latency <= 1.5x one master (p50): {}",
        verdict(us(&lat_redlock, 0.5) <= 1.5 * us(&lat_one, 0.5))
    );
}
