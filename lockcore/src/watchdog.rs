//! Keeping leases: renewing held locks before their ttl runs out.
//!
//! Every renewable lock held through one client is registered with that client's single
//! watchdog task, which runs on a thread of its own (not on a caller's runtime). Each
//! lock is due for renewal a third of its ttl after its last one; the task wakes at the
//! earliest due time and renews, in ONE pipeline, every lock due within the next sixth of
//! its ttl. So ten thousand held locks cost one timer and a handful of
//! round trips per ttl, not ten thousand timers.
//!
//! A renewal is a compare-and-extend: it finds the key gone or holding another token when
//! the lock was lost, and the lock's holder is told at once. A lock past its `max_hold`
//! is not renewed any more and counts as lost when its last lease ends. A Redis failure
//! is retried until the lease would have ended, then the lock counts as lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OnceCell, mpsc};
use tokio::time::Instant;

use crate::backend::replicas::{Acknowledging, Extension};
use crate::backend::{Backend, Extended, Locking};
use crate::error::BackendError;
use crate::events::{Event, Events};

/// Shared between a held lock, its `LockInfo`s and the watchdog.
#[derive(Debug)]
pub(crate) struct HeldState {
    lost: AtomicBool,
    /// Wakes the tasks waiting in [`HeldState::lost`].
    lost_notify: Notify,
    released: AtomicBool,
    /// The lock's fence, assigned on the first `LockInfo::fence` call.
    pub(crate) fence: OnceCell<u64>,
    /// Replicas that must acknowledge its fence and its renewals (set when its
    /// acquisition is confirmed with them).
    pub(crate) replicas: std::sync::atomic::AtomicU32,
    /// How the lock was taken.
    taking: Taking,
    /// The key's template (see `LockRequest::template`): its metrics' label.
    pub(crate) template: &'static str,
    /// The lease by this client's clock: since when (a try's or renewal's send) and for
    /// how long. The key cannot expire before its end (see [`HeldState::surely_held_at`]).
    lease: Mutex<(Instant, Duration)>,
}

/// How a lock came to be held: what its release reads of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taking {
    /// By this task's try, sent in the backend's `epoch`; `waited`: after subscribing to
    /// wait for it.
    Sent { epoch: u64, waited: bool },
    /// Handed over by another task's release: the epoch its lease began in is unknown.
    Handed,
}

impl HeldState {
    /// The state of a lock taken as `taking`, whose lease runs `ttl` from `since`.
    pub(crate) fn new(
        since: Instant,
        ttl: Duration,
        taking: Taking,
        template: &'static str,
    ) -> Arc<HeldState> {
        Arc::new(HeldState {
            template,
            lost: AtomicBool::new(false),
            lost_notify: Notify::new(),
            released: AtomicBool::new(false),
            fence: OnceCell::new(),
            replicas: std::sync::atomic::AtomicU32::new(0),
            taking,
            lease: Mutex::new((since, ttl)),
        })
    }

    /// Someone else wanted the lock when it was taken (it was waited for, or handed
    /// over): its release goes straight to the script that wakes waiters.
    pub(crate) fn was_contended(&self) -> bool {
        !matches!(self.taking, Taking::Sent { waited: false, .. })
    }

    /// A renewal sent at `since` extended the lease to `ttl` from then.
    pub(crate) fn renewed(&self, since: Instant, ttl: Duration) {
        *crate::util::lock(&self.lease) = (since, ttl);
    }

    /// Whether the key surely still held this lock's token at `now`, unless this
    /// client's release removed it: the lock was not found lost, the backend's epoch
    /// `epoch` is still the one it was taken in (no broken connection, no restart or
    /// failover seen since, which could have lost the key), and `now` is before the
    /// lease's end by this client's clock, less a margin for the two clocks' rates and
    /// Redis's millisecond expiry (2 ms + 1 % of the ttl). Assumes the server loses no
    /// key silently and its clock does not jump, and this host was not suspended.
    pub(crate) fn surely_held_at(&self, now: Instant, epoch: u64) -> bool {
        let same_epoch = matches!(self.taking, Taking::Sent { epoch: e, .. } if e == epoch);
        !self.is_lost() && same_epoch && now < self.lease_end()
    }

