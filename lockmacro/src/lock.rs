//! `#[distributed_lock]`: arguments → validated config → acquire / run / release.

use proc_macro2::{Delimiter, Span, TokenStream};
use quote::{ToTokens, quote};
use syn::{Expr, ItemFn, Type};

use crate::args::{Arg, ArgSlots, Errors, RawArgs, replicas_tokens};
use crate::names::Names;
use crate::shape::{
    Shape, parse_fn, shape_and_config, typed_body, with_error, wrap_async_trait_body,
};
use crate::shared::{client_expr, key_expr};
use crate::spans::{group, output_span, respan};
use crate::template::Template;
use crate::valid;

pub(crate) const LOCK_ARGS: &[&str] = &[
    "key", "keys", "ttl", "wait", "renew", "max_hold", "min_hold", "on_lost", "replicas",
    "permits", "mode", "client", "crate",
];

/// What the attribute takes (`permits`, `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Lock,
    Permits(u32),
    Read,
    Write,
}

/// A validated `#[distributed_lock]`.
struct LockConfig {
    krate: syn::Path,
    /// One template for `key`; those of `keys` (a multi-lock) otherwise.
    keys: Vec<Template>,
    multi: bool,
    ttl_ms: u64,
    wait_ms: u64,
    renew: bool,
    /// Zero: no cap.
    max_hold_ms: u64,
    /// Zero: released at once.
    min_hold_ms: u64,
    cancel_on_lost: bool,
    /// `None`: the client's default.
    replicas: Option<u32>,
    kind: Kind,
    client: Option<Expr>,
    names: Names,
}

pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut func = match parse_fn(item, "distributed_lock") {
        Ok(f) => f,
        Err(out) => return out,
    };
    let (shape, config, mut errors) =
        shape_and_config(&mut func, args, "distributed_lock", lock_config);
    valid::lock_fn(&func, &mut errors);
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
    let krate = slots.krate(errors);
    let key = slots.template("key", "the key template", bindings, errors);
    let keys = slots.templates("keys", bindings, errors);
    if key.is_absent() && keys.is_absent() {
        errors.push(syn::Error::new(
            Span::call_site(),
            "missing required argument `key`, e.g. `#[distributed_lock(key = \"order:<id>\")]` (or `keys = [..]` for several locks at once)",
        ));
    }
    let ttl = slots.duration("ttl", "", errors);
    let wait = slots.duration(
        "wait",
        "; leave `wait` out for one try that fails fast with `Busy`",
        errors,
    );
    let renew = slots.bool("renew", errors);
    let max_hold = slots.duration("max_hold", "", errors);
    let min_hold = slots.duration(
        "min_hold",
        "; leave `min_hold` out to release at once",
        errors,
    );
    let on_lost = slots.on_lost(errors);
    let replicas = slots.replicas(errors);
    let permits = slots.permits(errors);
    let mode = slots.mode(errors);
    let client = slots.expr("client");
    valid::lock_options(&renew, &max_hold, &on_lost, errors);
    valid::min_hold(&min_hold, &ttl, 30_000, errors);
    let kind = valid::lock_kind(&permits, &mode, &min_hold, errors);
    valid::one_source_of_keys(&key, &keys, &permits, &mode, errors);
    let multi = !keys.is_absent();
    let keys = match (key, keys) {
        (Arg::Given(_, key), Arg::Absent) => vec![key],
        (Arg::Absent, Arg::Given(_, keys)) => keys,
        _ => return None,
    };
    Some(LockConfig {
        krate: krate.or(syn::parse_quote!(::distlock))?,
        keys,
        multi,
        ttl_ms: ttl.or(30_000)?,
        wait_ms: wait.or(0)?,
        renew: renew.or(false)?,
        max_hold_ms: max_hold.or(0)?,
        min_hold_ms: min_hold.or(0)?,
        cancel_on_lost: on_lost.or(true)?,
        replicas: replicas.optional()?,
        kind: kind?,
        client,
        names: Names::lock(),
    })
}

