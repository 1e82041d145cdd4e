//! The lock family against the plain lock, on the same client in the same run
//! (`DISTLOCK_BENCH_ONLY=family`):
//! - F1: uncontended pairs, one task on keys `f1:<i mod 100>`, in alternating blocks of
//!   a plain lock, a semaphore of 4 permits and a read lock: pairs/s and the ratios to
//!   the lock.
//! - F2: the same with 64 tasks, each on its own key.
//! - F3: 16 tasks share one semaphore of 4 permits: 2,000 acquisitions, each held 1 ms
//!   (`tokio::time::sleep`); acquisitions/s against the ideal (4 holders at once, each
//!   for the hold plus one round trip to release), and how long a freed permit takes to
//!   reach a waiter (p50, p99), and each task's share.
//! - F4: read-mostly, 15 readers and 1 writer on one read/write lock, each holding 1 ms
//!   (the writer pausing 10 ms between writes), 2,000 acquisitions in all, against the
//!   same 16 tasks on one plain lock: the acquisitions/s of each, the handoff (a
//!   release to the next acquisition by a task that asked before it, p50, p99), the
//!   writer's waits (p50, p99, most), which a stream of readers must not stretch, and
//!   each task's share.
//! - F5: a multi-lock of two keys against the same two plain locks taken one after the
//!   other, one task, 2,000 pairs in alternating blocks: on one server (the one-script
//!   way), and on a local 3-primary cluster with the two keys in different slots (the
//!   ordered way) and sharing a hash tag (one script again).
#![allow(clippy::wildcard_imports)]
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::*;

/// What F1 and F2 take: a lock (0), a semaphore of that many permits, a read lock
/// (`READ`).
const READ: u32 = u32::MAX;

/// `n` sequential pairs on keys `f1:<i mod 100>` (`tasks` 1), or `tasks` tasks on their
/// own keys; returns elapsed.
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
                    READ => locks.read_lock(key),
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

/// A plain lock, a semaphore of 4 and a read lock, in 10 rounds of blocks (in turn
/// order, then reversed): pairs/s of each.
async fn alternate(locks: &distlock::Locks, tasks: usize, per_block: usize) -> [f64; 3] {
    let rounds = 10;
    let kinds = [0, 4, READ];
    let mut took = [Duration::ZERO; 3];
    for &k in &kinds {
        pairs(locks, k, tasks, per_block / 4).await; // warm-up: scripts loaded
    }
    for round in 0..rounds {
        for i in 0..3 {
            let i = if round % 2 == 0 { i } else { 2 - i };
            took[i] += pairs(locks, kinds[i], tasks, per_block).await;
        }
    }
    let n = (per_block * rounds) as f64;
    took.map(|t| n / t.as_secs_f64())
}

/// F3: (acquisitions/s, the ideal, the handoff gaps in ns sorted, each task's
/// acquisitions sorted).
async fn contended(locks: &distlock::Locks, acquisitions: u64) -> (f64, f64, Vec<u64>, Vec<u64>) {
    let tickets = Arc::new(AtomicU64::new(0));
    let released = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
    let gaps = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let start = Instant::now();
    let runs = (0..16).map(|_| {
        let (locks, tickets) = (locks.clone(), tickets.clone());
        let (released, gaps) = (released.clone(), gaps.clone());
        tokio::spawn(async move {
            let mut mine = 0u64;
            while tickets.fetch_add(1, Ordering::Relaxed) < acquisitions {
                mine += 1;
                let request = locks.semaphore("f3", 4).ttl(TTL).wait(WAIT);
                let g = request.acquire().await.expect("acquire");
                let at = Instant::now();
                if let Some(freed) = released.lock().unwrap().pop() {
                    gaps.lock().unwrap().push((at - freed).as_nanos() as u64);
                }
                tokio::time::sleep(HOLD).await;
                g.release().await.expect("release");
                released.lock().unwrap().push(Instant::now());
            }
            mine
        })
    });
    let mut shares = Vec::new();
    for run in futures_util::future::join_all(runs).await {
        shares.push(run.expect("task"));
    }
    shares.sort_unstable();
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
    let rate = acquisitions as f64 / elapsed.as_secs_f64();
    (rate, 4.0 / (hold + rtt), gaps, shares)
}

