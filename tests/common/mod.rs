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
pub use testkit::{
    NO_REAPER_VAR, REAPER_SCRIPT, RedisServer, free_port, least_privilege, ping, server_comm,
    spawn_reaper,
};

/// Polls `fut` once and drops it, as a caller that cancels it at its first await:
/// `true` when it was still in flight then (the cancellation really came mid-call).
pub async fn cancelled_in_flight(fut: impl std::future::Future) -> bool {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx).is_pending())).await
}

/// After a try that was cancelled in flight: `count` (a command answering how many of
/// the try's writes are there) comes to 0 within 5 s, and is still 0 once both
/// clean-ups have run (the second comes a command timeout, 1 s, later, for a try that
/// landed after the first); the ttl, 30 s, is the control.
pub async fn nothing_left_after_cleanups(
    raw: &mut redis::aio::MultiplexedConnection,
    count: &redis::Cmd,
) {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let n: u32 = count.query_async(raw).await.unwrap();
        if n == 0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "the cancelled try kept what it took ({n})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let n: u32 = count.query_async(raw).await.unwrap();
    assert_eq!(n, 0, "left held after both clean-ups");
}

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

/// How long `locks` took to take `key`, waiting up to `wait` (it releases it at once).
pub async fn time_to_take(locks: &distlock::Locks, key: &str, wait: Duration) -> Duration {
    let started = Instant::now();
    take_and_release(locks, key, wait).await.unwrap() - started
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

/// Releases `g` and gives how long after that the waiter `w` (a [`take_and_release`]
/// task) held the lock.
pub async fn handoff_gap(g: distlock::LockGuard, w: tokio::task::JoinHandle<Instant>) -> Duration {
    let released = Instant::now();
    g.release().await.unwrap();
    w.await.unwrap().saturating_duration_since(released)
}

/// Outcomes of lock cycles: when each started (from the first), how long it took and
/// how it ended; and when `stop` was seen.
pub struct Cycles {
    pub outcomes: Vec<(Duration, Duration, Result<(), distlock::Error>)>,
    pub stopped_at: Duration,
}

/// How long cycles may go on failing once `stop` is set (the failover is over by then):
/// the client finds the new primary within its connect timeout (5 s by default), with a
/// margin for loaded machines.
pub const RECOVERY: Duration = Duration::from_secs(7);

/// Lock cycles on `key` (acquire with a 1 s ttl, fence, release) 5 ms apart, for
/// failovers: until `stop` is set and then five cycles in a row have worked, or twice
/// `RECOVERY` after `stop` (which `check_failover` reports).
pub fn cycle_until(
    locks: &distlock::Locks,
    key: &str,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Cycles> {
    let (locks, stop, key) = (locks.clone(), stop.clone(), key.to_owned());
    tokio::spawn(async move {
        let mut outcomes = Vec::new();
        let first = Instant::now();
        let mut stopped: Option<Instant> = None;
        loop {
            if stopped.is_none() && stop.load(std::sync::atomic::Ordering::SeqCst) {
                stopped = Some(Instant::now());
            }
            if let Some(at) = stopped {
                let recovered = outcomes.len() >= 5
                    && outcomes
                        .iter()
                        .rev()
                        .take(5)
                        .all(|(_, _, o): &(_, _, Result<(), _>)| o.is_ok());
                if recovered || at.elapsed() > 2 * RECOVERY {
                    return Cycles {
                        outcomes,
                        stopped_at: at - first,
                    };
                }
            }
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
            outcomes.push((start - first, start.elapsed(), outcome));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// What cycles across a failover may see: `Backend` errors within `bound`; `Busy`, a
/// lock whose release failed meanwhile being held until its ttl; `Lost` where
/// `lost_allowed` (a lock taken on the old primary just before the switch that never
/// reached the replica: replication is asynchronous, its holder is told). They end with
/// five that worked, the first of them begun within `RECOVERY` of `stop`. Prints the
/// failed cycles.
pub fn check_failover(cycles: &Cycles, bound: Duration, lost_allowed: bool) {
    use distlock::Error;
    let outcomes = &cycles.outcomes;
    let failed = outcomes.iter().filter(|(_, _, o)| o.is_err()).count();
    eprintln!(
        "{} cycles, {failed} failed; stopped at {:?}",
        outcomes.len(),
        cycles.stopped_at
    );
    for (at, took, outcome) in outcomes {
        if let Err(e) = outcome {
            eprintln!("  at {at:?}, took {took:?}: {e}");
        }
    }
    for (_, took, outcome) in outcomes.iter().filter(|(_, _, o)| o.is_err()) {
        let allowed = match outcome {
            Err(Error::Backend { .. } | Error::Busy { .. }) => true,
            Err(Error::Lost { .. }) => lost_allowed,
            _ => false,
        };
        assert!(allowed, "a failed call is a backend error: {outcome:?}");
        assert!(*took < bound, "took {took:?}");
    }
    assert!(
        outcomes.len() >= 5 && outcomes.iter().rev().take(5).all(|(_, _, o)| o.is_ok()),
        "working again before the end"
    );
    let (recovered_at, _, _) = &outcomes[outcomes.len() - 5];
    assert!(
        *recovered_at <= cycles.stopped_at + RECOVERY,
        "working again within {RECOVERY:?} of the failover's end (at {recovered_at:?})"
    );
}

/// Waits until `key` holds an idempotency claim in progress (a claim held on its way to
/// Redis, just let through); panics when it has not landed within `within` of `since`.
pub async fn wait_for_claim(
    raw: &mut redis::aio::MultiplexedConnection,
    key: &str,
    since: std::time::Instant,
    within: std::time::Duration,
) {
    loop {
        let found: Option<String> = redis::cmd("GET").arg(key).query_async(raw).await.unwrap();
        if found.as_deref().is_some_and(|r| r.contains("in_progress")) {
            return;
        }
        assert!(
            since.elapsed() < within,
            "the held claim did not land within {within:?}: {found:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// Waits until a waiter of another client has marked the lock value at `key`
/// (`<token> waiting`, its try after subscribing); panics when it has not within
/// `within`.
pub async fn wait_for_mark(
    raw: &mut redis::aio::MultiplexedConnection,
    key: &str,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let found: Option<String> = redis::cmd("GET").arg(key).query_async(raw).await.unwrap();
        if found.as_deref().is_some_and(|v| v.ends_with(" waiting")) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no waiter marked {key} within {within:?}: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Calls `call` again while it answers `InProgress`; panics with "not given back" when
/// that lasts past `within` of `since`. Returns the first other answer.
pub async fn retry_while_in_progress<T, F, Fut>(
    mut call: F,
    since: std::time::Instant,
    within: std::time::Duration,
) -> Result<T, AppError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, AppError>>,
{
    loop {
        match call().await {
            Err(AppError::Lock(distlock::Error::InProgress { .. })) => {
                assert!(since.elapsed() < within, "not given back");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

/// Calls of command `name` (lower case) redis-server ran so far (`INFO commandstats`).
pub async fn commandstat_calls(raw: &mut redis::aio::MultiplexedConnection, name: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// An axum server on a free port of 127.0.0.1 whose one route, `POST path`, runs
/// `handler` with a [`CountingApp`] over `locks`, under a timeout layer as users put one:
/// 504 when the handler has not answered within `timeout` (its future is dropped).
/// Returns its address, its task (the server stops when it is aborted or the runtime
/// ends) and the count of the handler's runs.
pub async fn serve_counting<H, T>(
    locks: distlock::Locks,
    path: &str,
    handler: H,
    timeout: std::time::Duration,
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<std::io::Result<()>>,
    std::sync::Arc<Runs>,
)
where
    H: axum::handler::Handler<T, CountingApp>,
    T: 'static,
{
    let runs = std::sync::Arc::new(Runs::default());
    let app = CountingApp {
        locks,
        runs: runs.clone(),
    };
    let timeout_layer = axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| async move {
            use axum::response::IntoResponse as _;
            match tokio::time::timeout(timeout, next.run(req)).await {
                Ok(res) => res,
                Err(_) => axum::http::StatusCode::GATEWAY_TIMEOUT.into_response(),
            }
        },
    );
    let router = axum::Router::new()
        .route(path, axum::routing::post(handler))
        .layer(timeout_layer)
        .with_state(app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = tokio::spawn(async move { axum::serve(listener, router).await });
    (addr, serving, runs)
}

/// The state of a test's axum handler that counts the runs of its body.
#[derive(Clone)]
pub struct CountingApp {
    pub locks: distlock::Locks,
    pub runs: std::sync::Arc<Runs>,
}
