//! The `Ok` value is stored as JSON, so it must be `Serialize + DeserializeOwned`.
use distlock::idempotent;

struct Receipt {
    id: u64,
}

#[idempotent(key = "pay:<id>")]
async fn pay(id: u64) -> Result<Receipt, distlock::Error> {
    Ok(Receipt { id })
}

fn main() {}
