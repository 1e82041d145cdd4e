//! Plain async fns: settings, the return-type contract and the runner that
//! `#[idempotent(key = ...)]` expands to. Reached only through `crate::__private`.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::recording::same_data;
use super::{Begin, Fingerprint, begin, record, record_key};
use crate::client::Locks;
use crate::error::{BackendErrorKind, Error};

/// Settings fixed at compile time by `#[idempotent]`.
#[derive(Debug, Clone, Copy)]
pub struct IdemSpec {
    /// Retention of the completed record, in milliseconds.
    pub ttl_ms: u64,
    /// Lease of the claim, in milliseconds.
    pub lease_ms: u64,
    /// How long a repeat waits for a running call (0: answer `InProgress` at once).
    pub wait_ms: u64,
    /// Largest response body stored (handlers), or stored value's JSON (keyed fns).
    pub max_body: usize,
    /// The header carrying the key (handlers).
    pub header: &'static str,
    /// Whether a request without the header is rejected (handlers).
    pub required: bool,
    /// When the claim is found lost while the body runs: cancel the body at its next
    /// await (`true`) or let it finish (`false`); either way nothing is stored and the
    /// call returns `Lost`.
    pub cancel_on_lost: bool,
    /// Replicas that must acknowledge the claim and the stored result; `None`: the
    /// client's default.
    pub replicas: Option<u32>,
}

impl IdemSpec {
    pub(crate) fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms.max(1))
    }

    pub(crate) fn retention(&self) -> Duration {
        Duration::from_millis(self.ttl_ms.max(1))
    }
}

/// What an idempotent plain fn returns: `Result<T, E>` with `T` storable and
/// `E: From<distlock::Error>`.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` functions must return `Result<T, E>` where `T: Serialize + DeserializeOwned` and `E: From<distlock::Error>`, found `{Self}`",
    label = "expected `Result<T, E>`",
    note = "the `Ok` value is stored as JSON and replayed to repeats; idempotency failures (`InProgress`, `PayloadMismatch`, `Backend`) are returned through `E`"
)]
pub trait IdemOutput: Sized {
    /// The `Ok` type.
    type Value;
    /// An idempotency failure as this return value.
    fn from_idem_error(error: Error) -> Self;
    /// The `Ok` value as JSON (`None` for an `Err`, which is not stored), checked to read
    /// back as itself: making the same serde calls as the original (see `recording`:
    /// `Some(None)`, which reads back as `None`, does not), and equal to it by `same` (the
    /// type's `PartialEq`, when it has one: see [`SameProbe`]); else why it cannot be
    /// stored (the record says so, and a repeat gets `Unrepresentable` rather than
    /// another value).
    fn to_stored(&self, same: Same<Self::Value>) -> Option<Result<serde_json::Value, String>>;
    /// The `Ok` value back from its JSON.
    fn from_stored(value: serde_json::Value) -> Result<Self, serde_json::Error>;
}

/// An `Ok` type `#[idempotent]` can store and replay.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored by `#[idempotent]`: it must implement `serde::Serialize` and `serde::de::DeserializeOwned`",
    label = "the `Ok` type must be `Serialize + DeserializeOwned`",
    note = "the first call's `Ok` value is stored as JSON and replayed to every repeat; derive `serde::Serialize` and `serde::Deserialize` for it"
)]
pub trait IdemValue: serde::Serialize + serde::de::DeserializeOwned {}

#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned> IdemValue for T {}

/// An error type `#[idempotent]` can report its failures through.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot carry idempotency failures: `#[idempotent]` needs `{Self}: From<distlock::Error>`",
    label = "the error type `{Self}` of this return type must implement `From<distlock::Error>`",
    note = "`InProgress`, `PayloadMismatch` and `Backend` are returned as `Err(distlock::Error.into())`"
)]
pub trait IdemError: From<Error> {}

#[diagnostic::do_not_recommend]
impl<E: From<Error>> IdemError for E {}

/// How a stored value is compared with the value read back from its JSON: the type's
/// `PartialEq` when it has one, else `None` (see [`IdemOutput::to_stored`]).
pub type Same<T> = Option<fn(&T, &T) -> bool>;

