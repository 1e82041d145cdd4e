//! Handlers: the key from a request header, the response captured, stored and replayed.
//!
//! Framework-neutral; the integrations (a layer above) connect it to axum and actix-web.
//! This file holds the handler run (claim, body, capture, store); the request model is in
//! `request`, the responses distlock writes itself in `response`, and what generated code
//! calls (the detach and capture traits) in `__private`.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tracing::Instrument as _;

use super::record::{self, Captured, REPLAYED_HEADER};
use super::{Begin, Claim, Fingerprint, IdemFn, IdemSpec, begin, record_key};
use crate::client::Locks;
use crate::error::{BackendErrorKind, Error};
use crate::key;

mod __private;
mod request;
mod response;

pub use __private::*;
pub use request::*;
pub use response::*;

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

/// One idempotent handler call: header checked, key claimed (or replayed), the body run
/// with the lease renewed, then the response stored or the claim released.
#[doc(hidden)]
pub struct HandlerRun {
    claim: Option<Claim>,
    digest: String,
    spec: IdemSpec,
    mode: DetachMode,
    /// The call's `distlock.idempotent` span (none without a record): entered while
    /// claiming and storing, and open until the call ends.
    span: tracing::Span,
}

impl HandlerRun {
    /// A call that runs the handler with no record.
    fn without_record(req: &IdemRequest, spec: IdemSpec) -> HandlerRun {
        HandlerRun {
            claim: None,
            digest: String::new(),
            spec,
            mode: DetachMode::of(req),
            span: tracing::Span::none(),
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
        // The call's span, as a fn's (see `run_idempotent`): the outcome is recorded as
        // the claim's events go out.
        let span = tracing::info_span!(
            target: "distlock",
            "distlock.idempotent",
            otel.name = "distlock.idempotent",
            otel.kind = "internal",
            distlock.function = function.namespace,
            distlock.key = record.as_str(),
            distlock.outcome = tracing::field::Empty,
        );
        let claiming = begin(&locks, function, record.clone(), &fp, &digest, &spec);
        match claiming.instrument(span.clone()).await? {
            Begin::Run(claim) => Ok(HandlerRun {
                claim: Some(claim),
                digest,
                spec,
                mode: DetachMode::of(req),
                span,
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
        let span = self.span.clone();
        self.finish_in(cap).instrument(span).await
    }

    async fn finish_in(self, cap: Capture) -> IdemResponse {
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
