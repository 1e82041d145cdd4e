//! Taking, holding and releasing one lock: the request and its contention here, the
//! guard and its release in `guard.rs`.

mod guard;
mod inspect;
mod multi;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::replicas::Acknowledging;
use crate::backend::{Attempt, Locking, ReleaseCall, Released, Successor, Try};
use crate::client::{Inner, Locks};
use crate::contention::{Contention, Next as Contended, in_flight};
use crate::error::{BackendError, Error, Result};
use crate::events::Event;
use crate::key;
use crate::local::{Entered, Next, Turn};
use crate::watchdog::{HeldState, RenewedLease, Taking};
pub use guard::LockGuard;
use guard::release_raw;
pub(crate) use inspect::KeyWalk;
pub use inspect::{Holder, LockState, Share};
pub use multi::{MultiLockGuard, MultiLockRequest};

/// What a request takes and its guard holds: a lock, or one of a semaphore's permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// The key holds one holder's token (`acquire.lua`, `release.lua`).
    Exclusive,
    /// One of this many permits of the semaphore at the key (`permit_*.lua`).
    Permit(u32),
    /// A share of the read lock at the key: the token in `{key}:readers`
    /// (`read_acquire.lua`, released and renewed as a permit).
    Read,
    /// The write lock at the key: a lock's token, taken once no reader holds
    /// (`write_acquire.lua`); released and renewed as a lock, never yielded.
    Write,
}

impl Shape {
    /// Whether holders share: a permit or a read share, whose token is in a sorted set
    /// ([`set`](Self::set)), not at the key.
    pub(crate) fn shares(self) -> bool {
        matches!(self, Shape::Permit(_) | Shape::Read)
    }

    /// The sorted set the holder's token is in, for a permit or a read share.
    pub(crate) fn set(self, key: &str) -> Option<String> {
        match self {
            Shape::Permit(_) => Some(key.to_owned()),
            Shape::Read => Some(key::companion(key, ":readers")),
            Shape::Exclusive | Shape::Write => None,
        }
    }

    /// The kind this shape takes (see [`key::Kind`]).
    pub(crate) fn kind(self) -> key::Kind {
        match self {
            Shape::Exclusive => key::Kind::Lock,
            Shape::Write => key::Kind::WriteLock,
            Shape::Read => key::Kind::ReadLock,
            Shape::Permit(_) => key::Kind::Semaphore,
        }
    }

    /// Whether a release wakes the waiters only when the last holder leaves (a read
    /// lock: only a writer waits for readers).
    pub(crate) fn wakes_on_last(self) -> bool {
        self == Shape::Read
    }

    /// What a holder of `self` may take again in the same task without a round trip:
    /// the same, or a read share under the write lock.
    fn reenters(self, inner: Shape) -> bool {
        self == inner || (self == Shape::Write && inner == Shape::Read)
    }
}

/// Default lease when `ttl` is not given.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

tokio::task_local! {
    /// The locks held by annotated code running in this task, outermost first.
    static CURRENT: Arc<[LockInfo]>;
}

/// What is known about a held lock: its key, its token, and its fencing token once
/// asked for.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let locks = lockcore::Locks::in_memory();
/// let guard = locks.lock("job").acquire().await.unwrap();
/// let info = guard.info().clone();
/// assert_eq!(info.key(), "lock:job");
/// let fence = info.fence().await.unwrap(); // from the clock, for a name's first fence
/// assert_eq!(guard.fence().await.unwrap(), fence);
/// # guard.release().await.unwrap();
/// # }
/// ```
#[derive(Clone)]
pub struct LockInfo {
    key: Arc<str>,
    token: Arc<str>,
    locks: Locks,
    /// Which client took it (reentrancy is per client and key).
    client: usize,
    shape: Shape,
    state: Arc<HeldState>,
}

impl LockInfo {
    /// A lock (or permit, by `shape`) just acquired through `locks` as `taking`, its
    /// lease running `ttl` from `since`.
    fn new(
        locks: &Locks,
        (key, token, shape): (Arc<str>, Arc<str>, Shape),
        since: Instant,
        ttl: Duration,
        taking: Taking,
        template: &'static str,
    ) -> Self {
        LockInfo {
            key,
            token,
            locks: locks.clone(),
            client: Arc::as_ptr(&locks.inner) as usize,
            shape,
            state: HeldState::new(since, ttl, taking, template),
        }
    }

    /// How many permits the semaphore this holds one of counts (`None`: a lock).
    pub fn permits(&self) -> Option<u32> {
        match self.shape {
            Shape::Permit(permits) => Some(permits),
            _ => None,
        }
    }

    /// Whether this is a share of a read lock (`Some(true)`), the write lock
    /// (`Some(false)`), or neither.
    pub fn is_read(&self) -> Option<bool> {
        match self.shape {
            Shape::Read => Some(true),
            Shape::Write => Some(false),
            _ => None,
        }
    }

