//! An axum shop with a payment callback that charges once however often the provider
//! retries it, and a flash-sale endpoint that never oversells.
//!
//! ```sh
//! cargo run --example axum_orders --features axum            # serve on 127.0.0.1:3000
//! cargo run --example axum_orders --features axum -- --demo  # serve, then act as clients
//! cargo run --example axum_orders --features axum,metrics     # with /metrics (Prometheus)
//! ```
//!
//! It uses the Redis at `REDIS_URL` (default `redis://127.0.0.1:6379/`; a Redis Cluster as
//! `redis+cluster://host1:7000,host2:7001`); with `--demo` and
//! no Redis reachable it falls back to the in-memory backend and says so. The README's
//! "Idempotency" section has curl commands to try by hand.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use distlock::{Locks, distributed_lock, idempotent};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

/// Stand-ins for a payment gateway and a stock table.
#[derive(Clone, Default)]
struct Shop {
    /// Every charge made at the gateway: (order, cents).
    charges: Arc<Mutex<Vec<(String, u64)>>>,
    /// Items left per sku.
    stock: Arc<Mutex<BTreeMap<u32, u32>>>,
    /// Who bought what.
    sold_to: Arc<Mutex<Vec<String>>>,
}

#[derive(Serialize, Deserialize)]
struct PaymentNotice {
    order_id: String,
    amount_cents: u64,
}

#[derive(Serialize, Deserialize)]
struct Buy {
    buyer: String,
}

/// The provider retries this callback until it sees a 2xx, with the same
/// `Idempotency-Key`: the card is charged once, and every retry gets the first answer.
/// One provider calls this endpoint, so its records are shared by a literal scope.
#[idempotent(header = "Idempotency-Key", scope = "payment-provider", ttl = "24h")]
async fn payment_callback(
    State(shop): State<Shop>,
    Json(notice): Json<PaymentNotice>,
) -> (StatusCode, Json<serde_json::Value>) {
    let mut charges = shop.charges.lock().await;
    tokio::time::sleep(Duration::from_millis(50)).await; // the gateway is slow
    charges.push((notice.order_id.clone(), notice.amount_cents));
    let receipt = format!("rcpt-{}", charges.len());
    (
        StatusCode::OK,
        Json(
            serde_json::json!({ "order_id": notice.order_id, "charged_cents": notice.amount_cents, "receipt": receipt }),
        ),
    )
}

/// Double-clicked "buy" buttons send the same key: the claim answers the repeats; the
/// lock serializes different buyers on the same sku. `#[idempotent]` goes on top, so
/// a repeat never waits for the lock. Each buyer's keys are its own (`scope`; in a real
/// service, the authenticated user rather than a field of the body).
#[idempotent(header = "Idempotency-Key", scope = "<req.buyer>")]
#[distributed_lock(key = "stock:<sku>", ttl = "10s", wait = "5s")]
async fn buy(
    State(shop): State<Shop>,
    Path(sku): Path<u32>,
    Json(req): Json<Buy>,
) -> Result<(StatusCode, String), distlock::Error> {
    // Read, think, write: without the lock two buyers could take the last item.
    let left = *shop.stock.lock().await.get(&sku).unwrap_or(&0);
    tokio::time::sleep(Duration::from_millis(10)).await;
    if left == 0 {
        return Ok((StatusCode::GONE, "sold out".into()));
    }
    shop.stock.lock().await.insert(sku, left - 1);
    shop.sold_to.lock().await.push(req.buyer.clone());
    Ok((
        StatusCode::CREATED,
        format!("{} got one; {} left", req.buyer, left - 1),
    ))
}

async fn stats(State(shop): State<Shop>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "charges": shop.charges.lock().await.len(),
        "stock": *shop.stock.lock().await,
        "sold": shop.sold_to.lock().await.len(),
    }))
}

fn app(shop: Shop) -> Router {
    let router = Router::new()
        .route("/payments/callback", post(payment_callback))
        .route("/flash-sale/{sku}/buy", post(buy))
        .route("/stats", get(stats));
    // distlock's metrics (feature `metrics`) through the Prometheus exporter: the
    // recorder is installed once, and `/metrics` renders what it holds.
    #[cfg(feature = "metrics")]
    let router = {
        let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("no other metrics recorder is installed");
        router.route(
            "/metrics",
            get(move || std::future::ready(prometheus.render())),
        )
    };
    router.with_state(shop)
}

