use distlock::idempotent;

struct Email;

impl Email {
    #[idempotent(key = "notify:<id>")]
    async fn notify(&self, id: u64) -> Result<u64, distlock::Error> {
        Ok(id)
    }
}

struct Sms;

impl Sms {
    #[idempotent(key = "notify:<id>", name = "")]
    async fn notify(&self, id: u64) -> Result<u64, distlock::Error> {
        Ok(id)
    }
}

fn main() {}
