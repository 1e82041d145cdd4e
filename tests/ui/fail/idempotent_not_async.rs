//! Only `async fn`.
use distlock::idempotent;

#[idempotent(key = "pay:<id>")]
fn pay(id: u64) -> Result<u64, distlock::Error> {
    Ok(id)
}

fn main() {}
