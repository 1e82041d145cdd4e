//! The Redis backend: one multiplexed connection per client and tokio runtime,
//! reconnected when it breaks, plus a few direct connections for the lock scripts (see
//! [`super::direct`]); every call bounded by the command timeout.
//!
//! On a Redis Cluster the connection is a redis-rs cluster connection instead, built to
//! retry nothing itself: a command it re-sent after an I/O error might run twice (a
//! release that already deleted its key would then report the lock lost). Redirects
//! (`MOVED`, `ASK`) and the replies that say a command did not run (`TRYAGAIN`,
//! `CLUSTERDOWN`, no connection to the slot's node) are followed here, within the
//! command timeout; an I/O error reaches the caller, which knows whether a retry is safe.
//! Direct connections go to the primary that owns a key's slot (`direct_to_owner`), and
//! waking uses sharded Pub/Sub (see [`sharded`](super::scripts::sharded)).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncConnectionConfig, FromRedisValue, Script, ScriptInvocation};
use tokio::runtime::Handle;

use super::direct::{Direct, DirectTls, Place};
use super::native::Native;
use super::sentinel::SentinelTarget;
use super::{Attempt, ReleaseCall, Released, Try, millis};
use crate::error::{BackendError, BackendErrorKind};
use crate::key::Companion;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::ACQUIRE));
static UNLOCK: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::UNLOCK));
static RELEASE: LazyLock<[Script; 2]> =
    LazyLock::new(|| super::scripts::both(super::scripts::RELEASE));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::EXTEND));
static FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::FENCE));

/// How many runtimes' connections one client keeps: more than a service runs (actix-web
/// runs one per worker, and the default client is shared by all). The connection of a
/// runtime that shut down is found closed and dropped before this matters, where
/// distlock made its socket.
const MAX_RUNTIMES: usize = 64;

/// How long an idle direct connection of another runtime must have been unused before a
/// runtime that needs one closes it to make room: such a connection most likely belongs
/// to a runtime that shut down; one a live runtime uses now and then stays.
const RECLAIM_IDLE: Duration = Duration::from_secs(2);

/// How many direct connections one client keeps open at most (over all runtimes).
const MAX_DIRECT: usize = 4;

/// Direct connections serve a call only while fewer calls than this are in flight on
/// the client: under heavy concurrency the multiplexed connection pipelines many
/// commands per socket read and write, which costs redis-server less CPU per command.
const DIRECT_BELOW: usize = 3;

/// Where the backend connects.
// One per client, behind its `Arc` (see `Backend`).
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub(crate) enum Target {
    /// One server.
    Single(redis::Client),
    /// A Redis Cluster (built with no retries, see the module docs), and the settings
    /// of its first node (for a node redis-rs has no connection to, see `run_on`).
    Cluster(ClusterClient, redis::ConnectionInfo),
    /// The primary the sentinels name (see `sentinel.rs`).
    Sentinel(Arc<SentinelTarget>),
}

pub(crate) struct RedisBackend {
    target: Target,
    /// How direct connections speak TLS.
    tls: DirectTls,
    timeout: Duration,
    /// How long making a connection may take (see [`Self::connect`]).
    connect_timeout: Duration,
    /// Live connections and the runtimes they were born on: a connection's driver task
    /// dies with its runtime, so a call from another runtime opens its own. Kept short
    /// (the newest [`MAX_RUNTIMES`]), since a runtime that shut down leaves a dead entry.
    slots: Mutex<Vec<Slot>>,
    /// Connections being made, one per runtime at most (see [`Self::connect`]).
    pending: Mutex<Vec<Pending>>,
    generation: AtomicU64,
    /// Idle direct connections, newest last.
    idle: Arc<Mutex<Vec<Direct>>>,
    /// On a cluster, the primary of each slot range as last read (`CLUSTER SLOTS`), for
    /// direct connections; `None` until read, and again when a redirect showed it stale.
    owners: Arc<Mutex<Option<Vec<SlotOwner>>>>,
    /// On a cluster, the connections kept to nodes redis-rs has none to (see
    /// [`Self::plain_kept`]), by `host:port`.
    plain: Mutex<std::collections::HashMap<String, MultiplexedConnection>>,
    /// Whether a read of the slot owners is under way (one at a time, in a task).
    reading_owners: Arc<AtomicBool>,
    /// On a cluster, the `run_id` each node answered with when a direct connection to it
    /// was opened: another one means it restarted (see `epoch`).
    node_run_ids: Mutex<std::collections::HashMap<String, String>>,
    /// Direct connections open now, idle or in use.
    live: Arc<AtomicUsize>,
    /// Script calls in flight now.
    in_flight: AtomicUsize,
    /// Whether the address can be served by direct connections (one server).
    direct: bool,
    /// A cluster: scripts wake waiters with sharded Pub/Sub (see [`Self::script`]).
    sharded: bool,
    /// Whether the server's eviction policy was read (once per client, see
    /// [`warn_if_evicting`]).
    policy_checked: AtomicBool,
    /// Bumped on every sign that the server may have lost keys since: a connection broken
    /// by an I/O error, a failed connect, or a new connection to a server with another
    /// `run_id` (a restart, a failover). A release retry trusts its lease only within one
    /// epoch (see `lock.rs`, `release_raw`).
    epoch: Arc<AtomicU64>,
    /// The `run_id` of the server last connected to.
    run_id: Mutex<Option<String>>,
    /// Whether a server refused to tell its `run_id` (warned about once).
    run_id_refused: AtomicBool,
    /// What the server last connected to has natively (read on every new multiplexed
    /// connection; cleared when the server refuses a native command).
    native: Mutex<Native>,
    /// Whether the server takes `SET ... NX GET` (Redis 7.0+); cleared on its first
    /// syntax error, after which lock tries and claims go through their scripts only.
    pub(super) set_nx_get: AtomicBool,
}

/// A connection being made for one runtime, in a task of its own (see
/// [`RedisBackend::connect`]).
struct Pending {
    runtime: tokio::runtime::Id,
    /// Behind Sentinel: the count of new primaries announced when it began.
    switched: u64,
    id: u64,
    outcome: Outcome,
    /// Set by the task when the attempt failed (it counted the failure in `epoch`
    /// itself): such an attempt is not handed to a later call.
    failed: Arc<AtomicBool>,
    abort: tokio::task::AbortHandle,
}

/// What a connection attempt gave: the connection, what the server said of itself, and
/// the flag its socket sets when it closes (where distlock made the socket).
type Made = Result<
    (
        Conn,
        Option<(Native, Option<String>)>,
        Option<Arc<AtomicBool>>,
    ),
    BackendError,
>;

/// An attempt's result for every call awaiting it; `None`: the attempt was aborted (a
/// newer one replaced it, or its runtime shut down).
type Outcome = futures_util::future::Shared<futures_util::future::BoxFuture<'static, Option<Made>>>;

/// A runtime's connection, or the attempt to make it.
enum Attempting {
    Made((Conn, u64)),
    Under(u64, Outcome),
}

/// Numbers connection attempts.
static ATTEMPTS: AtomicU64 = AtomicU64::new(0);

impl Drop for RedisBackend {
    /// Connections still being made are of no use once the client is gone.
    fn drop(&mut self) {
        for attempt in crate::util::lock(&self.pending).drain(..) {
            attempt.abort.abort();
        }
    }
}

struct Slot {
    runtime: tokio::runtime::Id,
    conn: Conn,
    generation: u64,
    /// Behind Sentinel: the count of new primaries announced when it was made.
    switched: u64,
    /// Set when its socket closed (see `direct::Watched`); `None` where redis-rs made the
    /// socket (a cluster, or TLS that direct connections cannot speak).
    closed: Option<Arc<AtomicBool>>,
}

impl RedisBackend {
    /// One server.
    pub(crate) fn new(client: redis::Client, timeout: Duration, tls: DirectTls) -> Self {
        let direct = Direct::serves(client.get_connection_info(), &tls);
        Self::with(Target::Single(client), timeout, tls, direct)
    }

    /// Redis behind Sentinel. Direct connections stay off: a primary that was demoted
    /// keeps its connections.
    pub(crate) fn sentinel(target: Arc<SentinelTarget>, timeout: Duration) -> Self {
        Self::with(
            Target::Sentinel(target),
            timeout,
            DirectTls::default(),
            false,
        )
    }

    /// A Redis Cluster; `client` retries nothing itself (see the module docs).
    pub(crate) fn cluster(
        client: ClusterClient,
        base: redis::ConnectionInfo,
        timeout: Duration,
        tls: DirectTls,
    ) -> Self {
        let direct = Direct::serves(&base, &tls);
        Self::with(Target::Cluster(client, base), timeout, tls, direct)
    }

    /// Connections may take `timeout` to make (at least the command timeout).
    pub(crate) fn connect_within(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(self.timeout);
        self
    }