    /// The full Redis key, prefix included (`lock:order:42`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The value stored at the key: a UUID v4, then the holder identity (`uuid:host:pid`).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The fencing token of this acquisition, assigned on the first call: pass it to
    /// storage that keeps the largest fence it has seen per resource and rejects writes
    /// that carry a smaller one.
    ///
    /// The first call is one round trip, a script that increments the key's fence
    /// counter while the key holds this lock's token: the number is this lock's fence;
    /// otherwise the lock is lost.
    /// Later calls (on any clone of this info, a reentrant guard or [`current_lock`]
    /// included) return the same number without a round trip. A lock that does not ask
    /// pays nothing.
    ///
    /// What it guarantees: a holder that obtains a fence after another holder obtained
    /// one gets a larger one. A holder paused past its ttl, whose lock another holder has
    /// taken since, either got its fence before (smaller than the next holder's, so its
    /// late write is rejected) or gets [`Error::Lost`] when it asks. Asking just before a
    /// commit is therefore also the "check that you still hold the lock" step; the
    /// fence is what makes that check safe against a pause between asking and writing.
    ///
    /// Errors: [`Error::Lost`] when the key no longer holds this lock's token (or lease
    /// keeping found it lost), [`Error::Backend`] when Redis fails (the next call tries
    /// again; a counter value consumed by a call whose reply was lost is skipped).
    ///
    /// Only the first call asks Redis whether the lock is held; later calls return the
    /// cached number without a round trip while the lease runs by this client's clock,
    /// and [`Error::Lost`] once it has ended or lease keeping found it lost (storage that
    /// compares fences stays the guard).
    ///
    /// Each fence is max(counter + 1, the server's clock in microseconds since the epoch),
    /// and the counter (`{<key>}:fence`) expires once the name has been given no fence
    /// for the client's [fence idle window](crate::LocksBuilder::fence_idle_window), never
    /// less than this lock's ttl. One made afresh (the first fence of a name, after the
    /// counter expired, or after it was lost: a restart of a Redis without persistence,
    /// `FLUSHDB`, eviction) starts from the clock, above every earlier fence (fewer than
    /// one a microsecond on average, and no clock step back as large as the window), so
    /// fences never go backwards. A Redis that may evict keys (any
    /// `maxmemory-policy` but `noeviction`) may evict the lock key itself too, which lets
    /// a second holder in; run Redis with `noeviction`: the client warns through
    /// `tracing` when it connects to one that may evict.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockcore::Error> {
    /// let locks = lockcore::Locks::in_memory();
    /// let guard = locks.lock("stock:7").acquire().await?;
    /// let fence = guard.fence().await?; // one round trip; storage rejects smaller fences
    /// assert_eq!(guard.fence().await?, fence); // cached
    /// guard.release().await?;
    /// let next = locks.lock("stock:7").acquire().await?;
    /// assert!(next.fence().await? > fence);
    /// # next.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn fence(&self) -> Result<u64> {
        let lost = || Error::Lost {
            key: self.key.to_string(),
        };
        if self.shape.shares() {
            return Err(Error::Unsupported {
                key: self.key.to_string(),
                reason: "a semaphore's permits and a read lock's shares are held side by \
                         side, and a fence orders the holders of a lock: ask the write \
                         lock or a lock for one"
                    .to_owned(),
            });
        }
        // Lost, or the lease ended by this client's clock: the cached number no longer
        // vouches for anything.
        if !self.state.check_held() {
            return Err(lost());
        }
        let backend = &self.locks.inner.backend;
        // Never shorter than the lease (see `LocksBuilder::fence_idle_window`).
        let idle = self.locks.inner.fence_idle.max(self.state.ttl());
        // Shared by every clone (a reentrant guard, `current_lock()`).
        self.state
            .fence
            .get_or_try_init(|| async {
                let replicas = self.state.replicas.load(std::sync::atomic::Ordering::Relaxed);
                let asked = if replicas == 0 {
                    backend.fence(&self.key, &self.token, idle).await
                } else {
                    match backend.fence_acked(&self.key, &self.token, idle, replicas).await {
                        Ok(a) if a.value.is_some() && a.replicas < replicas => {
                            tracing::warn!(target: "distlock", key = &*self.key, acked = a.replicas, wanted = replicas, "lock fence not given: too few replicas acknowledged it");
                            return Err(Error::NotReplicated {
                                key: self.key.to_string(),
                                acked: a.replicas,
                                wanted: replicas,
                            });
                        }
                        Ok(a) => Ok(a.value),
                        Err(e) => Err(e),
                    }
                };
                match asked {
                    Ok(Some(fence)) => {
                        self.locks.inner.events.emit(Event::Fenced {
                            key: &self.key,
                            fence,
                        }, self.state.template);
                        Ok(fence)
                    }
                    Ok(None) => {
                        self.state.mark_lost();
                        self.locks.inner.events.emit(Event::Lost {
                            key: &self.key,
                            found_at: "fence",
                        }, self.state.template);
                        Err(lost())
                    }
                    Err(e) => Err(Error::backend(&self.key, e)),
                }
            })
            .await
            .copied()
    }

    /// The fence if [`fence`](Self::fence) already assigned one, without a round trip.
    pub fn cached_fence(&self) -> Option<u64> {
        self.state.fence.get().copied()
    }

    /// Whether the lock is still believed held: `false` once its lease has ended by this
    /// client's clock (the ttl from the try that took it, or from the last renewal, less
    /// a small margin for clock rates), or lease keeping (`renew`) found it lost. No
    /// round trip: that the key was not taken early (`FLUSHDB`, eviction) only the
    /// release, or [`fence`](Self::fence)'s first call, tells.
    pub fn is_held(&self) -> bool {
        self.state.check_held()
    }

    /// Resolves when the lock is known to be lost: its lease ended (by this client's
    /// clock, whatever else lease keeping is doing), or lease keeping found it lost.
    /// Never resolves for a lock that stays held; without `renew`, it resolves at the
    /// end of the ttl.
    pub async fn lost(&self) {
        self.state.lost().await
    }
}

