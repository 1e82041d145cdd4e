//! Handlers: the key from a request header, the response captured, stored and replayed.
//!
//! Framework-neutral; the integrations (a layer above) connect it to axum and actix-web.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::record::{self, Captured, REPLAYED_HEADER};
use super::{Begin, Claim, Fingerprint, IdemFn, IdemSpec, begin, record_key};
use crate::client::Locks;
use crate::error::{BackendErrorKind, Error};
use crate::key;

/// A handler's response as its capture left it: buffered whole (it may be stored), or
/// passed through as it streams (never stored).
#[doc(hidden)]
pub struct Capture(pub(crate) Kept);

pub(crate) enum Kept {
    Buffered(Captured),
    #[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
    Streaming(Passthrough),
}

impl From<Captured> for Capture {
    fn from(cap: Captured) -> Self {
        Capture(Kept::Buffered(cap))
    }
}

/// A response that streams through to the client as it is: one of unknown length (a
/// stream, server-sent events), or longer than `max_body`.
pub(crate) enum Passthrough {
    #[cfg(feature = "axum")]
    Axum(axum::response::Response),
    /// Held on this thread by its framework, which alone knows its type (actix-web:
    /// `HttpResponse` is not `Send`).
    #[cfg(feature = "actix")]
    OnThread(Box<dyn std::any::Any + Send>),
}

/// Longest idempotency key accepted, in bytes (the limit Stripe and the IETF draft use).
pub const MAX_KEY_LEN: usize = 255;

/// What an idempotent handler sees of its request: the headers, method, matched route
/// and query. The attribute adds it as a hidden first parameter; it is an extractor for
/// axum (`FromRequestParts`, feature `axum`) and actix-web (`FromRequest`, feature
/// `actix`), and never fails to extract.
pub struct IdemRequest {
    /// Lower-case names and raw values.
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    pub(crate) method: String,
    pub(crate) route: String,
    /// The request path as sent.
    pub(crate) path: String,
    pub(crate) query: String,
    pub(crate) origin: Origin,
    /// Whether tasks that are not `Send` can be spawned here (an actix-web worker runs a
    /// `LocalSet`, or a local runtime).
    pub(crate) spawn_local: bool,
    /// The body's fingerprint label, when this extractor read it (actix-web); axum's is
    /// read by [`BodyFp`].
    pub(crate) body: Option<String>,
    /// What the framework keeps for this request until it is dropped (actix-web: the
    /// `HttpRequest`, on its worker thread).
    pub(crate) _kept: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// The last parameter of an idempotent handler, as the attribute rewrites it: the
/// extractor the handler wrote (`.0`), and what the fingerprint needs of the request
/// body (`.1`). With axum it reads the body (within axum's `DefaultBodyLimit`), records
/// it and hands it on to the extractor; with actix-web the hidden request extractor
/// records the body as the handler's extractors read it, and this one reads whatever
/// they left.
#[doc(hidden)]
pub struct BodyFp<T>(pub T, pub BodySeen);

impl<T: std::fmt::Debug> std::fmt::Debug for BodyFp<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The request body's fingerprint label, when [`BodyFp`] read it.
#[doc(hidden)]
#[derive(Debug)]
pub struct BodySeen(pub(crate) Option<String>);

impl BodySeen {
    /// Nothing seen here: the request extractor's reading counts (actix-web), else none.
    pub fn unread() -> Self {
        BodySeen(None)
    }
}

/// Where a handler's work may run: in a task of its own on any worker thread (axum), or
/// on this thread (actix-web keeps the request on its worker thread), spawned when it
/// has a `LocalSet`, else in the caller's future.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct DetachMode {
    on_this_thread: bool,
    spawn_local: bool,
}

impl DetachMode {
    /// The mode for a request.
    pub fn of(req: &IdemRequest) -> DetachMode {
        DetachMode {
            on_this_thread: matches!(req.origin, Origin::Actix(_)),
            spawn_local: req.spawn_local,
        }
    }

