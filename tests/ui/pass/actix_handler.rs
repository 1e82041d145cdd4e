//! actix-web handlers: `#[distributed_lock]` below and above the route attribute.
//!
//! actix-web 4's `web::Path` has a private field, so `web::Path((a, b))` cannot be
//! destructured in a parameter; placeholders reach the tuple through `Deref` instead
//! (`<path.0>`). `web::Json` has a public field and destructures as usual.
use std::fmt;

use actix_web::{App, HttpResponse, ResponseError, web};
use distlock::distributed_lock;

#[derive(Debug)]
struct AppError(distlock::Error);
impl From<distlock::Error> for AppError {
    fn from(e: distlock::Error) -> Self {
        AppError(e)
    }
}
impl fmt::Display for AppError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lock failed: {}", self.0)
    }
}
impl ResponseError for AppError {}

#[derive(serde::Deserialize)]
struct Body {
    tag: String,
}

#[actix_web::post("/x/{a}/{b}")]
#[distributed_lock(key = "x:<path.0>:<path.1>")]
async fn h(path: web::Path<(u32, u32)>) -> Result<HttpResponse, AppError> {
    let (a, b) = path.into_inner();
    Ok(HttpResponse::Ok().body(format!("{a}/{b}")))
}

#[distributed_lock(key = "y:<path.0>:<path.1>:<body.tag>", wait = "1s")]
#[actix_web::post("/y/{a}/{b}")]
async fn reversed(
    path: web::Path<(u32, u32)>,
    web::Json(body): web::Json<Body>,
) -> Result<HttpResponse, AppError> {
    Ok(HttpResponse::Ok().body(format!("{}/{}/{}", path.0, path.1, body.tag)))
}

fn main() {
    let _app = App::new().service(h).service(reversed);
}
