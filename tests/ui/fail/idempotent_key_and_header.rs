//! `key` and `header` together.
use distlock::idempotent;

#[idempotent(key = "pay:<id>", header = "Idempotency-Key")]
async fn pay(id: u64) -> Result<u64, distlock::Error> {
    Ok(id)
}

fn main() {}
