//! `#[idempotent]` where it must work: axum and actix-web handlers (alone and with
//! `#[distributed_lock]` in both orders, `impl IntoResponse`, `Result` with
//! `distlock::Error`), plain fns (`()`, aliases, generics, methods), `#[async_trait]`
//! methods and a renamed crate; axum handler futures stay `Send`.
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use distlock::{Locks, distributed_lock, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Order {
    qty: u32,
}

#[derive(Clone)]
struct AppState {
    locks: Arc<Locks>,
}

#[idempotent(header = "Idempotency-Key", scope = "<user>", wait = "5s", max_body = 65536, client = st.locks)]
async fn create(
    State(st): State<AppState>,
    Path(user): Path<u64>,
    Json(order): Json<Order>,
) -> impl IntoResponse {
    (StatusCode::CREATED, Json(serde_json::json!({ "user": user, "qty": order.qty })))
}

#[idempotent(header = "Idempotency-Key", scope = "shop")]
#[distributed_lock(key = "stock:<sku>", wait = "1s")]
async fn buy(Path(sku): Path<u64>) -> Result<String, distlock::Error> {
    Ok(format!("{sku}"))
}

#[distributed_lock(key = "stock:<sku>", wait = "1s")]
#[idempotent(header = "Idempotency-Key", scope = "shop", required = false)]
async fn buy_lock_outer(Path(sku): Path<u64>) -> Result<String, distlock::Error> {
    Ok(format!("{sku}"))
}

#[actix_web::post("/a/{id}")]
#[idempotent(header = "Idempotency-Key", scope = "shop")]
async fn actix_create(id: actix_web::web::Path<u64>) -> actix_web::HttpResponse {
    actix_web::HttpResponse::Created().body(format!("{}", id.into_inner()))
}

#[idempotent(header = "X-Request-Id", scope = "shop")]
#[actix_web::post("/b")]
async fn actix_string() -> Result<String, distlock::Error> {
    Ok("ok".into())
}

/// Keyed, with parameters that are not payload: state and the client are left out of
/// the fingerprint; a counter is skipped by name; a set is fingerprinted sorted.
#[idempotent(key = "keyed:<id>", client = locks, skip = [hits])]
async fn keyed(
    State(st): State<AppState>,
    locks: &Locks,
    id: u64,
    tags: std::collections::HashSet<String>,
    hits: &std::sync::atomic::AtomicBool,
) -> Result<usize, distlock::Error> {
    let _ = (st, hits);
    Ok(tags.len() + id as usize)
}

type AppResult<T> = Result<T, distlock::Error>;

#[idempotent(key = "unit:<id>", ttl = "1h", lease = "10s")]
async fn unit(id: u64) -> AppResult<()> {
    let _ = id;
    Ok(())
}

#[idempotent(key = "gen:<id>", on_lost = "continue")]
async fn generic<T: std::fmt::Display + Serialize + Send>(id: T) -> Result<Vec<String>, distlock::Error> {
    Ok(vec![id.to_string()])
}

struct Service;

impl Service {
    #[idempotent(key = "svc:<id>", name = "service-method")]
    async fn method(&self, id: u64) -> Result<u64, distlock::Error> {
        Ok(id)
    }
}

#[async_trait::async_trait]
trait Payments {
    async fn pay(&self, id: u64) -> Result<u64, distlock::Error>;
}

#[async_trait::async_trait]
impl Payments for Service {
    #[idempotent(key = "pay:<id>", scope = "svc", name = "service-pay")]
    async fn pay(&self, id: u64) -> Result<u64, distlock::Error> {
        Ok(id)
    }
}

#[async_trait::async_trait]
trait Stock {
    async fn take(&self, sku: u64) -> Result<u64, distlock::Error>;
    async fn take_lock_outer(&self, sku: u64) -> Result<u64, distlock::Error>;
}

#[async_trait::async_trait]
impl Stock for Service {
    #[idempotent(key = "take:<sku>", name = "stock-take")]
    #[distributed_lock(key = "stock:<sku>")]
    async fn take(&self, sku: u64) -> Result<u64, distlock::Error> {
        Ok(sku)
    }

    #[distributed_lock(key = "stock:<sku>")]
    #[idempotent(key = "take2:<sku>", name = "stock-take-lock-outer")]
    async fn take_lock_outer(&self, sku: u64) -> Result<u64, distlock::Error> {
        Ok(sku)
    }
}

mod renamed {
    use distlock as dl;

    #[dl::idempotent(key = "r:<id>", crate = "dl")]
    pub async fn renamed(id: u64) -> Result<u64, dl::Error> {
        Ok(id)
    }
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    let st = AppState {
        locks: Arc::new(Locks::in_memory()),
    };
    let _app: axum::Router = axum::Router::new()
        .route("/c/{user}", axum::routing::post(create))
        .route("/buy/{sku}", axum::routing::post(buy))
        .route("/buy2/{sku}", axum::routing::post(buy_lock_outer))
        .with_state(st);
    let _actix = actix_web::App::new().service(actix_create).service(actix_string);
    assert_send(unit(1));
    let _ = keyed;
    assert_send(generic(1));
    assert_send(Service.method(1));
    assert_send(renamed::renamed(1));
    let _ = Service.pay(1);
    assert_send(Service.take(1));
    assert_send(Service.take_lock_outer(1));
}