    /// Runs `fut` where this mode says, so that it goes on when the caller is dropped.
    fn run<F>(self, fut: F) -> Pin<Box<dyn Future<Output = IdemResponse> + Send>>
    where
        F: Future<Output = IdemResponse> + Send + 'static,
    {
        if self.on_this_thread {
            Box::pin(detached_local_response(fut, self.spawn_local))
        } else {
            Box::pin(detached_response(fut))
        }
    }

    /// [`run`](Self::run) for a future that is not `Send`: only on this thread.
    fn run_local<F>(self, fut: F) -> Pin<Box<dyn Future<Output = IdemResponse>>>
    where
        F: Future<Output = IdemResponse> + 'static,
    {
        Box::pin(detached_local_response(
            fut,
            self.on_this_thread && self.spawn_local,
        ))
    }
}

/// The methods whose calls are recorded: the unsafe ones. `GET`, `HEAD`, `OPTIONS` and
/// the rest run the handler without a record (they must not change anything, and a
/// stored `GET` response would hide later changes; `HEAD` is never stored as a `GET`).
pub const RECORDED_METHODS: [&str; 4] = ["POST", "PUT", "PATCH", "DELETE"];

/// Which framework extracted the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Built by hand (tests of the runtime).
    Manual,
    /// axum.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    Axum,
    /// actix-web; the request itself is kept on this worker thread under this id
    /// (`HttpRequest` is not `Send`, and axum handlers need `Send` futures).
    #[cfg_attr(not(feature = "actix"), allow(dead_code))]
    Actix(u64),
}

impl IdemRequest {
    /// A request built by hand: `headers` as (name, value) pairs; its path is its
    /// `route`, and it has no body.
    pub fn new(
        method: &str,
        route: &str,
        query: &str,
        headers: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> IdemRequest {
        IdemRequest {
            headers: headers
                .into_iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), v))
                .collect(),
            method: method.to_owned(),
            route: route.to_owned(),
            path: route.to_owned(),
            query: query.to_owned(),
            origin: Origin::Manual,
            spawn_local: false,
            body: None,
            _kept: None,
        }
    }

    /// The fingerprint label of the body: `seen` when [`BodyFp`] read it, else what the
    /// request extractor read (actix-web), else none.
    fn body_label(&self, seen: BodySeen) -> String {
        seen.0.or_else(|| self.body.clone()).unwrap_or_default()
    }

    /// The request method.
    pub fn method(&self) -> &str {
        &self.method
    }

    /// The route template the framework matched (`/orders/{id}`), empty when unknown.
    pub fn route(&self) -> &str {
        &self.route
    }

    /// Every value of header `name` (case-insensitive).
    pub fn header_values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

impl std::fmt::Debug for IdemRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdemRequest")
            .field("method", &self.method)
            .field("route", &self.route)
            .field("path", &self.path)
            .field("query", &self.query)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// The key from the configured header, checked and escaped; `None` when absent and not
/// required. Nothing here touches Redis.
pub(crate) fn header_key(req: &IdemRequest, spec: &IdemSpec) -> Result<Option<String>, Error> {
    let header = spec.header;
    let values: Vec<&[u8]> = req.header_values(header).collect();
    let raw = match values.as_slice() {
        [] if spec.required => {
            return Err(Error::MissingKey {
                header: header.to_owned(),
            });
        }
        [] => return Ok(None),
        [one] => *one,
        many => {
            return Err(Error::InvalidKey {
                key: shown(many[0]),
                reason: format!(
                    "the request has {} `{header}` headers; send exactly one",
                    many.len()
                ),
            });
        }
    };
    let invalid = |reason: String| Error::InvalidKey {
        key: shown(raw),
        reason,
    };
    if raw.is_empty() {
        return Err(invalid(format!("the `{header}` header is empty")));
    }
    if raw.len() > MAX_KEY_LEN {
        return Err(invalid(format!(
            "the `{header}` header is {} bytes long; at most {MAX_KEY_LEN} are allowed",
            raw.len()
        )));
    }
    if let Some((at, &b)) = raw
        .iter()
        .enumerate()
        .find(|(_, b)| !(0x21..=0x7e).contains(*b))
    {
        let what = match b {
            b'\r' => "a carriage return (CR)".to_owned(),
            b'\n' => "a line feed (LF)".to_owned(),
            b' ' => "a space".to_owned(),
            b'\t' => "a tab".to_owned(),
            0x80.. => format!("a non-ASCII byte (0x{b:02X})"),
            _ => format!("a control character (0x{b:02X})"),
        };
        return Err(invalid(format!(
            "the `{header}` header contains {what} at byte {at}; only visible ASCII characters (`!` to `~`) are allowed"
        )));
    }
    let text = std::str::from_utf8(raw).unwrap_or_default();
    let mut escaped = String::with_capacity(text.len());
    key::escape_into(&mut escaped, text);
    Ok(Some(escaped))
}

