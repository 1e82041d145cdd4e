//! `replicas` takes an integer: how many replicas must acknowledge each write.
use distlock::{distributed_lock, idempotent};

struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = "a:<id>", replicas = "one")]
async fn lock_word(id: u64) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a:<id>", replicas = -1)]
async fn lock_negative(id: u64) -> Result<(), AppError> {
    Ok(())
}

#[idempotent(key = "a:<id>", replicas = 1.5)]
async fn idem_fraction(id: u64) -> Result<(), AppError> {
    Ok(())
}

fn main() {}
