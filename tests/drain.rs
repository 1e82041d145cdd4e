//! `distlock::idempotency::drain` at a deploy: an axum server shut down gracefully while
//! a handler's body runs for a client that went away. axum's graceful shutdown returns as
//! soon as its connections are closed, and a runtime shut down then drops the body
//! mid-run: its claim stays in progress until the lease ends, and a retry after it runs
//! the body again. `drain` waits for the detached body and its store. A binary of its
//! own: `drain` counts the whole process's detached work.
#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::*;
use distlock::{Locks, idempotent};
use tokio::io::AsyncWriteExt;

#[idempotent(header = "Idempotency-Key", scope = "deploys", client = app.locks, lease = "20s")]
async fn slow_charge(
    axum::extract::State(app): axum::extract::State<CountingApp>,
    body: String,
) -> String {
    let n = app.runs.bump();
    tokio::time::sleep(Duration::from_millis(400)).await;
    format!("charged {} once ({n})", body.len())
}

/// One deploy: serve, a client that sends a request and goes away, a graceful shutdown,
/// then `drain` (or not), then the runtime shuts down. Returns the record's value after
/// the runtime is gone, the body's runs, and what `drain` reported.
fn deploy(server: &RedisServer, key: &str, drain: Option<Duration>) -> (String, u32, usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let url = server.url();
    let (runs, left) = rt.block_on(async move {
        let locks = Locks::connect(&url).await.unwrap();
        let runs = std::sync::Arc::new(Runs::default());
        let app = CountingApp {
            locks,
            runs: runs.clone(),
        };
        let router = axum::Router::new()
            .route("/charge", axum::routing::post(slow_charge))
            .with_state(app);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        // A client that sends its request, then goes away while the body runs.
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "POST /charge HTTP/1.1\r\nhost: x\r\nidempotency-key: {key}\r\ncontent-type: text/plain\r\ncontent-length: 3\r\n\r\nabc"
        );
        client.write_all(request.as_bytes()).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while runs.get() == 0 {
            assert!(Instant::now() < deadline, "the body never started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(client);
        let _ = stop.send(());
        serving.await.unwrap().unwrap();
        let left = match drain {
            Some(within) => distlock::idempotency::drain(within).await,
            None => usize::MAX,
        };
        (runs, left)
    });
    drop(rt);
    let record = redis::Client::open(server.admin_url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut record = record;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{key}*"))
        .query(&mut record)
        .unwrap();
    let value: Option<String> = match keys.first() {
        Some(k) => redis::cmd("GET").arg(k).query(&mut record).unwrap(),
        None => None,
    };
    (value.unwrap_or_default(), runs.get(), left)
}

/// With `drain`, the body the shutdown would have cut finishes and its response is
/// stored: a retry gets the replay, the body ran once. Control: without it the body is
/// dropped mid-run, and the record stays in progress (a retry after its lease would run
/// the body again).
#[test]
fn drain_lets_detached_calls_finish_before_the_runtime_shuts_down() {
    let server = RedisServer::start();
    let (record, runs, _) = deploy(&server, "deploy-control", None);
    assert_eq!(runs, 1);
    assert!(
        record.contains("in_progress") && !record.contains("completed"),
        "control: the shutdown cut the body, the claim stays: {record}"
    );
    let (record, runs, left) = deploy(&server, "deploy-drained", Some(Duration::from_secs(10)));
    assert_eq!(left, 0, "every detached call finished");
    assert_eq!(runs, 1);
    assert!(
        record.contains("\"status\":\"completed\""),
        "the response was stored: {record}"
    );
}

/// `drain` returns after `within` when a call still runs, and says how many.
#[test]
fn drain_gives_up_after_within_and_counts_what_still_runs() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let locks = Locks::in_memory();
        let runs = std::sync::Arc::new(Runs::default());
        let call = long_job(locks.clone(), 1, runs.clone());
        // The caller goes away; the body goes on in its task.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), call)
                .await
                .is_err()
        );
        let started = Instant::now();
        let left = distlock::idempotency::drain(Duration::from_millis(200)).await;
        assert!(left >= 1, "{left}");
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!(
            distlock::idempotency::drain(Duration::from_secs(10)).await,
            0
        );
        assert_eq!(runs.get(), 1);
    });
}

#[idempotent(key = "job:<id>", client = locks, skip = [runs])]
async fn long_job(locks: Locks, id: u32, runs: std::sync::Arc<Runs>) -> Result<u32, AppError> {
    tokio::time::sleep(Duration::from_millis(800)).await;
    Ok(runs.bump())
}
