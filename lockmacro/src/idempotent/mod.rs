//! `#[idempotent]`: arguments → validated config → claim / run / store or release.
//!
//! Two modes, chosen by the arguments:
//! - `key = "pay:<id>"` on any async fn returning `Result<T, E>`: the `Ok` value is
//!   stored as JSON and replayed (`run_idempotent`).
//! - `header = "Idempotency-Key"` on an axum or actix-web handler: a hidden first
//!   parameter extracts the request's header, method, route and query; the handler's
//!   response is captured, stored and replayed, and its return type becomes
//!   `IdemResponse` (`HandlerRun`).
//!
//! A sibling `#[distributed_lock(...)]` below this attribute is applied here first, to the
//! original signature, so the claim always happens outside the lock (see
//! [`take_sibling_lock`]).

use proc_macro2::TokenStream;
use quote::{ToTokens, quote};
use syn::ItemFn;

use crate::args::RawArgs;
use crate::shape::{parse_fn, shape_and_config, with_error};
pub(crate) use config::Source;
use config::idem_config;
use expand::*;

mod config;
mod detach;
mod expand;

pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut func = match parse_fn(item, "idempotent") {
        Ok(f) => f,
        Err(out) => return out,
    };
    // Apply a `#[distributed_lock]` written below this attribute now, so the lock ends
    // up inside the idempotency claim (as it does when written above).
    let mut extra = TokenStream::new();
    if let Some((lock_path, lock_args)) = take_sibling_lock(&mut func) {
        let locked = crate::lock::distributed_lock(lock_args, func.to_token_stream());
        match split_fn(locked.clone()) {
            Some((f, rest)) => {
                func = f;
                extra = rest;
                // The attribute is gone: name its path once so the user's
                // `use distlock::distributed_lock` does not look unused. (Not in an
                // `#[async_trait]` body, whose shape must stay as it is.)
                if func.sig.asyncness.is_some() {
                    let body = &func.block;
                    *func.block = syn::parse_quote!({
                        #[allow(unused_imports)]
                        use #lock_path as _;
                        #body
                    });
                }
            }
            None => return locked,
        }
    }
    let (shape, config, mut errors) = shape_and_config(&mut func, args, "idempotent", idem_config);
    if let Some(config) = &config {
        crate::valid::idem_fn(
            &func,
            &shape,
            &config.source,
            config.name.is_some(),
            &mut errors,
        );
    }
    let out = match (errors.finish(), config) {
        (Some(e), _) => with_error(func.into_token_stream(), e),
        (None, Some(config)) => expand_fn(func, shape, &config),
        (None, None) => func.into_token_stream(),
    };
    let out = quote!(#out #extra);
    if std::env::var_os("DISTLOCK_MACROS_DEBUG").is_some() {
        eprintln!("{out}");
    }
    out
}

/// Removes a `#[distributed_lock(...)]` from the fn's attributes, returning its arguments.
///
/// Attribute macros run outermost first and see the attributes below them still
/// attached. With `#[idempotent]` above `#[distributed_lock]`, leaving the lock attribute
/// in place would wrap the lock around the whole idempotent expansion (and, for a
/// handler, around a signature it does not expect). Applying it here instead gives the
/// same nesting as the other order: claim first, then lock, then the body; repeats are
/// answered from the record without touching the lock.
///
/// Found by its name, or, imported under another name (`use distlock::distributed_lock
/// as lock`), by its arguments: a list of `name = value` pairs, all of them the lock's,
/// `key` among them. (A macro cannot see what an import names.)
pub(super) fn take_sibling_lock(func: &mut ItemFn) -> Option<(syn::Path, TokenStream)> {
    let looks_like_lock = |a: &syn::Attribute| {
        let syn::Meta::List(list) = &a.meta else {
            return false;
        };
        match syn::parse2::<RawArgs>(list.tokens.clone()) {
            Ok(RawArgs(args)) => {
                args.iter().any(|arg| arg.name == "key")
                    && args
                        .iter()
                        .all(|arg| crate::lock::LOCK_ARGS.iter().any(|n| arg.name == n))
            }
            Err(_) => false,
        }
    };
    let at = func.attrs.iter().position(|a| {
        a.path()
            .segments
            .last()
            .is_some_and(|s| s.ident == "distributed_lock")
            || (!a.path().is_ident("doc") && looks_like_lock(a))
    })?;
    let attr = func.attrs.remove(at);
    let path = attr.path().clone();
    Some(match attr.meta {
        syn::Meta::List(list) => (path, list.tokens),
        _ => (path, TokenStream::new()),
    })
}

/// The fn out of a macro's output, and whatever follows it (`compile_error!`s).
pub(super) fn split_fn(tokens: TokenStream) -> Option<(ItemFn, TokenStream)> {
    let file: syn::File = syn::parse2(tokens).ok()?;
    let mut func = None;
    let mut rest = TokenStream::new();
    for item in file.items {
        match item {
            syn::Item::Fn(f) if func.is_none() => func = Some(f),
            other => other.to_tokens(&mut rest),
        }
    }
    Some((func?, rest))
}
