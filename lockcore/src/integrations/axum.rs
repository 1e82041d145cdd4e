//! axum 0.8: `IdemRequest` is an extractor, `IdemResponse` and `Error` are responses.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::Error;
use crate::idempotency::fingerprint::body_label;
use crate::idempotency::http::{
    BodyFp, BodySeen, Capture, CaptureAxum, IdemRequest, IdemResponse, Kept, Origin, Outcome,
    Passthrough, Reply, SendCapture, internal_error, problem,
};
use crate::idempotency::record::{Captured, replayed_headers};

impl<S: Send + Sync> FromRequestParts<S> for IdemRequest {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(IdemRequest {
            headers: parts
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect(),
            method: parts.method.as_str().to_owned(),
            route: parts
                .extensions
                .get::<MatchedPath>()
                .map(|m| m.as_str().to_owned())
                .unwrap_or_default(),
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().unwrap_or_default().to_owned(),
            origin: Origin::Axum,
            spawn_local: false,
            body: None,
            _kept: None,
        })
    }
}

/// How [`BodyFp`] extracts: through `T`'s own way `M`.
#[doc(hidden)]
pub struct ViaBodyFp<M>(std::marker::PhantomData<M>);

/// Reads the body (within `DefaultBodyLimit`, as `Bytes` does), records its fingerprint
/// label, and gives `T` the request with the same body.
impl<S, M, T> FromRequest<S, ViaBodyFp<M>> for BodyFp<T>
where
    S: Send + Sync,
    T: FromRequest<S, M>,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        use axum::RequestExt as _;
        // The body within the limit, as `Bytes` reads it, without copying the parts.
        let (parts, body) = req.with_limited_body().into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX)
            .await
            .map_err(|e| unreadable_body(&e))?;
        let label = body_label(
            parts.headers.get(CONTENT_TYPE).map(|v| v.as_bytes()),
            &bytes,
        );
        let inner = T::from_request(Request::from_parts(parts, Body::from(bytes)), state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(BodyFp(inner, BodySeen(Some(label))))
    }
}

/// The rejection `Bytes` gives for a body that could not be read: 413 past the limit,
/// else 400.
fn unreadable_body(e: &axum::Error) -> Response {
    let text = e.to_string();
    let status = if text.contains("length limit exceeded") {
        StatusCode::PAYLOAD_TOO_LARGE
    } else {
        StatusCode::BAD_REQUEST
    };
    (status, format!("Failed to buffer the request body: {text}")).into_response()
}

/// A captured response as an axum one (framing headers are left to the server).
pub(crate) fn render(cap: Captured) -> Response {
    let mut res = Response::new(Body::from(cap.body));
    *res.status_mut() =
        StatusCode::from_u16(cap.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = res.headers_mut();
    for (name, value) in replayed_headers(cap.headers) {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) {
            headers.append(n, v);
        }
    }
    res
}

/// Buffers an axum response whose body is known to be at most `max_body` bytes long;
/// any other (a stream of unknown length, a longer body) passes through as it is.
pub(crate) async fn capture(res: Response, max_body: usize) -> Capture {
    use axum::body::HttpBody as _;
    let fits = res
        .body()
        .size_hint()
        .exact()
        .is_some_and(|n| n <= max_body as u64);
    if !fits {
        return Capture(Kept::Streaming(Passthrough::Axum(res)));
    }
    let (parts, body) = res.into_parts();
    match axum::body::to_bytes(body, max_body).await {
        Ok(bytes) => Captured {
            status: parts.status.as_u16(),
            headers: parts
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect(),
            body: bytes.to_vec(),
        }
        .into(),
        Err(e) => internal_error(&format!("the handler's response body failed: {e}")).into(),
    }
}

impl IntoResponse for IdemResponse {
    fn into_response(self) -> Response {
        match self.0 {
            Outcome::Streaming(Passthrough::Axum(res)) => res,
            other => render(IdemResponse(other).into_captured()),
        }
    }
}

/// RFC 9457 `application/problem+json`: `MissingKey`/`InvalidKey` 400, `InProgress` 409
/// with `Retry-After`, `PayloadMismatch` 422, `Busy` and `NotReplicated` 503 with
/// `Retry-After: 1`, `Backend` 503 (with `Retry-After: 1` unless the client is
/// misconfigured), `Lost` 500.
impl IntoResponse for Error {
    fn into_response(self) -> Response {
        render(problem(&self))
    }
}

impl<T: IntoResponse> CaptureAxum for &&Reply<T> {
    fn __distlock_capture(&self, _req: &IdemRequest, max_body: usize) -> SendCapture {
        let res = self.take().into_response();
        Box::pin(capture(res, max_body))
    }
}
