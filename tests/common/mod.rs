//! Test harness: private `redis-server` processes on free ports (from `testkit`, shared
//! with the benchmarks), and helpers the test files share.
#![allow(dead_code, unreachable_pub)]

pub mod proxy;

/// One test per backend for each `async fn(Locks)` named: `on_redis::NAME` against a
/// private redis-server, `in_memory::NAME` against `Locks::in_memory()`. The calling file
/// must have `RedisServer` in scope (`use common::*`).
#[allow(unused_macros)] // shared by test files that do not all use it, like the dead_code allow above
macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod on_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let server = super::RedisServer::start();
                    let locks = distlock::Locks::connect(&server.url()).await.unwrap();
                    super::$name(locks).await;
                }
            )*
        }
        mod in_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(distlock::Locks::in_memory()).await;
                }
            )*
        }
    };
}

use std::time::{Duration, Instant};

#[allow(unused_imports)] // each test file uses some of them
pub use testkit::{NO_REAPER_VAR, REAPER_SCRIPT, RedisServer, free_port, ping, spawn_reaper};

/// `n` acquire + release of `key` through `locks`, one after another.
pub async fn cycles(locks: &distlock::Locks, key: &str, n: usize) {
    for _ in 0..n {
        let g = locks.lock(key).acquire().await.unwrap();
        g.release().await.unwrap();
    }
}

/// A task that takes `key` through `locks`, waiting up to `wait`, and releases it at
/// once; it resolves to the instant it held the lock.
pub fn take_and_release(
    locks: &distlock::Locks,
    key: &str,
    wait: Duration,
) -> tokio::task::JoinHandle<Instant> {
    let (locks, key) = (locks.clone(), key.to_owned());
    tokio::spawn(async move {
        let g = locks.lock(key).wait(wait).acquire().await.unwrap();
        let at = Instant::now();
        g.release().await.unwrap();
        at
    })
}

/// The `@@<event> ...` messages a child test process prints on `stdout`, from `@@` on,
/// as they arrive (read on a thread of their own; other lines are dropped). The test
/// harness writes `test <name> ... ` without a newline first, so a message may start
/// mid-line.
pub fn child_messages(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(at) = line.find("@@")
                && tx.send(line[at..].to_owned()).is_err()
            {
                break;
            }
        }
    });
    rx
}

/// A call counter for idempotent bodies. Not `Serialize`, so never part of a
/// fingerprint (an `AtomicU32` is).
#[derive(Default)]
pub struct Runs(pub std::sync::atomic::AtomicU32);

impl Runs {
    /// Counts one more run; returns the count.
    pub fn bump(&self) -> u32 {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
    }

    /// Runs so far.
    pub fn get(&self) -> u32 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// An error type as users write them.
#[derive(Debug)]
pub enum AppError {
    Lock(distlock::Error),
    App(&'static str),
}

impl From<distlock::Error> for AppError {
    fn from(e: distlock::Error) -> Self {
        AppError::Lock(e)
    }
}

impl AppError {
    pub fn lock(&self) -> Option<&distlock::Error> {
        match self {
            AppError::Lock(e) => Some(e),
            AppError::App(_) => None,
        }
    }
}

/// Outcomes of lock cycles: how long each took and how it ended.
pub type Outcomes = Vec<(Duration, Result<(), distlock::Error>)>;

/// Lock cycles on `key` (acquire with a 1 s ttl, fence, release) until `stop`, 5 ms
/// apart: for failovers.
pub fn cycle_until(
    locks: &distlock::Locks,
    key: &str,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Outcomes> {
    let (locks, stop, key) = (locks.clone(), stop.clone(), key.to_owned());
    tokio::spawn(async move {
        let mut outcomes = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let start = Instant::now();
            let outcome = async {
                let g = locks
                    .lock(key.as_str())
                    .ttl(Duration::from_secs(1))
                    .acquire()
                    .await?;
                g.fence().await?;
                g.release().await
            }
            .await;
            outcomes.push((start.elapsed(), outcome));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        outcomes
    })
}

/// What cycles across a failover may see: `Backend` errors within `bound`; `Busy`, a
/// lock whose release failed meanwhile being held until its ttl; `Lost` where
/// `lost_allowed` (a lock taken on the old primary just before the switch that never
/// reached the replica: replication is asynchronous, its holder is told). The last five
/// worked.
pub fn check_failover(outcomes: &Outcomes, bound: Duration, lost_allowed: bool) {
    use distlock::Error;
    let failed = outcomes.iter().filter(|(_, o)| o.is_err()).count();
    eprintln!("{} cycles, {failed} failed", outcomes.len());
    for (took, outcome) in outcomes.iter().filter(|(_, o)| o.is_err()) {
        let allowed = match outcome {
            Err(Error::Backend { .. } | Error::Busy { .. }) => true,
            Err(Error::Lost { .. }) => lost_allowed,
            _ => false,
        };
        assert!(allowed, "a failed call is a backend error: {outcome:?}");
        assert!(*took < bound, "took {took:?}");
    }
    assert!(
        outcomes.iter().rev().take(5).all(|(_, o)| o.is_ok()),
        "working again before the end"
    );
}