/// F4's writer pauses this long between writes.
const WRITE_EVERY: Duration = Duration::from_millis(10);

/// What F4 measured.
struct ReadMostly {
    rate: f64,
    /// The writer's waits, ns, sorted.
    waits: Vec<u64>,
    /// From a release to an acquisition by a task that asked before it, ns, sorted.
    gaps: Vec<u64>,
    /// Acquisitions by each reader, sorted; by the writer.
    readers: Vec<u64>,
    writer: u64,
}

/// F4 for 15 readers and a writer on one read/write lock (`rw`), or the same tasks on
/// one plain lock.
async fn read_mostly(locks: &distlock::Locks, acquisitions: u64, rw: bool) -> ReadMostly {
    let tickets = Arc::new(AtomicU64::new(0));
    let waits = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let released = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let gaps = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let name = if rw { "f4:rw" } else { "f4:lock" };
    let start = Instant::now();
    let runs = (0..16).map(|t| {
        let (locks, tickets, waits) = (locks.clone(), tickets.clone(), waits.clone());
        let (released, gaps) = (released.clone(), gaps.clone());
        tokio::spawn(async move {
            let writer = t == 0;
            let mut mine = 0u64;
            while tickets.fetch_add(1, Ordering::Relaxed) < acquisitions {
                mine += 1;
                let asked = Instant::now();
                let request = match (rw, writer) {
                    (false, _) => locks.lock(name),
                    (true, true) => locks.write_lock(name),
                    (true, false) => locks.read_lock(name),
                };
                let g = request
                    .ttl(TTL)
                    .wait(WAIT)
                    .acquire()
                    .await
                    .expect("acquire");
                let at = Instant::now();
                if writer {
                    waits.lock().unwrap().push((at - asked).as_nanos() as u64);
                }
                // A handoff: this task asked before the latest release.
                let freed = *released.lock().unwrap();
                if let Some(freed) = freed.filter(|f| *f > asked) {
                    gaps.lock().unwrap().push((at - freed).as_nanos() as u64);
                }
                tokio::time::sleep(HOLD).await;
                g.release().await.expect("release");
                *released.lock().unwrap() = Some(Instant::now());
                if writer {
                    // Read-mostly: the writer writes every 10 ms or so.
                    tokio::time::sleep(WRITE_EVERY).await;
                }
            }
            mine
        })
    });
    let mut shares = Vec::new();
    for run in futures_util::future::join_all(runs).await {
        shares.push(run.expect("task"));
    }
    let rate = acquisitions as f64 / start.elapsed().as_secs_f64();
    let mut waits = std::mem::take(&mut *waits.lock().unwrap());
    waits.sort_unstable();
    let mut gaps = std::mem::take(&mut *gaps.lock().unwrap());
    gaps.sort_unstable();
    let writer = shares.remove(0);
    shares.sort_unstable();
    ReadMostly {
        rate,
        waits,
        gaps,
        readers: shares,
        writer,
    }
}

/// The `q` quantile of sorted nanoseconds, in ms.
fn ms_at(sorted: &[u64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).copied().unwrap_or(0) as f64 / 1e6
}

/// F5: `n` pairs of two keys (`{tag}a` and `{tag}b` style names from `name`), as one
/// multi-lock (`multi`) or two plain locks in turn; returns elapsed.
async fn two_keys(
    locks: &distlock::Locks,
    name: fn(usize) -> [String; 2],
    multi: bool,
    n: usize,
) -> Duration {
    let start = Instant::now();
    for i in 0..n {
        let [a, b] = name(i % 100);
        if multi {
            let g = locks
                .multi_lock([a, b])
                .ttl(TTL)
                .acquire()
                .await
                .expect("multi");
            g.release().await.expect("release");
        } else {
            let ga = locks.lock(a).ttl(TTL).acquire().await.expect("a");
            let gb = locks.lock(b).ttl(TTL).acquire().await.expect("b");
            let (ra, rb) = tokio::join!(ga.release(), gb.release());
            ra.expect("release a");
            rb.expect("release b");
        }
    }
    start.elapsed()
}