    /// The lease's ttl (from the try that took the lock, or the last renewal).
    pub(crate) fn ttl(&self) -> Duration {
        crate::util::lock(&self.lease).1
    }

    /// When the lease (from the try that took the lock, or the last renewal) surely
    /// still runs until, by this client's clock: its end less the margin of
    /// [`surely_held_at`](Self::surely_held_at).
    pub(crate) fn lease_end(&self) -> Instant {
        let (since, ttl) = *crate::util::lock(&self.lease);
        let margin = Duration::from_millis(2) + ttl / 100;
        (since + ttl).checked_sub(margin).unwrap_or(since)
    }

    /// Whether the lock is lost, or its lease has ended by this client's clock (no
    /// renewal extended it in time): then it is marked lost, and `false`.
    pub(crate) fn check_held(&self) -> bool {
        if self.is_lost() {
            return false;
        }
        if Instant::now() >= self.lease_end() && !self.is_released() {
            self.mark_lost();
            return false;
        }
        true
    }

    pub(crate) fn mark_lost(&self) {
        self.lost.store(true, Ordering::Release);
        self.lost_notify.notify_waiters();
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    pub(crate) fn mark_released(&self) {
        self.released.store(true, Ordering::Release);
    }

    fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Resolves when the lock is known to be lost: found lost, or its lease ended by
    /// this client's clock, whatever the renewal task is doing meanwhile (it may be
    /// awaiting another lock's renewal).
    pub(crate) async fn lost(&self) {
        loop {
            let notified = self.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.check_held() {
                return;
            }
            if self.is_released() {
                // Released: only a loss found since (by the release) wakes it.
                notified.await;
                continue;
            }
            // Woken at the lease end as known now; a renewal meanwhile moves it, and the
            // next turn sleeps until the new one.
            let end = self.lease_end();
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(end) => {}
            }
        }
    }
}

/// One lock under the watchdog's care.
pub(crate) struct RenewedLease {
    pub(crate) key: Arc<str>,
    pub(crate) token: Arc<str>,
    /// The sorted set of a semaphore's permit or a read lock's share (renewed there
    /// by `permit_extend.lua`); `None`: a lock, at `key`.
    pub(crate) permit: Option<Arc<str>>,
    pub(crate) ttl: Duration,
    pub(crate) acquired_at: Instant,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) state: Arc<HeldState>,
    /// Where its renewals and loss are reported.
    pub(crate) events: Events,
}

struct Tracked {
    lease: RenewedLease,
    due: Instant,
    lease_end: Instant,
}

/// The registration side of a client's watchdog: one task on a thread of its own,
/// started by the first renewable lock and ending with the client.
///
/// The task does not live on any caller's tokio runtime: callers may hold locks from
/// several runtimes (actix-web runs one per worker, and the default client is shared by
/// all of them), and a runtime that shuts down takes its tasks with it. A lease the task
/// can no longer renew (its thread could not start, or it ended) is reported lost.
#[derive(Default)]
pub(crate) struct Watchdog {
    task: Mutex<Option<mpsc::UnboundedSender<RenewedLease>>>,
}

impl Watchdog {
    /// Renews `lease` through `backend` until it is released or lost.
    pub(crate) fn register(&self, backend: &Arc<Backend>, lease: RenewedLease) {
        let mut task = crate::util::lock(&self.task);
        let lease = match task.as_ref() {
            Some(tx) => match tx.send(lease) {
                Ok(()) => return,
                Err(e) => e.0, // the task ended (it cannot, short of a bug): start another
            },
            None => lease,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let state = lease.state.clone();
        let _ = tx.send(lease);
        let client = Arc::downgrade(backend);
        // Its events go where the registering caller's go (a scoped subscriber included).
        let dispatch = tracing::dispatcher::get_default(|d| d.clone());
        let started = std::thread::Builder::new()
            .name("distlock-watchdog".into())
            .spawn(move || {
                tracing::dispatcher::with_default(&dispatch, || {
                    let mut tracking = Tracking {
                        leases: Vec::new(),
                        incoming: rx,
                    };
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt.block_on(run(client, &mut tracking)),
                        Err(e) => {
                            tracing::error!(target: "distlock", error = %e, "lock renewal cannot start its runtime")
                        }
                    }
                })
            });
        if let Err(e) = started {
            // Nothing renews it: the one lease sent is lost; the next registration tries
            // again.
            tracing::error!(target: "distlock", error = %e, "lock renewal cannot start its thread");
            state.mark_lost();
            return;
        }
        *task = Some(tx);
    }
}

