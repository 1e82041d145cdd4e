//! The Redis backend: one multiplexed connection per client and tokio runtime,
//! reconnected when it breaks, plus a few direct connections for the lock scripts (see
//! [`super::direct`]); every call bounded by the command timeout.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, FromRedisValue, Script, ScriptInvocation};
use tokio::runtime::Handle;

use super::direct::{Direct, Place};
use super::{ReleaseCall, Released, Try, millis};
use crate::error::{BackendError, BackendErrorKind};

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::ACQUIRE));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::RELEASE));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(super::scripts::EXTEND));

/// How many runtimes' connections one client keeps.
const MAX_RUNTIMES: usize = 8;

/// How many direct connections one client keeps open at most (over all runtimes).
const MAX_DIRECT: usize = 4;

/// Direct connections serve a call only while fewer calls than this are in flight on
/// the client: under heavy concurrency the multiplexed connection pipelines many
/// commands per socket read and write, which costs redis-server less CPU per command.
const DIRECT_BELOW: usize = 3;

pub(crate) struct RedisBackend {
    client: redis::Client,
    timeout: Duration,
    /// Live connections and the runtimes they were born on: a connection's driver task
    /// dies with its runtime, so a call from another runtime opens its own. Kept short
    /// (the newest [`MAX_RUNTIMES`]), since a runtime that shut down leaves a dead entry.
    slots: Mutex<Vec<Slot>>,
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
    /// Idle direct connections, newest last.
    idle: Mutex<Vec<Direct>>,
    /// Direct connections open now, idle or in use.
    live: Arc<AtomicUsize>,
    /// Script calls in flight now.
    in_flight: AtomicUsize,
    /// Whether the address can be served by direct connections (not TLS).
    direct: bool,
    /// Whether the server's eviction policy was read (once per client, see
    /// [`warn_if_evicting`]).
    policy_checked: AtomicBool,
    /// Whether the server takes `SET ... NX GET` (Redis 7.0+); cleared on its first
    /// syntax error, after which claims go through the script only.
    pub(super) set_nx_get: AtomicBool,
}

struct Slot {
    runtime: tokio::runtime::Id,
    conn: MultiplexedConnection,
    generation: u64,
}

impl RedisBackend {
    pub(crate) fn new(client: redis::Client, timeout: Duration) -> Self {
        let direct = Direct::serves(client.get_connection_info());
        RedisBackend {
            client,
            timeout,
            slots: Mutex::new(Vec::new()),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
            idle: Mutex::new(Vec::new()),
            live: Arc::new(AtomicUsize::new(0)),
            in_flight: AtomicUsize::new(0),
            direct,
            policy_checked: AtomicBool::new(false),
            set_nx_get: AtomicBool::new(true),
        }
    }

