//! An error type that cannot hold a `distlock::Error`.
use distlock::distributed_lock;

struct AppError;

#[distributed_lock(key = "order:<id>")]
async fn ship(id: u64) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

fn main() {}
