//! Checks that relate one argument to another, or an argument to the function (serde's
//! `internals/check.rs`: "cross-cutting checks that require looking at more than a single
//! attrs object"). A check of one argument alone happens where it is parsed (`args.rs`);
//! these run once every argument is parsed, and only say what the parsers cannot.

use proc_macro2::Span;
use syn::{ItemFn, LitStr, ReturnType};

use crate::args::{Arg, Errors};
use crate::idempotent::Source;
use crate::lock::Kind;
use crate::shape::Shape;
use crate::template::Template;

/// `#[distributed_lock]`: `max_hold` and `on_lost` are about lease keeping, which only
/// `renew = true` turns on (an invalid `renew` is reported already, not again here).
pub(crate) fn lock_options(
    renew: &Arg<bool>,
    max_hold: &Arg<u64>,
    on_lost: &Arg<bool>,
    errors: &mut Errors,
) {
    if !renew.is_absent() && renew.value().is_none() {
        return;
    }
    if renew.value() == Some(&true) {
        return;
    }
    for name in [max_hold.name(), on_lost.name()].into_iter().flatten() {
        errors.push(syn::Error::new(
            name.span(),
            format!("`{name}` only applies to lease keeping; add `renew = true`"),
        ));
    }
}

/// `#[distributed_lock]`: `min_hold` keeps the lock by its lease, so it cannot be longer
/// than `ttl` (`default_ttl_ms` when `ttl` is absent; an invalid `ttl` is reported
/// already).
pub(crate) fn min_hold(
    min_hold: &Arg<u64>,
    ttl: &Arg<u64>,
    default_ttl_ms: u64,
    errors: &mut Errors,
) {
    let (Arg::Given(name, min_ms), Some(ttl_ms)) = (
        min_hold,
        ttl.value()
            .copied()
            .or(ttl.is_absent().then_some(default_ttl_ms)),
    ) else {
        return;
    };
    if *min_ms > ttl_ms {
        let ttl = if ttl.is_absent() {
            "the default `ttl` of 30s".to_owned()
        } else {
            "`ttl`".to_owned()
        };
        errors.push(syn::Error::new(
            name.span(),
            format!(
                "`min_hold` is longer than {ttl}: the lock is kept by its lease, which `ttl` bounds; lower `min_hold` or raise `ttl`"
            ),
        ));
    }
}

/// `#[distributed_lock]`: what it takes. `permits` and `mode` exclude each other, and
/// `min_hold` (a run-once job's lock) goes with neither. `None` when that is not so or
/// one of them is invalid (reported already).
pub(crate) fn lock_kind(
    permits: &Arg<u32>,
    mode: &Arg<bool>,
    min_hold: &Arg<u64>,
    errors: &mut Errors,
) -> Option<Kind> {
    if let (Some(p), Some(m)) = (permits.name(), mode.name()) {
        let mut e = syn::Error::new(
            m.span(),
            "`mode` and `permits` exclude each other: a read/write lock has no count, a semaphore no mode",
        );
        e.combine(syn::Error::new(
            p.span(),
            "`permits` is given here; keep one of the two",
        ));
        errors.push(e);
        return None;
    }
    if let Some(min_hold) = min_hold.name() {
        let (other, what) = match (permits.name(), mode.name()) {
            (Some(p), _) => (p, "a semaphore (`permits`)"),
            (_, Some(m)) => (m, "a read/write lock (`mode`)"),
            _ => return kind_of(permits, mode),
        };
        let mut e = syn::Error::new(
            min_hold.span(),
            format!(
                "`min_hold` keeps a lock for a job that must run once per period; it does not apply to {what}"
            ),
        );
        e.combine(syn::Error::new(
            other.span(),
            format!("{what} is asked for here; remove `min_hold`, or `{other}` for a plain lock"),
        ));
        errors.push(e);
        return None;
    }
    kind_of(permits, mode)
}

/// `#[distributed_lock]`: `key` or `keys`, not both; `keys` takes locks, so neither
/// `permits` nor `mode` (a missing key is reported where the keys are parsed).
pub(crate) fn one_source_of_keys(
    key: &Arg<Template>,
    keys: &Arg<Vec<Template>>,
    permits: &Arg<u32>,
    mode: &Arg<bool>,
    errors: &mut Errors,
) {
    let Some(many) = keys.name() else {
        return;
    };
    if let Some(one) = key.name() {
        let mut e = syn::Error::new(
            many.span(),
            "`keys` and `key` exclude each other: `keys = [..]` takes several locks at once, `key` one",
        );
        e.combine(syn::Error::new(
            one.span(),
            "`key` is given here; keep one of the two",
        ));
        errors.push(e);
    }
    for other in [permits.name(), mode.name()].into_iter().flatten() {
        errors.push(syn::Error::new(
            other.span(),
            format!("`{other}` does not apply to `keys`: a multi-lock takes plain locks"),
        ));
    }
}