/// A header value as it may be shown in an error: escaped, at most 64 characters.
fn shown(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::new();
    key::escape_into(&mut out, &text);
    if out.chars().count() > 64 {
        out = out.chars().take(64).collect::<String>() + "...";
    }
    out
}

/// What an idempotent handler returns; renders as an axum response (`IntoResponse`) or
/// an actix-web one (`Responder`).
pub struct IdemResponse(pub(crate) Outcome);

pub(crate) enum Outcome {
    /// This call ran the body: its response as it was (with `Set-Cookie` and the rest).
    Fresh(Captured),
    /// This call ran the body, whose response streams through as it comes (not stored).
    Streaming(Passthrough),
    /// A repeat answered from the record.
    Replayed(Captured),
    /// Rejected before the body ran.
    Failed(Error),
}

impl IdemResponse {
    /// The response to send, framework-neutral. A response that streamed through (of
    /// unknown length, or longer than `max_body`) exists only as its framework's
    /// response, which axum's `IntoResponse` and actix-web's `Responder` send; here it
    /// is a 500.
    pub fn into_captured(self) -> Captured {
        match self.0 {
            Outcome::Fresh(cap) => cap,
            Outcome::Streaming(_) => internal_error(
                "a streamed response can only be sent by its framework (`IntoResponse` or `Responder`)",
            ),
            Outcome::Replayed(mut cap) => {
                cap.headers
                    .push((REPLAYED_HEADER.to_ascii_lowercase(), b"true".to_vec()));
                cap
            }
            Outcome::Failed(e) => problem(&e),
        }
    }

    /// The error this response reports, if the call was rejected.
    pub fn error(&self) -> Option<&Error> {
        match &self.0 {
            Outcome::Failed(e) => Some(e),
            _ => None,
        }
    }
}

impl From<Error> for IdemResponse {
    fn from(e: Error) -> Self {
        IdemResponse(Outcome::Failed(e))
    }
}

impl std::fmt::Debug for IdemResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Outcome::Fresh(c) => f.debug_tuple("Fresh").field(&c.status).finish(),
            Outcome::Streaming(_) => f.write_str("Streaming"),
            Outcome::Replayed(c) => f.debug_tuple("Replayed").field(&c.status).finish(),
            Outcome::Failed(e) => f.debug_tuple("Failed").field(e).finish(),
        }
    }
}

/// The HTTP status an error maps to.
pub(crate) fn status_of(e: &Error) -> u16 {
    match e {
        Error::MissingKey { .. } | Error::InvalidKey { .. } => 400,
        Error::InProgress { .. } => 409,
        Error::PayloadMismatch { .. } => 422,
        Error::Busy { .. } | Error::Backend { .. } | Error::NotReplicated { .. } => 503,
        Error::Lost { .. } | Error::Unrepresentable { .. } => 500,
    }
}

fn retry_after(e: &Error) -> Option<Duration> {
    match e {
        Error::InProgress { retry_after, .. } => Some(*retry_after),
        Error::Busy { .. } | Error::NotReplicated { .. } => Some(Duration::from_secs(1)),
        // Redis down, slow, loading or failing over: worth a retry; a misconfiguration
        // is not.
        Error::Backend { source, .. } if source.kind() != BackendErrorKind::Config => {
            Some(Duration::from_secs(1))
        }
        _ => None,
    }
}

