//! W1 and W2: uncontended pairs, against the baseline in alternating rounds.
#![allow(clippy::wildcard_imports)]
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::*;

// ---------------------------------------------------------------------------------------
// W1 and W2: uncontended
// ---------------------------------------------------------------------------------------

/// `n` sequential pairs from key index `from`; latencies (ns) appended; returns elapsed and errors.
pub(crate) async fn w1_block(
    client: &Client,
    from: usize,
    n: usize,
    lat: &mut Vec<u64>,
) -> (Duration, u64) {
    let mut errors = 0;
    let start = Instant::now();
    for i in from..from + n {
        let t = Instant::now();
        let key = format!("w1:{}", i % 100);
        match client.acquire(&key, WAIT).await {
            Ok(h) => {
                if client.release(h).await.is_err() {
                    errors += 1;
                }
            }
            Err(_) => errors += 1,
        }
        lat.push(t.elapsed().as_nanos() as u64);
    }
    (start.elapsed(), errors)
}

/// `tasks` tasks each on its own key, `pairs` pairs in all (each pair also takes a fence
/// when `fenced`); returns elapsed and errors.
pub(crate) async fn w2_block(
    client: &Arc<Client>,
    tasks: usize,
    pairs: usize,
    fenced: bool,
) -> (Duration, u64) {
    let barrier = Arc::new(tokio::sync::Barrier::new(tasks + 1));
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let n = pairs / tasks + usize::from(t < pairs % tasks);
        let (client, barrier) = (client.clone(), barrier.clone());
        handles.push(tokio::spawn(async move {
            let key = format!("{}:{t}", if fenced { "w2f" } else { "w2" });
            barrier.wait().await;
            let mut errors = 0u64;
            for _ in 0..n {
                match client.acquire(&key, WAIT).await {
                    Ok(h) => {
                        if fenced && client.fence(&h).await.is_err() {
                            errors += 1;
                        }
                        if client.release(h).await.is_err() {
                            errors += 1;
                        }
                    }
                    Err(_) => errors += 1,
                }
            }
            errors
        }));
    }
    barrier.wait().await;
    let start = Instant::now();
    let mut errors = 0;
    for h in handles {
        errors += h.await.expect("w2 task");
    }
    (start.elapsed(), errors)
}

#[derive(Default)]
pub(crate) struct Uncontended {
    pub(crate) pairs: usize,
    pub(crate) elapsed: Duration,
    pub(crate) errors: u64,
    /// Latency of every pair (ns), sorted at the end (W1).
    pub(crate) lat: Vec<u64>,
    /// Pairs per second of every block, in order.
    pub(crate) block_rates: Vec<f64>,
    /// redis-server CPU seconds spent during this implementation's blocks.
    pub(crate) server_cpu: f64,
    /// This process's CPU seconds (all threads) during this implementation's blocks.
    pub(crate) client_cpu: f64,
}

impl Uncontended {
    pub(crate) fn rate(&self) -> f64 {
        self.pairs as f64 / self.elapsed.as_secs_f64()
    }

    pub(crate) fn add_block(&mut self, pairs: usize, elapsed: Duration, errors: u64) {
        self.pairs += pairs;
        self.elapsed += elapsed;
        self.errors += errors;
        self.block_rates.push(pairs as f64 / elapsed.as_secs_f64());
    }

    /// Server CPU per pair, in microseconds.
    pub(crate) fn server_us(&self) -> f64 {
        self.server_cpu * 1e6 / self.pairs.max(1) as f64
    }

    /// Client (this process) CPU per pair, in microseconds.
    pub(crate) fn client_us(&self) -> f64 {
        self.client_cpu * 1e6 / self.pairs.max(1) as f64
    }
}

/// Median, min and max of the per-round ratios `a / b` (blocks of the same round).
pub(crate) fn round_ratios(a: &Uncontended, b: &Uncontended) -> (f64, f64, f64) {
    let mut r: Vec<f64> = a
        .block_rates
        .iter()
        .zip(&b.block_rates)
        .map(|(x, y)| x / y)
        .collect();
    r.sort_by(f64::total_cmp);
    let mid = pct(&r, 0.5).unwrap_or(f64::NAN);
    (
        mid,
        r.first().copied().unwrap_or(f64::NAN),
        r.last().copied().unwrap_or(f64::NAN),
    )
}

