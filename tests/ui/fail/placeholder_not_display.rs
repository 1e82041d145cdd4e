//! A placeholder whose type has no `Display` impl.
use distlock::distributed_lock;

struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

struct OrderId(u64);

#[distributed_lock(key = "order:<id>")]
async fn ship(id: OrderId) -> Result<(), AppError> {
    let _ = id.0;
    Ok(())
}

fn main() {}
