//! Attribute macros of [distlock](https://docs.rs/distlock). Depend on `distlock`, which
//! re-exports them; the generated code calls `distlock::__private`.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

use proc_macro::TokenStream;

// Parse, check, expand: the arguments (`args`), their checks (`check`, `template`,
// `duration`), the checks that relate them (`valid`), the function's shape (`shape`) and
// where errors land (`spans`), the pieces both attributes emit (`shared`) and the names
// they introduce (`names`), then one module per attribute.
mod args;
mod check;
mod duration;
mod idempotent;
mod lock;
mod names;
mod shape;
mod shared;
#[cfg(test)]
mod snapshots;
mod spans;
mod template;
mod valid;

/// Runs an async fn's body under a distributed lock; see `distlock::distributed_lock`.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    lock::distributed_lock(args.into(), item.into()).into()
}

/// Runs an async fn or an axum/actix-web handler once per key; see `distlock::idempotent`.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    idempotent::idempotent(args.into(), item.into()).into()
}
