//! `crate = "..."` when `distlock` is reachable under another name.
extern crate distlock as renamed;

use renamed::distributed_lock;

#[derive(Debug)]
struct AppError;
impl From<renamed::Error> for AppError {
    fn from(_: renamed::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = "renamed:<id>", crate = "renamed")]
async fn ship(id: u64) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

mod inner {
    pub(crate) mod again {
        pub(crate) use ::distlock as lib;
    }
}

#[distributed_lock(key = "path:<id>", crate = "crate::inner::again::lib")]
async fn by_path(id: u64) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

fn main() {
    let _ = ship(1);
    let _ = by_path(1);
}