/// The leases a watchdog task renews, and those sent to it. Whatever it still holds when
/// it ends (the client is gone, or the task failed, a panic included) can no longer be
/// renewed: reported lost, and the channel is closed so the next registration starts
/// another task.
struct Tracking {
    leases: Vec<Tracked>,
    incoming: mpsc::UnboundedReceiver<RenewedLease>,
}

impl Drop for Tracking {
    fn drop(&mut self) {
        self.incoming.close();
        while let Ok(lease) = self.incoming.try_recv() {
            self.leases.push(Tracked::new(lease));
        }
        for t in self.leases.drain(..) {
            if !t.lease.state.is_released() {
                t.lease.state.mark_lost();
                tracing::warn!(target: "distlock", key = &*t.lease.key, "lock lease can no longer be renewed: reported lost");
            }
        }
    }
}

impl Tracked {
    /// Whether the lock has been held for its `max_hold`: no longer renewed.
    fn capped(&self, now: Instant) -> bool {
        self.lease
            .max_hold
            .is_some_and(|max| now >= self.lease.acquired_at + max)
    }

    /// Whether its renewal is due now: within a sixth of a ttl of its due time, and not
    /// past `max_hold`.
    fn renewal_due(&self, now: Instant) -> bool {
        !self.capped(now) && self.due <= now + self.lease.ttl / 6
    }

    fn new(lease: RenewedLease) -> Tracked {
        let (ttl, at) = (lease.ttl, lease.acquired_at);
        Tracked {
            lease,
            due: at + ttl / 3,
            lease_end: at + ttl,
        }
    }
}

async fn run(client: std::sync::Weak<Backend>, tracking: &mut Tracking) {
    let mut epoch = client.upgrade().map(|b| b.epoch());
    let mut next_look = Instant::now() + EPOCH_LOOK;
    // When every lease was last made due at once: at most once per `EARLY_GAP`.
    let mut checked_early: Option<Instant> = None;
    loop {
        // While leases are held, the backend's epoch is looked at every `EPOCH_LOOK`: a
        // restart or failover the client suspected since (see `Locking::epoch`) makes
        // every lease due at once, so each finds out whether its key survived.
        let next = tracking
            .leases
            .iter()
            .map(|t| t.due.min(t.lease_end))
            .min()
            .map(|at| at.min(next_look));
        let woke = match next {
            Some(at) => tokio::select! {
                lease = tracking.incoming.recv() => lease.map(Some),
                _ = tokio::time::sleep_until(at) => Some(None),
            },
            None => tracking.incoming.recv().await.map(Some),
        };
        match woke {
            None => return, // the client is gone
            Some(Some(lease)) => {
                tracking.leases.push(Tracked::new(lease));
                while let Ok(lease) = tracking.incoming.try_recv() {
                    tracking.leases.push(Tracked::new(lease));
                }
            }
            Some(None) => {}
        }
        let Some(backend) = client.upgrade() else {
            return;
        };
        let now = Instant::now();
        let mut early = false;
        if now >= next_look {
            next_look = now + EPOCH_LOOK;
            let now_epoch = Some(backend.epoch());
            // Not more often than `EARLY_GAP` (an outage bumps the epoch at every failed
            // connect), and never for a lease whose retry is already near.
            if now_epoch != epoch && checked_early.is_none_or(|at| now >= at + EARLY_GAP) {
                epoch = now_epoch;
                checked_early = Some(now);
                for t in tracking
                    .leases
                    .iter_mut()
                    .filter(|t| !t.capped(now) && t.due > now + EARLY_GAP)
                {
                    t.due = now;
                    early = true;
                }
                if early {
                    tracing::debug!(target: "distlock", leases = tracking.leases.len(), "redis may have restarted or failed over: every held lock is checked now");
                }
            }
        }
        // A wake for the epoch look alone, with no lease ended or due, costs no tick.
        let due = tracking
            .leases
            .iter()
            .any(|t| now >= t.lease_end || t.renewal_due(now));
        if early || due {
            tick(&backend, &mut tracking.leases).await;
        }
    }
}