    /// An idle direct connection of this runtime, or a new one while fewer than
    /// [`MAX_DIRECT`] are open; `None` sends the call over the multiplexed connection.
    async fn take_direct(
        &self,
        runtime: tokio::runtime::Id,
    ) -> Result<Option<Direct>, BackendError> {
        if !self.direct {
            return Ok(None);
        }
        while let Some(found) = self.idle_of(runtime) {
            if !found.is_broken() {
                return Ok(Some(found));
            }
            tracing::debug!(target: "distlock", "an idle direct connection was closed by redis; replacing it");
        }
        let place = match Place::take(&self.live, MAX_DIRECT) {
            Some(place) => place,
            None => {
                // Make room by closing one left by another runtime (most likely one
                // that has shut down); otherwise every direct connection is busy.
                let mut idle = crate::util::lock(&self.idle);
                let Some(other) = idle.iter().position(|d| d.runtime() != runtime) else {
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
        let info = self.client.get_connection_info();
        let opened = Direct::open(info, runtime, place).await?;
        tracing::debug!(target: "distlock", open = self.live.load(Ordering::Relaxed), "opened a direct connection to redis");
        Ok(Some(opened))
    }

    /// The newest idle direct connection of `runtime`, taken out of the pool.
    fn idle_of(&self, runtime: tokio::runtime::Id) -> Option<Direct> {
        let mut idle = crate::util::lock(&self.idle);
        let at = idle.iter().rposition(|d| d.runtime() == runtime)?;
        Some(idle.swap_remove(at))
    }

    fn give_back(&self, conn: Direct) {
        crate::util::lock(&self.idle).push(conn);
    }

    /// Closes every idle direct connection (one broke: the others likely share its fate).
    fn drop_idle(&self) {
        let stale = std::mem::take(&mut *crate::util::lock(&self.idle));
        drop(stale);
    }

    fn cached(&self, runtime: tokio::runtime::Id) -> Option<(MultiplexedConnection, u64)> {
        let slots = crate::util::lock(&self.slots);
        slots
            .iter()
            .find(|s| s.runtime == runtime)
            .map(|s| (s.conn.clone(), s.generation))
    }

    async fn connection(&self) -> Result<(MultiplexedConnection, u64), BackendError> {
        let runtime = current_runtime()?;
        if let Some(found) = self.cached(runtime) {
            return Ok(found);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(found) = self.cached(runtime) {
            return Ok(found);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let mut slots = crate::util::lock(&self.slots);
        slots.retain(|s| s.runtime != runtime);
        if slots.len() >= MAX_RUNTIMES {
            slots.remove(0);
        }
        slots.push(Slot {
            runtime,
            conn: conn.clone(),
            generation,
        });
        tracing::debug!(target: "distlock", generation, "connected to redis");
        Ok((conn, generation))
    }

    /// On this client's first call only: reads the eviction policy over the multiplexed
    /// connection (opened now), in a task of its own.
    async fn check_policy_once(&self) {
        if self.policy_checked.load(Ordering::Relaxed)
            || self.policy_checked.swap(true, Ordering::Relaxed)
        {
            return;
        }
        if let Ok((conn, _)) = self.connection().await {
            tokio::spawn(warn_if_evicting(conn, self.timeout));
        }
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
                match &reply {
                    Ok(_) => self.give_back(direct),
                    // The server answered: the connection is in step.
                    Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => {
                        self.give_back(direct)
                    }
                    Err(_) => {
                        drop(direct);
                        self.drop_idle();
                    }
                }
                return reply.map_err(BackendError::from);
            }
            let (mut conn, generation) = self.connection().await?;
            used.store(generation, Ordering::Relaxed);
            what.run::<T, _>(&mut conn).await.map_err(|e| {
                if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
                    self.forget(generation);
                }
                BackendError::from(e)
            })
        };
        self.within_timeout(&used, call).await
    }

    /// `call` within the command timeout. On a timeout the multiplexed connection it was
    /// using (its generation in `used`, 0 for none) is dropped: its late reply may still
    /// come, and must not be read as another call's.
    async fn within_timeout<T>(
        &self,
        used: &AtomicU64,
        call: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => {
                let generation = used.load(Ordering::Relaxed);
                if generation != 0 {
                    self.forget(generation);
                }
                Err(BackendError::timeout(self.timeout))
            }
        }
    }

    pub(crate) async fn try_acquire(
        &self,
        key: &str,
        fence_key: &str,
        token: &str,
        ttl: Duration,
        client: &str,
    ) -> Result<Try, BackendError> {
        let mut inv = ACQUIRE.prepare_invoke();
        inv.key(key)
            .key(fence_key)
            .arg(token)
            .arg(millis(ttl))
            .arg(client);
        let reply: i64 = self.eval(&inv).await?;
        Ok(match reply {
            fence @ 1.. => Try::Taken(fence.unsigned_abs()),
            -1 | 0 => Try::Busy(None),
            left => Try::Busy(Some(Duration::from_millis(left.unsigned_abs()))),
        })
    }

    pub(crate) async fn release(&self, call: &ReleaseCall<'_>) -> Result<Released, BackendError> {
        let mut inv = RELEASE.prepare_invoke();
        let (client, window) = call.yield_to.map_or(("", 0), |(c, w)| (c, millis(w)));
        let (next, next_ttl, turn_over) = call
            .successor
            .map_or(("", 0, false), |s| (s.token, millis(s.ttl), s.turn_over));
        inv.key(call.key)
            .key(call.fence_key)
            .key(crate::key::companion(call.key, ":turns"))
            .arg(call.token)
            .arg(call.channel)
            .arg(call.retry_of.map(|f| f.to_string()).unwrap_or_default())
            .arg(client)
            .arg(window)
            .arg(next)
            .arg(next_ttl)
            .arg(if turn_over { "1" } else { "" })
            .arg(u8::from(call.self_subscribed));
        let reply: Vec<i64> = self.eval(&inv).await?;
        Ok(match reply.as_slice() {
            [1] => Released::Now,
            [2] => Released::Earlier,
            [3] => Released::Unknown,
            [4, fence] => Released::Handed(fence.unsigned_abs()),
            [5] => Released::Yielded,
            _ => Released::Lost,
        })
    }

    /// One pipeline of compare-and-extend calls (EVALSHA; on NOSCRIPT the script is
    /// loaded and the pipeline sent once more).
    pub(crate) async fn extend_many(
        &self,
        leases: &[(&str, &str, Duration)],
    ) -> Result<Vec<bool>, BackendError> {
        let mut pipe = redis::pipe();
        for (key, token, ttl) in leases {
            pipe.cmd("EVALSHA")
                .arg(EXTEND.get_hash())
                .arg(1)
                .arg(*key)
                .arg(*token)
                .arg(millis(*ttl));
        }
        let used = AtomicU64::new(0);
        let call = async {
            let (mut conn, generation) = self.connection().await?;
            used.store(generation, Ordering::Relaxed);
            let mut reply = pipe.query_async::<Vec<i64>>(&mut conn).await;
            if let Err(e) = &reply
                && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
            {
                EXTEND.prepare_invoke().load_async(&mut conn).await?;
                reply = pipe.query_async::<Vec<i64>>(&mut conn).await;
            }
            reply.map_err(|e| {
                if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
                    self.forget(generation);
                }
                BackendError::from(e)
            })
        };
        let replies = self.within_timeout(&used, call).await?;
        Ok(replies.into_iter().map(|r| r == 1).collect())
    }

    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        let used = AtomicU64::new(0);
        let call = async {
            self.check_policy_once().await;
            let (mut conn, generation) = self.connection().await?;
            used.store(generation, Ordering::Relaxed);
            redis::cmd("PING")
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| {
                    self.forget(generation);
                    BackendError::from(e)
                })
        };
        self.within_timeout(&used, call).await
    }
}

