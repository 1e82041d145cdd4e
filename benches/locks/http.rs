//! W5: idempotency over HTTP. One axum server in this process with two endpoints doing the
//! same work: `/distlock` (`#[idempotent(header = ...)]`) and `/baseline`, written by hand
//! as a careful user would: `SET key placeholder NX PX 30000`, run, `SET key response PX
//! 86400000`; a repeat `GET`s the key and answers the stored response (409 while the
//! placeholder is there). 16 clients on keep-alive connections send fresh keys, then the
//! same keys again (replays), in rounds that alternate which endpoint goes first.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::*;

/// Concurrent HTTP clients.
const CLIENTS: usize = 16;

#[derive(Clone)]
pub(crate) struct App {
    locks: distlock::Locks,
    raw: MultiplexedConnection,
}

#[derive(Deserialize)]
pub(crate) struct Pay {
    order: String,
    cents: u64,
}

#[derive(Serialize)]
pub(crate) struct Receipt {
    order: String,
    cents: u64,
    receipt: &'static str,
}

#[distlock::idempotent(header = "Idempotency-Key", scope = "bench", client = app.locks)]
async fn distlock_pay(State(app): State<App>, Json(pay): Json<Pay>) -> Json<Receipt> {
    Json(Receipt {
        order: pay.order,
        cents: pay.cents,
        receipt: "r-1",
    })
}

/// The receipt every endpoint answers, as JSON.
fn receipt_json(pay: Pay) -> String {
    serde_json::to_string(&Receipt {
        order: pay.order,
        cents: pay.cents,
        receipt: "r-1",
    })
    .expect("a receipt serializes")
}

async fn baseline_pay(State(app): State<App>, headers: HeaderMap, body: String) -> Response {
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let rkey = format!("base:{key}");
    let mut conn = app.raw.clone();
    let claimed: Option<String> = redis::cmd("SET")
        .arg(&rkey)
        .arg("in_progress")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut conn)
        .await
        .unwrap_or(None);
    if claimed.is_some() {
        let Ok(pay) = serde_json::from_str::<Pay>(&body) else {
            let _: Result<(), _> = conn.del(&rkey).await;
            return StatusCode::UNPROCESSABLE_ENTITY.into_response();
        };
        let text = receipt_json(pay);
        let _: Result<(), _> = redis::cmd("SET")
            .arg(&rkey)
            .arg(&text)
            .arg("PX")
            .arg(86_400_000)
            .query_async(&mut conn)
            .await;
        return ([("content-type", "application/json")], text).into_response();
    }
    match conn.get::<_, Option<String>>(&rkey).await {
        Ok(Some(stored)) if stored != "in_progress" => (
            [
                ("content-type", "application/json"),
                ("idempotent-replayed", "true"),
            ],
            stored,
        )
            .into_response(),
        _ => StatusCode::CONFLICT.into_response(),
    }
}

