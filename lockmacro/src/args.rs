//! Parsing `name = value` attribute arguments, with precise errors.

use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, Ident, LitStr, Token};

use crate::check::closest;
use crate::template::Template;

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

/// Collects errors so one compile shows all of them (serde's `Ctxt`): every error is
/// pushed here, and [`finish`](Self::finish) hands them over as one. Dropping it
/// unfinished is a bug in this crate (errors would be lost): it panics.
#[derive(Default)]
pub(crate) struct Errors {
    errors: Option<syn::Error>,
    finished: bool,
}

impl Errors {
    pub(crate) fn push(&mut self, e: syn::Error) {
        match &mut self.errors {
            Some(all) => all.combine(e),
            None => self.errors = Some(e),
        }
    }

    /// The errors pushed, combined; `None` when there were none.
    pub(crate) fn finish(mut self) -> Option<syn::Error> {
        self.finished = true;
        self.errors.take()
    }
}

impl Drop for Errors {
    fn drop(&mut self) {
        if !self.finished && !std::thread::panicking() {
            panic!("forgot to check for errors");
        }
    }
}

/// One argument after parsing. Every getter of [`ArgSlots`] returns one, by one
/// convention: `Absent` when not written; `Invalid` when written wrong, its error
/// already pushed (nothing more is said of it, and no expansion follows); `Given` with
/// its value. The name, as written, is where errors about how it relates to other
/// arguments point (see `valid.rs`).
pub(crate) enum Arg<T> {
    Absent,
    Invalid(Ident),
    Given(Ident, T),
}

impl<T> Arg<T> {
    /// Its value, or `default` when absent; `None` when invalid.
    pub(crate) fn or(self, default: T) -> Option<T> {
        match self {
            Arg::Absent => Some(default),
            Arg::Invalid(_) => None,
            Arg::Given(_, v) => Some(v),
        }
    }

    /// Its value if given, `Some(None)` when absent; `None` when invalid (as [`or`]).
    ///
    /// [`or`]: Self::or
    pub(crate) fn optional(self) -> Option<Option<T>> {
        self.map(Some).or(None)
    }

    /// Its value, `None` unless given (absence already reported by the caller).
    pub(crate) fn required(self) -> Option<T> {
        match self {
            Arg::Given(_, v) => Some(v),
            Arg::Absent | Arg::Invalid(_) => None,
        }
    }

    /// The argument's name when it is written, valid or not.
    pub(crate) fn name(&self) -> Option<&Ident> {
        match self {
            Arg::Absent => None,
            Arg::Invalid(name) | Arg::Given(name, _) => Some(name),
        }
    }

    /// The value when given.
    pub(crate) fn value(&self) -> Option<&T> {
        match self {
            Arg::Given(_, v) => Some(v),
            Arg::Absent | Arg::Invalid(_) => None,
        }
    }

    pub(crate) fn is_absent(&self) -> bool {
        matches!(self, Arg::Absent)
    }

    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Arg<U> {
        match self {
            Arg::Absent => Arg::Absent,
            Arg::Invalid(name) => Arg::Invalid(name),
            Arg::Given(name, v) => Arg::Given(name, f(v)),
        }
    }
}

