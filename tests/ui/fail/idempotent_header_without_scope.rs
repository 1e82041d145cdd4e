use axum::extract::Path;

#[distlock::idempotent(header = "Idempotency-Key")]
async fn create(Path(user): Path<u64>) -> String {
    format!("order for {user}")
}

fn main() {}