/// An RFC 9457 `application/problem+json` response for `e`. The detail never contains
/// the Redis key (it would show the prefix and module paths to clients).
pub(crate) fn problem(e: &Error) -> Captured {
    let status = status_of(e);
    let (kind, title, detail) = match e {
        Error::MissingKey { header } => (
            "missing-idempotency-key",
            "Idempotency key missing",
            format!("This endpoint requires an `{header}` header."),
        ),
        Error::InvalidKey { reason, .. } => {
            ("invalid-key", "Invalid idempotency key", reason.clone())
        }
        Error::InProgress { retry_after, .. } => (
            "idempotency-key-in-use",
            "Request in progress",
            format!(
                "A request with the same idempotency key is still being processed; retry in {} s.",
                secs(*retry_after)
            ),
        ),
        Error::PayloadMismatch { .. } => (
            "idempotency-key-reused",
            "Idempotency key reused",
            "This idempotency key was already used with a different request payload.".to_owned(),
        ),
        Error::Busy { .. } => (
            "busy",
            "Resource busy",
            "The resource is locked by another request; retry later.".to_owned(),
        ),
        Error::NotReplicated { .. } => (
            "not-replicated",
            "Service unavailable",
            "The lock and idempotency store could not copy this request's record to its \
             replicas in time; retry later."
                .to_owned(),
        ),
        Error::Backend { .. } => (
            "store-unavailable",
            "Service unavailable",
            "The lock and idempotency store is unavailable.".to_owned(),
        ),
        Error::Unrepresentable { .. } => (
            "unrepresentable",
            "Internal error",
            "This request's payload or result cannot be recorded for idempotency.".to_owned(),
        ),
        Error::Lost { .. } => (
            "lock-lost",
            "Lock lost",
            "The lock or idempotency claim protecting this operation was lost while it ran \
             (its lease ended and another request may have taken it over)."
                .to_owned(),
        ),
    };
    let body = serde_json::json!({
        "type": format!("urn:distlock:problem:{kind}"),
        "title": title,
        "status": status,
        "detail": detail,
    });
    let mut headers = vec![(
        "content-type".to_owned(),
        b"application/problem+json".to_vec(),
    )];
    if let Some(after) = retry_after(e) {
        headers.push((
            "retry-after".to_owned(),
            secs(after).to_string().into_bytes(),
        ));
    }
    Captured {
        status,
        headers,
        body: body.to_string().into_bytes(),
    }
}

/// Whole seconds, rounded up, at least 1 (for `Retry-After`).
fn secs(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000).max(1) as u64
}

/// One idempotent handler call: header checked, key claimed (or replayed), the body run
/// with the lease renewed, then the response stored or the claim released.
#[doc(hidden)]
pub struct HandlerRun {
    claim: Option<Claim>,
    digest: String,
    spec: IdemSpec,
    mode: DetachMode,
}

impl HandlerRun {
    /// A call that runs the handler with no record.
    fn without_record(req: &IdemRequest, spec: IdemSpec) -> HandlerRun {
        HandlerRun {
            claim: None,
            digest: String::new(),
            spec,
            mode: DetachMode::of(req),
        }
    }

