//! A handler must return a response of an enabled framework.
use distlock::idempotent;

struct Created(u64);

#[idempotent(header = "Idempotency-Key", scope = "shop")]
async fn create() -> Created {
    Created(1)
}

fn main() {}
