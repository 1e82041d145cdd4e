//! The expansion of `#[idempotent]` that runs the call in a task of its own, and the
//! syntactic test of whether a function's body can move there.

use proc_macro2::{Delimiter, TokenStream};
use quote::{ToTokens, quote};
use syn::visit_mut::VisitMut;
use syn::{FnArg, Ident, ItemFn, LitStr, ReturnType, Type};

use super::config::{IdemConfig, Source};
use super::expand::*;
use crate::check::EachBinding;
use crate::names::Names;
use crate::shared::key_expr;
use crate::spans::{group, respan};
use crate::template::Template;

/// Whether the body can run in a task of its own: an `async fn` without `self`, `Self`,
/// generics, `unsafe` or attributes on its parameters, whose parameter types hold no
/// reference, lifetime or `impl Trait` (so the body owns everything it uses and its
/// future is `'static`). Whether it is also `Send` is decided by the compiler (see
/// `Detach`). A parameter type with a lifetime it does not write out (`Cow<str>`) is
/// not seen here: such fns take `detach = false` (or write `Cow<'_, str>`).
pub(super) fn detachable(func: &ItemFn) -> bool {
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

pub(super) fn is_ident(t: &proc_macro2::TokenTree, name: &str) -> bool {
    matches!(t, proc_macro2::TokenTree::Ident(i) if i == name)
}

pub(super) fn is_punct(t: &proc_macro2::TokenTree, c: char) -> bool {
    matches!(t, proc_macro2::TokenTree::Punct(p) if p.as_char() == c)
}

/// Whether any token of `tokens`, at any depth, satisfies `hit`.
pub(super) fn mentions(tokens: TokenStream, hit: &dyn Fn(&proc_macro2::TokenTree) -> bool) -> bool {
    tokens.into_iter().any(|t| match &t {
        proc_macro2::TokenTree::Group(g) => mentions(g.stream(), hit),
        _ => hit(&t),
    })
}

/// `pat` with `mut` and `ref` taken off its bindings, to match it against a reference
/// to the parameter (each binding then borrows its part).
pub(super) fn by_ref_pattern(pat: &syn::Pat) -> syn::Pat {
    let mut pat = pat.clone();
    EachBinding(|p: &mut syn::PatIdent| {
        p.by_ref = None;
        p.mutability = None;
    })
    .visit_pat_mut(&mut pat);
    pat
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
/// Handlers claim first, in the caller (a replay or a rejection needs no task), then
/// spawn the body with the capture and the store of its response.
pub(super) fn expand_detached(
    mut func: ItemFn,
    config: &IdemConfig,
    bindings: &[Binding],
    name: &str,
) -> TokenStream {
    let d = Detached::of(&mut func, config, bindings, name);
    let wrapped = match &config.source {
        Source::Key(key) => detached_keyed(config, key, &d),
        Source::Header(header) => detached_handler(&mut func, config, header, &d),
    };
    *func.block = syn::parse_quote!({ #wrapped });
    func.into_token_stream()
}

/// What both detached expansions build from the fn: each parameter under a name of its
/// own, the borrows of the user's patterns, the body as a nested fn, the prelude.
struct Detached {
    /// A plain `name: T` keeps its name (the attributes below this one may refer to it,
    /// as `#[instrument(skip(db))]` does), a pattern gets `__distlock_pN`.
    ids: Vec<Ident>,
    tys: Vec<Type>,
    /// `let <the user's pattern, by reference> = &id;` for each parameter.
    borrows: TokenStream,
    /// The user's body as `async fn __distlock_idem_body(<the original parameters>)`.
    nested_body: TokenStream,
    ret: Type,
    prelude: TokenStream,
    idem_fn: TokenStream,
}

impl Detached {
    /// The pieces, with the outer fn now taking the parameters under their new names.
    fn of(func: &mut ItemFn, config: &IdemConfig, bindings: &[Binding], name: &str) -> Self {
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
                        _ => Names::param(i),
                    };
                    Some((id, pt.clone()))
                }
                FnArg::Receiver(_) => None,
            })
            .collect();
        let ids: Vec<Ident> = params.iter().map(|(id, _)| id.clone()).collect();
        let tys: Vec<Type> = params.iter().map(|(_, pt)| (*pt.ty).clone()).collect();
        let originals = params.iter().map(|(_, pt)| pt);
        let borrows = params
            .iter()
            .map(|(id, pt)| {
                let pat = by_ref_pattern(&pt.pat);
                quote! {
                    #[allow(unused_variables)]
                    let #pat = &#id;
                }
            })
            .collect();
        let output = func.sig.output.clone();
        func.sig.inputs = ids
            .iter()
            .zip(&tys)
            .map(|(id, ty)| -> FnArg { syn::parse_quote!(#id: #ty) })
            .collect();
        let ret: Type = match &output {
            ReturnType::Type(_, ty) => (**ty).clone(),
            ReturnType::Default => syn::parse_quote!(()),
        };
        let (block, body_fn) = (&func.block, &config.names.body_fn);
        // A parameter the attribute uses (in `key`, `scope` or `client`) may be unused here.
        let nested_body = quote! {
            #[allow(clippy::too_many_arguments, unused_variables)]
            async fn #body_fn(#(#originals),*) #output #block
        };
        Detached {
            ids,
            tys,
            borrows,
            nested_body,
            ret,
            prelude: prelude(config, bindings, false),
            idem_fn: idem_fn(config, name),
        }
    }
}

/// A keyed fn: key, scope, fingerprint and client from the borrows, then the nested
/// body's future run by `DetachFn` (spawned when it is `Send`).
fn detached_keyed(config: &IdemConfig, key: &Template, d: &Detached) -> TokenStream {
    let krate = &config.krate;
    let n = &config.names;
    let (scope_var, fp_var, client_var, key_var, buf) =
        (&n.scope, &n.fp, &n.client, &n.key, &n.buf);
    let (call_var, body_fn) = (&n.call, &n.body_fn);
    let Detached {
        ids,
        borrows,
        nested_body,
        ret,
        prelude,
        idem_fn,
        ..
    } = d;
    let key = key_expr(krate, key, buf, false);
    let spec = spec(config, "");
    // Both on the `Ok` type: a return type that does not fit is reported there.
    let at = ok_span(ret);
    let call = respan(
        quote!((&&#krate::__private::DetachFn::new(#body_fn(#(#ids),*))).__distlock_run),
        at,
    );
    let call_args = idem_call(config, idem_fn, spec);
    let same = same_expr(krate, ret, at);
    let args = group(Delimiter::Parenthesis, quote!(#call_args, #same), at);
    let dot_await = respan(quote!(.await), at);
    quote! {
        let (#key_var, #scope_var, #fp_var, #client_var) = {
            #borrows
            let #key_var: ::std::string::String = #key;
            #prelude
            (#key_var, #scope_var, #fp_var, #client_var)
        };
        #nested_body
        #[allow(unused_imports)]
        use #krate::__private::{DetachFnInline as _, DetachFnSend as _};
        // The call's temporaries end here: the future awaited below is `Send`
        // whenever the body is.
        let #call_var = #call #args;
        #call_var #dot_await
    }
}

/// A handler: the claim in the caller (a replay or a rejection needs no task), then the
/// body, the capture and the store of its response in a task of its own.
fn detached_handler(
    func: &mut ItemFn,
    config: &IdemConfig,
    header: &LitStr,
    d: &Detached,
) -> TokenStream {
    let krate = &config.krate;
    let n = &config.names;
    let (scope_var, fp_var, client_var) = (&n.scope, &n.fp, &n.client);
    let (call_var, body_fn) = (&n.call, &n.body_fn);
    let Detached {
        ids,
        tys,
        borrows,
        nested_body,
        ret,
        prelude,
        idem_fn,
    } = d;
    let (req, run_var, out_var, work_fn) = (&n.req, &n.run, &n.out, &n.work_fn);
    let begin = begin_expr(config, header, req, idem_fn);
    let capture = capture_expr(config, req, ret, out_var);
    let unwrap_body = body_param(func, krate, ids.last(), &n.body_seen);
    handler_signature(&mut func.sig, krate, req);
    quote! {
        #unwrap_body
        let (#scope_var, #fp_var, #client_var) = {
            #borrows
            #prelude
            (#scope_var, #fp_var, #client_var)
        };
        #nested_body
        // The claim here: a replay or a rejection answers from this task. A
        // caller dropped while the claim is in flight gives it back (the body
        // has not run).
        let #run_var = #begin;
        // From the claim on, the call (body, capture, store) runs in a task of
        // its own where it can (see `DetachMode`): a caller dropped at any await
        // leaves it to run to its end.
        #[allow(clippy::too_many_arguments)]
        async fn #work_fn(
            #run_var: #krate::__private::HandlerRun,
            #req: #krate::__private::IdemRequest,
            #(#ids: #tys),*
        ) -> #krate::__private::IdemResponse {
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
        let #call_var = (&&#krate::__private::Detach::new(
            #krate::__private::DetachMode::of(&#req),
            #work_fn(#run_var, #req, #(#ids),*),
        ))
            .__distlock_run();
        #call_var.await
    }
}

/// The last parameter read through `BodyFp` (see `wrap_body_param`): its type wrapped,
/// and the statement that unwraps it into `last` and `seen` (with no parameter, one
/// that binds `seen` alone is added).
fn body_param(
    func: &mut ItemFn,
    krate: &syn::Path,
    last: Option<&Ident>,
    seen: &Ident,
) -> TokenStream {
    let Some(id) = last else {
        func.sig.inputs.push(syn::parse_quote!(
            #krate::__private::BodyFp((), #seen): #krate::__private::BodyFp<()>
        ));
        return TokenStream::new();
    };
    if let Some(FnArg::Typed(pt)) = func.sig.inputs.last_mut() {
        let ty = &pt.ty;
        let wrapped: Type = syn::parse_quote!(#krate::__private::BodyFp<#ty>);
        *pt.ty = wrapped;
    }
    quote!(let #krate::__private::BodyFp(#id, #seen) = #id;)
}