/// F5 in 10 alternating rounds: (multi-lock pairs/s, two locks pairs/s, taken at once).
async fn f5(locks: &distlock::Locks, name: fn(usize) -> [String; 2], n: usize) -> (f64, f64, bool) {
    let (mut multi, mut two) = (Duration::ZERO, Duration::ZERO);
    two_keys(locks, name, true, n / 4).await;
    for round in 0..10 {
        if round % 2 == 0 {
            multi += two_keys(locks, name, true, n).await;
            two += two_keys(locks, name, false, n).await;
        } else {
            two += two_keys(locks, name, false, n).await;
            multi += two_keys(locks, name, true, n).await;
        }
    }
    let [a, b] = name(0);
    let g = locks.multi_lock([a, b]).acquire().await.expect("probe");
    let at_once = g.taken_at_once();
    g.release().await.expect("probe release");
    let pairs = (n * 10) as f64;
    (
        pairs / multi.as_secs_f64(),
        pairs / two.as_secs_f64(),
        at_once,
    )
}

fn print_f5(label: &str, (multi, two, at_once): (f64, f64, bool)) {
    let how = if at_once { "one script" } else { "in order" };
    println!(
        "  F5 {label}: multi-lock ({how}) {multi:.0} pairs/s, two locks in turn {two:.0}: {:.2}x",
        multi / two
    );
}

pub(crate) async fn run_family(cfg: &Config, url: &str) {
    let locks = distlock::Locks::connect(url).await.expect("connect");
    for (name, tasks, per_block) in [
        ("F1 1 task:  ", 1, cfg.w1_pairs / 10),
        ("F2 64 tasks:", cfg.w2_tasks, cfg.w2_pairs / 10),
    ] {
        let [lock, sem, read] = alternate(&locks, tasks, per_block).await;
        println!(
            "  {name} lock {lock:.0} pairs/s, semaphore(4) {sem:.0} ({:.2}x), read lock {read:.0} ({:.2}x)",
            sem / lock,
            read / lock
        );
    }
    let (rate, ideal, gaps, shares) = contended(&locks, cfg.w3_acquisitions).await;
    println!(
        "  F3 16 tasks, 4 permits, 1 ms hold: {rate:.0} acquisitions/s, ideal {ideal:.0}: {:.2} of ideal; a freed permit reached a waiter in p50 {:.2} ms, p99 {:.2} ms; per task {}-{} of {}",
        rate / ideal,
        ms_at(&gaps, 0.5),
        ms_at(&gaps, 0.99),
        shares[0],
        shares[shares.len() - 1],
        cfg.w3_acquisitions
    );
    let plain = read_mostly(&locks, cfg.w3_acquisitions, false).await;
    let rw = read_mostly(&locks, cfg.w3_acquisitions, true).await;
    for (name, f) in [("read/write lock", &rw), ("one plain lock", &plain)] {
        println!(
            "  F4 {name}: {:.0} acquisitions/s; handoff p50 {:.2} ms, p99 {:.2} ms; the writer {} times (waits p50 {:.2} ms, p99 {:.2} ms, most {:.2} ms), each reader {}-{}",
            f.rate,
            ms_at(&f.gaps, 0.5),
            ms_at(&f.gaps, 0.99),
            f.writer,
            ms_at(&f.waits, 0.5),
            ms_at(&f.waits, 0.99),
            ms_at(&f.waits, 1.0),
            f.readers[0],
            f.readers[f.readers.len() - 1]
        );
    }
    println!(
        "  F4 15 readers + 1 writer (a write every 10 ms), 1 ms hold: read/write lock / plain lock {:.2}x",
        rw.rate / plain.rate
    );
    let n = cfg.w1_pairs / 10;
    print_f5(
        "one server",
        f5(&locks, |i| [format!("f5:{i}:a"), format!("f5:{i}:b")], n).await,
    );
    let cluster = testkit::RedisCluster::start(3, 0);
    let on_cluster = distlock::Locks::cluster(cluster.urls())
        .connect()
        .await
        .expect("cluster");
    // `f5:<i>:a` and `f5:<i>:b` hash to different slots for most `i`.
    let apart = |i: usize| [format!("f5:{i}:a"), format!("f5:{i}:b")];
    let tagged = |i: usize| [format!("{{f5:{i}}}:a"), format!("{{f5:{i}}}:b")];
    print_f5("cluster, two slots", f5(&on_cluster, apart, n).await);
    print_f5("cluster, one slot", f5(&on_cluster, tagged, n).await);
}