impl fmt::Debug for LockInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockInfo")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("fence", &self.cached_fence())
            .finish()
    }
}

/// The lock held by the annotated function running in this task, if any.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// assert!(lockcore::current_lock().is_none());
/// let locks = lockcore::Locks::in_memory();
/// let guard = locks.lock("job").acquire().await.unwrap();
/// let fence = guard
///     .scope(async { lockcore::current_lock().unwrap().fence().await })
///     .await
///     .unwrap();
/// assert_eq!(fence, guard.fence().await.unwrap());
/// # guard.release().await.unwrap();
/// # }
/// ```
pub fn current_lock() -> Option<LockInfo> {
    CURRENT.try_with(|held| held.last().cloned()).ok().flatten()
}

/// Whether annotated code running in this task holds a lock.
pub(crate) fn holds_lock() -> bool {
    CURRENT.try_with(|held| !held.is_empty()).unwrap_or(false)
}

/// The lock on `key` this task already holds through client `client`, if any.
fn held_in_task(key: &str, client: usize) -> Option<LockInfo> {
    CURRENT
        .try_with(|held| {
            held.iter()
                .find(|i| i.client == client && &*i.key == key)
                .cloned()
        })
        .ok()
        .flatten()
}

impl Locks {
    /// Starts a request for the lock named `name` (the Redis key is the prefix plus `name`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let guard = locks.lock("order:42").acquire().await.unwrap();
    /// assert_eq!(guard.key(), "lock:order:42");
    /// # guard.release().await.unwrap();
    /// # }
    /// ```
    pub fn lock(&self, name: impl Into<String>) -> LockRequest<'_> {
        LockRequest::new(self, name.into())
    }

    /// Starts a request for one of the `permits` permits of the semaphore named `name`
    /// (Redisson's `RPermitExpirableSemaphore`): the same builder as [`lock`](Self::lock),
    /// whose guard holds one permit. At most `permits` holders, of any client, hold one
    /// at a time.
    ///
    /// Every permit is a lease of its own: one whose holder dies frees itself when its
    /// ttl ends; `renew`, `max_hold`, `replicas` and [`Error::Lost`] at release work per
    /// permit as they do for a lock. A released permit wakes the waiters by message;
    /// this client's waiters for the same semaphore queue in FIFO order and only the
    /// first contends in Redis. A task that holds a permit and asks for the same
    /// semaphore again gets a reentrant guard on the permit it has.
    ///
    /// The semaphore is one sorted set at the key: each holder's token scored by when its
    /// lease ends, in ms since the epoch by the server's clock (`ZRANGE lock:gpu 0 -1
    /// WITHSCORES` in `redis-cli` lists them). The count is the caller's: clients that
    /// disagree on it each apply their own, so after lowering it in a deployment the
    /// smaller count holds as the permits taken under the larger one are given back.
    ///
    /// Not with `min_hold` (a run-once job wants a lock), not over Redlock (its
    /// masters cannot count holders together); a permit has no fence
    /// ([`Error::Unsupported`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let a = locks.semaphore("gpu", 2).acquire().await.unwrap();
    /// let b = locks.semaphore("gpu", 2).acquire().await.unwrap();
    /// let third = locks.semaphore("gpu", 2).acquire().await;
    /// assert!(matches!(third, Err(lockcore::Error::Busy { .. })));
    /// a.release().await.unwrap();
    /// let c = locks.semaphore("gpu", 2).acquire().await.unwrap();
    /// # b.release().await.unwrap();
    /// # c.release().await.unwrap();
    /// # }
    /// ```
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> LockRequest<'_> {
        let mut request = LockRequest::new(self, name.into());
        request.shape = Shape::Permit(permits);
        request
    }

    /// Starts a request for a share of the read lock named `name` (Redisson's
    /// `RReadWriteLock.readLock()`): the same builder as [`lock`](Self::lock). Readers
    /// of any client share the lock; [`write_lock`](Self::write_lock) excludes them.
    ///
    /// Writers come first: a reader that comes while a writer waits for the readers to
    /// leave queues behind that writer, so a steady stream of readers never starves a
    /// writer (the waiting writer keeps a mark, `{key}:writer`, renewed by its tries at
    /// least every 100 ms, that new readers respect). Each reader's share is a lease of
    /// its own in `{key}:readers` (a sorted set scored by the leases' ends, as a
    /// semaphore): a crashed reader's share frees itself at its ttl; `renew`,
    /// `max_hold`, `replicas` and [`Error::Lost`] at release apply per share. The last
    /// reader to leave wakes a waiting writer by message; a writer's release wakes the
    /// readers.
    ///
    /// A caller that stops waiting (its `wait` ran out, or it was cancelled) leaves its
    /// mark (a waiting writer's, or a reader's place before the next writer) until it
    /// ends, 300 ms at most.
    ///
    /// In one task: a holder of the write lock may take the read lock of the same name
    /// (it passes through, under the write lock), and a reader may take the read lock
    /// again; a reader asking for the write lock is refused with
    /// [`Error::Unsupported`] (an upgrade waits for its own share to leave: a deadlock).
    /// No `min_hold`, no fence for a share, not over Redlock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let a = locks.read_lock("config").acquire().await.unwrap();
    /// let b = locks.read_lock("config").acquire().await.unwrap(); // readers share
    /// let writer = locks.write_lock("config").acquire().await;
    /// assert!(matches!(writer, Err(lockcore::Error::Busy { .. })));
    /// a.release().await.unwrap();
    /// b.release().await.unwrap();
    /// let w = locks.write_lock("config").acquire().await.unwrap();
    /// # w.release().await.unwrap();
    /// # }
    /// ```
    pub fn read_lock(&self, name: impl Into<String>) -> LockRequest<'_> {
        let mut request = LockRequest::new(self, name.into());
        request.shape = Shape::Read;
        request
    }

    /// Starts a request for the write lock named `name`: held alone, excluding every
    /// reader and writer of the same name; see [`read_lock`](Self::read_lock). Its fence,
    /// renewal and release are a lock's; it never leaves the lock to other clients for
    /// a yield window (the waiting readers and writers contend when it is released).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let w = locks.write_lock("config").acquire().await.unwrap();
    /// let reader = locks.read_lock("config").acquire().await;
    /// assert!(matches!(reader, Err(lockcore::Error::Busy { .. })));
    /// w.release().await.unwrap();
    /// # }
    /// ```
    pub fn write_lock(&self, name: impl Into<String>) -> LockRequest<'_> {
        let mut request = LockRequest::new(self, name.into());
        request.shape = Shape::Write;
        request
    }
}