/// The least time between two checks of every lease at once (see [`run`]).
const EARLY_GAP: Duration = Duration::from_secs(1);

/// How often the renewal task looks at the backend's epoch while leases are held (an
/// atomic read, no round trip).
const EPOCH_LOOK: Duration = Duration::from_millis(50);

async fn tick(backend: &Backend, tracked: &mut Vec<Tracked>) {
    let now = Instant::now();
    drop_ended(tracked, now);
    let due = due_now(tracked, now);
    if due.is_empty() {
        return;
    }
    let sent = Instant::now();
    // A renewal still under way when a lease ends does not keep that lock "held": the
    // key may have expired meanwhile. Not waited for past the last lease end, it counts
    // as failed; each answer is judged against its own lease's end (see `record`).
    let last_end = due
        .iter()
        .map(|&i| tracked[i].lease_end)
        .max()
        .unwrap_or(sent);
    let renewed = extend_due(backend, tracked, &due, sent, last_end).await;
    record(tracked, &due, renewed, sent);
}

/// Phase 1: leases released, or ended without a renewal (max_hold reached, or renewals
/// kept failing), leave; the ended ones are lost.
fn drop_ended(tracked: &mut Vec<Tracked>, now: Instant) {
    tracked.retain(|t| {
        if t.lease.state.is_released() {
            return false;
        }
        if now >= t.lease_end {
            t.lease.state.mark_lost();
            t.lease.events.emit(
                Event::Lost {
                    key: &t.lease.key,
                    found_at: if t.capped(now) {
                        "max_hold"
                    } else {
                        "lease end"
                    },
                },
                t.lease.state.template,
            );
            return false;
        }
        true
    });
}

/// Phase 2: the leases to renew now (a sixth of a ttl early). Those past max_hold are
/// left to run out: their due time moves past their lease end.
fn due_now(tracked: &mut [Tracked], now: Instant) -> Vec<usize> {
    let due = (0..tracked.len())
        .filter(|&i| tracked[i].renewal_due(now))
        .collect();
    for t in tracked.iter_mut().filter(|t| t.capped(now)) {
        t.due = t.lease_end;
    }
    due
}

/// One due lease's renewal: what its compare-and-extend found (or why it failed), when
/// its answer came, and how many replicas acknowledged it (0 for a lease without
/// `replicas`).
struct Answer {
    result: Result<bool, BackendError>,
    answered: Instant,
    acked: u32,
}