    /// Checks the header, then claims. `Err` is the response to send at once: a replay,
    /// or a rejection (`MissingKey`, `InvalidKey`, `InProgress`, `PayloadMismatch`,
    /// `Backend`).
    pub async fn begin(
        req: &IdemRequest,
        body: BodySeen,
        client: Result<Locks, Error>,
        function: IdemFn,
        scope: Option<String>,
        mut fp: Fingerprint,
        spec: IdemSpec,
    ) -> Result<HandlerRun, IdemResponse> {
        if !RECORDED_METHODS.contains(&req.method.as_str()) {
            tracing::debug!(target: "distlock", method = req.method, function = function.namespace, "not a recorded method: running without idempotency");
            return Ok(HandlerRun::without_record(req, spec));
        }
        let key = match header_key(req, &spec) {
            Ok(Some(key)) => key,
            Ok(None) => {
                tracing::debug!(target: "distlock", header = spec.header, function = function.namespace, "no idempotency key: running without idempotency (`required = false`)");
                return Ok(HandlerRun::without_record(req, spec));
            }
            Err(e) => {
                tracing::debug!(target: "distlock", error = %e, function = function.namespace, "idempotency key rejected");
                return Err(e.into());
            }
        };
        let locks = client?;
        fp.http(
            &req.method,
            &req.route,
            &req.path,
            &req.query,
            req.body_label(body),
        );
        let record = record_key(locks.prefix(), function.namespace, scope.as_deref(), &key);
        let digest = fp.digest();
        match begin(&locks, function, record.clone(), &fp, &digest, &spec).await? {
            Begin::Run(claim) => Ok(HandlerRun {
                claim: Some(claim),
                digest,
                spec,
                mode: DetachMode::of(req),
            }),
            Begin::Replay(raw) => Err(match record::stored_response(&record, &raw) {
                Ok(cap) => IdemResponse(Outcome::Replayed(cap)),
                Err(e) => e.into(),
            }),
        }
    }

    /// Runs the handler's body, renewing the claim's lease meanwhile. `Err` is the
    /// response to send when the claim was found lost (see `on_lost`): nothing is stored.
    pub async fn keep<F: Future>(&mut self, body: F) -> Result<F::Output, IdemResponse> {
        let Some(claim) = &self.claim else {
            return Ok(body.await);
        };
        match claim.keep(body, self.spec.cancel_on_lost).await {
            Ok(out) => Ok(out),
            Err(lost) => {
                if let Some(claim) = self.claim.take() {
                    // Still ours if no renewal got through: given up, so a retry runs now.
                    claim.release_boxed().await;
                }
                Err(lost.into())
            }
        }
    }

    /// Stores the response when it may be replayed, else releases the claim; returns it.
    ///
    /// Stored: status below 500 except 408, 409, 425 and 429, with a body of at most
    /// `max_body` bytes. Released (so a retry runs the body): every other response.
    async fn finish(self, cap: Capture) -> IdemResponse {
        let cap = match cap.0 {
            Kept::Buffered(cap) => cap,
            Kept::Streaming(through) => {
                if let Some(claim) = self.claim {
                    tracing::debug!(target: "distlock", key = claim.key(), "response streamed through (unknown length, or over `max_body`): not stored; the claim is released");
                    claim.release_boxed().await;
                }
                return IdemResponse(Outcome::Streaming(through));
            }
        };
        let Some(claim) = self.claim else {
            return IdemResponse(Outcome::Fresh(cap));
        };
        let storable = cap.status < 500 && ![408, 409, 425, 429].contains(&cap.status);
        if !storable {
            tracing::debug!(target: "distlock", key = claim.key(), status = cap.status, "response not stored (retryable status); the claim is released");
            claim.release_boxed().await;
        } else if cap.body.len() > self.spec.max_body {
            tracing::warn!(
                target: "distlock",
                key = claim.key(),
                bytes = cap.body.len(),
                max_body = self.spec.max_body,
                "response body over `max_body`: returned but not stored; the claim is released"
            );
            claim.release_boxed().await;
        } else {
            let record = record::completed_response(&self.digest, &cap);
            let retention = Duration::from_millis(self.spec.ttl_ms.max(1));
            if let Err(lost) = claim.complete(record, retention).await {
                return lost.into();
            }
        }
        IdemResponse(Outcome::Fresh(cap))
    }

    /// [`keep`](Self::keep) then [`finish`](Self::finish): `work` is the body followed
    /// by the capture of its response.
    pub async fn run<F: Future<Output = Capture>>(mut self, work: F) -> IdemResponse {
        match self.keep(work).await {
            Ok(cap) => self.finish(cap).await,
            Err(done) => done,
        }
    }

    /// Captures the response and stores it (or releases the claim) in a task of its own
    /// where it can be: the body has run, so a caller that goes away now must not leave
    /// the key in progress, nor make a retry run the body again.
    pub fn finish_with<C: CaptureFuture>(self, capture: C) -> C::Finish {
        capture.finish(self)
    }
}

