//! `#[idempotent(...)]` arguments → a validated [`IdemConfig`].

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Expr, Ident, LitStr};

use crate::args::{
    ArgSlots, Errors, RawArg, RawArgs, bool_lit, crate_arg, duration_arg, lit_str, on_lost_arg,
    template_arg,
};
use crate::check::closest;
use crate::template::Template;

pub(super) const IDEM_ARGS: &[&str] = &[
    "key",
    "header",
    "scope",
    "ttl",
    "lease",
    "wait",
    "required",
    "fingerprint",
    "skip",
    "max_body",
    "on_lost",
    "replicas",
    "name",
    "detach",
    "client",
    "crate",
];

/// Where the idempotency key comes from.
pub(super) enum Source {
    /// A template over the fn's parameters.
    Key(Template),
    /// A request header (handlers).
    Header(LitStr),
}

/// A validated `#[idempotent]`.
pub(super) struct IdemConfig {
    pub(super) krate: syn::Path,
    pub(super) source: Source,
    pub(super) scope: Option<Template>,
    pub(super) ttl_ms: u64,
    pub(super) lease_ms: u64,
    pub(super) wait_ms: u64,
    pub(super) required: bool,
    /// `fingerprint = [a, b]`: only these bindings (each must be `Serialize`).
    pub(super) fingerprint: Option<Vec<Ident>>,
    /// `skip = [pool]`: bindings left out of the fingerprint.
    pub(super) skip: Vec<Ident>,
    pub(super) max_body: u64,
    /// `on_lost = "cancel"` (default): cancel the body when the claim is found lost.
    pub(super) cancel_on_lost: bool,
    /// `replicas = n`; `None`: the client's default.
    pub(super) replicas: Option<u32>,
    /// `name = "..."`: the records' namespace instead of `module::path::fn`.
    pub(super) name: Option<LitStr>,
    /// `detach = false`: keep the body in the caller's future even when it could run in
    /// a task of its own.
    pub(super) detach: bool,
    pub(super) client: Option<Expr>,
}

pub(super) fn idem_config(
    raw: RawArgs,
    bindings: Option<&[String]>,
    errors: &mut Errors,
) -> Option<IdemConfig> {
    let mut slots = ArgSlots::sort(raw, IDEM_ARGS, errors);
    let krate = crate_arg(&mut slots, errors);
    let key_arg = slots.take("key");
    let header_arg = slots.take("header");
    let source = match (key_arg, header_arg) {
        (Some(_), Some(header)) => {
            errors.push(syn::Error::new(
                header.name.span(),
                "`key` and `header` cannot be used together: `key = \"...\"` builds the key from the fn's parameters, `header = \"Idempotency-Key\"` takes it from a request header",
            ));
            None
        }
        (Some(key), None) => {
            template_arg(&key, "the key template", bindings, errors).map(Source::Key)
        }
        (None, Some(header)) => match lit_str(&header) {
            Ok(lit) => match header_name_error(&lit.value()) {
                Some(msg) => {
                    errors.push(syn::Error::new(lit.span(), msg));
                    None
                }
                None => Some(Source::Header(lit)),
            },
            Err(e) => {
                errors.push(e);
                None
            }
        },
        (None, None) => {
            errors.push(syn::Error::new(
                Span::call_site(),
                "missing `key` or `header`: write `#[idempotent(key = \"pay:<id>\")]` on an async fn, or `#[idempotent(header = \"Idempotency-Key\", scope = \"<user>\")]` on an axum or actix-web handler",
            ));
            None
        }
    };
    let is_key = matches!(source, Some(Source::Key(_)));
    let header_only = |arg: &RawArg, errors: &mut Errors| {
        if is_key {
            errors.push(syn::Error::new(
                arg.name.span(),
                format!(
                    "`{}` only applies to handlers keyed by `header = \"...\"`",
                    arg.name
                ),
            ));
        }
    };
    let scope = match slots.take("scope") {
        Some(arg) => Some(template_arg(&arg, "the scope template", bindings, errors)),
        None => {
            if let Some(Source::Header(lit)) = &source {
                errors.push(syn::Error::new(
                    lit.span(),
                    "`header = ...` needs a `scope`: who may replay this endpoint's stored responses. Write `scope = \"<user>\"` with a binding that identifies the caller (each caller's keys are then its own), or a literal such as `scope = \"provider-webhooks\"` for an endpoint whose callers may share records; without a scope, anyone who knows a key gets the response stored under it and can claim keys before their owner",
                ));
            }
            Some(None)
        }
    };
    let ttl = duration_arg(slots.take("ttl"), errors, "", 24 * 3_600_000);
    let lease = duration_arg(slots.take("lease"), errors, "", 30_000);
    let wait = duration_arg(
        slots.take("wait"),
        errors,
        "; leave `wait` out to answer a repeat that arrives while the first call runs with `InProgress` at once",
        0,
    );
    let required = match slots.take("required") {
        Some(arg) => {
            header_only(&arg, errors);
            match bool_lit(&arg) {
                Ok(b) => Some(b),
                Err(e) => {
                    errors.push(e);
                    None
                }
            }
        }
        None => Some(true),
    };
    let max_body = match slots.take("max_body") {
        Some(arg) => {
            header_only(&arg, errors);
            match size_arg(&arg) {
                Ok(n) => Some(n),
                Err(e) => {
                    errors.push(e);
                    None
                }
            }
        }
        None => Some(1024 * 1024),
    };
    let key_only = |arg: &RawArg, errors: &mut Errors| {
        if matches!(source, Some(Source::Header(_))) {
            errors.push(syn::Error::new(
                arg.name.span(),
                format!(
                    "`{}` only applies to fns keyed by `key = \"...\"`: a handler's fingerprint is the request as sent (method, route, path, query and body), whatever its bindings",
                    arg.name
                ),
            ));
        }
    };
    let fingerprint = match slots.take("fingerprint") {
        Some(arg) => {
            key_only(&arg, errors);
            match binding_list(&arg, bindings) {
                Ok(names) => Some(Some(names)),
                Err(e) => {
                    errors.push(e);
                    None
                }
            }
        }
        None => Some(None),
    };
    let skip = match slots.take("skip") {
        Some(arg) => {
            key_only(&arg, errors);
            match binding_list(&arg, bindings) {
                Ok(names) => Some(names),
                Err(e) => {
                    errors.push(e);
                    None
                }
            }
        }
        None => Some(Vec::new()),
    };
    let cancel_on_lost = match slots.take("on_lost") {
        Some(arg) => on_lost_arg(&arg, errors),
        None => Some(true),
    };
    let name = match slots.take("name") {
        Some(arg) => match lit_str(&arg) {
            Ok(lit) => match name_error(&lit.value()) {
                Some(msg) => {
                    errors.push(syn::Error::new(lit.span(), msg));
                    None
                }
                None => Some(Some(lit)),
            },
            Err(e) => {
                errors.push(e);
                None
            }
        },
        None => Some(None),
    };
    let detach = match slots.take("detach") {
        Some(arg) => match bool_lit(&arg) {
            Ok(b) => Some(b),
            Err(e) => {
                errors.push(e);
                None
            }
        },
        None => Some(true),
    };
    let replicas = crate::args::replicas_arg(slots.take("replicas"), errors);
    let client = slots.take("client").map(|a| a.value);
    Some(IdemConfig {
        krate: krate?,
        source: source?,
        scope: scope?,
        ttl_ms: ttl?,
        lease_ms: lease?,
        wait_ms: wait?,
        required: required?,
        fingerprint: fingerprint?,
        skip: skip?,
        max_body: max_body?,
        cancel_on_lost: cancel_on_lost?,
        replicas: replicas?,
        name: name?,
        detach: detach?,
        client,
    })
}

