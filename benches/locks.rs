//! distlock against a raw redis-rs baseline, in the same run, on a private redis-server.
//!
//! Run with `scripts/bench.sh` (or `cargo bench --bench locks`). `DISTLOCK_BENCH_QUICK=1`
//! divides every count by 10 for a quick look. Benchmarks never fail: the targets are
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
//! - W2: 64 tasks, each on its own key, 100,000 pairs in total.
//!   W1 and W2 run in 20 rounds of blocks (raw, distlock, raw+lua; then the reverse) so
//!   that the drift of a shared, noisy machine falls on every side alike. `raw+lua` is a
//!   diagnostic third column: raw redis-rs sending distlock's own Lua scripts, which
//!   splits distlock's gap to the baseline into server-side and client-side cost (with
//!   the CPU redis-server and this process spent per pair).
//! - W3: 16 tasks of one process on one key share 2,000 tickets: acquire (wait up to 10 s),
//!   hold 1 ms (`tokio::time::sleep`), release.
//! - W4: the same with 4 processes x 4 tasks (this binary re-executed in child mode,
//!   tickets shared through a Redis counter), timestamps merged in the parent.

use std::collections::BTreeMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::io::{Read, Write as _};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::Instant;

/// The lease everywhere.
const TTL: Duration = Duration::from_secs(30);
/// How long a contended acquire may wait.
const WAIT: Duration = Duration::from_secs(10);
/// The critical section of W3 and W4.
const HOLD: Duration = Duration::from_millis(1);
/// The baseline's polling interval.
const POLL: Duration = Duration::from_millis(50);
/// Set in the environment of a W4 child process.
const CHILD_ENV: &str = "DISTLOCK_BENCH_CHILD";

/// Compare-and-delete of the baseline.
const RAW_RELEASE: &str = r"if redis.call('GET', KEYS[1]) == ARGV[1] then
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
    let server = Server::start();
    rt.block_on(run(&cfg, &server));
    drop(server);
}

// ---------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------

struct Config {
    quick: bool,
    rt_pairs: usize,
    ping_samples: usize,
    w1_warmup: usize,
    w1_pairs: usize,
    w2_tasks: usize,
    w2_pairs: usize,
    w3_tasks: usize,
    w3_acquisitions: u64,
    w4_procs: usize,
    w4_tasks: usize,
    w4_acquisitions: u64,
}

impl Config {
    fn from_env() -> Config {
        let quick = std::env::var("DISTLOCK_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let div = if quick { 10 } else { 1 };
        Config {
            quick,
            rt_pairs: 100,
            ping_samples: 2_000 / div,
            w1_warmup: 1_000 / div,
            w1_pairs: 20_000 / div,
            w2_tasks: 64,
            w2_pairs: 100_000 / div,
            w3_tasks: 16,
            w3_acquisitions: 2_000 / div as u64,
            w4_procs: 4,
            w4_tasks: 4,
            w4_acquisitions: 2_000 / div as u64,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The implementations behind one interface
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Distlock,
    Raw,
    /// Diagnostic, W1/W2 only: raw redis-rs sending distlock's own Lua scripts (same
    /// keys and arguments), so the gap to `Raw` is the server's and the gap to
    /// `Distlock` is distlock's client-side cost.
    RawLua,
    /// Diagnostic, W3 only: the floor of distlock's design on this machine. A fair (FIFO)
    /// `tokio::sync::Mutex` stands for the local queue, one PING for the acquire and one
    /// for the release: the same wake-ups and round trips, no lock logic at all.
    Floor,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Distlock => "distlock",
            Kind::Raw => "raw",
            Kind::RawLua => "raw+lua",
            Kind::Floor => "floor",
        }
    }

    fn parse(s: &str) -> Kind {
        match s {
            "distlock" => Kind::Distlock,
            "raw" => Kind::Raw,
            other => panic!("unknown implementation `{other}`"),
        }
    }
}

enum Client {
    Distlock(distlock::Locks),
    Raw {
        conn: MultiplexedConnection,
        release: redis::Script,
    },
    RawLua {
        conn: MultiplexedConnection,
        acquire: redis::Script,
        release: redis::Script,
    },
    Floor {
        conn: MultiplexedConnection,
        queue: Arc<tokio::sync::Mutex<()>>,
    },
}

enum Held {
    Distlock(distlock::LockGuard),
    Raw { key: String, token: String },
    Floor(tokio::sync::OwnedMutexGuard<()>),
}

/// distlock's scripts, sent by hand.
const LUA_ACQUIRE: &str = include_str!("../lockcore/src/scripts/acquire.lua");
const LUA_RELEASE: &str = include_str!("../lockcore/src/scripts/release.lua");
/// A client id for the raw+lua client (it never waits, so it is never yielded to).
const LUA_CLIENT_ID: &str = "bench:raw-lua";

#[derive(Debug)]
enum AcqError {
    /// Still held by someone else when the wait ran out.
    Busy,
    Failed(String),
}

impl Client {
    async fn connect(kind: Kind, url: &str) -> Client {
        match kind {
            Kind::Distlock => Client::Distlock(
                distlock::Locks::connect(url)
                    .await
                    .expect("distlock connects"),
            ),
            Kind::Raw => {
                let mut conn = raw_connection(url).await;
                let release = redis::Script::new(RAW_RELEASE);
                release
                    .prepare_invoke()
                    .load_async(&mut conn)
                    .await
                    .expect("SCRIPT LOAD");
                Client::Raw { conn, release }
            }
            Kind::RawLua => {
                let mut conn = raw_connection(url).await;
                let (acquire, release) = (
                    redis::Script::new(LUA_ACQUIRE),
                    redis::Script::new(LUA_RELEASE),
                );
                for s in [&acquire, &release] {
                    s.prepare_invoke()
                        .load_async(&mut conn)
                        .await
                        .expect("SCRIPT LOAD");
                }
                Client::RawLua {
                    conn,
                    acquire,
                    release,
                }
            }
            Kind::Floor => Client::Floor {
                conn: raw_connection(url).await,
                queue: Arc::default(),
            },
        }
    }

