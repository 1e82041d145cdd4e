//! Fns: a binding whose type cannot be fingerprinted is an error on it, unless skipped;
//! a parameter type named like application state must be one. Handlers: `fingerprint`
//! and `skip` do not apply (the request is the payload).
use axum::Json;
use axum::extract::Path;
use distlock::idempotent;
use serde::Deserialize;

#[derive(Deserialize)]
struct Transfer {
    to: String,
}

struct Pool;

#[idempotent(key = "transfer:<id>")]
async fn transfer(id: u64, Json(t): Json<Transfer>, pool: &Pool) -> Result<String, distlock::Error> {
    let _ = pool;
    Ok(format!("{id} {}", t.to))
}

#[idempotent(key = "transfer:<id>", skip = [t, pool])]
async fn transfer_skipped(id: u64, Json(t): Json<Transfer>, pool: &Pool) -> Result<String, distlock::Error> {
    let _ = pool;
    Ok(format!("{id} {}", t.to))
}

#[idempotent(header = "Idempotency-Key", scope = "shop", skip = [id], fingerprint = [id])]
async fn handler(Path(id): Path<u64>) -> String {
    id.to_string()
}

/// The user's own type, named like axum's.
struct State<T>(T);

#[idempotent(key = "s:<id>")]
async fn named_like_state(id: u64, state: State<u64>) -> Result<u64, distlock::Error> {
    Ok(id + state.0)
}

fn main() {}
