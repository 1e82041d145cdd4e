//! `required` only means something for handlers (`header = ...`; `max_body` caps a keyed
//! fn's stored value too); bad values and unknown arguments are reported together.
use distlock::idempotent;

#[idempotent(key = "pay:<id>", required = false, max_body = "1MiB", lease = "0s", wiat = "5s")]
async fn pay(id: u64) -> Result<u64, distlock::Error> {
    Ok(id)
}

fn main() {}
