//! A held lock's guard, and every way it is released: by `release`, by a drop, and by
//! a release that is itself cancelled.

use super::*;

/// A held lock. Release it with [`release`](LockGuard::release) to learn whether it was
/// held to the end; dropping it instead schedules the release at once on the current
/// tokio runtime (a loss found then is only logged).
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    pub(super) locks: Locks,
    pub(super) info: LockInfo,
    pub(super) acquired_at: Instant,
    /// Until when a release keeps the lock by its lease (`LockRequest::min_hold`,
    /// counted from when the lock reached this client: its reply, or the handoff's
    /// wake-up, never before the server took it).
    pub(super) keep_until: Option<Instant>,
    pub(super) done: bool,
    /// A nested acquisition of a lock this task already holds: releases nothing.
    pub(super) reentrant: bool,
    /// This task's place at the head of the key's local queue, given up after release.
    pub(super) turn: Option<Turn>,
}

impl LockGuard {
    /// The guard of a lock handed to a waiter that gave up just then: dropped at once,
    /// it releases the lock (or hands it on).
    pub(super) fn orphan(
        locks: Locks,
        key: Arc<str>,
        token: Arc<str>,
        at: Instant,
        ttl: Duration,
        turn: Turn,
    ) -> Self {
        let held = (key, token, Shape::Exclusive);
        let info = LockInfo::new(&locks, held, at, ttl, Taking::Handed, super::UNNAMED);
        LockGuard {
            info,
            locks,
            acquired_at: at,
            keep_until: None,
            done: false,
            reentrant: false,
            turn: Some(turn),
        }
    }

    /// The full Redis key.
    pub fn key(&self) -> &str {
        self.info.key()
    }

    /// The token stored at the key.
    pub fn token(&self) -> &str {
        self.info.token()
    }

    /// The fence given to this acquisition so far, if any (for the annotated call's span).
    pub(crate) fn fence_given(&self) -> Option<u64> {
        self.info.state.fence.get().copied()
    }

    /// The fencing token of this acquisition, assigned on the first call; see
    /// [`LockInfo::fence`].
    pub async fn fence(&self) -> Result<u64> {
        self.info.fence().await
    }

    /// Key, token and fence together.
    pub fn info(&self) -> &LockInfo {
        &self.info
    }

    /// How long the lock has been held.
    pub fn held_for(&self) -> Duration {
        self.acquired_at.elapsed()
    }

    /// Whether this guard re-entered a lock its task already held.
    pub fn is_reentrant(&self) -> bool {
        self.reentrant
    }

    /// Resolves when lease keeping finds the lock lost; see [`LockInfo::lost`].
    pub async fn lost(&self) {
        self.info.lost().await
    }

    /// Runs `fut` with this lock visible through [`current_lock`] (and re-entrant for
    /// acquisitions of the same key in this task).
    pub async fn scope<F: Future>(&self, fut: F) -> F::Output {
        let mut held: Vec<LockInfo> = CURRENT.try_with(|held| held.to_vec()).unwrap_or_default();
        held.push(self.info.clone());
        CURRENT.scope(held.into(), fut).await
    }

    /// Waits for `replicas` to acknowledge this lock (just taken with lease `ttl`): the
    /// guard, or the lock given back and [`Error::NotReplicated`] (or `Lost` when it was
    /// no longer held, `Backend` when Redis failed).
    pub(super) async fn confirm_replicated(
        mut self,
        ttl: Duration,
        replicas: u32,
    ) -> Result<LockGuard> {
        self.info
            .state
            .replicas
            .store(replicas, std::sync::atomic::Ordering::Relaxed);
        let key = self.info.key.to_string();
        let backend = &self.locks.inner.backend;
        let confirmed = match self.info.shape.set(&self.info.key) {
            None => {
                backend
                    .confirm_lock(&self.info.key, &self.info.token, ttl, replicas)
                    .await
            }
            Some(set) => {
                backend
                    .confirm_permit(&set, &self.info.token, ttl, replicas)
                    .await
            }
        };
        let err = match confirmed {
            Ok(a) if a.value && a.replicas >= replicas => return Ok(self),
            Ok(a) if a.value => {
                tracing::warn!(target: "distlock", key, acked = a.replicas, wanted = replicas, "lock given back: too few replicas acknowledged it");
                Error::NotReplicated {
                    key,
                    acked: a.replicas,
                    wanted: replicas,
                }
            }
            // Gone before replicas could acknowledge it (its lease ended): not taken.
            Ok(_) => {
                self.info.state.mark_lost();
                Error::Busy {
                    key,
                    waited: self.acquired_at.elapsed(),
                }
            }
            Err(e) => Error::backend(&key, e),
        };
        // Given back, at once whatever `min_hold` says (the caller never had it); what
        // the release finds changes nothing for the caller.
        self.keep_until = None;
        let _ = self.release().await;
        Err(err)
    }

