//! A plain fn must return `Result<T, E>`.
use distlock::idempotent;

#[idempotent(key = "pay:<id>")]
async fn pay(id: u64) -> u64 {
    id
}

fn main() {}
