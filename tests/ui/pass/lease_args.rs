use distlock::distributed_lock;

struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = "report:<id>", ttl = "10s", renew = true, max_hold = "5m")]
async fn cancel_on_loss(id: u64) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "report:<id>", ttl = "10s", renew = true, on_lost = "continue")]
async fn run_on(id: u64) -> Result<(), AppError> {
    Ok(())
}

fn main() {}