    /// A nested acquisition asking for more replicas than the outer one was confirmed
    /// with: the outer lease kept as it is (its expiry written again) and the replicas' `WAIT`, in one pipeline on one
    /// connection (see `backend::replicas`), and the count raised for the fence and
    /// renewals. The nested guard releases nothing when dropped: too few replicas or the
    /// key found gone is the nested call's error, and the outer holder's renewals judge
    /// its own lease.
    pub(super) async fn confirm_reentrant(self, replicas: u32) -> Result<LockGuard> {
        use std::sync::atomic::Ordering;
        let state = &self.info.state;
        if replicas <= state.replicas.load(Ordering::Relaxed) {
            return Ok(self);
        }
        let (key, token) = (&self.info.key, &self.info.token);
        if !state.check_held() {
            return Err(Error::Lost {
                key: key.to_string(),
            });
        }
        // The lease kept as it is on the server (its expiry written again, so that the
        // `WAIT` counts a write): the renewal task (and `max_hold`) keep deciding when it
        // ends, and a renewal in flight is never undone.
        let ttl = Duration::ZERO;
        let backend = &self.locks.inner.backend;
        let set = self.info.shape.set(key);
        // Boxed as a trait object: a rare path, and every acquisition's future (a
        // handler's among them) would otherwise carry its type, deep enough to overflow
        // the compiler's `Send` check.
        let confirmed: std::pin::Pin<Box<dyn Future<Output = _> + Send + '_>> = match &set {
            None => Box::pin(backend.confirm_lock(key, token, ttl, replicas)),
            Some(set) => Box::pin(backend.confirm_permit(set, token, ttl, replicas)),
        };
        match confirmed.await {
            Ok(a) if a.value && a.replicas >= replicas => {
                state.replicas.fetch_max(replicas, Ordering::Relaxed);
                Ok(self)
            }
            Ok(a) if a.value => Err(Error::NotReplicated {
                key: key.to_string(),
                acked: a.replicas,
                wanted: replicas,
            }),
            Ok(_) => {
                state.mark_lost();
                Err(Error::Lost {
                    key: key.to_string(),
                })
            }
            Err(e) => Err(Error::backend(key, e)),
        }
    }

    /// Releases the lock with a compare-and-delete.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let guard = locks.lock("order:42").acquire().await.unwrap();
    /// // ... the critical section, passing guard.fence().await? to storage ...
    /// guard.release().await.unwrap();
    /// # }
    /// ```
    ///
    /// Returns [`Error::Lost`] when the key was gone or held another token: the lease
    /// ran out (or was taken) while the lock was held, so the critical section may have
    /// overlapped with another holder's. A release whose reply is lost is retried once,
    /// and the retry never reports a release that happened as `Lost`: a retry that finds
    /// the key no longer holding the token before the lease could have ended (by this
    /// client's clock, counted from the try that took the lock or the last renewal, less
    /// a margin), with no sign since that Redis could have lost the key (a broken
    /// connection, a restart or failover seen as a new `run_id`), knows the lost try
    /// released it, which is success; otherwise the outcome cannot be told and the error
    /// is [`Error::Backend`]. A lock handed over by another task of the client has no
    /// such knowledge: its retry is never counted as success.
    ///
    /// When another task of the same client waits for the key, the release hands the
    /// lock to it in the same round trip (see [`LocksBuilder::yield_window`] for how turns
    /// pass between clients).
    ///
    /// A reentrant guard releases nothing; it reports `Lost` only if the lock is already
    /// known lost.
    ///
    /// [`LocksBuilder::yield_window`]: crate::LocksBuilder::yield_window
    pub async fn release(mut self) -> Result<()> {
        self.done = true;
        if self.reentrant {
            return if self.info.is_held() {
                Ok(())
            } else {
                Err(Error::Lost {
                    key: self.info.key().to_owned(),
                })
            };
        }
        // From here on the release finishes whatever happens to this future: cancelled
        // at any await, it goes on in a task of its own (see `Releasing`).
        self.releasing().finish().await
    }

    /// The release of this guard's lock, ready to run.
    fn releasing(&mut self) -> Releasing {
        self.info.state.mark_released();
        Releasing {
            locks: self.locks.clone(),
            token: self.info.token.clone(),
            state: self.info.state.clone(),
            info: self.info.clone(),
            held: self.acquired_at.elapsed(),
            keep_until: self.keep_until,
            turn: self.turn.take(),
            next: None,
            sent: None,
            recovering: false,
            finished: false,
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done || self.reentrant {
            return;
        }
        // Not started: dropping it starts it in a task of its own.
        drop(self.releasing());
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("info", &self.info)
            .finish()
    }
}