/// Why `name` cannot name a record namespace, if it cannot.
pub(super) fn name_error(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("the `name` is empty; write e.g. `name = \"email-notify\"`".into());
    }
    name.chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '{' | '}'))
        .map(|c| {
            format!(
                "`name = {name:?}`: {c:?} is not allowed in a record namespace (no whitespace, control characters or braces)"
            )
        })
}

/// Why `name` is not a valid HTTP header name, if it is not.
pub(super) fn header_name_error(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("the header name is empty; write e.g. `header = \"Idempotency-Key\"`".into());
    }
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    name.chars().find(|c| !token(*c)).map(|c| {
        format!("`{name}` is not a valid HTTP header name: `{}` is not allowed (use letters, digits and `-`)", c.escape_default())
    })
}

/// `max_body = 65536` or `max_body = "64KiB"` / `"1MiB"`.
pub(super) fn size_arg(arg: &RawArg) -> syn::Result<u64> {
    let bad = |span: Span| {
        syn::Error::new(
            span,
            "`max_body` expects a size in bytes: an integer such as `65536`, or a string such as `\"64KiB\"` or `\"1MiB\"`",
        )
    };
    match &arg.value {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) => i.base10_parse::<u64>(),
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) => {
            let text = s.value();
            let t = text.trim();
            let digits = t.len() - t.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            let n: u64 = t[..digits].parse().map_err(|_| bad(s.span()))?;
            let unit = match t[digits..].trim() {
                "" | "B" => 1,
                "KiB" => 1024,
                "MiB" => 1024 * 1024,
                _ => return Err(bad(s.span())),
            };
            n.checked_mul(unit).ok_or_else(|| bad(s.span()))
        }
        other => Err(bad(other.span())),
    }
}

/// `fingerprint = [a, b]` or `skip = [a]`: binding names, each checked against the
/// parameters.
pub(super) fn binding_list(arg: &RawArg, bindings: Option<&[String]>) -> syn::Result<Vec<Ident>> {
    let what = arg.name.to_string();
    let Expr::Array(list) = &arg.value else {
        return Err(syn::Error::new(
            arg.value.span(),
            format!(
                "`{what}` expects a list of parameter bindings, e.g. `{what} = [order, amount]`"
            ),
        ));
    };
    let mut names = Vec::new();
    let mut errors = Errors::default();
    for elem in &list.elems {
        let ident = match elem {
            Expr::Path(p) if p.qself.is_none() => p.path.get_ident().cloned(),
            _ => None,
        };
        let Some(ident) = ident else {
            errors.push(syn::Error::new(
                elem.span(),
                "expected a parameter binding name, e.g. `order`",
            ));
            continue;
        };
        if let Some(bindings) = bindings {
            let name = ident.unraw().to_string();
            if !bindings.contains(&name) {
                let hint = match closest(&name, bindings.iter().map(String::as_str)) {
                    Some(best) => format!("; did you mean `{best}`?"),
                    None => String::new(),
                };
                let list = bindings
                    .iter()
                    .map(|b| format!("`{b}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                errors.push(syn::Error::new(
                    ident.span(),
                    format!("unknown binding `{name}` in `{what}`: no parameter binds `{name}`{hint} (available bindings: {list})"),
                ));
                continue;
            }
        }
        names.push(ident);
    }
    match errors.finish() {
        Some(e) => Err(e),
        None => Ok(names),
    }
}