/// Finds the `Ok` type's `PartialEq` for generated code, given the fn's return type `R`:
/// `(&&SameProbe::<R>::new()).__distlock_same()` is `Some(eq)` when `R` is
/// `Result<T, E>` with `T: PartialEq` ([`SameByEq`], found first), else [`NoSame`]
/// ([`SameBySerde`]); either is an [`IntoSame`]. A generic `T` whose bounds do not
/// promise `PartialEq` gets `NoSame`. Named by the return type alone, a return type that
/// is not `Result` is reported once, by the call's own bound.
#[doc(hidden)]
pub struct SameProbe<R>(std::marker::PhantomData<fn() -> R>);

impl<R> SameProbe<R> {
    /// The probe.
    pub fn new() -> Self {
        SameProbe(std::marker::PhantomData)
    }
}

impl<R> Default for SameProbe<R> {
    fn default() -> Self {
        Self::new()
    }
}

/// No `PartialEq` found: the serde calls compare (see [`IdemOutput::to_stored`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct NoSame;

/// What a [`SameProbe`] found, as the comparison of the `Ok` values of `R`.
#[doc(hidden)]
pub trait IntoSame<R> {
    /// The comparison, if any.
    fn into_same(self) -> Same<R::Value>
    where
        R: IdemOutput;
}

impl<T: IdemValue, E: IdemError> IntoSame<Result<T, E>> for Same<T> {
    fn into_same(self) -> Same<<Result<T, E> as IdemOutput>::Value> {
        self
    }
}

impl<R> IntoSame<R> for NoSame {
    fn into_same(self) -> Same<R::Value>
    where
        R: IdemOutput,
    {
        None
    }
}

/// `Result<T, E>` with `T: PartialEq`: its equality.
#[doc(hidden)]
pub trait SameByEq {
    /// The comparison.
    type Found;
    /// The comparison.
    fn __distlock_same(&self) -> Self::Found;
}

impl<T: PartialEq, E> SameByEq for &SameProbe<Result<T, E>> {
    type Found = Same<T>;

    fn __distlock_same(&self) -> Same<T> {
        Some(|a, b| a == b)
    }
}

/// Any other return type: no comparison.
#[doc(hidden)]
pub trait SameBySerde {
    /// No comparison.
    fn __distlock_same(&self) -> NoSame;
}

impl<R> SameBySerde for SameProbe<R> {
    fn __distlock_same(&self) -> NoSame {
        NoSame
    }
}

impl<T: IdemValue, E: IdemError> IdemOutput for Result<T, E> {
    type Value = T;

    fn from_idem_error(error: Error) -> Self {
        Err(error.into())
    }

    fn to_stored(&self, same: Same<T>) -> Option<Result<serde_json::Value, String>> {
        let ok = self.as_ref().ok()?;
        let round_trip = || {
            let value =
                serde_json::to_value(ok).map_err(|e| format!("it fails to serialize: {e}"))?;
            let back: T = serde_json::from_value(value.clone())
                .map_err(|e| format!("it does not read back from its JSON {value}: {e}"))?;
            // The JSON texts of the two would not do: `Some(None)` reads back as `None`,
            // whose JSON is `null` again. The type's own equality tells; without one,
            // their serde calls do (see `recording`), which cannot see an untagged
            // enum's variant.
            // Both, where the type has `PartialEq`: a hand-written one may compare less
            // than the data (an id alone), and the serde calls see less than the type.
            let same = same_data(ok, &back)? && same.is_none_or(|eq| eq(ok, &back));
            if !same {
                return Err(format!(
                    "it reads back from its JSON {value} as another value"
                ));
            }
            Ok(value)
        };
        Some(round_trip())
    }

    fn from_stored(value: serde_json::Value) -> Result<Self, serde_json::Error> {
        serde_json::from_value(value).map(Ok)
    }
}

/// An idempotent fn as its records know it.
#[derive(Debug, Clone, Copy)]
pub struct IdemFn {
    /// The records' namespace: `name = "..."`, else `module::path::fn_name`.
    pub namespace: &'static str,
    /// Where the fn is defined (`file:line:column`), to name two fns that share one
    /// namespace.
    pub site: &'static str,
}

/// Where a plain fn's record lives: the function's path, the rendered scope, the key.
#[derive(Debug)]
pub struct IdemTarget {
    /// The fn: its record namespace and where it is defined.
    pub function: IdemFn,
    /// The rendered `scope` template, if any.
    pub scope: Option<String>,
    /// The rendered `key` template.
    pub key: String,
}

