//! An unknown placeholder lists the bindings and suggests the closest.
use distlock::distributed_lock;

struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = "order:<od>")]
async fn ship(id: u64, qty: u32) -> Result<(), AppError> {
    let _ = (id, qty);
    Ok(())
}

fn main() {}
