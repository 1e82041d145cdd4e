//! A semaphore needs at least one permit, takes a count, and has no `min_hold`.
use distlock::distributed_lock;

#[distributed_lock(key = "gpu", permits = 0)]
async fn none() -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock(key = "gpu", permits = "4")]
async fn quoted() -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock(key = "gpu", permits = 4, min_hold = "1s")]
async fn kept() -> Result<(), distlock::Error> {
    Ok(())
}

fn main() {}