    fn with(target: Target, timeout: Duration, tls: DirectTls, direct: bool) -> Self {
        let sharded = matches!(target, Target::Cluster(..));
        RedisBackend {
            tls,
            target,
            timeout,
            connect_timeout: timeout,
            slots: Mutex::new(Vec::new()),
            pending: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            idle: Arc::new(Mutex::new(Vec::new())),
            owners: Arc::new(Mutex::new(None)),
            reading_owners: Arc::new(AtomicBool::new(false)),
            node_run_ids: Mutex::new(std::collections::HashMap::new()),
            plain: Mutex::new(std::collections::HashMap::new()),
            live: Arc::new(AtomicUsize::new(0)),
            in_flight: AtomicUsize::new(0),
            direct,
            sharded,
            policy_checked: AtomicBool::new(false),
            epoch: Arc::new(AtomicU64::new(0)),
            run_id: Mutex::new(None),
            run_id_refused: AtomicBool::new(false),
            native: Mutex::new(Native::default()),
            set_nx_get: AtomicBool::new(true),
        }
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether this is a Redis Cluster.
    pub(super) fn is_cluster(&self) -> bool {
        self.sharded
    }

    /// Which of a script's two forms this server runs: sharded Pub/Sub on a cluster.
    pub(super) fn script<'s>(&self, pair: &'s [Script; 2]) -> &'s Script {
        &pair[usize::from(self.sharded)]
    }

    /// The current epoch (see the field).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// A connection broke or could not be made: the server may have restarted.
    fn broke(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// A new connection reached the server with `run_id`: another one than before means
    /// a restart or a failover.
    ///
    /// A new connection to a server whose `run_id` cannot be read (an ACL without `INFO`,
    /// the usual least-privilege user; `INFO` renamed) may reach a server that restarted
    /// unseen: it counts as such a sign, so a release retry never trusts its lease across
    /// it (see `lock.rs`, `release_raw`).
    fn observe(&self, run_id: Option<&str>) {
        let Some(id) = run_id else {
            self.unknown_server();
            return;
        };
        let mut known = crate::util::lock(&self.run_id);
        if known.as_deref() != Some(id) {
            if known.is_some() {
                tracing::debug!(target: "distlock", run_id = id, "redis answers with another run_id: restarted or failed over");
                self.broke();
            }
            *known = Some(id.to_owned());
        }
    }

    /// A new connection reached a server whose `run_id` it could not read: counted as a
    /// possible restart (see [`Self::observe`]), with a warning once per client.
    fn unknown_server(&self) {
        self.broke();
        if !self.run_id_refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                target: "distlock",
                "redis refused `INFO server` (an ACL without @dangerous?): a restart cannot be \
                 told from the run_id, so every new connection counts as one; a release whose \
                 reply was lost then reports an unknown outcome (`Backend`) rather than trust \
                 that its first try released the lock"
            );
        }
    }

    /// An idle direct connection of this runtime, or a new one while fewer than
    /// [`MAX_DIRECT`] are open and it opens within a quarter of the command timeout (see
    /// [`Self::open_direct`]); `None` sends the call over the multiplexed connection.
    async fn take_direct(
        &self,
        runtime: tokio::runtime::Id,
    ) -> Result<Option<Direct>, BackendError> {
        let Target::Single(client) = &self.target else {
            return Ok(None);
        };
        if !self.direct {
            return Ok(None);
        }
        let info = client.get_connection_info();
        self.take_direct_to(runtime, info).await
    }

    /// [`take_direct`](Self::take_direct) to the server `info` names.
    async fn take_direct_to(
        &self,
        runtime: tokio::runtime::Id,
        info: &redis::ConnectionInfo,
    ) -> Result<Option<Direct>, BackendError> {
        let addr = info.addr().to_string();
        while let Some(mut found) = self.idle_of(runtime, &addr) {
            if found.is_broken() {
                // Closed by the server: its idle `timeout`, `CLIENT KILL`, or a restart
                // that may have lost keys (see `epoch`).
                tracing::debug!(target: "distlock", "an idle direct connection was closed by redis; replacing it");
                self.broke();
                continue;
            }
            self.first_use(&mut found);
            return Ok(Some(found));
        }
        let place = match Place::take(&self.live, MAX_DIRECT) {
            Some(place) => place,
            None => {
                // Make room by closing one left by another runtime (most likely one
                // that has shut down: unused for a while); otherwise every direct
                // connection is busy, or used by live runtimes, and the call goes over
                // the multiplexed one (closing theirs would only move the churn there).
                let mut idle = crate::util::lock(&self.idle);
                let Some(other) = idle.iter().position(|d| {
                    (d.runtime() != runtime || d.addr() != addr) && d.idle_for() >= RECLAIM_IDLE
                }) else {
                    return Ok(None);
                };
                drop(idle.remove(other));
                drop(idle);
                match Place::take(&self.live, MAX_DIRECT) {
                    Some(place) => place,
                    None => return Ok(None),
                }
            }
        };
        let mut opening = self.open_direct(runtime, info.clone(), place);
        let waited = match tokio::time::timeout(self.timeout / 4, &mut opening).await {
            Ok(waited) => waited.map_err(drop),
            Err(_) => {
                // Closed first: from here the task keeps what it makes (the idle pool),
                // unless it had sent it already.
                opening.close();
                opening.try_recv().map_err(|_| ())
            }
        };
        match waited {
            Ok(Ok(mut opened)) => {
                self.first_use(&mut opened);
                Ok(Some(opened))
            }
            Ok(Err(e)) => {
                if !self.sharded {
                    self.broke();
                }
                Err(e.into())
            }
            // Still opening (it goes on, into the idle pool), or its runtime is shutting
            // down: the multiplexed (or cluster) connection takes the call.
            Err(()) => Ok(None),
        }
    }

    /// Opens a direct connection in a task of its own. The call waits for it a while
    /// (see `take_direct_to`); when the call has stopped waiting, the connection goes
    /// into the idle pool for the next call, so that opening it (a TLS handshake,
    /// `AUTH`, naming the connection, reading the `run_id`, each a round trip) never
    /// makes a call miss its timeout again and again on a slow link. Within the connect
    /// timeout.
    fn open_direct(
        &self,
        runtime: tokio::runtime::Id,
        info: redis::ConnectionInfo,
        place: Place,
    ) -> tokio::sync::oneshot::Receiver<redis::RedisResult<Direct>> {
        let (tls, idle, within) = (self.tls.clone(), self.idle.clone(), self.connect_timeout);
        // Where it fails with nobody waiting: on one server, a sign that it may have
        // restarted (see `epoch`); on a cluster, a node that cannot be reached: the slot
        // owners are read again.
        let failed: Box<dyn FnOnce() + Send> = if self.sharded {
            let owners = self.owners.clone();
            Box::new(move || *crate::util::lock(&owners) = None)
        } else {
            let epoch = self.epoch.clone();
            Box::new(move || {
                epoch.fetch_add(1, Ordering::AcqRel);
            })
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        crate::util::spawn_here(async move {
            let open = Direct::open(&info, &tls, runtime, place);
            let opened = match tokio::time::timeout(within, open).await {
                Ok(opened) => opened,
                Err(_) => Err(io::Error::from(io::ErrorKind::TimedOut).into()),
            };
            match tx.send(opened) {
                Ok(()) => {}
                Err(Ok(opened)) => {
                    tracing::debug!(target: "distlock", addr = opened.addr(), "opened a direct connection to redis after its call went on without it");
                    crate::util::lock(&idle).push(opened);
                }
                Err(Err(e)) => {
                    tracing::debug!(target: "distlock", error = %e, "a direct connection could not be opened");
                    failed();
                }
            }
        });
        rx
    }

    /// Before each use of a direct connection: on its first, the server's `run_id` it
    /// read when opened is compared with the one known (another one means a restart, see
    /// `epoch`).
    fn first_use(&self, direct: &mut Direct) {
        let Some(id) = direct.take_run_id() else {
            return;
        };
        let Some(id) = id.as_deref() else {
            self.unknown_server();
            return;
        };
        if self.sharded {
            // A cluster's nodes each have their own `run_id`.
            let mut known = crate::util::lock(&self.node_run_ids);
            if known
                .insert(direct.addr().to_owned(), id.to_owned())
                .is_some_and(|was| was != id)
            {
                self.broke();
            }
        } else {
            self.observe(Some(id));
        }
    }

    /// The newest idle direct connection of `runtime`, taken out of the pool.
    fn idle_of(&self, runtime: tokio::runtime::Id, addr: &str) -> Option<Direct> {
        let mut idle = crate::util::lock(&self.idle);
        let at = idle
            .iter()
            .rposition(|d| d.runtime() == runtime && d.addr() == addr)?;
        Some(idle.swap_remove(at))
    }

    fn give_back(&self, mut conn: Direct) {
        conn.went_idle();
        crate::util::lock(&self.idle).push(conn);
    }

    /// A direct connection after a call that got `reply` on it: back to the pool while
    /// it is in step (an answer, or an error the server sent); else closed, with the idle
    /// ones (they likely share its fate), and the break counted.
    fn done_with<T>(&self, conn: Direct, reply: &redis::RedisResult<T>) {
        match reply {
            Err(e) if !matches!(e.kind(), redis::ErrorKind::Server(_)) => {
                drop(conn);
                self.drop_idle();
                self.broke();
            }
            _ => self.give_back(conn),
        }
    }

    /// Closes every idle direct connection (one broke: the others likely share its fate).
    fn drop_idle(&self) {
        let stale = std::mem::take(&mut *crate::util::lock(&self.idle));
        drop(stale);
    }

    fn cached(&self, runtime: tokio::runtime::Id) -> Option<(Conn, u64)> {
        if let Target::Sentinel(target) = &self.target {
            // Its listener ends with the runtime it ran on: another one takes over.
            target.listen();
        }
        let switched = self.switched();
        let mut slots = crate::util::lock(&self.slots);
        let closed = |s: &Slot| s.closed.as_ref().is_some_and(|c| c.load(Ordering::Acquire));
        if slots.iter().any(|s| s.switched != switched || closed(s)) {
            // The sentinels announced a new primary, or a connection's socket closed
            // (the server or the network closed it): connect again.
            slots.retain(|s| s.switched == switched && !closed(s));
            self.broke();
        }
        slots
            .iter()
            .find(|s| s.runtime == runtime)
            .map(|s| (s.conn.clone(), s.generation))
    }

    /// Behind Sentinel, the count of new primaries announced; else 0.
    fn switched(&self) -> u64 {
        match &self.target {
            Target::Sentinel(target) => target.switched(),
            _ => 0,
        }
    }

    async fn connection(&self) -> Result<(Conn, u64), BackendError> {
        current_runtime()?;
        let runtime = self.connection_runtime()?.id();
        if let Some(found) = self.cached(runtime) {
            return Ok(found);
        }
        self.connect(runtime).await
    }

    /// The runtime whose tasks drive the connection that calls from this one use: the
    /// caller's own, or on a cluster the runtime of the client library's own thread (see
    /// [`cluster_runtime`]).
    fn connection_runtime(&self) -> Result<Handle, BackendError> {
        if self.sharded
            && let Some(shared) = cluster_runtime()
        {
            return Ok(shared.clone());
        }
        Handle::try_current().map_err(|_| {
            BackendError::new(BackendErrorKind::Config, "called outside a tokio runtime")
        })
    }

    /// A new connection for `runtime`, unless another call made one.
    ///
    /// It is made in a task of its own, one per runtime at a time, that every call
    /// needing it awaits: a call that gives up (its timeout, or its caller cancelled it)
    /// leaves the attempt running for the next one. So a connection that takes longer
    /// than one command timeout to make (a TLS handshake, then the sentinels' answer and
    /// another handshake, on a loaded machine) is still made, instead of being started
    /// again and given up at every call. The attempt is bounded by its own steps'
    /// timeouts.
    async fn connect(&self, runtime: tokio::runtime::Id) -> Result<(Conn, u64), BackendError> {
        // A few turns at most: each waits for an attempt, except where one ended at once
        // (its runtime shutting down cancels every task it spawns), which must not spin.
        for _ in 0..4 {
            let (id, outcome) = match self.attempt(runtime)? {
                Attempting::Made(found) => return Ok(found),
                Attempting::Under(id, outcome) => (id, outcome),
            };
            let made = outcome.await;
            // The first call back takes the result: installs the connection. Under
            // `pending`'s lock, so that no call starts another attempt in between.
            let mut pending = crate::util::lock(&self.pending);
            let Some(at) = pending.iter().position(|p| p.id == id) else {
                match made {
                    // Aborted because a newer attempt (for the primary the sentinels
                    // name now) replaced it, or installed by another call: on to that.
                    None | Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(e),
                }
            };
            let attempt = pending.remove(at);
            return match made {
                Some(Ok((conn, server, closed))) => {
                    Ok(self.install(runtime, attempt.switched, conn, server, closed))
                }
                // Counted in `epoch` by the attempt itself.
                Some(Err(e)) => Err(e),
                // Its task ended without a result (its runtime shutting down), and
                // nothing replaced it.
                None => Err(BackendError::new(
                    BackendErrorKind::Connection,
                    "the connection attempt ended without a result (its runtime shutting down?)",
                )),
            };
        }
        Err(BackendError::new(
            BackendErrorKind::Connection,
            "no connection: every attempt ended early",
        ))
    }

    /// The connection of `runtime` if there is one now, else the attempt under way for
    /// it, else a new one. Attempts that failed (their callers gone, or they would have
    /// been removed), that began before the sentinels announced a new primary, or that
    /// belong to runtimes beyond the newest [`MAX_RUNTIMES`], are dropped.
    fn attempt(&self, runtime: tokio::runtime::Id) -> Result<Attempting, BackendError> {
        use futures_util::FutureExt;
        use tracing::instrument::WithSubscriber as _;
        let handle = self.connection_runtime()?;
        let mut pending = crate::util::lock(&self.pending);
        if let Some(found) = self.cached(runtime) {
            return Ok(Attempting::Made(found));
        }
        let switched = self.switched();
        pending.retain(|p| {
            let keep = p.switched == switched && !p.failed.load(Ordering::Acquire);
            if !keep {
                p.abort.abort();
            }
            keep
        });
        if let Some(p) = pending.iter().find(|p| p.runtime == runtime) {
            return Ok(Attempting::Under(p.id, p.outcome.clone()));
        }
        if pending.len() >= MAX_RUNTIMES {
            // The oldest, most likely of a runtime that has shut down.
            pending.remove(0).abort.abort();
        }
        let failed = Arc::new(AtomicBool::new(false));
        let task = {
            let (failed, epoch) = (failed.clone(), self.epoch.clone());
            let making = make(
                self.target.clone(),
                self.tls.clone(),
                self.connect_timeout,
                self.timeout,
            );
            handle.spawn(
                async move {
                    let made = making.await;
                    if made.is_err() {
                        // A failed connect: the server may have restarted (see `epoch`).
                        epoch.fetch_add(1, Ordering::AcqRel);
                        failed.store(true, Ordering::Release);
                    }
                    made
                }
                .with_current_subscriber(),
            )
        };
        let abort = task.abort_handle();
        let outcome = async move { task.await.ok() }.boxed().shared();
        let id = ATTEMPTS.fetch_add(1, Ordering::Relaxed);
        pending.push(Pending {
            runtime,
            switched,
            id,
            outcome: outcome.clone(),
            failed,
            abort,
        });
        Ok(Attempting::Under(id, outcome))
    }

    /// Makes `conn` the connection of `runtime`, with what its server said of itself.
    fn install(
        &self,
        runtime: tokio::runtime::Id,
        switched: u64,
        conn: Conn,
        server: Option<(Native, Option<String>)>,
        closed: Option<Arc<AtomicBool>>,
    ) -> (Conn, u64) {
        if let Some((native, run_id)) = server {
            self.observe(run_id.as_deref());
            *crate::util::lock(&self.native) = native;
        }
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let native = self.native();
        let mut slots = crate::util::lock(&self.slots);
        slots.retain(|s| s.runtime != runtime);
        if slots.len() >= MAX_RUNTIMES {
            slots.remove(0);
        }
        slots.push(Slot {
            runtime,
            conn: conn.clone(),
            generation,
            switched,
            closed,
        });
        tracing::debug!(target: "distlock", generation, ?native, "connected to redis");
        (conn, generation)
    }

    /// On this client's first call only: reads the eviction policy over the multiplexed
    /// connection (opened now), in a task of its own.
    async fn check_policy_once(&self) {
        if self.policy_checked.load(Ordering::Relaxed)
            || self.policy_checked.swap(true, Ordering::Relaxed)
        {
            return;
        }
        if let Ok((Conn::Single(conn), _)) = self.connection().await {
            tokio::spawn(warn_if_evicting(conn, self.timeout));
        }
    }

    /// What the server last connected to has natively.
    pub(super) fn native(&self) -> Native {
        *crate::util::lock(&self.native)
    }

    /// The server refused a native command: scripts only until the next connection's
    /// detection.
    fn refuse_native(&self, e: &dyn std::fmt::Display) {
        tracing::debug!(target: "distlock", error = %e, "redis refused a native conditional command; using scripts");
        *crate::util::lock(&self.native) = Native::default();
    }

    /// A call on the multiplexed connection of `generation` failed with `e`: a connection
    /// that broke is dropped (the next call reconnects) and counts as a sign of lost keys
    /// (see `epoch`); a server error reply leaves it in use.
    fn failed(&self, generation: u64, e: redis::RedisError) -> BackendError {
        // READONLY: the server was demoted (a failover); the command did not run.
        let demoted = e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
        if demoted || e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
            self.forget(generation);
            self.broke();
        }
        BackendError::from(e)
    }

    /// Drops the connection of `generation` so the next call reconnects.
    fn forget(&self, generation: u64) {
        let mut slots = crate::util::lock(&self.slots);
        slots.retain(|s| s.generation != generation);
    }

    /// Runs one script invocation (EVALSHA, loading the script on NOSCRIPT) within the
    /// timeout, over a direct connection when one is free.
    pub(crate) async fn eval<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, BackendError> {
        self.call(Call::Script(invocation)).await
    }

    /// Runs one plain command within the timeout, over a direct connection when one is
    /// free.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, BackendError> {
        self.call(Call::Cmd(cmd)).await
    }

    /// Runs a pipeline (a `MULTI` one too) within the timeout, over a direct connection
    /// when one is free.
    pub(crate) async fn query_pipe<T: FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, BackendError> {
        self.call(Call::Pipe(pipe)).await
    }

    /// Runs a pipeline within the timeout on a connection no other call uses meanwhile:
    /// an idle or new direct connection whatever the calls in flight (to the current
    /// primary behind Sentinel, to the slot's owner on a cluster), else (every direct one
    /// busy, or TLS) a connection of its own, closed after. For pipelines that end in
    /// `WAIT`, which holds its connection while replicas catch up: on a connection other
    /// calls share, one lagging replica would stall every call to its primary.
    pub(crate) async fn query_pipe_alone<T: FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, BackendError> {
        let call = async {
            let runtime = current_runtime()?;
            let client = match &self.target {
                Target::Single(client) => {
                    if let Some(mut direct) = self.take_direct(runtime).await? {
                        let reply = Call::Pipe(pipe).run::<T, _>(&mut direct).await;
                        self.done_with(direct, &reply);
                        return reply.map_err(BackendError::from);
                    }
                    client.clone()
                }
                Target::Sentinel(target) => {
                    let client = target.current(self.timeout).await?;
                    if let Some(reply) = self.pipe_on_primary(runtime, &client, pipe).await {
                        return reply;
                    }
                    client
                }
                // A cluster: a direct connection to the slot's owner (read now if the map
                // is not known); the shared one only where none can be had (every direct
                // one busy, TLS, or a slot moving).
                Target::Cluster(..) => {
                    if self.direct
                        && let Some(key) = pipe_key(pipe)
                    {
                        self.read_owners_now().await;
                        let what = Call::Pipe(pipe);
                        if let Some(reply) =
                            Box::pin(self.direct_to_slot_owner(runtime, &key, what)).await
                        {
                            return reply;
                        }
                        // Every direct connection busy: one of its own to the owner.
                        if let Some(node) = self.owner_of(&key) {
                            let mut own = self.plain_to(&node).await?;
                            match Call::Pipe(pipe).run::<T, _>(&mut own).await {
                                Err(e) if AtNode::of(&e, false).is_some() => {
                                    *crate::util::lock(&self.owners) = None;
                                }
                                reply => return reply.map_err(BackendError::from),
                            }
                        }
                    }
                    return self.call_on_shared(Call::Pipe(pipe)).await;
                }
            };
            let mut own = client
                .get_multiplexed_async_connection()
                .await
                .inspect_err(|_| self.broke())?;
            Call::Pipe(pipe)
                .run::<T, _>(&mut own)
                .await
                .map_err(BackendError::from)
        };
        // Boxed: making a connection of its own (behind Sentinel too) is a large future,
        // which the callers' futures would carry whether they wait for replicas or not.
        self.within_timeout(&AtomicU64::new(0), Box::pin(call).as_mut())
            .await
    }

    /// Runs `cmd`, an `EVALSHA` of `script` built by [`evalsha`], loading the script on
    /// NOSCRIPT: the hot paths' scripts, without a `ScriptInvocation` per call.
    async fn evalsha_call<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &redis::Cmd,
    ) -> Result<T, BackendError> {
        self.call(Call::Evalsha(script, cmd)).await
    }

    async fn call<T: FromRedisValue>(&self, what: Call<'_, '_>) -> Result<T, BackendError> {
        let used = AtomicU64::new(0);
        let call = async {
            let runtime = current_runtime()?;
            self.check_policy_once().await;
            let _in_flight = InFlight::enter(&self.in_flight);
            if _in_flight.before < DIRECT_BELOW
                && let Some(mut direct) = self.take_direct(runtime).await?
            {
                let reply = what.run::<T, _>(&mut direct).await;
                self.done_with(direct, &reply);
                return reply.map_err(BackendError::from);
            }
            if _in_flight.before < DIRECT_BELOW
                && self.sharded
                && let Some(reply) = Box::pin(self.direct_to_owner(runtime, what)).await
            {
                return reply;
            }
            let (conn, generation) = self.connection().await?;
            used.store(generation, Ordering::Relaxed);
            let reply = self
                .run_on(conn.clone(), what)
                .await
                .map_err(|e| self.failed(generation, e));
            self.read_owners_if_unknown(conn);
            reply
        };
        tokio::pin!(call);
        self.within_timeout(&used, call).await
    }

    /// A connection of its own to the cluster node `node` names, with the first node's
    /// settings (credentials, TLS).
    async fn plain_to(&self, node: &AtNode) -> redis::RedisResult<MultiplexedConnection> {
        self.plain_making(node)?.await
    }

    /// [`plain_to`](Self::plain_to), as a future that borrows nothing.
    fn plain_making(
        &self,
        node: &AtNode,
    ) -> redis::RedisResult<
        impl Future<Output = redis::RedisResult<MultiplexedConnection>> + Send + 'static,
    > {
        let Target::Cluster(_, base) = &self.target else {
            return Err((redis::ErrorKind::Client, "not a cluster").into());
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(None);
        let client = redis::Client::open(node_info(base, node.host.clone(), node.port))?;
        Ok(async move {
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
        })
    }

    /// A connection to the cluster node `node` names for following a redirect there (a
    /// node redis-rs has no connection to: one that joined after it read the map), kept
    /// for the next redirect to that node: a migration answers `ASK` then `TRYAGAIN`
    /// round after round. Made on the cluster connections' runtime (see
    /// [`cluster_runtime`]), so that it serves every runtime.
    async fn plain_kept(&self, node: &AtNode) -> redis::RedisResult<MultiplexedConnection> {
        let addr = format!("{}:{}", node.host, node.port);
        if let Some(conn) = crate::util::lock(&self.plain).get(&addr) {
            return Ok(conn.clone());
        }
        tracing::debug!(target: "distlock", host = %node.host, port = node.port, "redirected to a cluster node redis-rs has no connection to; connecting");
        let making = self.plain_making(node)?;
        let conn = match cluster_runtime() {
            Some(rt) => rt.spawn(making).await.map_err(|e| {
                redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "connecting to a cluster node",
                    e.to_string(),
                ))
            })??,
            None => making.await?,
        };
        let mut kept = crate::util::lock(&self.plain);
        if kept.len() >= MAX_RUNTIMES {
            kept.clear();
        }
        kept.insert(addr, conn.clone());
        Ok(conn)
    }

    /// A kept connection to a cluster node failed: the next redirect there makes another.
    fn forget_plain(&self, node: &AtNode) {
        crate::util::lock(&self.plain).remove(&format!("{}:{}", node.host, node.port));
    }

    /// Behind Sentinel, `pipe` over a direct connection to the primary `client` names
    /// (kept for the next such call, not opened and closed each time). `None`: no direct
    /// connection can be had (every one busy, or TLS), and the caller makes its own.
    /// One that answers `READONLY` (a demoted primary) is closed, with the idle ones.
    async fn pipe_on_primary<T: FromRedisValue>(
        &self,
        runtime: tokio::runtime::Id,
        client: &redis::Client,
        pipe: &redis::Pipeline,
    ) -> Option<Result<T, BackendError>> {
        let info = client.get_connection_info();
        if !Direct::serves(info, &self.tls) {
            return None;
        }
        let mut direct = match self.take_direct_to(runtime, info).await {
            Ok(Some(direct)) => direct,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        let reply = Call::Pipe(pipe).run::<T, _>(&mut direct).await;
        let demoted = matches!(&reply, Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly));
        if demoted {
            drop(direct);
            self.drop_idle();
            self.broke();
        } else {
            self.done_with(direct, &reply);
        }
        Some(reply.map_err(BackendError::from))
    }

    /// The primary that owns the slot of `key`, as last read.
    fn owner_of(&self, key: &[u8]) -> Option<AtNode> {
        let slot = crate::key::slot(key);
        let owners = crate::util::lock(&self.owners);
        let (_, _, host, port) = owners
            .as_ref()?
            .iter()
            .find(|(start, end, _, _)| *start <= slot && slot <= *end)?;
        Some(AtNode {
            host: host.clone(),
            port: *port,
            asking: false,
        })
    }

    /// On a cluster whose slot owners are not known, reads them now (`CLUSTER SLOTS`, one
    /// node, within the command timeout) for a call that needs a direct connection.
    async fn read_owners_now(&self) {
        if crate::util::lock(&self.owners).is_some() {
            return;
        }
        let Ok((Conn::Cluster(mut conn), _)) = self.connection().await else {
            return;
        };
        let read = conn.route_command(
            redis::cmd("CLUSTER").arg("SLOTS").to_owned(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        );
        if let Ok(Ok(ranges)) = tokio::time::timeout(self.timeout, read).await {
            *crate::util::lock(&self.owners) = Some(slot_owners(&ranges));
        }
    }

    /// On a cluster, `what` over a direct connection to the primary that owns its key's
    /// slot, as last read. `None`: no such connection, or the node answered that the
    /// command did not run there (a redirect: the map is read again), and the cluster
    /// connection takes the call.
    async fn direct_to_owner<T: FromRedisValue>(
        &self,
        runtime: tokio::runtime::Id,
        what: Call<'_, '_>,
    ) -> Option<Result<T, BackendError>> {
        let key = what.single_key()?;
        self.direct_to_slot_owner(runtime, &key, what).await
    }

    /// [`direct_to_owner`](Self::direct_to_owner) for the slot of `key`.
    async fn direct_to_slot_owner<T: FromRedisValue>(
        &self,
        runtime: tokio::runtime::Id,
        key: &[u8],
        what: Call<'_, '_>,
    ) -> Option<Result<T, BackendError>> {
        let Target::Cluster(_, base) = &self.target else {
            return None;
        };
        if !self.direct {
            return None;
        }
        let owner = self.owner_of(key)?;
        let info = node_info(base, owner.host, owner.port);
        // A node that cannot be reached directly: the map is read again (also when an
        // open that outlived the call's wait fails, see `open_direct`), and the cluster
        // connection decides. `take_direct_to` waits at most a quarter of the timeout.
        let mut direct = match self.take_direct_to(runtime, &info).await {
            Ok(Some(direct)) => direct,
            Ok(None) => return None,
            Err(_) => {
                *crate::util::lock(&self.owners) = None;
                return None;
            }
        };
        let reply = what.run::<T, _>(&mut direct).await;
        if let Err(e) = &reply {
            match e.kind() {
                // The slot has another owner: read them again. The old one may have
                // failed over, losing what it had not replicated (see `epoch`).
                redis::ErrorKind::Server(redis::ServerErrorKind::Moved) => {
                    drop(direct);
                    self.broke();
                    *crate::util::lock(&self.owners) = None;
                    return None;
                }
                // Migrating or settling: the owners stand; the cluster path follows it.
                redis::ErrorKind::Server(
                    redis::ServerErrorKind::Ask
                    | redis::ServerErrorKind::TryAgain
                    | redis::ServerErrorKind::ClusterDown,
                ) => {
                    self.give_back(direct);
                    return None;
                }
                _ => {}
            }
        }
        self.done_with(direct, &reply);
        Some(reply.map_err(BackendError::from))
    }

    /// On a cluster whose slot owners are not known (first use, or a redirect), reads
    /// them (`CLUSTER SLOTS`, one node) for the direct connections: in a task of its own,
    /// one at a time, within the command timeout, so no call waits for it.
    fn read_owners_if_unknown(&self, conn: Conn) {
        if !self.direct || crate::util::lock(&self.owners).is_some() {
            return;
        }
        let Conn::Cluster(mut conn) = conn else {
            return;
        };
        if self.reading_owners.swap(true, Ordering::AcqRel) {
            return;
        }
        let (owners, reading, timeout) = (
            self.owners.clone(),
            self.reading_owners.clone(),
            self.timeout,
        );
        crate::util::spawn_here(async move {
            let read = conn.route_command(
                redis::cmd("CLUSTER").arg("SLOTS").to_owned(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            );
            if let Ok(Ok(ranges)) = tokio::time::timeout(timeout, read).await {
                *crate::util::lock(&owners) = Some(slot_owners(&ranges));
            }
            reading.store(false, Ordering::Release);
        });
    }

    /// `what` on the shared connection (not a direct one), without a timer of its own:
    /// for a caller already within the timeout.
    async fn call_on_shared<T: FromRedisValue>(
        &self,
        what: Call<'_, '_>,
    ) -> Result<T, BackendError> {
        let (conn, generation) = self.connection().await?;
        self.run_on(conn, what)
            .await
            .map_err(|e| self.failed(generation, e))
    }

    /// `what` on `conn`; on a cluster, following redirects and waiting out the replies
    /// that say the command did not run (see the module docs).
    async fn run_on<T: FromRedisValue>(
        &self,
        conn: Conn,
        what: Call<'_, '_>,
    ) -> redis::RedisResult<T> {
        match conn {
            Conn::Single(mut conn) => what.run::<T, _>(&mut conn).await,
            // Boxed: the redirect loop's state (a connection being made among it) would
            // otherwise make every call's future, on one server too, several times larger.
            Conn::Cluster(conn) => Box::pin(self.run_on_cluster(conn, what)).await,
        }
    }

    /// [`run_on`](Self::run_on) on a cluster connection.
    async fn run_on_cluster<T: FromRedisValue>(
        &self,
        mut conn: ClusterConnection,
        what: Call<'_, '_>,
    ) -> redis::RedisResult<T> {
        let mut at: Option<AtNode> = None;
        let mut round = 0u32;
        loop {
            let reply = match &at {
                None => what.run::<T, _>(&mut conn).await,
                Some(node) => match what.run::<T, _>(&mut node.on(&mut conn)).await {
                    // A node redis-rs has no connection to (a new one, which owned no
                    // slot when it read the map): a plain connection of its own.
                    Err(e) if e.kind() == redis::ErrorKind::ClusterConnectionNotFound => {
                        match self.plain_kept(node).await {
                            Ok(mut plain) => {
                                let reply = what.run::<T, _>(&mut node.on_plain(&mut plain)).await;
                                if matches!(&reply, Err(e) if !matches!(e.kind(), redis::ErrorKind::Server(_)))
                                {
                                    self.forget_plain(node);
                                }
                                reply
                            }
                            // Not reachable yet (a node reconnecting after a failover):
                            // wait and route by slot again, below.
                            Err(_) => Err(e),
                        }
                    }
                    reply => reply,
                },
            };
            let e = match reply {
                Err(e) if round < MAX_REDIRECTS => e,
                reply => return reply,
            };
            round += 1;
            tracing::trace!(target: "distlock", error = %e, round, "redis cluster redirect or try-again");
            if round > 3 {
                // Redirects that keep coming (a slot map being rebuilt): not in a spin.
                let pause = Duration::from_millis(u64::from(round.min(10)) * 2);
                tokio::time::sleep(pause).await;
            }
            at = match e.kind() {
                redis::ErrorKind::Server(redis::ServerErrorKind::Moved) => {
                    // The slot has another owner: after a failover, keys the old one had
                    // not replicated are gone.
                    self.broke();
                    AtNode::of(&e, false)
                }
                redis::ErrorKind::Server(redis::ServerErrorKind::Ask) => AtNode::of(&e, true),
                // A transaction whose commands were redirected while queued: nothing ran,
                // and the redirect itself was not returned. A probe of its key finds it.
                redis::ErrorKind::Server(redis::ServerErrorKind::ExecAbort) => {
                    match what.first_key().map(|key| {
                        let mut probe = redis::cmd("TYPE");
                        probe.arg(key);
                        probe
                    }) {
                        Some(probe) => match probe.query_async::<String>(&mut conn).await {
                            Err(e)
                                if e.kind()
                                    == redis::ErrorKind::Server(redis::ServerErrorKind::Moved) =>
                            {
                                self.broke();
                                AtNode::of(&e, false)
                            }
                            Err(e)
                                if e.kind()
                                    == redis::ErrorKind::Server(redis::ServerErrorKind::Ask) =>
                            {
                                AtNode::of(&e, true)
                            }
                            // Not the topology: the transaction's own fault.
                            _ => return Err(e),
                        },
                        None => return Err(e),
                    }
                }
                // Keys split between the two nodes of a slot being migrated: that lasts
                // until the migration moves the rest, which a slow or stuck reshard may
                // not do for long. Tried again briefly (a migration moving one of them
                // now), then returned: the callers that can run on fewer keys do.
                redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain)
                    if round >= SPLIT_ROUNDS =>
                {
                    return Err(e);
                }
                redis::ErrorKind::Server(
                    redis::ServerErrorKind::TryAgain | redis::ServerErrorKind::ClusterDown,
                )
                | redis::ErrorKind::ClusterConnectionNotFound => {
                    let pause = Duration::from_millis(u64::from(round.min(10)) * 2);
                    tokio::time::sleep(pause).await;
                    None
                }
                _ => return Err(e),
            };
        }
    }

    /// `call` within the command timeout. On a timeout the multiplexed connection it was
    /// using (its generation in `used`, 0 for none) is dropped: its late reply may still
    /// come, and must not be read as another call's. The call is pinned where its caller
    /// made it: a large future is not copied into the timer.
    async fn within_timeout<T>(
        &self,
        used: &AtomicU64,
        call: std::pin::Pin<&mut impl Future<Output = Result<T, BackendError>>>,
    ) -> Result<T, BackendError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => {
                let generation = used.load(Ordering::Relaxed);
                if self.sharded {
                    // A cluster connection matches replies itself and reconnects on its
                    // own: kept. But the slot's primary may have failed over meanwhile,
                    // without a reply that says so (see `epoch`).
                    self.broke();
                } else if generation != 0 {
                    self.forget(generation);
                }
                Err(BackendError::timeout(self.timeout))
            }
        }
    }

    pub(crate) async fn try_acquire(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        client: &str,
        attempt: Attempt,
    ) -> Result<Try, BackendError> {
        let mark = match attempt {
            Attempt::First if self.set_nx_get.load(Ordering::Relaxed) => {
                let mut set = redis::Cmd::with_capacity(7, key.len() + token.len() + 32);
                set.arg("SET")
                    .arg(key)
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(millis(ttl))
                    .arg("GET");
                match self.query::<Option<String>>(&set).await {
                    Ok(None) => return Ok(Try::Taken),
                    // Held: by someone else, or by something this caller may take over
                    // (its own token, a yield marker not naming it), which the script does.
                    Ok(Some(held)) if !may_take_over(&held, token, client) => {
                        return Ok(Try::Busy(None));
                    }
                    Ok(Some(_)) => false,
                    Err(e) if self.refuses_nx_get(&e) => false,
                    Err(e) => return Err(e),
                }
            }
            Attempt::First => false,
            Attempt::Again(mark) => mark,
        };
        let mut cmd = evalsha(&ACQUIRE, 1, 4, key.len() + token.len() + client.len());
        cmd.arg(key)
            .arg(token)
            .arg(millis(ttl))
            .arg(client)
            .arg(u8::from(mark));
        let reply: i64 = self.evalsha_call(&ACQUIRE, &cmd).await?;
        Ok(match reply {
            0 => Try::Taken,
            left @ 1.. => Try::Busy(Some(Duration::from_millis(left.unsigned_abs()))),
            _ => Try::Busy(None),
        })
    }

    /// Whether `e` is this server refusing `SET ... NX GET` (Redis before 7.0); if so,
    /// remembered: later calls go through the scripts.
    pub(super) fn refuses_nx_get(&self, e: &BackendError) -> bool {
        let refused = e.kind() == BackendErrorKind::Response
            && e.to_string().to_ascii_lowercase().contains("syntax");
        if refused {
            self.set_nx_get.store(false, Ordering::Relaxed);
            tracing::debug!(target: "distlock", error = %e, "this Redis refuses SET NX GET: lock tries and claims run in scripts");
        }
        refused
    }

    /// `INCR` of the counter, then `GET` of the key, pipelined (one round trip, two
    /// plain commands). The `GET` finding the token (marked or not) makes the value a
    /// fence: the key held the token from before the `INCR` (tokens are unique and never
    /// written back once gone), so every later holder's fence is larger. Otherwise the
    /// lock is lost and the value is skipped.
    pub(crate) async fn fence(&self, key: &str, token: &str) -> Result<Option<u64>, BackendError> {
        if self.sharded {
            let mut cmd = evalsha(&FENCE, 2, 1, 2 * key.len() + token.len());
            cmd.arg(key).arg(Companion(key, ":fence")).arg(token);
            return match self.evalsha_call(&FENCE, &cmd).await {
                Err(e) if e.is_split() => Box::pin(self.fence_split(key, token)).await,
                asked => asked,
            };
        }
        let (fence, held): (u64, Option<String>) = self.query_pipe(&fence_pipe(key)).await?;
        Ok(fence_if_held(fence, held, token))
    }

    /// A fence while the key and its counter are split between the two nodes of a
    /// migrating slot: the `INCR`, then the `GET` once it answered, each a call on one
    /// key that goes wherever its key is (a counter that does not exist yet is made on the
    /// slot's new node). The same reasoning as the pipelined form on one server: a key
    /// that still holds the token after the increment held it from before.
    async fn fence_split(&self, key: &str, token: &str) -> Result<Option<u64>, BackendError> {
        tracing::debug!(target: "distlock", key, "lock fence while its slot migrates: the counter and the key asked one after the other");
        let mut incr = redis::cmd("INCR");
        incr.arg(Companion(key, ":fence"));
        let fence: u64 = self.query(&incr).await?;
        let mut get = redis::cmd("GET");
        get.arg(key);
        let held: Option<String> = self.query(&get).await?;
        Ok(fence_if_held(fence, held, token))
    }

    /// Without a successor, first the plain compare-and-delete (`unlock.lua`); the full
    /// release runs only when that finds waiters registered. On a cluster whose slot
    /// migrates with the lock key and its recent turns (`{key}:turns`) split between the
    /// two nodes, the release runs on the lock key alone, without yielding (the turns
    /// only decide who goes next between clients).
    pub(crate) async fn release(&self, call: &ReleaseCall<'_>) -> Result<Released, BackendError> {
        if call.successor.is_none() && !call.contended {
            let mut cmd = evalsha(&UNLOCK, 1, 1, call.key.len() + call.token.len());
            cmd.arg(call.key).arg(call.token);
            match self.evalsha_call::<i64>(&UNLOCK, &cmd).await? {
                1 => return Ok(Released::Now),
                0 => return Ok(Released::NotOurs),
                _ => {}
            }
        }
        match self.release_script(call, true).await {
            Err(e) if e.is_split() => self.release_script(call, false).await,
            released => released,
        }
    }

    /// `release.lua`; `with_turns`: with the recent turns' key declared, so it may yield.
    async fn release_script(
        &self,
        call: &ReleaseCall<'_>,
        with_turns: bool,
    ) -> Result<Released, BackendError> {
        let mut inv = self.script(&RELEASE).prepare_invoke();
        let yield_to = call.yield_to.filter(|_| with_turns);
        let (client, window) = yield_to.map_or(("", 0), |(c, w)| (c, millis(w)));
        let (next, next_ttl, turn_over) = call
            .successor
            .map_or(("", 0, false), |s| (s.token, millis(s.ttl), s.turn_over));
        let channel = crate::notify::channel_of(call.key);
        inv.key(call.key);
        if with_turns {
            inv.key(Companion(call.key, ":turns"));
        }
        inv.arg(call.token)
            .arg(&channel)
            .arg(client)
            .arg(window)
            .arg(next)
            .arg(next_ttl)
            .arg(if turn_over { "1" } else { "" })
            .arg(u8::from(
                yield_to.is_some() && (call.self_subscribed)(&channel),
            ));
        let reply: i64 = self.eval(&inv).await?;
        Ok(match reply {
            1 => Released::Now,
            4 => Released::Handed,
            5 => Released::Yielded,
            _ => Released::NotOurs,
        })
    }

    /// One pipeline of compare-and-extend calls: `SET ... IFEQ` where the server has it,
    /// else EVALSHA (on NOSCRIPT the script is loaded and the pipeline sent once more).
    pub(crate) async fn extend_many(
        &self,
        leases: &[(&str, &str, Duration)],
    ) -> Result<Vec<bool>, BackendError> {
        if self.sharded {
            // The keys live in many slots: one call each, sent together.
            let calls = leases.iter().map(|(key, token, ttl)| async move {
                let mut cmd = evalsha(&EXTEND, 1, 2, key.len() + token.len());
                cmd.arg(*key).arg(*token).arg(millis(*ttl));
                self.evalsha_call::<i64>(&EXTEND, &cmd)
                    .await
                    .map(|r| r == 1)
            });
            return futures_util::future::try_join_all(calls).await;
        }
        let scripted = || {
            let mut pipe = redis::pipe();
            for (key, token, ttl) in leases {
                pipe.cmd("EVALSHA")
                    .arg(EXTEND.get_hash())
                    .arg(1)
                    .arg(*key)
                    .arg(*token)
                    .arg(millis(*ttl));
            }
            pipe
        };
        let used = AtomicU64::new(0);
        let call = async {
            let (mut conn, generation) = self.connection().await?;
            used.store(generation, Ordering::Relaxed);
            let native = self.native();
            if native.set_ifeq {
                let mut pipe = redis::pipe();
                for (key, token, ttl) in leases {
                    if let Some(cmd) = native.extend(key, token, *ttl) {
                        pipe.add_command(cmd);
                    }
                }
                match pipe.query_async::<Vec<Option<String>>>(&mut conn).await {
                    Ok(replies) if replies.iter().all(Option::is_some) => {
                        return Ok(vec![true; replies.len()]);
                    }
                    // A value a waiter marked does not match: the script decides.
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => {
                        self.refuse_native(&e);
                    }
                    Err(e) => return Err(self.failed(generation, e)),
                }
            }
            let pipe = scripted();
            let mut reply = pipe.query_async::<Vec<i64>>(&mut conn).await;
            if let Err(e) = &reply
                && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
            {
                EXTEND.prepare_invoke().load_async(&mut conn).await?;
                reply = pipe.query_async::<Vec<i64>>(&mut conn).await;
            }
            reply
                .map(|r| r.into_iter().map(|r| r == 1).collect())
                .map_err(|e| self.failed(generation, e))
        };
        tokio::pin!(call);
        self.within_timeout(&used, call).await
    }

    /// Deletes `key` if it holds `token` with the server's native compare-and-delete,
    /// waking nobody: the clean-up of a try whose reply was lost. `false` when the server
    /// has none or it deleted nothing (the caller releases through the scripts, which
    /// also handle a value a waiter marked).
    pub(crate) async fn delete_if(&self, key: &str, token: &str) -> Result<bool, BackendError> {
        let Some(cmd) = self.native().delete(key, token) else {
            return Ok(false);
        };
        // 0: gone, another holder's, or marked by a waiter: the release decides.
        Ok(self.query_native::<i64>(&cmd).await? == Some(1))
    }

    /// [`query`](Self::query) of a native command; `None` when the server refuses it
    /// (it has no such command after all): scripts from then on.
    pub(super) async fn query_native<T: FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<Option<T>, BackendError> {
        match self.query::<T>(cmd).await {
            Ok(reply) => Ok(Some(reply)),
            Err(e) if e.kind() == BackendErrorKind::Response => {
                self.refuse_native(&e);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        let used = AtomicU64::new(0);
        let call = async {
            self.check_policy_once().await;
            let (conn, generation) = self.connection().await?;
            used.store(generation, Ordering::Relaxed);
            let ping = redis::cmd("PING");
            let reply = match conn {
                // redis-rs sends a plain PING to every node: one is enough.
                Conn::Cluster(mut conn) => conn
                    .route_command(ping, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
                    .await
                    .map(drop),
                conn => self.run_on::<()>(conn, Call::Cmd(&ping)).await,
            };
            reply.map_err(|e| self.failed(generation, e))
        };
        tokio::pin!(call);
        self.within_timeout(&used, call).await
    }
}

/// Whether a key holding `held` can be taken by `token` of client `client` (see
/// `acquire.lua`): it is that token (a handoff whose reply was lost), or a yield marker
/// that does not name the client.
fn may_take_over(held: &str, token: &str, client: &str) -> bool {
    holds_token(held, token)
        || held.strip_prefix("yield: ").is_some_and(|names| {
            !names
                .split(' ')
                .any(|name| !name.is_empty() && name == client)
        })
}

/// Whether a lock key's value `held` is `token`, as written, or with a waiter's mark
/// (`<token> waiting`, see `acquire.lua`).
/// `INCR` of `key`'s fence counter, then `GET` of the key: see [`RedisBackend::fence`].
pub(super) fn fence_pipe(key: &str) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("INCR")
        .arg(Companion(key, ":fence"))
        .cmd("GET")
        .arg(key);
    pipe
}

/// The counter's value is a fence when the key still held the token.
pub(super) fn fence_if_held(fence: u64, held: Option<String>, token: &str) -> Option<u64> {
    held.is_some_and(|v| holds_token(&v, token))
        .then_some(fence)
}

fn holds_token(held: &str, token: &str) -> bool {
    held.strip_prefix(token)
        .is_some_and(|rest| rest.is_empty() || rest == " waiting")
}

/// Whether Redis may evict this client's keys under `policy` (`maxmemory-policy`): every
/// policy but `noeviction` may, under memory pressure. `volatile-*` evicts lock keys and
/// records (they have a ttl); `allkeys-*` the fence counters too.
pub(crate) fn may_evict_locks(policy: &str) -> bool {
    !policy.is_empty() && policy != "noeviction"
}

/// Reads `maxmemory-policy` and warns when Redis may evict keys: an evicted lock key lets
/// a second holder in, an evicted fence counter starts again from 1. Servers that refuse
/// `CONFIG GET` (managed Redis, ACLs) are skipped.
async fn warn_if_evicting(mut conn: MultiplexedConnection, timeout: Duration) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let read = cmd.query_async::<Vec<String>>(&mut conn);
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(reply)) => {
            let policy = reply.get(1).map_or("", String::as_str);
            if may_evict_locks(policy) {
                tracing::warn!(
                    target: "distlock",
                    policy,
                    "redis maxmemory-policy {policy} may evict keys under memory pressure: an \
                     evicted lock key lets a second holder in, and an evicted fence counter \
                     (`{{<lock key>}}:fence`) starts again from 1; use `noeviction`"
                );
            } else {
                tracing::debug!(target: "distlock", policy, "redis evicts no keys");
            }
        }
        // Refused (an ACL without @dangerous, managed Redis): said once per client, since
        // nothing else would tell that the policy is unchecked.
        Ok(Err(e)) => tracing::warn!(
            target: "distlock",
            error = %e,
            "cannot read redis maxmemory-policy: make sure it is `noeviction` (an evicted \
             lock key lets a second holder in, an evicted fence counter starts again from 1)"
        ),
        Err(_) => tracing::debug!(target: "distlock", "reading redis maxmemory-policy timed out"),
    }
}