/// Whether Redis may evict keys that have no ttl under `policy` (`maxmemory-policy`).
pub(crate) fn evicts_keys_without_ttl(policy: &str) -> bool {
    policy.starts_with("allkeys-")
}

/// Reads `maxmemory-policy` and warns when Redis may evict keys without a ttl: the fence
/// counters have none on purpose, and an evicted counter starts again from 1, so fences
/// would go backwards. Servers that refuse `CONFIG GET` (managed Redis, ACLs) are skipped.
async fn warn_if_evicting(mut conn: MultiplexedConnection, timeout: Duration) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let read = cmd.query_async::<Vec<String>>(&mut conn);
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(reply)) => {
            let policy = reply.get(1).map_or("", String::as_str);
            if evicts_keys_without_ttl(policy) {
                tracing::warn!(
                    target: "distlock",
                    policy,
                    "redis maxmemory-policy {policy} may evict keys without a ttl: a fence counter \
                     (`{{<lock key>}}:fence`) evicted starts again from 1 and fences go backwards; \
                     use `noeviction` or a `volatile-*` policy"
                );
            } else {
                tracing::debug!(target: "distlock", policy, "redis eviction policy keeps keys without a ttl");
            }
        }
        Ok(Err(e)) => {
            tracing::debug!(target: "distlock", error = %e, "cannot read redis maxmemory-policy")
        }
        Err(_) => tracing::debug!(target: "distlock", "reading redis maxmemory-policy timed out"),
    }
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

/// One call of [`RedisBackend::call`]: a script or a plain command.
#[derive(Clone, Copy)]
enum Call<'a, 'b> {
    Script(&'a ScriptInvocation<'b>),
    Cmd(&'a redis::Cmd),
}

impl Call<'_, '_> {
    async fn run<T: FromRedisValue, C: redis::aio::ConnectionLike + Send>(
        self,
        conn: &mut C,
    ) -> redis::RedisResult<T> {
        match self {
            Call::Script(inv) => inv.invoke_async::<T>(conn).await,
            Call::Cmd(cmd) => cmd.query_async::<T>(conn).await,
        }
    }
}
