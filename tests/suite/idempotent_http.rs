//! `#[idempotent(header = "Idempotency-Key")]` on real axum and actix-web servers bound
//! to 127.0.0.1, each test with its own redis-server: replay fidelity, bad headers,
//! payload mismatch, concurrency, waiting, what is and is not stored, both orders with
//! `#[distributed_lock]`, connections killed while a body runs and a Redis outage. Every
//! check runs against both frameworks.
use crate::common;
use crate::http;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::RedisServer;
use distlock::Locks;
use http::{Resp, post, send};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

/// Shared by both apps: the client, call counters and a stock table.
#[derive(Clone)]
struct App {
    locks: Locks,
    runs: Arc<BTreeMap<&'static str, AtomicU32>>,
    stock: Arc<tokio::sync::Mutex<BTreeMap<u32, u32>>>,
    /// Order ids that took an item (each must appear once).
    sold: Arc<std::sync::Mutex<Vec<String>>>,
}

const COUNTERS: &[&str] = &[
    "orders", "slow", "wait", "flaky", "conflict", "big", "binary", "optional", "stock", "busy",
    "steady", "transfer", "upload", "echo", "page", "events", "raw",
];

/// Server-sent events: one at once, the second 2 s later.
fn two_events(
    n: u32,
) -> impl futures_util::Stream<Item = Result<axum::body::Bytes, std::io::Error>> {
    futures_util::stream::unfold(0, move |i| async move {
        let event = match i {
            0 => format!("data: one {n}\n\n"),
            1 => {
                tokio::time::sleep(Duration::from_secs(2)).await;
                "data: two\n\n".to_owned()
            }
            _ => return None,
        };
        Some((Ok(axum::body::Bytes::from(event)), i + 1))
    })
}

impl App {
    fn new(locks: Locks) -> App {
        App {
            locks,
            runs: Arc::new(COUNTERS.iter().map(|c| (*c, AtomicU32::new(0))).collect()),
            stock: Arc::new(tokio::sync::Mutex::new(BTreeMap::from([(1, 5), (2, 5)]))),
            sold: Arc::default(),
        }
    }

    fn bump(&self, name: &str) -> u32 {
        self.runs[name].fetch_add(1, Ordering::SeqCst) + 1
    }

    fn runs(&self, name: &str) -> u32 {
        self.runs[name].load(Ordering::SeqCst)
    }

    /// Read, await, write: oversells without the lock.
    async fn take_one(&self, sku: u32, order: &str) -> Option<u32> {
        let left = *self.stock.lock().await.get(&sku).unwrap_or(&0);
        tokio::time::sleep(Duration::from_millis(5)).await;
        if left == 0 {
            return None;
        }
        self.stock.lock().await.insert(sku, left - 1);
        self.sold.lock().unwrap().push(order.to_owned());
        Some(left - 1)
    }
}