/// A response being captured, handed to [`HandlerRun::finish_with`].
#[doc(hidden)]
pub trait CaptureFuture {
    /// The capture, then the store or release.
    type Finish: Future<Output = IdemResponse>;
    /// Runs the capture, then [`HandlerRun::finish`], detached from the caller.
    fn finish(self, run: HandlerRun) -> Self::Finish;
}

impl CaptureFuture for SendCapture {
    type Finish = Pin<Box<dyn Future<Output = IdemResponse> + Send>>;

    fn finish(self, run: HandlerRun) -> Self::Finish {
        run.mode.run(async move { run.finish(self.await).await })
    }
}

impl CaptureFuture for std::future::Ready<Capture> {
    type Finish = Pin<Box<dyn Future<Output = IdemResponse> + Send>>;

    fn finish(self, run: HandlerRun) -> Self::Finish {
        let capture: SendCapture = Box::pin(self);
        capture.finish(run)
    }
}

impl CaptureFuture for LocalCapture {
    type Finish = Pin<Box<dyn Future<Output = IdemResponse>>>;

    fn finish(self, run: HandlerRun) -> Self::Finish {
        run.mode
            .run_local(async move { run.finish(self.await).await })
    }
}

/// `fut` in a task of its own, spawned at once: it runs to its end even when the
/// caller's future is dropped. A panic in it is resumed in the caller.
fn detached_response<F>(fut: F) -> impl Future<Output = IdemResponse> + Send
where
    F: Future<Output = IdemResponse> + Send + 'static,
{
    let task = super::detached(fut);
    async move { answered(task.await) }
}

/// A detached call's response, or the error that says its runtime shut down first.
fn answered(out: Option<IdemResponse>) -> IdemResponse {
    out.unwrap_or_else(|| super::runtime_gone().into())
}

/// [`detached_response`] on this thread: spawned on its `LocalSet` when `local` says
/// there is one (actix-web workers run every handler on one), else in the caller's
/// future.
fn detached_local_response<F>(fut: F, local: bool) -> impl Future<Output = IdemResponse>
where
    F: Future<Output = IdemResponse> + 'static,
{
    let spawned = if local {
        Ok(super::detached_local(fut))
    } else {
        Err(Box::pin(fut))
    };
    async move {
        match spawned {
            Ok(task) => answered(task.await),
            Err(here) => here.await,
        }
    }
}

/// A handler's call once claimed (body, capture, store), offered to the detach traits by
/// generated code: `(&&Detach::new(mode, call)).__distlock_run()` runs it in a task of
/// its own when it is `Send` ([`DetachSend`], found first), else on the actix-web
/// worker's `LocalSet` ([`DetachLocal`]); see [`DetachMode`].
///
/// The call is boxed at once: it is a large future (the body, the capture and the
/// store), and from here on only the box moves, into the task and its wrappers.
#[doc(hidden)]
pub struct Detach<F>(Cell<Option<(DetachMode, Pin<Box<F>>)>>);

impl<F> Detach<F> {
    /// Wraps the call.
    pub fn new(mode: DetachMode, call: F) -> Self {
        Detach(Cell::new(Some((mode, Box::pin(call)))))
    }

    fn take(&self) -> (DetachMode, Pin<Box<F>>) {
        self.0
            .take()
            .unwrap_or_else(|| unreachable!("a handler's call runs once"))
    }
}

/// Runs a `Send` handler call in a task of its own.
#[doc(hidden)]
pub trait DetachSend {
    /// The response.
    fn __distlock_run(&self) -> Pin<Box<dyn Future<Output = IdemResponse> + Send>>;
}

impl<F: Future<Output = IdemResponse> + Send + 'static> DetachSend for &Detach<F> {
    fn __distlock_run(&self) -> Pin<Box<dyn Future<Output = IdemResponse> + Send>> {
        let (mode, call) = self.take();
        mode.run(call)
    }
}

/// Runs any other handler call on the actix-web worker's `LocalSet`, or in the caller.
#[doc(hidden)]
pub trait DetachLocal {
    /// The response.
    fn __distlock_run(&self) -> Pin<Box<dyn Future<Output = IdemResponse>>>;
}