fn kind_of(permits: &Arg<u32>, mode: &Arg<bool>) -> Option<Kind> {
    match (permits, mode) {
        (Arg::Invalid(_), _) | (_, Arg::Invalid(_)) => None,
        (Arg::Given(_, n), _) => Some(Kind::Permits(*n)),
        (_, Arg::Given(_, true)) => Some(Kind::Read),
        (_, Arg::Given(_, false)) => Some(Kind::Write),
        _ => Some(Kind::Lock),
    }
}

/// `#[distributed_lock]` on the fn: it must return a `Result`.
pub(crate) fn lock_fn(func: &ItemFn, errors: &mut Errors) {
    if let ReturnType::Default = func.sig.output {
        errors.push(syn::Error::new(
            func.sig.paren_token.span.close(),
            "`#[distributed_lock]` functions must return `Result<T, E>` where `E: From<distlock::Error>`; add a return type",
        ));
    }
}

/// `#[idempotent]`'s key comes from exactly one of `key` and `header`. `None` when that
/// is not so, or the one given is invalid.
pub(crate) fn idem_source(
    key: Arg<Template>,
    header: Arg<LitStr>,
    errors: &mut Errors,
) -> Option<Source> {
    match (key, header) {
        (Arg::Absent, Arg::Absent) => {
            errors.push(syn::Error::new(
                Span::call_site(),
                "missing `key` or `header`: write `#[idempotent(key = \"pay:<id>\")]` on an async fn, or `#[idempotent(header = \"Idempotency-Key\", scope = \"<user>\")]` on an axum or actix-web handler",
            ));
            None
        }
        (key, Arg::Absent) => key.required().map(Source::Key),
        (Arg::Absent, header) => header.required().map(Source::Header),
        (_, header) => {
            let name = header.name().expect("a header argument was written");
            errors.push(syn::Error::new(
                name.span(),
                "`key` and `header` cannot be used together: `key = \"...\"` builds the key from the fn's parameters, `header = \"Idempotency-Key\"` takes it from a request header",
            ));
            None
        }
    }
}

/// The options of one kind of `#[idempotent]` written on the other: `required` and
/// `max_body` mean something for handlers only, `fingerprint` and `skip` for keyed fns
/// only; and a handler must say whose keys they are (`scope`).
pub(crate) fn idem_options(
    source: Option<&Source>,
    scope: &Arg<Template>,
    header_only: [Option<&syn::Ident>; 2],
    key_only: [Option<&syn::Ident>; 2],
    errors: &mut Errors,
) {
    if let (Some(Source::Header(lit)), Arg::Absent) = (source, scope) {
        errors.push(syn::Error::new(
            lit.span(),
            "`header = ...` needs a `scope`: who may replay this endpoint's stored responses. Write `scope = \"<user>\"` with a binding that identifies the caller (each caller's keys are then its own), or a literal such as `scope = \"provider-webhooks\"` for an endpoint whose callers may share records; without a scope, anyone who knows a key gets the response stored under it and can claim keys before their owner",
        ));
    }
    if let Some(Source::Key(_)) = source {
        for name in header_only.into_iter().flatten() {
            errors.push(syn::Error::new(
                name.span(),
                format!("`{name}` only applies to handlers keyed by `header = \"...\"`"),
            ));
        }
    }
    if let Some(Source::Header(_)) = source {
        for name in key_only.into_iter().flatten() {
            errors.push(syn::Error::new(
                name.span(),
                format!(
                    "`{name}` only applies to fns keyed by `key = \"...\"`: a handler's fingerprint is the request as sent (method, route, path, query and body), whatever its bindings"
                ),
            ));
        }
    }
}

/// `#[idempotent]` on the fn: a method names its records' namespace; a keyed fn returns
/// a `Result`; `header` only on a plain `async fn` (a handler), not a trait method.
pub(crate) fn idem_fn(
    func: &ItemFn,
    shape: &Shape,
    source: &Source,
    named: bool,
    errors: &mut Errors,
) {
    if !named && func.sig.receiver().is_some() {
        errors.push(syn::Error::new(
            func.sig.ident.span(),
            format!(
                "`#[idempotent]` on a method needs `name = \"...\"`: records are namespaced by module path and fn name, which the methods named `{}` of every type in this module share (`impl Email {{ fn notify }}` and `impl Sms {{ fn notify }}` would answer each other's calls); name the namespace, e.g. `name = \"<type>-{}\"`",
                func.sig.ident, func.sig.ident
            ),
        ));
    }
    match (source, shape) {
        (Source::Key(_), _) if matches!(func.sig.output, ReturnType::Default) => {
            errors.push(syn::Error::new(
                func.sig.paren_token.span.close(),
                "`#[idempotent(key = ...)]` functions must return `Result<T, E>` where `T: Serialize + DeserializeOwned` and `E: From<distlock::Error>`; add a return type",
            ));
        }
        (Source::Header(lit), Shape::AsyncTrait(_)) => errors.push(syn::Error::new(
            lit.span(),
            "`header = ...` works on axum and actix-web handlers (plain `async fn`s); use `key = \"...\"` in trait methods",
        )),
        _ => {}
    }
}
