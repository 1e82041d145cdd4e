//! What generated code calls to add a binding (autoref specialization): a set sorted,
//! a `Serialize` value, a known non-payload type skipped, or a compile error.

use super::*;

/// One argument offered to the fingerprint by generated code:
/// `(&&&&FpArg(name, &binding)).__distlock_fp(&mut fp)` adds a set sorted ([`FpSet`],
/// found first), else adds a `Serialize` value ([`FpSerialize`]), else skips a known
/// non-payload type ([`FpNonPayload`]), else is a compile error ([`FpNone`]).
#[doc(hidden)]
pub struct FpArg<'a, T: ?Sized>(pub &'static str, pub &'a T);

/// Adds a set, its elements sorted (autoref specialization, first).
#[doc(hidden)]
pub trait FpSet {
    /// Adds the argument.
    fn __distlock_fp(&self, fp: &mut Fingerprint);
}

impl<T: Serialize, S> FpSet for &&&FpArg<'_, std::collections::HashSet<T, S>> {
    fn __distlock_fp(&self, fp: &mut Fingerprint) {
        fp.add_set(self.0, self.1.iter());
    }
}

impl<T: Serialize, S> FpSet for &&&FpArg<'_, &std::collections::HashSet<T, S>> {
    fn __distlock_fp(&self, fp: &mut Fingerprint) {
        fp.add_set(self.0, self.1.iter());
    }
}

/// Adds a `Serialize` argument (autoref specialization, second).
#[doc(hidden)]
pub trait FpSerialize {
    /// Adds the argument.
    fn __distlock_fp(&self, fp: &mut Fingerprint);
}

impl<T: Serialize + ?Sized> FpSerialize for &&FpArg<'_, T> {
    fn __distlock_fp(&self, fp: &mut Fingerprint) {
        fp.add(self.0, self.1);
    }
}

/// Skips a known non-payload argument (autoref specialization, third).
#[doc(hidden)]
pub trait FpNonPayload {
    /// Records the argument as left out.
    fn __distlock_fp(&self, fp: &mut Fingerprint);
}

impl<T: NonPayload + ?Sized> FpNonPayload for &FpArg<'_, T> {
    fn __distlock_fp(&self, fp: &mut Fingerprint) {
        fp.skip(self.0);
    }
}

/// Types that are never part of a call's payload: the client, and the frameworks'
/// application state.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is named like application state, so `#[idempotent]` leaves its bindings out of the fingerprint, but it is not axum's `State` or `Extension`, actix-web's `web::Data` or a `distlock::Locks`",
    label = "left out of the fingerprint by its name",
    note = "if it is part of the payload, name the payload's bindings with `fingerprint = [...]`, or give the type another name"
)]
pub trait NonPayload {}

/// Compiles only for a [`NonPayload`] type (generated code checks a parameter left out
/// of the fingerprint by its type's name).
#[doc(hidden)]
pub fn assert_non_payload<T: NonPayload + ?Sized>() {}

impl NonPayload for crate::Locks {}
impl<T: NonPayload + ?Sized> NonPayload for &T {}
impl<T: NonPayload + ?Sized> NonPayload for std::sync::Arc<T> {}
#[cfg(feature = "axum")]
impl<T> NonPayload for axum::extract::State<T> {}
#[cfg(feature = "axum")]
impl<T> NonPayload for axum::Extension<T> {}
#[cfg(feature = "actix")]
impl<T: ?Sized> NonPayload for actix_web::web::Data<T> {}

/// Any other argument: a compile error (autoref specialization, last).
#[doc(hidden)]
pub trait FpNone {
    /// Never callable: the binding's type is not `Serialize`.
    fn __distlock_fp(&self, fp: &mut Fingerprint)
    where
        Self: FpChecked;
}

impl<T: ?Sized> FpNone for FpArg<'_, T> {
    fn __distlock_fp(&self, _fp: &mut Fingerprint)
    where
        Self: FpChecked,
    {
        unreachable!("`Fingerprintable` is implemented by `Serialize` types only")
    }
}

/// Holds for an argument whose type is [`Fingerprintable`].
#[doc(hidden)]
pub trait FpChecked {}

impl<T: Fingerprintable + ?Sized> FpChecked for FpArg<'_, T> {}

/// A type a binding may have to be part of the fingerprint.
#[diagnostic::on_unimplemented(
    message = "this parameter binding cannot be part of the idempotency fingerprint: `{Self}` is not `serde::Serialize`",
    label = "not `Serialize`: a different value here would replay the first call's result",
    note = "derive `serde::Serialize` for it; or, if it is not part of the payload (a pool, a client, a counter), list the binding in `skip = [...]`; or name the payload's bindings with `fingerprint = [...]`"
)]
pub trait Fingerprintable {}

#[diagnostic::do_not_recommend]
impl<T: Serialize + ?Sized> Fingerprintable for T {}