impl<F: Future<Output = IdemResponse> + 'static> DetachLocal for Detach<F> {
    fn __distlock_run(&self) -> Pin<Box<dyn Future<Output = IdemResponse>>> {
        let (mode, call) = self.take();
        mode.run_local(call)
    }
}

/// A handler's return value, offered to the capture traits by generated code:
/// `(&&&&Reply::new(out)).__distlock_capture(&req)` picks, by autoref specialization,
/// [`CaptureBoth`] (the type is an axum response and an actix responder: decided by
/// which framework extracted the request), else [`CaptureAxum`], else [`CaptureActix`],
/// else [`CaptureNone`], a compile error that says what is wrong.
#[doc(hidden)]
pub struct Reply<T>(Cell<Option<T>>);

impl<T> Reply<T> {
    /// Wraps the handler's return value.
    pub fn new(value: T) -> Self {
        Reply(Cell::new(Some(value)))
    }

    #[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
    pub(crate) fn take(&self) -> T {
        self.0
            .take()
            .unwrap_or_else(|| unreachable!("a reply is captured once"))
    }
}

/// A capture that may be awaited in a `Send` handler future.
#[doc(hidden)]
pub type SendCapture = Pin<Box<dyn Future<Output = Capture> + Send>>;
/// A capture for actix-web, whose bodies are not `Send`.
#[doc(hidden)]
pub type LocalCapture = Pin<Box<dyn Future<Output = Capture>>>;

/// Capture of a type that is both an axum response and an actix responder.
#[doc(hidden)]
pub trait CaptureBoth {
    /// Renders the response, and buffers it when it is at most `max_body` bytes long.
    fn __distlock_capture(&self, req: &IdemRequest, max_body: usize) -> SendCapture;
}

/// Capture of an axum response.
#[doc(hidden)]
pub trait CaptureAxum {
    /// Renders the response, and buffers it when it is at most `max_body` bytes long.
    fn __distlock_capture(&self, req: &IdemRequest, max_body: usize) -> SendCapture;
}

/// Capture of an actix-web responder.
#[doc(hidden)]
pub trait CaptureActix {
    /// Renders the response, and buffers it when it is at most `max_body` bytes long.
    fn __distlock_capture(&self, req: &IdemRequest, max_body: usize) -> LocalCapture;
}

/// The last resort of the capture: reached only for a type that is neither an axum
/// response nor an actix responder, where it is a compile error.
#[doc(hidden)]
pub trait CaptureNone {
    /// Never callable: `Self: HandlerReturn` holds for no type.
    fn __distlock_capture(&self, req: &IdemRequest, max_body: usize) -> std::future::Ready<Capture>
    where
        Self: HandlerReturn;
}

/// Implemented by no type: names what an idempotent handler must return.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent(header = ...)]` handlers must return a response: a type implementing `axum::response::IntoResponse` (with distlock's feature `axum`) or `actix_web::Responder` (with feature `actix`)",
    label = "not a response type of an enabled framework",
    note = "enable the feature of your framework: `distlock = {{ features = [\"axum\"] }}` or `[\"actix\"]`; for a plain async fn use `key = \"...\"` instead of `header`"
)]
pub trait HandlerReturn {}

impl<T> CaptureNone for Reply<T> {
    fn __distlock_capture(
        &self,
        _req: &IdemRequest,
        _max_body: usize,
    ) -> std::future::Ready<Capture>
    where
        Self: HandlerReturn,
    {
        unreachable!("`Reply<T>: HandlerReturn` holds for no `T`")
    }
}

