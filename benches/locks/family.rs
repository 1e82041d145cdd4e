//! The lock family against the plain lock, on the same client in the same run
//! (`DISTLOCK_BENCH_ONLY=family`):
//! - F1: uncontended pairs, one task on keys `f1:<i mod 100>`, in alternating blocks of
//!   a plain lock and a semaphore of 4 permits: pairs/s and the semaphore's ratio.
//! - F2: the same with 64 tasks, each on its own key.
//! - F3: 16 tasks share one semaphore of 4 permits: 2,000 acquisitions, each held 1 ms
//!   (`tokio::time::sleep`); acquisitions/s against the ideal (4 holders at once, each
//!   for the hold plus one round trip to release), and how long a freed permit takes to
//!   reach a waiter (p50, p99).
#![allow(clippy::wildcard_imports)]
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::*;

/// `n` sequential pairs from key index `from` (`permits` 0: a lock), or `tasks` tasks on
/// their own keys; returns elapsed.
async fn pairs(locks: &distlock::Locks, permits: u32, tasks: usize, n: usize) -> Duration {
    let start = Instant::now();
    let runs = (0..tasks).map(|t| {
        let locks = locks.clone();
        tokio::spawn(async move {
            for i in 0..n / tasks {
                let key = if tasks == 1 {
                    format!("f1:{}", i % 100)
                } else {
                    format!("f2:{t}")
                };
                let request = match permits {
                    0 => locks.lock(key),
                    p => locks.semaphore(key, p),
                };
                let g = request
                    .ttl(TTL)
                    .wait(WAIT)
                    .acquire()
                    .await
                    .expect("acquire");
                g.release().await.expect("release");
            }
        })
    });
    for run in futures_util::future::join_all(runs).await {
        run.expect("task");
    }
    start.elapsed()
}

/// Plain lock against a semaphore of 4, in `rounds` alternating blocks: (lock pairs/s,
/// semaphore pairs/s, per-round ratios).
async fn alternate(
    locks: &distlock::Locks,
    tasks: usize,
    per_block: usize,
) -> (f64, f64, Vec<f64>) {
    let rounds = 10;
    let (mut lock_t, mut sem_t, mut ratios) = (Duration::ZERO, Duration::ZERO, Vec::new());
    pairs(locks, 4, tasks, per_block / 4).await; // warm-up: scripts loaded
    for round in 0..rounds {
        let (l, s) = if round % 2 == 0 {
            let l = pairs(locks, 0, tasks, per_block).await;
            (l, pairs(locks, 4, tasks, per_block).await)
        } else {
            let s = pairs(locks, 4, tasks, per_block).await;
            (pairs(locks, 0, tasks, per_block).await, s)
        };
        lock_t += l;
        sem_t += s;
        ratios.push(l.as_secs_f64() / s.as_secs_f64());
    }
    let n = (per_block * rounds) as f64;
    ratios.sort_by(f64::total_cmp);
    (n / lock_t.as_secs_f64(), n / sem_t.as_secs_f64(), ratios)
}

/// F3: acquisitions/s, the ideal, and the handoff gaps (ns) from a release to the next
/// acquisition.
async fn contended(locks: &distlock::Locks, acquisitions: u64) -> (f64, f64, Vec<u64>) {
    let tickets = Arc::new(AtomicU64::new(0));
    let released = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
    let gaps = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let start = Instant::now();
    let runs = (0..16).map(|_| {
        let (locks, tickets) = (locks.clone(), tickets.clone());
        let (released, gaps) = (released.clone(), gaps.clone());
        tokio::spawn(async move {
            while tickets.fetch_add(1, Ordering::Relaxed) < acquisitions {
                let g = locks
                    .semaphore("f3", 4)
                    .ttl(TTL)
                    .wait(WAIT)
                    .acquire()
                    .await
                    .expect("acquire");
                let at = Instant::now();
                if let Some(freed) = released.lock().unwrap().pop() {
                    gaps.lock().unwrap().push((at - freed).as_nanos() as u64);
                }
                tokio::time::sleep(HOLD).await;
                g.release().await.expect("release");
                released.lock().unwrap().push(Instant::now());
            }
        })
    });
    for run in futures_util::future::join_all(runs).await {
        run.expect("task");
    }
    let elapsed = start.elapsed();
    // The ideal: 4 holders, each holding for the measured sleep plus one release round
    // trip (measured as an uncontended pair's half).
    let probe = Instant::now();
    for _ in 0..200 {
        let g = locks
            .semaphore("f3:probe", 4)
            .acquire()
            .await
            .expect("probe");
        g.release().await.expect("probe release");
    }
    let rtt = probe.elapsed().as_secs_f64() / 400.0;
    let slept = Instant::now();
    for _ in 0..50 {
        tokio::time::sleep(HOLD).await;
    }
    let hold = slept.elapsed().as_secs_f64() / 50.0;
    let mut gaps = std::mem::take(&mut *gaps.lock().unwrap());
    gaps.sort_unstable();
    (
        acquisitions as f64 / elapsed.as_secs_f64(),
        4.0 / (hold + rtt),
        gaps,
    )
}

pub(crate) async fn run_family(cfg: &Config, url: &str) {
    let locks = distlock::Locks::connect(url).await.expect("connect");
    let per_block = cfg.w1_pairs / 10;
    let (lock, sem, ratios) = alternate(&locks, 1, per_block).await;
    println!(
        "  F1 1 task:   lock {lock:.0} pairs/s, semaphore(4) {sem:.0} pairs/s: {:.2}x (rounds {:.2}-{:.2})",
        sem / lock,
        ratios[0],
        ratios[ratios.len() - 1]
    );
    let (lock, sem, ratios) = alternate(&locks, cfg.w2_tasks, cfg.w2_pairs / 10).await;
    println!(
        "  F2 {} tasks: lock {lock:.0} pairs/s, semaphore(4) {sem:.0} pairs/s: {:.2}x (rounds {:.2}-{:.2})",
        cfg.w2_tasks,
        sem / lock,
        ratios[0],
        ratios[ratios.len() - 1]
    );
    let (rate, ideal, gaps) = contended(&locks, cfg.w3_acquisitions).await;
    let at = |q: f64| {
        gaps.get((gaps.len() as f64 * q) as usize)
            .copied()
            .unwrap_or(0) as f64
            / 1e6
    };
    println!(
        "  F3 16 tasks, 4 permits, 1 ms hold: {rate:.0} acquisitions/s, ideal {ideal:.0}: {:.2} of ideal; a freed permit reached a waiter in p50 {:.2} ms, p99 {:.2} ms",
        rate / ideal,
        at(0.5),
        at(0.99)
    );
}
