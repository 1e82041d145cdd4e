//! `#[distributed_lock]`: arguments → validated config → acquire / run / release.

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Block, Expr, Ident, ItemFn, LitStr, Pat, ReturnType, Stmt, Type};

use crate::args::{ArgSlots, Errors, RawArgs, crate_arg, lit_str, template_arg};
use crate::check::{binding_tokens, param_bindings, pat_bindings};
use crate::duration;
use crate::template::{Part, Template};

pub(crate) const LOCK_ARGS: &[&str] = &[
    "key", "ttl", "wait", "renew", "max_hold", "on_lost", "client", "crate",
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

/// The annotated item as a function; otherwise the item unchanged plus an error.
pub(crate) fn parse_fn(item: TokenStream, attr: &str) -> Result<ItemFn, TokenStream> {
    syn::parse2(item.clone()).map_err(|_| {
        let e = syn::Error::new(
            Span::call_site(),
            format!("`#[{attr}]` can only be applied to an `async fn` with a body"),
        );
        with_error(item, e)
    })
}

/// What both attributes do first: find the body's shape and the bindings, parse the
/// arguments with `config` (checking placeholders against those bindings), and report a
/// function that is not async. Errors are collected, not returned at the first.
pub(crate) fn shape_and_config<C>(
    func: &mut ItemFn,
    args: TokenStream,
    attr: &str,
    config: impl FnOnce(RawArgs, Option<&[String]>, &mut Errors) -> Option<C>,
) -> (Shape, Option<C>, Errors) {
    let mut errors = Errors::default();
    let shape = Shape::of(func);
    let bindings = shape.bindings(func);
    let config = match syn::parse2::<RawArgs>(args) {
        Ok(raw) => config(raw, bindings.as_deref(), &mut errors),
        Err(e) => {
            errors.push(e);
            None
        }
    };
    if let Shape::NotAsync = shape {
        errors.push(syn::Error::new(
            func.sig.fn_token.span(),
            format!(
                "the `async` keyword is missing from the function declaration: `#[{attr}]` works on `async fn`"
            ),
        ));
    }
    (shape, config, errors)
}

/// The user's item, unchanged, plus the error: IDEs keep seeing the function.
pub(crate) fn with_error(item: TokenStream, e: syn::Error) -> TokenStream {
    let e = e.to_compile_error();
    quote!(#item #e)
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
    let ttl = duration_arg(slots.take("ttl"), errors, "").unwrap_or(Some(30_000));
    let wait = duration_arg(
        slots.take("wait"),
        errors,
        "; leave `wait` out for one try that fails fast with `Busy`",
    )
    .unwrap_or(Some(0));
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
    let max_hold = duration_arg(max_hold_arg, errors, "").unwrap_or(Some(0));
    let cancel_on_lost = match slots.take("on_lost") {
        Some(arg) => {
            needs_renew("on_lost", &arg, errors);
            on_lost_arg(&arg, errors)
        }
        None => Some(true),
    };
    let client = slots.take("client").map(|a| a.value);
    Some(LockConfig {
        krate: krate?,
        key: key?,
        ttl_ms: ttl?,
        wait_ms: wait?,
        renew: renew?,
        max_hold_ms: max_hold?,
        cancel_on_lost: cancel_on_lost?,
        client,
    })
}

/// `on_lost = "cancel" | "continue"` as whether to cancel the body (`None`: reported).
pub(crate) fn on_lost_arg(arg: &crate::args::RawArg, errors: &mut Errors) -> Option<bool> {
    match lit_str(arg) {
        Ok(lit) if lit.value() == "cancel" => Some(true),
        Ok(lit) if lit.value() == "continue" => Some(false),
        Ok(lit) => {
            errors.push(syn::Error::new(
                lit.span(),
                format!(
                    "unknown `on_lost` policy `{}`: expected `\"cancel\"` (default: the body is cancelled at its next await) or `\"continue\"` (it runs on and the call returns `Lost`)",
                    lit.value()
                ),
            ));
            None
        }
        Err(e) => {
            errors.push(e);
            None
        }
    }
}

/// The value as a `bool` literal.
pub(crate) fn bool_lit(arg: &crate::args::RawArg) -> syn::Result<bool> {
    match &arg.value {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Bool(b),
            ..
        }) => Ok(b.value),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{}` expects `true` or `false`", arg.name),
        )),
    }
}

/// `None` when absent; `Some(None)` when present but invalid (the error is recorded).
pub(crate) fn duration_arg(
    arg: Option<crate::args::RawArg>,
    errors: &mut Errors,
    zero_hint: &str,
) -> Option<Option<u64>> {
    let arg = arg?;
    let lit: LitStr = match lit_str(&arg) {
        Ok(l) => l,
        Err(e) => {
            errors.push(e);
            return Some(None);
        }
    };
    let name = &arg.name;
    match duration::parse(&lit.value()) {
        Ok(d) if d.is_zero() => {
            errors.push(syn::Error::new(
                lit.span(),
                format!("`{name}` must be greater than zero{zero_hint}"),
            ));
            Some(None)
        }
        Ok(d) => Some(Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))),
        Err(msg) => {
            errors.push(syn::Error::new(lit.span(), format!("{msg} (in `{name}`)")));
            Some(None)
        }
    }
}

/// How the function's body is laid out.
pub(crate) enum Shape {
    /// `async fn`: wrap the block.
    Async,
    /// A method already rewritten by `#[async_trait]`: `Box::pin(async move { ...; let __ret: R = {body}; __ret })`.
    /// Holds the index of the `let __ret` statement inside the async block.
    AsyncTrait(usize),
    NotAsync,
}

impl Shape {
    pub(crate) fn of(func: &mut ItemFn) -> Shape {
        if func.sig.asyncness.is_some() {
            return Shape::Async;
        }
        match async_trait_block(&mut func.block).and_then(|b| ret_stmt(b).map(|(i, _)| i)) {
            Some(i) => Shape::AsyncTrait(i),
            None => Shape::NotAsync,
        }
    }

    pub(crate) fn bindings(&self, func: &ItemFn) -> Option<Vec<String>> {
        let mut names = param_bindings(&func.sig);
        match self {
            Shape::Async => {}
            Shape::AsyncTrait(i) => {
                let mut block = func.block.clone();
                let inner = async_trait_block(&mut block)?;
                for stmt in &inner.stmts[..*i] {
                    if let Stmt::Local(local) = stmt {
                        pat_bindings(&local.pat, &mut names);
                    }
                }
                // `#[async_trait]` moves `self` to `__self` and patterns to `__argN`, then
                // rebinds each parameter with `let`: keep the names the user wrote, once.
                let internal = |n: &str| {
                    n == "__self"
                        || n.strip_prefix("__arg")
                            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                };
                let mut kept: Vec<String> = Vec::new();
                for n in names {
                    if !internal(&n) && !kept.contains(&n) {
                        kept.push(n);
                    }
                }
                names = kept;
            }
            Shape::NotAsync => return None,
        }
        Some(names)
    }
}

/// The block inside `Box::pin(async move { ... })`, the body `#[async_trait]` generates.
pub(crate) fn async_trait_block(block: &mut Block) -> Option<&mut Block> {
    let Some(Stmt::Expr(Expr::Call(call), None)) = block.stmts.last_mut() else {
        return None;
    };
    let Expr::Path(callee) = &*call.func else {
        return None;
    };
    let is_pin = callee
        .path
        .segments
        .last()
        .is_some_and(|s| s.ident == "pin");
    if !is_pin || call.args.len() != 1 {
        return None;
    }
    match call.args.first_mut() {
        Some(Expr::Async(a)) => Some(&mut a.block),
        _ => None,
    }
}

/// The `let __ret: R = { body };` statement of an `#[async_trait]` body.
pub(crate) fn ret_stmt(block: &mut Block) -> Option<(usize, &mut syn::Local)> {
    block
        .stmts
        .iter_mut()
        .enumerate()
        .find_map(|(i, s)| match s {
            Stmt::Local(local) => match &local.pat {
                Pat::Type(pt) if matches!(&*pt.pat, Pat::Ident(id) if id.ident == "__ret") => {
                    local.init.is_some().then_some((i, local))
                }
                _ => None,
            },
            _ => None,
        })
}

/// An async fn's return type, and its body as an expression: the block bound to a
/// `ret_var` of that type (so `?` and inference in the body see the signature's type),
/// or the block as is when the type contains `impl Trait` (not allowed on a `let`).
pub(crate) fn typed_body(func: &ItemFn, ret_var: &str) -> (Type, TokenStream) {
    let ret = match &func.sig.output {
        ReturnType::Type(_, ty) => (**ty).clone(),
        ReturnType::Default => syn::parse_quote!(()),
    };
    let block = &func.block;
    let ret_var = Ident::new(ret_var, Span::mixed_site());
    // `impl Trait` cannot be written in a `let`: each becomes `_`, so the rest of the
    // type (`Result<_, distlock::Error>`) still guides inference in the body.
    let annotated = infer_impl_traits(&ret);
    let body = quote! {
        #[allow(clippy::diverging_sub_expression)]
        let #ret_var: #annotated = #block;
        #[allow(unreachable_code)]
        #ret_var
    };
    (ret, body)
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

/// In a fn `#[async_trait]` has already expanded, replaces the initializer of the typed
/// return statement with `wrap(return type, initializer)`.
pub(crate) fn wrap_async_trait_body(
    block: &mut Block,
    wrap: impl FnOnce(&Type, TokenStream) -> TokenStream,
) {
    if let Some(inner) = async_trait_block(block)
        && let Some((_, local)) = ret_stmt(inner)
    {
        let ret = match &local.pat {
            Pat::Type(pt) => (*pt.ty).clone(),
            _ => unreachable!("ret_stmt matched a typed pattern"),
        };
        if let Some(init) = &mut local.init {
            let body = &init.expr;
            let wrapped = wrap(&ret, quote!(#body));
            *init.expr = syn::parse_quote!({ #wrapped });
        }
    }
}

/// The client a call uses: `client_of(&expr)` for `client = expr` (spanned over the
/// expression, so a client of the wrong type is reported there), else the default one.
pub(crate) fn client_expr(
    krate: &syn::Path,
    client: Option<&Expr>,
    async_trait: bool,
) -> TokenStream {
    let Some(expr) = client else {
        return quote!(#krate::__private::default_locks());
    };
    let expr = if async_trait {
        rename_self(expr.to_token_stream())
    } else {
        expr.to_token_stream()
    };
    let (first, last) = span_range(expr.clone());
    let client_of = respan_range(quote!(#krate::__private::client_of), first, last);
    let amp = respan(quote!(&), first);
    let arg = group(Delimiter::Parenthesis, quote!(#amp #expr), last);
    quote!(#client_of #arg)
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
        ..
    } = config;
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

/// The key as an expression building a `String`; placeholder values are borrowed.
pub(crate) fn key_expr(
    krate: &syn::Path,
    template: &Template,
    buf: &Ident,
    async_trait: bool,
) -> TokenStream {
    let span = template.lit.span();
    // The whole call on the literal, so a placeholder that is not `Display` is reported
    // there and not on the attribute.
    let push_arg = respan(quote!(#krate::__private::KeyBuf::push_arg), span);
    let pushes = template.parts.iter().map(|part| match part {
        Part::Lit(s) => quote!(#buf.push_lit(#s);),
        Part::Arg { root, fields } => {
            let root = binding_tokens(root, span, async_trait);
            let fields = fields.iter().map(|f| match f.parse::<u32>() {
                Ok(i) => syn::Index { index: i, span }.into_token_stream(),
                Err(_) => binding_tokens(f, span, false),
            });
            quote_spanned! {span=>
                #push_arg(&mut #buf, &(#root #(.#fields)*));
            }
        }
    });
    quote! {{
        let mut #buf = #krate::__private::KeyBuf::new();
        #(#pushes)*
        #buf.finish()
    }}
}

/// `tokens` with every span set to `span` (hygiene unchanged: only the location moves).
pub(crate) fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let TokenTree::Group(g) = &tt {
                let mut new = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                new.set_span(g.span().located_at(span));
                tt = TokenTree::Group(new);
            } else {
                tt.set_span(tt.span().located_at(span));
            }
            tt
        })
        .collect()
}

/// Where a return type that is not `Result<T, E: From<Error>>` is reported: at `E` in
/// `Result<T, E>` (the usual mistake is an `E` without the `From` impl), else at the
/// type's first token.
pub(crate) fn output_span(ret: &Type) -> Span {
    if let Type::Path(p) = ret
        && let Some(last) = p.path.segments.last()
        && last.ident == "Result"
        && let syn::PathArguments::AngleBracketed(args) = &last.arguments
    {
        let types: Vec<_> = args
            .args
            .iter()
            .filter_map(|a| match a {
                syn::GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect();
        if let [_, error] = types[..] {
            return span_range(error.to_token_stream()).0;
        }
    }
    span_range(ret.to_token_stream()).0
}

/// The spans of the first and last tokens: code respanned over them (see [`respan_range`])
/// makes rustc underline everything in between, which a single `Span` cannot on stable.
pub(crate) fn span_range(tokens: TokenStream) -> (Span, Span) {
    let mut iter = tokens.into_iter();
    let first = iter.next().map_or_else(Span::call_site, |tt| tt.span());
    let last = iter.last().map_or(first, |tt| match tt {
        TokenTree::Group(g) => g.span_close(),
        other => other.span(),
    });
    (first, last)
}

/// `tokens` with the first token located at `first` and all others at `last`.
pub(crate) fn respan_range(tokens: TokenStream, first: Span, last: Span) -> TokenStream {
    let mut iter = tokens.into_iter();
    let head = iter.next().map(|tt| respan(tt.into(), first));
    let tail = respan(iter.collect(), last);
    quote!(#head #tail)
}

/// A group of `inner` (whose spans are kept) with its delimiters at `span`.
pub(crate) fn group(delimiter: Delimiter, inner: TokenStream, span: Span) -> TokenTree {
    let mut g = proc_macro2::Group::new(delimiter, inner);
    g.set_span(Span::call_site().located_at(span));
    TokenTree::Group(g)
}

/// `#[async_trait]` moved `self` into `__self`; expressions from the arguments must follow.
pub(crate) fn rename_self(tokens: TokenStream) -> TokenStream {
    tokens
        .into_iter()
        .map(|tt| match tt {
            TokenTree::Ident(id) if id == "self" => {
                TokenTree::Ident(Ident::new("__self", id.span()))
            }
            TokenTree::Group(g) => {
                let mut new = proc_macro2::Group::new(g.delimiter(), rename_self(g.stream()));
                new.set_span(g.span());
                TokenTree::Group(new)
            }
            other => other,
        })
        .collect()
}

/// `ty` with every `impl Trait` in it replaced by `_`.
fn infer_impl_traits(ty: &Type) -> Type {
    struct Infer;
    impl syn::visit_mut::VisitMut for Infer {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            if let Type::ImplTrait(it) = ty {
                *ty = Type::Infer(syn::TypeInfer {
                    underscore_token: syn::Token![_](it.impl_token.span),
                });
                return;
            }
            syn::visit_mut::visit_type_mut(self, ty);
        }
    }
    let mut ty = ty.clone();
    syn::visit_mut::VisitMut::visit_type_mut(&mut Infer, &mut ty);
    ty
}
