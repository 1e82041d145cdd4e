//! A zero lease.
use distlock::distributed_lock;

struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = "order:<id>", ttl = "0s")]
async fn ship(id: u64) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

fn main() {}
