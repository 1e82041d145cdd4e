//! An actix-web shop with a payment callback that charges once however often the
//! provider retries it, and a flash-sale endpoint that never oversells.
//!
//! ```sh
//! cargo run --example actix_orders --features actix            # serve on 127.0.0.1:3001
//! cargo run --example actix_orders --features actix -- --demo  # serve, then act as clients
//! ```
//!
//! It uses the Redis at `REDIS_URL` (default `redis://127.0.0.1:6379/`); with `--demo` and
//! no Redis reachable it falls back to the in-memory backend and says so. The README's
//! "Idempotency" section has curl commands to try by hand.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};
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
    shop: web::Data<Shop>,
    web::Json(notice): web::Json<PaymentNotice>,
) -> HttpResponse {
    let mut charges = shop.charges.lock().await;
    tokio::time::sleep(Duration::from_millis(50)).await; // the gateway is slow
    charges.push((notice.order_id.clone(), notice.amount_cents));
    let receipt = format!("rcpt-{}", charges.len());
    HttpResponse::Ok().json(serde_json::json!({
        "order_id": notice.order_id, "charged_cents": notice.amount_cents, "receipt": receipt
    }))
}

/// Double-clicked "buy" buttons send the same key: the claim answers the repeats; the
/// lock serializes different buyers on the same sku. `#[idempotent]` goes on top, so
/// a repeat never waits for the lock. Each buyer's keys are its own (`scope`; in a real
/// service, the authenticated user rather than a field of the body).
#[idempotent(header = "Idempotency-Key", scope = "<req.buyer>")]
#[distributed_lock(key = "stock:<sku.0>", ttl = "10s", wait = "5s")]
async fn buy(
    shop: web::Data<Shop>,
    sku: web::Path<(u32,)>,
    web::Json(req): web::Json<Buy>,
) -> Result<HttpResponse, distlock::Error> {
    // Read, think, write: without the lock two buyers could take the last item.
    let left = *shop.stock.lock().await.get(&sku.0).unwrap_or(&0);
    tokio::time::sleep(Duration::from_millis(10)).await;
    if left == 0 {
        return Ok(HttpResponse::Gone().body("sold out"));
    }
    shop.stock.lock().await.insert(sku.0, left - 1);
    shop.sold_to.lock().await.push(req.buyer.clone());
    Ok(HttpResponse::Created().body(format!("{} got one; {} left", req.buyer, left - 1)))
}

async fn stats(shop: web::Data<Shop>) -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({
        "charges": shop.charges.lock().await.len(),
        "stock": *shop.stock.lock().await,
        "sold": shop.sold_to.lock().await.len(),
    }))
}

fn main() -> std::io::Result<()> {
    let demo = std::env::args().any(|a| a == "--demo");
    actix_web::rt::System::new().block_on(async move {
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
        let data = web::Data::new(shop);
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .route("/payments/callback", web::post().to(payment_callback))
                .route("/flash-sale/{sku}/buy", web::post().to(buy))
                .route("/stats", web::get().to(stats))
        })
        .workers(2)
        .bind(if demo {
            "127.0.0.1:0"
        } else {
            "127.0.0.1:3001"
        })?;
        let addr = server.addrs()[0];
        println!("listening on http://{addr}");
        // Shut down by hand (below), not on the first signal.
        let server = server.disable_signals().run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        let ok = if demo {
            run_demo(addr).await
        } else {
            let _ = tokio::signal::ctrl_c().await;
            true
        };
        // Graceful shutdown: stop taking connections, then let the handlers' bodies
        // whose clients went away finish and store their responses in their tasks on
        // the workers, then stop the workers (their runtimes, and whatever still runs
        // there, go with them: such a key would stay in progress until its lease ends,
        // and a retry would run the body again).
        handle.pause().await;
        let left = distlock::idempotency::drain(Duration::from_secs(10)).await;
        if left > 0 {
            eprintln!("{left} idempotent calls still running at shutdown");
        }
        handle.stop(true).await;
        std::process::exit(if ok { 0 } else { 1 });
    })
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
    let (_, _, stats) = request(addr, "GET", "/stats", None, "").await;
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
    charges == 1 && sold + left == 5
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
