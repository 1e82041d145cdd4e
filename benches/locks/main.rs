//! distlock against a raw redis-rs baseline, in the same run, on a private redis-server.
//!
//! Run with `scripts/bench.sh` (or `cargo bench --bench locks`). `DISTLOCK_BENCH_QUICK=1`
//! divides every count by 10 for a quick look; `DISTLOCK_BENCH_ONLY=uncontended` runs RT,
//! W1, W2 and W2F only, `DISTLOCK_BENCH_ONLY=w5` W5 only, `DISTLOCK_BENCH_ONLY=cluster`
//! W1, W2 and W3 on a local 3-primary Redis Cluster (`cluster.rs`),
//! `DISTLOCK_BENCH_ONLY=redlock` W1 over Redlock on 5 local masters against one master,
//! `DISTLOCK_BENCH_ONLY=family` the semaphore against the plain lock (`family.rs`),
//! `DISTLOCK_BENCH_ONLY=w6` 10,000 renewed locks held by one client (`many.rs`),
//! `DISTLOCK_BENCH_ONLY=w7` a crowd of 1,000 waiters on one key over 10 clients,
//! `DISTLOCK_BENCH_ONLY=scaling` W2 on clusters of 1, 3 and 6 primaries and
//! `DISTLOCK_BENCH_ONLY=keys` W2 over 1,000,000 held keys (`scale.rs`). `REDIS_SERVER_BIN`
//! names the server (Valkey's `valkey-server`, or Redis 8.2's). Benchmarks never fail: the targets are
//! printed as met or not, and the exit status only reflects whether the bench could run.
//!
//! The baseline is what a careful user writes by hand: `SET key token NX PX 30000` to
//! take, an `EVALSHA` compare-and-delete to release, both on ONE multiplexed connection,
//! and a retry every 50 ms while the lock is held by someone else.
//!
//! Workloads (TTL 30 s everywhere):
//! - RT: commands on the wire per uncontended acquire+release, counted with `MONITOR`
//!   (lines from the client's connection; lines that Lua ran, `[0 lua]`, are not round trips).
//! - W1: one task, 1,000 warm-up then 20,000 sequential pairs on keys `w1:<i mod 100>`.
//! - W2: 64 tasks, each on its own key, 100,000 pairs in total. W2F: the same with a
//!   fence taken in every pair (distlock `fence()`, the baseline an `INCR`).
//!   W1 and W2 run in 20 rounds of blocks (raw, distlock, raw+lua; then the reverse) so
//!   that the drift of a shared, noisy machine falls on every side alike. `raw+lua` is a
//!   diagnostic third column: raw redis-rs sending distlock's own Lua scripts, which
//!   splits distlock's gap to the baseline into server-side and client-side cost (with
//!   the CPU redis-server and this process spent per pair).
//! - W3: 16 tasks of one process on one key share 2,000 tickets: acquire (wait up to 10 s),
//!   hold 1 ms (`tokio::time::sleep`), release.
//! - W4: the same with 4 processes x 4 tasks (this binary re-executed in child mode,
//!   tickets shared through a Redis counter), timestamps merged in the parent.
//! - W5: idempotency over HTTP (`http.rs`): an axum endpoint with `#[idempotent]` against
//!   one written by hand (`SET NX PX` placeholder, then `SET` of the response), 16
//!   clients, 5,000 fresh keys then the same keys again.

use std::time::Duration;

/// The lease everywhere.
pub(crate) const TTL: Duration = Duration::from_secs(30);
/// How long a contended acquire may wait.
pub(crate) const WAIT: Duration = Duration::from_secs(10);
/// The critical section of W3 and W4.
pub(crate) const HOLD: Duration = Duration::from_millis(1);
/// The baseline's polling interval.
pub(crate) const POLL: Duration = Duration::from_millis(50);
/// Set in the environment of a W4 child process.
pub(crate) const CHILD_ENV: &str = "DISTLOCK_BENCH_CHILD";

/// Compare-and-delete of the baseline.
pub(crate) const RAW_RELEASE: &str = r"if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child_main();
        return;
    }
    let cfg = Config::from_env();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    // With feature `metrics`, a recorder is installed (what an application that scrapes
    // distlock's metrics runs with): W1 then measures their cost against the same
    // workload built without the feature (`benches/README.md`, "Metrics").
    #[cfg(feature = "metrics")]
    let _recorder = {
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("no other recorder");
        println!("metrics: the Prometheus recorder is installed");
        handle
    };
    let server = testkit::RedisServer::start();
    rt.block_on(run(&cfg, &server));
    drop(server);
}

mod clients;
mod cluster;
mod config;
mod contended;
mod family;
mod http;
mod many;
mod measure;
mod report;
mod scale;
mod uncontended;

#[allow(unused_imports)]
use {
    clients::*, cluster::*, config::*, contended::*, family::*, http::*, many::*, measure::*,
    report::*, scale::*, uncontended::*,
};
