//! Cross-checks between the arguments and the function: placeholders against the
//! bindings the parameter patterns introduce.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::visit_mut::VisitMut;
use syn::{Attribute, FnArg, Ident, Pat, PatIdent, Signature};

use crate::template::Template;

/// Names bound by the function's parameters, walking destructuring patterns
/// (`Path(id)`, `Json(Order { id, .. })`, `web::Path((a, b))`).
pub(crate) fn param_bindings(sig: &Signature) -> Vec<String> {
    let mut names = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(_) => names.push("self".to_owned()),
            FnArg::Typed(pat) => pat_bindings(&pat.pat, &mut names),
        }
    }
    names
}

/// The names `pat` binds, added to `out` in order (each once: the cases of an `|`
/// pattern bind the same names). `r#type` binds `type`: placeholders write `<type>` (or
/// `<r#type>`).
pub(crate) fn pat_bindings(pat: &Pat, out: &mut Vec<String>) {
    let mut pat = pat.clone();
    EachBinding(|p: &mut PatIdent| {
        let name = p.ident.unraw().to_string();
        if !out.contains(&name) {
            out.push(name);
        }
    })
    .visit_pat_mut(&mut pat);
}

/// The one walk over a pattern's bindings: `f` gets each `name` or `name @ sub` binding,
/// in order, inside tuples, tuple structs, structs, slices, references, parentheses,
/// type ascriptions and every case of an `|` pattern. Types and expressions inside the
/// pattern (an array length, a range bound) are not entered: they bind nothing.
pub(crate) struct EachBinding<F>(pub(crate) F);

impl<F: FnMut(&mut PatIdent)> VisitMut for EachBinding<F> {
    fn visit_pat_ident_mut(&mut self, p: &mut PatIdent) {
        (self.0)(p);
        syn::visit_mut::visit_pat_ident_mut(self, p);
    }

    fn visit_type_mut(&mut self, _: &mut syn::Type) {}

    fn visit_expr_mut(&mut self, _: &mut syn::Expr) {}
}

/// The `#[cfg(...)]` attributes of each parameter, with the names its pattern binds: a
/// statement about such a binding carries them too, so it goes where the parameter goes.
pub(crate) fn binding_cfgs(sig: &Signature) -> Vec<(String, Vec<Attribute>)> {
    let mut out = Vec::new();
    for input in &sig.inputs {
        let FnArg::Typed(pat) = input else { continue };
        let cfgs: Vec<Attribute> = pat
            .attrs
            .iter()
            .filter(|a| a.path().is_ident("cfg"))
            .cloned()
            .collect();
        if cfgs.is_empty() {
            continue;
        }
        let mut names = Vec::new();
        pat_bindings(&pat.pat, &mut names);
        out.extend(names.into_iter().map(|n| (n, cfgs.clone())));
    }
    out
}

/// The expression naming binding or field `name` (as [`param_bindings`] gives it):
/// `self` (`__self` in an `#[async_trait]` body), or a raw identifier for a keyword
/// (`type` is `r#type`).
pub(crate) fn binding_tokens(name: &str, span: Span, async_trait: bool) -> TokenStream {
    if name == "self" {
        return if async_trait {
            Ident::new("__self", span).into_token_stream()
        } else {
            syn::token::SelfValue(span).into_token_stream()
        };
    }
    match syn::parse_str::<Ident>(name) {
        Ok(_) => Ident::new(name, span).into_token_stream(),
        Err(_) => Ident::new_raw(name, span).into_token_stream(),
    }
}

/// Every placeholder must name a binding; the error lists them and suggests the closest.
pub(crate) fn check_placeholders(
    template: &Template,
    what: &str,
    bindings: &[String],
) -> syn::Result<()> {
    let mut errors: Option<syn::Error> = None;
    for (root, _) in template.args() {
        if bindings.iter().any(|b| b == root) {
            continue;
        }
        let available = if bindings.is_empty() {
            "the function has no parameters".to_owned()
        } else {
            format!(
                "available bindings: {}",
                bindings
                    .iter()
                    .map(|b| format!("`{b}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let hint = match closest(root, bindings.iter().map(String::as_str)) {
            Some(best) => format!("; did you mean `<{best}>`?"),
            None => String::new(),
        };
        let e = syn::Error::new(
            template.lit.span(),
            format!(
                "unknown placeholder `<{root}>` in {what}: no parameter binds `{root}`{hint} ({available})"
            ),
        );
        match &mut errors {
            Some(all) => all.combine(e),
            None => errors = Some(e),
        }
    }
    errors.map_or(Ok(()), Err)
}

/// The candidate closest to `name`, if it is close enough to be a likely typo.
pub(crate) fn closest<'a>(
    name: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .map(|c| (levenshtein(name, c), c))
        .filter(|(d, c)| *d <= (name.len().max(c.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_bindings_in_patterns() {
        let sig: Signature = syn::parse_quote! {
            fn f(&self, Path((a, b)): Path<(u32, u32)>, Json(Order { id, customer: c, .. }): Json<Order>, x @ _: u8)
        };
        assert_eq!(param_bindings(&sig), ["self", "a", "b", "id", "c", "x"]);
    }

    #[test]
    fn suggests() {
        assert_eq!(closest("od", ["id", "n"].into_iter()), Some("id"));
        assert_eq!(
            closest("ttk", ["key", "ttl", "wait"].into_iter()),
            Some("ttl")
        );
        assert_eq!(closest("zzzzz", ["id"].into_iter()), None);
    }
}
