//! The responses distlock answers itself: replays, `409`, `422`, `400` and `503` as
//! problem details (RFC 9457), with `Retry-After` where a retry may succeed.

use super::*;

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
        Error::InProgress { .. } | Error::StaleFence { .. } => 409,
        Error::PayloadMismatch { .. } => 422,
        Error::Busy { .. } | Error::Backend { .. } | Error::NotReplicated { .. } => 503,
        Error::Lost { .. }
        | Error::Unrepresentable { .. }
        | Error::Unsupported { .. }
        | Error::WrongKind { .. } => 500,
    }
}

pub(super) fn retry_after(e: &Error) -> Option<Duration> {
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
        Error::WrongKind { .. } => (
            "wrong-kind",
            "Internal error",
            "This operation's lock is named like another kind of lock that holds it.".to_owned(),
        ),
        Error::Unsupported { .. } => (
            "unsupported",
            "Internal error",
            "This operation's lock is configured in a way that cannot be served.".to_owned(),
        ),
        Error::StaleFence { .. } => (
            "stale-fence",
            "Conflict",
            "A later holder of the lock protecting this operation has written already; \
             this request's write was refused."
                .to_owned(),
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
pub(super) fn secs(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000).max(1) as u64
}
