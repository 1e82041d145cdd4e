//! A function without a return type cannot report lock failures.
use distlock::distributed_lock;

struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = "order:<id>")]
async fn ship(id: u64) {
    let _ = id;
}

fn main() {}