/// One call of an `#[idempotent(key = ...)]` fn, as generated code describes it.
#[derive(Debug)]
pub struct IdemCall {
    /// The client (or why there is none).
    pub client: Result<Locks, Error>,
    /// Where the record lives.
    pub target: IdemTarget,
    /// The payload.
    pub fp: Fingerprint,
    /// The attribute's settings.
    pub spec: IdemSpec,
}

/// The body of an `#[idempotent(key = ...)]` fn: claim or replay, run with the lease
/// renewed, then store an `Ok` or release on `Err` or a panic (see `Claim`'s `Drop` for
/// a cancelled call).
///
/// `same`: what generated code's [`SameProbe`] found for the return type.
pub fn run_idempotent<R, F, S>(
    call: IdemCall,
    same: S,
    body: F,
) -> impl Future<Output = R> + use<R, F, S>
where
    R: IdemOutput,
    F: Future<Output = R>,
    S: IntoSame<R>,
{
    run_idempotent_with(call, same.into_same(), body)
}

/// [`run_idempotent`] with the comparison found.
async fn run_idempotent_with<R, F>(call: IdemCall, same: Same<R::Value>, body: F) -> R
where
    R: IdemOutput,
    F: Future<Output = R>,
{
    use tracing::Instrument as _;
    // One span per call: the function, the record's key once known, and the outcome
    // (`claimed`, `replayed`, `in_progress`, `mismatch`, `claim_failed`), recorded as
    // the call's events go out; the arguments are never recorded.
    let span = tracing::info_span!(
        target: "distlock",
        "distlock.idempotent",
        otel.name = "distlock.idempotent",
        otel.kind = "internal",
        distlock.function = call.target.function.namespace,
        distlock.key = tracing::field::Empty,
        distlock.outcome = tracing::field::Empty,
    );
    run_idempotent_in(call, same, body).instrument(span).await
}

async fn run_idempotent_in<R, F>(call: IdemCall, same: Same<R::Value>, body: F) -> R
where
    R: IdemOutput,
    F: Future<Output = R>,
{
    let IdemCall {
        client,
        target,
        fp,
        spec,
    } = call;
    let locks = match client {
        Ok(locks) => locks,
        Err(e) => return R::from_idem_error(e),
    };
    let key = record_key(
        locks.prefix(),
        target.function.namespace,
        target.scope.as_deref().map(capped).as_deref(),
        &capped(&target.key),
    );
    tracing::Span::current().record("distlock.key", key.as_str());
    if let Some(reason) = fp.failure() {
        tracing::warn!(target: "distlock", key, reason, "idempotent call refused: its payload cannot be fingerprinted");
        return R::from_idem_error(Error::Unrepresentable { key, reason });
    }
    let digest = fp.digest();
    let claim = match begin(&locks, target.function, key.clone(), &fp, &digest, &spec).await {
        Ok(Begin::Run(claim)) => claim,
        Ok(Begin::Replay(raw)) => {
            return match record::stored_value(&key, &raw).and_then(|v| {
                R::from_stored(v).map_err(|e| {
                    Error::backend(
                        &key,
                        crate::error::BackendError::new(
                            BackendErrorKind::Response,
                            format!("the stored result does not decode as the return type: {e}"),
                        ),
                    )
                })
            }) {
                Ok(out) => out,
                Err(e) => R::from_idem_error(e),
            };
        }
        Err(e) => return R::from_idem_error(e),
    };
    let out = match claim.keep(body, spec.cancel_on_lost).await {
        Ok(out) => out,
        Err(lost) => {
            // Still ours if no renewal got through: given up, so a retry runs now (the
            // release checks the owner: a claim taken over is left alone).
            claim.release().await;
            return R::from_idem_error(lost);
        }
    };
    let stored = out.to_stored(same).map(|value| {
        let value = value?;
        // As a handler's response body: a value past `max_body` is not stored.
        let len = value.to_string().len();
        if len > spec.max_body {
            return Err(format!(
                "its JSON is {len} bytes, more than `max_body` ({} bytes)",
                spec.max_body
            ));
        }
        Ok(value)
    });
    match stored {
        Some(Ok(value)) => {
            let record = record::completed_value(&digest, &value);
            if let Err(lost) = claim.complete(record, spec.retention()).await {
                return R::from_idem_error(lost);
            }
        }
        // It ran: the key is done whatever happens to the value. Releasing the claim
        // would let every repeat run the body again.
        Some(Err(reason)) => {
            tracing::warn!(target: "distlock", key = claim.key(), reason, "the result cannot be stored; the record says so, and repeats get `Unrepresentable`");
            let record = record::completed_unstorable(&digest, &reason);
            if let Err(lost) = claim.complete(record, spec.retention()).await {
                return R::from_idem_error(lost);
            }
        }
        None => claim.release().await,
    }
    out
}

