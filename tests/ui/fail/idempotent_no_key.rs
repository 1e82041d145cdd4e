//! Neither `key` nor `header`.
use distlock::idempotent;

#[idempotent(ttl = "1h")]
async fn pay(id: u64) -> Result<u64, distlock::Error> {
    Ok(id)
}

fn main() {}
