//! How cost grows with load (issue 24), each against the raw baseline in the same run:
//! - `DISTLOCK_BENCH_ONLY=w7`, a crowd on one key: 100 and then 1,000 waiters spread over
//!   10 clients (each a `Locks` of its own, as 10 instances would be) share tickets on one
//!   key, each acquisition held 1 ms. Handoff gaps, server commands per acquisition
//!   (`INFO commandstats`: they must not grow with the crowd), fairness across clients and
//!   tasks.
//! - `DISTLOCK_BENCH_ONLY=scaling`: W2 on a local Redis Cluster of 1, 3 and 6 primaries
//!   (one machine: the ratio to raw on the same cluster and the commands per pair).
//! - `DISTLOCK_BENCH_ONLY=keys`: W2 over 1,000,000 distinct keys: 64 tasks take every key
//!   and hold them all, then release them all; memory per held lock in Redis and in
//!   this process, against raw.
#![allow(clippy::wildcard_imports)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use redis::aio::MultiplexedConnection;

use crate::*;

/// Clients in W7.
const W7_CLIENTS: usize = 10;

/// One W7 run: `per_client` waiters in each of [`W7_CLIENTS`] clients of `kind`.
async fn w7_once(url: &str, kind: Kind, per_client: usize, total: u64, rtt: f64) -> Contended {
    let mut clients = Vec::with_capacity(W7_CLIENTS);
    for c in 0..W7_CLIENTS {
        let client = Arc::new(Client::connect(kind, url).await);
        client
            .warm_up(kind, url, &format!("w7:warm:{}:{c}", kind.name()))
            .await;
        clients.push(client);
    }
    let tickets = Arc::new(Tickets::Local {
        taken: AtomicU64::new(0),
        total,
    });
    let mut stats = raw_connection(url).await;
    reset_commandstats(&mut stats).await;
    let runs = clients.iter().enumerate().map(|(c, client)| {
        contend(
            client.clone(),
            "w7",
            per_client,
            (c * per_client) as u32,
            tickets.clone(),
        )
    });
    let mut all = RunOut::default();
    for out in futures_util::future::join_all(runs).await {
        all.recs.extend(out.recs);
        all.timeouts += out.timeouts;
        all.errors += out.errors;
    }
    all.commands = read_commandstats(&mut stats).await;
    analyze(all, W7_CLIENTS * per_client, per_client, rtt)
}

pub(crate) async fn run_w7(cfg: &Config, url: &str) {
    let pings = ping_rtts(url, cfg.ping_samples).await;
    let rtt = pct(&pings, 0.5).unwrap_or(0) as f64;
    // Three turns of every waiter for distlock; the baseline, which polls, runs a tenth
    // as many (1,000 pollers hand over a few dozen times a second).
    let total = if cfg.quick { 1_000 } else { 3_000 };
    println!(
        "W7: a crowd on one key, {W7_CLIENTS} clients, {total} acquisitions ({} for raw) held {HOLD:?} each (PING p50 {:.0} us)",
        total / 10,
        rtt / 1e3
    );
    let mut rows = Vec::new();
    for per_client in [10, 100] {
        for kind in [Kind::Distlock, Kind::Raw] {
            let tickets = if kind == Kind::Raw { total / 10 } else { total };
            let r = w7_once(url, kind, per_client, tickets, rtt).await;
            rows.push((per_client * W7_CLIENTS, kind, r));
        }
    }
    println!(
        "  {:>7} {:<8} {:>9} {:>8} {:>22} {:>14} {:>17} {:>17} {:>9}",
        "waiters",
        "",
        "acq/s",
        "x ideal",
        "handoff p50/p99/max us",
        "commands/acq",
        "per client (fair)",
        "per task (fair)",
        "overlaps"
    );
    for (waiters, kind, r) in &rows {
        let commands: f64 = r.commands.iter().map(|(_, n)| n).sum();
        let per_client = format!(
            "{}-{} ({:.0})",
            r.per_proc.iter().min().unwrap_or(&0),
            r.per_proc.iter().max().unwrap_or(&0),
            r.n as f64 / W7_CLIENTS as f64
        );
        println!(
            "  {:>7} {:<8} {:>9.0} {:>7.2}x {:>22} {:>14.1} {:>17} {:>17} {:>9}",
            waiters,
            kind.name(),
            r.rate,
            r.rate / r.ideal,
            format!(
                "{}/{}/{}",
                opt(r.gap_p50_us),
                opt(r.gap_p99_us),
                opt(r.gap_max_us)
            ),
            commands,
            per_client,
            format!("{}-{} ({:.1})", r.min_task, r.max_task, r.fair),
            r.overlaps
        );
        let top: Vec<String> = r
            .commands
            .iter()
            .filter(|(_, n)| *n >= 0.05)
            .map(|(name, n)| format!("{name} {n:.2}"))
            .collect();
        println!(
            "          commands per acquisition: {}; timeouts {}, errors {}",
            top.join(", "),
            r.timeouts,
            r.errors
        );
    }
    let cmds = |waiters: usize| {
        rows.iter()
            .find(|(w, k, _)| *w == waiters && *k == Kind::Distlock)
            .map_or(f64::NAN, |(_, _, r)| {
                r.commands.iter().map(|(_, n)| n).sum()
            })
    };
    let big = &rows
        .iter()
        .find(|(w, k, _)| *w == 10 * W7_CLIENTS * 10 && *k == Kind::Distlock)
        .expect("the 1,000-waiter run")
        .2;
    println!(
        "  W7 commands per acquisition, 1,000 waiters vs 100: {:.2} vs {:.2} ({:.2}x; no herd when about 1x) {}",
        cmds(1_000),
        cmds(100),
        cmds(1_000) / cmds(100),
        verdict(cmds(1_000) <= 1.2 * cmds(100))
    );
    println!(
        "  W7 handoff p99 with 1,000 waiters < 1 ms: {} us {}; every client within 0.5x-2x of its share: {}",
        opt(big.gap_p99_us),
        verdict(big.handoff_ok()),
        verdict(
            big.per_proc
                .iter()
                .all(|&n| n as f64 >= 0.5 * big.n as f64 / W7_CLIENTS as f64
                    && n as f64 <= 2.0 * big.n as f64 / W7_CLIENTS as f64)
        )
    );
}

