//! The identifiers the expansions introduce, each spelled here once.
//!
//! Locals are `mixed_site`: hygienic, so the user's body can neither name them nor be
//! shadowed by them. The nested fns and the call temporary keep `call_site`, so that
//! errors about them point where the attribute is and `#[allow]`s apply as written.

use proc_macro2::Span;
use syn::Ident;

/// The names one expansion uses, built once per attribute from its prefix
/// (`__distlock` for `#[distributed_lock]`, `__distlock_idem` for `#[idempotent]`).
pub(crate) struct Names {
    /// The key the template builds.
    pub(crate) key: Ident,
    /// The client the call uses.
    pub(crate) client: Ident,
    /// The buffer a template is written into.
    pub(crate) buf: Ident,
    /// The body's value, typed with the fn's return type.
    pub(crate) ret: Ident,
    /// The scope the template builds (`#[idempotent]`).
    pub(crate) scope: Ident,
    /// The payload fingerprint.
    pub(crate) fp: Ident,
    /// The hidden request extractor of a handler.
    pub(crate) req: Ident,
    /// A handler's claimed run.
    pub(crate) run: Ident,
    /// A handler body's value.
    pub(crate) out: Ident,
    /// The captured response.
    pub(crate) cap: Ident,
    /// An early response (a replay, a rejection).
    pub(crate) done: Ident,
    /// The check of an `impl Trait` return type's bounds.
    pub(crate) impl_check: Ident,
    /// What the body wrapper saw of the request body.
    pub(crate) body_seen: Ident,
    /// The nested fn holding the user's body (a detached call).
    pub(crate) body_fn: Ident,
    /// The nested fn a detached handler runs (body, capture, store).
    pub(crate) work_fn: Ident,
    /// The call's future, bound so its temporaries end before the `.await`.
    pub(crate) call: Ident,
}

impl Names {
    /// The names of `#[distributed_lock]`'s expansion.
    pub(crate) fn lock() -> Names {
        Names::with_prefix("__distlock")
    }

    /// The names of `#[idempotent]`'s expansion.
    pub(crate) fn idem() -> Names {
        Names::with_prefix("__distlock_idem")
    }

    fn with_prefix(prefix: &str) -> Names {
        let local = |name: &str| Ident::new(&format!("{prefix}_{name}"), Span::mixed_site());
        let item = |name: &str| Ident::new(&format!("{prefix}_{name}"), Span::call_site());
        Names {
            key: local("key"),
            client: local("client"),
            buf: local("buf"),
            ret: local("ret"),
            scope: local("scope"),
            fp: local("fp"),
            req: local("req"),
            run: local("run"),
            out: local("out"),
            cap: local("cap"),
            done: local("done"),
            impl_check: local("impl_check"),
            body_seen: local("body_seen"),
            body_fn: item("body"),
            work_fn: item("work"),
            call: item("call"),
        }
    }

    /// The name a detached call gives its parameter `i` when that is a pattern.
    pub(crate) fn param(i: usize) -> Ident {
        Ident::new(&format!("__distlock_p{i}"), Span::mixed_site())
    }
}
