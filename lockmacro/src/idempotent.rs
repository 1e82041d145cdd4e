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

use proc_macro2::{Delimiter, Span, TokenStream};
use quote::{ToTokens, format_ident, quote};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, ItemFn, LitStr, ReturnType, Type};

use crate::args::{ArgSlots, Errors, RawArg, RawArgs, crate_arg, lit_str, template_arg};
use crate::check::{self, binding_tokens, closest};
use crate::expand::{
    self, Shape, bool_lit, duration_arg, group, key_expr, parse_fn, respan, respan_range,
    shape_and_config, span_range, with_error,
};
use crate::template::Template;

const IDEM_ARGS: &[&str] = &[
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
    "name",
    "detach",
    "client",
    "crate",
];

/// Where the idempotency key comes from.
enum Source {
    /// A template over the fn's parameters.
    Key(Template),
    /// A request header (handlers).
    Header(LitStr),
}

/// A validated `#[idempotent]`.
struct IdemConfig {
    krate: syn::Path,
    source: Source,
    scope: Option<Template>,
    ttl_ms: u64,
    lease_ms: u64,
    wait_ms: u64,
    required: bool,
    /// `fingerprint = [a, b]`: only these bindings (each must be `Serialize`).
    fingerprint: Option<Vec<Ident>>,
    /// `skip = [pool]`: bindings left out of the fingerprint.
    skip: Vec<Ident>,
    max_body: u64,
    /// `on_lost = "cancel"` (default): cancel the body when the claim is found lost.
    cancel_on_lost: bool,
    /// `name = "..."`: the records' namespace instead of `module::path::fn`.
    name: Option<LitStr>,
    /// `detach = false`: keep the body in the caller's future even when it could run in
    /// a task of its own.
    detach: bool,
    client: Option<Expr>,
}

pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut func = match parse_fn(item, "idempotent") {
        Ok(f) => f,
        Err(out) => return out,
    };
    // Apply a `#[distributed_lock]` written below this attribute now, so the lock ends
    // up inside the idempotency claim (as it does when written above).
    let mut extra = TokenStream::new();
    if let Some((lock_path, lock_args)) = take_sibling_lock(&mut func) {
        let locked = expand::distributed_lock(lock_args, func.to_token_stream());
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
    if let Some(config) = &config
        && config.name.is_none()
        && func.sig.receiver().is_some()
    {
        errors.push(syn::Error::new(
            func.sig.ident.span(),
            format!(
                "`#[idempotent]` on a method needs `name = \"...\"`: records are namespaced by module path and fn name, which the methods named `{}` of every type in this module share (`impl Email {{ fn notify }}` and `impl Sms {{ fn notify }}` would answer each other's calls); name the namespace, e.g. `name = \"<type>-{}\"`",
                func.sig.ident, func.sig.ident
            ),
        ));
    }
    if let Some(config) = &config {
        match (&config.source, &shape) {
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
fn take_sibling_lock(func: &mut ItemFn) -> Option<(syn::Path, TokenStream)> {
    let looks_like_lock = |a: &syn::Attribute| {
        let syn::Meta::List(list) = &a.meta else {
            return false;
        };
        match syn::parse2::<RawArgs>(list.tokens.clone()) {
            Ok(RawArgs(args)) => {
                args.iter().any(|arg| arg.name == "key")
                    && args
                        .iter()
                        .all(|arg| expand::LOCK_ARGS.iter().any(|n| arg.name == n))
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
fn split_fn(tokens: TokenStream) -> Option<(ItemFn, TokenStream)> {
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

fn idem_config(
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
    let ttl = duration_arg(slots.take("ttl"), errors, "").unwrap_or(Some(24 * 3_600_000));
    let lease = duration_arg(slots.take("lease"), errors, "").unwrap_or(Some(30_000));
    let wait = duration_arg(
        slots.take("wait"),
        errors,
        "; leave `wait` out to answer a repeat that arrives while the first call runs with `InProgress` at once",
    )
    .unwrap_or(Some(0));
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
        Some(arg) => expand::on_lost_arg(&arg, errors),
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
        name: name?,
        detach: detach?,
        client,
    })
}

/// Why `name` cannot name a record namespace, if it cannot.
fn name_error(name: &str) -> Option<String> {
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
fn header_name_error(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("the header name is empty; write e.g. `header = \"Idempotency-Key\"`".into());
    }
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    name.chars().find(|c| !token(*c)).map(|c| {
        format!("`{name}` is not a valid HTTP header name: `{}` is not allowed (use letters, digits and `-`)", c.escape_default())
    })
}

/// `max_body = 65536` or `max_body = "64KiB"` / `"1MiB"`.
fn size_arg(arg: &RawArg) -> syn::Result<u64> {
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
fn binding_list(arg: &RawArg, bindings: Option<&[String]>) -> syn::Result<Vec<Ident>> {
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

fn expand_fn(mut func: ItemFn, shape: Shape, config: &IdemConfig) -> TokenStream {
    // Each binding with the `#[cfg]`s of its parameter: its fingerprint statement carries
    // them, so a parameter compiled out takes its statement along.
    let cfgs = check::binding_cfgs(&func.sig);
    let params = binding_params(&func.sig);
    let bindings: Vec<Binding> = shape
        .bindings(&func)
        .unwrap_or_default()
        .into_iter()
        .map(|name| {
            let cfg = cfgs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, attrs)| attrs.clone())
                .unwrap_or_default();
            let (span, non_payload) = params
                .iter()
                .find(|(n, _, _)| *n == name)
                .map(|(_, span, np)| (*span, np.clone()))
                .unwrap_or((Span::call_site(), None));
            Binding {
                name,
                cfgs: cfg,
                span,
                non_payload,
            }
        })
        .collect();
    let name = func.sig.ident.to_string();
    if matches!(shape, Shape::Async) && config.detach && detachable(&func) {
        return expand_detached(func, config, &bindings, &name);
    }
    match shape {
        Shape::Async => {
            let (ret, body) = expand::typed_body(&func, "__distlock_idem_ret");
            let wrapped = match &config.source {
                Source::Key(key) => key_call(config, key, &ret, &bindings, &name, false, body),
                Source::Header(header) => {
                    let req = Ident::new("__distlock_idem_req", Span::mixed_site());
                    let krate = &config.krate;
                    let seen_when_cfg_out = wrap_body_param(&mut func.sig, krate);
                    handler_signature(&mut func.sig, krate, &req);
                    let call = header_call(config, header, &req, &ret, &bindings, &name, body);
                    quote!(#seen_when_cfg_out #call)
                }
            };
            *func.block = syn::parse_quote!({ #wrapped });
        }
        Shape::AsyncTrait(_) => {
            if let Source::Key(key) = &config.source {
                expand::wrap_async_trait_body(&mut func.block, |ret, body| {
                    key_call(config, key, ret, &bindings, &name, true, body)
                });
            }
        }
        Shape::NotAsync => {}
    }
    func.into_token_stream()
}

/// Statements computing the scope, the fingerprint and the client, all before the body
/// takes ownership of the arguments.
/// A parameter binding, as the fingerprint sees it.
struct Binding {
    name: String,
    /// The `#[cfg]` attributes of its parameter.
    cfgs: Vec<syn::Attribute>,
    /// Where the pattern binds it.
    span: Span,
    /// Its parameter's type, when it is named like a known non-payload type (`State`,
    /// `Extension`, `web::Data`, `Locks`): left out of the fingerprint whatever its own
    /// type, once the parameter's type is checked to be one.
    non_payload: Option<Type>,
}

/// Each name the parameters bind, where, and its parameter's type when that is named
/// like a known non-payload type.
fn binding_params(sig: &syn::Signature) -> Vec<(String, Span, Option<Type>)> {
    let mut out = Vec::new();
    for input in &sig.inputs {
        let FnArg::Typed(pt) = input else { continue };
        let non_payload = non_payload_type(&pt.ty).then(|| (*pt.ty).clone());
        let mut names = Vec::new();
        check::pat_bindings(&pt.pat, &mut names);
        for name in names {
            let span = ident_span(pt.pat.to_token_stream(), &name).unwrap_or_else(|| pt.pat.span());
            out.push((name, span, non_payload.clone()));
        }
    }
    out
}

/// The span of identifier `name` (unraw) in `tokens`.
fn ident_span(tokens: TokenStream, name: &str) -> Option<Span> {
    tokens.into_iter().find_map(|t| match t {
        proc_macro2::TokenTree::Ident(i) if i.unraw() == name => Some(i.span()),
        proc_macro2::TokenTree::Group(g) => ident_span(g.stream(), name),
        _ => None,
    })
}

/// `State<T>`, `Extension<T>`, `Data<T>` (`web::Data`), `Locks` and `Arc<Locks>`, behind
/// any references: application state and clients, never a call's payload.
fn non_payload_type(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) => non_payload_type(&r.elem),
        Type::Paren(p) => non_payload_type(&p.elem),
        Type::Path(p) if p.qself.is_none() => {
            let Some(last) = p.path.segments.last() else {
                return false;
            };
            let one_type_arg = matches!(
                &last.arguments,
                syn::PathArguments::AngleBracketed(a) if a.args.len() == 1
            );
            match last.ident.to_string().as_str() {
                "State" | "Extension" | "Data" => one_type_arg,
                "Locks" => last.arguments.is_none(),
                "Arc" => match &last.arguments {
                    syn::PathArguments::AngleBracketed(args) => args
                        .args
                        .iter()
                        .any(|a| matches!(a, syn::GenericArgument::Type(t) if non_payload_type(t))),
                    _ => false,
                },
                _ => false,
            }
        }
        _ => false,
    }
}

fn prelude(config: &IdemConfig, bindings: &[Binding], async_trait: bool) -> TokenStream {
    let krate = &config.krate;
    let scope_var = Ident::new("__distlock_idem_scope", Span::mixed_site());
    let fp_var = Ident::new("__distlock_idem_fp", Span::mixed_site());
    let client_var = Ident::new("__distlock_idem_client", Span::mixed_site());
    let buf = Ident::new("__distlock_idem_buf", Span::mixed_site());
    let scope = match &config.scope {
        Some(t) => {
            let e = key_expr(krate, t, &buf, async_trait);
            quote!(::core::option::Option::Some(#e))
        }
        None => quote!(::core::option::Option::None),
    };
    let binding_ident = |name: &str, span: Span| binding_tokens(name, span, async_trait);
    let adds: Vec<TokenStream> = match (&config.source, &config.fingerprint) {
        // Handlers: the request as sent (see `HandlerRun::begin`), not the bindings.
        (Source::Header(_), _) => Vec::new(),
        // Named: each must be `Serialize`; an error lands on the name.
        (Source::Key(_), Some(names)) => names
            .iter()
            .map(|ident| {
                let name = ident.unraw().to_string();
                let b = binding_ident(&name, ident.span());
                // All on the name: a binding that is not `Serialize` is reported there.
                respan(
                    quote!(#krate::__private::Fingerprint::add(&mut #fp_var, #name, &#b);),
                    ident.span(),
                )
            })
            .collect(),
        // Every binding but `self`, those of non-payload parameters and those skipped:
        // each must be `Serialize` (a set is sorted), or of a non-payload type.
        (Source::Key(_), None) => bindings
            .iter()
            .filter(|b| b.name != "self" && !config.skip.iter().any(|s| s.unraw() == b.name))
            .map(|b| {
                if let Some(ty) = &b.non_payload {
                    // Left out by its parameter's type name: checked to be that type.
                    let cfgs = &b.cfgs;
                    let check = respan(
                        quote!(#krate::__private::assert_non_payload::<#ty>();),
                        span_range(ty.to_token_stream()).0,
                    );
                    return quote! {
                        #(#cfgs)*
                        #check
                    };
                }
                let name = &b.name;
                let cfgs = &b.cfgs;
                let ident = binding_ident(name, Span::call_site());
                // On the binding: one that cannot be fingerprinted is reported there.
                let add = respan(
                    quote!((&&&&#krate::__private::FpArg(#name, &#ident)).__distlock_fp(&mut #fp_var);),
                    b.span,
                );
                quote! {
                    #(#cfgs)*
                    #add
                }
            })
            .collect(),
    };
    let client = expand::client_expr(krate, config.client.as_ref(), async_trait);
    quote! {
        let #scope_var: ::core::option::Option<::std::string::String> = #scope;
        #[allow(clippy::needless_borrow, unused_mut)]
        let #fp_var = {
            #[allow(unused_imports)]
            use #krate::__private::{FpNonPayload as _, FpNone as _, FpSerialize as _, FpSet as _};
            let mut #fp_var = #krate::__private::Fingerprint::new();
            #(#adds)*
            #fp_var
        };
        let #client_var = #client;
    }
}

fn spec(config: &IdemConfig, header: &str) -> TokenStream {
    let krate = &config.krate;
    let IdemConfig {
        ttl_ms,
        lease_ms,
        wait_ms,
        required,
        max_body,
        cancel_on_lost,
        ..
    } = config;
    let max_body = usize::try_from(*max_body).unwrap_or(usize::MAX);
    quote! {
        #krate::__private::IdemSpec {
            ttl_ms: #ttl_ms,
            lease_ms: #lease_ms,
            wait_ms: #wait_ms,
            max_body: #max_body,
            header: #header,
            required: #required,
            cancel_on_lost: #cancel_on_lost,
        }
    }
}

/// The fn's record namespace (`name`, else `module::path::fn`) and where it is defined
/// (two fns found sharing a namespace at run time are named by it).
fn idem_fn(config: &IdemConfig, name: &str) -> TokenStream {
    let krate = &config.krate;
    let namespace = match &config.name {
        Some(lit) => quote!(#lit),
        None => quote!(::core::concat!(::core::module_path!(), "::", #name)),
    };
    quote! {
        #krate::__private::IdemFn {
            namespace: #namespace,
            site: ::core::concat!(::core::file!(), ":", ::core::line!(), ":", ::core::column!()),
        }
    }
}

/// The `IdemCall` of a keyed fn, from the variables the prelude and the key set.
fn idem_call(config: &IdemConfig, idem_fn: &TokenStream, spec: TokenStream) -> TokenStream {
    let krate = &config.krate;
    let scope_var = Ident::new("__distlock_idem_scope", Span::mixed_site());
    let fp_var = Ident::new("__distlock_idem_fp", Span::mixed_site());
    let client_var = Ident::new("__distlock_idem_client", Span::mixed_site());
    let key_var = Ident::new("__distlock_idem_key", Span::mixed_site());
    quote! {
        #krate::__private::IdemCall {
            client: #client_var,
            target: #krate::__private::IdemTarget {
                function: #idem_fn,
                scope: #scope_var,
                key: #key_var,
            },
            fp: #fp_var,
            spec: #spec,
        }
    }
}

/// `run_idempotent(IdemCall { .. }, async move { body }).await`.
fn key_call(
    config: &IdemConfig,
    key: &Template,
    ret: &Type,
    bindings: &[Binding],
    name: &str,
    async_trait: bool,
    body: TokenStream,
) -> TokenStream {
    let krate = &config.krate;
    let key_var = Ident::new("__distlock_idem_key", Span::mixed_site());
    let buf = Ident::new("__distlock_idem_buf", Span::mixed_site());
    let key = key_expr(krate, key, &buf, async_trait);
    let prelude = prelude(config, bindings, async_trait);
    let spec = spec(config, "");
    let idem_fn = idem_fn(config, name);
    // The call and its `.await` both require `R: IdemOutput`. Both on one token of the
    // return type (the `Ok` type, which must be storable), a return type that does not
    // fit is reported there, once.
    let at = ok_span(ret);
    let run = respan(quote!(#krate::__private::run_idempotent), at);
    let call = idem_call(config, &idem_fn, spec);
    let args = group(
        Delimiter::Parenthesis,
        quote!(#call, async move { #body }),
        at,
    );
    let dot_await = respan(quote!(.await), at);
    quote! {
        let #key_var: ::std::string::String = #key;
        #prelude
        #run #args #dot_await
    }
}

/// The first token of `T` in `Result<T, E>` (or any `Alias<T, ..>`), else of the type.
fn ok_span(ret: &Type) -> Span {
    if let Type::Path(p) = ret
        && let Some(last) = p.path.segments.last()
        && let syn::PathArguments::AngleBracketed(args) = &last.arguments
        && let Some(syn::GenericArgument::Type(ok)) = args.args.first()
    {
        return span_range(ok.to_token_stream()).0;
    }
    span_range(ret.to_token_stream()).0
}

/// Header check and claim (or an early response), the body with the lease renewed, the
/// response captured for whichever framework called, then stored or released.
fn header_call(
    config: &IdemConfig,
    header: &LitStr,
    req: &Ident,
    ret: &Type,
    bindings: &[Binding],
    name: &str,
    body: TokenStream,
) -> TokenStream {
    let prelude = prelude(config, bindings, false);
    let run_var = Ident::new("__distlock_idem_run", Span::mixed_site());
    let out_var = Ident::new("__distlock_idem_out", Span::mixed_site());
    let cap_var = Ident::new("__distlock_idem_cap", Span::mixed_site());
    let done = format_ident!("__distlock_idem_done", span = Span::mixed_site());
    let idem_fn = idem_fn(config, name);
    let begin = begin_expr(config, header, req, &idem_fn);
    let capture = capture_expr(config, req, ret, &out_var);
    // `-> impl IntoResponse` is rewritten away: check the body's value against the
    // bounds, which also keeps the user's `use` of the trait from looking unused.
    let impl_check = match ret {
        Type::ImplTrait(it) => {
            let bounds = it
                .bounds
                .iter()
                .filter(|b| matches!(b, syn::TypeParamBound::Trait(_)));
            let check = Ident::new("__distlock_idem_impl_check", Span::mixed_site());
            quote! {
                fn #check<__DistlockOut: #(#bounds)+*>(_: &__DistlockOut) {}
                #check(&#out_var);
            }
        }
        _ => TokenStream::new(),
    };
    quote! {
        #prelude
        #[allow(unused_mut)]
        let mut #run_var = #begin;
        let #out_var = match #run_var.keep(async move { #body }).await {
            ::core::result::Result::Ok(out) => out,
            ::core::result::Result::Err(#done) => return #done,
        };
        #impl_check
        #[allow(clippy::needless_borrow)]
        let #cap_var = #capture;
        #run_var.finish_with(#cap_var).await
    }
}

/// Whether the body can run in a task of its own: an `async fn` without `self`, `Self`,
/// generics, `unsafe` or attributes on its parameters, whose parameter types hold no
/// reference, lifetime or `impl Trait` (so the body owns everything it uses and its
/// future is `'static`). Whether it is also `Send` is decided by the compiler (see
/// `Detach`). A parameter type with a lifetime it does not write out (`Cow<str>`) is
/// not seen here: such fns take `detach = false` (or write `Cow<'_, str>`).
fn detachable(func: &ItemFn) -> bool {
    let sig = &func.sig;
    if sig.receiver().is_some()
        || sig.unsafety.is_some()
        || !sig.generics.params.is_empty()
        || sig.generics.where_clause.is_some()
        || sig.variadic.is_some()
        || mentions(sig.output.to_token_stream(), &|t| is_ident(t, "Self"))
        || mentions(func.block.to_token_stream(), &|t| is_ident(t, "Self"))
    {
        return false;
    }
    sig.inputs.iter().all(|input| match input {
        FnArg::Typed(pt) => {
            pt.attrs.is_empty()
                && !mentions(pt.ty.to_token_stream(), &|t| {
                    is_punct(t, '&')
                        || is_punct(t, '\'')
                        || is_ident(t, "impl")
                        || is_ident(t, "Self")
                })
                && !mentions(pt.pat.to_token_stream(), &|t| is_punct(t, '&'))
        }
        FnArg::Receiver(_) => false,
    })
}

fn is_ident(t: &proc_macro2::TokenTree, name: &str) -> bool {
    matches!(t, proc_macro2::TokenTree::Ident(i) if i == name)
}

fn is_punct(t: &proc_macro2::TokenTree, c: char) -> bool {
    matches!(t, proc_macro2::TokenTree::Punct(p) if p.as_char() == c)
}

/// Whether any token of `tokens`, at any depth, satisfies `hit`.
fn mentions(tokens: TokenStream, hit: &dyn Fn(&proc_macro2::TokenTree) -> bool) -> bool {
    tokens.into_iter().any(|t| match &t {
        proc_macro2::TokenTree::Group(g) => mentions(g.stream(), hit),
        _ => hit(&t),
    })
}

/// `pat` with `mut` and `ref` taken off its bindings, to match it against a reference
/// to the parameter (each binding then borrows its part).
fn by_ref_pattern(pat: &syn::Pat) -> syn::Pat {
    let mut pat = pat.clone();
    strip_binding_modes(&mut pat);
    pat
}

fn strip_binding_modes(pat: &mut syn::Pat) {
    use syn::Pat;
    match pat {
        Pat::Ident(p) => {
            p.by_ref = None;
            p.mutability = None;
            if let Some((_, sub)) = &mut p.subpat {
                strip_binding_modes(sub);
            }
        }
        Pat::Tuple(t) => t.elems.iter_mut().for_each(strip_binding_modes),
        Pat::TupleStruct(t) => t.elems.iter_mut().for_each(strip_binding_modes),
        Pat::Struct(s) => s
            .fields
            .iter_mut()
            .for_each(|f| strip_binding_modes(&mut f.pat)),
        Pat::Slice(s) => s.elems.iter_mut().for_each(strip_binding_modes),
        Pat::Paren(p) => strip_binding_modes(&mut p.pat),
        Pat::Type(t) => strip_binding_modes(&mut t.pat),
        _ => {}
    }
}

/// The expansion that runs the body in a task of its own (see [`detachable`]).
///
/// The parameters are renamed `__distlock_pN`; the scope, key and fingerprint are
/// computed from the user's patterns matched against references to them; the body
/// becomes a nested `async fn` with the original parameters and return type, whose
/// future the runtime spawns when it is `Send`:
///
/// ```text
/// async fn f(__p0: T0, __p1: T1) -> R {
///     let (key, scope, fp, client) = { let pat0 = &__p0; let pat1 = &__p1; ... };
///     async fn __distlock_idem_body(pat0: T0, pat1: T1) -> R { body }
///     (&&DetachFn::new(__distlock_idem_body(__p0, __p1))).__distlock_run(..).await
/// }
/// ```
/// Handlers add the request and the capture of the response to the spawned work.
fn expand_detached(
    mut func: ItemFn,
    config: &IdemConfig,
    bindings: &[Binding],
    name: &str,
) -> TokenStream {
    let krate = &config.krate;
    // Each parameter under a name of its own: a plain `name: T` keeps its name (the
    // attributes below this one may refer to it, as `#[instrument(skip(db))]` does), a
    // pattern gets `__distlock_pN`.
    let params: Vec<(Ident, syn::PatType)> = func
        .sig
        .inputs
        .iter()
        .enumerate()
        .filter_map(|(i, input)| match input {
            FnArg::Typed(pt) => {
                let id = match &*pt.pat {
                    syn::Pat::Ident(p) if p.subpat.is_none() && p.by_ref.is_none() => {
                        p.ident.clone()
                    }
                    _ => Ident::new(&format!("__distlock_p{i}"), Span::mixed_site()),
                };
                Some((id, pt.clone()))
            }
            FnArg::Receiver(_) => None,
        })
        .collect();
    let ids: Vec<&Ident> = params.iter().map(|(id, _)| id).collect();
    let tys: Vec<&Type> = params.iter().map(|(_, pt)| &*pt.ty).collect();
    let originals: Vec<&syn::PatType> = params.iter().map(|(_, pt)| pt).collect();
    let borrows = params.iter().map(|(id, pt)| {
        let pat = by_ref_pattern(&pt.pat);
        quote! {
            #[allow(unused_variables)]
            let #pat = &#id;
        }
    });
    let output = func.sig.output.clone();
    // The outer fn takes the parameters under those names, with their types.
    func.sig.inputs = ids
        .iter()
        .zip(&tys)
        .map(|(id, ty)| -> FnArg { syn::parse_quote!(#id: #ty) })
        .collect();
    let ret: Type = match &output {
        ReturnType::Type(_, ty) => (**ty).clone(),
        ReturnType::Default => syn::parse_quote!(()),
    };
    let block = &func.block;
    let body_fn = Ident::new("__distlock_idem_body", Span::call_site());
    // A parameter the attribute uses (in `key`, `scope` or `client`) may be unused here.
    let nested_body = quote! {
        #[allow(clippy::too_many_arguments, unused_variables)]
        async fn #body_fn(#(#originals),*) #output #block
    };
    let prelude = prelude(config, bindings, false);
    let scope_var = Ident::new("__distlock_idem_scope", Span::mixed_site());
    let fp_var = Ident::new("__distlock_idem_fp", Span::mixed_site());
    let client_var = Ident::new("__distlock_idem_client", Span::mixed_site());
    let key_var = Ident::new("__distlock_idem_key", Span::mixed_site());
    let buf = Ident::new("__distlock_idem_buf", Span::mixed_site());
    let idem_fn = idem_fn(config, name);
    let wrapped = match &config.source {
        Source::Key(key) => {
            let key = key_expr(krate, key, &buf, false);
            let spec = spec(config, "");
            // Both on the `Ok` type: a return type that does not fit is reported there.
            let at = ok_span(&ret);
            let call = respan(
                quote!((&&#krate::__private::DetachFn::new(#body_fn(#(#ids),*))).__distlock_run),
                at,
            );
            let args = group(
                Delimiter::Parenthesis,
                idem_call(config, &idem_fn, spec),
                at,
            );
            let dot_await = respan(quote!(.await), at);
            quote! {
                let (#key_var, #scope_var, #fp_var, #client_var) = {
                    #(#borrows)*
                    let #key_var: ::std::string::String = #key;
                    #prelude
                    (#key_var, #scope_var, #fp_var, #client_var)
                };
                #nested_body
                #[allow(unused_imports)]
                use #krate::__private::{DetachFnInline as _, DetachFnSend as _};
                // The call's temporaries end here: the future awaited below is `Send`
                // whenever the body is.
                let __distlock_idem_call = #call #args;
                __distlock_idem_call #dot_await
            }
        }
        Source::Header(header) => {
            let req = Ident::new("__distlock_idem_req", Span::mixed_site());
            let run_var = Ident::new("__distlock_idem_run", Span::mixed_site());
            let out_var = Ident::new("__distlock_idem_out", Span::mixed_site());
            let work_fn = Ident::new("__distlock_idem_work", Span::call_site());
            let begin = begin_expr(config, header, &req, &idem_fn);
            let capture = capture_expr(config, &req, &ret, &out_var);
            // The last parameter read through `BodyFp` (see `wrap_body_param`).
            let seen = body_seen_ident();
            let unwrap_body = match params.last() {
                Some((id, _)) => {
                    let last = func.sig.inputs.last_mut().expect("a parameter per id");
                    if let FnArg::Typed(pt) = last {
                        let ty = &pt.ty;
                        let wrapped: Type = syn::parse_quote!(#krate::__private::BodyFp<#ty>);
                        *pt.ty = wrapped;
                    }
                    quote!(let #krate::__private::BodyFp(#id, #seen) = #id;)
                }
                None => {
                    func.sig.inputs.push(syn::parse_quote!(
                        #krate::__private::BodyFp((), #seen): #krate::__private::BodyFp<()>
                    ));
                    TokenStream::new()
                }
            };
            handler_signature(&mut func.sig, krate, &req);
            quote! {
                #unwrap_body
                let (#scope_var, #fp_var, #client_var) = {
                    #(#borrows)*
                    #prelude
                    (#scope_var, #fp_var, #client_var)
                };
                #nested_body
                // The whole call, claim included: a caller dropped at any await leaves
                // it to run to its end.
                #[allow(clippy::too_many_arguments)]
                async fn #work_fn(
                    #req: #krate::__private::IdemRequest,
                    #seen: #krate::__private::BodySeen,
                    #scope_var: ::core::option::Option<::std::string::String>,
                    #fp_var: #krate::__private::Fingerprint,
                    #client_var: ::core::result::Result<#krate::Locks, #krate::Error>,
                    #(#ids: #tys),*
                ) -> #krate::__private::IdemResponse {
                    let #run_var = #begin;
                    #run_var
                        .run(async move {
                            let #out_var = #body_fn(#(#ids),*).await;
                            #[allow(clippy::needless_borrow)]
                            let capture = #capture;
                            capture.await
                        })
                        .await
                }
                #[allow(unused_imports)]
                use #krate::__private::{DetachLocal as _, DetachSend as _};
                let __distlock_idem_call = (&&#krate::__private::Detach::new(
                    #krate::__private::DetachMode::of(&#req),
                    #work_fn(#req, #seen, #scope_var, #fp_var, #client_var, #(#ids),*),
                ))
                    .__distlock_run();
                __distlock_idem_call.await
            }
        }
    };
    *func.block = syn::parse_quote!({ #wrapped });
    func.into_token_stream()
}

/// `HandlerRun::begin(..).await`, or an early `return` of the response it answered.
fn begin_expr(
    config: &IdemConfig,
    header: &LitStr,
    req: &Ident,
    idem_fn: &TokenStream,
) -> TokenStream {
    let krate = &config.krate;
    let scope_var = Ident::new("__distlock_idem_scope", Span::mixed_site());
    let fp_var = Ident::new("__distlock_idem_fp", Span::mixed_site());
    let client_var = Ident::new("__distlock_idem_client", Span::mixed_site());
    let done = format_ident!("__distlock_idem_done", span = Span::mixed_site());
    let seen = body_seen_ident();
    let spec = spec(config, &header.value());
    quote! {
        match #krate::__private::HandlerRun::begin(
            &#req,
            #seen,
            #client_var,
            #idem_fn,
            #scope_var,
            #fp_var,
            #spec,
        ).await {
            ::core::result::Result::Ok(run) => run,
            ::core::result::Result::Err(#done) => return #done,
        }
    }
}

/// The capture of the handler's return value `out` for whichever framework called, by
/// autoref specialization (see `Reply`): a future of the `Capture`. Over the return
/// type: a type that is no framework's response is reported there.
fn capture_expr(config: &IdemConfig, req: &Ident, ret: &Type, out: &Ident) -> TokenStream {
    let krate = &config.krate;
    let (first, last) = span_range(ret.to_token_stream());
    let capture = respan_range(
        quote!((&&&&#krate::__private::Reply::new(#out)).__distlock_capture),
        first,
        last,
    );
    let max_body = usize::try_from(config.max_body).unwrap_or(usize::MAX);
    let args = group(Delimiter::Parenthesis, quote!(&#req, #max_body), last);
    quote! {{
        #[allow(unused_imports)]
        use #krate::__private::{
            CaptureActix as _, CaptureAxum as _, CaptureBoth as _, CaptureNone as _,
        };
        #capture #args
    }}
}

/// A handler's signature as the frameworks call it: the hidden request extractor first
/// (after `self`), and `IdemResponse` returned.
fn handler_signature(sig: &mut syn::Signature, krate: &syn::Path, req: &Ident) {
    let hidden: FnArg = syn::parse_quote!(#req: #krate::__private::IdemRequest);
    let at = usize::from(matches!(sig.inputs.first(), Some(FnArg::Receiver(_))));
    sig.inputs.insert(at, hidden);
    let arrow = match &sig.output {
        ReturnType::Type(arrow, _) => *arrow,
        ReturnType::Default => Default::default(),
    };
    sig.output = ReturnType::Type(
        arrow,
        Box::new(syn::parse_quote!(#krate::__private::IdemResponse)),
    );
}

/// The binding of what [`wrap_body_param`]'s wrapper saw of the request body.
fn body_seen_ident() -> Ident {
    Ident::new("__distlock_idem_body_seen", Span::mixed_site())
}

/// Rewrites a handler's last parameter `pat: T` to `BodyFp(pat, seen): BodyFp<T>` (or
/// adds `BodyFp((), seen): BodyFp<()>` to a handler without parameters): the wrapper
/// reads the request body for the fingerprint, then extracts `T` as before. A last
/// parameter under `#[cfg(..)]` is wrapped too, and the statement returned (for the top
/// of the body) gives `seen` its value when the parameter is compiled out.
fn wrap_body_param(sig: &mut syn::Signature, krate: &syn::Path) -> TokenStream {
    let seen = body_seen_ident();
    let last = sig.inputs.iter_mut().rev().find_map(|input| match input {
        FnArg::Typed(pt) => Some(pt),
        FnArg::Receiver(_) => None,
    });
    let Some(pt) = last else {
        sig.inputs.push(syn::parse_quote!(
            #krate::__private::BodyFp((), #seen): #krate::__private::BodyFp<()>
        ));
        return TokenStream::new();
    };
    let (pat, ty) = (&pt.pat, &pt.ty);
    let wrapped_pat: syn::Pat = syn::parse_quote!(#krate::__private::BodyFp(#pat, #seen));
    let wrapped_ty: Type = syn::parse_quote!(#krate::__private::BodyFp<#ty>);
    *pt.pat = wrapped_pat;
    *pt.ty = wrapped_ty;
    let preds: Vec<TokenStream> = pt
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .filter_map(|a| a.meta.require_list().ok().map(|l| l.tokens.clone()))
        .collect();
    if preds.is_empty() {
        return TokenStream::new();
    }
    quote! {
        #[cfg(not(all(#(#preds),*)))]
        let #seen = #krate::__private::BodySeen::unread();
    }
}
