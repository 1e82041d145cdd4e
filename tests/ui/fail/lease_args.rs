use distlock::distributed_lock;

struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = "a:<id>", max_hold = "5m")]
async fn cap_without_renew(id: u64) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a:<id>", renew = true, on_lost = "ignore")]
async fn bad_policy(id: u64) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "a:<id>", renew = "yes")]
async fn renew_not_bool(id: u64) -> Result<(), AppError> {
    Ok(())
}

fn main() {}
