//! A return type that is not a `Result`.
use distlock::distributed_lock;

struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = "order:<id>")]
async fn ship(id: u64) -> u32 {
    let _ = id;
    7
}

fn main() {}