/// A rendered key or scope as it goes into the record's key: as it is up to
/// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes (a header key's limit), else
/// `sha256:<hex>` of it, so an argument of any size makes a key of bounded size (two
/// different long keys stay two records).
fn capped(part: &str) -> std::borrow::Cow<'_, str> {
    use sha2::{Digest, Sha256};
    use std::fmt::Write as _;
    if part.len() <= crate::MAX_KEY_LEN {
        return std::borrow::Cow::Borrowed(part);
    }
    let mut hashed = String::with_capacity(7 + 64);
    hashed.push_str("sha256:");
    for byte in Sha256::digest(part.as_bytes()) {
        let _ = write!(hashed, "{byte:02x}");
    }
    std::borrow::Cow::Owned(hashed)
}

/// An idempotent fn's body, offered to the detach traits by generated code:
/// `(&&DetachFn::new(body)).__distlock_run(client, target, fp, spec)` runs it with
/// [`run_idempotent`] in a task of its own when the body and its result are `Send`
/// ([`DetachFnSend`], found first), else in the caller's future ([`DetachFnInline`]).
/// The body must not borrow (the macro passes only bodies of fns that take owned
/// parameters).
#[doc(hidden)]
pub struct DetachFn<F>(Cell<Option<F>>);

impl<F> DetachFn<F> {
    /// Wraps the body.
    pub fn new(body: F) -> Self {
        DetachFn(Cell::new(Some(body)))
    }

    fn take(&self) -> F {
        self.0
            .take()
            .unwrap_or_else(|| unreachable!("an idempotent body runs once"))
    }
}

/// Runs a `Send` body in a task of its own: the caller going away (a timeout around the
/// call) does not stop it, and its result is stored for the retry. Not inside a held
/// `#[distributed_lock]`: the body stays in the caller's task, under the lock.
#[doc(hidden)]
pub trait DetachFnSend {
    /// The fn's return type.
    type Output;
    /// The call.
    fn __distlock_run<S>(
        &self,
        call: IdemCall,
        same: S,
    ) -> Pin<Box<dyn Future<Output = Self::Output> + Send>>
    where
        Self::Output: IdemOutput,
        S: IntoSame<Self::Output>;
}

impl<F> DetachFnSend for &DetachFn<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn __distlock_run<S>(
        &self,
        call: IdemCall,
        same: S,
    ) -> Pin<Box<dyn Future<Output = Self::Output> + Send>>
    where
        Self::Output: IdemOutput,
        S: IntoSame<Self::Output>,
    {
        // Boxed at once: only the box moves into the task and its wrappers.
        let run = Box::pin(run_idempotent_with(call, same.into_same(), self.take()));
        if crate::lock::holds_lock() {
            return run;
        }
        Box::pin(async move {
            match super::detached(run).await {
                Some(out) => out,
                None => F::Output::from_idem_error(super::runtime_gone()),
            }
        })
    }
}

/// Runs any other body in the caller's future; dropped mid-body, its claim stays in
/// progress until its lease ends.
#[doc(hidden)]
pub trait DetachFnInline {
    /// The fn's return type.
    type Output;
    /// The call.
    fn __distlock_run<S>(
        &self,
        call: IdemCall,
        same: S,
    ) -> Pin<Box<dyn Future<Output = Self::Output>>>
    where
        Self::Output: IdemOutput,
        S: IntoSame<Self::Output>;
}

