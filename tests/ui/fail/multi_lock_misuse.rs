//! `keys` takes a non-empty array of distinct templates whose placeholders are bound,
//! and neither `key`, `permits` nor `mode` beside it.
use distlock::distributed_lock;

#[distributed_lock(keys = [])]
async fn none() -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock(keys = ["account:<from>", "account:<from>"])]
async fn twice(from: u64) -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock(keys = ["account:<from>", "account:<too>"])]
async fn unknown(from: u64, to: u64) -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock(key = "account:<from>", keys = ["account:<to>"])]
async fn both(from: u64, to: u64) -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock(keys = ["gpu:<a>", "gpu:<b>"], permits = 2)]
async fn counted(a: u64, b: u64) -> Result<(), distlock::Error> {
    Ok(())
}

fn main() {}
