//! A return type that is both an axum response and an actix responder (`String`,
//! `Vec<u8>`, `&'static str`, ...): rendered by the framework that extracted the request.

use actix_web::Responder;
use axum::response::IntoResponse;

use crate::idempotency::http::{
    CaptureBoth, IdemRequest, Origin, Reply, SendCapture, internal_error,
};

impl<T: IntoResponse + Responder> CaptureBoth for &&&Reply<T> {
    fn __distlock_capture(&self, req: &IdemRequest, max_body: usize) -> SendCapture {
        let value = self.take();
        match req.origin {
            Origin::Actix(id) => {
                // The future must be `Send` (the same code serves axum), so an actix body
                // is read now; the types that are both are all in-memory bodies.
                let cap = super::actix::capture_now(value, id, max_body).unwrap_or_else(|_| {
                    internal_error("a streaming actix body cannot be captured from a type that is also an axum response").into()
                });
                Box::pin(std::future::ready(cap))
            }
            _ => Box::pin(super::axum::capture(value.into_response(), max_body)),
        }
    }
}
