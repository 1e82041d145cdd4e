//! Parsing `name = value` attribute arguments, with precise errors.

use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, Ident, LitStr, Token};

use crate::check::closest;

/// One `name = value` argument; the name is kept so errors can point at it.
pub(crate) struct RawArg {
    pub(crate) name: Ident,
    pub(crate) value: Expr,
}

/// All arguments, in the order written.
pub(crate) struct RawArgs(pub(crate) Vec<RawArg>);

impl Parse for RawArgs {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let list = Punctuated::<RawArg, Token![,]>::parse_terminated(input)?;
        Ok(RawArgs(list.into_iter().collect()))
    }
}

impl Parse for RawArg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let name = Ident::parse_any(input).map_err(|e| {
            syn::Error::new(e.span(), "expected an argument such as `key = \"...\"`")
        })?;
        if !input.peek(Token![=]) {
            return Err(syn::Error::new(
                name.span(),
                format!("expected `=` and a value after `{name}`"),
            ));
        }
        input.parse::<Token![=]>()?;
        let value: Expr = input.parse()?;
        Ok(RawArg { name, value })
    }
}

/// Collects errors so one compile shows all of them.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    pub(crate) fn finish(self) -> Option<syn::Error> {
        self.0
    }
}

/// Sorts arguments into named slots, reporting unknown and repeated names.
pub(crate) struct ArgSlots<'a> {
    known: &'a [&'a str],
    values: Vec<Option<RawArg>>,
}

impl<'a> ArgSlots<'a> {
    pub(crate) fn sort(args: RawArgs, known: &'a [&'a str], errors: &mut Errors) -> Self {
        let mut values: Vec<Option<RawArg>> = known.iter().map(|_| None).collect();
        for arg in args.0 {
            let name = arg.name.unraw().to_string();
            match known.iter().position(|k| *k == name) {
                Some(i) if values[i].is_some() => errors.push(syn::Error::new(
                    arg.name.span(),
                    format!("duplicate argument `{name}`"),
                )),
                Some(i) => values[i] = Some(arg),
                None => {
                    let list = known
                        .iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let hint = match closest(&name, known.iter().copied()) {
                        Some(best) => format!(": did you mean `{best}`?"),
                        None => String::new(),
                    };
                    errors.push(syn::Error::new(
                        arg.name.span(),
                        format!("unknown argument `{name}`{hint} (expected one of: {list})"),
                    ));
                }
            }
        }
        ArgSlots { known, values }
    }

    /// Takes the argument called `name`.
    pub(crate) fn take(&mut self, name: &str) -> Option<RawArg> {
        let i = self.known.iter().position(|k| *k == name)?;
        self.values[i].take()
    }
}

/// The value as a string literal, or an error naming the argument.
pub(crate) fn lit_str(arg: &RawArg) -> syn::Result<LitStr> {
    match &arg.value {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) => Ok(s.clone()),
        other => Err(syn::Error::new(
            other.span(),
            format!(
                "`{}` expects a string literal, e.g. `{} = \"...\"`",
                arg.name, arg.name
            ),
        )),
    }
}

/// `crate = "path"`: where the facade is (default `::distlock`); `None` after an error.
pub(crate) fn crate_arg(slots: &mut ArgSlots<'_>, errors: &mut Errors) -> Option<syn::Path> {
    match slots.take("crate") {
        Some(arg) => match lit_str(&arg).and_then(|s| s.parse::<syn::Path>()) {
            Ok(path) => Some(path),
            Err(e) => {
                errors.push(e);
                None
            }
        },
        None => Some(syn::parse_quote!(::distlock)),
    }
}

/// A template argument, parsed and (when the fn's bindings are known) checked against
/// them; `None` after an error.
pub(crate) fn template_arg(
    arg: &RawArg,
    what: &str,
    bindings: Option<&[String]>,
    errors: &mut Errors,
) -> Option<crate::template::Template> {
    match lit_str(arg).and_then(|lit| crate::template::Template::parse(&lit, &arg.name.to_string()))
    {
        Ok(t) => {
            if let Some(bindings) = bindings
                && let Err(e) = crate::check::check_placeholders(&t, what, bindings)
            {
                errors.push(e);
            }
            Some(t)
        }
        Err(e) => {
            errors.push(e);
            None
        }
    }
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

/// `replicas = 1`: how many replicas must acknowledge; `Some(None)` when absent (the
/// client's default then). `None` when invalid (the error is recorded).
pub(crate) fn replicas_arg(
    arg: Option<crate::args::RawArg>,
    errors: &mut Errors,
) -> Option<Option<u32>> {
    let Some(arg) = arg else {
        return Some(None);
    };
    let parsed = match &arg.value {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) => i.base10_parse::<u32>().ok(),
        _ => None,
    };
    if parsed.is_none() {
        errors.push(syn::Error::new(
            arg.value.span(),
            "`replicas` expects how many replicas must acknowledge each write: an integer such as `1`",
        ));
        return None;
    }
    Some(parsed)
}

/// `replicas` in a spec: `Some(n)` as given, `None` for the client's default.
pub(crate) fn replicas_tokens(replicas: Option<u32>) -> proc_macro2::TokenStream {
    match replicas {
        Some(n) => quote::quote!(::core::option::Option::Some(#n)),
        None => quote::quote!(::core::option::Option::None),
    }
}

/// A duration in milliseconds: `default` when absent. `None` when invalid (the error is
/// recorded), as every `*_arg` here: `None` always means "invalid, already reported".
pub(crate) fn duration_arg(
    arg: Option<crate::args::RawArg>,
    errors: &mut Errors,
    zero_hint: &str,
    default: u64,
) -> Option<u64> {
    let Some(arg) = arg else {
        return Some(default);
    };
    let lit: LitStr = match lit_str(&arg) {
        Ok(l) => l,
        Err(e) => {
            errors.push(e);
            return None;
        }
    };
    let name = &arg.name;
    match crate::duration::parse(&lit.value()) {
        Ok(d) if d.is_zero() => {
            errors.push(syn::Error::new(
                lit.span(),
                format!("`{name}` must be greater than zero{zero_hint}"),
            ));
            None
        }
        Ok(d) => Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        Err(msg) => {
            errors.push(syn::Error::new(lit.span(), format!("{msg} (in `{name}`)")));
            None
        }
    }
}
