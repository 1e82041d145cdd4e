//! A crate-local `Result<T>` alias as the return type.
use distlock::distributed_lock;

#[derive(Debug)]
struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

type Result<T> = std::result::Result<T, AppError>;

#[distributed_lock(key = "alias:<id>")]
async fn aliased(id: u64) -> Result<u64> {
    Ok(id)
}

// `distlock::Result` works too: `distlock::Error` converts into itself.
#[distributed_lock(key = "plain:<id>")]
async fn plain(id: u64) -> distlock::Result<u64> {
    Ok(id)
}

fn main() {
    let _ = aliased(1);
    let _ = plain(1);
}
