//! The header must be a valid HTTP header name.
use distlock::idempotent;

#[idempotent(header = "Idempotency Key", scope = "shop")]
async fn create() -> String {
    String::new()
}

fn main() {}