/// A request for one lock, made by [`Locks::lock`]; set `ttl` and `wait`, then `acquire`.
#[must_use = "a lock request does nothing until `.acquire().await`"]
#[derive(Debug)]
pub struct LockRequest<'a> {
    locks: &'a Locks,
    name: String,
    ttl: Duration,
    wait: Duration,
    renew: bool,
    max_hold: Option<Duration>,
    min_hold: Option<Duration>,
    replicas: Option<u32>,
    shape: Shape,
    template: &'static str,
}

/// The metrics' label of a lock taken without [`LockRequest::template`].
pub(crate) const UNNAMED: &str = "(unnamed)";

impl<'a> LockRequest<'a> {
    pub(crate) fn new(locks: &'a Locks, name: String) -> Self {
        LockRequest {
            locks,
            name,
            ttl: DEFAULT_TTL,
            wait: Duration::ZERO,
            renew: false,
            max_hold: None,
            min_hold: None,
            replicas: None,
            shape: Shape::Exclusive,
            template: UNNAMED,
        }
    }

    /// The key's template, `"order:<id>"` say: the label of this lock's metrics (feature
    /// `metrics`) and a field of its spans, so that their number does not grow with the
    /// keys (default `"(unnamed)"`). `#[distributed_lock]` gives its `key` literally.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let id = 42;
    /// let guard = locks.lock(format!("order:{id}")).template("order:<id>").acquire().await.unwrap();
    /// # guard.release().await.unwrap();
    /// # }
    /// ```
    pub fn template(mut self, template: &'static str) -> Self {
        self.template = template;
        self
    }