/// What a handler's own `#[distributed_lock]` returns when the lock stays taken.
fn busy_error() -> distlock::Error {
    distlock::Error::Busy {
        key: "lock:stock:1".into(),
        waited: Duration::from_secs(3),
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    sku: String,
    qty: u32,
    ship: Ship,
}

#[derive(Debug, Serialize, Deserialize)]
struct Ship {
    city: String,
    zip: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Buy {
    order: String,
}

/// Only `Deserialize`, as axum and actix request bodies usually are.
#[derive(Debug, Deserialize)]
struct Transfer {
    to: String,
    amount: u64,
}

mod axum_app {
    use super::*;
    use axum::Json;
    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use axum::routing::post;
    use distlock::{distributed_lock, idempotent};

    #[idempotent(header = "Idempotency-Key", scope = "<user>", client = app.locks)]
    async fn orders(
        State(app): State<App>,
        Path(user): Path<u64>,
        Json(order): Json<Order>,
    ) -> impl IntoResponse {
        let n = app.bump("orders");
        (
            StatusCode::CREATED,
            [
                ("set-cookie", "session=abc".to_owned()),
                ("x-order-id", format!("o-{n}")),
            ],
            Json(serde_json::json!({ "user": user, "sku": order.sku, "qty": order.qty, "n": n })),
        )
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn slow(State(app): State<App>) -> String {
        let n = app.bump("slow");
        tokio::time::sleep(Duration::from_millis(300)).await;
        format!("slow run {n}")
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn steady(State(app): State<App>) -> String {
        let n = app.bump("steady");
        tokio::time::sleep(STEADY).await;
        format!("steady run {n}")
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks, wait = "5s")]
    async fn wait(State(app): State<App>) -> String {
        let n = app.bump("wait");
        tokio::time::sleep(Duration::from_millis(300)).await;
        format!("wait run {n}")
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn flaky(State(app): State<App>) -> (StatusCode, String) {
        match app.bump("flaky") {
            1 => (StatusCode::SERVICE_UNAVAILABLE, "try again".into()),
            n => (StatusCode::CREATED, format!("flaky run {n}")),
        }
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn conflict(State(app): State<App>) -> (StatusCode, String) {
        match app.bump("conflict") {
            1 => (StatusCode::CONFLICT, "busy".into()),
            n => (StatusCode::OK, format!("conflict run {n}")),
        }
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks, max_body = "1KiB")]
    async fn big(State(app): State<App>) -> String {
        let n = app.bump("big");
        format!("{n}").repeat(4096)
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn binary(
        State(app): State<App>,
    ) -> (
        [(axum::http::HeaderName, axum::http::HeaderValue); 1],
        Vec<u8>,
    ) {
        let n = app.bump("binary") as u8;
        // A header value that is not UTF-8 (obs-text): replayed byte for byte.
        let latin1 = axum::http::HeaderValue::from_bytes(b"caf\xe9").unwrap();
        (
            [(axum::http::HeaderName::from_static("x-name"), latin1)],
            vec![0xff, 0x00, n, 0x80],
        )
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn busy(State(app): State<App>) -> Result<String, distlock::Error> {
        match app.bump("busy") {
            1 => Err(busy_error()),
            n => Ok(format!("busy run {n}")),
        }
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks, required = false)]
    async fn optional(State(app): State<App>) -> String {
        format!("optional run {}", app.bump("optional"))
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn transfer(
        State(app): State<App>,
        Path(from): Path<String>,
        Json(t): Json<Transfer>,
    ) -> String {
        let n = app.bump("transfer");
        format!("transfer {n}: {} from {from} to {}", t.amount, t.to)
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn upload(State(app): State<App>, body: axum::body::Bytes) -> String {
        format!("upload {}: {} bytes", app.bump("upload"), body.len())
    }

    /// Reads the body itself, as a stream.
    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn raw(State(app): State<App>, body: axum::body::Body) -> String {
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        format!("raw {}: {} bytes", app.bump("raw"), bytes.len())
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn echo(State(app): State<App>, Json(v): Json<serde_json::Value>) -> String {
        format!("echo {}: {v}", app.bump("echo"))
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn page(State(app): State<App>) -> String {
        format!("page {}", app.bump("page"))
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn events(State(app): State<App>) -> axum::response::Response {
        let n = app.bump("events");
        (
            [("content-type", "text/event-stream")],
            axum::body::Body::from_stream(two_events(n)),
        )
            .into_response()
    }

    /// The body of both attribute orders below: one sale, counted.
    async fn sell_one(app: &App, sku: u32, buy: &Buy) -> (StatusCode, String) {
        app.bump("stock");
        match app.take_one(sku, &buy.order).await {
            Some(left) => (
                StatusCode::CREATED,
                format!("{} bought; {left} left", buy.order),
            ),
            None => (StatusCode::GONE, "sold out".into()),
        }
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    #[distributed_lock(key = "stock:<sku>", client = app.locks, wait = "5s")]
    async fn stock_idem_outer(
        State(app): State<App>,
        Path(sku): Path<u32>,
        Json(buy): Json<Buy>,
    ) -> Result<(StatusCode, String), distlock::Error> {
        Ok(sell_one(&app, sku, &buy).await)
    }

    #[distributed_lock(key = "stock:<sku>", client = app.locks, wait = "5s")]
    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn stock_lock_outer(
        State(app): State<App>,
        Path(sku): Path<u32>,
        Json(buy): Json<Buy>,
    ) -> Result<(StatusCode, String), distlock::Error> {
        Ok(sell_one(&app, sku, &buy).await)
    }

    /// A 100 ms timeout around the handler, as a timeout layer would put it.
    async fn timeout_100ms(
        req: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        match tokio::time::timeout(Duration::from_millis(100), next.run(req)).await {
            Ok(res) => res,
            Err(_) => StatusCode::GATEWAY_TIMEOUT.into_response(),
        }
    }

    pub(super) async fn start(app: App) -> SocketAddr {
        let router = axum::Router::new()
            .route(
                "/slow-timed",
                post(slow).layer(axum::middleware::from_fn(timeout_100ms)),
            )
            .route("/orders/{user}", post(orders))
            .route("/transfer/{from}", post(transfer))
            .route("/upload", post(upload))
            .route(
                "/limited",
                post(upload).layer(axum::extract::DefaultBodyLimit::max(64)),
            )
            .route("/raw", post(raw))
            .route("/echo", post(echo))
            .route("/page", axum::routing::get(page))
            .route("/events", post(events))
            .route("/slow", post(slow))
            .route("/steady", post(steady))
            .route("/wait", post(wait))
            .route("/flaky", post(flaky))
            .route("/conflict", post(conflict))
            .route("/big", post(big))
            .route("/binary", post(binary))
            .route("/optional", post(optional))
            .route("/busy", post(busy))
            .route("/stock-a/{sku}", post(stock_idem_outer))
            .route("/stock-b/{sku}", post(stock_lock_outer))
            .with_state(app);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        addr
    }
}

mod actix_app {
    use super::*;
    use actix_web::{HttpResponse, web};
    use distlock::{distributed_lock, idempotent};

    #[idempotent(header = "Idempotency-Key", scope = "<user>", client = app.locks)]
    async fn orders(
        app: web::Data<App>,
        user: web::Path<u64>,
        web::Json(order): web::Json<Order>,
    ) -> HttpResponse {
        let n = app.bump("orders");
        HttpResponse::Created()
            .insert_header(("set-cookie", "session=abc"))
            .insert_header(("x-order-id", format!("o-{n}")))
            .json(serde_json::json!({ "user": *user, "sku": order.sku, "qty": order.qty, "n": n }))
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn slow(app: web::Data<App>) -> String {
        let n = app.bump("slow");
        tokio::time::sleep(Duration::from_millis(300)).await;
        format!("slow run {n}")
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn steady(app: web::Data<App>) -> String {
        let n = app.bump("steady");
        tokio::time::sleep(STEADY).await;
        format!("steady run {n}")
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks, wait = "5s")]
    async fn wait(app: web::Data<App>) -> String {
        let n = app.bump("wait");
        tokio::time::sleep(Duration::from_millis(300)).await;
        format!("wait run {n}")
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn flaky(app: web::Data<App>) -> HttpResponse {
        match app.bump("flaky") {
            1 => HttpResponse::ServiceUnavailable().body("try again"),
            n => HttpResponse::Created().body(format!("flaky run {n}")),
        }
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn conflict(app: web::Data<App>) -> HttpResponse {
        match app.bump("conflict") {
            1 => HttpResponse::Conflict().body("busy"),
            n => HttpResponse::Ok().body(format!("conflict run {n}")),
        }
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks, max_body = "1KiB")]
    async fn big(app: web::Data<App>) -> HttpResponse {
        let n = app.bump("big");
        HttpResponse::Ok().body(format!("{n}").repeat(4096))
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn binary(app: web::Data<App>) -> HttpResponse {
        let n = app.bump("binary") as u8;
        let latin1 = actix_web::http::header::HeaderValue::from_bytes(b"caf\xe9").unwrap();
        HttpResponse::Ok()
            .content_type("application/octet-stream")
            .insert_header(("x-name", latin1))
            .body(vec![0xff, 0x00, n, 0x80])
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn busy(app: web::Data<App>) -> Result<String, distlock::Error> {
        match app.bump("busy") {
            1 => Err(busy_error()),
            n => Ok(format!("busy run {n}")),
        }
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks, required = false)]
    async fn optional(app: web::Data<App>) -> String {
        format!("optional run {}", app.bump("optional"))
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn transfer(
        web::Json(t): web::Json<Transfer>,
        from: web::Path<String>,
        app: web::Data<App>,
    ) -> String {
        let n = app.bump("transfer");
        format!("transfer {n}: {} from {from} to {}", t.amount, t.to)
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn upload(body: web::Bytes, app: web::Data<App>) -> String {
        format!("upload {}: {} bytes", app.bump("upload"), body.len())
    }

    /// Reads the body itself, as a stream.
    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn raw(body: web::Payload, app: web::Data<App>) -> String {
        let bytes = body.to_bytes().await.unwrap();
        format!("raw {}: {} bytes", app.bump("raw"), bytes.len())
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn echo(app: web::Data<App>, web::Json(v): web::Json<serde_json::Value>) -> String {
        format!("echo {}: {v}", app.bump("echo"))
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn page(app: web::Data<App>) -> String {
        format!("page {}", app.bump("page"))
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn events(app: web::Data<App>) -> HttpResponse {
        let n = app.bump("events");
        HttpResponse::Ok()
            .content_type("text/event-stream")
            .streaming(two_events(n))
    }

    /// The body of both attribute orders below: one sale, counted.
    async fn sell_one(app: &App, sku: u32, buy: &Buy) -> HttpResponse {
        app.bump("stock");
        match app.take_one(sku, &buy.order).await {
            Some(left) => {
                HttpResponse::Created().body(format!("{} bought; {left} left", buy.order))
            }
            None => HttpResponse::Gone().body("sold out"),
        }
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    #[distributed_lock(key = "stock:<sku.0>", client = app.locks, wait = "5s")]
    async fn stock_idem_outer(
        app: web::Data<App>,
        sku: web::Path<(u32,)>,
        web::Json(buy): web::Json<Buy>,
    ) -> Result<HttpResponse, distlock::Error> {
        Ok(sell_one(&app, sku.0, &buy).await)
    }

    #[distributed_lock(key = "stock:<sku.0>", client = app.locks, wait = "5s")]
    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn stock_lock_outer(
        app: web::Data<App>,
        sku: web::Path<(u32,)>,
        web::Json(buy): web::Json<Buy>,
    ) -> Result<HttpResponse, distlock::Error> {
        Ok(sell_one(&app, sku.0, &buy).await)
    }

    /// A 100 ms timeout around the handler, as a timeout middleware would put it.
    async fn timeout_100ms(
        req: actix_web::dev::ServiceRequest,
        next: actix_web::middleware::Next<actix_web::body::BoxBody>,
    ) -> Result<actix_web::dev::ServiceResponse<actix_web::body::BoxBody>, actix_web::Error> {
        let http = req.request().clone();
        match tokio::time::timeout(Duration::from_millis(100), next.call(req)).await {
            Ok(res) => res,
            Err(_) => Ok(actix_web::dev::ServiceResponse::new(
                http,
                HttpResponse::GatewayTimeout().finish(),
            )),
        }
    }

    /// Runs the server on its own thread and actix system; it ends with the test process.
    pub(super) fn start(app: App) -> SocketAddr {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let server = actix_web::HttpServer::new(move || {
                    actix_web::App::new()
                        .app_data(web::Data::new(app.clone()))
                        .route("/orders/{user}", web::post().to(orders))
                        .route("/transfer/{from}", web::post().to(transfer))
                        .route("/upload", web::post().to(upload))
                        .route("/raw", web::post().to(raw))
                        .route("/echo", web::post().to(echo))
                        .route("/events", web::post().to(events))
                        .route(
                            "/page",
                            web::route()
                                .guard(
                                    actix_web::guard::Any(actix_web::guard::Get())
                                        .or(actix_web::guard::Head()),
                                )
                                .to(page),
                        )
                        .route("/slow", web::post().to(slow))
                        .service(
                            web::resource("/slow-timed")
                                .wrap(actix_web::middleware::from_fn(timeout_100ms))
                                .route(web::post().to(slow)),
                        )
                        .route("/steady", web::post().to(steady))
                        .route("/wait", web::post().to(wait))
                        .route("/flaky", web::post().to(flaky))
                        .route("/conflict", web::post().to(conflict))
                        .route("/big", web::post().to(big))
                        .route("/binary", web::post().to(binary))
                        .route("/optional", web::post().to(optional))
                        .route("/busy", web::post().to(busy))
                        .route("/stock-a/{sku}", web::post().to(stock_idem_outer))
                        .route("/stock-b/{sku}", web::post().to(stock_lock_outer))
                })
                .workers(2)
                .bind(("127.0.0.1", 0))
                .unwrap();
                tx.send(server.addrs()[0]).unwrap();
                server.run().await.unwrap();
            });
        });
        rx.recv_timeout(Duration::from_secs(30)).unwrap()
    }
}

struct Harness {
    redis: RedisServer,
    app: App,
    addr: SocketAddr,
}

impl Harness {
    async fn new(actix: bool) -> Harness {
        let redis = RedisServer::start();
        let locks = Locks::connect(&redis.url()).await.unwrap();
        let app = App::new(locks);
        let addr = if actix {
            actix_app::start(app.clone())
        } else {
            axum_app::start(app.clone()).await
        };
        Harness { redis, app, addr }
    }

    async fn keys(&self) -> Vec<String> {
        let mut conn = self.redis.raw().await;
        let mut keys: Vec<String> = conn.keys("*").await.unwrap();
        keys.sort();
        keys
    }
}

macro_rules! both_frameworks {
    ($($name:ident),* $(,)?) => {
        mod on_axum {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Harness::new(false).await).await;
                }
            )*
        }
        mod on_actix {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Harness::new(true).await).await;
                }
            )*
        }
    };
}

both_frameworks!(
    replay_is_identical_to_the_first_response,
    bad_headers_are_400_and_store_nothing,
    different_payload_is_422_and_reordered_fields_replay,
    fifty_concurrent_requests_run_the_body_once,
    wait_returns_the_stored_response,
    server_errors_and_retryable_statuses_are_not_stored,
    large_bodies_are_returned_not_stored_binary_bodies_replay,
    missing_header_with_required_false_runs_without_idempotency,
    lock_and_idempotency_work_in_either_order,
    distlock_errors_are_problem_responses_and_not_stored,
    retry_after_is_how_long_such_a_body_takes,
    caller_that_goes_away_does_not_cause_a_second_run,
    the_request_body_is_the_payload_whatever_its_type,
    equal_requests_have_one_fingerprint,
    only_unsafe_methods_are_recorded,
    streaming_responses_pass_through_at_once,
    connections_killed_while_the_body_runs_lose_nothing,
    a_redis_outage_is_503_then_the_retry_runs_once,
);

/// axum: the body is read within `DefaultBodyLimit`, as `Bytes` reads it: past the limit
/// 413 before anything is claimed; control: a body within it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_bodies_past_the_body_limit_are_413_and_claim_nothing() {
    let h = Harness::new(false).await;
    let big = "x".repeat(200);
    let res = post(h.addr, "/limited", Some("over-limit"), &big).await;
    assert_eq!(res.status, 413, "{}", res.text());
    assert!(
        h.keys().await.is_empty(),
        "nothing claimed: {:?}",
        h.keys().await
    );
    let res = post(h.addr, "/limited", Some("in-limit"), "small").await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.text(), "upload 1: 5 bytes");
}

/// Raw request headers.
type Headers<'a> = Vec<(&'a str, &'a [u8])>;

/// How long the `/steady` handler takes.
const STEADY: Duration = Duration::from_millis(1300);

const ORDER: &str = r#"{"sku":"a-1","qty":2,"ship":{"city":"Oslo","zip":"0150"}}"#;

async fn replay_is_identical_to_the_first_response(h: Harness) {
    let first = post(h.addr, "/orders/7", Some("k-1"), ORDER).await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(first.header("set-cookie"), Some("session=abc"));
    assert_eq!(first.header("x-order-id"), Some("o-1"));
    assert_eq!(first.header("idempotent-replayed"), None);
    for _ in 0..3 {
        let again = post(h.addr, "/orders/7", Some("k-1"), ORDER).await;
        assert_eq!(again.status, first.status);
        assert_eq!(again.body, first.body, "same body bytes");
        assert_eq!(
            again.stable_headers(),
            first.stable_headers(),
            "same stored headers"
        );
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(
            again.header("set-cookie"),
            None,
            "Set-Cookie is never replayed"
        );
    }
    assert_eq!(h.app.runs("orders"), 1);
    // The record is a plain UTF-8 value, namespaced by function and scope: the claim's
    // in-progress record, then the completed one the store appended.
    let keys = h.keys().await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(
        keys[0].starts_with("lock:idem:suite::idempotent_http::")
            && keys[0].ends_with("::orders:7:k-1"),
        "{keys:?}"
    );
    let mut conn = h.redis.raw().await;
    let raw: String = conn.get(&keys[0]).await.unwrap();
    let parts: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&raw)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(parts.len(), 2, "{raw}");
    assert_eq!(parts[0]["status"], "in_progress");
    let rec = &parts[1];
    assert_eq!(rec["status"], "completed");
    assert_eq!(rec["fp"], parts[0]["fp"]);
    assert_eq!(rec["response"]["status"], 201);
    assert!(!raw.contains("session=abc"), "{raw}");
    let ttl: i64 = conn.pttl(&keys[0]).await.unwrap();
    assert!(ttl > 23 * 3_600_000, "retention is 24 h by default: {ttl}");
    // Another user (scope) with the same key is another record.
    let other = post(h.addr, "/orders/8", Some("k-1"), ORDER).await;
    assert_eq!(other.status, 201);
    assert_eq!(other.header("idempotent-replayed"), None);
    assert_eq!(h.app.runs("orders"), 2);
}

async fn bad_headers_are_400_and_store_nothing(h: Harness) {
    let long = "a".repeat(256);
    let cases: Vec<(&str, Headers, &str)> = vec![
        ("missing", vec![], "requires an `Idempotency-Key` header"),
        ("empty", vec![("Idempotency-Key", b"")], "is empty"),
        (
            "too long",
            vec![("Idempotency-Key", long.as_bytes())],
            "256 bytes long; at most 255",
        ),
        (
            "space",
            vec![("Idempotency-Key", b"a b")],
            "a space at byte 1",
        ),
        ("tab", vec![("Idempotency-Key", b"a\tb")], "a tab at byte 1"),
        (
            "non-ASCII",
            vec![("Idempotency-Key", "cl\u{e9}".as_bytes())],
            "non-ASCII byte (0xC3) at byte 2",
        ),
        (
            "two headers",
            vec![("Idempotency-Key", b"a"), ("Idempotency-Key", b"b")],
            "2 `Idempotency-Key` headers",
        ),
        // The servers' HTTP parsers reject these before any handler runs (the handler
        // would reject them too, see the unit tests of `header_key`).
        ("DEL", vec![("Idempotency-Key", b"a\x7f")], ""),
        ("CR LF", vec![("Idempotency-Key", b"a\r\nb")], ""),
        ("bare LF", vec![("Idempotency-Key", b"a\nb")], ""),
    ];
    for (label, headers, says) in &cases {
        let r = send(h.addr, "POST", "/orders/7", headers, ORDER.as_bytes()).await;
        assert_eq!(r.status, 400, "{label}: {}", r.text());
        if !says.is_empty() {
            assert_eq!(
                r.header("content-type"),
                Some("application/problem+json"),
                "{label}"
            );
            let problem: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(problem["status"], 400, "{label}");
            let detail = problem["detail"].as_str().unwrap();
            assert!(detail.contains(says), "{label}: {detail}");
        }
    }
    assert_eq!(h.app.runs("orders"), 0, "no bad request ran the body");
    assert_eq!(
        h.keys().await,
        Vec::<String>::new(),
        "Redis holds no record"
    );
    // The largest valid key works.
    let ok = post(h.addr, "/orders/7", Some(&"a".repeat(255)), ORDER).await;
    assert_eq!(ok.status, 201);
}

async fn different_payload_is_422_and_reordered_fields_replay(h: Harness) {
    let first = post(h.addr, "/orders/7", Some("k-2"), ORDER).await;
    assert_eq!(first.status, 201);
    let reordered = r#"{ "ship": {"zip": "0150", "city": "Oslo"},
                         "qty": 2, "sku": "a-1" }"#;
    let again = post(h.addr, "/orders/7", Some("k-2"), reordered).await;
    assert_eq!(again.status, 201, "{}", again.text());
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    let changed = ORDER.replace("\"qty\":2", "\"qty\":3");
    let r = post(h.addr, "/orders/7", Some("k-2"), &changed).await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    // The query string is part of the payload too.
    let r = post(h.addr, "/orders/7?coupon=x", Some("k-2"), ORDER).await;
    assert_eq!(r.status, 422);
    assert_eq!(h.app.runs("orders"), 1, "a mismatch never runs the body");
}

async fn fifty_concurrent_requests_run_the_body_once(h: Harness) {
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let addr = h.addr;
        tasks.push(tokio::spawn(async move {
            post(addr, "/slow", Some("same"), "").await
        }));
    }
    let mut ok: Vec<Resp> = Vec::new();
    let mut conflicts = 0;
    for t in tasks {
        let r = t.await.unwrap();
        match r.status {
            200 => ok.push(r),
            409 => {
                let after: u64 = r.header("retry-after").unwrap().parse().unwrap();
                assert!((1..=30).contains(&after));
                conflicts += 1;
            }
            other => panic!("unexpected {other}: {}", r.text()),
        }
    }
    assert_eq!(h.app.runs("slow"), 1, "the body ran exactly once");
    assert!(!ok.is_empty());
    assert!(ok.iter().all(|r| r.body == ok[0].body));
    assert_eq!(ok[0].text(), "slow run 1");
    let replay = post(h.addr, "/slow", Some("same"), "").await;
    assert_eq!(replay.body, ok[0].body);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    println!(
        "50 concurrent requests: 1 run, {} x 200, {conflicts} x 409",
        ok.len()
    );
}

async fn wait_returns_the_stored_response(h: Harness) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let addr = h.addr;
        tasks.push(tokio::spawn(async move {
            post(addr, "/wait", Some("w"), "").await
        }));
    }
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.text(), "wait run 1");
    }
    assert_eq!(h.app.runs("wait"), 1);
    assert!(started.elapsed() < Duration::from_secs(3));
}

async fn server_errors_and_retryable_statuses_are_not_stored(h: Harness) {
    let r = post(h.addr, "/flaky", Some("f"), "").await;
    assert_eq!(r.status, 503);
    let r = post(h.addr, "/flaky", Some("f"), "").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (201, "flaky run 2"),
        "5xx released the claim"
    );
    let r = post(h.addr, "/flaky", Some("f"), "").await;
    assert_eq!(r.header("idempotent-replayed"), Some("true"));
    assert_eq!(h.app.runs("flaky"), 2);

    let r = post(h.addr, "/conflict", Some("c"), "").await;
    assert_eq!(r.status, 409);
    let r = post(h.addr, "/conflict", Some("c"), "").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "conflict run 2"),
        "409 is not stored"
    );
    assert_eq!(h.app.runs("conflict"), 2);
}