impl<F: Future + 'static> DetachFnInline for DetachFn<F> {
    type Output = F::Output;

    fn __distlock_run<S>(
        &self,
        call: IdemCall,
        same: S,
    ) -> Pin<Box<dyn Future<Output = Self::Output>>>
    where
        Self::Output: IdemOutput,
        S: IntoSame<Self::Output>,
    {
        Box::pin(run_idempotent_with(call, same.into_same(), self.take()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a repeat would get: the stored value read back, or why none was stored.
    fn replayed<T: IdemValue>(value: T) -> Result<T, String> {
        let out: Result<T, Error> = Ok(value);
        let stored = out.to_stored(None).expect("an `Ok` is stored")?;
        let back = <Result<T, Error>>::from_stored(stored).map_err(|e| e.to_string())?;
        Ok(back.unwrap_or_else(|e| panic!("{e}")))
    }

    /// `Some(None)` is written `null`, as `None` is: it would replay as `None`, so it is
    /// stored unstorable. Control: values that read back as themselves are replayed,
    /// `None` and `Some(Some(_))` of the same type among them.
    #[test]
    fn nested_none_is_not_replayed_as_none() {
        let reason = replayed(Some(None::<u32>)).expect_err("`Some(None)` is unstorable");
        assert!(reason.contains("another value"), "{reason}");
        assert_eq!(
            replayed(vec![Some(Some(1u8)), Some(None)]).map_err(|_| ()),
            Err(())
        );
        // The control.
        assert_eq!(replayed(None::<Option<u32>>), Ok(None));
        assert_eq!(replayed(Some(Some(3u32))), Ok(Some(Some(3))));
        assert_eq!(replayed(Some(7u32)), Ok(Some(7)));
        assert_eq!(replayed(()), Ok(()));
        assert_eq!(
            replayed(std::collections::HashMap::from([
                ("a".to_owned(), 1u8),
                ("b".to_owned(), 2)
            ])),
            Ok(std::collections::HashMap::from([
                ("a".to_owned(), 1u8),
                ("b".to_owned(), 2)
            ]))
        );
        assert_eq!(
            replayed(serde_json::json!({"b": [1, null], "a": 2.5})),
            Ok(serde_json::json!({"a": 2.5, "b": [1, null]}))
        );
    }

    /// `Units(5)` of an untagged enum is written `5`, which reads back as `Cents(5)`:
    /// the same serde calls, so only the type's `PartialEq` (found by the probe the
    /// macro uses) tells them apart. Control: `Cents(5)` reads back as itself.
    #[test]
    fn an_untagged_variant_that_reads_back_as_another_is_told_by_its_eq() {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(untagged)]
        enum Amount {
            Cents(u64),
            Units(u64),
        }
        use super::{SameByEq as _, SameBySerde as _};
        let same = (&&SameProbe::<Result<Amount, Error>>::new()).__distlock_same();
        assert!(same.is_some(), "the probe finds `PartialEq`");
        let stored = |v: Amount| Ok::<_, Error>(v).to_stored(same).expect("an `Ok`");
        let reason = stored(Amount::Units(5)).expect_err("`Units(5)` is another value");
        assert!(reason.contains("another value"), "{reason}");
        assert_eq!(stored(Amount::Cents(5)), Ok(serde_json::json!(5)));
        // Without `PartialEq` (the serde calls alone) the loss is not seen.
        assert_eq!(
            Ok::<_, Error>(Amount::Units(5)).to_stored(None),
            Some(Ok(serde_json::json!(5)))
        );
        // A type without `PartialEq` gets the serde calls.
        #[derive(serde::Serialize, serde::Deserialize)]
        struct NoEq;
        // The generated code's form, `&&` and all (without `PartialEq` it finds the
        // fallback).
        #[allow(clippy::needless_borrow)]
        let none: Same<NoEq> = IntoSame::<Result<NoEq, Error>>::into_same(
            (&&SameProbe::<Result<NoEq, Error>>::new()).__distlock_same(),
        );
        assert!(none.is_none());
    }

    use proptest::prelude::*;

    proptest! {
        // No regression files written beside the crate: a failure prints its input.
        #![proptest_config(ProptestConfig {
            failure_persistence: None,
            ..ProptestConfig::with_cases(256)
        })]

        /// A value is stored exactly when it reads back as itself, and then it is
        /// replayed as itself: here, when it holds no `Some(None)`.
        #[test]
        fn stored_values_replay_as_themselves(
            list in proptest::collection::vec(proptest::option::of(proptest::option::of(any::<i8>())), 0..6),
            map in proptest::collection::hash_map("[a-z]{0,3}", proptest::option::of(any::<u16>()), 0..6),
        ) {
            let faithful = !list.iter().any(|x| matches!(x, Some(None)));
            let value = (list, map);
            match replayed(value.clone()) {
                Ok(back) => {
                    prop_assert!(faithful);
                    prop_assert_eq!(back, value);
                }
                Err(reason) => prop_assert!(!faithful, "{}", reason),
            }
        }
    }
}
