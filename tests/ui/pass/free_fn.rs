//! A free `async fn` with the default client and every duration argument.
use distlock::distributed_lock;

#[derive(Debug)]
struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = "order:<id>")]
async fn defaults(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[distributed_lock(key = "stock:{<sku>}:<n>", ttl = "1m30s", wait = "500ms")]
async fn durations(sku: String, n: u32) -> Result<(), AppError> {
    let _ = (sku, n);
    Ok(())
}

#[distributed_lock(key = "global")]
async fn no_params() -> Result<(), AppError> {
    Ok(())
}

fn main() {
    let _ = defaults(1);
    let _ = durations(String::new(), 2);
    let _ = no_params();
}