async fn large_bodies_are_returned_not_stored_binary_bodies_replay(h: Harness) {
    let r = post(h.addr, "/big", Some("b"), "").await;
    assert_eq!((r.status, r.body.len()), (200, 4096), "returned in full");
    let r = post(h.addr, "/big", Some("b"), "").await;
    assert_eq!(r.header("idempotent-replayed"), None, "not stored");
    assert_eq!(h.app.runs("big"), 2);

    let first = post(h.addr, "/binary", Some("bin"), "").await;
    assert_eq!(first.body, [0xff, 0x00, 1, 0x80]);
    let again = post(h.addr, "/binary", Some("bin"), "").await;
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert!(
        first.header("x-name").is_some(),
        "a header that is not UTF-8"
    );
    assert_eq!(again.stable_headers(), first.stable_headers());
}

async fn missing_header_with_required_false_runs_without_idempotency(h: Harness) {
    for n in 1..=2 {
        let r = post(h.addr, "/optional", None, "").await;
        assert_eq!(r.text(), format!("optional run {n}"));
    }
    assert_eq!(
        h.keys().await,
        Vec::<String>::new(),
        "keyless requests share no record"
    );
    let a = post(h.addr, "/optional", Some("o"), "").await;
    let b = post(h.addr, "/optional", Some("o"), "").await;
    assert_eq!(a.body, b.body);
    assert_eq!(b.header("idempotent-replayed"), Some("true"));
    assert_eq!(h.app.runs("optional"), 3);
}

