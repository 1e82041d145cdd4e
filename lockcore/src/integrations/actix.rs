//! actix-web 4: `IdemRequest` is an extractor, `IdemResponse` a responder and `Error` a
//! `ResponseError`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use actix_web::error::PayloadError;
use actix_web::web::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt as _};

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::Payload;
use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{FromRequest, HttpRequest, HttpResponse, Responder, ResponseError};

use crate::error::Error;
use crate::idempotency::fingerprint::body_label;
use crate::idempotency::http::{
    BodyFp, BodySeen, Capture, CaptureActix, IdemRequest, IdemResponse, Kept, LocalCapture, Origin,
    Outcome, Passthrough, Reply, internal_error, problem, status_of,
};
use crate::idempotency::record::{Captured, replayed_headers};

thread_local! {
    /// Requests of idempotent handlers running on this worker thread. `HttpRequest` is
    /// not `Send`; keeping it here keeps `IdemRequest` `Send` (axum needs that), and
    /// actix runs a handler on one thread from extraction to response.
    static REQUESTS: RefCell<HashMap<u64, HttpRequest>> = RefCell::new(HashMap::new());
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Keeps request `id` on this thread until the `IdemRequest` is dropped.
struct KeptRequest(u64);

impl Drop for KeptRequest {
    fn drop(&mut self) {
        let _ = REQUESTS.try_with(|r| r.borrow_mut().remove(&self.0));
    }
}

fn with_request<R>(id: u64, f: impl FnOnce(&HttpRequest) -> R) -> Option<R> {
    REQUESTS
        .try_with(|r| r.borrow().get(&id).cloned())
        .ok()
        .flatten()
        .map(|req| f(&req))
}

impl FromRequest for IdemRequest {
    type Error = actix_web::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self, Self::Error>>>>;

    /// Also reads the request body (at most 16 MiB) for the fingerprint,
    /// and hands it on: the handler's own extractors read it from a payload that yields
    /// it once it is read, whichever parameter they are.
    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        REQUESTS.with(|r| r.borrow_mut().insert(id, req.clone()));
        let slot = Arc::new(Mutex::new(Slot::default()));
        let mut original = payload.take();
        let replay: Pin<Box<dyn Stream<Item = Result<Bytes, PayloadError>>>> =
            Box::pin(Replay { slot: slot.clone() });
        *payload = Payload::from(replay);
        let mut request = IdemRequest {
            headers: req
                .headers()
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect(),
            method: req.method().as_str().to_owned(),
            route: req.match_pattern().unwrap_or_default(),
            path: req.path().to_owned(),
            query: req.query_string().to_owned(),
            origin: Origin::Actix(id),
            spawn_local: actix_web::rt::System::try_current().is_some()
                || std::thread::current()
                    .name()
                    .is_some_and(|n| n.starts_with("actix-server worker")),
            body: None,
            _kept: Some(Box::new(KeptRequest(id))),
        };
        Box::pin(async move {
            let mut body = BytesMut::new();
            let read = loop {
                match original.next().await {
                    Some(Ok(chunk)) if body.len() + chunk.len() > BODY_LIMIT => {
                        break Err(PayloadError::Overflow);
                    }
                    Some(Ok(chunk)) => body.extend_from_slice(&chunk),
                    Some(Err(e)) => break Err(e),
                    None => break Ok(body.freeze()),
                }
            };
            let failed = read.is_err();
            if let Ok(bytes) = &read {
                let label = body_label(request.header_values("content-type").next(), bytes);
                request.body = Some(label);
            }
            let waker = {
                let mut slot = crate::util::lock(&slot);
                slot.read = Some(read);
                slot.waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
            if failed {
                return Err(PayloadError::Overflow.into());
            }
            Ok(request)
        })
    }
}

/// The most of a request body an idempotent actix-web handler reads (413 beyond).
pub(crate) const BODY_LIMIT: usize = 16 * 1024 * 1024;

/// The body as [`IdemRequest`] read it, for the handler's extractors.
#[derive(Default)]
struct Slot {
    /// The whole body (or why it could not be read), once read; taken by the replay.
    read: Option<Result<Bytes, PayloadError>>,
    /// Given to the replay already.
    given: bool,
    waker: Option<std::task::Waker>,
}

/// The payload the handler's extractors read: the body once [`IdemRequest`] has read it.
struct Replay {
    slot: Arc<Mutex<Slot>>,
}

impl Stream for Replay {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut slot = crate::util::lock(&self.slot);
        if slot.given {
            return Poll::Ready(None);
        }
        match slot.read.take() {
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            Some(read) => {
                slot.given = true;
                match read {
                    Ok(bytes) if bytes.is_empty() => Poll::Ready(None),
                    other => Poll::Ready(Some(other)),
                }
            }
        }
    }
}