#[tokio::main]
async fn main() {
    let demo = std::env::args().any(|a| a == "--demo");
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let locks = match Locks::connect(&url).await {
        Ok(locks) => {
            println!("using Redis at {url}");
            locks
        }
        Err(e) if demo => {
            println!("Redis at {url} unavailable ({e}); the demo uses the in-memory backend");
            Locks::in_memory()
        }
        Err(e) => panic!("Redis at {url} unavailable: {e} (set REDIS_URL, or run with --demo)"),
    };
    distlock::install(locks);
    let shop = Shop::default();
    shop.stock.lock().await.insert(7, 5);
    let bind = if demo {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:3000"
    };
    let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
    let addr = listener.local_addr().unwrap();
    println!("listening on http://{addr}");
    let router = app(shop.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // Graceful shutdown: on Ctrl-C (or at the end of the demo) the server stops taking
    // requests and returns once its connections are closed...
    let server = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                tokio::select! {
                    _ = stopped => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            })
            .await
    });
    let ok = if demo { run_demo(addr).await } else { true };
    let _ = stop.send(());
    server.await.unwrap().unwrap();
    // ...while a body whose client went away may still run in its task: let it finish
    // and store its response before the runtime shuts down, or its key stays in
    // progress until its lease ends and a retry runs it again.
    let left = distlock::idempotency::drain(Duration::from_secs(10)).await;
    if left > 0 {
        eprintln!("{left} idempotent calls still running at shutdown");
    }
    std::process::exit(if ok { 0 } else { 1 });
}

/// Client mode: a provider retrying callbacks, and buyers racing (with double clicks).
async fn run_demo(addr: SocketAddr) -> bool {
    // 1. One payment notice, delivered 3 times at once and 2 more times later.
    let notice = r#"{"order_id":"A-1001","amount_cents":4200}"#;
    let mut deliveries = Vec::new();
    for _ in 0..3 {
        deliveries.push(tokio::spawn(http(
            addr,
            "/payments/callback",
            "pay-notify-A-1001",
            notice,
        )));
    }
    let mut answers = Vec::new();
    for d in deliveries {
        answers.push(d.await.unwrap());
    }
    for _ in 0..2 {
        answers.push(http(addr, "/payments/callback", "pay-notify-A-1001", notice).await);
    }
    for (i, (status, replayed, body)) in answers.iter().enumerate() {
        println!(
            "callback delivery {}: {status} replayed={replayed} {body}",
            i + 1
        );
    }
    // 2. 12 buyers for 5 items, each clicking twice.
    let mut clicks = Vec::new();
    for b in 0..12 {
        for _ in 0..2 {
            let body = format!(r#"{{"buyer":"buyer-{b}"}}"#);
            let key = format!("buy-7-buyer-{b}");
            clicks.push(tokio::spawn(async move {
                http(addr, "/flash-sale/7/buy", &key, &body).await
            }));
        }
    }
    let mut by_status = BTreeMap::new();
    for c in clicks {
        *by_status.entry(c.await.unwrap().0).or_insert(0) += 1;
    }
    let (_, _, stats) = get_stats(addr).await;
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let charges = stats["charges"].as_u64().unwrap();
    let sold = stats["sold"].as_u64().unwrap();
    let left = stats["stock"]["7"].as_u64().unwrap();
    println!("buy clicks by status: {by_status:?}");
    println!(
        "charged once: {} ({charges} charge for 5 deliveries)",
        if charges == 1 { "yes" } else { "NO" }
    );
    println!(
        "never oversold: {} ({sold} sold, {left} left of 5)",
        if sold + left == 5 { "yes" } else { "NO" }
    );
    #[cfg(feature = "metrics")]
    {
        let (_, _, metrics) = request(addr, "GET", "/metrics", None, "").await;
        println!("--- /metrics ---\n{metrics}--- end ---");
    }
    charges == 1 && sold + left == 5
}

async fn get_stats(addr: SocketAddr) -> (u16, bool, String) {
    request(addr, "GET", "/stats", None, "").await
}

async fn http(addr: SocketAddr, path: &str, key: &str, body: &str) -> (u16, bool, String) {
    request(addr, "POST", path, Some(key), body).await
}

/// A tiny HTTP/1.1 client (one request per connection), to keep the example's
/// dependencies to the server's own.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, bool, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let key = key
        .map(|k| format!("Idempotency-Key: {k}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{key}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let replayed = head
        .to_ascii_lowercase()
        .contains("idempotent-replayed: true");
    (status, replayed, body.to_owned())
}
