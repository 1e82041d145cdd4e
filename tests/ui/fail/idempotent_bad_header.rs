//! The header must be a valid HTTP header name.
use distlock::idempotent;

#[idempotent(header = "Idempotency Key")]
async fn create() -> String {
    String::new()
}

fn main() {}