/// A floor for W5, written by hand: the guarantees distlock keeps, without distlock.
/// It fingerprints the payload (canonical JSON, SHA-256), runs the call in a task of its
/// own (a caller that goes away does not cause a second run), claims with a record that
/// names the owner, the fingerprint and the lease (`SET NX GET PX`), replays a completed
/// record with the same fingerprint (422 for another), and stores with distlock's own
/// commands (`MULTI`, `SET NX PX`, `APPEND`, `GETRANGE`, `EXEC`). No lease renewal, no
/// waiting, no takeover, no header checks: what it lacks only makes it cheaper.
async fn guarded_pay(State(app): State<App>, headers: HeaderMap, body: String) -> Response {
    use sha2::Digest as _;
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let Ok(payload) = serde_json::from_str::<serde_json::Value>(&body) else {
        return StatusCode::UNPROCESSABLE_ENTITY.into_response();
    };
    let canonical = payload.to_string(); // objects are sorted maps: keys in order
    let fp: String = sha2::Sha256::digest(canonical.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let rkey = format!("guarded:{key}");
    let conn = app.raw.clone();
    let call = tokio::spawn(async move {
        let mut conn = conn;
        let owner = format!("{}:bench:1", uuid::Uuid::new_v4());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let claim = format!(
            r#"{{"claimed_at_ms":{now},"fp":"{fp}","lease_until_ms":{},"owner":"{owner}","retention_ms":86400000,"status":"in_progress"}}"#,
            now + 30_000
        );
        let found: Option<String> = redis::cmd("SET")
            .arg(&rkey)
            .arg(&claim)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(86_430_000)
            .query_async(&mut conn)
            .await
            .unwrap_or(None);
        if let Some(raw) = found {
            let Some(at) = raw.find(r#"{"status":"completed","fp":""#) else {
                return StatusCode::CONFLICT.into_response();
            };
            let done: serde_json::Value = serde_json::Deserializer::from_str(&raw[at..])
                .into_iter()
                .next()
                .and_then(Result::ok)
                .unwrap_or_default();
            if done["fp"] != fp.as_str() {
                return StatusCode::UNPROCESSABLE_ENTITY.into_response();
            }
            let body = done["response"]["body"].as_str().unwrap_or("").to_owned();
            return (
                [
                    ("content-type", "application/json"),
                    ("idempotent-replayed", "true"),
                ],
                body,
            )
                .into_response();
        }
        let Ok(pay) = serde_json::from_value::<Pay>(payload) else {
            return StatusCode::UNPROCESSABLE_ENTITY.into_response();
        };
        let text = receipt_json(pay);
        let done = format!(
            r#"{{"status":"completed","fp":"{fp}","completed_at_ms":{now},"response":{}}}"#,
            serde_json::json!({
                "status": 200,
                "headers": [["content-type", "application/json"]],
                "body": text,
            })
        );
        let owner_at = claim.find(r#""owner":""#).unwrap_or(0);
        let _: Result<(usize, Vec<u8>), _> = redis::pipe()
            .atomic()
            .cmd("SET")
            .arg(&rkey)
            .arg(&done)
            .arg("NX")
            .arg("PX")
            .arg(86_400_000)
            .ignore()
            .cmd("APPEND")
            .arg(&rkey)
            .arg(&done)
            .cmd("GETRANGE")
            .arg(&rkey)
            .arg(owner_at)
            .arg(owner_at + owner.len() + 9)
            .query_async(&mut conn)
            .await;
        ([("content-type", "application/json")], text).into_response()
    });
    call.await
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(addr: std::net::SocketAddr) -> Conn {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).ok();
        Conn {
            stream,
            buf: Vec::with_capacity(4096),
        }
    }

    /// Sends one POST and reads its response; returns the status.
    async fn post(&mut self, path: &str, key: &str, body: &str) -> u16 {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: bench\r\nIdempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.stream.write_all(req.as_bytes()).await.expect("write");
        self.buf.clear();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if self.buf.len() >= end + 4 + len {
                    return head
                        .split_whitespace()
                        .nth(1)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                }
            }
            let n = self.stream.read(&mut chunk).await.expect("read");
            assert!(n > 0, "the server closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// What one phase of one endpoint measured.
#[derive(Default, Clone, Copy)]
pub(crate) struct Phase {
    pub(crate) requests: u64,
    pub(crate) secs: f64,
    pub(crate) server_cpu_s: f64,
    /// What redis-server spent running the commands themselves (`INFO commandstats`
    /// `usec`): its CPU without reading, parsing and writing.
    pub(crate) command_s: f64,
    /// This process's CPU (HTTP clients, axum server, both Redis clients; see
    /// `own_cpu`): the clients are the same for both endpoints.
    pub(crate) process_cpu_s: f64,
    pub(crate) commands: u64,
    /// Read events of redis-server (`total_reads_processed`): one per socket read, so
    /// fewer than the commands where a connection pipelines several.
    pub(crate) reads: u64,
    /// Connections redis-server accepted (`total_connections_received`).
    pub(crate) connections: u64,
    pub(crate) unexpected: u64,
}

impl Phase {
    pub(crate) fn rate(&self) -> f64 {
        self.requests as f64 / self.secs.max(1e-9)
    }

    pub(crate) fn cpu_us(&self) -> f64 {
        self.server_cpu_s * 1e6 / self.requests.max(1) as f64
    }

    pub(crate) fn command_us(&self) -> f64 {
        self.command_s * 1e6 / self.requests.max(1) as f64
    }

    pub(crate) fn process_us(&self) -> f64 {
        self.process_cpu_s * 1e6 / self.requests.max(1) as f64
    }

    pub(crate) fn commands_per(&self) -> f64 {
        self.commands as f64 / self.requests.max(1) as f64
    }

    pub(crate) fn reads_per(&self) -> f64 {
        self.reads as f64 / self.requests.max(1) as f64
    }

    fn add(&mut self, other: Phase) {
        self.requests += other.requests;
        self.secs += other.secs;
        self.server_cpu_s += other.server_cpu_s;
        self.command_s += other.command_s;
        self.process_cpu_s += other.process_cpu_s;
        self.commands += other.commands;
        self.reads += other.reads;
        self.connections += other.connections;
        self.unexpected += other.unexpected;
    }
}

/// W5 for every endpoint: first calls and replays, summed over the rounds.
pub(crate) struct Http {
    pub(crate) distlock: [Phase; 2],
    pub(crate) baseline: [Phase; 2],
    /// The hand-written floor with distlock's guarantees (see `guarded_pay`).
    pub(crate) guarded: [Phase; 2],
}

/// Sends `keys` (split over [`CLIENTS`] connections) to `path`; a response other than
/// 200 counts as unexpected.
async fn phase(
    addr: std::net::SocketAddr,
    path: &'static str,
    keys: Arc<Vec<String>>,
    conn: &mut MultiplexedConnection,
) -> Phase {
    reset_commandstats(conn).await;
    let (reads0, connections0) = reads_processed(conn).await;
    let cpu0 = server_cpu(conn).await;
    let process0 = own_cpu();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let keys = keys.clone();
        tasks.push(tokio::spawn(async move {
            let mut http = Conn::open(addr).await;
            let mut unexpected = 0u64;
            for key in keys.iter().skip(c).step_by(CLIENTS) {
                let body = format!(r#"{{"order":"{key}","cents":4200}}"#);
                if http.post(path, key, &body).await != 200 {
                    unexpected += 1;
                }
            }
            unexpected
        }));
    }
    let mut unexpected = 0;
    for t in tasks {
        unexpected += t.await.expect("client task");
    }
    let secs = started.elapsed().as_secs_f64();
    let process_cpu_s = own_cpu() - process0;
    let cpu = server_cpu(conn).await - cpu0;
    // This connection's own reads (CONFIG RESETSTAT, INFO stats, INFO cpu) left out.
    let (reads1, connections1) = reads_processed(conn).await;
    let reads = (reads1 - reads0).saturating_sub(3);
    let command_s = command_usec(conn).await / 1e6;
    let stats = read_commandstats(conn).await;
    let commands = stats
        .iter()
        .filter(|(name, _)| !["info", "config"].contains(&name.as_str()))
        .map(|(_, n)| *n)
        .sum();
    Phase {
        requests: keys.len() as u64,
        secs,
        server_cpu_s: cpu,
        command_s,
        process_cpu_s,
        commands,
        reads,
        connections: connections1 - connections0,
        unexpected,
    }
}

/// redis-server's `total_reads_processed` and `total_connections_received` so far.
async fn reads_processed(conn: &mut MultiplexedConnection) -> (u64, u64) {
    let stats = info_section(conn, "stats").await;
    let field = |name: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
            .unwrap_or(0)
    };
    (
        field("total_reads_processed"),
        field("total_connections_received"),
    )
}

/// Microseconds redis-server spent in commands since the last reset (`INFO
/// commandstats`). `EXEC` is left out: the commands it runs count on their own. A
/// script's time includes its inner calls, which also count on their own (counted
/// twice; neither endpoint runs a script on its usual path).
async fn command_usec(conn: &mut MultiplexedConnection) -> f64 {
    info_section(conn, "commandstats")
        .await
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
        .filter(|(name, _)| !["info", "config|resetstat", "exec"].contains(name))
        .filter_map(|(_, rest)| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix("usec="))?
                .parse::<f64>()
                .ok()
        })
        .sum()
}