/// A response the handler could not produce (its body failed to read).
#[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
pub(crate) fn internal_error(what: &str) -> Captured {
    tracing::error!(target: "distlock", "{what}");
    Captured {
        status: 500,
        headers: vec![("content-type".into(), b"text/plain; charset=utf-8".to_vec())],
        body: b"internal server error".to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(required: bool) -> IdemSpec {
        IdemSpec {
            ttl_ms: 1000,
            lease_ms: 1000,
            wait_ms: 0,
            max_body: 10,
            header: "Idempotency-Key",
            required,
            cancel_on_lost: true,
            replicas: None,
        }
    }

    fn req(values: &[&[u8]]) -> IdemRequest {
        IdemRequest::new(
            "POST",
            "/x",
            "",
            values
                .iter()
                .map(|v| ("Idempotency-Key".to_owned(), v.to_vec())),
        )
    }

    fn reason(values: &[&[u8]]) -> String {
        match header_key(&req(values), &spec(true)) {
            Err(Error::InvalidKey { reason, .. }) => reason,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn header_rules() {
        assert!(matches!(
            header_key(&req(&[]), &spec(true)),
            Err(Error::MissingKey { .. })
        ));
        assert_eq!(header_key(&req(&[]), &spec(false)).unwrap(), None);
        assert_eq!(
            header_key(&req(&[b"a:b{c}%"]), &spec(true)).unwrap(),
            Some("a%3Ab%7Bc%7D%25".into())
        );
        assert!(reason(&[b""]).contains("is empty"));
        assert!(reason(&[&[b'a'; 256]]).contains("256 bytes long; at most 255"));
        assert!(reason(&[b"a\r\nb"]).contains("carriage return (CR) at byte 1"));
        assert!(reason(&[b"a b"]).contains("a space at byte 1"));
        assert!(reason(&["é".as_bytes()]).contains("non-ASCII byte (0xC3) at byte 0"));
        assert!(reason(&[b"a\x7f"]).contains("control character (0x7F)"));
        assert!(reason(&[b"a", b"b"]).contains("2 `Idempotency-Key` headers"));
        assert!(header_key(&req(&[&[b'a'; 255]]), &spec(true)).is_ok());
    }

    #[test]
    fn problems() {
        let p = problem(&Error::InProgress {
            key: "lock:idem:x".into(),
            retry_after: Duration::from_millis(1500),
        });
        assert_eq!(p.status, 409);
        assert!(p.headers.contains(&("retry-after".into(), b"2".to_vec())));
        let body = String::from_utf8(p.body).unwrap();
        assert!(!body.contains("lock:idem"), "{body}");
        assert_eq!(
            problem(&Error::PayloadMismatch { key: "k".into() }).status,
            422
        );
        assert_eq!(
            problem(&Error::MissingKey {
                header: "Idempotency-Key".into()
            })
            .status,
            400
        );
        let busy = problem(&Error::Busy {
            key: "lock:a".into(),
            waited: Duration::ZERO,
        });
        assert_eq!(busy.status, 503);
        assert!(
            busy.headers
                .contains(&("retry-after".into(), b"1".to_vec()))
        );
        assert_eq!(problem(&Error::Lost { key: "k".into() }).status, 500);
        use crate::error::BackendError;
        let down = problem(&Error::backend(
            "k",
            BackendError::new(BackendErrorKind::Connection, "refused"),
        ));
        assert_eq!(down.status, 503);
        assert!(
            down.headers
                .contains(&("retry-after".into(), b"1".to_vec()))
        );
        let loading = problem(&Error::backend(
            "k",
            BackendError::new(BackendErrorKind::Response, "LOADING"),
        ));
        assert!(
            loading
                .headers
                .contains(&("retry-after".into(), b"1".to_vec()))
        );
        let misconfigured = problem(&Error::backend(
            "k",
            BackendError::new(BackendErrorKind::Config, "no runtime"),
        ));
        assert_eq!(misconfigured.status, 503);
        assert!(
            !misconfigured
                .headers
                .iter()
                .any(|(n, _)| n == "retry-after"),
            "a retry would fail the same"
        );
        let not_replicated = problem(&Error::NotReplicated {
            key: "k".into(),
            acked: 0,
            wanted: 1,
        });
        assert_eq!(not_replicated.status, 503);
        assert!(
            not_replicated
                .headers
                .iter()
                .any(|(n, v)| n == "retry-after" && v == b"1"),
            "{:?}",
            not_replicated.headers
        );
    }
}
