//! A read/write lock's side is `"read"` or `"write"`, has no count, and no `min_hold`.
use distlock::distributed_lock;

#[distributed_lock(key = "catalog", mode = "readonly")]
async fn unknown_side() -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock(key = "catalog", mode = "read", permits = 4)]
async fn counted() -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock(key = "catalog", mode = "write", min_hold = "1s")]
async fn kept() -> Result<(), distlock::Error> {
    Ok(())
}

fn main() {}