/// Runs W5: `rounds` rounds of `keys_per_round` fresh keys per endpoint, then the same
/// keys again; the endpoint that goes first alternates.
pub(crate) async fn run_w5(url: &str, rounds: usize, keys_per_round: usize) -> Http {
    let locks = distlock::Locks::connect(url)
        .await
        .expect("distlock client");
    let raw = raw_connection(url).await;
    let app = App { locks, raw };
    let router = axum::Router::new()
        .route("/distlock", axum::routing::post(distlock_pay))
        .route("/baseline", axum::routing::post(baseline_pay))
        .route("/guarded", axum::routing::post(guarded_pay))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let mut stats = raw_connection(url).await;
    // `DISTLOCK_BENCH_W5_PATH=/distlock` (or `/baseline`, `/guarded`): that endpoint alone,
    // for a profiler (`perf record -p`, `perf stat -e instructions -p`) to see one.
    let only = std::env::var("DISTLOCK_BENCH_W5_PATH").ok();
    let paths: Vec<&'static str> = ["/distlock", "/baseline", "/guarded"]
        .into_iter()
        .filter(|p| only.as_deref().is_none_or(|o| o == *p))
        .collect();
    // Warm-up: connections made, scripts loaded.
    let warm: Arc<Vec<String>> = Arc::new((0..CLIENTS * 4).map(|i| format!("warm-{i}")).collect());
    for path in &paths {
        phase(addr, path, warm.clone(), &mut stats).await;
    }
    if only.is_some() {
        eprintln!("W5: warm; pid {}", std::process::id());
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let mut out = Http {
        distlock: [Phase::default(); 2],
        baseline: [Phase::default(); 2],
        guarded: [Phase::default(); 2],
    };
    for round in 0..rounds {
        let keys: Arc<Vec<String>> = Arc::new(
            (0..keys_per_round)
                .map(|i| format!("r{round}-k{i}"))
                .collect(),
        );
        let mut order = paths.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        // First calls (0), then the same keys again: replays (1).
        for which in 0..2 {
            for &path in &order {
                let p = phase(addr, path, keys.clone(), &mut stats).await;
                let slot = match path {
                    "/distlock" => &mut out.distlock[which],
                    "/baseline" => &mut out.baseline[which],
                    _ => &mut out.guarded[which],
                };
                slot.add(p);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.abort();
    out
}
