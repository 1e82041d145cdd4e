//! Metrics (feature `metrics`): every [`Event`] counted and timed through the `metrics`
//! 0.24 facade, labelled by the key's template or the idempotent function, never by the
//! key; a gauge of waiting tasks; the duration of each Redis call. Nothing is recorded
//! until the application installs a recorder. Without the feature, this module is the
//! no-op [`Waiting`] and [`Operation`], and nothing else is compiled in.
//!
//! Every name, unit, label and when it moves: the table in the `distlock` crate's docs,
//! "Metrics" (`src/lib.rs`); a change here changes it there.

#[cfg(feature = "metrics")]
use crate::events::Event;

/// Records `event` under `template`.
#[cfg(feature = "metrics")]
pub(crate) fn record(event: &Event<'_>, template: &'static str) {
    use metrics::{counter, histogram};
    let lock = |name: &'static str| counter!(name, "template" => template);
    let idem = |name: &'static str| counter!(name, "function" => template);
    match *event {
        Event::Acquired {
            waited,
            tries,
            handed,
            ..
        } => {
            counter!("distlock_lock_acquisitions_total", "template" => template, "outcome" => "acquired").increment(1);
            histogram!("distlock_lock_wait_seconds", "template" => template, "outcome" => "acquired")
                .record(waited.as_secs_f64());
            if handed {
                counter!("distlock_lock_handoffs_total", "template" => template, "via" => "local")
                    .increment(1);
            } else if tries > 1 {
                counter!("distlock_lock_handoffs_total", "template" => template, "via" => "cross_process")
                    .increment(1);
            }
        }
        Event::Busy { waited, .. } => {
            counter!("distlock_lock_acquisitions_total", "template" => template, "outcome" => "busy").increment(1);
            histogram!("distlock_lock_wait_seconds", "template" => template, "outcome" => "busy")
                .record(waited.as_secs_f64());
        }
        Event::AcquireFailed { .. } => {
            counter!("distlock_lock_acquisitions_total", "template" => template, "outcome" => "error").increment(1);
        }
        Event::Fenced { .. } => lock("distlock_lock_fences_total").increment(1),
        Event::Released { held, .. } | Event::Kept { held, .. } => {
            histogram!("distlock_lock_held_seconds", "template" => template)
                .record(held.as_secs_f64());
        }
        Event::Lost { found_at, .. } => {
            counter!("distlock_lock_lost_total", "template" => template, "found_at" => found_at)
                .increment(1);
        }
        Event::ReleaseFailed { .. } => lock("distlock_lock_release_failures_total").increment(1),
        Event::Renewed { .. } => {
            counter!("distlock_lock_renewals_total", "template" => template, "outcome" => "renewed")
                .increment(1);
        }
        Event::RenewalFailed { .. } => {
            counter!("distlock_lock_renewals_total", "template" => template, "outcome" => "failed")
                .increment(1);
        }
        Event::Claimed { took_over, .. } => {
            counter!("distlock_idem_calls_total", "function" => template, "outcome" => "claimed")
                .increment(1);
            if took_over {
                idem("distlock_idem_takeovers_total").increment(1);
            }
        }
        Event::Replayed { .. } => {
            counter!("distlock_idem_calls_total", "function" => template, "outcome" => "replayed")
                .increment(1);
        }
        Event::InProgress { .. } => {
            counter!("distlock_idem_calls_total", "function" => template, "outcome" => "in_progress").increment(1);
        }
        Event::Mismatch { .. } => {
            counter!("distlock_idem_calls_total", "function" => template, "outcome" => "mismatch")
                .increment(1);
        }
        Event::ClaimFailed { .. } => {
            counter!("distlock_idem_calls_total", "function" => template, "outcome" => "error")
                .increment(1);
        }
        Event::Stored { .. } => idem("distlock_idem_stored_total").increment(1),
        Event::NotStored { .. } => idem("distlock_idem_not_stored_total").increment(1),
    }
}

/// One task waiting for a lock: counted in `distlock_lock_waiting` from
/// [`start`](Waiting::start) until dropped (held, given up, failed or cancelled).
pub(crate) struct Waiting(#[cfg(feature = "metrics")] &'static str);

impl Waiting {
    #[cfg(feature = "metrics")]
    pub(crate) fn start(template: &'static str) -> Waiting {
        metrics::gauge!("distlock_lock_waiting", "template" => template).increment(1.0);
        Waiting(template)
    }

    #[cfg(not(feature = "metrics"))]
    pub(crate) fn start(_template: &'static str) -> Waiting {
        Waiting()
    }
}

#[cfg(feature = "metrics")]
impl Drop for Waiting {
    fn drop(&mut self) {
        metrics::gauge!("distlock_lock_waiting", "template" => self.0).decrement(1.0);
    }
}

/// One Redis call, timed into `db.client.operation.duration` when it ends (dropped:
/// answered, failed, timed out or cancelled).
pub(crate) struct Operation {
    #[cfg(feature = "metrics")]
    started: std::time::Instant,
    #[cfg(feature = "metrics")]
    name: &'static str,
}

impl Operation {
    /// `name()` is asked only with the feature on: without it, nothing is computed.
    #[cfg(feature = "metrics")]
    pub(crate) fn start_with(name: impl FnOnce() -> &'static str) -> Operation {
        Operation {
            started: std::time::Instant::now(),
            name: name(),
        }
    }

    #[cfg(not(feature = "metrics"))]
    pub(crate) fn start_with(_name: impl FnOnce() -> &'static str) -> Operation {
        Operation {}
    }
}

#[cfg(feature = "metrics")]
impl Drop for Operation {
    fn drop(&mut self) {
        metrics::histogram!(
            "db.client.operation.duration",
            "db.system.name" => "redis",
            "db.operation.name" => self.name
        )
        .record(self.started.elapsed().as_secs_f64());
    }
}
