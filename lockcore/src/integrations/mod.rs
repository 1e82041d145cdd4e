//! Framework integrations of `#[idempotent(header = ...)]` and of [`Error`](crate::Error)
//! as an HTTP response: axum (feature `axum`) and actix-web (feature `actix`).

#[cfg(feature = "actix")]
pub(crate) mod actix;
#[cfg(feature = "axum")]
pub(crate) mod axum;
#[cfg(all(feature = "axum", feature = "actix"))]
mod both;