async fn lock_and_idempotency_work_in_either_order(h: Harness) {
    for (path, sku) in [("/stock-a/1", 1), ("/stock-b/2", 2)] {
        h.app.sold.lock().unwrap().clear();
        // 8 buyers for 5 items; each sends its order 3 times at once (double clicks).
        let mut tasks = Vec::new();
        for buyer in 0..8 {
            for _ in 0..3 {
                let addr = h.addr;
                let body = format!(r#"{{"order":"order-{buyer}"}}"#);
                let key = format!("buy-{sku}-{buyer}");
                tasks.push(tokio::spawn(async move {
                    post(addr, path, Some(&key), &body).await
                }));
            }
        }
        let mut statuses = BTreeMap::new();
        for t in tasks {
            *statuses.entry(t.await.unwrap().status).or_insert(0) += 1;
        }
        assert_eq!(
            h.app.stock.lock().await[&sku],
            0,
            "{path}: never oversold ({statuses:?})"
        );
        let mut sold = h.app.sold.lock().unwrap().clone();
        assert_eq!(sold.len(), 5, "{path}: {sold:?}");
        sold.sort();
        sold.dedup();
        assert_eq!(sold.len(), 5, "{path}: no order was served twice");
        assert!(
            statuses.keys().all(|s| [201, 409, 410].contains(s)),
            "{path}: {statuses:?}"
        );
        // A repeat of a completed order is answered from the record without the lock.
        let guard = h
            .app
            .locks
            .lock(format!("stock:{sku}"))
            .acquire()
            .await
            .unwrap();
        let buyer = sold[0].trim_start_matches("order-");
        let r = post(
            h.addr,
            path,
            Some(&format!("buy-{sku}-{buyer}")),
            &format!(r#"{{"order":"order-{buyer}"}}"#),
        )
        .await;
        assert_eq!(r.status, 201, "{path}: {}", r.text());
        assert_eq!(r.header("idempotent-replayed"), Some("true"));
        guard.release().await.unwrap();
    }
}

async fn distlock_errors_are_problem_responses_and_not_stored(h: Harness) {
    // `distlock::Error` as the handler's error: `IntoResponse` / `ResponseError`.
    let r = post(h.addr, "/busy", Some("z"), "").await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.header("retry-after"), Some("1"));
    let problem: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(problem["type"], "urn:distlock:problem:busy");
    assert!(
        !r.text().contains("lock:stock"),
        "no Redis key in public errors"
    );
    // 503 released the claim: the retry runs the body and is stored.
    let r = post(h.addr, "/busy", Some("z"), "").await;
    assert_eq!((r.status, r.text().as_str()), (200, "busy run 2"));
    let r = post(h.addr, "/busy", Some("z"), "").await;
    assert_eq!(r.header("idempotent-replayed"), Some("true"));
    assert_eq!(h.app.runs("busy"), 2);
}

/// A repeat that arrives while the first call runs gets `Retry-After` of about how long
/// such a body takes, not the 30 s lease left: 1 s before any body of the fn completed,
/// then the 1.3 s the handler takes, rounded up.
async fn retry_after_is_how_long_such_a_body_takes(h: Harness) {
    async fn conflict_after(h: &Harness, key: &str) -> (Option<String>, Resp) {
        let first = tokio::spawn({
            let (addr, key) = (h.addr, key.to_owned());
            async move { post(addr, "/steady", Some(&key), "").await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let repeat = post(h.addr, "/steady", Some(key), "").await;
        assert_eq!(repeat.status, 409, "{}", repeat.text());
        let after = repeat.header("retry-after").map(str::to_owned);
        let first = first.await.unwrap();
        assert_eq!(first.status, 200);
        (after, first)
    }
    let (after, _) = conflict_after(&h, "steady-1").await;
    assert_eq!(
        after.as_deref(),
        Some("1"),
        "nothing known yet: 1 s, not the lease"
    );
    let (after, _) = conflict_after(&h, "steady-2").await;
    assert_eq!(after.as_deref(), Some("2"), "a body takes 1.3 s");
    assert_eq!(h.app.runs("steady"), 2);
}

/// The caller goes away while the 300 ms body runs: the client closes its connection
/// (axum then drops the handler's future; actix-web lets it run), or a 100 ms timeout
/// around the handler fires. The body still runs to its end and its response is stored:
/// the retry gets it, and the body ran once.
async fn caller_that_goes_away_does_not_cause_a_second_run(h: Harness) {
    let gone = tokio::time::timeout(
        Duration::from_millis(100),
        post(h.addr, "/slow", Some("gone-1"), "{}"),
    )
    .await;
    assert!(gone.is_err(), "the client left before the response");
    let timed_out = post(h.addr, "/slow-timed", Some("gone-2"), "{}").await;
    assert_eq!(timed_out.status, 504, "{}", timed_out.text());
    for (path, key, run) in [("/slow", "gone-1", 1), ("/slow-timed", "gone-2", 2)] {
        let deadline = Instant::now() + Duration::from_secs(5);
        let again = loop {
            let r = post(h.addr, path, Some(key), "{}").await;
            if r.status != 409 {
                break r;
            }
            assert!(
                Instant::now() < deadline,
                "{key}: still in progress after 5 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(again.status, 200, "{key}: {}", again.text());
        assert_eq!(
            again.text(),
            format!("slow run {run}"),
            "{key}: the first run's response"
        );
    }
    assert_eq!(h.app.runs("slow"), 2, "each body ran once");
}

/// The app's connections to Redis are killed (`CLIENT KILL TYPE normal`) while a claimed
/// 300 ms body runs. A repeat sent right after is not a 503 and does not run the body:
/// 409 while the body runs (or, on a slow machine, the first response replayed), its
/// claim going over a new connection; the holder's store goes over a new connection too,
/// so its response is kept: the replay gets it, and the body ran once.
async fn connections_killed_while_the_body_runs_lose_nothing(h: Harness) {
    let addr = h.addr;
    let first = tokio::spawn(async move { post(addr, "/slow", Some("killed-1"), "{}").await });
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.app.runs("slow") == 0 {
        assert!(Instant::now() < deadline, "the body never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut raw = h.redis.raw().await;
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(killed >= 1, "the app's connections were killed");
    let repeat = post(h.addr, "/slow", Some("killed-1"), "{}").await;
    assert!(
        repeat.status == 409 || (repeat.status == 200 && repeat.text() == "slow run 1"),
        "{} {}",
        repeat.status,
        repeat.text()
    );
    let first = first.await.unwrap();
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.text(), "slow run 1");
    let replay = post(h.addr, "/slow", Some("killed-1"), "{}").await;
    assert_eq!(replay.status, 200, "{}", replay.text());
    assert_eq!(replay.text(), "slow run 1");
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(h.app.runs("slow"), 1, "the body ran once");
}

/// Redis down: a call is a 503 with `Retry-After: 1` at once (the connection is
/// refused; a hung Redis would take the 1 s command timeout), and its body does not run. Once Redis is back (restarted, empty), the retry runs the
/// body, once, and its replay is the stored response.
async fn a_redis_outage_is_503_then_the_retry_runs_once(mut h: Harness) {
    h.redis.kill();
    let started = Instant::now();
    let down = post(h.addr, "/orders/1", Some("outage-1"), ORDER).await;
    assert_eq!(down.status, 503, "{}", down.text());
    assert_eq!(down.header("retry-after"), Some("1"));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "an outage must not hang: {:?}",
        started.elapsed()
    );
    assert_eq!(h.app.runs("orders"), 0, "no body runs without its claim");
    h.redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        let r = post(h.addr, "/orders/1", Some("outage-1"), ORDER).await;
        if r.status != 503 {
            break r;
        }
        assert!(Instant::now() < deadline, "Redis is back: {}", r.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(again.status, 201, "{}", again.text());
    let replay = post(h.addr, "/orders/1", Some("outage-1"), ORDER).await;
    assert_eq!(replay.status, 201, "{}", replay.text());
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.body, again.body);
    assert_eq!(h.app.runs("orders"), 1, "the body ran once");
}

/// The body is part of the payload even when the handler's type for it is not
/// `Serialize` (`Json<T>` with a `Deserialize`-only `T`, raw `Bytes`): a different body
/// under the same key is 422, and the body does not run again. So is another path.
async fn the_request_body_is_the_payload_whatever_its_type(h: Harness) {
    let to_bob = r#"{"to":"bob","amount":100}"#;
    let first = post(h.addr, "/transfer/alice", Some("t-1"), to_bob).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.text(), "transfer 1: 100 from alice to bob");
    let again = post(
        h.addr,
        "/transfer/alice",
        Some("t-1"),
        r#"{"amount":100, "to":"bob"}"#,
    )
    .await;
    assert_eq!(
        again.text(),
        first.text(),
        "the same body, reordered: replayed"
    );
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    let to_eve = post(
        h.addr,
        "/transfer/alice",
        Some("t-1"),
        r#"{"to":"eve","amount":100}"#,
    )
    .await;
    assert_eq!(to_eve.status, 422, "another recipient: {}", to_eve.text());
    let from_carol = post(h.addr, "/transfer/carol", Some("t-1"), to_bob).await;
    assert_eq!(
        from_carol.status,
        422,
        "another path: {}",
        from_carol.text()
    );
    assert_eq!(h.app.runs("transfer"), 1);

    let up = |body: &'static [u8]| {
        send(
            h.addr,
            "POST",
            "/upload",
            &[("Idempotency-Key", b"u-1")],
            body,
        )
    };
    assert_eq!(up(b"\x00\x01abc").await.text(), "upload 1: 5 bytes");
    assert_eq!(
        up(b"\x00\x01abc").await.header("idempotent-replayed"),
        Some("true")
    );
    assert_eq!(up(b"\x00\x02abc").await.status, 422, "other bytes");
    assert_eq!(h.app.runs("upload"), 1);

    // A form sent again (a double click, a rebuilt retry) has a new random boundary:
    // the same parts are the same payload, other parts another.
    let form = |boundary: &str, file: &str| {
        let body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"doc\"; filename=\"a.txt\"\r\n\
             Content-Type: text/plain\r\n\r\n{file}\r\n--{boundary}--\r\n"
        );
        let ct = format!("multipart/form-data; boundary={boundary}");
        async move {
            send(
                h.addr,
                "POST",
                "/upload",
                &[("Idempotency-Key", b"m-1"), ("Content-Type", ct.as_bytes())],
                body.as_bytes(),
            )
            .await
        }
    };
    let first = form("----b1", "file bytes").await;
    assert_eq!(first.status, 200, "{}", first.text());
    let again = form("----b2", "file bytes").await;
    assert_eq!(again.status, 200, "another boundary: {}", again.text());
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        form("----b3", "other file").await.status,
        422,
        "another file"
    );
    assert_eq!(h.app.runs("upload"), 2);

    let raw =
        |body: &'static [u8]| send(h.addr, "POST", "/raw", &[("Idempotency-Key", b"r-1")], body);
    assert_eq!(raw(b"streamed").await.text(), "raw 1: 8 bytes");
    assert_eq!(
        raw(b"streamed").await.header("idempotent-replayed"),
        Some("true")
    );
    assert_eq!(
        raw(b"streaMed").await.status,
        422,
        "a body the handler streams itself"
    );
    assert_eq!(h.app.runs("raw"), 1);
}

/// One value, one fingerprint: numbers equal as JSON numbers, and a percent-encoded query
/// and its decoded form, replay instead of answering 422; two values are two, also where
/// they round to one `f64` or differ only in the order of a repeated query name.
async fn equal_requests_have_one_fingerprint(h: Harness) {
    let first = post(
        h.addr,
        "/echo?a=%41&b=x+y",
        Some("e-1"),
        r#"{"n":100,"m":[1,0]}"#,
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text());
    for (path, body) in [
        ("/echo?a=%41&b=x+y", r#"{"m":[1.0,-0],"n":1e2}"#),
        ("/echo?b=x%20y&a=A", r#"{"n":100,"m":[1,0]}"#),
    ] {
        let again = post(h.addr, path, Some("e-1"), body).await;
        assert_eq!(again.status, 200, "{path} {body}: {}", again.text());
        assert_eq!(
            again.header("idempotent-replayed"),
            Some("true"),
            "{path} {body}"
        );
        assert_eq!(again.body, first.body);
    }
    for (path, body, what) in [
        (
            "/echo?a=B&b=x+y",
            r#"{"n":100,"m":[1,0]}"#,
            "another query value",
        ),
        (
            "/echo?a=%41&b=x+y",
            r#"{"n":100.5,"m":[1,0]}"#,
            "another number",
        ),
    ] {
        let other = post(h.addr, path, Some("e-1"), body).await;
        assert_eq!(other.status, 422, "{what}");
    }
    assert_eq!(h.app.runs("echo"), 1);
    // Numbers a `u128` or a decimal reads apart are apart, though the same `f64`; the
    // values of a repeated query name keep their order (`Query<HashMap>` keeps the last).
    for (key, first, second, what) in [
        (
            "e-2",
            ("/echo", r#"{"amount":18446744073709551616}"#),
            ("/echo", r#"{"amount":18446744073709551617}"#),
            "beyond u64",
        ),
        (
            "e-3",
            ("/echo", r#"{"amount":0.1}"#),
            ("/echo", r#"{"amount":0.10000000000000000001}"#),
            "beyond f64's digits",
        ),
        (
            "e-4",
            ("/echo?amount=1&amount=100", "{}"),
            ("/echo?amount=100&amount=1", "{}"),
            "repeated query values reordered",
        ),
    ] {
        let one = post(h.addr, first.0, Some(key), first.1).await;
        assert_eq!(one.status, 200, "{what}: {}", one.text());
        let other = post(h.addr, second.0, Some(key), second.1).await;
        assert_eq!(other.status, 422, "{what}: {}", other.text());
    }
    assert_eq!(h.app.runs("echo"), 4);
}

/// `HEAD` and `GET` are not recorded: each runs the handler, and nothing is stored (a
/// `HEAD` is never replayed as a `GET`, nor a `GET` as the next `GET`).
async fn only_unsafe_methods_are_recorded(h: Harness) {
    let key: &[u8] = b"p-1";
    let head = send(h.addr, "HEAD", "/page", &[("Idempotency-Key", key)], b"").await;
    assert_eq!(head.status, 200);
    let get = send(h.addr, "GET", "/page", &[("Idempotency-Key", key)], b"").await;
    assert_eq!(get.status, 200, "{}", get.text());
    assert_eq!(get.text(), "page 2");
    assert_eq!(get.header("idempotent-replayed"), None);
    assert_eq!(h.app.runs("page"), 2);
    assert!(
        h.keys().await.is_empty(),
        "nothing stored: {:?}",
        h.keys().await
    );
}

/// A response of unknown length (server-sent events) passes through as it comes: the
/// first event arrives long before the second is produced (2 s later). It is not
/// stored: its claim is released, and a retry runs the handler again.
async fn streaming_responses_pass_through_at_once(h: Harness) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let started = Instant::now();
    let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    s.write_all(
        format!(
            "POST /events HTTP/1.1\r\nHost: {}\r\nIdempotency-Key: s-1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            h.addr
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("data: one 1") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("no first event within 10 s")
            .unwrap();
        assert!(n > 0, "closed before the first event");
        seen.extend_from_slice(&buf[..n]);
    }
    let first = started.elapsed();
    assert!(
        first < Duration::from_millis(1500),
        "the first event waited for the stream: {first:?}"
    );
    s.read_to_end(&mut seen).await.unwrap();
    assert!(String::from_utf8_lossy(&seen).contains("data: two"));
    let again = post(h.addr, "/events", Some("s-1"), "").await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert!(again.text().contains("data: one 2"), "{}", again.text());
    assert_eq!(again.header("idempotent-replayed"), None);
    assert_eq!(
        h.app.runs("events"),
        2,
        "not stored: the retry ran the handler"
    );
}

/// actix-web's test service on a plain multi-thread tokio runtime: no actix system, so
/// no `LocalSet` to spawn on, and a task spawned elsewhere may run on another thread than
/// the request's. The handlers run in the caller's future instead (one returning an
/// actix-only response used to panic; one returning a `String` could answer 500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actix_test_service_without_a_local_set() {
    use actix_web::{HttpResponse, web};
    use distlock::idempotent;

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn text(app: web::Data<App>, web::Json(b): web::Json<Buy>) -> String {
        format!("text {} {}", app.bump("orders"), b.order)
    }

    #[idempotent(header = "Idempotency-Key", scope = "tests", client = app.locks)]
    async fn response(app: web::Data<App>, web::Json(b): web::Json<Buy>) -> HttpResponse {
        HttpResponse::Created().body(format!("response {} {}", app.bump("slow"), b.order))
    }

    let redis = RedisServer::start();
    let app = App::new(Locks::connect(&redis.url()).await.unwrap());
    let svc = actix_web::test::init_service(
        actix_web::App::new()
            .app_data(web::Data::new(app.clone()))
            .route("/text", web::post().to(text))
            .route("/response", web::post().to(response)),
    )
    .await;
    for i in 0..20 {
        for (path, first) in [("/text", "text 1 o-1"), ("/response", "response 1 o-1")] {
            let req = actix_web::test::TestRequest::post()
                .uri(path)
                .insert_header(("Idempotency-Key", "a-1"))
                .insert_header(("content-type", "application/json"))
                .set_payload(r#"{"order":"o-1"}"#)
                .to_request();
            let body = actix_web::test::call_and_read_body(&svc, req).await;
            assert_eq!(body, first, "{path}, call {i}");
        }
    }
    assert_eq!(app.runs("orders"), 1);
    assert_eq!(app.runs("slow"), 1);
}