/// A release under way, owning all it needs to finish: the lock's token and lease, this
/// task's turn in the local queue and the waiter the release may hand the lock to.
///
/// Dropped before it finished (the caller's `release()` was cancelled at an await, or a
/// guard was dropped), it finishes in a task of its own on the current runtime. Once a
/// try may have been sent, that task's first try is a retry: it finds the lock still
/// held (and releases it, or hands it to the same waiter), handed to that waiter
/// already (and wakes it holding it), or released already.
struct Releasing {
    locks: Locks,
    info: LockInfo,
    held: Duration,
    /// Before this instant a release keeps the lock by its lease (`min_hold`); the
    /// task that finishes a cancelled release asks again, and releases if it has passed.
    keep_until: Option<Instant>,
    turn: Option<Turn>,
    /// The local waiter the try under way hands the lock to.
    next: Option<Next>,
    /// Whose lock the next try releases: the caller's, then a waiter's that gave up as
    /// the lock reached it; and that lock's lease.
    token: Arc<str>,
    state: Arc<HeldState>,
    /// When the first try that may have reached Redis was sent: a handoff a retry
    /// reports may date from then, and the waiter's lease is counted from it.
    sent: Option<Instant>,
    /// This is the task that finishes a dropped release: dropped too, it gives up (the
    /// lock then expires after its ttl).
    recovering: bool,
    finished: bool,
}

impl Releasing {
    /// Releases the lock, handing it to the next task of the local queue when one waits.
    /// A waiter that gives up just as the lock reaches it leaves it to this call, which
    /// releases it in turn; only the first release's outcome is returned.
    async fn finish(mut self) -> Result<()> {
        if let Some(result) = self.keep().await {
            self.finished = true;
            return result;
        }
        let mut result = None;
        loop {
            // A write lock is never handed down the local queue: readers that waited
            // behind it go first (`write_acquire.lua`); the next local writer contends.
            if self.next.is_none() && self.info.shape != Shape::Write {
                self.next = self.turn.as_ref().and_then(Turn::next);
            }
            let inner = &self.locks.inner;
            let retry = self.sent.is_some();
            let at = *self.sent.get_or_insert_with(Instant::now);
            let outcome = release_raw(
                inner,
                (self.info.key(), &self.token, self.info.shape),
                Some(&self.state),
                retry,
                self.next.as_ref().map(Next::successor),
            )
            .await;
            // No await from here to the next try: nothing below can be cancelled halfway.
            if let (Ok(Released::Yielded), Some(turn)) = (&outcome, &self.turn) {
                turn.left_to_others(at + inner.yield_window);
            }
            let handed = match (&outcome, self.next.take()) {
                (Ok(Released::Handed), Some(next)) => Some(next),
                (_, Some(next)) => {
                    let left = self.turn.as_ref().and_then(|turn| turn.give_back(next));
                    if let (Err(_), Some(token)) = (&outcome, left) {
                        // The failed try may have handed the lock to a waiter that has
                        // given up since: nobody would take it before its ttl.
                        let held = (self.info.key.clone(), token, Shape::Exclusive);
                        spawn_cleanup(self.locks.clone(), held);
                    }
                    None
                }
                (_, None) => None,
            };
            if result.is_none() {
                result = Some(report(&self.info, self.held, outcome));
            }
            let Some(next) = handed else {
                break;
            };
            let (next_token, next_ttl) = (next.token().clone(), next.successor().ttl);
            if self.turn.as_mut().is_some_and(|turn| turn.grant(next, at)) {
                break;
            }
            tracing::trace!(target: "distlock", key = self.info.key(), "local waiter left as the lock reached it; releasing it");
            self.token = next_token;
            self.state = HeldState::new(at, next_ttl, Taking::Handed, self.info.state.template);
            self.sent = None;
        }
        self.finished = true;
        result.unwrap_or(Ok(()))
    }