fn expand(mut func: ItemFn, shape: Shape, config: &LockConfig) -> TokenStream {
    match shape {
        Shape::Async => {
            let (ret, body) = typed_body(&func, &config.names.ret);
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
    let (key_var, client_var) = (&config.names.key, &config.names.client);
    let keys: Vec<TokenStream> = config
        .keys
        .iter()
        .map(|key| key_expr(krate, key, &config.names.buf, async_trait))
        .collect();
    let (key, key_ty, run) = if config.multi {
        (
            quote!(::std::vec![#(#keys),*]),
            quote!(::std::vec::Vec<::std::string::String>),
            quote!(run_multi_locked),
        )
    } else {
        let key = &keys[0];
        (
            quote!(#key),
            quote!(::std::string::String),
            quote!(run_locked),
        )
    };
    let client = client_expr(krate, config.client.as_ref(), async_trait);
    let template: Vec<String> = config.keys.iter().map(|k| k.lit.value()).collect();
    let template = template.join(", ");
    let LockConfig {
        ttl_ms,
        wait_ms,
        renew,
        max_hold_ms,
        min_hold_ms,
        cancel_on_lost,
        replicas,
        kind,
        ..
    } = config;
    let replicas = replicas_tokens(*replicas);
    let kind = match kind {
        Kind::Lock => quote!(#krate::__private::LockKind::Lock),
        Kind::Permits(n) => quote!(#krate::__private::LockKind::Permits(#n)),
        Kind::Read => quote!(#krate::__private::LockKind::Read),
        Kind::Write => quote!(#krate::__private::LockKind::Write),
    };
    // The call and its `.await` both require `R: LockOutput`. Both on one token of the
    // return type, a return type that is not `Result<T, E: From<Error>>` is reported
    // there, once, rather than on the whole attribute.
    let at = output_span(ret);
    let run = respan(quote!(#krate::__private::#run), at);
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
                min_hold_ms: #min_hold_ms,
                cancel_on_lost: #cancel_on_lost,
                replicas: #replicas,
                kind: #kind,
                template: #template,
            },
            async move { #body },
        },
        at,
    );
    let dot_await = respan(quote!(.await), at);
    quote! {
        let #key_var: #key_ty = #key;
        let #client_var = #client;
        #run #args #dot_await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config `args` give on a fn binding `bindings`, or every error message.
    fn config(args: TokenStream, bindings: &[&str]) -> Result<LockConfig, Vec<String>> {
        let bindings: Vec<String> = bindings.iter().map(|b| (*b).to_owned()).collect();
        let mut errors = Errors::default();
        let raw = syn::parse2::<RawArgs>(args).expect("arguments parse");
        let config = lock_config(raw, Some(&bindings), &mut errors);
        match errors.finish() {
            Some(e) => Err(e.into_iter().map(|e| e.to_string()).collect()),
            None => Ok(config.expect("no errors, so a config")),
        }
    }

    fn errors(args: TokenStream, bindings: &[&str]) -> Vec<String> {
        match config(args, bindings) {
            Ok(_) => panic!("expected errors"),
            Err(e) => e,
        }
    }

    #[test]
    fn defaults() {
        let c = config(quote!(key = "order:<id>"), &["id"]).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(c.keys[0].lit.value(), "order:<id>");
        assert_eq!((c.ttl_ms, c.wait_ms, c.max_hold_ms), (30_000, 0, 0));
        assert!(!c.renew && c.cancel_on_lost);
        assert_eq!(c.replicas, None);
        assert!(c.client.is_none());
        assert_eq!(c.krate.to_token_stream().to_string(), ":: distlock");
        assert_eq!(c.names.key.to_string(), "__distlock_key");
    }

    #[test]
    fn every_option() {
        let c = config(
            quote!(
                key = "a:<id>",
                ttl = "1m30s",
                wait = "250ms",
                renew = true,
                max_hold = "5m",
                on_lost = "continue",
                replicas = 2,
                client = app.locks,
                crate = "my::dl"
            ),
            &["id", "app"],
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!((c.ttl_ms, c.wait_ms, c.max_hold_ms), (90_000, 250, 300_000));
        assert!(c.renew && !c.cancel_on_lost);
        assert_eq!(c.replicas, Some(2));
        assert_eq!(c.client.to_token_stream().to_string(), "app . locks");
        assert_eq!(c.krate.to_token_stream().to_string(), "my :: dl");
    }

    #[test]
    fn what_it_takes() {
        let kind =
            |args: TokenStream| config(args, &["a", "b"]).map(|c| (c.kind, c.multi, c.keys.len()));
        assert_eq!(kind(quote!(key = "k")), Ok((Kind::Lock, false, 1)));
        assert_eq!(
            kind(quote!(key = "k", permits = 4)),
            Ok((Kind::Permits(4), false, 1))
        );
        assert_eq!(
            kind(quote!(key = "k", mode = "read")),
            Ok((Kind::Read, false, 1))
        );
        assert_eq!(
            kind(quote!(key = "k", mode = "write")),
            Ok((Kind::Write, false, 1))
        );
        assert_eq!(
            kind(quote!(keys = ["x:<a>", "x:<b>"])),
            Ok((Kind::Lock, true, 2))
        );
        let e = errors(quote!(keys = ["x:<a>", "x:<a>"], permits = 2), &["a"]);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].starts_with("this key is named twice"), "{e:?}");
        assert!(
            e[1].starts_with("`permits` does not apply to `keys`"),
            "{e:?}"
        );
        let e = errors(quote!(key = "k", mode = "read", permits = 2), &[]);
        assert!(
            e[0].starts_with("`mode` and `permits` exclude each other"),
            "{e:?}"
        );
    }

    #[test]
    fn a_missing_key_and_bad_values_are_all_reported() {
        let e = errors(quote!(ttl = "0s", wait = "3x", replicas = "one"), &[]);
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(e[0].starts_with("missing required argument `key`"), "{e:?}");
        assert_eq!(e[1], "`ttl` must be greater than zero");
        assert!(e[2].contains("unknown unit `x`") && e[2].ends_with("(in `wait`)"));
        assert!(e[3].starts_with("`replicas` expects how many replicas"));
    }

    #[test]
    fn lease_options_need_renew() {
        let e = errors(
            quote!(key = "a", max_hold = "5m", on_lost = "continue"),
            &[],
        );
        assert_eq!(
            e,
            [
                "`max_hold` only applies to lease keeping; add `renew = true`",
                "`on_lost` only applies to lease keeping; add `renew = true`",
            ]
        );
        let e = errors(quote!(key = "a", renew = false, max_hold = "5m"), &[]);
        assert_eq!(e.len(), 1, "{e:?}");
        // An invalid `renew` is reported once, not again for what needs it.
        let e = errors(quote!(key = "a", renew = "yes", max_hold = "5m"), &[]);
        assert_eq!(e, ["`renew` expects `true` or `false`"]);
        assert!(config(quote!(key = "a", renew = true, on_lost = "cancel"), &[]).is_ok());
    }

    #[test]
    fn min_hold_is_at_most_the_ttl() {
        let c = config(quote!(key = "job", ttl = "10m", min_hold = "5m"), &[])
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(c.min_hold_ms, 300_000);
        assert_eq!(
            config(quote!(key = "job"), &[]).ok().map(|c| c.min_hold_ms),
            Some(0)
        );
        let e = errors(quote!(key = "job", min_hold = "5m"), &[]);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("`min_hold` is longer than the default `ttl` of 30s"));
        let e = errors(quote!(key = "job", ttl = "1m", min_hold = "2m"), &[]);
        assert!(
            e[0].starts_with("`min_hold` is longer than `ttl`:"),
            "{e:?}"
        );
        let e = errors(quote!(key = "job", min_hold = "0s"), &[]);
        assert_eq!(
            e,
            ["`min_hold` must be greater than zero; leave `min_hold` out to release at once"]
        );
        // An invalid `ttl` is reported once, not again for `min_hold`.
        let e = errors(quote!(key = "job", ttl = "soon", min_hold = "2m"), &[]);
        assert_eq!(e.len(), 1, "{e:?}");
    }

    #[test]
    fn names_and_placeholders_are_checked() {
        let e = errors(
            quote!(key = "a:<od>", tll = "1s", ttl = "1s", ttl = "2s"),
            &["id"],
        );
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e[0].starts_with("unknown argument `tll`: did you mean `ttl`?"));
        assert_eq!(e[1], "duplicate argument `ttl`");
        assert!(e[2].contains("did you mean `<id>`?"), "{e:?}");
        let e = errors(quote!(key = 42), &[]);
        assert_eq!(e, ["`key` expects a string literal, e.g. `key = \"...\"`"]);
    }
}