    /// Replicas that must acknowledge the lock once taken, and its fence once given
    /// (default: the client's, see [`LocksBuilder::replicas`](crate::LocksBuilder::replicas);
    /// 0 waits for none). Fewer within half the command timeout: the lock is given back
    /// and `acquire` returns [`Error::NotReplicated`]; the fence is not given. With
    /// `renew`, a renewal counts only once they acknowledged it (unacknowledged renewals
    /// are retried; a lease that ends without one is lost). A lock found gone before the
    /// acknowledgement (its lease already ended) was not taken: [`Error::Busy`]. The
    /// `WAIT` runs on a connection of its own, so a lagging replica slows only the calls
    /// that wait for it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory(); // in memory every count is acknowledged
    /// let guard = locks.lock("stock:7").replicas(1).acquire().await.unwrap();
    /// guard.release().await.unwrap();
    /// # }
    /// ```
    pub fn replicas(mut self, replicas: u32) -> Self {
        self.replicas = Some(replicas);
        self
    }

    /// Keeps the lease while the lock is held: renewed every `ttl / 3` with a
    /// compare-and-extend, batched with every other renewable lock of the client
    /// (default off). A renewal that finds the lock gone marks it lost
    /// ([`LockInfo::is_held`], [`LockGuard::lost`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let locks = lockcore::Locks::in_memory();
    /// let guard = locks
    ///     .lock("report")
    ///     .ttl(Duration::from_millis(300))
    ///     .renew(true)
    ///     .acquire()
    ///     .await
    ///     .unwrap();
    /// tokio::time::sleep(Duration::from_millis(700)).await; // longer than the ttl
    /// assert!(guard.info().is_held());
    /// guard.release().await.unwrap();
    /// # }
    /// ```
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// With [`renew`](Self::renew): stop renewing this long after acquisition, so a
    /// stuck holder cannot keep the lock forever. The lock then counts as lost when its
    /// last lease ends.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Keeps the lock at least this long after it was taken, even when it is released
    /// sooner (ShedLock's `lockAtLeastFor`): a release before then does not delete the
    /// key but sets its lease to end `min_hold` after the acquisition (one
    /// compare-and-extend, as a renewal), hands it to no waiter and wakes none; waiters
    /// take it when that lease ends. A release after `min_hold` is an ordinary one.
    ///
    /// For a job that runs on a schedule on every instance: with `wait` at zero, the
    /// instance that takes the lock runs the job and the others are told [`Error::Busy`]
    /// and skip it; `min_hold` keeps the lock for the rest of the period, so an instance
    /// whose clock or timer is a little late does not run the job a second time. Keep
    /// it shorter than the period, and no longer than `ttl` (the attribute requires it;
    /// here a longer one lengthens the lease past `ttl`).
    ///
    /// `min_hold` is counted from when the lock reached this client (never before the
    /// server took it), and the kept lease has the margin of a lease for clock drift. A
    /// nested acquisition of a lock the task holds keeps the outer one's `min_hold`. A
    /// lock given back for want of replicas is released at once. The kept lock's value
    /// is `<token> kept`: with `renew`, a renewal already in flight when the body ends
    /// no longer finds its token, so it cannot set the lease back to `ttl` (longer or
    /// shorter than `min_hold`; over Redlock, whose masters are written one by one, it
    /// still may).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let locks = lockcore::Locks::in_memory();
    /// let ran = locks.lock("job:report").min_hold(Duration::from_secs(60)).acquire().await.unwrap();
    /// ran.release().await.unwrap(); // the job took a moment
    /// // Another instance, a second later: the lock is still kept.
    /// let late = locks.lock("job:report").acquire().await;
    /// assert!(matches!(late, Err(lockcore::Error::Busy { .. })));
    /// # }
    /// ```
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.min_hold = Some(min_hold);
        self
    }

    /// The lease: how long the lock stays held if it is never released (default 30 s).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let locks = lockcore::Locks::in_memory();
    /// let g = locks.lock("a").ttl(Duration::from_millis(50)).acquire().await.unwrap();
    /// tokio::time::sleep(Duration::from_millis(80)).await;
    /// assert!(matches!(g.release().await, Err(lockcore::Error::Lost { .. })));
    /// # }
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long to keep trying while someone else holds the lock (default zero: one try,
    /// then [`Error::Busy`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// let locks = lockcore::Locks::in_memory();
    /// let held = locks.lock("a").acquire().await.unwrap();
    /// let busy = locks.lock("a").wait(Duration::from_millis(20)).acquire().await;
    /// assert!(matches!(busy, Err(lockcore::Error::Busy { .. })));
    /// held.release().await.unwrap();
    /// # }
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Takes the lock: one plain `SET key token NX PX ttl` when the key is free, retried
    /// (through a script that also takes over yield markers) until `wait` runs out. The
    /// fence is assigned only when asked for ([`LockGuard::fence`]).
    ///
    /// Errors: [`Error::Busy`] when still held by someone else at the deadline,
    /// [`Error::Backend`] when Redis fails (returned at once, within the command timeout),
    /// [`Error::InvalidKey`] for an empty key or one whose hash tag is malformed.
    ///
    /// A task that already holds the same key through the same client (an annotated fn
    /// calling another with the same key) gets a reentrant guard at once, without a
    /// round trip; only the outermost holder releases.
    pub async fn acquire(self) -> Result<LockGuard> {
        self.check_shape()?;
        let replicas = self.replicas.unwrap_or(self.locks.inner.replicas);
        let ttl = self.ttl;
        let guard = self.take().await?;
        if replicas == 0 {
            return Ok(guard);
        }
        if guard.reentrant {
            return guard.confirm_reentrant(replicas).await;
        }
        guard.confirm_replicated(ttl, replicas).await
    }

    /// A semaphore's request: permits to count, and no `min_hold`.
    fn check_shape(&self) -> Result<()> {
        let reason = match (self.shape, self.min_hold) {
            (Shape::Permit(0), _) => "a semaphore needs at least one permit",
            (Shape::Permit(_) | Shape::Read | Shape::Write, Some(_)) => {
                "`min_hold` keeps a lock for a run-once job; a semaphore's permits and a \
                 read/write lock are given back at release"
            }
            _ => return Ok(()),
        };
        Err(Error::Unsupported {
            key: format!("{}{}", self.locks.inner.prefix, self.name),
            reason: reason.to_owned(),
        })
    }

    /// [`acquire`](Self::acquire) without waiting for replicas.
    async fn take(self) -> Result<LockGuard> {
        let key = self.full_key()?;
        if let Some(outer) = held_in_task(&key, Arc::as_ptr(&self.locks.inner) as usize) {
            if !outer.shape.reenters(self.shape) {
                let reason = match (outer.shape, self.shape) {
                    (Shape::Read, Shape::Write) => {
                        "this task holds the read lock: the write lock would wait for its \
                         own share to leave; release the read lock first"
                    }
                    _ => "this task holds this key as another kind of lock",
                };
                return Err(Error::Unsupported {
                    key: key.to_string(),
                    reason: reason.to_owned(),
                });
            }
            tracing::trace!(target: "distlock", key = &*key, "lock re-entered");
            return Ok(LockGuard {
                locks: self.locks.clone(),
                info: outer,
                acquired_at: Instant::now(),
                keep_until: None,
                done: false,
                reentrant: true,
                turn: None,
            });
        }
        let started = Instant::now();
        let deadline = started + self.wait;
        let mut token = self.new_token();
        if self.shape.shares() {
            // A semaphore's waiters line up; one that does not wait, and readers (who
            // share), try at once.
            let line = if self.wait.is_zero() || self.shape == Shape::Read {
                None
            } else {
                // One line per count: a caller that counts more permits than the head
                // of another line may find one free that the head may not take.
                let line = match self.shape {
                    Shape::Permit(n) => crate::util::arc_str(format_args!("{key} {n}")),
                    _ => key.clone(),
                };
                let lines = &self.locks.inner.lines;
                match lines.enter(&line, deadline, self.template).await {
                    Some(line) => Some(line),
                    None => return Err(self.busy_here(&key, started)),
                }
            };
            let taken = self.contend(key, token, None, started, deadline).await;
            drop(line);
            return taken;
        }
        let turn = match self.enter_queue(&key, &token, deadline).await {
            Entered::Contend(turn) => turn,
            Entered::LeaseOver(turn) => {
                token = self.new_token();
                turn
            }
            Entered::Granted(turn, at) => {
                let turn = Some(turn);
                return Ok(self.taken(key, token, started, 0, turn, at, Taking::Handed));
            }
            Entered::Busy => return Err(self.busy_here(&key, started)),
        };
        self.contend(key, token, Some(turn), started, deadline)
            .await
    }

    /// `Busy` without a try in Redis: this client's own line did not reach the caller
    /// by its deadline.
    fn busy_here(&self, key: &str, started: Instant) -> Error {
        let waited = started.elapsed();
        self.locks.inner.events.emit(
            Event::Busy {
                key,
                waited,
                local: true,
            },
            self.template,
        );
        Error::Busy {
            key: key.to_string(),
            waited,
        }
    }

    /// One try in Redis, for a lock, a permit, or a read or write lock; `as_writer`: a
    /// lock that found readers holding the name tries as a writer (see [`Try::Readers`]).
    async fn try_once(
        &self,
        key: &str,
        token: &str,
        how: Attempt,
        deadline: Instant,
        as_writer: bool,
    ) -> Result<Try, BackendError> {
        let inner = &self.locks.inner;
        let mark = matches!(how, Attempt::Again(true));
        // Refused, a reader or writer keeps the other side out while it may try again
        // (see `read_acquire.lua`): its tries come at least every `LOCK_RETRY_CAP`, so
        // three of them bound its mark.
        let left = deadline.saturating_duration_since(Instant::now());
        let waiting = left.min(3 * LOCK_RETRY_CAP);
        let shape = match self.shape {
            Shape::Exclusive if as_writer && matches!(how, Attempt::Again(_)) => Shape::Write,
            shape => shape,
        };
        match shape {
            Shape::Read => {
                let backend = &inner.backend;
                backend.try_read(key, token, self.ttl, mark, waiting).await
            }
            Shape::Write => {
                let who = (inner.client_id.as_str(), mark);
                inner
                    .backend
                    .try_write(key, token, self.ttl, who, waiting)
                    .await
            }
            Shape::Exclusive => {
                let client = &inner.client_id;
                inner
                    .backend
                    .try_acquire(key, token, self.ttl, client, how)
                    .await
            }
            Shape::Permit(permits) => {
                inner
                    .backend
                    .try_permit(key, token, self.ttl, permits)
                    .await
            }
        }
    }

    /// What [`Error::WrongKind`] says when a try found `key` of another type
    /// (`WRONGTYPE`): a semaphore where a lock's kind was asked for, else what holds the
    /// key as a string (`readers`: a read lock; a token: a lock or a write lock).
    async fn wrong_kind(&self, key: &str) -> Error {
        let asked = self.shape.kind();
        let held = if asked != key::Kind::Semaphore {
            key::Kind::Semaphore
        } else {
            match self.locks.inner.backend.inspect(key).await {
                Ok(seen) if seen.value.as_deref() == Some(key::READERS_MARK) => key::Kind::ReadLock,
                Ok(seen) if !seen.readers.is_empty() => key::Kind::ReadLock,
                _ => key::Kind::Lock,
            }
        };
        Error::WrongKind {
            key: key.to_owned(),
            held,
            asked,
        }
    }

    /// The full key (prefix and name), checked.
    fn full_key(&self) -> Result<Arc<str>> {
        let key = crate::util::arc_str(format_args!("{}{}", self.locks.inner.prefix, self.name));
        let checked = key::check_key(&self.name)
            .and(key::check_key(&key))
            .and(key::check_lock_name(&self.name));
        match checked {
            Ok(()) => Ok(key),
            Err(reason) => Err(Error::InvalidKey {
                key: key.to_string(),
                reason: reason.to_owned(),
            }),
        }
    }

    /// A token no other try has used: `<uuid>:<holder>` (a write lock's UUID says so, see
    /// `key::token_uuid`).
    fn new_token(&self) -> Arc<str> {
        let holder = &self.locks.inner.holder;
        let uuid = key::token_uuid(self.shape.kind());
        crate::util::arc_str(format_args!("{uuid}:{holder}"))
    }

    /// This task's place in the key's local queue (see `local.rs`); a lock handed to it
    /// just as it gave up is released by its orphan guard.
    async fn enter_queue(&self, key: &Arc<str>, token: &Arc<str>, deadline: Instant) -> Entered {
        let orphan = {
            let (locks, key, token) = (self.locks.clone(), key.clone(), token.clone());
            let ttl = self.ttl;
            move |turn, at| drop(LockGuard::orphan(locks, key, token, at, ttl, turn))
        };
        let queues = &self.locks.inner.queues;
        let template = self.template;
        queues
            .enter(key, token, self.ttl, deadline, orphan, template)
            .await
    }

    /// At the head of the local queue (a lock's `turn`; a semaphore's line, held by the
    /// caller): tries against the backend, over the one contention loop, until taken,
    /// the deadline or an error.
    async fn contend(
        self,
        key: Arc<str>,
        mut token: Arc<str>,
        turn: Option<Turn>,
        started: Instant,
        deadline: Instant,
    ) -> Result<LockGuard> {
        let inner = &self.locks.inner;
        // Wake-ups are wanted: when the subscription cannot be had, back off instead.
        let mut contention = Contention::new(
            &inner.wakeups,
            (&key, crate::notify::channel_of),
            started,
            deadline,
            LOCK_RETRY_CAP,
            true,
        );
        if let Some(until) = turn.as_ref().and_then(Turn::left_to_others_until) {
            // This client just left the lock to the others: a try now would only find
            // its own yield marker. Wait for the next release or the window's end.
            contention.wait_before_trying(until).await;
        }
        // Counted as waiting from its first refusal until it holds, gives up or is dropped.
        let mut waiting = None;
        // Found readers holding the name: a writer's tries from then on.
        let mut as_writer = false;
        loop {
            // The lease is counted from before the try is sent: Redis starts it later, so
            // it never outlives the key.
            let sent = Instant::now();
            let epoch = inner.backend.epoch();
            // A waiter woken by messages registers, so the holder's release wakes it.
            let how = contention.waiter().map_or(Attempt::First, Attempt::Again);
            let tried = in_flight(self.try_once(&key, &token, how, deadline, as_writer), || {
                tracing::trace!(target: "distlock", key = &*key, "lock acquire cancelled with a try in flight; taking its token back");
                spawn_cleanup(self.locks.clone(), (key.clone(), token.clone(), self.shape));
            })
            .await;
            let left = match tried {
                Ok(Try::Taken) => {
                    let (tries, waited) = (contention.waits(), contention.waiter().is_some());
                    drop(contention);
                    let taking = Taking::Sent { epoch, waited };
                    return Ok(self.taken(key, token, started, tries, turn, sent, taking));
                }
                Ok(Try::Busy(left)) => {
                    if inner.backend.independent_writes() {
                        token = self.new_token();
                    }
                    left
                }
                Ok(Try::Readers(left)) => {
                    as_writer = true;
                    left
                }
                Err(source) => {
                    if source.is_transient() {
                        // The SET may have landed with its reply lost: take it back.
                        spawn_cleanup(self.locks.clone(), (key.clone(), token, self.shape));
                    }
                    let error = if source.is_wrong_type() {
                        self.wrong_kind(&key).await
                    } else {
                        Error::backend(&key, source)
                    };
                    inner.events.emit(
                        Event::AcquireFailed {
                            key: &key,
                            error: &error,
                        },
                        self.template,
                    );
                    return Err(error);
                }
            };
            waiting.get_or_insert_with(|| crate::metrics::Waiting::start(self.template));
            if let Contended::GiveUp(waited) = contention.refused(left).await {
                inner.events.emit(
                    Event::Busy {
                        key: &key,
                        waited,
                        local: false,
                    },
                    self.template,
                );
                return Err(Error::Busy {
                    key: key.to_string(),
                    waited,
                });
            }
        }
    }

    /// Builds the guard of a lock taken as `taking`, its lease running by this client's
    /// clock from `acquired_at`: when the try that took it was sent, or when the
    /// previous local holder's release that handed it over was.
    #[allow(clippy::too_many_arguments)]
    fn taken(
        self,
        key: Arc<str>,
        token: Arc<str>,
        started: Instant,
        attempt: u32,
        turn: Option<Turn>,
        acquired_at: Instant,
        taking: Taking,
    ) -> LockGuard {
        let inner = &self.locks.inner;
        let handed = taking == Taking::Handed;
        let held = (key, token, self.shape);
        let info = LockInfo::new(
            self.locks,
            held,
            acquired_at,
            self.ttl,
            taking,
            self.template,
        );
        let waited = started.elapsed();
        inner.events.emit(
            Event::Acquired {
                key: info.key(),
                waited,
                tries: attempt + 1,
                handed,
            },
            self.template,
        );
        let lease = if self.renew {
            crate::local::HolderLease::Renewed(info.state.clone())
        } else {
            crate::local::HolderLease::Until(acquired_at + self.ttl)
        };
        match &turn {
            Some(turn) if handed => turn.set_lease(lease),
            Some(turn) => turn.begin(lease),
            None => {}
        }
        if self.renew {
            inner.watchdog.register(
                &inner.backend,
                RenewedLease {
                    key: info.key.clone(),
                    token: info.token.clone(),
                    permit: self.shape.set(&info.key).map(Arc::from),
                    ttl: self.ttl,
                    acquired_at,
                    max_hold: self.max_hold,
                    state: info.state.clone(),
                    events: inner.events.clone(),
                },
            );
        }
        LockGuard {
            locks: self.locks.clone(),
            info,
            acquired_at,
            keep_until: self.min_hold.map(|m| Instant::now() + m),
            done: false,
            reentrant: false,
            turn,
        }
    }
}

/// Longest sleep between lock tries while subscribed: covers a missed release message
/// and a holder whose lease ran out without a release.
const LOCK_RETRY_CAP: Duration = Duration::from_millis(100);

/// Takes back `token` from `key`, where a try whose reply was lost may have written it:
/// at once, and once more a command timeout later, for a request that was itself late
/// and ran after the first clean-up (the token is this try's alone, so a second
/// compare-and-delete can only remove what the try wrote).
fn spawn_cleanup(locks: Locks, (key, token, shape): (Arc<str>, Arc<str>, Shape)) {
    // Outside a runtime the handed token stays until its ttl.
    crate::util::spawn_here(async move {
        let backend = &locks.inner.backend;
        for again in [false, true] {
            if again {
                tokio::time::sleep(backend.command_timeout()).await;
            }
            if let Some(set) = shape.set(&key) {
                let wake = (&*key, shape.wakes_on_last());
                let _ = backend.release_permit(&set, &token, wake).await;
            } else if !matches!(backend.delete_if(&key, &token).await, Ok(true)) {
                let held = (&*key, &*token, shape);
                let _ = release_raw(&locks.inner, held, None, false, None).await;
            }
        }
    });
}
