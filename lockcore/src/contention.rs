//! The one contention loop of every primitive: a caller tries, and when it is refused
//! (a lock held, a record in progress) it waits for the release message and tries
//! again, until its deadline. The order of steps is what keeps a wake-up from being
//! missed, as tokio's `Notify::enable` does for one process:
//!
//! 1. the first try is sent unsubscribed (most tries find the key free);
//! 2. refused, the caller subscribes to the key's channel, then tries once more at once:
//!    a release that happened before the subscription was confirmed is not missed;
//! 3. refused again, it waits for a message, the holder's lease end or a capped
//!    fallback (a message lost on the way), whichever comes first, never past the
//!    deadline, then tries again;
//! 4. at the deadline the caller gives up, with how long it waited.
//!
//! A try in flight when its caller is cancelled may still land: [`in_flight`] runs the
//! primitive's clean-up then. Whether a refused try needs a fresh token (a backend whose
//! writes land on nodes independently) is the primitive's to say, from the backend.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::notify::{Subscription, Wakeups};

/// One caller contending for one channel's key.
pub(crate) struct Contention<'a> {
    wakeups: &'a Wakeups,
    /// The channel, as `channel_of(of)`: named only when the caller subscribes, so an
    /// uncontended first try allocates nothing for it.
    of: &'a str,
    channel_of: fn(&str) -> String,
    started: Instant,
    deadline: Instant,
    /// Longest wait between tries while subscribed.
    cap: Duration,
    /// Unsubscribed although wake-ups are wanted: back off from 1 ms instead of
    /// waiting for the fallback.
    backoff: bool,
    wake: Option<Subscription>,
    subscribed: bool,
    waits: u32,
}

/// What a refused caller does next.
pub(crate) enum Next {
    /// Try again now.
    Retry,
    /// The deadline passed: give up, having waited this long.
    GiveUp(Duration),
}

impl<'a> Contention<'a> {
    /// The channel is `channel_of(of)`. `backoff`: see the field; a lock waiter backs
    /// off when Pub/Sub could not be had, an idempotency repeat waits for the holder's
    /// lease.
    pub(crate) fn new(
        wakeups: &'a Wakeups,
        (of, channel_of): (&'a str, fn(&str) -> String),
        started: Instant,
        deadline: Instant,
        cap: Duration,
        backoff: bool,
    ) -> Contention<'a> {
        Contention {
            wakeups,
            of,
            channel_of,
            started,
            deadline,
            cap,
            backoff: backoff && wakeups.by_message(),
            wake: None,
            subscribed: false,
            waits: 0,
        }
    }

    /// `None` for a first try; `Some(woken)` for a waiter's, `woken` when a release
    /// message will wake it (so its try may ask the holder's release to publish).
    pub(crate) fn waiter(&self) -> Option<bool> {
        self.subscribed.then_some(self.wake.is_some())
    }

    /// How many times the caller waited.
    pub(crate) fn waits(&self) -> u32 {
        self.waits
    }

    /// Subscribes, then waits for the next release or `until` (never past the
    /// deadline), before any try: a caller that knows a try now would be refused (its
    /// client just left the lock to the others).
    pub(crate) async fn wait_before_trying(&mut self, until: Instant) {
        self.subscribe().await;
        let until = until.min(self.deadline);
        match self.wake.as_mut() {
            Some(w) => drop(tokio::time::timeout_at(until, w.released()).await),
            None => tokio::time::sleep_until(until).await,
        }
    }

    /// After a refused try that saw `left` of the holder's lease: give up at the
    /// deadline; the first time, subscribe and try again at once; else wait (see the
    /// module docs) and try again.
    pub(crate) async fn refused(&mut self, left: Option<Duration>) -> Next {
        let now = Instant::now();
        if now >= self.deadline {
            return Next::GiveUp(now - self.started);
        }
        if !self.subscribed {
            self.subscribe().await;
            if self.wake.is_some() {
                return Next::Retry;
            }
        }
        wait_for_wake(
            self.wake.as_mut(),
            self.backoff,
            left,
            self.waits,
            self.deadline,
            self.cap,
        )
        .await;
        self.waits = self.waits.saturating_add(1);
        Next::Retry
    }

    /// Subscribes, within the caller's deadline: a Pub/Sub connection that is slow to
    /// come (another waiter's connect ahead, a stalled node) leaves the caller polling, and
    /// its call ends by its deadline all the same.
    async fn subscribe(&mut self) {
        self.subscribed = true;
        let subscribing = self.wakeups.subscribe((self.channel_of)(self.of));
        self.wake = tokio::time::timeout_at(self.deadline, subscribing)
            .await
            .ok()
            .flatten();
    }
}

/// Runs `try_`, and `on_cancel` if the caller drops it before it answered: a try that
/// may still land is cleaned up (a lock's token taken back, a claim given back).
pub(crate) async fn in_flight<T>(try_: impl Future<Output = T>, on_cancel: impl FnOnce()) -> T {
    let guard = Armed(Some(on_cancel));
    let out = try_.await;
    guard.disarm();
    out
}

/// Runs its function when dropped, unless disarmed first.
struct Armed<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Armed<F> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl<F: FnOnce()> Drop for Armed<F> {
    fn drop(&mut self) {
        if let Some(run) = self.0.take() {
            run();
        }
    }
}

/// How a waiter waits before its next try, never past `deadline`: until a message on
/// `wake` (when subscribed), or the holder's remaining lease `left`, or `cap` (which
/// covers a missed message), whichever comes first. Unsubscribed while wake-ups are
/// wanted (`backoff`: Pub/Sub could not be had), a jittered exponential backoff from
/// 1 ms, capped at 16 ms.
async fn wait_for_wake(
    wake: Option<&mut Subscription>,
    backoff: bool,
    left: Option<Duration>,
    attempt: u32,
    deadline: Instant,
    cap: Duration,
) {
    let now = Instant::now();
    let fallback = left
        .map(|l| l + Duration::from_millis(1))
        .unwrap_or(cap)
        .min(cap);
    match wake {
        Some(wake) => {
            let until = (now + fallback).min(deadline);
            let _ = tokio::time::timeout_at(until, wake.released()).await;
        }
        None if !backoff => tokio::time::sleep_until((now + fallback).min(deadline)).await,
        None => {
            const CAP_MS: u64 = 16;
            let ceiling = (1u64 << attempt.min(4)).min(CAP_MS);
            let micros = fastrand::u64(ceiling * 500..=ceiling * 1000);
            let until = (now + Duration::from_micros(micros)).min(deadline);
            tokio::time::sleep_until(until).await;
        }
    }
}
