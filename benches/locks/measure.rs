//! Measurements: percentiles, round trips on the wire, CPU, `INFO commandstats`.
#![allow(clippy::wildcard_imports)]
use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;

use crate::*;

// ---------------------------------------------------------------------------------------
// Measurements
// ---------------------------------------------------------------------------------------

/// Nanoseconds on the wall clock (CLOCK_REALTIME), comparable across processes.
pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64
}

/// Nearest-rank percentile of sorted samples.
pub(crate) fn pct<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// PING round trips (ns, sorted) through a multiplexed connection: their p50 is the
/// "one round trip" of W3/W4, their p99 the noise floor of any latency figure here.
pub(crate) async fn ping_rtts(url: &str, samples: usize) -> Vec<u64> {
    let mut conn = raw_connection(url).await;
    let mut lat = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .expect("PING");
        lat.push(t.elapsed().as_nanos() as u64);
    }
    lat.sort_unstable();
    lat
}

/// Commands on the wire per uncontended acquire+release, counted with `MONITOR`.
pub(crate) struct WireCount {
    pub(crate) per_pair: f64,
    /// Client commands by name, and the commands Lua ran.
    pub(crate) commands: BTreeMap<String, usize>,
    pub(crate) lua: usize,
}

pub(crate) async fn count_round_trips(kind: Kind, url: &str, port: u16, pairs: usize) -> WireCount {
    let client = Arc::new(Client::connect(kind, url).await);
    client
        .warm_up(kind, url, &format!("rt:warm:{}", kind.name()))
        .await;
    for i in 0..10 {
        let h = client
            .acquire(&format!("rt:{i}"), WAIT)
            .await
            .expect("acquire");
        client.release(h).await.expect("release");
    }
    let mut marker = raw_connection(url).await;
    let mut monitor = tokio::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "monitor"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-cli monitor");
    let mut lines = BufReader::new(monitor.stdout.take().expect("stdout")).lines();
    let read = async {
        // `OK`, then our begin marker (retried until the monitor is surely attached).
        let begin = format!("bench-begin-{}", kind.name());
        let mut marker_addr = None;
        while marker_addr.is_none() {
            let _: String = redis::cmd("ECHO")
                .arg(&begin)
                .query_async(&mut marker)
                .await
                .expect("ECHO");
            let until = Instant::now() + Duration::from_millis(200);
            while let Ok(Ok(Some(line))) = tokio::time::timeout_at(until, lines.next_line()).await {
                if line.contains(&begin) {
                    marker_addr = parse_monitor(&line).map(|(a, _)| a);
                    break;
                }
            }
        }
        let marker_addr = marker_addr.expect("marker address");
        for i in 0..pairs {
            let h = client
                .acquire(&format!("rt:{}", i % 100), WAIT)
                .await
                .expect("acquire");
            client.release(h).await.expect("release");
        }
        let end = format!("bench-end-{}", kind.name());
        let _: String = redis::cmd("ECHO")
            .arg(&end)
            .query_async(&mut marker)
            .await
            .expect("ECHO");
        let mut commands = BTreeMap::new();
        let mut lua = 0;
        while let Some(line) = lines.next_line().await.expect("monitor output") {
            if line.contains(&end) {
                break;
            }
            let Some((addr, cmd)) = parse_monitor(&line) else {
                continue;
            };
            if addr == "lua" {
                lua += 1;
            } else if addr != marker_addr {
                *commands.entry(cmd.to_uppercase()).or_insert(0) += 1;
            }
        }
        (commands, lua)
    };
    let (commands, lua) = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("MONITOR count timed out");
    let _ = monitor.kill().await;
    let total: usize = commands.values().sum();
    WireCount {
        per_pair: total as f64 / pairs as f64,
        commands,
        lua,
    }
}

/// `1712345678.123456 [0 127.0.0.1:43210] "EVALSHA" "..."` -> (`127.0.0.1:43210`, `EVALSHA`).
pub(crate) fn parse_monitor(line: &str) -> Option<(String, String)> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let addr = line[open + 1..close].split_whitespace().nth(1)?.to_owned();
    let rest = line[close + 1..].trim_start().strip_prefix('"')?;
    let cmd = rest[..rest.find('"')?].to_owned();
    Some((addr, cmd))
}
