//! `client = ...` with a `&Locks` parameter, a field, and a shared `Arc<Locks>`.
use std::sync::{Arc, LazyLock};

use distlock::{Locks, distributed_lock};

#[derive(Debug)]
struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

static LOCKS: LazyLock<Arc<Locks>> = LazyLock::new(|| Arc::new(Locks::in_memory()));

#[distributed_lock(key = "a:<id>", client = locks)]
async fn by_ref(locks: &Locks, id: u64) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "b:<id>", client = locks)]
async fn by_value(locks: Locks, id: u64) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "c:<id>", client = LOCKS.clone())]
async fn from_static(id: u64) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "d:<id>", client = shared)]
async fn arc_param(shared: Arc<Locks>, id: u64) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

fn main() {
    let locks = Locks::in_memory();
    let _ = by_ref(&locks, 1);
    let _ = by_value(locks, 2);
    let _ = from_static(3);
    let _ = arc_param(LOCKS.clone(), 4);
}