/// Rounds of W1 and W2: each round runs one block of every implementation, in an order
/// that flips every round, so that the drift of a shared, noisy machine falls on all alike.
pub(crate) const ROUNDS: usize = 20;

pub(crate) fn round_order(round: usize) -> [Kind; 3] {
    if round.is_multiple_of(2) {
        [Kind::Raw, Kind::Distlock, Kind::RawLua]
    } else {
        [Kind::RawLua, Kind::Distlock, Kind::Raw]
    }
}

/// Results indexed by [`slot`].
type Three = [Uncontended; 3];

/// CPU seconds this process has run so far, all threads (Linux `schedstat`, ns
/// resolution); NaN elsewhere.
pub(crate) fn own_cpu() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return f64::NAN;
    };
    let mut ns = 0u64;
    for t in tasks.flatten() {
        if let Ok(stat) = std::fs::read_to_string(t.path().join("schedstat")) {
            ns += stat
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    ns as f64 / 1e9
}

/// `INFO <section>` of the server.
pub(crate) async fn info_section(conn: &mut MultiplexedConnection, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"))
}

/// Server CPU seconds so far (`INFO cpu`: user + sys of redis-server).
pub(crate) async fn server_cpu(conn: &mut MultiplexedConnection) -> f64 {
    info_section(conn, "cpu")
        .await
        .lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// Connections to every server whose CPU counts (one, or a cluster's nodes).
pub(crate) struct Servers(Vec<MultiplexedConnection>);

impl Servers {
    pub(crate) async fn connect(urls: &[String]) -> Servers {
        let mut conns = Vec::with_capacity(urls.len());
        for url in urls {
            conns.push(raw_connection(url).await);
        }
        Servers(conns)
    }

    /// CPU seconds the servers have spent so far, summed.
    pub(crate) async fn cpu(&mut self) -> f64 {
        let mut sum = 0.0;
        for conn in &mut self.0 {
            sum += server_cpu(conn).await;
        }
        sum
    }
}

pub(crate) async fn run_w1(cfg: &Config, servers: &[String], clients: &[Arc<Client>; 3]) -> Three {
    let mut stats = Servers::connect(servers).await;
    let mut out: Three = Default::default();
    for client in clients {
        let mut sink = Vec::new();
        w1_block(client, 0, cfg.w1_warmup, &mut sink).await;
    }
    let per_block = cfg.w1_pairs / ROUNDS;
    let mut next = [0usize; 3];
    for round in 0..ROUNDS {
        for kind in round_order(round) {
            let i = slot(kind);
            let cpu = stats.cpu().await;
            let own = own_cpu();
            let res = &mut out[i];
            let (elapsed, errors) = w1_block(&clients[i], next[i], per_block, &mut res.lat).await;
            res.client_cpu += own_cpu() - own;
            res.server_cpu += stats.cpu().await - cpu;
            next[i] += per_block;
            res.add_block(per_block, elapsed, errors);
        }
    }
    for r in &mut out {
        r.lat.sort_unstable();
    }
    out
}

pub(crate) async fn run_w2(
    cfg: &Config,
    servers: &[String],
    clients: &[Arc<Client>; 3],
    fenced: bool,
) -> Three {
    let mut stats = Servers::connect(servers).await;
    let mut out: Three = Default::default();
    let per_block = cfg.w2_pairs / ROUNDS;
    for round in 0..ROUNDS {
        for kind in round_order(round) {
            let i = slot(kind);
            let cpu = stats.cpu().await;
            let own = own_cpu();
            let (elapsed, errors) = w2_block(&clients[i], cfg.w2_tasks, per_block, fenced).await;
            out[i].client_cpu += own_cpu() - own;
            out[i].server_cpu += stats.cpu().await - cpu;
            out[i].add_block(per_block, elapsed, errors);
        }
    }
    out
}

/// Index of an implementation in [`Three`].
pub(crate) fn slot(kind: Kind) -> usize {
    match kind {
        Kind::Distlock => 0,
        Kind::Raw => 1,
        Kind::RawLua => 2,
        Kind::Floor => unreachable!("the floor runs in W3 only"),
    }
}
