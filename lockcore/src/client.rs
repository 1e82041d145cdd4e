//! The [`Locks`] client and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{
    Backend, Locking, memory::MemoryBackend, redis::RedisBackend, redlock::RedlockBackend,
};
use crate::error::{BackendError, BackendErrorKind, Error, Result};
use crate::events::{Event, Events};
use crate::local::LocalQueues;
use crate::notify::{Notifier, Source as NotifySource, Wakeups};
use crate::watchdog::Watchdog;

mod builder;
mod tls;

pub use builder::LocksBuilder;
#[cfg(feature = "tls")]
use tls::TlsMaterial;

/// Default key prefix: the lock on `order:42` lives at Redis key `lock:order:42`.
pub const DEFAULT_PREFIX: &str = "lock:";
/// Default bound on every Redis call, waiting for a connection included.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);

/// Default of [`LocksBuilder::connect_timeout`] (never shorter than the command timeout).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default of [`LocksBuilder::yield_window`].
pub const DEFAULT_YIELD_WINDOW: Duration = Duration::from_millis(10);

/// Default of [`LocksBuilder::fence_idle_window`]: a day.
pub const DEFAULT_FENCE_IDLE_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// A handle to the lock store, cheap to clone: every clone shares the same connections
/// (per tokio runtime: one multiplexed connection, re-opened when it breaks, one Pub/Sub
/// connection for waiters, and up to four direct connections that carry the lock
/// scripts while few calls are in flight, so an uncontended acquire or release costs
/// the round trip and not a hop through a connection's driver task).
///
/// ```no_run
/// # async fn demo() -> Result<(), lockcore::Error> {
/// use std::time::Duration;
/// let locks = lockcore::Locks::connect("redis://127.0.0.1:6379/").await?;
/// let guard = locks
///     .lock("order:42")
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(3))
///     .acquire()
///     .await?;
/// println!("fence {}", guard.fence().await?);
/// guard.release().await?; // Err(Error::Lost) if the lease ran out meanwhile
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locks {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// Shared with the renewal task, which holds it weakly.
    pub(crate) backend: Arc<Backend>,
    pub(crate) prefix: String,
    pub(crate) holder: String,
    /// Where the locks live, without credentials (for errors and `Debug`).
    pub(crate) target: String,
    /// How waiters hear of releases.
    pub(crate) wakeups: Wakeups,
    /// Where lock and idempotency steps are reported.
    pub(crate) events: Events,
    pub(crate) queues: Arc<LocalQueues>,
    /// Semaphores' local lines (see `local::Lines`).
    pub(crate) lines: Arc<crate::local::Lines>,
    pub(crate) watchdog: Watchdog,
    /// `<holder>:<random>`, unique to this client: what a yield marker names (see
    /// `release.lua`).
    pub(crate) client_id: String,
    /// How long it stays (zero: never left).
    pub(crate) yield_window: Duration,
    /// Replicas that must acknowledge a lock, fence or record unless a call says
    /// otherwise (see [`LocksBuilder::replicas`]).
    pub(crate) replicas: u32,
    /// How long a fence counter outlives its name's last fence (see
    /// [`LocksBuilder::fence_idle_window`]).
    pub(crate) fence_idle: Duration,
}

/// A client's settings besides its backend, as the builder collects them.
struct Settings {
    prefix: String,
    holder: Option<String>,
    yield_window: Duration,
    replicas: u32,
    fence_idle: Duration,
    events: Events,
}