/// Calls per command since the reset, summed over every node.
async fn commands_on(nodes: &mut [MultiplexedConnection]) -> BTreeMap<String, u64> {
    let mut sum = BTreeMap::new();
    for conn in nodes {
        for (name, calls) in read_commandstats(conn).await {
            *sum.entry(name).or_insert(0) += calls;
        }
    }
    sum
}

pub(crate) async fn run_scaling(cfg: &Config) {
    println!(
        "Cluster scaling: W2 ({} tasks, own keys, {} pairs a side) on 1, 3 and 6 primaries, one machine of {} cores",
        cfg.w2_tasks,
        cfg.w2_pairs,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut rows = Vec::new();
    for primaries in [1, 3, 6] {
        let cluster = testkit::RedisCluster::start(primaries, 0);
        let urls = cluster.urls();
        let clients = [
            Arc::new(Client::connect_cluster(Kind::Distlock, &urls).await),
            Arc::new(Client::connect_cluster(Kind::Raw, &urls).await),
            Arc::new(Client::connect_cluster(Kind::RawLua, &urls).await),
        ];
        let w2 = run_w2(cfg, &urls, &clients, false).await;
        // Commands per pair, each side alone.
        let mut nodes = Vec::new();
        for url in &urls {
            nodes.push(raw_connection(url).await);
        }
        let pairs = cfg.w2_pairs / 10;
        let mut per_pair = [0.0f64; 2];
        for (i, client) in clients[..2].iter().enumerate() {
            for conn in &mut nodes {
                reset_commandstats(conn).await;
            }
            w2_block(client, cfg.w2_tasks, pairs, false).await;
            per_pair[i] = commands_on(&mut nodes).await.values().sum::<u64>() as f64 / pairs as f64;
        }
        println!("  {primaries} primaries done");
        rows.push((primaries, w2, per_pair));
        drop(clients);
        drop(cluster);
    }
    println!(
        "\n  {:>9} {:>10} {:>10} {:>7} {:>15} {:>22} {:>20} {:>8}",
        "primaries",
        "raw/s",
        "distlock/s",
        "ratio",
        "per-round med",
        "server us/pair r / d",
        "commands/pair r / d",
        "errors"
    );
    for (primaries, [d, r, _], [cd, cr]) in &rows {
        let (mid, lo, hi) = round_ratios(d, r);
        println!(
            "  {:>9} {:>10.0} {:>10.0} {:>6.2}x {:>15} {:>22} {:>20} {:>8}",
            primaries,
            r.rate(),
            d.rate(),
            d.rate() / r.rate(),
            format!("{mid:.2}x ({lo:.2}-{hi:.2})"),
            format!("{:.1} / {:.1}", r.server_us(), d.server_us()),
            format!("{cr:.2} / {cd:.2}"),
            d.errors + r.errors
        );
    }
    for (primaries, [d, r, _], _) in &rows {
        println!(
            "  W2 on {primaries} primaries >= 0.95x raw: {:.2}x {}",
            d.rate() / r.rate(),
            verdict(d.rate() >= 0.95 * r.rate())
        );
    }
}

struct ManyKeys {
    take_s: f64,
    release_s: f64,
    server_bytes: f64,
    client_bytes: f64,
    sample: String,
    left: u64,
    errors: u64,
}

/// 64 tasks take keys `<prefix><i>` for every `i < n` and keep them, then release them all.
async fn many_keys_once(
    client: Arc<Client>,
    url: &str,
    prefix: &str,
    n: usize,
    tasks: usize,
) -> ManyKeys {
    let mut stats = raw_connection(url).await;
    let (mem0, rss0) = (stat(&mut stats, "memory", "used_memory").await, rss_bytes());
    let t0 = Instant::now();
    let takers = (0..tasks).map(|t| {
        let (client, prefix) = (client.clone(), prefix.to_owned());
        tokio::spawn(async move {
            let mut held = Vec::with_capacity(n / tasks + 1);
            let mut errors = 0u64;
            for i in (t..n).step_by(tasks) {
                match client.acquire(&format!("{prefix}{i}"), WAIT).await {
                    Ok(h) => held.push(h),
                    Err(_) => errors += 1,
                }
            }
            (held, errors)
        })
    });
    let mut all = Vec::with_capacity(tasks);
    let mut errors = 0;
    for h in futures_util::future::join_all(takers).await {
        let (held, e) = h.expect("taking task");
        errors += e;
        all.push(held);
    }
    let take_s = t0.elapsed().as_secs_f64();
    let server_bytes =
        (stat(&mut stats, "memory", "used_memory").await as f64 - mem0 as f64) / n as f64;
    let client_bytes = (rss_bytes() - rss0) / n as f64;
    let key: Option<String> = redis::cmd("RANDOMKEY")
        .query_async(&mut stats)
        .await
        .unwrap_or(None);
    let sample = match key {
        Some(key) => {
            let value: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut stats)
                .await
                .unwrap_or(None);
            format!(
                "{key} = {} ({} bytes)",
                value.as_deref().unwrap_or("?"),
                value.as_ref().map_or(0, String::len)
            )
        }
        None => "(none)".into(),
    };
    let t1 = Instant::now();
    let releasers = all.into_iter().map(|held| {
        let client = client.clone();
        tokio::spawn(async move {
            let mut errors = 0u64;
            for h in held {
                if client.release(h).await.is_err() {
                    errors += 1;
                }
            }
            errors
        })
    });
    for h in futures_util::future::join_all(releasers).await {
        errors += h.expect("releasing task");
    }
    let release_s = t1.elapsed().as_secs_f64();
    let left: u64 = redis::cmd("DBSIZE")
        .query_async(&mut stats)
        .await
        .unwrap_or(0);
    ManyKeys {
        take_s,
        release_s,
        server_bytes,
        client_bytes,
        sample,
        left,
        errors,
    }
}

