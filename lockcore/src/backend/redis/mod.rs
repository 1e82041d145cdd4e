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
//!
//! This file holds the backend's state, its constructors and the lock operations; the
//! connections they run on live by concern in `cache` (the multiplexed connection per
//! runtime, and the connection epoch), `pool` (direct connections), `routing` (which
//! connection a call takes, and its timeout) and `cluster` (redirects, slot owners, kept
//! connections to nodes).

mod cache;
mod cluster;
pub(crate) mod policy;
mod pool;
mod routing;

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
use super::{Attempt, Locking, ReleaseCall, Released, Try, millis};
use crate::error::{BackendError, BackendErrorKind};
use crate::key::Companion;
use cache::*;
use cluster::*;
use pool::*;
pub(crate) use routing::Route;
use routing::*;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::ACQUIRE));
static UNLOCK: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::UNLOCK));
static RELEASE: LazyLock<[Script; 2]> =
    LazyLock::new(|| super::scripts::both(super::scripts::RELEASE));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::EXTEND));
static FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::FENCE));
static KEEP: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::KEEP));
static MARK_READERS: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::MARK_READERS));
static FENCE_COUNTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(super::scripts::FENCE_COUNTER));
static SET_FENCED: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::SET_FENCED));
static PERMIT_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(super::scripts::PERMIT_ACQUIRE));
static PERMIT_RELEASE: LazyLock<[Script; 2]> =
    LazyLock::new(|| super::scripts::both(super::scripts::PERMIT_RELEASE));
static PERMIT_EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(super::scripts::PERMIT_EXTEND));
static INSPECT: LazyLock<[Script; 2]> =
    LazyLock::new(|| super::scripts::both(super::scripts::INSPECT));
static FORCE_RELEASE: LazyLock<[Script; 2]> =
    LazyLock::new(|| super::scripts::both(super::scripts::FORCE_RELEASE));
static MULTI_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(super::scripts::MULTI_ACQUIRE));
static READ_ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::READ_ACQUIRE));
static WRITE_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(super::scripts::WRITE_ACQUIRE));

/// A try's reply: 0 taken, else busy for that many ms (negative: unknown).
fn busy_for(reply: i64) -> Try {
    match reply {
        0 => Try::Taken,
        left @ 1.. => Try::Busy(Some(Duration::from_millis(left.unsigned_abs()))),
        // `-2 - left`: readers hold the name (acquire.lua).
        ..=-2 => Try::Readers(Some(Duration::from_millis((-2 - reply).unsigned_abs()))),
        _ => Try::Busy(None),
    }
}

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
    /// epoch (see `lock/guard.rs`, `release_raw`).
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

impl Drop for RedisBackend {
    /// Connections still being made are of no use once the client is gone.
    fn drop(&mut self) {
        for attempt in crate::util::lock(&self.pending).drain(..) {
            attempt.abort.abort();
        }
    }
}

impl RedisBackend {
    /// One server.
    pub(crate) fn new(client: redis::Client, timeout: Duration, tls: DirectTls) -> Self {
        let direct = Direct::serves(client.get_connection_info(), &tls);
        Self::with(Target::Single(client), timeout, tls, direct)
    }

