//! The attributes with ordinary Rust: raw identifiers (a placeholder writes `<type>` or
//! `<r#type>`), `#[cfg]` on a parameter, and `#[distributed_lock]` imported under another
//! name below `#[idempotent]`, under `#![deny(warnings)]`.
#![deny(warnings)]

use axum::extract::Path;
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

#[distributed_lock(key = "e:<id>")]
pub async fn cfg_lock(id: u64, #[cfg(all())] kept: u64) -> Result<u64, AppError> {
    Ok(id + kept)
}

#[idempotent(header = "Idempotency-Key", scope = "shop")]
#[lock(key = "stock:<sku>", wait = "1s")]
pub async fn renamed_lock_below(Path(sku): Path<u64>) -> Result<String, distlock::Error> {
    Ok(sku.to_string())
}

fn main() {}
