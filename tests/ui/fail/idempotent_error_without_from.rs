//! The error type must hold a `distlock::Error` (`InProgress`, `PayloadMismatch`, ...).
use distlock::idempotent;

#[derive(Debug)]
struct AppError;

#[idempotent(key = "pay:<id>")]
async fn pay(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