    /// Redis behind Sentinel. Direct connections serve only the pipelines that wait for
    /// replicas (see `pipe_on_primary`), over TLS with `tls` where the primary speaks it.
    pub(crate) fn sentinel(target: Arc<SentinelTarget>, timeout: Duration, tls: DirectTls) -> Self {
        Self::with(Target::Sentinel(target), timeout, tls, false)
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

    /// Whether `e` is this server refusing `SET ... NX GET` (Redis before 7.0); if so,
    /// remembered: later calls go through the scripts.
    pub(super) fn refuses_nx_get(&self, e: &BackendError) -> bool {
        let refused = e.is_capability_missing();
        if refused {
            self.set_nx_get.store(false, Ordering::Relaxed);
            tracing::debug!(target: "distlock", error = %e, "this Redis refuses SET NX GET: lock tries and claims run in scripts");
        }
        refused
    }

    /// A fence while the key and its counter are split between the two nodes of a
    /// migrating slot: the counter's step (`fence_counter.lua`, seeded as `fence.lua`
    /// seeds it), then the `GET` once it answered, each a call on one key that goes
    /// wherever its key is (a counter that does not exist yet is made on the slot's new
    /// node). A key that still holds the token after the increment held it from before
    /// (tokens are unique and never written back once gone), so every later holder's
    /// fence is larger.
    async fn fence_split(
        &self,
        key: &str,
        token: &str,
        idle: Duration,
    ) -> Result<Option<u64>, BackendError> {
        tracing::debug!(target: "distlock", key, "lock fence while its slot migrates: the counter and the key asked one after the other");
        let mut incr = evalsha(&FENCE_COUNTER, 1, 1, key.len() + 40);
        incr.arg(Companion(key, ":fence")).arg(millis(idle));
        let fence: u64 = self.evalsha_call(&FENCE_COUNTER, &incr).await?;
        let mut get = redis::cmd("GET");
        get.arg(key);
        let held: Option<String> = self.query(&get).await?;
        Ok(held
            .is_some_and(|v| holds_token(&v, token))
            .then_some(fence))
    }

    /// [`fence_split`](Self::fence_split) that waits for `replicas` (`WAIT` for up to
    /// `wait` ms): the counter's step and the `WAIT` in one pipeline, on one connection to
    /// the node the counter goes to (`WAIT` counts the writes of its own connection; the
    /// counter is the write a fence makes), then the `GET` of the key. The fence and how
    /// many replicas acknowledged it.
    pub(in crate::backend) async fn fence_split_acked(
        &self,
        key: &str,
        token: &str,
        idle: Duration,
        (replicas, wait): (u32, u64),
    ) -> Result<(Option<u64>, u32), BackendError> {
        tracing::debug!(target: "distlock", key, "lock fence (waiting for replicas) while its slot migrates: the counter and the key asked one after the other");
        // EVAL, not EVALSHA: a NOSCRIPT inside the pipeline would leave the WAIT alone.
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(super::scripts::FENCE_COUNTER)
            .arg(1)
            .arg(Companion(key, ":fence"))
            .arg(millis(idle))
            .cmd("WAIT")
            .arg(replicas)
            .arg(wait);
        let (fence, acked): (u64, u32) = self.query_pipe_alone(&pipe).await?;
        let mut get = redis::cmd("GET");
        get.arg(key);
        let held: Option<String> = self.query(&get).await?;
        Ok((
            held.is_some_and(|v| holds_token(&v, token))
                .then_some(fence),
            acked,
        ))
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

    /// [`query_via`](Self::query_via) of a native command; `None` when the server refuses
    /// it (it has no such command after all): scripts from then on.
    pub(super) async fn query_native<T: FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        route: Route,
    ) -> Result<Option<T>, BackendError> {
        match self.query_via::<T>(cmd, route).await {
            Ok(reply) => Ok(Some(reply)),
            // Only a reply that the command is missing turns native commands off:
            // `BUSY`, `LOADING`, a timeout, `WRONGTYPE` (a key of another kind) fail
            // this call and keep them.
            Err(e) if e.is_capability_missing() => {
                self.refuse_native(&e);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

impl Locking for RedisBackend {
    fn command_timeout(&self) -> Duration {
        self.timeout
    }

    /// The current epoch (see the field).
    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    async fn try_acquire(
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
                    Ok(Some(held)) if held == crate::key::READERS_MARK => {
                        return Ok(Try::Readers(None));
                    }
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
        Ok(busy_for(reply))
    }

    /// `fence.lua`: max(counter + 1, the server's clock in microseconds) while the key
    /// holds the token, the counter expiring after `idle` without a fence (see the
    /// script).
    async fn fence(
        &self,
        key: &str,
        token: &str,
        idle: Duration,
    ) -> Result<Option<u64>, BackendError> {
        let mut cmd = evalsha(&FENCE, 2, 2, 2 * key.len() + token.len() + 24);
        cmd.arg(key)
            .arg(Companion(key, ":fence"))
            .arg(token)
            .arg(millis(idle));
        match self.evalsha_call(&FENCE, &cmd).await {
            Err(e) if e.is_split() => Box::pin(self.fence_split(key, token, idle)).await,
            asked => asked,
        }
    }

    /// Without a successor, first the plain compare-and-delete (the server's own, else
    /// `unlock.lua`); the full release runs only when that finds waiters registered. On a cluster whose slot
    /// migrates with the lock key and its recent turns (`{key}:turns`) split between the
    /// two nodes, the release runs on the lock key alone, without yielding (the turns
    /// only decide who goes next between clients).
    async fn release(&self, call: &ReleaseCall<'_>) -> Result<Released, BackendError> {
        let mut undecided = false;
        if call.successor.is_none() && !call.contended {
            // The server's own compare-and-delete where it has one (Valkey 9's `DELIFEQ`,
            // Redis 8.4's `DELEX ... IFEQ`): 0 means gone, another holder's, or marked by
            // a waiter (`<token> waiting`), and `release.lua` tells which. A lost lock
            // pays that second call; a marked one pays it after `unlock.lua` too.
            let native = match self.native().delete(call.key, call.token) {
                Some(cmd) => match self.query_native::<i64>(&cmd, Route::Direct).await {
                    // A key of another kind (a semaphore took the name): not this
                    // holder's, as `release.lua` then says.
                    Err(e) if e.is_wrong_type() => Some(0),
                    native => native?,
                },
                None => None,
            };
            match native {
                Some(1) => return Ok(Released::Now),
                // Lost, or marked: only `release.lua` tells which, so a failure of it
                // leaves a retry unable to tell a release that happened from a lost lock.
                Some(_) => undecided = true,
                // No such command (or refused after all): `unlock.lua`.
                None => {
                    let mut cmd = evalsha(&UNLOCK, 1, 1, call.key.len() + call.token.len());
                    cmd.arg(call.key).arg(call.token);
                    match self.evalsha_call::<i64>(&UNLOCK, &cmd).await? {
                        1 => return Ok(Released::Now),
                        0 => return Ok(Released::NotOurs),
                        _ => {}
                    }
                }
            }
        }
        let released = match self.release_script(call, true).await {
            Err(e) if e.is_split() => self.release_script(call, false).await,
            released => released,
        };
        released.map_err(|e| if undecided { e.undecided() } else { e })
    }

    /// `keep.lua`.
    async fn keep(&self, key: &str, token: &str, left: Duration) -> Result<bool, BackendError> {
        let mut cmd = evalsha(&KEEP, 1, 2, key.len() + token.len() + 24);
        cmd.arg(key).arg(token).arg(millis(left));
        let kept: i64 = self.evalsha_call(&KEEP, &cmd).await?;
        Ok(kept == 1)
    }

    /// `set_fenced.lua`: the value and its highest fence seen share the key's slot, and
    /// its lifetime.
    async fn set_fenced(
        &self,
        key: &str,
        value: &str,
        fence: u64,
        ttl: Option<Duration>,
    ) -> Result<Option<u64>, BackendError> {
        let mut cmd = evalsha(&SET_FENCED, 2, 3, 2 * key.len() + value.len() + 56);
        cmd.arg(key)
            .arg(Companion(key, ":fence-seen"))
            .arg(value)
            .arg(fence)
            .arg(ttl.map_or(0, millis));
        let seen: Option<String> = self.evalsha_call(&SET_FENCED, &cmd).await?;
        seen.map(|seen| {
            seen.parse().map_err(|_| {
                BackendError::new(
                    crate::error::BackendErrorKind::Response,
                    format!("the fence seen for `{key}` is not a number: {seen:?}"),
                )
            })
        })
        .transpose()
    }

    async fn fenced_value(&self, key: &str) -> Result<(Option<String>, u64), BackendError> {
        let mut cmd = redis::cmd("MGET");
        cmd.arg(key).arg(Companion(key, ":fence-seen"));
        let (value, seen): (Option<String>, Option<u64>) = self.query(&cmd).await?;
        Ok((value, seen.unwrap_or(0)))
    }

    /// `permit_acquire.lua`: the semaphore is one key, so one call on any topology.
    async fn try_permit(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        permits: u32,
    ) -> Result<Try, BackendError> {
        let mut cmd = evalsha(&PERMIT_ACQUIRE, 1, 4, key.len() + token.len() + 40);
        cmd.arg(key)
            .arg(token)
            .arg(millis(ttl))
            .arg(permits)
            .arg(crate::key::limit_member(permits));
        let reply: i64 = self.evalsha_call(&PERMIT_ACQUIRE, &cmd).await?;
        Ok(busy_for(reply))
    }

    /// `permit_release.lua`, in its cluster form on a cluster (the channel lives in the
    /// key's slot).
    async fn release_permit(
        &self,
        set: &str,
        token: &str,
        (of, last): (&str, bool),
    ) -> Result<Released, BackendError> {
        let script = self.script(&PERMIT_RELEASE);
        let channel = crate::notify::channel_of(of);
        // The last reader takes `readers` off the lock key (permit_release.lua).
        let release = |with_lock: bool| {
            let keys = 1 + usize::from(with_lock);
            let data = set.len() + of.len() + token.len() + channel.len();
            let mut cmd = evalsha(script, keys, 3, data);
            cmd.arg(set);
            if with_lock {
                cmd.arg(of);
            }
            cmd.arg(token).arg(&channel).arg(u8::from(last));
            async move { self.evalsha_call::<i64>(script, &cmd).await }
        };
        let reply = match release(last).await {
            // A cluster slot migrating with the two keys on its two nodes: the share alone
            // (its `readers` ends with its ttl).
            Err(e) if e.is_split() && last => release(false).await?,
            reply => reply?,
        };
        Ok(if reply == 1 {
            Released::Now
        } else {
            Released::NotOurs
        })
    }

    /// `inspect.lua`, in its cluster form on a cluster.
    async fn inspect(&self, key: &str) -> Result<super::Seen, BackendError> {
        type Reply = (
            String,
            Option<String>,
            i64,
            Option<u64>,
            Vec<String>,
            Vec<String>,
            Option<String>,
            u64,
            u64,
        );
        let script = self.script(&INSPECT);
        let channel = crate::notify::channel_of(key);
        let mut cmd = evalsha(script, 4, 1, 4 * key.len() + channel.len() + 48);
        cmd.arg(key)
            .arg(Companion(key, ":fence"))
            .arg(Companion(key, ":readers"))
            .arg(Companion(key, ":writer"))
            .arg(&channel);
        let reply: Reply = self.evalsha_call(script, &cmd).await?;
        let (_kind, value, pttl, fence, permits, readers, writer, listening, now) = reply;
        // A semaphore's limit is a member of its set (`key::limit_member`), no holder.
        let limit = permits
            .chunks(2)
            .find_map(|pair| crate::key::semaphore_limit(&pair[0]));
        let shares = |flat: Vec<String>| {
            flat.chunks(2)
                .filter(|pair| crate::key::semaphore_limit(&pair[0]).is_none())
                .filter_map(|pair| {
                    let end: f64 = pair.get(1)?.parse().ok()?;
                    let left = (end - now as f64).max(0.0) as u64;
                    Some((pair[0].clone(), Duration::from_millis(left)))
                })
                .collect()
        };
        Ok(super::Seen {
            value,
            left: (pttl > 0).then(|| Duration::from_millis(pttl.unsigned_abs())),
            fence,
            permits: shares(permits),
            limit,
            readers: shares(readers),
            writer_waiting: writer,
            listening,
        })
    }

    /// `force_release.lua`, in its cluster form on a cluster.
    async fn force_release(&self, key: &str) -> Result<bool, BackendError> {
        let script = self.script(&FORCE_RELEASE);
        let channel = crate::notify::channel_of(key);
        let mut cmd = evalsha(script, 4, 1, 4 * key.len() + channel.len() + 64);
        cmd.arg(key)
            .arg(Companion(key, ":readers"))
            .arg(Companion(key, ":writer"))
            .arg(Companion(key, ":readers-waiting"))
            .arg(&channel);
        let deleted: i64 = self.evalsha_call(script, &cmd).await?;
        Ok(deleted > 0)
    }

    /// The one server; on a cluster, every primary of the slot map (read now when it
    /// is not known).
    async fn scan_nodes(&self) -> Result<Vec<super::ScanNode>, BackendError> {
        if !self.sharded {
            return Ok(vec![super::ScanNode(None)]);
        }
        // Read afresh for each walk: primaries added, moved or failed over since the map
        // was last read would otherwise be missed, or fail every walk.
        *crate::util::lock(&self.owners) = None;
        self.read_owners_now().await;
        let owners = crate::util::lock(&self.owners).clone();
        let Some(owners) = owners else {
            return Err(BackendError::new(
                BackendErrorKind::Connection,
                "the cluster's slot map could not be read (CLUSTER SLOTS)",
            ));
        };
        let mut nodes: Vec<_> = owners
            .into_iter()
            .map(|(_, _, host, port)| super::ScanNode(Some((host, port))))
            .collect();
        nodes.sort();
        nodes.dedup();
        Ok(nodes)
    }

    /// `SCAN` on the one server, or on a cluster's primary over a connection to it.
    async fn scan(
        &self,
        node: &super::ScanNode,
        cursor: u64,
        pattern: &str,
    ) -> Result<(u64, Vec<String>), BackendError> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(500);
        let Some((host, port)) = &node.0 else {
            return self.query(&scan).await;
        };
        let at = AtNode {
            host: host.clone(),
            port: *port,
            asking: false,
        };
        // Timed and traced as the calls through `call` are.
        let _timed = crate::metrics::Operation::start_with(|| "SCAN");
        let span = routing::client_span(|| "SCAN", || Some((host.clone(), *port)));
        let step = tracing::Instrument::instrument(
            async {
                let mut conn = self.plain_kept(&at).await?;
                scan.query_async::<(u64, Vec<String>)>(&mut conn).await
            },
            span,
        );
        match tokio::time::timeout(self.timeout, step).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => {
                self.forget_plain(&at);
                Err(e.into())
            }
            Err(_) => {
                self.forget_plain(&at);
                Err(BackendError::timeout(self.timeout))
            }
        }
    }

    /// One server, or one slot of a cluster.
    fn one_call(&self, keys: &[&str]) -> bool {
        let slot = |k: &str| crate::key::slot(k.as_bytes());
        !self.sharded || keys.iter().all(|k| slot(k) == slot(keys[0]))
    }

    /// `multi_acquire.lua`.
    async fn try_all(
        &self,
        keys: &[&str],
        tokens: &[&str],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        let data: usize = keys.iter().chain(tokens).map(|s| s.len()).sum();
        let mut cmd = evalsha(&MULTI_ACQUIRE, keys.len(), 1 + tokens.len(), data + 16);
        for key in keys {
            cmd.arg(*key);
        }
        cmd.arg(millis(ttl));
        for token in tokens {
            cmd.arg(*token);
        }
        let reply: i64 = self.evalsha_call(&MULTI_ACQUIRE, &cmd).await?;
        Ok(reply == 1)
    }

    /// `read_acquire.lua`: the lock key, the readers and the writer's mark share a slot.
    async fn try_read(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        mark: bool,
        waiting: Duration,
    ) -> Result<Try, BackendError> {
        let mut cmd = evalsha(&READ_ACQUIRE, 4, 4, 4 * key.len() + token.len() + 48);
        cmd.arg(key)
            .arg(Companion(key, ":readers"))
            .arg(Companion(key, ":writer"))
            .arg(Companion(key, ":readers-waiting"))
            .arg(token)
            .arg(millis(ttl))
            .arg(u8::from(mark))
            .arg(if waiting.is_zero() {
                0
            } else {
                millis(waiting)
            });
        let reply: i64 = self.evalsha_call(&READ_ACQUIRE, &cmd).await?;
        Ok(busy_for(reply))
    }

    /// `write_acquire.lua`, with `acquire.lua` inside it; never the plain `SET NX`,
    /// since the readers must be looked at.
    async fn try_write(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        (client, mark): (&str, bool),
        waiting: Duration,
    ) -> Result<Try, BackendError> {
        let data = 3 * key.len() + token.len() + client.len() + 32;
        let mut cmd = evalsha(&WRITE_ACQUIRE, 4, 5, data + key.len() + 16);
        cmd.arg(key)
            .arg(Companion(key, ":readers"))
            .arg(Companion(key, ":writer"))
            .arg(Companion(key, ":readers-waiting"))
            .arg(token)
            .arg(millis(ttl))
            .arg(client)
            .arg(u8::from(mark))
            .arg(if waiting.is_zero() {
                0
            } else {
                millis(waiting)
            });
        let reply: i64 = self.evalsha_call(&WRITE_ACQUIRE, &cmd).await?;
        Ok(busy_for(reply))
    }

    /// One `permit_extend.lua` call per permit, sent together (a multiplexed
    /// connection pipelines them).
    async fn extend_permits(&self, leases: &[(&str, &str, Duration)]) -> super::Extended {
        let calls = leases.iter().map(|(key, token, ttl)| async move {
            // A read share keeps its lock key's `readers` with it (permit_extend.lua).
            let lock = crate::key::readers_of(key);
            let extend = |lock: Option<&str>| {
                let keys = 1 + usize::from(lock.is_some());
                let mut cmd = evalsha(&PERMIT_EXTEND, keys, 2, 2 * key.len() + token.len() + 24);
                cmd.arg(*key);
                if let Some(lock) = lock {
                    cmd.arg(lock);
                }
                cmd.arg(*token).arg(millis(*ttl));
                async move { self.evalsha_call::<i64>(&PERMIT_EXTEND, &cmd).await }
            };
            let extended = match extend(lock).await {
                // A cluster slot migrating with the two keys on its two nodes: the share
                // alone, then its `readers` alone, each where its key is.
                Err(e) if e.is_split() && lock.is_some() => {
                    let extended = extend(None).await?;
                    if let (1, Some(lock)) = (extended, lock) {
                        let mut mark = evalsha(&MARK_READERS, 1, 1, lock.len() + 24);
                        mark.arg(lock).arg(millis(*ttl));
                        self.evalsha_call::<i64>(&MARK_READERS, &mark).await?;
                    }
                    Ok(extended)
                }
                extended => extended,
            };
            extended.map(|r| r == 1)
        });
        // Each judged on its own: one that fails (its node hangs) fails alone.
        futures_util::future::join_all(calls).await
    }

    /// One pipeline of compare-and-extend calls: `SET ... IFEQ` where the server has it,
    /// else EVALSHA (on NOSCRIPT the script is loaded and the pipeline sent once more).
    async fn extend_many(&self, leases: &[(&str, &str, Duration)]) -> super::Extended {
        if self.sharded {
            // The keys live in many slots: one call each, sent together, each judged on
            // its own (one primary that hangs fails its keys' calls only).
            let calls = leases.iter().map(|(key, token, ttl)| async move {
                let mut cmd = evalsha(&EXTEND, 1, 2, key.len() + token.len());
                cmd.arg(*key).arg(*token).arg(millis(*ttl));
                self.evalsha_call::<i64>(&EXTEND, &cmd)
                    .await
                    .map(|r| r == 1)
            });
            return futures_util::future::join_all(calls).await;
        }
        super::extended_all(leases.len(), self.extend_pipelined(leases).await)
    }
    /// Deletes `key` if it holds `token` with the server's native compare-and-delete,
    /// waking nobody: the clean-up of a try whose reply was lost. `false` when the server
    /// has none or it deleted nothing (the caller releases through the scripts, which
    /// also handle a value a waiter marked).
    async fn delete_if(&self, key: &str, token: &str) -> Result<bool, BackendError> {
        let Some(cmd) = self.native().delete(key, token) else {
            return Ok(false);
        };
        // 0: gone, another holder's, or marked by a waiter: the release decides (also for
        // a key of another kind).
        match self.query_native::<i64>(&cmd, Route::Direct).await {
            Err(e) if e.is_wrong_type() => Ok(false),
            deleted => Ok(deleted? == Some(1)),
        }
    }

    async fn ping(&self) -> Result<(), BackendError> {
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

impl RedisBackend {
    /// [`Locking::extend_many`] on one server: one pipeline (`SET ... IFEQ` where the
    /// server has it, else EVALSHA), one answer for the batch.
    async fn extend_pipelined(
        &self,
        leases: &[(&str, &str, Duration)],
    ) -> Result<Vec<bool>, BackendError> {
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
                    // `WRONGTYPE` (a key of another kind) says nothing of the server's
                    // commands: the scripts answer it (0: not this holder's).
                    Err(e) if crate::error::is_wrong_type(&e) => {}
                    // Only a reply that the command is missing turns them off (see
                    // `BackendError::is_capability_missing`); `BUSY` and the like fail
                    // the batch, to be retried.
                    Err(e) if crate::error::capability_missing(&e) => {
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
fn holds_token(held: &str, token: &str) -> bool {
    held.strip_prefix(token)
        .is_some_and(|rest| rest.is_empty() || rest == " waiting")
}