/// Sets its flag when dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Makes a connection to `target` (the task of [`RedisBackend::attempt`]): every step
/// (the sentinels' answer, the TCP and TLS handshakes) within `timeout` in all, then the
/// command that reads what the server has within `command`.
/// Every call on it is bounded by `within_timeout`, which also drops the connection on a
/// timeout: a response timeout of its own would be a second timer per command.
async fn make(target: Target, tls: DirectTls, timeout: Duration, command: Duration) -> Made {
    let until = tokio::time::Instant::now() + timeout;
    let client = match target {
        Target::Single(client) => client,
        Target::Sentinel(target) => target.primary(timeout).await?,
        // The nodes may run different versions: scripts only, no native commands.
        Target::Cluster(client, _) => {
            return match tokio::time::timeout_at(until, client.get_async_connection()).await {
                Ok(Ok(conn)) => Ok((Conn::Cluster(conn), None, None)),
                Ok(Err(e)) => Err(e.into()),
                Err(_) => Err(BackendError::timeout(timeout)),
            };
        }
    };
    // Bounded by `until` below, whichever way it is made.
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(None)
        .set_response_timeout(None);
    let info = client.get_connection_info();
    let connect = async {
        if !Direct::serves(info, &tls) {
            let conn = client.get_multiplexed_async_connection_with_config(&config);
            return Ok((conn.await?, None));
        }
        // The socket made here, watched: a close is seen before the next call.
        let stream = super::direct::Stream::connect(info, &tls, false).await?;
        let closed = Arc::new(AtomicBool::new(false));
        let watched = super::direct::Watched {
            stream,
            closed: closed.clone(),
        };
        let (conn, driver) =
            MultiplexedConnection::new_with_config(info.redis_settings(), watched, config.clone())
                .await?;
        // Set when the driver ends, or is dropped unpolled (its runtime shutting down).
        let ended = SetOnDrop(closed.clone());
        tokio::spawn(async move {
            let _ended = ended;
            driver.await;
        });
        Ok::<_, redis::RedisError>((conn, Some(closed)))
    };
    let (conn, closed) = match tokio::time::timeout_at(until, connect).await {
        Ok(made) => made?,
        Err(_) => return Err(BackendError::timeout(timeout)),
    };
    let server = detect_native(conn.clone(), command).await;
    Ok((Conn::Single(conn), Some(server), closed))
}

