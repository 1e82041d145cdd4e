//! `min_hold` keeps the lock by its lease: it cannot outlast `ttl`.
use distlock::distributed_lock;

#[distributed_lock(key = "job:report", ttl = "1m", min_hold = "5m")]
async fn report() -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock(key = "job:cleanup", min_hold = "1m")]
async fn cleanup() -> Result<(), distlock::Error> {
    Ok(())
}

fn main() {}
