//! The annotated function: parsing it, its body's shape (`async fn` or a method
//! `#[async_trait]` has rewritten), its typed return, and the errors reported on it.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, quote};
use syn::spanned::Spanned;
use syn::{Block, Expr, Ident, ItemFn, Pat, ReturnType, Stmt, Type};

use crate::args::{Errors, RawArgs};
use crate::check::{param_bindings, pat_bindings};

/// The annotated item as a function; otherwise the item unchanged plus an error: ours
/// when it is another kind of item, syn's own (with its span) when it does not parse.
pub(crate) fn parse_fn(item: TokenStream, attr: &str) -> Result<ItemFn, TokenStream> {
    syn::parse2::<ItemFn>(item.clone()).map_err(|e| match syn::parse2::<syn::Item>(item.clone()) {
        Ok(other) => with_error(
            item,
            syn::Error::new(
                first_span(&other),
                format!("`#[{attr}]` can only be applied to an `async fn` with a body"),
            ),
        ),
        Err(_) => with_error(item, e),
    })
}

/// The first token of an item (its `struct`, `fn`, ... keyword or first attribute).
fn first_span(item: &syn::Item) -> Span {
    item.to_token_stream()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |t| t.span())
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
pub(crate) fn typed_body(func: &ItemFn, ret_var: &Ident) -> (Type, TokenStream) {
    let ret = match &func.sig.output {
        ReturnType::Type(_, ty) => (**ty).clone(),
        ReturnType::Default => syn::parse_quote!(()),
    };
    let block = &func.block;
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
pub(crate) fn infer_impl_traits(ty: &Type) -> Type {
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