    async fn acquire(&self, key: &str, wait: Duration) -> Result<Held, AcqError> {
        match self {
            Client::Distlock(locks) => match locks.lock(key).ttl(TTL).wait(wait).acquire().await {
                Ok(guard) => Ok(Held::Distlock(guard)),
                Err(distlock::Error::Busy { .. }) => Err(AcqError::Busy),
                Err(e) => Err(AcqError::Failed(e.to_string())),
            },
            Client::Raw { conn, .. } => {
                let mut conn = conn.clone();
                let token = raw_token();
                let deadline = Instant::now() + wait;
                loop {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(TTL.as_millis() as u64)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| AcqError::Failed(e.to_string()))?;
                    if set.is_some() {
                        return Ok(Held::Raw {
                            key: key.to_owned(),
                            token,
                        });
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(AcqError::Busy);
                    }
                    tokio::time::sleep_until((now + POLL).min(deadline)).await;
                }
            }
            Client::RawLua { conn, acquire, .. } => {
                let mut conn = conn.clone();
                let key = format!("lua:{key}");
                let token = raw_token();
                let reply: i64 = acquire
                    .key(&key)
                    .key(format!("{{{key}}}:fence"))
                    .arg(&token)
                    .arg(TTL.as_millis() as u64)
                    .arg(LUA_CLIENT_ID)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| AcqError::Failed(e.to_string()))?;
                if reply >= 1 {
                    Ok(Held::Raw { key, token })
                } else {
                    Err(AcqError::Busy) // uncontended workloads only: no waiting
                }
            }
            Client::Floor { conn, queue } => {
                let turn = queue.clone().lock_owned().await;
                ping_once(conn).await.map_err(AcqError::Failed)?;
                Ok(Held::Floor(turn))
            }
        }
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        match (self, held) {
            (Client::Distlock(_), Held::Distlock(guard)) => {
                guard.release().await.map_err(|e| e.to_string())
            }
            (Client::Raw { conn, release }, Held::Raw { key, token }) => {
                let mut conn = conn.clone();
                let deleted: i64 = release
                    .key(&key)
                    .arg(&token)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if deleted == 1 {
                    Ok(())
                } else {
                    Err(format!("{key}: lost"))
                }
            }
            (Client::RawLua { conn, release, .. }, Held::Raw { key, token }) => {
                let mut conn = conn.clone();
                // The arguments distlock sends for an uncontended release.
                let released: Vec<i64> = release
                    .key(&key)
                    .key(format!("{{{key}}}:fence"))
                    .key(format!("{{{key}}}:turns"))
                    .arg(&token)
                    .arg(format!("{key}:released"))
                    .arg("")
                    .arg(LUA_CLIENT_ID)
                    .arg(10)
                    .arg("")
                    .arg(0)
                    .arg("")
                    .arg(0)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if released == [1] {
                    Ok(())
                } else {
                    Err(format!("{key}: lost"))
                }
            }
            (Client::Floor { conn, .. }, Held::Floor(turn)) => {
                let pinged = ping_once(conn).await;
                drop(turn);
                pinged
            }
            _ => unreachable!("a guard released through the other implementation"),
        }
    }

    /// Gets connections and scripts ready before timing: a few pairs, then one wait
    /// behind a second client holding `key` (for distlock, the wait opens the client's
    /// shared Pub/Sub connection, which it keeps).
    async fn warm_up(self: &Arc<Self>, kind: Kind, url: &str, key: &str) {
        for _ in 0..3 {
            let h = self.acquire(key, WAIT).await.expect("warm-up acquire");
            self.release(h).await.expect("warm-up release");
        }
        let other = Client::connect(kind, url).await;
        let held = other.acquire(key, WAIT).await.expect("warm-up acquire");
        let (me, k) = (self.clone(), key.to_owned());
        let waiter = tokio::spawn(async move {
            let h = me
                .acquire(&k, Duration::from_secs(2))
                .await
                .expect("warm-up wait");
            me.release(h).await.expect("warm-up release");
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        other.release(held).await.expect("warm-up release");
        waiter.await.expect("warm-up waiter");
    }
}

async fn ping_once(conn: &MultiplexedConnection) -> Result<(), String> {
    redis::cmd("PING")
        .query_async::<String>(&mut conn.clone())
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// A token unique to this acquisition: a per-process random seed hashing a counter.
fn raw_token() -> String {
    static SEED: std::sync::LazyLock<RandomState> = std::sync::LazyLock::new(RandomState::new);
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:016x}{:016x}:{}",
        SEED.hash_one((n, 0u8)),
        SEED.hash_one((n, 1u8)),
        std::process::id()
    )
}

async fn raw_connection(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis connects")
}

// ---------------------------------------------------------------------------------------
// The private redis-server
// ---------------------------------------------------------------------------------------

struct Server {
    port: u16,
    child: std::process::Child,
    dir: PathBuf,
    version: String,
}

