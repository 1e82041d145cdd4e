//! A key that is not a string literal.
use distlock::distributed_lock;

struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = order_id)]
async fn ship(order_id: u64) -> Result<(), AppError> {
    let _ = order_id;
    Ok(())
}

fn main() {}