/// Reads `INFO server` on a new connection to learn which conditional commands the
/// server has (none when it cannot be read) and its `run_id`.
async fn detect_native(
    mut conn: MultiplexedConnection,
    timeout: Duration,
) -> (Native, Option<String>) {
    // `HELLO` (no arguments) in the same round trip: where an ACL refuses `INFO` (the
    // least-privilege `-@dangerous`) or it is renamed, it still names the server and its
    // version, though not its `run_id`.
    let mut pipe = redis::pipe();
    pipe.cmd("INFO").arg("server").cmd("HELLO").ignore_errors();
    let asked = pipe.query_async::<Vec<redis::RedisResult<redis::Value>>>(&mut conn);
    let Ok(Ok(replies)) = tokio::time::timeout(timeout, asked).await else {
        return (Native::default(), None);
    };
    let mut replies = replies.into_iter();
    let info = match replies.next() {
        Some(Ok(redis::Value::BulkString(b))) => String::from_utf8(b).ok(),
        Some(Ok(redis::Value::VerbatimString { text, .. })) => Some(text),
        _ => None,
    };
    match info {
        Some(info) => (
            Native::from_info(&info),
            super::native::run_id(&info).map(str::to_owned),
        ),
        None => match replies.next() {
            Some(Ok(hello)) => (Native::from_hello(&hello), None),
            _ => (Native::default(), None),
        },
    }
}

