//! Two Redis Cluster hash tags: Redis hashes the first; a second brace group is how
//! distlock names a tagged key's companions, so a key holds one at most.
use distlock::distributed_lock;

struct AppError;
impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(key = "{tenant}:order:{<id>}")]
async fn ship(id: u64) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

fn main() {}
