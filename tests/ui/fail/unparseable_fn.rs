//! A function that does not parse keeps syn's own error, on the offending token.
use distlock::distributed_lock;

#[distributed_lock(key = "a")]
async fn broken() -> Result<(), distlock::Error> {
    let x = ;
    Ok(())
}

fn main() {}
