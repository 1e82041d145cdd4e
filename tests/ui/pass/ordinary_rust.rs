//! The attributes with ordinary Rust: raw identifiers (a placeholder writes `<type>` or
//! `<r#type>`), `#[cfg]` on a parameter, `#[distributed_lock]` imported under another
//! name below `#[idempotent]`, and one-expression bodies returning `impl Trait` (in a
//! task of its own or not, with and without the lock), under `#![deny(warnings)]`.
#![deny(warnings)]

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use distlock::distributed_lock as lock;
use distlock::{distributed_lock, idempotent};

#[derive(Debug)]
pub struct AppError;

impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = "a:<type>")]
pub async fn raw_lock(r#type: u64) -> Result<u64, AppError> {
    Ok(r#type)
}

#[idempotent(key = "b:<r#type>")]
pub async fn raw_idempotent(r#type: u64, r#match: String) -> Result<u64, AppError> {
    let _ = r#match;
    Ok(r#type)
}

#[idempotent(key = "c:<type>", fingerprint = [r#type])]
pub async fn raw_fingerprint(r#type: u64) -> Result<u64, AppError> {
    Ok(r#type)
}

#[idempotent(key = "d:<id>")]
pub async fn cfg_idempotent(id: u64, #[cfg(any())] gone: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[idempotent(header = "Idempotency-Key", scope = "shop")]
pub async fn cfg_handler(Path(id): Path<u64>, #[cfg(any())] gone: String) -> String {
    id.to_string()
}

#[idempotent(header = "Idempotency-Key", scope = "shop")]
pub async fn cfg_body_handler(
    Path(id): Path<u64>,
    #[cfg(all())] axum::Json(body): axum::Json<serde_json::Value>,
) -> String {
    format!("{id} {body}")
}

#[distributed_lock(key = "e:<id>")]
pub async fn cfg_lock(id: u64, #[cfg(all())] kept: u64) -> Result<u64, AppError> {
    Ok(id + kept)
}

#[idempotent(header = "Idempotency-Key", scope = "shop")]
#[lock(key = "stock:<sku>", wait = "1s")]
pub async fn renamed_lock_below(Path(sku): Path<u64>) -> Result<String, distlock::Error> {
    Ok(sku.to_string())
}

#[idempotent(header = "Idempotency-Key", scope = "shop")]
pub async fn one_expression(Path(sku): Path<u64>) -> impl IntoResponse {
    (StatusCode::CREATED, sku.to_string())
}

#[idempotent(header = "Idempotency-Key", scope = "shop", detach = false)]
pub async fn one_expression_in_place(Path(sku): Path<u64>) -> impl IntoResponse {
    (StatusCode::CREATED, sku.to_string())
}

#[idempotent(header = "Idempotency-Key", scope = "shop")]
#[distributed_lock(key = "stock:<sku>")]
pub async fn locked_impl_result(Path(sku): Path<u64>) -> Result<impl IntoResponse, distlock::Error> {
    Ok((StatusCode::CREATED, sku.to_string()))
}

#[distributed_lock(key = "stock:<sku>")]
#[idempotent(header = "Idempotency-Key", scope = "shop")]
pub async fn lock_outer_impl_result(
    Path(sku): Path<u64>,
) -> Result<impl IntoResponse, distlock::Error> {
    Ok((StatusCode::CREATED, sku.to_string()))
}

#[idempotent(header = "Idempotency-Key", scope = "shop", detach = false)]
#[distributed_lock(key = "stock:<sku>")]
pub async fn locked_impl_result_in_place(
    Path(sku): Path<u64>,
) -> Result<impl IntoResponse, distlock::Error> {
    Ok((StatusCode::CREATED, sku.to_string()))
}

#[distributed_lock(key = "f:<id>")]
pub async fn locked_display(id: u64) -> Result<impl std::fmt::Display, AppError> {
    Ok(id)
}

fn main() {
    let _: axum::Router = axum::Router::new()
        .route("/a/{sku}", axum::routing::post(one_expression))
        .route("/b/{sku}", axum::routing::post(one_expression_in_place))
        .route("/c/{sku}", axum::routing::post(locked_impl_result))
        .route("/d/{sku}", axum::routing::post(lock_outer_impl_result))
        .route("/e/{sku}", axum::routing::post(locked_impl_result_in_place))
        .route("/f/{id}", axum::routing::post(cfg_handler))
        .route("/g/{id}", axum::routing::post(cfg_body_handler));
}
