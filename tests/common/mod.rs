//! Test harness: private `redis-server` processes on free ports.
#![allow(dead_code, unreachable_pub)]

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

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` this test started; killed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("distlock-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = RedisServer {
            port,
            child: None,
            dir,
            extra: extra.iter().map(|a| a.to_string()).collect(),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(&bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{bin}` (install redis-server): {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if ping(self.port) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// SIGKILL, like a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same port (empty: no persistence).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// A plain redis-rs connection for inspecting state.
    pub async fn raw(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ping(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
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

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