pub(crate) async fn run_many_keys(cfg: &Config, url: &str) {
    let n = if cfg.quick { 100_000 } else { 1_000_000 };
    println!(
        "Many keys: {} tasks take {n} distinct keys and hold them all, then release them all (W2 over {n} keys)",
        cfg.w2_tasks
    );
    let mut rows = Vec::new();
    for (kind, prefix) in [(Kind::Raw, "wkr:"), (Kind::Distlock, "wk:")] {
        let client = Arc::new(Client::connect(kind, url).await);
        // What the previous side left (nothing, when every release worked) stays out
        // of this side's memory figure: it is measured from here.
        let r = many_keys_once(client, url, prefix, n, cfg.w2_tasks).await;
        println!("  {} done", kind.name());
        rows.push((kind, r));
    }
    println!(
        "\n  {:<8} {:>10} {:>12} {:>9} {:>22} {:>24} {:>7} {:>7}",
        "",
        "takes/s",
        "releases/s",
        "pairs/s",
        "redis bytes/held lock",
        "this process bytes/lock",
        "left",
        "errors"
    );
    for (kind, r) in &rows {
        println!(
            "  {:<8} {:>10.0} {:>12.0} {:>9.0} {:>22.0} {:>24.0} {:>7} {:>7}",
            kind.name(),
            n as f64 / r.take_s,
            n as f64 / r.release_s,
            n as f64 / (r.take_s + r.release_s),
            r.server_bytes,
            r.client_bytes,
            r.left,
            r.errors
        );
        println!("           a key as stored: {}", r.sample);
    }
    let (raw, ours) = (&rows[0].1, &rows[1].1);
    let pairs = |r: &ManyKeys| n as f64 / (r.take_s + r.release_s);
    println!(
        "  many keys: pairs/s {:.2}x raw; redis memory per held lock {:.2}x raw ({:.0} vs {:.0} bytes)",
        pairs(ours) / pairs(raw),
        ours.server_bytes / raw.server_bytes,
        ours.server_bytes,
        raw.server_bytes
    );
}