    /// A release before `min_hold` ran out: the lease set to end then (plus the margin
    /// of a lease for clock drift), by a compare-and-extend retried once on a transport
    /// failure; the lock handed to nobody. The local queue's turn passes on when this
    /// ends: the next task contends and waits for that lease. `None` once `min_hold` has
    /// passed (also between tries): an ordinary release follows, as a retry when a keep
    /// may have run.
    ///
    /// A retry (or the task finishing a cancelled keep) that finds the key gone or not
    /// holding the token cannot tell a keep of its own that ran (and whose shortened
    /// lease has ended) from a lost lock by the answer: by time it can, as a release
    /// retry does. While the lock's own lease surely runs, only this keep can have ended
    /// it: kept. Otherwise a `Backend` error says it cannot be told.
    async fn keep(&mut self) -> Option<Result<()>> {
        // Every release passes here: without `min_hold`, nothing is done.
        self.keep_until?;
        let inner = self.locks.inner.clone();
        let key = self.info.key.clone();
        let mut retried = false;
        loop {
            let left = self
                .keep_until?
                .checked_duration_since(Instant::now())
                .filter(|left| !left.is_zero())?;
            let left = left + left / 100 + Duration::from_millis(2);
            let retry = self.sent.is_some();
            self.sent.get_or_insert_with(Instant::now);
            let extended = match self.info.shape.set(&key) {
                // Marked kept: a renewal still in flight cannot set the lease back.
                None => inner.backend.keep(&key, &self.token, left).await,
                Some(set) => {
                    let lease = [(&*set, &*self.token, left)];
                    let extended = inner.backend.extend_permits(&lease).await;
                    extended.into_iter().next().unwrap_or(Ok(false))
                }
            };
            let (held, template) = (self.held, self.info.state.template);
            let kept = || {
                let event = Event::Kept {
                    key: &key,
                    held,
                    left,
                };
                inner.events.emit(event, template);
                Ok(())
            };
            return Some(match extended {
                Ok(true) => kept(),
                Ok(_) if retry => {
                    let (now, epoch) = (Instant::now(), inner.backend.epoch());
                    if self.state.surely_held_at(now, epoch) {
                        kept()
                    } else {
                        let error = Error::backend(
                            &key,
                            crate::error::BackendError::new(
                                crate::error::BackendErrorKind::Timeout,
                                "the reply of a keep (min_hold) was lost and the retry came \
                                 after the lease could have ended: whether it was kept \
                                 cannot be told",
                            ),
                        );
                        inner.events.emit(
                            Event::ReleaseFailed {
                                key: &key,
                                error: &error,
                            },
                            self.info.state.template,
                        );
                        Err(error)
                    }
                }
                Ok(_) => {
                    inner.events.emit(
                        Event::Lost {
                            key: &key,
                            found_at: "release",
                        },
                        self.info.state.template,
                    );
                    Err(Error::Lost {
                        key: key.to_string(),
                    })
                }
                Err(e) if !retried && e.is_transient() => {
                    retried = true;
                    continue;
                }
                Err(e) => {
                    let error = Error::backend(&key, e);
                    inner.events.emit(
                        Event::ReleaseFailed {
                            key: &key,
                            error: &error,
                        },
                        self.info.state.template,
                    );
                    Err(error)
                }
            });
        }
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let key = self.info.key();
        let handle = match tokio::runtime::Handle::try_current() {
            Ok(handle) if !self.recovering => handle,
            _ => {
                tracing::warn!(target: "distlock", key, "lock release dropped before it finished, outside a task that can finish it; the lock expires after its ttl");
                return;
            }
        };
        let rest = Releasing {
            locks: self.locks.clone(),
            info: self.info.clone(),
            held: self.held,
            keep_until: self.keep_until,
            turn: self.turn.take(),
            next: self.next.take(),
            token: self.token.clone(),
            state: self.state.clone(),
            sent: self.sent,
            recovering: true,
            finished: false,
        };
        tracing::trace!(target: "distlock", key, sent = self.sent.is_some(), "lock release cancelled; finishing it in a task of its own");
        self.finished = true;
        handle.spawn(async move {
            let _ = rest.finish().await;
        });
    }
}