/// The runtime that drives every cluster connection of the process, on a thread of its
/// own: a cluster connection made once then serves every runtime of its client (the
/// renewal task's, a new actix-web worker's) and outlives each of them. Making one talks
/// to every node of the cluster, and a node that hangs (SIGSTOP, a stalled host) holds it
/// up: a runtime that needed a connection of its own could not get one meanwhile, and
/// the renewal task lost healthy locks at their first renewal. `None` when its thread
/// cannot start (each caller's runtime then drives its own, as on one server).
fn cluster_runtime() -> Option<&'static Handle> {
    static RUNTIME: std::sync::OnceLock<Option<Handle>> = std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            let started = std::thread::Builder::new()
                .name("distlock-cluster".into())
                .spawn(move || {
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => {
                            let _ = tx.send(Some(rt.handle().clone()));
                            rt.block_on(std::future::pending::<()>());
                        }
                        Err(e) => {
                            tracing::error!(target: "distlock", error = %e, "the cluster connections' runtime cannot start");
                            let _ = tx.send(None);
                        }
                    }
                });
            match started {
                Ok(_) => rx.recv().ok().flatten(),
                Err(e) => {
                    tracing::error!(target: "distlock", error = %e, "the cluster connections' thread cannot start");
                    None
                }
            }
        })
        .as_ref()
}

