use distlock::idempotent;

#[derive(Debug)]
struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "a:<id>", on_lost = "ignore")]
async fn bad_policy(id: u64) -> Result<(), AppError> {
    Ok(())
}

#[idempotent(key = "a:<id>", on_lost = true)]
async fn not_a_string(id: u64) -> Result<(), AppError> {
    Ok(())
}

fn main() {}