impl<T> FromRequest for BodyFp<T>
where
    T: FromRequest + 'static,
{
    type Error = T::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self, Self::Error>>>>;

    /// `T` as it is: the request extractor read the body (see [`IdemRequest`]).
    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let inner = T::from_request(req, payload);
        Box::pin(async move { Ok(BodyFp(inner.await?, BodySeen::unread())) })
    }
}

/// A captured response as an actix one (framing headers are left to the server).
pub(crate) fn render(cap: Captured) -> HttpResponse {
    let status = StatusCode::from_u16(cap.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut res = HttpResponse::build(status);
    for (name, value) in replayed_headers(cap.headers) {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) {
            res.append_header((n, v));
        }
    }
    res.body(cap.body)
}

fn head(res: &HttpResponse<BoxBody>) -> (u16, Vec<(String, Vec<u8>)>) {
    (
        res.status().as_u16(),
        res.headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect(),
    )
}

thread_local! {
    /// Responses that stream through, until their handler's response is sent.
    static STREAMS: RefCell<HashMap<u64, HttpResponse<BoxBody>>> = RefCell::new(HashMap::new());
}

/// A streaming response held on this worker thread (see [`STREAMS`]); dropped unsent, it
/// is dropped there too.
pub(crate) struct Held(u64);

impl Held {
    fn new(res: HttpResponse<BoxBody>) -> Held {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        STREAMS.with(|s| s.borrow_mut().insert(id, res));
        Held(id)
    }

    fn take(self) -> Option<HttpResponse<BoxBody>> {
        STREAMS
            .try_with(|s| s.borrow_mut().remove(&self.0))
            .ok()
            .flatten()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = STREAMS.try_with(|s| s.borrow_mut().remove(&self.0));
    }
}

/// A rendered response whose body is still to be read: status, headers, body.
pub(crate) type ToRead = (u16, Vec<(String, Vec<u8>)>, BoxBody);

/// Renders `value` against the request `id`. A body in memory is buffered at once; a
/// body known to be at most `max_body` bytes long is `Err` to be read; any other (a
/// stream of unknown length, a longer body) passes through as it is.
pub(crate) fn capture_now<T: Responder>(
    value: T,
    id: u64,
    max_body: usize,
) -> Result<Capture, ToRead> {
    let Some(res) = with_request(id, |req| value.respond_to(req).map_into_boxed_body()) else {
        return Ok(internal_error(
            "an actix responder was returned, but the request was not extracted by actix-web",
        )
        .into());
    };
    let fits = match res.body().size() {
        BodySize::None => true,
        BodySize::Sized(n) => n <= max_body as u64,
        BodySize::Stream => false,
    };
    if !fits {
        return Ok(Capture(Kept::Streaming(Passthrough::OnThread(Box::new(
            Held::new(res),
        )))));
    }
    let (status, headers) = head(&res);
    let body = res.into_body();
    match body.try_into_bytes() {
        Ok(bytes) => Ok(Captured {
            status,
            headers,
            body: bytes.to_vec(),
        }
        .into()),
        Err(body) => Err((status, headers, body)),
    }
}

impl<T: Responder> CaptureActix for &Reply<T> {
    fn __distlock_capture(&self, req: &IdemRequest, max_body: usize) -> LocalCapture {
        let Origin::Actix(id) = req.origin else {
            return Box::pin(std::future::ready(
                internal_error(
                    "an actix responder was returned, but the request was not extracted by actix-web",
                )
                .into(),
            ));
        };
        match capture_now(self.take(), id, max_body) {
            Ok(cap) => Box::pin(std::future::ready(cap)),
            Err((status, headers, body)) => Box::pin(async move {
                match actix_web::body::to_bytes_limited(body, max_body).await {
                    Ok(Ok(bytes)) => Captured {
                        status,
                        headers,
                        body: bytes.to_vec(),
                    }
                    .into(),
                    Ok(Err(e)) => {
                        internal_error(&format!("the handler's response body failed: {e}")).into()
                    }
                    Err(_) => internal_error("the handler's response body outgrew its size").into(),
                }
            }),
        }
    }
}

impl Responder for IdemResponse {
    type Body = BoxBody;

    fn respond_to(self, _req: &HttpRequest) -> HttpResponse<Self::Body> {
        match self.0 {
            Outcome::Streaming(Passthrough::OnThread(held)) => held
                .downcast::<Held>()
                .ok()
                .and_then(|held| held.take())
                .unwrap_or_else(|| {
                    render(internal_error(
                        "a streamed response was sent from another thread than its handler's",
                    ))
                }),
            other => render(IdemResponse(other).into_captured()),
        }
    }
}

/// RFC 9457 `application/problem+json`: `MissingKey`/`InvalidKey` 400, `InProgress` 409
/// with `Retry-After`, `PayloadMismatch` 422, `Busy` and `NotReplicated` 503 with
/// `Retry-After: 1`, `Backend` 503 (with `Retry-After: 1` unless the client is
/// misconfigured), `Lost` 500.
impl ResponseError for Error {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(status_of(self)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse<BoxBody> {
        render(problem(self))
    }
}