/// Phase 3: every due lease's compare-and-extend, each answer its own, the whole bounded
/// by the last lease end (each answer is then judged against its own lease's end, see
/// [`record`]). Leases without `replicas`: one round trip for all (locks in one batch,
/// permits in another, sent together; on a cluster, one primary that hangs fails its
/// keys only). Leases with `replicas`: per primary ([`Acknowledging::ack_group`]), their
/// compare-and-extends and the replicas' `WAIT` pipelined on one connection, so the
/// `WAIT` counts the renewals on the primary it reaches (one sent on another connection
/// could be acknowledged by a new primary that lacks them); a lease whose renewal too
/// few replicas acknowledged is retried, and one whose lease ends without one is lost,
/// as if it had failed. All of it at once.
async fn extend_due<'a>(
    backend: &Backend,
    tracked: &'a [Tracked],
    due: &[usize],
    sent: Instant,
    last_end: Instant,
) -> Vec<Answer> {
    // Read once: a nested acquisition may raise a lease's count meanwhile, and a lease
    // goes one way only.
    let wanted: Vec<(usize, u32)> = due
        .iter()
        .map(|&i| (i, tracked[i].lease.state.replicas.load(Ordering::Relaxed)))
        .collect();
    let plain: Vec<usize> = wanted
        .iter()
        .filter(|(_, n)| *n == 0)
        .map(|(i, _)| *i)
        .collect();
    // The replicated leases by primary: its group, the most replicas any of them wants,
    // and the leases.
    let mut groups: Vec<(u64, u32, Vec<usize>)> = Vec::new();
    for &(i, wants) in wanted.iter().filter(|(_, n)| *n > 0) {
        let group = backend.ack_group(&tracked[i].lease.key);
        match groups.iter_mut().find(|(g, _, _)| *g == group) {
            Some((_, n, leases)) => {
                *n = (*n).max(wants);
                leases.push(i);
            }
            None => groups.push((group, wants, vec![i])),
        }
    }
    let plain_answers = async {
        if plain.is_empty() {
            return Vec::new();
        }
        let renewed =
            match tokio::time::timeout_at(last_end, extend_batch(backend, tracked, &plain)).await {
                Ok(renewed) => renewed,
                Err(_) => vec![Err(BackendError::timeout(last_end - sent)); plain.len()],
            };
        let answered = Instant::now();
        plain
            .iter()
            .zip(renewed)
            .map(|(&i, result)| {
                (
                    i,
                    Answer {
                        result,
                        answered,
                        acked: 0,
                    },
                )
            })
            .collect()
    };
    let acked_answers =
        futures_util::future::join_all(groups.iter().map(|(_, n, leases)| async move {
            let extensions: Vec<Extension<'_>> = leases
                .iter()
                .map(|&i| {
                    let l = &tracked[i].lease;
                    Extension {
                        key: l.permit.as_deref().unwrap_or(&l.key),
                        token: &l.token,
                        ttl: l.ttl,
                        permit: l.permit.is_some(),
                    }
                })
                .collect();
            let timed_out = || Err(BackendError::timeout(last_end - sent));
            let alone = |e: Extension<'a>| async move {
                let reply =
                    tokio::time::timeout_at(last_end, backend.extend_acked_many(&[e], *n)).await;
                let answered = Instant::now();
                let (result, acked) = match reply {
                    Ok(Ok(a)) => (Ok(a.value.first().copied().unwrap_or(false)), a.replicas),
                    Ok(Err(e)) => (Err(e), 0),
                    Err(_) => (timed_out(), 0),
                };
                Answer {
                    result,
                    answered,
                    acked,
                }
            };
            let reply =
                tokio::time::timeout_at(last_end, backend.extend_acked_many(&extensions, *n)).await;
            let answered = Instant::now();
            let answers: Vec<Answer> = match reply {
                Ok(Ok(a)) => a
                    .value
                    .into_iter()
                    .map(|extended| Answer {
                        result: Ok(extended),
                        answered,
                        acked: a.replicas,
                    })
                    .collect(),
                // One reply's error fails the whole pipeline (one key of the slot moved
                // on in a migration, say): each lease alone then, so one key's trouble
                // is its own (the ones that were extended are extended again).
                Ok(Err(_)) if extensions.len() > 1 => {
                    futures_util::future::join_all(extensions.iter().copied().map(alone)).await
                }
                Ok(Err(e)) => vec![Answer {
                    result: Err(e),
                    answered,
                    acked: 0,
                }],
                Err(_) => leases
                    .iter()
                    .map(|_| Answer {
                        result: timed_out(),
                        answered,
                        acked: 0,
                    })
                    .collect(),
            };
            leases.iter().copied().zip(answers).collect::<Vec<_>>()
        }));
    let (plain_answers, acked_answers) =
        futures_util::future::join(plain_answers, acked_answers).await;
    // Back in `due`'s order.
    let mut answers: Vec<(usize, Answer)> = plain_answers
        .into_iter()
        .chain(acked_answers.into_iter().flatten())
        .collect();
    due.iter()
        .map(|&i| {
            let at = answers.iter().position(|(j, _)| *j == i);
            match at {
                Some(at) => answers.swap_remove(at).1,
                None => Answer {
                    result: Ok(false),
                    answered: Instant::now(),
                    acked: 0,
                },
            }
        })
        .collect()
}