impl Server {
    fn start() -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("distlock-bench-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start redis-server (scripts/bench.sh installs it)");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !ping(port) {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let version = std::process::Command::new("redis-server")
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| {
                let out = String::from_utf8_lossy(&o.stdout).into_owned();
                out.split_whitespace()
                    .find_map(|w| w.strip_prefix("v=").map(str::to_owned))
            })
            .unwrap_or_else(|| "unknown".into());
        Server {
            port,
            child,
            dir,
            version,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

// ---------------------------------------------------------------------------------------
// Measurements
// ---------------------------------------------------------------------------------------

/// Nanoseconds on the wall clock (CLOCK_REALTIME), comparable across processes.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64
}

/// Nearest-rank percentile of sorted samples.
fn pct<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// PING round trips (ns, sorted) through a multiplexed connection: their p50 is the
/// "one round trip" of W3/W4, their p99 the noise floor of any latency figure here.
async fn ping_rtts(url: &str, samples: usize) -> Vec<u64> {
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
struct WireCount {
    per_pair: f64,
    /// Client commands by name, and the commands Lua ran.
    commands: BTreeMap<String, usize>,
    lua: usize,
}

async fn count_round_trips(kind: Kind, url: &str, port: u16, pairs: usize) -> WireCount {
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
fn parse_monitor(line: &str) -> Option<(String, String)> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let addr = line[open + 1..close].split_whitespace().nth(1)?.to_owned();
    let rest = line[close + 1..].trim_start().strip_prefix('"')?;
    let cmd = rest[..rest.find('"')?].to_owned();
    Some((addr, cmd))
}

// ---------------------------------------------------------------------------------------
// W1 and W2: uncontended
// ---------------------------------------------------------------------------------------

/// `n` sequential pairs from key index `from`; latencies (ns) appended; returns elapsed and errors.
async fn w1_block(client: &Client, from: usize, n: usize, lat: &mut Vec<u64>) -> (Duration, u64) {
    let mut errors = 0;
    let start = Instant::now();
    for i in from..from + n {
        let t = Instant::now();
        let key = format!("w1:{}", i % 100);
        match client.acquire(&key, WAIT).await {
            Ok(h) => {
                if client.release(h).await.is_err() {
                    errors += 1;
                }
            }
            Err(_) => errors += 1,
        }
        lat.push(t.elapsed().as_nanos() as u64);
    }
    (start.elapsed(), errors)
}

/// `tasks` tasks each on its own key, `pairs` pairs in all; returns elapsed and errors.
async fn w2_block(client: &Arc<Client>, tasks: usize, pairs: usize) -> (Duration, u64) {
    let barrier = Arc::new(tokio::sync::Barrier::new(tasks + 1));
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let n = pairs / tasks + usize::from(t < pairs % tasks);
        let (client, barrier) = (client.clone(), barrier.clone());
        handles.push(tokio::spawn(async move {
            let key = format!("w2:{t}");
            barrier.wait().await;
            let mut errors = 0u64;
            for _ in 0..n {
                match client.acquire(&key, WAIT).await {
                    Ok(h) => {
                        if client.release(h).await.is_err() {
                            errors += 1;
                        }
                    }
                    Err(_) => errors += 1,
                }
            }
            errors
        }));
    }
    barrier.wait().await;
    let start = Instant::now();
    let mut errors = 0;
    for h in handles {
        errors += h.await.expect("w2 task");
    }
    (start.elapsed(), errors)
}

#[derive(Default)]
struct Uncontended {
    pairs: usize,
    elapsed: Duration,
    errors: u64,
    /// Latency of every pair (ns), sorted at the end (W1).
    lat: Vec<u64>,
    /// Pairs per second of every block, in order.
    block_rates: Vec<f64>,
    /// redis-server CPU seconds spent during this implementation's blocks.
    server_cpu: f64,
    /// This process's CPU seconds (all threads) during this implementation's blocks.
    client_cpu: f64,
}

impl Uncontended {
    fn rate(&self) -> f64 {
        self.pairs as f64 / self.elapsed.as_secs_f64()
    }

    fn add_block(&mut self, pairs: usize, elapsed: Duration, errors: u64) {
        self.pairs += pairs;
        self.elapsed += elapsed;
        self.errors += errors;
        self.block_rates.push(pairs as f64 / elapsed.as_secs_f64());
    }

    /// Server CPU per pair, in microseconds.
    fn server_us(&self) -> f64 {
        self.server_cpu * 1e6 / self.pairs.max(1) as f64
    }

