//! Smoke test.
mod common;
use common::*;
use distlock::{Locks, distributed_lock};

#[distributed_lock(key = "order:<id>", ttl = "5s", client = locks)]
async fn ship(locks: &Locks, id: u64) -> Result<u64, AppError> {
    let info = distlock::current_lock().unwrap();
    assert_eq!(info.key(), format!("lock:order:{id}"));
    Ok(info.fence())
}

#[tokio::test]
async fn smoke() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    assert_eq!(ship(&locks, 7).await.unwrap(), 1);
    assert_eq!(ship(&locks, 7).await.unwrap(), 2);
}
