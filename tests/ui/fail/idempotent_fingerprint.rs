//! `fingerprint = [..]` names bindings; each must exist and be `Serialize`.
use distlock::idempotent;

struct Pool;

#[idempotent(key = "pay:<id>", fingerprint = [id, amout])]
async fn pay(id: u64, amount: u64, pool: &Pool) -> Result<u64, distlock::Error> {
    let _ = pool;
    Ok(id + amount)
}

#[idempotent(key = "pay:<id>", fingerprint = [id, pool])]
async fn pay_pool(id: u64, pool: &Pool) -> Result<u64, distlock::Error> {
    let _ = pool;
    Ok(id)
}

fn main() {}