fn current_runtime() -> Result<tokio::runtime::Id, BackendError> {
    Handle::try_current()
        .map(|h| h.id())
        .map_err(|_| BackendError::new(BackendErrorKind::Config, "called outside a tokio runtime"))
}

/// Counts one call in flight while it lives.
struct InFlight<'a> {
    count: &'a AtomicUsize,
    /// How many were in flight when this one started.
    before: usize,
}

impl<'a> InFlight<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        let before = count.fetch_add(1, Ordering::Relaxed);
        InFlight { count, before }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `EVALSHA <script's hash> <keys>`, sized for the `args` keys and arguments to come and
/// about `data` bytes of them.
fn evalsha(script: &Script, keys: usize, args: usize, data: usize) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(3 + keys + args, data + 64);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    cmd
}

/// One call of [`RedisBackend::call`]: a script, a plain command, or an `EVALSHA`.
#[derive(Clone, Copy)]
enum Call<'a, 'b> {
    Script(&'a ScriptInvocation<'b>),
    Cmd(&'a redis::Cmd),
    Evalsha(&'a Script, &'a redis::Cmd),
    Pipe(&'a redis::Pipeline),
}

impl Call<'_, '_> {
    /// The key a single command or `EVALSHA` works on (a script's other keys share its
    /// slot), for routing it to the slot's owner; `None` for the rest.
    fn single_key(self) -> Option<Vec<u8>> {
        let (cmd, at) = match self {
            Call::Cmd(cmd) => (cmd, 1),
            // `EVALSHA <sha> <numkeys> <key> ...`: with at least one key.
            Call::Evalsha(_, cmd)
                if !matches!(cmd.args_iter().nth(2), Some(redis::Arg::Simple(b"0"))) =>
            {
                (cmd, 3)
            }
            Call::Evalsha(..) | Call::Script(_) | Call::Pipe(_) => return None,
        };
        arg(cmd, at)
    }

    /// The key of a pipeline's first command (its first argument), for the probe after
    /// an aborted transaction.
    fn first_key(self) -> Option<Vec<u8>> {
        let Call::Pipe(pipe) = self else { return None };
        arg(pipe.cmd_iter().next()?, 1)
    }

    async fn run<T: FromRedisValue, C: redis::aio::ConnectionLike + Send>(
        self,
        conn: &mut C,
    ) -> redis::RedisResult<T> {
        // The script calls are boxed: they are not the usual path, and their futures are
        // several times larger than a command's, which every call's future would carry.
        match self {
            Call::Script(inv) => Box::pin(inv.invoke_async::<T>(conn)).await,
            Call::Cmd(cmd) => cmd.query_async::<T>(conn).await,
            Call::Pipe(pipe) => pipe.query_async::<T>(conn).await,
            Call::Evalsha(script, cmd) => match cmd.query_async::<T>(conn).await {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    Box::pin(script.prepare_invoke().load_async(conn)).await?;
                    cmd.query_async::<T>(conn).await
                }
                reply => reply,
            },
        }
    }
}

/// A range of slots (first, last) and the host and port of its primary.
type SlotOwner = (u16, u16, String, u16);

/// The key a pipeline that waits for replicas writes first: `EVAL <script> <numkeys>
/// <key> ...`, or `<command> <key> ...`; its slot is the pipeline's.
fn pipe_key(pipe: &redis::Pipeline) -> Option<Vec<u8>> {
    let first = pipe.cmd_iter().next()?;
    let name = arg(first, 0)?;
    let at = if name.eq_ignore_ascii_case(b"EVAL") || name.eq_ignore_ascii_case(b"EVALSHA") {
        3
    } else {
        1
    };
    arg(first, at)
}

/// How many `TRYAGAIN` replies one cluster call takes (about 40 ms of pauses) before it
/// reports one: its keys are split between the two nodes of a migrating slot.
const SPLIT_ROUNDS: u32 = 8;

/// How many redirects and not-run replies one cluster call follows before it reports
/// the last one (the command timeout bounds it too).
const MAX_REDIRECTS: u32 = 1000;

/// A multiplexed connection to one server, or a cluster connection.
#[derive(Clone)]
pub(super) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The cluster node a redirect named, and whether it wants `ASKING` first.
struct AtNode {
    host: String,
    port: u16,
    asking: bool,
}

impl AtNode {
    /// The node of a `MOVED` or `ASK` reply (`None`: route by slot again).
    fn of(e: &redis::RedisError, asking: bool) -> Option<AtNode> {
        let (addr, _slot) = e.redirect_node()?;
        let (host, port) = addr.rsplit_once(':')?;
        Some(AtNode {
            host: host.to_owned(),
            port: port.parse().ok()?,
            asking,
        })
    }

