//! Quickstart: two "instances" race to deduct stock; the lock keeps the count right.
//!
//! Uses `REDIS_URL` when set; `scripts/quickstart.sh` starts a private redis-server when one
//! is installed, else this falls back to the in-memory backend and says so.

use std::time::Duration;

use distlock::{Locks, distributed_lock};

#[derive(Debug)]
enum AppError {
    Lock(distlock::Error),
    SoldOut,
}

impl From<distlock::Error> for AppError {
    fn from(e: distlock::Error) -> Self {
        AppError::Lock(e)
    }
}

/// Read-modify-write with an await in between: only safe under the lock.
#[distributed_lock(key = "stock:<sku>", ttl = "10s", wait = "3s", client = locks)]
async fn deduct(
    locks: &Locks,
    stock: &tokio::sync::Mutex<u32>,
    sku: u64,
    n: u32,
) -> Result<u32, AppError> {
    let left = *stock.lock().await;
    tokio::time::sleep(Duration::from_millis(2)).await; // another instance would interleave here
    if left < n {
        return Err(AppError::SoldOut);
    }
    // The fence, asked for right before the write: `Lost` if the lease has run out.
    let fence = match distlock::current_lock() {
        Some(held) => held.fence().await?,
        None => 0,
    };
    *stock.lock().await = left - n;
    println!("sku {sku}: took {n}, {} left (fence {fence})", left - n);
    Ok(left - n)
}

#[tokio::main]
async fn main() -> Result<(), AppError> {
    let locks = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("using Redis at {url}");
            Locks::connect(&url).await?
        }
        Err(_) => {
            println!(
                "notice: REDIS_URL is not set; using the in-memory backend (one process only)"
            );
            Locks::in_memory()
        }
    };
    let stock = std::sync::Arc::new(tokio::sync::Mutex::new(10u32));
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let (locks, stock) = (locks.clone(), stock.clone());
        tasks.push(tokio::spawn(
            async move { deduct(&locks, &stock, 7, 1).await },
        ));
    }
    let (mut sold, mut refused) = (0, 0);
    for t in tasks {
        match t.await.expect("task panicked") {
            Ok(_) => sold += 1,
            Err(AppError::SoldOut) => refused += 1,
            Err(AppError::Lock(e)) => {
                eprintln!("lock error: {e}");
                return Err(AppError::Lock(e));
            }
        }
    }
    println!(
        "sold {sold}, refused {refused}, left {}",
        *stock.lock().await
    );
    assert_eq!(sold, 10, "never oversold, never undersold");
    Ok(())
}
