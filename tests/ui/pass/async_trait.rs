//! Methods of an `#[async_trait]` impl, with placeholders on parameters and on `self`.
use std::sync::Arc;

use async_trait::async_trait;
use distlock::{Locks, distributed_lock};

#[derive(Debug)]
struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[async_trait]
trait Orders {
    async fn ship(&self, order: u64) -> Result<u64, AppError>;
    async fn cancel(&self, order: u64) -> Result<(), AppError>;
    async fn audit(&self) -> Result<String, AppError>;
    async fn pair(&self, pair: (u32, u32)) -> Result<u32, AppError>;
}

struct Service {
    id: String,
    locks: Locks,
}

#[async_trait]
impl Orders for Service {
    #[distributed_lock(key = "ship:<order>", client = self.locks)]
    async fn ship(&self, order: u64) -> Result<u64, AppError> {
        Ok(order)
    }

    #[distributed_lock(key = "cancel:<self.id>:<order>", client = &self.locks, wait = "1s")]
    async fn cancel(&self, order: u64) -> Result<(), AppError> {
        let _ = order;
        Ok(())
    }

    #[distributed_lock(key = "audit:<self.id>")]
    async fn audit(&self) -> Result<String, AppError> {
        Ok(self.id.clone())
    }

    // `#[async_trait]` turns the pattern into `__arg1` plus a `let (a, b) = __arg1;`.
    #[distributed_lock(key = "pair:<self.id>:<a>:<b>", client = self.locks)]
    async fn pair(&self, (a, b): (u32, u32)) -> Result<u32, AppError> {
        Ok(a + b)
    }
}

struct Shared {
    locks: Arc<Locks>,
}

#[async_trait]
impl Orders for Shared {
    #[distributed_lock(key = "ship:<order>", client = self.locks)]
    async fn ship(&self, order: u64) -> Result<u64, AppError> {
        if order == 0 {
            return Err(AppError);
        }
        Ok(order)
    }

    #[distributed_lock(key = "cancel:<order>", client = self.locks.clone())]
    async fn cancel(&self, order: u64) -> Result<(), AppError> {
        let _ = order;
        Ok(())
    }

    async fn audit(&self) -> Result<String, AppError> {
        Ok(String::new())
    }

    async fn pair(&self, pair: (u32, u32)) -> Result<u32, AppError> {
        Ok(pair.0)
    }
}

fn main() {
    let s: Box<dyn Orders + Send + Sync> = Box::new(Service {
        id: "s".into(),
        locks: Locks::in_memory(),
    });
    let _ = s.ship(1);
    let _ = Shared {
        locks: Arc::new(Locks::in_memory()),
    };
}
