//! The attribute on something that is not a function.
use distlock::distributed_lock;

#[distributed_lock(key = "order")]
struct Order {
    id: u64,
}

fn main() {}
