//! A placeholder that names no parameter: the error lists the bindings.
use distlock::idempotent;

#[idempotent(key = "pay-callback:<notify>", ttl = "24h")]
async fn on_paid(notify_id: String, amount: u64) -> Result<u64, distlock::Error> {
    let _ = notify_id;
    Ok(amount)
}

fn main() {}
