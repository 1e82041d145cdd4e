//! What generated handler code calls: the detach traits that run a claimed call in a task
//! of its own, and the capture traits that pick, by autoref specialization, how a
//! framework's response is captured. Not a public API.

use super::*;

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
    pub(super) fn run<F>(self, fut: F) -> Pin<Box<dyn Future<Output = IdemResponse> + Send>>
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
    pub(super) fn run_local<F>(self, fut: F) -> Pin<Box<dyn Future<Output = IdemResponse>>>
    where
        F: Future<Output = IdemResponse> + 'static,
    {
        Box::pin(detached_local_response(
            fut,
            self.on_this_thread && self.spawn_local,
        ))
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
pub(super) fn detached_response<F>(fut: F) -> impl Future<Output = IdemResponse> + Send
where
    F: Future<Output = IdemResponse> + Send + 'static,
{
    let task = super::super::detached(fut);
    async move { answered(task.await) }
}

/// A detached call's response, or the error that says its runtime shut down first.
pub(super) fn answered(out: Option<IdemResponse>) -> IdemResponse {
    out.unwrap_or_else(|| super::super::runtime_gone().into())
}

/// [`detached_response`] on this thread: spawned on its `LocalSet` when `local` says
/// there is one (actix-web workers run every handler on one), else in the caller's
/// future.
pub(super) fn detached_local_response<F>(fut: F, local: bool) -> impl Future<Output = IdemResponse>
where
    F: Future<Output = IdemResponse> + 'static,
{
    let spawned = if local {
        Ok(super::super::detached_local(fut))
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

    pub(super) fn take(&self) -> (DetachMode, Pin<Box<F>>) {
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