    fn on<'c>(&'c self, conn: &'c mut ClusterConnection) -> Routed<'c> {
        Routed {
            node: self,
            via: Via::Cluster(conn),
        }
    }

    fn on_plain<'c>(&'c self, conn: &'c mut MultiplexedConnection) -> Routed<'c> {
        Routed {
            node: self,
            via: Via::Plain(conn),
        }
    }
}

/// Commands that all go to one cluster node (after `ASKING` when it asked for them).
struct Routed<'c> {
    node: &'c AtNode,
    via: Via<'c>,
}

/// How they reach it: through the cluster connection by address, or a connection to it
/// alone.
enum Via<'c> {
    Cluster(&'c mut ClusterConnection),
    Plain(&'c mut MultiplexedConnection),
}

impl Routed<'_> {
    async fn command(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        match &mut self.via {
            Via::Cluster(conn) => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: self.node.host.clone(),
                    port: self.node.port,
                };
                conn.route_command(cmd.clone(), RoutingInfo::SingleNode(route))
                    .await
            }
            Via::Plain(conn) => redis::aio::ConnectionLike::req_packed_command(*conn, cmd).await,
        }
    }

    async fn pipeline(
        &mut self,
        pipe: redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        match &mut self.via {
            Via::Cluster(conn) => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: self.node.host.clone(),
                    port: self.node.port,
                };
                conn.route_pipeline(pipe, offset, count, route).await
            }
            Via::Plain(conn) => {
                redis::aio::ConnectionLike::req_packed_commands(*conn, &pipe, offset, count).await
            }
        }
    }
}

