//! `client = ...` that is not a `Locks`, `&Locks` or `Arc<Locks>`.
use distlock::distributed_lock;

struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = "order:<id>", client = url)]
async fn ship(url: &str, id: u64) -> Result<(), AppError> {
    let _ = (url, id);
    Ok(())
}

fn main() {}
