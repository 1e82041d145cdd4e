//! What happens to locks and idempotent calls, as one type: every step is an [`Event`],
//! emitted at one point ([`Events::emit`]) that writes the `tracing` line (target
//! `distlock`) and hands the event to the observer given to
//! [`LocksBuilder::observer`](crate::LocksBuilder::observer), if any. A metrics exporter
//! is one observer; nothing else needs to change.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// One step of a lock or an idempotent call. Keys are the full Redis keys (`lock:order:42`,
/// or the idempotency record's key); no argument or payload is ever part of an event.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use lockcore::{Event, Locks};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let log = seen.clone();
/// let locks = Locks::in_memory_observed(move |event: &Event<'_>| {
///     log.lock().unwrap().push(event.name())
/// });
/// locks.lock("a").acquire().await.unwrap().release().await.unwrap();
/// assert_eq!(*seen.lock().unwrap(), ["acquired", "released"]);
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Event<'a> {
    /// A lock was taken, after `waited` and `tries` tries; `handed`: by this process's
    /// previous holder, without a round trip.
    Acquired {
        /// The lock's key.
        key: &'a str,
        /// From the call to the lock being held.
        waited: Duration,
        /// Tries sent to the backend.
        tries: u32,
        /// Handed over by the previous holder in this process.
        handed: bool,
    },
    /// The lock stayed held by another until `wait` ran out (`local`: by a holder in
    /// this process).
    Busy {
        /// The lock's key.
        key: &'a str,
        /// How long the caller waited.
        waited: Duration,
        /// Held in this process.
        local: bool,
    },
    /// A try failed: the backend could not be asked.
    AcquireFailed {
        /// The lock's key.
        key: &'a str,
        /// What the caller gets.
        error: &'a crate::Error,
    },
    /// A fencing token was assigned.
    Fenced {
        /// The lock's key.
        key: &'a str,
        /// The token.
        fence: u64,
    },
    /// A lock was released after being held for `held`; `handed`: to the next local
    /// waiter.
    Released {
        /// The lock's key.
        key: &'a str,
        /// From acquisition to release.
        held: Duration,
        /// Handed to the next waiter in this process.
        handed: bool,
    },
    /// A lock released before its `min_hold` ran out: its lease now ends `left` from
    /// now, and nobody was handed it or woken.
    Kept {
        /// The lock's key.
        key: &'a str,
        /// From acquisition to release.
        held: Duration,
        /// How long the lock stays held by its lease.
        left: Duration,
    },
    /// The lock was lost while held: it expired or another holder took it (found at
    /// release, renewal or a fence).
    Lost {
        /// The lock's key.
        key: &'a str,
        /// Where the loss was found: `"release"`, `"renewal"`, `"fence"`, `"lease end"`
        /// (renewals kept failing) or `"max_hold"` (the lease was not renewed past it).
        found_at: &'static str,
    },
    /// A release failed, or its outcome cannot be told.
    ReleaseFailed {
        /// The lock's key.
        key: &'a str,
        /// What the caller gets.
        error: &'a crate::Error,
    },
    /// A lease was renewed.
    Renewed {
        /// The lock's key.
        key: &'a str,
    },
    /// A renewal failed and will be tried again while the lease lasts.
    RenewalFailed {
        /// The lock's key.
        key: &'a str,
        /// The backend's error.
        error: &'a crate::BackendError,
    },
    /// An idempotency key was claimed: the body runs (`took_over`: a claim whose
    /// claimer stopped renewing it was taken over, so the body runs again).
    Claimed {
        /// The record's key.
        key: &'a str,
        /// From the call to the claim.
        waited: Duration,
        /// An expired claim was taken over.
        took_over: bool,
    },
    /// The stored result of an earlier call was replayed.
    Replayed {
        /// The record's key.
        key: &'a str,
    },
    /// The key is in use by a call in progress until `wait` ran out.
    InProgress {
        /// The record's key.
        key: &'a str,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The key was used before with a different payload.
    Mismatch {
        /// The record's key.
        key: &'a str,
    },
    /// A claim could not be made: the backend could not be asked.
    ClaimFailed {
        /// The record's key.
        key: &'a str,
        /// What the caller gets.
        error: &'a crate::Error,
    },
    /// The call's result was stored, `bytes` long.
    Stored {
        /// The record's key.
        key: &'a str,
        /// The record's length.
        bytes: usize,
    },
    /// The call's result was not stored: the claim was lost, or the backend failed; the
    /// claim ends with its lease.
    NotStored {
        /// The record's key.
        key: &'a str,
        /// Why, in words.
        reason: &'a str,
    },
}

