//! `keys = [..]`: several locks taken together, on a free fn and a method.
use distlock::distributed_lock;

#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "3s")]
async fn transfer(from: u64, to: u64, cents: u64) -> Result<u64, distlock::Error> {
    Ok(from + to + cents)
}

struct Bank {
    name: String,
}

impl Bank {
    #[distributed_lock(keys = ["ledger:<self.name>", "account:<id>"], ttl = "10s")]
    async fn post(&self, id: u64) -> Result<(), distlock::Error> {
        let _ = id;
        Ok(())
    }
}

fn main() {
    let _ = transfer(1, 2, 3);
    let bank = Bank {
        name: "main".into(),
    };
    let _ = bank.post(7);
}