impl redis::aio::ConnectionLike for Routed<'_> {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        Box::pin(async move {
            if !self.node.asking {
                return self.command(cmd).await;
            }
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").add_command(cmd.clone());
            let mut replies = self.pipeline(pipe, 1, 1).await?;
            replies
                .pop()
                .ok_or_else(|| (redis::ErrorKind::Client, "no reply after ASKING").into())
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(async move {
            if !self.node.asking {
                return self.pipeline(pipeline.clone(), offset, count).await;
            }
            // A transaction: `ASKING`, then `MULTI` ... `EXEC` (the flag lasts until
            // `EXEC`). Otherwise `ASKING` before each command, its `OK` dropped. On a
            // cluster a pipeline has one key (see `RedisBackend::fence`), so the node
            // that asked for it has it.
            let mut pipe = redis::pipe();
            if pipeline.is_transaction() {
                pipe.cmd("ASKING").cmd("MULTI");
                for cmd in pipeline.cmd_iter() {
                    pipe.add_command(cmd.clone());
                }
                pipe.cmd("EXEC");
                return self.pipeline(pipe, offset + 1, count).await;
            }
            for cmd in pipeline.cmd_iter() {
                pipe.cmd("ASKING").add_command(cmd.clone());
            }
            let replies = self.pipeline(pipe, 2 * offset, 2 * count).await?;
            Ok(replies.into_iter().skip(1).step_by(2).collect())
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// The primaries of a `CLUSTER SLOTS` reply, by slot range (entries naming no usable
/// host, `""` or `"?"`, left out: their slots go through the cluster connection).
fn slot_owners(reply: &redis::Value) -> Vec<SlotOwner> {
    let redis::Value::Array(ranges) = reply else {
        return Vec::new();
    };
    let int = |v: &redis::Value| match v {
        redis::Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    ranges
        .iter()
        .filter_map(|range| {
            let redis::Value::Array(parts) = range else {
                return None;
            };
            let redis::Value::Array(primary) = parts.get(2)? else {
                return None;
            };
            let host = match primary.first()? {
                redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
                _ => return None,
            };
            if host.is_empty() || host == "?" {
                return None;
            }
            Some((
                int(parts.first()?)?,
                int(parts.get(1)?)?,
                host,
                int(primary.get(1)?)?,
            ))
        })
        .collect()
}

/// Argument `at` of `cmd` (0: the command's name), as bytes.
fn arg(cmd: &redis::Cmd, at: usize) -> Option<Vec<u8>> {
    match cmd.args_iter().nth(at)? {
        redis::Arg::Simple(bytes) => Some(bytes.to_vec()),
        _ => None,
    }
}

/// The settings of a cluster's first node (`base`: credentials, TLS) for the node at
/// `host:port`.
fn node_info(base: &redis::ConnectionInfo, host: String, port: u16) -> redis::ConnectionInfo {
    let addr = match base.addr() {
        redis::ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => redis::ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => redis::ConnectionAddr::Tcp(host, port),
    };
    base.clone().set_addr(addr)
}
