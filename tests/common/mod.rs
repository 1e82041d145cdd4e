//! Test harness: private `redis-server` processes on free ports.
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

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A `redis-server` this test started; killed on drop, and by this process's reaper (see
/// [`REAPER_SCRIPT`]) if the test process ends without dropping it (a server kept in a
/// `static` or otherwise never dropped, SIGKILL of the test process).
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
        tell_reaper("dir", dir.to_str().expect("temp dir path is UTF-8"));
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
        tell_reaper("pid", &child.id().to_string());
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

    /// The server process's id (`None` after [`kill`](Self::kill)).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's working directory, removed on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// SIGKILL, like a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            // Unregistered before `wait`: until this process reaps it, the pid cannot be
            // taken by another process, so the reaper never holds a pid that may name one
            // (short of this process being killed between these two lines).
            tell_reaper("unpid", &c.id().to_string());
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

/// The reaper: one `sh` per test process that started a server, reading lines from a pipe
/// whose write end only the test process holds (std opens it close-on-exec, so neither the
/// servers nor other children inherit it). `pid N` / `unpid N` add and remove a process to
/// SIGKILL, `dir PATH` a directory to remove (only `*/distlock-test-*` ones; removing one
/// the test already removed is a no-op). When the test process ends, however it ends (also
/// SIGKILL), the pipe reaches EOF and the reaper kills the listed pids, removes the dirs
/// and exits. A partial last line (the test killed mid-write) fails `read` and is ignored.
/// It runs in its own process group and ignores INT, HUP and TERM, so a Ctrl-C or a
/// group-wide kill of the tests does not take it down before its work.
pub const REAPER_SCRIPT: &str = r#"
trap '' INT HUP TERM
pids=' '
dirs=''
while read -r op arg; do
  case "$op" in
    pid) pids="$pids$arg " ;;
    unpid)
      case "$pids" in
        *" $arg "*) pids="${pids%% $arg *} ${pids#* $arg }" ;;
      esac ;;
    dir)
      case "$arg" in
        */distlock-test-*) dirs="$dirs$arg
" ;;
      esac ;;
  esac
done
for p in $pids; do kill -9 "$p" 2>/dev/null; done
printf '%s' "$dirs" | while IFS= read -r d; do
  rm -rf -- "$d" 2>/dev/null || { sleep 0.2; rm -rf -- "$d"; }
done
"#;

/// Environment variable that, set, starts no reaper: for the control that shows servers
/// outlive a SIGKILLed test process without it.
pub const NO_REAPER_VAR: &str = "DISTLOCK_TEST_NO_REAPER";

/// Starts a reaper running [`REAPER_SCRIPT`] with its stdin piped from this process.
pub fn spawn_reaper() -> std::io::Result<Child> {
    Command::new("sh")
        .args(["-c", REAPER_SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
}

/// Sends `op arg` to this process's reaper, starting it first if need be. The line goes out
/// in one `write` (shorter than `PIPE_BUF`: atomic), so lines from threads never mix.
fn tell_reaper(op: &str, arg: &str) {
    static REAPER: OnceLock<Option<Mutex<ChildStdin>>> = OnceLock::new();
    let reaper = REAPER.get_or_init(|| {
        if std::env::var_os(NO_REAPER_VAR).is_some() {
            return None;
        }
        match spawn_reaper() {
            // The `Child` is dropped, not waited for: the reaper outlives this process.
            Ok(mut child) => child.stdin.take().map(Mutex::new),
            Err(e) => {
                eprintln!("no reaper for redis-servers (`sh`: {e}); they die with their Drop only");
                None
            }
        }
    });
    if let Some(stdin) = reaper {
        let line = format!("{op} {arg}\n");
        let mut stdin = stdin.lock().unwrap_or_else(|e| e.into_inner());
        let _ = stdin.write_all(line.as_bytes());
    }
}

pub fn ping(port: u16) -> bool {
    use std::io::Read;
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