/// The compare-and-extends of `leases` without `replicas`: locks in one batch, permits
/// in another, sent together; each answer its own, in `leases`' order.
async fn extend_batch(backend: &Backend, tracked: &[Tracked], leases: &[usize]) -> Extended {
    let batch = |permits: bool| -> Vec<(&str, &str, Duration)> {
        leases
            .iter()
            .map(|&i| &tracked[i].lease)
            .filter(|l| l.permit.is_some() == permits)
            .map(|l| (l.permit.as_deref().unwrap_or(&l.key), &*l.token, l.ttl))
            .collect()
    };
    let (locks, permits) = (batch(false), batch(true));
    if permits.is_empty() {
        return backend.extend_many(&locks).await;
    }
    let (locks, permits) = futures_util::future::join(
        async {
            match locks.is_empty() {
                true => Vec::new(),
                false => backend.extend_many(&locks).await,
            }
        },
        backend.extend_permits(&permits),
    )
    .await;
    let (mut locks, mut permits) = (locks.into_iter(), permits.into_iter());
    leases
        .iter()
        .map(|&i| match tracked[i].lease.permit {
            Some(_) => permits.next().unwrap_or(Ok(false)),
            None => locks.next().unwrap_or(Ok(false)),
        })
        .collect()
}

/// Phase 4: each due lease's outcome: renewed (its lease now runs from `sent`), retried
/// soon (a failed call, or too few acknowledgements), or lost (the key gone or another
/// token's), which leaves the watchdog.
fn record(tracked: &mut Vec<Tracked>, due: &[usize], renewed: Vec<Answer>, sent: Instant) {
    let retry_soon = |t: &mut Tracked| {
        t.due = Instant::now() + (t.lease.ttl / 10).max(Duration::from_millis(10));
    };
    let mut lost = Vec::new();
    for (&i, answer) in due.iter().zip(renewed) {
        let Answer {
            result,
            answered,
            acked,
        } = answer;
        let t = &mut tracked[i];
        // A renewal still under way when its lease ended does not keep the lock held:
        // the key may have expired meanwhile (the next tick finds the lease over).
        let result = match result {
            Ok(true) if answered >= t.lease_end => Err(BackendError::timeout(t.lease_end - sent)),
            result => result,
        };
        let extended = match result {
            Ok(extended) => extended,
            Err(e) => {
                t.lease.events.emit(
                    Event::RenewalFailed {
                        key: &t.lease.key,
                        error: &e,
                    },
                    t.lease.state.template,
                );
                retry_soon(t);
                continue;
            }
        };
        let wanted = t.lease.state.replicas.load(Ordering::Relaxed);
        if extended && wanted > acked {
            tracing::warn!(target: "distlock", key = &*t.lease.key, acked, "lock renewal not acknowledged by enough replicas; retrying");
            retry_soon(t);
        } else if extended {
            t.lease_end = sent + t.lease.ttl;
            t.lease.state.renewed(sent, t.lease.ttl);
            t.due = sent + t.lease.ttl / 3;
            t.lease
                .events
                .emit(Event::Renewed { key: &t.lease.key }, t.lease.state.template);
        } else {
            if !t.lease.state.is_released() {
                t.lease.state.mark_lost();
                t.lease.events.emit(
                    Event::Lost {
                        key: &t.lease.key,
                        found_at: "renewal",
                    },
                    t.lease.state.template,
                );
            }
            lost.push(i);
        }
    }
    for i in lost.into_iter().rev() {
        tracked.swap_remove(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A release retry trusts the lease only before its end less the margin, in the epoch
    /// it began in, and while the lock is not known lost.
    #[test]
    fn the_lease_is_trusted_only_within_its_epoch_and_end() {
        let since = Instant::now();
        let ttl = Duration::from_secs(10);
        let held = HeldState::new(
            since,
            ttl,
            Taking::Sent {
                epoch: 3,
                waited: false,
            },
            "t",
        );
        let margin = Duration::from_millis(2) + ttl / 100;
        assert!(held.surely_held_at(since, 3));
        assert!(held.surely_held_at(since + ttl - margin - Duration::from_millis(1), 3));
        assert!(
            !held.surely_held_at(since + ttl - margin, 3),
            "past the end less the margin"
        );
        assert!(
            !held.surely_held_at(since, 4),
            "a broken connection or restart since"
        );
        let handed = HeldState::new(since, ttl, Taking::Handed, "t");
        assert!(handed.was_contended() && !held.was_contended());
        assert!(
            !handed.surely_held_at(since, 3),
            "an unknown epoch is never trusted"
        );
        held.renewed(since + ttl, ttl);
        assert!(held.surely_held_at(since + ttl + ttl / 2, 3), "renewed");
        held.mark_lost();
        assert!(!held.surely_held_at(since, 3), "found lost");
    }
}
