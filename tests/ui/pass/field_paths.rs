//! Placeholders reaching into fields: `<order.customer.id>` and tuple fields `<pair.0>`.
use distlock::distributed_lock;

#[derive(Debug)]
struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

struct Customer {
    id: u64,
}

struct Order {
    id: u64,
    customer: Customer,
}

#[distributed_lock(key = "customer:{<order.customer.id>}:order:<order.id>")]
async fn ship(order: Order) -> Result<u64, AppError> {
    Ok(order.id)
}

#[distributed_lock(key = "pair:<pair.0>:<pair.1>")]
async fn pair(pair: (u32, String)) -> Result<u32, AppError> {
    Ok(pair.0)
}

#[distributed_lock(key = "ref:<order.customer.id>")]
async fn by_ref(order: &Order) -> Result<(), AppError> {
    let _ = order.id;
    Ok(())
}

fn main() {
    let _ = ship(Order {
        id: 1,
        customer: Customer { id: 2 },
    });
    let _ = pair((1, "a".into()));
}