impl Event<'_> {
    /// A short stable name: `acquired`, `busy`, `acquire_failed`, `fenced`, `released`,
    /// `lost`, `release_failed`, `renewed`, `renewal_failed`, `claimed`, `replayed`,
    /// `in_progress`, `mismatch`, `claim_failed`, `stored`, `not_stored`.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Acquired { .. } => "acquired",
            Event::Busy { .. } => "busy",
            Event::AcquireFailed { .. } => "acquire_failed",
            Event::Fenced { .. } => "fenced",
            Event::Released { .. } => "released",
            Event::Kept { .. } => "kept",
            Event::Lost { .. } => "lost",
            Event::ReleaseFailed { .. } => "release_failed",
            Event::Renewed { .. } => "renewed",
            Event::RenewalFailed { .. } => "renewal_failed",
            Event::Claimed { .. } => "claimed",
            Event::Replayed { .. } => "replayed",
            Event::InProgress { .. } => "in_progress",
            Event::Mismatch { .. } => "mismatch",
            Event::ClaimFailed { .. } => "claim_failed",
            Event::Stored { .. } => "stored",
            Event::NotStored { .. } => "not_stored",
        }
    }

    /// The key the event is about.
    pub fn key(&self) -> &str {
        match *self {
            Event::Acquired { key, .. }
            | Event::Busy { key, .. }
            | Event::AcquireFailed { key, .. }
            | Event::Fenced { key, .. }
            | Event::Released { key, .. }
            | Event::Kept { key, .. }
            | Event::Lost { key, .. }
            | Event::ReleaseFailed { key, .. }
            | Event::Renewed { key }
            | Event::RenewalFailed { key, .. }
            | Event::Claimed { key, .. }
            | Event::Replayed { key }
            | Event::InProgress { key, .. }
            | Event::Mismatch { key }
            | Event::ClaimFailed { key, .. }
            | Event::Stored { key, .. }
            | Event::NotStored { key, .. } => key,
        }
    }

    /// The `tracing` line: warnings for what a caller must hear of (a loss, a failure,
    /// a takeover, a mismatch), debug for the normal steps, trace for renewals and fences.
    fn trace(&self) {
        let key = self.key();
        let ms = |d: &Duration| d.as_secs_f64() * 1e3;
        match self {
            Event::Acquired {
                waited,
                tries,
                handed,
                ..
            } => {
                tracing::debug!(target: "distlock", key, waited_ms = ms(waited), tries, handed, "lock acquired")
            }
            Event::Busy {
                waited,
                local: false,
                ..
            } => tracing::debug!(target: "distlock", key, waited_ms = ms(waited), "lock busy"),
            Event::Busy {
                waited,
                local: true,
                ..
            } => {
                tracing::debug!(target: "distlock", key, waited_ms = ms(waited), "lock busy (held in this process)")
            }
            Event::AcquireFailed { error, .. } => {
                tracing::warn!(target: "distlock", key, error = %error, "lock acquire failed")
            }
            Event::Fenced { fence, .. } => {
                tracing::trace!(target: "distlock", key, fence, "lock fence assigned")
            }
            Event::Released { held, handed, .. } => {
                tracing::debug!(target: "distlock", key, held_ms = ms(held), handed, "lock released")
            }
            Event::Kept { held, left, .. } => {
                tracing::debug!(target: "distlock", key, held_ms = ms(held), left_ms = ms(left), "lock released before its min_hold: kept by its lease")
            }
            Event::Lost { found_at, .. } => {
                tracing::warn!(target: "distlock", key, found_at, "lock lost while held: it expired or another holder took it")
            }
            Event::ReleaseFailed { error, .. } => {
                tracing::warn!(target: "distlock", key, error = %error, "lock release failed")
            }
            Event::Renewed { .. } => tracing::trace!(target: "distlock", key, "lock lease renewed"),
            Event::RenewalFailed { error, .. } => {
                tracing::warn!(target: "distlock", key, error = %error, "lock renewal failed; retrying")
            }
            Event::Claimed {
                waited,
                took_over: false,
                ..
            } => {
                tracing::debug!(target: "distlock", key, waited_ms = ms(waited), "idempotency key claimed")
            }
            Event::Claimed {
                waited,
                took_over: true,
                ..
            } => {
                tracing::warn!(target: "distlock", key, waited_ms = ms(waited), "idempotency key claimed by taking over an expired claim (its claimer stopped renewing the lease); the body runs again")
            }
            Event::Replayed { .. } => {
                tracing::debug!(target: "distlock", key, "idempotent replay of the stored result")
            }
            Event::InProgress { waited, .. } => {
                tracing::debug!(target: "distlock", key, waited_ms = ms(waited), "idempotency key in use by a call in progress")
            }
            Event::Mismatch { .. } => {
                tracing::warn!(target: "distlock", key, "idempotency key reused with a different payload")
            }
            Event::ClaimFailed { error, .. } => {
                tracing::warn!(target: "distlock", key, error = %error, "idempotency claim failed")
            }
            Event::Stored { bytes, .. } => {
                tracing::debug!(target: "distlock", key, bytes, "idempotent result stored")
            }
            Event::NotStored { reason, .. } => {
                tracing::warn!(target: "distlock", key, reason, "idempotent result not stored; the claim ends with its lease")
            }
        }
    }
}

pub(crate) type Observer = dyn Fn(&Event<'_>) + Send + Sync;

/// Where one client's events go: the `tracing` line, then its observer.
#[derive(Clone, Default)]
pub(crate) struct Events {
    observer: Option<Arc<Observer>>,
}

impl Events {
    pub(crate) fn new(observer: Option<Arc<Observer>>) -> Events {
        Events { observer }
    }

    /// The one place an event goes out. An observer that panics does not take the
    /// lock's bookkeeping with it: the panic is caught and logged.
    /// `template`: the key's template (a lock's) or the function (an idempotent call's),
    /// the one label the metrics use.
    pub(crate) fn emit(&self, event: Event<'_>, template: &'static str) {
        event.trace();
        if let Event::Claimed { .. }
        | Event::Replayed { .. }
        | Event::InProgress { .. }
        | Event::Mismatch { .. }
        | Event::ClaimFailed { .. } = event
        {
            // The outcome of the idempotent call's span (see `run_idempotent`).
            tracing::Span::current().record("distlock.outcome", event.name());
        }
        #[cfg(feature = "metrics")]
        crate::metrics::record(&event, template);
        #[cfg(not(feature = "metrics"))]
        let _ = template;
        if let Some(observe) = &self.observer {
            let call = std::panic::AssertUnwindSafe(|| observe(&event));
            if std::panic::catch_unwind(call).is_err() {
                tracing::error!(target: "distlock", event = event.name(), "the event observer panicked");
            }
        }
    }
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Events")
            .field("observer", &self.observer.is_some())
            .finish()
    }
}