/// Sorts arguments into named slots, reporting unknown and repeated names; the typed
/// getters below then take each one out as an [`Arg`].
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
    fn take(&mut self, name: &str) -> Option<RawArg> {
        let i = self.known.iter().position(|k| *k == name)?;
        self.values[i].take()
    }

    /// The argument `name` read by `parse`: the one shape every getter has.
    pub(crate) fn parsed<T>(
        &mut self,
        name: &str,
        errors: &mut Errors,
        parse: impl FnOnce(&RawArg) -> syn::Result<T>,
    ) -> Arg<T> {
        let Some(arg) = self.take(name) else {
            return Arg::Absent;
        };
        match parse(&arg) {
            Ok(v) => Arg::Given(arg.name, v),
            Err(e) => {
                errors.push(e);
                Arg::Invalid(arg.name)
            }
        }
    }

    /// `name = true | false`.
    pub(crate) fn bool(&mut self, name: &str, errors: &mut Errors) -> Arg<bool> {
        self.parsed(name, errors, bool_lit)
    }

    /// `name = "10s"` in milliseconds, greater than zero (`zero_hint` says what to do
    /// instead of zero).
    pub(crate) fn duration(
        &mut self,
        name: &str,
        zero_hint: &str,
        errors: &mut Errors,
    ) -> Arg<u64> {
        self.parsed(name, errors, |arg| duration_ms(arg, zero_hint))
    }

    /// `name = "..."`, rejected with the message `check` gives, if any.
    pub(crate) fn string(
        &mut self,
        name: &str,
        check: fn(&str) -> Option<String>,
        errors: &mut Errors,
    ) -> Arg<LitStr> {
        self.parsed(name, errors, |arg| {
            let lit = lit_str(arg)?;
            match check(&lit.value()) {
                Some(msg) => Err(syn::Error::new(lit.span(), msg)),
                None => Ok(lit),
            }
        })
    }

    /// A template (`key`, `scope`), its placeholders checked against the fn's bindings
    /// when they are known: an unknown placeholder is reported, and the template is
    /// still given (so the other arguments' errors come with it).
    pub(crate) fn template(
        &mut self,
        name: &str,
        what: &str,
        bindings: Option<&[String]>,
        errors: &mut Errors,
    ) -> Arg<Template> {
        let arg = self.parsed(name, errors, |arg| {
            lit_str(arg).and_then(|lit| Template::parse(&lit, &arg.name.to_string()))
        });
        if let (Some(t), Some(bindings)) = (arg.value(), bindings)
            && let Err(e) = crate::check::check_placeholders(t, what, bindings)
        {
            errors.push(e);
        }
        arg
    }

    /// `name = ["tmpl", ...]`: a non-empty array of key templates, each parsed and its
    /// placeholders checked against `bindings`, none written twice.
    pub(crate) fn templates(
        &mut self,
        name: &str,
        bindings: Option<&[String]>,
        errors: &mut Errors,
    ) -> Arg<Vec<Template>> {
        let arg = self.parsed(name, errors, |arg| {
            let Expr::Array(array) = &arg.value else {
                return Err(syn::Error::new(
                    arg.value.span(),
                    format!("`{name}` expects an array of key templates, e.g. `{name} = [\"account:<from>\", \"account:<to>\"]`"),
                ));
            };
            if array.elems.is_empty() {
                return Err(syn::Error::new(
                    array.span(),
                    format!("`{name}` is empty: name at least one key (or use `key = \"...\"` for one)"),
                ));
            }
            let mut templates: Vec<Template> = Vec::new();
            let mut errs: Option<syn::Error> = None;
            let mut push = |e: syn::Error| match &mut errs {
                Some(all) => all.combine(e),
                None => errs = Some(e),
            };
            for elem in &array.elems {
                let lit = match elem {
                    Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(lit),
                        ..
                    }) => lit,
                    other => {
                        push(syn::Error::new(
                            other.span(),
                            "each key is a string literal template, e.g. `\"account:<from>\"`",
                        ));
                        continue;
                    }
                };
                if templates.iter().any(|t| t.lit.value() == lit.value()) {
                    push(syn::Error::new(
                        lit.span(),
                        "this key is named twice in `keys`: remove the duplicate",
                    ));
                    continue;
                }
                match Template::parse(lit, name) {
                    Ok(t) => templates.push(t),
                    Err(e) => push(e),
                }
            }
            match errs {
                Some(e) => Err(e),
                None => Ok(templates),
            }
        });
        if let (Some(ts), Some(bindings)) = (arg.value(), bindings) {
            for t in ts {
                if let Err(e) = crate::check::check_placeholders(t, "the key template", bindings) {
                    errors.push(e);
                }
            }
        }
        arg
    }

    /// `on_lost = "cancel" | "continue"` as whether to cancel the body.
    pub(crate) fn on_lost(&mut self, errors: &mut Errors) -> Arg<bool> {
        self.parsed("on_lost", errors, |arg| {
            let lit = lit_str(arg)?;
            match lit.value().as_str() {
                "cancel" => Ok(true),
                "continue" => Ok(false),
                other => Err(syn::Error::new(
                    lit.span(),
                    format!(
                        "unknown `on_lost` policy `{other}`: expected `\"cancel\"` (default: the body is cancelled at its next await) or `\"continue\"` (it runs on and the call returns `Lost`)"
                    ),
                )),
            }
        })
    }

    /// `replicas = 1`: how many replicas must acknowledge.
    pub(crate) fn replicas(&mut self, errors: &mut Errors) -> Arg<u32> {
        self.parsed("replicas", errors, |arg| {
            let parsed = match &arg.value {
                Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(i),
                    ..
                }) => i.base10_parse::<u32>().ok(),
                _ => None,
            };
            parsed.ok_or_else(|| {
                syn::Error::new(
                    arg.value.span(),
                    "`replicas` expects how many replicas must acknowledge each write: an integer such as `1`",
                )
            })
        })
    }

    /// `permits = 4`: a semaphore's count, at least 1.
    pub(crate) fn permits(&mut self, errors: &mut Errors) -> Arg<u32> {
        self.parsed("permits", errors, |arg| {
            let parsed = match &arg.value {
                Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(i),
                    ..
                }) => i.base10_parse::<u32>().ok(),
                _ => None,
            };
            match parsed {
                Some(0) => Err(syn::Error::new(
                    arg.value.span(),
                    "`permits = 0` would never let anyone in: a semaphore needs at least one permit (`permits = 1` is a lock; leave `permits` out for one)",
                )),
                Some(n) => Ok(n),
                None => Err(syn::Error::new(
                    arg.value.span(),
                    "`permits` expects how many holders may hold the semaphore at once: an integer such as `4`",
                )),
            }
        })
    }

    /// `mode = "read" | "write"`: a read/write lock's side; `true` for read.
    pub(crate) fn mode(&mut self, errors: &mut Errors) -> Arg<bool> {
        self.parsed("mode", errors, |arg| {
            let lit = lit_str(arg)?;
            match lit.value().as_str() {
                "read" => Ok(true),
                "write" => Ok(false),
                other => Err(syn::Error::new(
                    lit.span(),
                    format!("`mode` is `\"read\"` or `\"write\"` (a read/write lock's side), not `{other:?}`"),
                )),
            }
        })
    }

    /// `crate = "path"`: where the facade is.
    pub(crate) fn krate(&mut self, errors: &mut Errors) -> Arg<syn::Path> {
        self.parsed("crate", errors, |arg| lit_str(arg)?.parse::<syn::Path>())
    }

    /// `name = <any expression>` (`client`): never invalid here; the compiler checks it.
    pub(crate) fn expr(&mut self, name: &str) -> Option<Expr> {
        self.take(name).map(|a| a.value)
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

/// The value as a `bool` literal.
fn bool_lit(arg: &RawArg) -> syn::Result<bool> {
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

/// A duration string in milliseconds, greater than zero.
fn duration_ms(arg: &RawArg, zero_hint: &str) -> syn::Result<u64> {
    let lit = lit_str(arg)?;
    let name = &arg.name;
    match crate::duration::parse(&lit.value()) {
        Ok(d) if d.is_zero() => Err(syn::Error::new(
            lit.span(),
            format!("`{name}` must be greater than zero{zero_hint}"),
        )),
        Ok(d) => Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        Err(msg) => Err(syn::Error::new(lit.span(), format!("{msg} (in `{name}`)"))),
    }
}

/// `replicas` in a spec: `Some(n)` as given, `None` for the client's default.
pub(crate) fn replicas_tokens(replicas: Option<u32>) -> proc_macro2::TokenStream {
    match replicas {
        Some(n) => quote::quote!(::core::option::Option::Some(#n)),
        None => quote::quote!(::core::option::Option::None),
    }
}