impl Locks {
    /// Connects to the Redis at `url` with default settings and checks it answers `PING`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockcore::Error> {
    /// let locks = lockcore::Locks::connect("redis://127.0.0.1:6379/").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Locks> {
        Locks::builder(url).connect().await
    }

    /// Starts configuring a client for the Redis at `url`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let locks = lockcore::Locks::builder("redis://127.0.0.1:6379/")
    ///     .prefix("myapp:lock:")
    ///     .command_timeout(Duration::from_millis(500))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn builder(url: impl Into<String>) -> LocksBuilder {
        LocksBuilder::new(url.into())
    }

    /// Starts configuring a client for the Redis Cluster that these nodes belong to (any
    /// of its nodes will do: the others are found through them). Each lock's keys, and
    /// each idempotency record's, live in one hash slot; waiters are woken with sharded
    /// Pub/Sub (Redis 7.0+) on the node that owns the slot. The URL form
    /// `redis+cluster://host1:7000,host2:7001` given to [`Locks::builder`] (or in
    /// `REDIS_URL`) does the same.
    ///
    /// ```
    /// let locks = lockcore::Locks::cluster(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"])
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn cluster<S: AsRef<str>>(nodes: impl IntoIterator<Item = S>) -> LocksBuilder {
        let nodes: Vec<String> = nodes.into_iter().map(|n| n.as_ref().to_owned()).collect();
        let mut builder = Locks::builder(nodes.join(","));
        builder.nodes = Some(nodes);
        builder
    }

    /// Starts configuring a client for the Redis primary that these sentinels call
    /// `master`. The primary is found through the sentinels when a connection is made,
    /// and found again after a connection error, a `READONLY` reply (it was demoted) or a
    /// `+switch-master` message, without rebuilding the client. The primary is reached with
    /// the credentials and database of the first sentinel URL. The URL form
    /// `redis+sentinel://host1:26379,host2:26379/mymaster` given to [`Locks::builder`]
    /// (or in `REDIS_URL`) does the same (its credentials and database, as in
    /// `redis+sentinel://:password@host1:26379/mymaster/0`, are the primary's).
    ///
    /// The address the sentinels name is checked with `ROLE` where the user may run it;
    /// a least-privilege user (`+@all -@dangerous`, refused `ROLE` and `INFO`) trusts
    /// the sentinels instead, and leaves a server they named that was demoted since at
    /// its first `READONLY` reply. The sentinels themselves are reached with the same
    /// credentials (give the user to them too, with any rights there).
    ///
    /// During a failover calls fail with [`Error::Backend`] within their timeout. A
    /// failover loses the writes the old primary had not replicated: `replicas = 1`
    /// closes that hole for locks and records (see the crate docs).
    ///
    /// ```
    /// let locks = lockcore::Locks::sentinel("mymaster", ["redis://127.0.0.1:26379"])
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn sentinel<S: AsRef<str>>(
        master: impl Into<String>,
        sentinels: impl IntoIterator<Item = S>,
    ) -> LocksBuilder {
        let sentinels: Vec<String> = sentinels
            .into_iter()
            .map(|n| n.as_ref().to_owned())
            .collect();
        let master = master.into();
        let mut builder = Locks::builder(format!("{master} via {}", sentinels.join(",")));
        builder.sentinel = Some((master, sentinels));
        builder
    }

    /// Starts configuring a client that takes each lock on a quorum of independent Redis
    /// masters (Redlock; N/2+1 of N, five usually): `SET NX PX` on every master at once,
    /// each bounded by the command timeout; taken when a quorum set it with validity left
    /// (`ttl - elapsed - drift`, drift `ttl / 100 + 2 ms`); otherwise given back on every
    /// master. Release and renewal need a quorum too: a renewal that a quorum refuses
    /// means the lock is lost. Waiters retry after a random delay.
    ///
    /// `#[idempotent]` works over the same masters: each step of a record runs on every
    /// master and counts like a lock (a claim is the caller's on a quorum, a result is
    /// stored once a quorum stored it, so a later quorum of claims always meets it).
    ///
    /// What it does not give: fencing tokens (`fence()` returns an error: independent
    /// counters cannot give a number that always grows) and `replicas = n` (an error
    /// too). A master that restarts without persistence forgets
    /// its locks; Redlock's safety then rests on its clocks and on the restart waiting at
    /// least a ttl (`appendfsync always`, or a delayed start).
    ///
    /// ```
    /// let locks = lockcore::Locks::redlock([
    ///     "redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379",
    /// ])
    /// .build()
    /// .unwrap();
    /// ```
    pub fn redlock<S: AsRef<str>>(masters: impl IntoIterator<Item = S>) -> LocksBuilder {
        let masters: Vec<String> = masters.into_iter().map(|m| m.as_ref().to_owned()).collect();
        let mut builder = Locks::builder(masters.join(","));
        builder.redlock = Some(masters);
        builder
    }

    /// Locks kept in this process, with the same TTL, token, fencing, `Busy` and `Lost`
    /// rules as Redis: for unit tests of annotated code. Never chosen implicitly.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// let g = locks.lock("a").acquire().await.unwrap();
    /// assert!(matches!(locks.lock("a").acquire().await, Err(lockcore::Error::Busy { .. })));
    /// g.release().await.unwrap();
    /// # }
    /// ```
    pub fn in_memory() -> Locks {
        Locks::in_memory_events(Events::default())
    }

    /// [`in_memory`](Locks::in_memory), every lock and idempotency step also given to
    /// `observer` (see [`Event`] and [`LocksBuilder::observer`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory_observed(|event| println!("{}", event.name()));
    /// locks.lock("a").acquire().await.unwrap().release().await.unwrap();
    /// # }
    /// ```
    pub fn in_memory_observed(observer: impl Fn(&Event<'_>) + Send + Sync + 'static) -> Locks {
        Locks::in_memory_events(Events::new(Some(Arc::new(observer))))
    }

    fn in_memory_events(events: Events) -> Locks {
        Locks::in_memory_with(Settings {
            prefix: DEFAULT_PREFIX.to_owned(),
            holder: None,
            yield_window: Duration::ZERO,
            replicas: 0,
            fence_idle: DEFAULT_FENCE_IDLE_WINDOW,
            events,
        })
    }

    fn in_memory_with(settings: Settings) -> Locks {
        let memory = MemoryBackend::default();
        Locks::new(
            memory.wakeups(),
            memory.into(),
            "in-memory".to_owned(),
            settings,
        )
    }

    fn new(wakeups: Wakeups, backend: Backend, target: String, settings: Settings) -> Locks {
        let Settings {
            prefix,
            holder,
            yield_window,
            replicas,
            fence_idle,
            events,
        } = settings;
        let holder = sanitize_holder(&holder.unwrap_or_else(default_holder));
        let id = uuid::Uuid::new_v4().simple().to_string();
        let client_id = format!("{holder}:{}", &id[..12]);
        Locks {
            inner: Arc::new(Inner {
                backend: Arc::new(backend),
                prefix,
                wakeups: wakeups.for_client(&client_id),
                events,
                client_id,
                holder,
                target,
                queues: Arc::default(),
                lines: Arc::default(),
                watchdog: Watchdog::default(),
                yield_window,
                replicas,
                fence_idle,
            }),
        }
    }

    /// The key prefix, `lock:` unless configured.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The holder identity written after the UUID in every token (`host:pid` by default).
    pub fn holder_id(&self) -> &str {
        &self.inner.holder
    }

    /// Whether this is the [`in_memory`](Locks::in_memory) backend.
    pub fn is_in_memory(&self) -> bool {
        self.inner.backend.in_process()
    }

    /// Number of release channels this client is subscribed to on the current tokio
    /// runtime: one per key that has waiters, zero when nobody waits.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = lockcore::Locks::in_memory();
    /// assert_eq!(locks.waiting_channels(), 0);
    /// # }
    /// ```
    pub fn waiting_channels(&self) -> usize {
        self.inner.wakeups.active_channels()
    }

    /// Checks that the backend answers, within the command timeout.
    pub async fn ping(&self) -> Result<()> {
        self.inner
            .backend
            .ping()
            .await
            .map_err(|e| Error::backend(&self.inner.target, e))
    }
}

impl fmt::Debug for Locks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locks")
            .field("target", &self.inner.target)
            .field("prefix", &self.inner.prefix)
            .field("holder", &self.inner.holder)
            .finish()
    }
}

fn default_holder() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("{host}:{}", std::process::id())
}

/// Tokens must not carry hash-tag braces or whitespace.
fn sanitize_holder(holder: &str) -> String {
    holder
        .chars()
        .map(|c| {
            if c == '{' || c == '}' || c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
}