    /// Client (this process) CPU per pair, in microseconds.
    fn client_us(&self) -> f64 {
        self.client_cpu * 1e6 / self.pairs.max(1) as f64
    }
}

/// Median, min and max of the per-round ratios `a / b` (blocks of the same round).
fn round_ratios(a: &Uncontended, b: &Uncontended) -> (f64, f64, f64) {
    let mut r: Vec<f64> = a
        .block_rates
        .iter()
        .zip(&b.block_rates)
        .map(|(x, y)| x / y)
        .collect();
    r.sort_by(f64::total_cmp);
    let mid = pct(&r, 0.5).unwrap_or(f64::NAN);
    (
        mid,
        r.first().copied().unwrap_or(f64::NAN),
        r.last().copied().unwrap_or(f64::NAN),
    )
}

/// Rounds of W1 and W2: each round runs one block of every implementation, in an order
/// that flips every round, so that the drift of a shared, noisy machine falls on all alike.
const ROUNDS: usize = 20;

fn round_order(round: usize) -> [Kind; 3] {
    if round.is_multiple_of(2) {
        [Kind::Raw, Kind::Distlock, Kind::RawLua]
    } else {
        [Kind::RawLua, Kind::Distlock, Kind::Raw]
    }
}

/// Results indexed by [`slot`].
type Three = [Uncontended; 3];

/// CPU seconds this process has run so far, all threads (Linux `schedstat`, ns
/// resolution); NaN elsewhere.
fn own_cpu() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return f64::NAN;
    };
    let mut ns = 0u64;
    for t in tasks.flatten() {
        if let Ok(stat) = std::fs::read_to_string(t.path().join("schedstat")) {
            ns += stat
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    ns as f64 / 1e9
}

/// Server CPU seconds so far (`INFO cpu`: user + sys of redis-server).
async fn server_cpu(conn: &mut MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .expect("INFO cpu");
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

async fn run_w1(cfg: &Config, url: &str, clients: &[Arc<Client>; 3]) -> Three {
    let mut stats = raw_connection(url).await;
    let mut out: Three = Default::default();
    for client in clients {
        let mut sink = Vec::new();
        w1_block(client, 0, cfg.w1_warmup, &mut sink).await;
    }
    let per_block = cfg.w1_pairs / ROUNDS;
    let mut next = [0usize; 3];
    for round in 0..ROUNDS {
        for kind in round_order(round) {
            let i = slot(kind);
            let cpu = server_cpu(&mut stats).await;
            let own = own_cpu();
            let res = &mut out[i];
            let (elapsed, errors) = w1_block(&clients[i], next[i], per_block, &mut res.lat).await;
            res.client_cpu += own_cpu() - own;
            res.server_cpu += server_cpu(&mut stats).await - cpu;
            next[i] += per_block;
            res.add_block(per_block, elapsed, errors);
        }
    }
    for r in &mut out {
        r.lat.sort_unstable();
    }
    out
}

async fn run_w2(cfg: &Config, url: &str, clients: &[Arc<Client>; 3]) -> Three {
    let mut stats = raw_connection(url).await;
    let mut out: Three = Default::default();
    let per_block = cfg.w2_pairs / ROUNDS;
    for round in 0..ROUNDS {
        for kind in round_order(round) {
            let i = slot(kind);
            let cpu = server_cpu(&mut stats).await;
            let own = own_cpu();
            let (elapsed, errors) = w2_block(&clients[i], cfg.w2_tasks, per_block).await;
            out[i].client_cpu += own_cpu() - own;
            out[i].server_cpu += server_cpu(&mut stats).await - cpu;
            out[i].add_block(per_block, elapsed, errors);
        }
    }
    out
}

/// Index of an implementation in [`Three`].
fn slot(kind: Kind) -> usize {
    match kind {
        Kind::Distlock => 0,
        Kind::Raw => 1,
        Kind::RawLua => 2,
        Kind::Floor => unreachable!("the floor runs in W3 only"),
    }
}

// ---------------------------------------------------------------------------------------
// W3 and W4: contended
// ---------------------------------------------------------------------------------------

/// One acquisition, on the shared wall clock.
#[derive(Clone, Copy, Debug)]
struct Rec {
    task: u32,
    acq_start: u64,
    acq_done: u64,
    rel_start: u64,
    rel_done: u64,
}

#[derive(Default)]
struct RunOut {
    recs: Vec<Rec>,
    timeouts: u64,
    errors: u64,
    /// Calls per command name on the server during the run (`INFO commandstats`, so the
    /// commands Lua ran are included).
    commands: BTreeMap<String, u64>,
}

/// Zeroes the server's command statistics (`CONFIG RESETSTAT`) just before a run.
async fn reset_commandstats(conn: &mut MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .expect("CONFIG RESETSTAT");
}

/// Calls per command since the reset (`INFO commandstats`: the commands Lua ran count too).
async fn read_commandstats(conn: &mut MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    let mut calls_by_name = BTreeMap::new();
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let calls = rest
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if !matches!(name, "config|resetstat" | "info") {
            calls_by_name.insert(name.to_owned(), calls);
        }
    }
    calls_by_name
}

enum Tickets {
    Local {
        taken: AtomicU64,
        total: u64,
    },
    Redis {
        conn: MultiplexedConnection,
        key: String,
        total: u64,
    },
}

impl Tickets {
    /// Takes the next ticket; `false` when all are gone.
    async fn take(&self) -> bool {
        match self {
            Tickets::Local { taken, total } => taken.fetch_add(1, Ordering::Relaxed) < *total,
            Tickets::Redis { conn, key, total } => {
                let n: Result<u64, _> = redis::cmd("INCR")
                    .arg(key)
                    .query_async(&mut conn.clone())
                    .await;
                n.is_ok_and(|n| n <= *total)
            }
        }
    }
}

/// `tasks` tasks on `key` until the tickets run out: per ticket, acquire (wait up to
/// 10 s, retried with the same ticket if it runs out), hold 1 ms, release. The next
/// ticket is taken during the hold, so taking it adds nothing between release and acquire.
async fn contend(
    client: Arc<Client>,
    key: &str,
    tasks: usize,
    task_base: u32,
    tickets: Arc<Tickets>,
) -> RunOut {
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let (client, tickets, key) = (client.clone(), tickets.clone(), key.to_owned());
        let task = task_base + t as u32;
        handles.push(tokio::spawn(async move {
            let mut out = RunOut::default();
            let mut have = tickets.take().await;
            while have {
                let acq_start = now_ns();
                let held = match client.acquire(&key, WAIT).await {
                    Ok(h) => h,
                    Err(AcqError::Busy) => {
                        out.timeouts += 1;
                        continue;
                    }
                    Err(AcqError::Failed(e)) => {
                        out.errors += 1;
                        eprintln!("task {task}: acquire failed: {e}");
                        if out.errors > 20 {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let acq_done = now_ns();
                let ((), next) = tokio::join!(tokio::time::sleep(HOLD), tickets.take());
                let rel_start = now_ns();
                if let Err(e) = client.release(held).await {
                    out.errors += 1;
                    eprintln!("task {task}: release failed: {e}");
                }
                let rel_done = now_ns();
                out.recs.push(Rec {
                    task,
                    acq_start,
                    acq_done,
                    rel_start,
                    rel_done,
                });
                have = next;
            }
            out
        }));
    }
    let mut all = RunOut::default();
    for h in handles {
        let out = h.await.expect("contending task");
        all.recs.extend(out.recs);
        all.timeouts += out.timeouts;
        all.errors += out.errors;
    }
    all
}

async fn run_w3(cfg: &Config, url: &str, kind: Kind) -> RunOut {
    let client = Arc::new(Client::connect(kind, url).await);
    client
        .warm_up(kind, url, &format!("w3:warm:{}", kind.name()))
        .await;
    let tickets = Arc::new(Tickets::Local {
        taken: AtomicU64::new(0),
        total: cfg.w3_acquisitions,
    });
    let mut stats = raw_connection(url).await;
    reset_commandstats(&mut stats).await;
    let mut out = contend(client, "w3", cfg.w3_tasks, 0, tickets).await;
    out.commands = read_commandstats(&mut stats).await;
    out
}

async fn run_w4(cfg: &Config, url: &str, kind: Kind) -> RunOut {
    let tickets_key = format!("bench:w4:tickets:{}", kind.name());
    let mut conn = raw_connection(url).await;
    let _: () = redis::cmd("DEL")
        .arg(&tickets_key)
        .query_async(&mut conn)
        .await
        .expect("DEL");
    let exe = std::env::current_exe().expect("current exe");
    let mut children = Vec::new();
    for p in 0..cfg.w4_procs {
        let mut child = tokio::process::Command::new(&exe)
            .env(CHILD_ENV, "1")
            .env("DISTLOCK_BENCH_KIND", kind.name())
            .env("DISTLOCK_BENCH_URL", url)
            .env("DISTLOCK_BENCH_KEY", "w4")
            .env("DISTLOCK_BENCH_TICKETS", &tickets_key)
            .env("DISTLOCK_BENCH_TOTAL", cfg.w4_acquisitions.to_string())
            .env("DISTLOCK_BENCH_TASKS", cfg.w4_tasks.to_string())
            .env("DISTLOCK_BENCH_TASK_BASE", (p * cfg.w4_tasks).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn a W4 child");
        let stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        loop {
            match lines.next_line().await.expect("child output") {
                Some(l) if l == "ready" => break,
                Some(_) => {}
                None => panic!("W4 child {p} exited before it was ready"),
            }
        }
        children.push((child, stdin, lines));
    }
    reset_commandstats(&mut conn).await;
    for (_, stdin, _) in &mut children {
        stdin.write_all(b"go\n").await.expect("go");
        stdin.flush().await.expect("go");
    }
    let mut all = RunOut::default();
    for (mut child, _stdin, mut lines) in children {
        while let Some(line) = lines.next_line().await.expect("child output") {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["rec", task, a, b, c, d] => all.recs.push(Rec {
                    task: task.parse().expect("task"),
                    acq_start: a.parse().expect("ts"),
                    acq_done: b.parse().expect("ts"),
                    rel_start: c.parse().expect("ts"),
                    rel_done: d.parse().expect("ts"),
                }),
                ["done", timeouts, errors] => {
                    all.timeouts += timeouts.parse::<u64>().expect("timeouts");
                    all.errors += errors.parse::<u64>().expect("errors");
                }
                _ => eprintln!("W4 child: {line}"),
            }
        }
        let status = child.wait().await.expect("child exit");
        assert!(status.success(), "a W4 child failed: {status}");
    }
    all.commands = read_commandstats(&mut conn).await;
    all
}

/// A W4 child: connect, warm up, say `ready`, wait for `go`, contend, print the records.
fn child_main() {
    let env = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"));
    let kind = Kind::parse(&env("DISTLOCK_BENCH_KIND"));
    let url = env("DISTLOCK_BENCH_URL");
    let key = env("DISTLOCK_BENCH_KEY");
    let tickets_key = env("DISTLOCK_BENCH_TICKETS");
    let total: u64 = env("DISTLOCK_BENCH_TOTAL").parse().expect("total");
    let tasks: usize = env("DISTLOCK_BENCH_TASKS").parse().expect("tasks");
    let base: u32 = env("DISTLOCK_BENCH_TASK_BASE").parse().expect("task base");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let out = rt.block_on(async {
        let client = Arc::new(Client::connect(kind, &url).await);
        client
            .warm_up(
                kind,
                &url,
                &format!("w4:warm:{}:{}", kind.name(), std::process::id()),
            )
            .await;
        let tickets = Arc::new(Tickets::Redis {
            conn: raw_connection(&url).await,
            key: tickets_key,
            total,
        });
        println!("ready");
        std::io::stdout().flush().expect("stdout");
        let mut go = String::new();
        tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut go))
            .await
            .expect("stdin")
            .expect("stdin");
        contend(client, &key, tasks, base, tickets).await
    });
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    for r in &out.recs {
        writeln!(
            w,
            "rec {} {} {} {} {}",
            r.task, r.acq_start, r.acq_done, r.rel_start, r.rel_done
        )
        .expect("stdout");
    }
    writeln!(w, "done {} {}", out.timeouts, out.errors).expect("stdout");
    w.flush().expect("stdout");
}

/// The figures of one contended run.
struct Contended {
    n: usize,
    rate: f64,
    ideal: f64,
    hold_mean_us: f64,
    release_mean_us: f64,
    same_share: f64,
    handoffs: usize,
    gap_p50_us: Option<f64>,
    gap_p99_us: Option<f64>,
    gap_max_us: Option<f64>,
    min_task: u64,
    max_task: u64,
    fair: f64,
    timeouts: u64,
    errors: u64,
    overlaps: usize,
    /// Acquisitions per process (W4), and the share of consecutive ones by one process.
    per_proc: Vec<u64>,
    same_proc_share: f64,
    /// Handoffs to a task of another process (W4): how many, gap p50/p99.
    xproc_handoffs: usize,
    xproc_gap_p50_us: Option<f64>,
    xproc_gap_p99_us: Option<f64>,
    /// Server commands per acquisition, by name.
    commands: Vec<(String, f64)>,
}

/// `tasks` in all, `tasks_per_proc` of them in each process.
fn analyze(mut run: RunOut, tasks: usize, tasks_per_proc: usize, rtt_ns: f64) -> Contended {
    let recs = &mut run.recs;
    recs.sort_by_key(|r| r.acq_done);
    let n = recs.len();
    let mut per_task = vec![0u64; tasks];
    for r in recs.iter() {
        per_task[r.task as usize] += 1;
    }
    let hold_mean_ns = recs
        .iter()
        .map(|r| (r.rel_start - r.acq_done) as f64)
        .sum::<f64>()
        / n.max(1) as f64;
    let release_mean_ns = recs
        .iter()
        .map(|r| (r.rel_done - r.rel_start) as f64)
        .sum::<f64>()
        / n.max(1) as f64;
    let span_ns =
        recs.iter().map(|r| r.rel_done).max().unwrap_or(0) - recs.first().map_or(0, |r| r.acq_done);
    let mut per_proc = vec![0u64; tasks.div_ceil(tasks_per_proc)];
    for r in recs.iter() {
        per_proc[r.task as usize / tasks_per_proc] += 1;
    }
    let mut same = 0;
    let mut same_proc = 0;
    let mut overlaps = 0;
    let mut gaps: Vec<i64> = Vec::new();
    let mut xproc_gaps: Vec<i64> = Vec::new();
    for w in recs.windows(2) {
        let (prev, next) = (w[0], w[1]);
        if next.acq_done < prev.rel_start {
            overlaps += 1; // two holders at once: must never happen
        }
        if next.task as usize / tasks_per_proc == prev.task as usize / tasks_per_proc {
            same_proc += 1;
        } else {
            xproc_gaps.push(next.acq_done as i64 - prev.rel_done as i64);
        }
        if next.task == prev.task {
            same += 1;
        } else {
            gaps.push(next.acq_done as i64 - prev.rel_done as i64);
        }
    }
    gaps.sort_unstable();
    xproc_gaps.sort_unstable();
    let us = |ns: i64| ns as f64 / 1e3;
    Contended {
        n,
        rate: n as f64 / (span_ns as f64 / 1e9),
        ideal: 1e9 / (hold_mean_ns + rtt_ns),
        hold_mean_us: hold_mean_ns / 1e3,
        release_mean_us: release_mean_ns / 1e3,
        same_share: same as f64 / n.saturating_sub(1).max(1) as f64,
        handoffs: gaps.len(),
        gap_p50_us: pct(&gaps, 0.5).map(us),
        gap_p99_us: pct(&gaps, 0.99).map(us),
        gap_max_us: gaps.last().copied().map(us),
        min_task: per_task.iter().copied().min().unwrap_or(0),
        max_task: per_task.iter().copied().max().unwrap_or(0),
        fair: n as f64 / tasks as f64,
        timeouts: run.timeouts,
        errors: run.errors,
        overlaps,
        per_proc,
        same_proc_share: same_proc as f64 / n.saturating_sub(1).max(1) as f64,
        xproc_handoffs: xproc_gaps.len(),
        xproc_gap_p50_us: pct(&xproc_gaps, 0.5).map(us),
        xproc_gap_p99_us: pct(&xproc_gaps, 0.99).map(us),
        commands: run
            .commands
            .iter()
            .map(|(name, calls)| (name.clone(), *calls as f64 / n.max(1) as f64))
            .collect(),
    }
}

impl Contended {
    fn handoff_ok(&self) -> bool {
        self.gap_p99_us.is_some_and(|p99| p99 < 1_000.0)
    }

    fn rate_ok(&self) -> bool {
        self.rate >= 0.9 * self.ideal
    }

    fn fair_ok(&self) -> bool {
        self.min_task as f64 >= 0.5 * self.fair && self.max_task as f64 <= 2.0 * self.fair
    }
}

// ---------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------

struct Table {
    rows: Vec<[String; 5]>,
}

impl Table {
    fn new() -> Table {
        Table {
            rows: vec![[
                "workload".into(),
                "figure".into(),
                "distlock".into(),
                "raw redis-rs".into(),
                "ratio".into(),
            ]],
        }
    }

    /// A row whose ratio is distlock / raw.
    fn num(&mut self, w: &str, figure: &str, d: f64, r: f64, decimals: usize) {
        let ratio = if r != 0.0 {
            format!("{:.2}x", d / r)
        } else {
            "-".into()
        };
        self.rows.push([
            w.into(),
            figure.into(),
            format!("{d:.decimals$}"),
            format!("{r:.decimals$}"),
            ratio,
        ]);
    }

    fn text(&mut self, w: &str, figure: &str, d: String, r: String, ratio: String) {
        self.rows.push([w.into(), figure.into(), d, r, ratio]);
    }

    fn print(&self) {
        let mut width = [0usize; 5];
        for row in &self.rows {
            for (i, c) in row.iter().enumerate() {
                width[i] = width[i].max(c.chars().count());
            }
        }
        for (n, row) in self.rows.iter().enumerate() {
            let line: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if i < 2 {
                        format!("{c:<w$}", w = width[i])
                    } else {
                        format!("{c:>w$}", w = width[i])
                    }
                })
                .collect();
            println!("  {}", line.join("  "));
            if n == 0 {
                println!("  {}", "-".repeat(width.iter().sum::<usize>() + 8));
            }
        }
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

async fn run(cfg: &Config, server: &Server) {
    let url = server.url();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "distlock bench: redis-server {} on 127.0.0.1:{} (private, save \"\", appendonly no), {cores} CPUs, {} mode",
        server.version,
        server.port,
        if cfg.quick {
            "QUICK (counts / 10)"
        } else {
            "full"
        }
    );
    println!(
        "  baseline = raw redis-rs: SET NX PX + EVALSHA compare-and-delete on one multiplexed connection, 50 ms polling"
    );
    println!("  TTL 30 s everywhere; ratio = distlock / raw\n");

    let mut wire = Vec::new();
    for kind in [Kind::Distlock, Kind::Raw] {
        let count = count_round_trips(kind, &url, server.port, cfg.rt_pairs).await;
        println!(
            "  RT {:<8} {:.2} commands per acquire+release on the wire {:?}, plus {:.1} run inside Lua",
            kind.name(),
            count.per_pair,
            count.commands,
            count.lua as f64 / cfg.rt_pairs as f64
        );
        wire.push(count);
    }

    let clients = [
        Arc::new(Client::connect(Kind::Distlock, &url).await),
        Arc::new(Client::connect(Kind::Raw, &url).await),
        Arc::new(Client::connect(Kind::RawLua, &url).await),
    ];
    let w1 = run_w1(cfg, &url, &clients).await;
    println!("  W1 done");
    let w2 = run_w2(cfg, &url, &clients).await;
    println!("  W2 done");
    drop(clients);

    let pings = ping_rtts(&url, cfg.ping_samples).await;
    let ping_us = |q: f64| pct(&pings, q).unwrap_or(0) as f64 / 1e3;
    let rtt = ping_us(0.5) * 1e3;
    let ping_line = format!(
        "one round trip (PING through a multiplexed connection, {} samples): p50 {:.1} us, p90 {:.1} us, p99 {:.1} us",
        pings.len(),
        ping_us(0.5),
        ping_us(0.9),
        ping_us(0.99)
    );
    let w3d = analyze(
        run_w3(cfg, &url, Kind::Distlock).await,
        cfg.w3_tasks,
        cfg.w3_tasks,
        rtt,
    );
    let w3r = analyze(
        run_w3(cfg, &url, Kind::Raw).await,
        cfg.w3_tasks,
        cfg.w3_tasks,
        rtt,
    );
    let w3f = analyze(
        run_w3(cfg, &url, Kind::Floor).await,
        cfg.w3_tasks,
        cfg.w3_tasks,
        rtt,
    );
    println!("  W3 done");
    let w4_tasks = cfg.w4_procs * cfg.w4_tasks;
    let w4d = analyze(
        run_w4(cfg, &url, Kind::Distlock).await,
        w4_tasks,
        cfg.w4_tasks,
        rtt,
    );
    let w4r = analyze(
        run_w4(cfg, &url, Kind::Raw).await,
        w4_tasks,
        cfg.w4_tasks,
        rtt,
    );
    println!("  W4 done\n");

    println!("  {ping_line}\n");
    let mut t = Table::new();
    t.num(
        "RT",
        "commands per acquire+release",
        wire[0].per_pair,
        wire[1].per_pair,
        2,
    );
    let [d1, r1, l1] = &w1;
    t.num("W1", "pairs/s", d1.rate(), r1.rate(), 0);
    let p = |u: &Uncontended, q: f64| pct(&u.lat, q).unwrap_or(0) as f64 / 1e3;
    t.num("W1", "p50 us", p(d1, 0.5), p(r1, 0.5), 1);
    t.num("W1", "p99 us", p(d1, 0.99), p(r1, 0.99), 1);
    let [d2, r2, l2] = &w2;
    t.num("W2", "pairs/s", d2.rate(), r2.rate(), 0);
    for (w, d, r) in [("W3", &w3d, &w3r), ("W4", &w4d, &w4r)] {
        t.num(w, "acquisitions/s", d.rate, r.rate, 0);
        t.num(w, "ideal 1/(hold + 1 RTT)/s", d.ideal, r.ideal, 0);
        t.num(
            w,
            "acquisitions/s / ideal",
            d.rate / d.ideal,
            r.rate / r.ideal,
            2,
        );
        t.num(
            w,
            "measured hold us (mean)",
            d.hold_mean_us,
            r.hold_mean_us,
            0,
        );
        t.num(
            w,
            "release call us (mean)",
            d.release_mean_us,
            r.release_mean_us,
            0,
        );
        t.text(
            w,
            "same-task share",
            format!("{:.1}%", d.same_share * 100.0),
            format!("{:.1}%", r.same_share * 100.0),
            "".into(),
        );
        if w == "W4" {
            t.text(
                w,
                "same-process share",
                format!("{:.1}%", d.same_proc_share * 100.0),
                format!("{:.1}%", r.same_proc_share * 100.0),
                "".into(),
            );
            let list = |c: &Contended| {
                c.per_proc
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join("/")
            };
            t.text(w, "acquisitions per process", list(d), list(r), "".into());
            t.text(
                w,
                "handoffs to another process",
                d.xproc_handoffs.to_string(),
                r.xproc_handoffs.to_string(),
                "".into(),
            );
            t.text(
                w,
                "  their gap p50/p99 us",
                format!("{}/{}", opt(d.xproc_gap_p50_us), opt(d.xproc_gap_p99_us)),
                format!("{}/{}", opt(r.xproc_gap_p50_us), opt(r.xproc_gap_p99_us)),
                "".into(),
            );
        }
        t.text(
            w,
            "cross-task handoffs",
            d.handoffs.to_string(),
            r.handoffs.to_string(),
            "".into(),
        );
        for (name, dv, rv) in [
            ("handoff gap p50 us", d.gap_p50_us, r.gap_p50_us),
            ("handoff gap p99 us", d.gap_p99_us, r.gap_p99_us),
            ("handoff gap max us", d.gap_max_us, r.gap_max_us),
        ] {
            let ratio = match (dv, rv) {
                (Some(a), Some(b)) if b != 0.0 => format!("{:.2}x", a / b),
                _ => "-".into(),
            };
            t.text(w, name, opt(dv), opt(rv), ratio);
        }
        t.text(
            w,
            &format!("min/max per task (fair {:.0})", d.fair),
            format!("{}/{}", d.min_task, d.max_task),
            format!("{}/{}", r.min_task, r.max_task),
            "".into(),
        );
        t.text(
            w,
            "acquisitions (timeouts, errors)",
            format!("{} ({}, {})", d.n, d.timeouts, d.errors),
            format!("{} ({}, {})", r.n, r.timeouts, r.errors),
            "".into(),
        );
    }
    t.print();
    println!(
        "\nW3 floor on this machine: a FIFO tokio::sync::Mutex plus one PING to acquire and one to"
    );
    println!(
        "release (distlock's wake-ups and round trips, no lock logic): acquisitions/s / ideal {:.2},",
        w3f.rate / w3f.ideal
    );
    println!(
        "release call {:.0} us, handoff gap p50 {} us, p99 {} us, max {} us (distlock: {:.2}, {:.0} us, {} / {} / {} us)",
        w3f.release_mean_us,
        opt(w3f.gap_p50_us),
        opt(w3f.gap_p99_us),
        opt(w3f.gap_max_us),
        w3d.rate / w3d.ideal,
        w3d.release_mean_us,
        opt(w3d.gap_p50_us),
        opt(w3d.gap_p99_us),
        opt(w3d.gap_max_us)
    );
    println!(
        "\nServer commands per acquisition in W3/W4 (INFO commandstats, Lua's inner calls included;"
    );
    println!(
        "W4 also counts the ticket INCR; for distlock a PTTL is one try that found the lock held):"
    );
    for (name, c) in [
        ("W3 distlock", &w3d),
        ("W3 raw", &w3r),
        ("W4 distlock", &w4d),
        ("W4 raw", &w4r),
    ] {
        let list: Vec<String> = c
            .commands
            .iter()
            .filter(|(_, per)| *per >= 0.005)
            .map(|(cmd, per)| format!("{cmd} {per:.2}"))
            .collect();
        println!("  {name:<12} {}", list.join(", "));
    }
    for (name, d, r, l) in [("W1", d1, r1, l1), ("W2", d2, r2, l2)] {
        if d.errors + r.errors + l.errors > 0 {
            println!(
                "  {name} errors: distlock {}, raw {}, raw+lua {}",
                d.errors, r.errors, l.errors
            );
        }
    }
    for (name, c) in [
        ("W3 distlock", &w3d),
        ("W3 raw", &w3r),
        ("W4 distlock", &w4d),
        ("W4 raw", &w4r),
    ] {
        if c.overlaps > 0 {
            println!(
                "  {name}: {} acquisitions overlapped the previous holder!",
                c.overlaps
            );
        }
    }

    println!("\nUncontended, per round ({ROUNDS} rounds, blocks alternating):");
    for (name, d, r) in [("W1", d1, r1), ("W2", d2, r2)] {
        let (mid, lo, hi) = round_ratios(d, r);
        println!("  {name} distlock / raw per round: median {mid:.2}x, range {lo:.2}x-{hi:.2}x");
    }
    println!(
        "\nWhere the uncontended gap comes from. raw+lua = raw redis-rs sending distlock's own Lua"
    );
    println!(
        "scripts (same keys, arguments and round trips, none of distlock's client-side code):"
    );
    println!(
        "  {:<4} {:>30} {:>10} {:>10} {:>10}",
        "", "", "raw", "raw+lua", "distlock"
    );
    for (name, d, r, l) in [("W1", d1, r1, l1), ("W2", d2, r2, l2)] {
        println!(
            "  {name:<4} {:>30} {:>10.0} {:>10.0} {:>10.0}",
            "pairs/s",
            r.rate(),
            l.rate(),
            d.rate()
        );
        println!(
            "  {name:<4} {:>30} {:>10.2} {:>10.2} {:>10.2}",
            "x raw",
            1.0,
            l.rate() / r.rate(),
            d.rate() / r.rate()
        );
        println!(
            "  {name:<4} {:>30} {:>10.1} {:>10.1} {:>10.1}",
            "redis-server CPU us per pair",
            r.server_us(),
            l.server_us(),
            d.server_us()
        );
        println!(
            "  {name:<4} {:>30} {:>10.1} {:>10.1} {:>10.1}",
            "client (bench process) CPU us",
            r.client_us(),
            l.client_us(),
            d.client_us()
        );
    }
    println!(
        "  W1   {:>30} {:>10.1} {:>10.1} {:>10.1}",
        "p50 us",
        p(r1, 0.5),
        p(l1, 0.5),
        p(d1, 0.5)
    );
    println!("\nTargets (informational; a bench never fails):");
    let r1x = d1.rate() / r1.rate();
    let r2x = d2.rate() / r2.rate();
    println!(
        "  RT  2 round trips per acquire+release:   distlock {:.2} {}   (raw {:.2})",
        wire[0].per_pair,
        verdict(wire[0].per_pair == 2.0),
        wire[1].per_pair
    );
    println!(
        "  W1  pairs/s >= 0.97x raw:                 {r1x:.2}x {}",
        verdict(r1x >= 0.97)
    );
    println!(
        "  W2  pairs/s >= 0.97x raw:                 {r2x:.2}x {}",
        verdict(r2x >= 0.97)
    );
    for (w, d, r) in [("W3", &w3d, &w3r), ("W4", &w4d, &w4r)] {
        println!(
            "  {w}  handoff p99 < 1 ms:                   distlock {} us {}   (raw {} us {})",
            opt(d.gap_p99_us),
            verdict(d.handoff_ok()),
            opt(r.gap_p99_us),
            verdict(r.handoff_ok())
        );
        println!(
            "  {w}  acquisitions/s >= 0.9x ideal:        distlock {:.2}x {}   (raw {:.2}x {})",
            d.rate / d.ideal,
            verdict(d.rate_ok()),
            r.rate / r.ideal,
            verdict(r.rate_ok())
        );
        println!(
            "  {w}  every task in 0.5x-2x of fair share: distlock {:.2}x-{:.2}x {}   (raw {:.2}x-{:.2}x {})",
            d.min_task as f64 / d.fair,
            d.max_task as f64 / d.fair,
            verdict(d.fair_ok()),
            r.min_task as f64 / r.fair,
            r.max_task as f64 / r.fair,
            verdict(r.fair_ok())
        );
    }
}
