//! W6: many held locks (`DISTLOCK_BENCH_ONLY=w6`). One client holds 10,000 locks with
//! renewal on (ttl 3 s, so a renewal is due every second) for a window of ticks; the
//! raw baseline holds as many with `SET NX PX` and renews them each second with one
//! pipeline of `EVALSHA` compare-and-extend on one multiplexed connection. Measured in
//! the window, from the server: read events (`total_reads_processed`: one per batch the
//! client sends, about) and scripts run per tick, redis-server CPU per renewal; from this
//! process: CPU per held lock per tick, and memory per held lock in the client (RSS)
//! and in Redis (`used_memory`).
#![allow(clippy::wildcard_imports)]

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use super::*;

const TTL_W6: Duration = Duration::from_secs(3);
const WINDOW: Duration = Duration::from_secs(6);

/// Compare-and-extend of the baseline.
const RAW_EXTEND: &str = r"if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0";

struct Held {
    /// Read events, scripts run, redis-server CPU s, this process's CPU s over the window.
    reads: u64,
    scripts: u64,
    server_cpu: f64,
    own_cpu: f64,
    ticks: f64,
    /// Bytes per held lock: this process's RSS, and Redis's `used_memory`.
    client_bytes: f64,
    server_bytes: f64,
}

/// This process's resident memory, in bytes.
pub(crate) fn rss_bytes() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(f64::NAN, |pages| pages * 4096.0)
}

/// A numeric field of an `INFO` section (0 when missing).
pub(crate) async fn stat(conn: &mut MultiplexedConnection, section: &str, field: &str) -> u64 {
    info_section(conn, section)
        .await
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .strip_prefix(':')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// The window's figures, taken around `hold` (which keeps the locks held meanwhile).
async fn measure(
    conn: &mut MultiplexedConnection,
    before_rss: f64,
    before_mem: u64,
    n: usize,
) -> Held {
    let client_bytes = (rss_bytes() - before_rss) / n as f64;
    let server_bytes =
        (stat(conn, "memory", "used_memory").await as f64 - before_mem as f64) / n as f64;
    reset_commandstats(conn).await;
    let reads0 = stat(conn, "stats", "total_reads_processed").await;
    let (cpu0, own0, t0) = (server_cpu(conn).await, own_cpu(), Instant::now());
    tokio::time::sleep(WINDOW).await;
    let (cpu1, own1, secs) = (
        server_cpu(conn).await,
        own_cpu(),
        t0.elapsed().as_secs_f64(),
    );
    let reads1 = stat(conn, "stats", "total_reads_processed").await;
    let scripts = read_commandstats(conn)
        .await
        .iter()
        .filter(|(name, _)| name.starts_with("evalsha") || name.starts_with("eval"))
        .map(|(_, calls)| calls)
        .sum();
    Held {
        // The measuring connection's own INFO calls (4) and the reset are left out.
        reads: reads1.saturating_sub(reads0).saturating_sub(4),
        scripts,
        server_cpu: cpu1 - cpu0,
        own_cpu: own1 - own0,
        ticks: secs / (TTL_W6.as_secs_f64() / 3.0),
        client_bytes,
        server_bytes,
    }
}

pub(crate) async fn run_w6(cfg: &Config, url: &str) {
    let n = if cfg.quick { 1_000 } else { 10_000 };
    let mut conn = raw_connection(url).await;
    println!(
        "W6: {n} locks held by one client, renewed (ttl {TTL_W6:?}: a tick a second), a {WINDOW:?} window"
    );

    // distlock
    let (rss0, mem0) = (rss_bytes(), stat(&mut conn, "memory", "used_memory").await);
    let locks = distlock::Locks::connect(url).await.expect("connect");
    let mut guards = Vec::with_capacity(n);
    for i in 0..n {
        let g = locks
            .lock(format!("w6:{i}"))
            .ttl(TTL_W6)
            .renew(true)
            .acquire()
            .await
            .expect("acquire");
        guards.push(g);
    }
    let ours = measure(&mut conn, rss0, mem0, n).await;
    let mut lost = 0;
    for g in guards {
        if g.release().await.is_err() {
            lost += 1;
        }
    }

    // raw: SET NX PX, then one pipeline of compare-and-extend a second.
    let (rss0, mem0) = (rss_bytes(), stat(&mut conn, "memory", "used_memory").await);
    let mut raw = raw_connection(url).await;
    let extend = redis::Script::new(RAW_EXTEND);
    let tokens: Vec<String> = (0..n)
        .map(|i| format!("{}:{i}", uuid::Uuid::new_v4()))
        .collect();
    for (i, token) in tokens.iter().enumerate() {
        let _: Option<String> = redis::cmd("SET")
            .arg(format!("w6r:{i}"))
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(TTL_W6.as_millis() as u64)
            .query_async(&mut raw)
            .await
            .expect("SET");
    }
    let _: String = extend
        .prepare_invoke()
        .load_async(&mut raw)
        .await
        .expect("SCRIPT LOAD");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renewer = tokio::spawn({
        let (mut raw, stop, tokens) = (raw.clone(), stop.clone(), tokens.clone());
        let sha = extend.get_hash().to_owned();
        async move {
            let mut tick = tokio::time::interval(TTL_W6 / 3);
            tick.tick().await;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                let mut pipe = redis::pipe();
                for (i, token) in tokens.iter().enumerate() {
                    pipe.cmd("EVALSHA")
                        .arg(&sha)
                        .arg(1)
                        .arg(format!("w6r:{i}"))
                        .arg(token)
                        .arg(TTL_W6.as_millis() as u64);
                }
                let _: Vec<i64> = pipe.query_async(&mut raw).await.expect("renew");
            }
        }
    });
    let theirs = measure(&mut conn, rss0, mem0, n).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = renewer.await;

    let per_tick = |h: &Held, v: f64| v / h.ticks.max(1e-9);
    println!("                                              raw   distlock");
    println!(
        "  read events per tick (~round trips)     {:>8.1} {:>10.1}",
        per_tick(&theirs, theirs.reads as f64),
        per_tick(&ours, ours.reads as f64)
    );
    println!(
        "  scripts run per tick                    {:>8.0} {:>10.0}",
        per_tick(&theirs, theirs.scripts as f64),
        per_tick(&ours, ours.scripts as f64)
    );
    let cpu_per = |h: &Held| h.server_cpu * 1e6 / (h.scripts.max(1) as f64);
    println!(
        "  redis-server CPU us per renewal         {:>8.2} {:>10.2}",
        cpu_per(&theirs),
        cpu_per(&ours)
    );
    let own_per = |h: &Held| h.own_cpu * 1e6 / (n as f64 * h.ticks.max(1e-9));
    println!(
        "  client CPU us per held lock per tick    {:>8.2} {:>10.2}",
        own_per(&theirs),
        own_per(&ours)
    );
    println!(
        "  client memory per held lock, bytes      {:>8.0} {:>10.0}",
        theirs.client_bytes, ours.client_bytes
    );
    println!(
        "  redis memory per held lock, bytes       {:>8.0} {:>10.0}",
        theirs.server_bytes, ours.server_bytes
    );
    println!("  locks lost during the window: {lost} of {n}");
    println!(
        "  W6 renewals batched (read events per tick < 1% of the locks): {}; CPU per renewal <= 1.2x raw: {:.2}x {}",
        verdict(per_tick(&ours, ours.reads as f64) < n as f64 / 100.0),
        cpu_per(&ours) / cpu_per(&theirs),
        verdict(cpu_per(&ours) <= 1.2 * cpu_per(&theirs))
    );
}
