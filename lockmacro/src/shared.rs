//! Expansion pieces both attributes use: the key template and the client.

use proc_macro2::{Delimiter, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::{Expr, Ident};

use crate::check::binding_tokens;
use crate::shape::rename_self;
use crate::spans::{group, respan, respan_range, span_range};
use crate::template::{Part, Template};

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