/// One release (compare-and-delete, or a handoff to `next`), retried once on a
/// transport failure. `retry` is set when an earlier try may have run.
///
/// A retry that finds the key no longer holding `token` is told apart from a lost lock
/// by time, with no marker key written: before the lease in `lease` could have ended,
/// and with no sign that Redis lost keys since it began (`HeldState::surely_held_at`),
/// the key cannot have expired, and only this client's handoff writes `next`'s token,
/// so the earlier try released it (`Earlier`); otherwise it cannot be told (`Unknown`).
/// Without `lease` (a clean-up of a try whose reply was lost) it is never `Earlier`.
pub(super) async fn release_raw(
    inner: &Inner,
    (key, token, shape): (&str, &str, Shape),
    lease: Option<&HeldState>,
    mut retry: bool,
    next: Option<Successor<'_>>,
) -> std::result::Result<Released, Error> {
    // A read/write lock's writer never yields: its readers do not read yield markers.
    let yield_to = (!inner.yield_window.is_zero() && shape == Shape::Exclusive)
        .then_some((inner.client_id.as_str(), inner.yield_window));
    let set = shape.set(key);
    let call = ReleaseCall {
        key,
        token,
        successor: next,
        contended: lease.is_none_or(HeldState::was_contended),
        yield_to,
        // Only a yielding release that wakes waiters counts the channel's subscribers.
        self_subscribed: &|channel| inner.wakeups.may_count_self(channel),
    };
    let mut retried = false;
    // Whether a key found not ours on a retry means the earlier try released it: not
    // after a native compare-and-delete answered 0 (the lock may have been lost).
    let mut can_tell = true;
    loop {
        let released = match &set {
            None => inner.backend.release(&call).await,
            Some(set) => {
                let wake = (key, shape.wakes_on_last());
                inner.backend.release_permit(set, token, wake).await
            }
        };
        match released {
            Ok(Released::NotOurs) if retry => {
                // The reply arrived now, so Redis ran the call before now.
                let (now, epoch) = (Instant::now(), inner.backend.epoch());
                let within = can_tell && lease.is_some_and(|l| l.surely_held_at(now, epoch));
                return Ok(if within {
                    Released::Earlier
                } else {
                    Released::Unknown
                });
            }
            Ok(found) => return Ok(found),
            Err(e) if !retried && e.is_transient() => {
                retried = true;
                retry = true;
                can_tell &= !e.is_undecided();
            }
            Err(e) => return Err(Error::backend(key, e)),
        }
    }
}

/// The caller's view of one release's outcome, reported.
fn report(
    info: &LockInfo,
    held: Duration,
    outcome: std::result::Result<Released, Error>,
) -> Result<()> {
    let (events, key) = (&info.locks.inner.events, info.key());
    let failed = |error: Error| {
        events.emit(
            Event::ReleaseFailed { key, error: &error },
            info.state.template,
        );
        Err(error)
    };
    match outcome {
        Ok(Released::Now | Released::Yielded | Released::Earlier | Released::Handed) => {
            let handed = matches!(outcome, Ok(Released::Handed));
            events.emit(Event::Released { key, held, handed }, info.state.template);
            Ok(())
        }
        Ok(Released::NotOurs) => {
            events.emit(
                Event::Lost {
                    key,
                    found_at: "release",
                },
                info.state.template,
            );
            Err(Error::Lost {
                key: key.to_owned(),
            })
        }
        Ok(Released::Unknown) => failed(Error::backend(
            key,
            crate::error::BackendError::new(
                crate::error::BackendErrorKind::Timeout,
                "the release reply was lost and the retry came after the lease could \
                 have ended: whether this release came before the expiry cannot be told",
            ),
        )),
        Err(e) => failed(e),
    }
}
