//! Methods taking `&self`, `&mut self` and `self: Arc<Self>`, keyed on `<self.id>`.
use std::sync::Arc;

use distlock::distributed_lock;

#[derive(Debug)]
struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

struct Account {
    id: u64,
    balance: i64,
}

impl Account {
    #[distributed_lock(key = "account:<self.id>")]
    async fn balance(&self) -> Result<i64, AppError> {
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.id>", ttl = "5s")]
    async fn deposit(&mut self, amount: i64) -> Result<i64, AppError> {
        self.balance += amount;
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.id>:<n>")]
    async fn shared(self: Arc<Self>, n: u8) -> Result<u64, AppError> {
        Ok(self.id + u64::from(n))
    }
}

fn assert_send<T: Send>(_: &T) {}

fn main() {
    let mut a = Account { id: 1, balance: 0 };
    {
        let f = a.balance();
        assert_send(&f);
    }
    {
        let f = a.deposit(5);
        assert_send(&f);
    }
    let f = Arc::new(a).shared(3);
    assert_send(&f);
}
