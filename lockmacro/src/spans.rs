//! Where errors land: moving tokens onto the user's spans.

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote};
use syn::Type;

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
