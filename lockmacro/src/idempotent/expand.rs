//! The expansion of `#[idempotent]` when the body stays in the caller's future, and
//! the pieces both expansions share (the prelude, the spec, the claim, the capture).

use proc_macro2::{Delimiter, Span, TokenStream};
use quote::{ToTokens, quote};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, LitStr, ReturnType, Type};

use super::config::{IdemConfig, Source};
use super::detach::{detachable, expand_detached};
use crate::check::{self, binding_tokens};
use crate::shape::{Shape, typed_body, wrap_async_trait_body};
use crate::shared::{client_expr, key_expr};
use crate::spans::{group, respan, respan_range, span_range};
use crate::template::Template;

pub(super) fn expand_fn(mut func: ItemFn, shape: Shape, config: &IdemConfig) -> TokenStream {
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
            let (ret, body) = typed_body(&func, &config.names.ret);
            let wrapped = match &config.source {
                Source::Key(key) => key_call(config, key, &ret, &bindings, &name, false, body),
                Source::Header(header) => {
                    let req = &config.names.req;
                    let krate = &config.krate;
                    let seen_when_cfg_out =
                        wrap_body_param(&mut func.sig, krate, &config.names.body_seen);
                    handler_signature(&mut func.sig, krate, req);
                    let call = header_call(config, header, req, &ret, &bindings, &name, body);
                    quote!(#seen_when_cfg_out #call)
                }
            };
            *func.block = syn::parse_quote!({ #wrapped });
        }
        Shape::AsyncTrait(_) => {
            if let Source::Key(key) = &config.source {
                wrap_async_trait_body(&mut func.block, |ret, body| {
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
pub(super) struct Binding {
    pub(super) name: String,
    /// The `#[cfg]` attributes of its parameter.
    pub(super) cfgs: Vec<syn::Attribute>,
    /// Where the pattern binds it.
    pub(super) span: Span,
    /// Its parameter's type, when it is named like a known non-payload type (`State`,
    /// `Extension`, `web::Data`, `Locks`): left out of the fingerprint whatever its own
    /// type, once the parameter's type is checked to be one.
    pub(super) non_payload: Option<Type>,
}

/// Each name the parameters bind, where, and its parameter's type when that is named
/// like a known non-payload type.
pub(super) fn binding_params(sig: &syn::Signature) -> Vec<(String, Span, Option<Type>)> {
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
pub(super) fn ident_span(tokens: TokenStream, name: &str) -> Option<Span> {
    tokens.into_iter().find_map(|t| match t {
        proc_macro2::TokenTree::Ident(i) if i.unraw() == name => Some(i.span()),
        proc_macro2::TokenTree::Group(g) => ident_span(g.stream(), name),
        _ => None,
    })
}

/// `State<T>`, `Extension<T>`, `Data<T>` (`web::Data`), `Locks` and `Arc<Locks>`, behind
/// any references: application state and clients, never a call's payload.
pub(super) fn non_payload_type(ty: &Type) -> bool {
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

pub(super) fn prelude(config: &IdemConfig, bindings: &[Binding], async_trait: bool) -> TokenStream {
    let krate = &config.krate;
    let scope_var = &config.names.scope;
    let fp_var = &config.names.fp;
    let client_var = &config.names.client;
    let buf = &config.names.buf;
    let scope = match &config.scope {
        Some(t) => {
            let e = key_expr(krate, t, buf, async_trait);
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
    let client = client_expr(krate, config.client.as_ref(), async_trait);
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

pub(super) fn spec(config: &IdemConfig, header: &str) -> TokenStream {
    let krate = &config.krate;
    let IdemConfig {
        ttl_ms,
        lease_ms,
        wait_ms,
        required,
        max_body,
        cancel_on_lost,
        replicas,
        ..
    } = config;
    let max_body = usize::try_from(*max_body).unwrap_or(usize::MAX);
    let replicas = crate::args::replicas_tokens(*replicas);
    quote! {
        #krate::__private::IdemSpec {
            ttl_ms: #ttl_ms,
            lease_ms: #lease_ms,
            wait_ms: #wait_ms,
            max_body: #max_body,
            header: #header,
            required: #required,
            cancel_on_lost: #cancel_on_lost,
            replicas: #replicas,
        }
    }
}

/// The fn's record namespace (`name`, else `module::path::fn`) and where it is defined
/// (two fns found sharing a namespace at run time are named by it).
pub(super) fn idem_fn(config: &IdemConfig, name: &str) -> TokenStream {
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
pub(super) fn idem_call(
    config: &IdemConfig,
    idem_fn: &TokenStream,
    spec: TokenStream,
) -> TokenStream {
    let krate = &config.krate;
    let scope_var = &config.names.scope;
    let fp_var = &config.names.fp;
    let client_var = &config.names.client;
    let key_var = &config.names.key;
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
pub(super) fn key_call(
    config: &IdemConfig,
    key: &Template,
    ret: &Type,
    bindings: &[Binding],
    name: &str,
    async_trait: bool,
    body: TokenStream,
) -> TokenStream {
    let krate = &config.krate;
    let key_var = &config.names.key;
    let buf = &config.names.buf;
    let key = key_expr(krate, key, buf, async_trait);
    let prelude = prelude(config, bindings, async_trait);
    let spec = spec(config, "");
    let idem_fn = idem_fn(config, name);
    // The call and its `.await` both require `R: IdemOutput`. Both on one token of the
    // return type (the `Ok` type, which must be storable), a return type that does not
    // fit is reported there, once.
    let at = ok_span(ret);
    let run = respan(quote!(#krate::__private::run_idempotent), at);
    let call = idem_call(config, &idem_fn, spec);
    let same = same_expr(krate, ret, at);
    let args = group(
        Delimiter::Parenthesis,
        quote!(#call, #same, async move { #body }),
        at,
    );
    let dot_await = respan(quote!(.await), at);
    quote! {
        let #key_var: ::std::string::String = #key;
        #prelude
        #run #args #dot_await
    }
}

/// The comparison of a stored value with the value read back from it: the `Ok` type's
/// `PartialEq` when it has one (see lockcore's `SameProbe`). Named by the return type
/// alone (no bound on it here): a return type that does not fit is reported once, by
/// the call.
pub(super) fn same_expr(krate: &syn::Path, ret: &Type, at: Span) -> TokenStream {
    respan(
        quote! {{
            #[allow(unused_imports)]
            use #krate::__private::{SameByEq as _, SameBySerde as _};
            (&&#krate::__private::SameProbe::<#ret>::new()).__distlock_same()
        }},
        at,
    )
}

/// The first token of `T` in `Result<T, E>` (or any `Alias<T, ..>`), else of the type.
pub(super) fn ok_span(ret: &Type) -> Span {
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
pub(super) fn header_call(
    config: &IdemConfig,
    header: &LitStr,
    req: &Ident,
    ret: &Type,
    bindings: &[Binding],
    name: &str,
    body: TokenStream,
) -> TokenStream {
    let prelude = prelude(config, bindings, false);
    let run_var = &config.names.run;
    let out_var = &config.names.out;
    let cap_var = &config.names.cap;
    let done = &config.names.done;
    let idem_fn = idem_fn(config, name);
    let begin = begin_expr(config, header, req, &idem_fn);
    let capture = capture_expr(config, req, ret, out_var);
    // `-> impl IntoResponse` is rewritten away: check the body's value against the
    // bounds, which also keeps the user's `use` of the trait from looking unused.
    let impl_check = match ret {
        Type::ImplTrait(it) => {
            let bounds = it
                .bounds
                .iter()
                .filter(|b| matches!(b, syn::TypeParamBound::Trait(_)));
            let check = &config.names.impl_check;
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

/// `HandlerRun::begin(..).await`, or an early `return` of the response it answered.
pub(super) fn begin_expr(
    config: &IdemConfig,
    header: &LitStr,
    req: &Ident,
    idem_fn: &TokenStream,
) -> TokenStream {
    let krate = &config.krate;
    let scope_var = &config.names.scope;
    let fp_var = &config.names.fp;
    let client_var = &config.names.client;
    let done = &config.names.done;
    let seen = &config.names.body_seen;
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
pub(super) fn capture_expr(
    config: &IdemConfig,
    req: &Ident,
    ret: &Type,
    out: &Ident,
) -> TokenStream {
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
pub(super) fn handler_signature(sig: &mut syn::Signature, krate: &syn::Path, req: &Ident) {
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

/// Rewrites a handler's last parameter `pat: T` to `BodyFp(pat, seen): BodyFp<T>` (or
/// adds `BodyFp((), seen): BodyFp<()>` to a handler without parameters): the wrapper
/// reads the request body for the fingerprint, then extracts `T` as before. A last
/// parameter under `#[cfg(..)]` is wrapped too, and the statement returned (for the top
/// of the body) gives `seen` its value when the parameter is compiled out.
pub(super) fn wrap_body_param(
    sig: &mut syn::Signature,
    krate: &syn::Path,
    seen: &Ident,
) -> TokenStream {
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
