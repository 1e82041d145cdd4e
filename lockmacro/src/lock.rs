//! `#[distributed_lock]`: arguments → validated config → acquire / run / release.

use proc_macro2::{Delimiter, Span, TokenStream};
use quote::{ToTokens, quote};
use syn::{Expr, Ident, ItemFn, ReturnType, Type};

use crate::args::{
    ArgSlots, Errors, RawArgs, bool_lit, crate_arg, duration_arg, on_lost_arg, replicas_arg,
    replicas_tokens, template_arg,
};
use crate::shape::{
    Shape, parse_fn, shape_and_config, typed_body, with_error, wrap_async_trait_body,
};
use crate::shared::{client_expr, key_expr};
use crate::spans::{group, output_span, respan};
use crate::template::Template;

pub(crate) const LOCK_ARGS: &[&str] = &[
    "key", "ttl", "wait", "renew", "max_hold", "on_lost", "replicas", "client", "crate",
];

/// A validated `#[distributed_lock]`.
struct LockConfig {
    krate: syn::Path,
    key: Template,
    ttl_ms: u64,
    wait_ms: u64,
    renew: bool,
    /// Zero: no cap.
    max_hold_ms: u64,
    cancel_on_lost: bool,
    /// `None`: the client's default.
    replicas: Option<u32>,
    client: Option<Expr>,
}

pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut func = match parse_fn(item, "distributed_lock") {
        Ok(f) => f,
        Err(out) => return out,
    };
    let (shape, config, mut errors) =
        shape_and_config(&mut func, args, "distributed_lock", lock_config);
    if let ReturnType::Default = func.sig.output {
        errors.push(syn::Error::new(
            func.sig.paren_token.span.close(),
            "`#[distributed_lock]` functions must return `Result<T, E>` where `E: From<distlock::Error>`; add a return type",
        ));
    }
    match (errors.finish(), config) {
        (Some(e), _) => with_error(func.into_token_stream(), e),
        (None, Some(config)) => {
            let out = expand(func, shape, &config);
            if std::env::var_os("DISTLOCK_MACROS_DEBUG").is_some() {
                eprintln!("{out}");
            }
            out
        }
        (None, None) => func.into_token_stream(),
    }
}

/// `bindings` is `None` when the function's shape is already reported as wrong; the
/// placeholders are checked here so their errors come with the other argument errors.
fn lock_config(
    raw: RawArgs,
    bindings: Option<&[String]>,
    errors: &mut Errors,
) -> Option<LockConfig> {
    let mut slots = ArgSlots::sort(raw, LOCK_ARGS, errors);
    let krate = crate_arg(&mut slots, errors);
    let key = match slots.take("key") {
        Some(arg) => template_arg(&arg, "the key template", bindings, errors),
        None => {
            errors.push(syn::Error::new(
                Span::call_site(),
                "missing required argument `key`, e.g. `#[distributed_lock(key = \"order:<id>\")]`",
            ));
            None
        }
    };
    let ttl = duration_arg(slots.take("ttl"), errors, "", 30_000);
    let wait = duration_arg(
        slots.take("wait"),
        errors,
        "; leave `wait` out for one try that fails fast with `Busy`",
        0,
    );
    let renew_arg = slots.take("renew");
    let renew = match &renew_arg {
        Some(arg) => match bool_lit(arg) {
            Ok(b) => Some(b),
            Err(e) => {
                errors.push(e);
                None
            }
        },
        None => Some(false),
    };
    let needs_renew = |name: &str, arg: &crate::args::RawArg, errors: &mut Errors| {
        if renew == Some(false) {
            errors.push(syn::Error::new(
                arg.name.span(),
                format!("`{name}` only applies to lease keeping; add `renew = true`"),
            ));
        }
    };
    let max_hold_arg = slots.take("max_hold");
    if let Some(arg) = &max_hold_arg {
        needs_renew("max_hold", arg, errors);
    }
    let max_hold = duration_arg(max_hold_arg, errors, "", 0);
    let cancel_on_lost = match slots.take("on_lost") {
        Some(arg) => {
            needs_renew("on_lost", &arg, errors);
            on_lost_arg(&arg, errors)
        }
        None => Some(true),
    };
    let replicas = replicas_arg(slots.take("replicas"), errors);
    let client = slots.take("client").map(|a| a.value);
    Some(LockConfig {
        krate: krate?,
        key: key?,
        ttl_ms: ttl?,
        wait_ms: wait?,
        renew: renew?,
        max_hold_ms: max_hold?,
        cancel_on_lost: cancel_on_lost?,
        replicas: replicas?,
        client,
    })
}

fn expand(mut func: ItemFn, shape: Shape, config: &LockConfig) -> TokenStream {
    match shape {
        Shape::Async => {
            let (ret, body) = typed_body(&func, "__distlock_ret");
            let wrapped = locked_call(config, &ret, false, body);
            func.block = Box::new(syn::parse_quote!({ #wrapped }));
        }
        Shape::AsyncTrait(_) => wrap_async_trait_body(&mut func.block, |ret, body| {
            locked_call(config, ret, true, body)
        }),
        Shape::NotAsync => {}
    }
    func.into_token_stream()
}

/// Key, client, then `run_locked(client, key, spec, async move { body }).await`.
fn locked_call(
    config: &LockConfig,
    ret: &Type,
    async_trait: bool,
    body: TokenStream,
) -> TokenStream {
    let krate = &config.krate;
    let key_var = Ident::new("__distlock_key", Span::mixed_site());
    let client_var = Ident::new("__distlock_client", Span::mixed_site());
    let buf = Ident::new("__distlock_buf", Span::mixed_site());
    let key = key_expr(krate, &config.key, &buf, async_trait);
    let client = client_expr(krate, config.client.as_ref(), async_trait);
    let LockConfig {
        ttl_ms,
        wait_ms,
        renew,
        max_hold_ms,
        cancel_on_lost,
        replicas,
        ..
    } = config;
    let replicas = replicas_tokens(*replicas);
    // The call and its `.await` both require `R: LockOutput`. Both on one token of the
    // return type, a return type that is not `Result<T, E: From<Error>>` is reported
    // there, once, rather than on the whole attribute.
    let at = output_span(ret);
    let run = respan(quote!(#krate::__private::run_locked), at);
    let args = group(
        Delimiter::Parenthesis,
        quote! {
            #client_var,
            #key_var,
            #krate::__private::LockSpec {
                ttl_ms: #ttl_ms,
                wait_ms: #wait_ms,
                renew: #renew,
                max_hold_ms: #max_hold_ms,
                cancel_on_lost: #cancel_on_lost,
                replicas: #replicas,
            },
            async move { #body },
        },
        at,
    );
    let dot_await = respan(quote!(.await), at);
    quote! {
        let #key_var: ::std::string::String = #key;
        let #client_var = #client;
        #run #args #dot_await
    }
}
