//! Inside an `#[async_trait]` impl, an error type without `From<distlock::Error>`.
use async_trait::async_trait;
use distlock::distributed_lock;

struct AppError;

#[async_trait]
trait Orders {
    async fn ship(&self, order: u64) -> Result<(), AppError>;
}

struct Service;

#[async_trait]
impl Orders for Service {
    #[distributed_lock(key = "ship:<order>")]
    async fn ship(&self, order: u64) -> Result<(), AppError> {
        let _ = order;
        Ok(())
    }
}

fn main() {}
