//! `#[idempotent(...)]` arguments → a validated [`IdemConfig`].

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Expr, Ident, LitStr};

use crate::args::{ArgSlots, Errors, RawArg, RawArgs};
use crate::check::closest;
use crate::names::Names;
use crate::template::Template;
use crate::valid;

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
pub(crate) enum Source {
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
    /// The identifiers the expansion introduces.
    pub(super) names: Names,
}

pub(super) fn idem_config(
    raw: RawArgs,
    bindings: Option<&[String]>,
    errors: &mut Errors,
) -> Option<IdemConfig> {
    let mut slots = ArgSlots::sort(raw, IDEM_ARGS, errors);
    let krate = slots.krate(errors);
    let key = slots.template("key", "the key template", bindings, errors);
    let header = slots.string("header", header_name_error, errors);
    let scope = slots.template("scope", "the scope template", bindings, errors);
    let ttl = slots.duration("ttl", "", errors);
    let lease = slots.duration("lease", "", errors);
    let wait = slots.duration(
        "wait",
        "; leave `wait` out to answer a repeat that arrives while the first call runs with `InProgress` at once",
        errors,
    );
    let required = slots.bool("required", errors);
    let max_body = slots.parsed("max_body", errors, size_arg);
    let fingerprint = slots.parsed("fingerprint", errors, |arg| binding_list(arg, bindings));
    let skip = slots.parsed("skip", errors, |arg| binding_list(arg, bindings));
    let on_lost = slots.on_lost(errors);
    let name = slots.string("name", name_error, errors);
    let detach = slots.bool("detach", errors);
    let replicas = slots.replicas(errors);
    let client = slots.expr("client");
    let source = valid::idem_source(key, header, errors);
    valid::idem_options(
        source.as_ref(),
        &scope,
        [required.name(), None],
        [fingerprint.name(), skip.name()],
        errors,
    );
    Some(IdemConfig {
        krate: krate.or(syn::parse_quote!(::distlock))?,
        source: source?,
        scope: scope.optional()?,
        ttl_ms: ttl.or(24 * 3_600_000)?,
        lease_ms: lease.or(30_000)?,
        wait_ms: wait.or(0)?,
        required: required.or(true)?,
        fingerprint: fingerprint.optional()?,
        skip: skip.or(Vec::new())?,
        max_body: max_body.or(1024 * 1024)?,
        cancel_on_lost: on_lost.or(true)?,
        replicas: replicas.optional()?,
        name: name.optional()?,
        detach: detach.or(true)?,
        client,
        names: Names::idem(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::TokenStream;
    use quote::{ToTokens, quote};

    /// The config `args` give on a fn binding `bindings`, or every error message.
    fn config(args: TokenStream, bindings: &[&str]) -> Result<IdemConfig, Vec<String>> {
        let bindings: Vec<String> = bindings.iter().map(|b| (*b).to_owned()).collect();
        let mut errors = Errors::default();
        let raw = syn::parse2::<RawArgs>(args).expect("arguments parse");
        let config = idem_config(raw, Some(&bindings), &mut errors);
        match errors.finish() {
            Some(e) => Err(e.into_iter().map(|e| e.to_string()).collect()),
            None => Ok(config.expect("no errors, so a config")),
        }
    }

    fn ok(args: TokenStream, bindings: &[&str]) -> IdemConfig {
        config(args, bindings).unwrap_or_else(|e| panic!("{e:?}"))
    }

    fn errors(args: TokenStream, bindings: &[&str]) -> Vec<String> {
        match config(args, bindings) {
            Ok(_) => panic!("expected errors"),
            Err(e) => e,
        }
    }

    #[test]
    fn keyed_defaults() {
        let c = ok(quote!(key = "pay:<id>"), &["id"]);
        assert!(matches!(&c.source, Source::Key(t) if t.lit.value() == "pay:<id>"));
        assert_eq!((c.ttl_ms, c.lease_ms, c.wait_ms), (86_400_000, 30_000, 0));
        assert_eq!(c.max_body, 1024 * 1024);
        assert!(c.required && c.cancel_on_lost && c.detach);
        assert!(c.scope.is_none() && c.fingerprint.is_none() && c.skip.is_empty());
        assert!(c.name.is_none() && c.replicas.is_none() && c.client.is_none());
        assert_eq!(c.names.scope.to_string(), "__distlock_idem_scope");
    }

    #[test]
    fn every_keyed_option() {
        let c = ok(
            quote!(
                key = "pay:<id>",
                scope = "<tenant>",
                ttl = "1h",
                lease = "5s",
                wait = "2s",
                fingerprint = [id, amount],
                skip = [pool],
                on_lost = "continue",
                replicas = 1,
                name = "payments",
                detach = false,
                client = locks
            ),
            &["id", "amount", "pool", "tenant", "locks"],
        );
        assert_eq!((c.ttl_ms, c.lease_ms, c.wait_ms), (3_600_000, 5_000, 2_000));
        assert_eq!(c.scope.map(|s| s.lit.value()).as_deref(), Some("<tenant>"));
        let names = |v: &[Ident]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(names(c.fingerprint.as_deref().unwrap()), ["id", "amount"]);
        assert_eq!(names(&c.skip), ["pool"]);
        assert!(!c.cancel_on_lost && !c.detach);
        assert_eq!(c.replicas, Some(1));
        assert_eq!(c.name.map(|n| n.value()).as_deref(), Some("payments"));
        assert_eq!(c.client.to_token_stream().to_string(), "locks");
    }

    #[test]
    fn handlers() {
        let c = ok(
            quote!(
                header = "Idempotency-Key",
                scope = "<user>",
                required = false,
                max_body = "64KiB"
            ),
            &["user"],
        );
        assert!(matches!(&c.source, Source::Header(h) if h.value() == "Idempotency-Key"));
        assert!(!c.required);
        assert_eq!(c.max_body, 65_536);
        assert_eq!(
            ok(quote!(header = "K", scope = "s", max_body = 100), &[]).max_body,
            100
        );
    }

    #[test]
    fn the_key_comes_from_one_place() {
        let e = errors(quote!(ttl = "1h"), &[]);
        assert!(e[0].starts_with("missing `key` or `header`"), "{e:?}");
        let e = errors(quote!(key = "a", header = "K", scope = "s"), &[]);
        assert!(
            e[0].starts_with("`key` and `header` cannot be used together"),
            "{e:?}"
        );
        let e = errors(quote!(header = "K"), &[]);
        assert!(e[0].starts_with("`header = ...` needs a `scope`"), "{e:?}");
        let e = errors(quote!(header = "Idempotency Key", scope = "s"), &[]);
        assert!(e[0].contains("is not a valid HTTP header name"), "{e:?}");
    }

    #[test]
    fn options_of_the_other_kind_are_reported() {
        // `max_body` caps a keyed fn's stored value too.
        let e = errors(quote!(key = "a", required = false, max_body = 10), &[]);
        assert_eq!(
            e,
            ["`required` only applies to handlers keyed by `header = \"...\"`"]
        );
        let e = errors(
            quote!(header = "K", scope = "s", fingerprint = [a], skip = [a]),
            &["a"],
        );
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].starts_with("`fingerprint` only applies to fns keyed by `key"));
        assert!(e[1].starts_with("`skip` only applies to fns keyed by `key"));
    }

    #[test]
    fn values_are_checked() {
        let e = errors(
            quote!(
                key = "a",
                fingerprint = [amout],
                name = "two words",
                lease = "0s",
                detach = 1
            ),
            &["amount"],
        );
        assert_eq!(e.len(), 4, "{e:?}");
        assert_eq!(e[0], "`lease` must be greater than zero");
        assert!(
            e[1].contains("unknown binding `amout` in `fingerprint`")
                && e[1].contains("did you mean `amount`?")
        );
        assert!(
            e[2].contains("is not allowed in a record namespace"),
            "{e:?}"
        );
        assert_eq!(e[3], "`detach` expects `true` or `false`");
        let e = errors(quote!(header = "K", scope = "s", max_body = "1GB"), &[]);
        assert!(
            e[0].starts_with("`max_body` expects a size in bytes"),
            "{e:?}"
        );
    }
}
