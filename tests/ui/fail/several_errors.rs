//! Independent mistakes are all reported in one compile.
use distlock::distributed_lock;

struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = "order:<od>", tll = "10s", wait = "3x", retries = 3)]
async fn ship(id: u64) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

fn main() {}
