//! The process-wide default client: `distlock::install`, `REDIS_URL`, and test suites in
//! which every test has its own tokio runtime.

mod common;

use std::sync::OnceLock;

use common::*;
use distlock::{Locks, distributed_lock};

/// One server for this binary; installed as the default client once.
fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let s = RedisServer::start();
        distlock::install(Locks::builder(s.url()).build().unwrap());
        s
    })
}

#[distributed_lock(key = "default:<n>", ttl = "5s")]
async fn uses_default(n: u32) -> Result<String, AppError> {
    Ok(distlock::current_lock().unwrap().key().to_owned())
}

/// Each `#[tokio::test]` below runs on its own runtime, which shuts down when the test
/// ends. The shared default client must open a connection for each of them instead of
/// reusing one whose runtime is gone.
async fn round(n: u32) {
    let _ = server();
    for _ in 0..3 {
        assert_eq!(call_default(n).await, format!("lock:default:{n}"));
    }
}

async fn call_default(n: u32) -> String {
    uses_default(n).await.unwrap()
}

#[tokio::test]
async fn runtime_a() {
    round(1).await;
}

#[tokio::test]
async fn runtime_b() {
    round(2).await;
}

/// Eight runtimes in turn, more than the four direct connections one client keeps: a
/// connection whose runtime has shut down is never used from another one.
#[test]
fn runtimes_one_after_another() {
    let _ = server();
    for n in 10..18 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(round(n));
        drop(rt); // the connection's driver task dies here
    }
}

/// Without `install`, the attribute connects lazily to `REDIS_URL`. Runs in a child
/// process so the installed client above does not interfere.
#[test]
fn lazy_client_from_redis_url() {
    if let Ok(expected) = std::env::var("DISTLOCK_LAZY_CHILD") {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let key = rt.block_on(uses_default(5)).unwrap();
        assert_eq!(key, expected);
        println!("@@lazy-ok");
        return;
    }
    let s = RedisServer::start();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["lazy_client_from_redis_url", "--exact", "--nocapture"])
        .env("DISTLOCK_LAZY_CHILD", "lock:default:5")
        .env("REDIS_URL", s.url())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("@@lazy-ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn malformed_redis_url_is_an_error_not_a_panic() {
    if std::env::var_os("DISTLOCK_BAD_URL_CHILD").is_some() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        match rt.block_on(uses_default(6)) {
            Err(AppError::Lock(distlock::Error::Backend { source, .. })) => {
                assert_eq!(source.kind(), distlock::BackendErrorKind::Config);
                println!("@@bad-url-ok");
            }
            other => panic!("{other:?}"),
        }
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "malformed_redis_url_is_an_error_not_a_panic",
            "--exact",
            "--nocapture",
        ])
        .env("DISTLOCK_BAD_URL_CHILD", "1")
        .env("REDIS_URL", "not a url")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("@@bad-url-ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
