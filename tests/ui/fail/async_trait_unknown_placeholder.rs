//! Inside an `#[async_trait]` impl the available bindings are still the parameters.
use async_trait::async_trait;
use distlock::distributed_lock;

struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[async_trait]
trait Orders {
    async fn ship(&self, order: u64) -> Result<(), AppError>;
}

struct Service;

#[async_trait]
impl Orders for Service {
    #[distributed_lock(key = "ship:<ordr>")]
    async fn ship(&self, order: u64) -> Result<(), AppError> {
        let _ = order;
        Ok(())
    }
}

fn main() {}
