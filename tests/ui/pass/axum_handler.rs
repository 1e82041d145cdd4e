//! An axum 0.8 handler: destructured extractors in placeholders, and the locked future
//! is still `Send`, so the function is a valid `Handler` for `Router::route`.
use axum::Router;
use axum::extract::{Json, Path};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use distlock::distributed_lock;
use serde::{Deserialize, Serialize};

#[derive(Debug)]
enum AppError {
    Lock(distlock::Error),
}
impl From<distlock::Error> for AppError {
    fn from(e: distlock::Error) -> Self {
        AppError::Lock(e)
    }
}
impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            AppError::Lock(e) => (StatusCode::CONFLICT, e.to_string()).into_response(),
        }
    }
}

#[derive(Deserialize)]
struct Body {
    qty: u32,
}

#[derive(Serialize)]
struct Out {
    id: u64,
    qty: u32,
}

#[distributed_lock(key = "x:<id>", ttl = "10s", wait = "2s")]
async fn h(Path(id): Path<u64>, Json(body): Json<Body>) -> Result<Json<Out>, AppError> {
    tokio::task::yield_now().await;
    Ok(Json(Out { id, qty: body.qty }))
}

fn main() {
    let _app: Router = Router::new().route("/x/{id}", post(h));
}
