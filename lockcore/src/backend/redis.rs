//! The Redis backend: one multiplexed connection per client and tokio runtime,
//! reconnected when it breaks, every call bounded by the command timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, FromRedisValue, Script, ScriptInvocation};
use tokio::runtime::Handle;

use super::{ReleaseCall, Released, Try, millis};
use crate::error::{BackendError, BackendErrorKind};

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/acquire.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/release.lua")));
static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/extend.lua")));

/// How many runtimes' connections one client keeps.
const MAX_RUNTIMES: usize = 8;

pub(crate) struct RedisBackend {
    client: redis::Client,
    timeout: Duration,
    /// Live connections and the runtimes they were born on: a connection's driver task
    /// dies with its runtime, so a call from another runtime opens its own. Kept short
    /// (the newest [`MAX_RUNTIMES`]), since a runtime that shut down leaves a dead entry.
    slots: Mutex<Vec<Slot>>,
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
}

struct Slot {
    runtime: tokio::runtime::Id,
    conn: MultiplexedConnection,
    generation: u64,
}

impl RedisBackend {
    pub(crate) fn new(client: redis::Client, timeout: Duration) -> Self {
        RedisBackend {
            client,
            timeout,
            slots: Mutex::new(Vec::new()),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
        }
    }

    fn cached(&self, runtime: tokio::runtime::Id) -> Option<(MultiplexedConnection, u64)> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots
            .iter()
            .find(|s| s.runtime == runtime)
            .map(|s| (s.conn.clone(), s.generation))
    }

    async fn connection(&self) -> Result<(MultiplexedConnection, u64), BackendError> {
        let runtime = Handle::try_current()
            .map_err(|_| {
                BackendError::new(BackendErrorKind::Config, "called outside a tokio runtime")
            })?
            .id();
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
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
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

    /// Drops the connection of `generation` so the next call reconnects.
    fn forget(&self, generation: u64) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.retain(|s| s.generation != generation);
    }

    /// Runs one script invocation (EVALSHA, loading the script on NOSCRIPT) within the timeout.
    pub(crate) async fn eval<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, BackendError> {
        let mut used = None;
        let call = async {
            let (mut conn, generation) = self.connection().await?;
            used = Some(generation);
            invocation.invoke_async::<T>(&mut conn).await.map_err(|e| {
                if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
                    self.forget(generation);
                }
                BackendError::from(e)
            })
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => {
                if let Some(generation) = used {
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
        let mut used = None;
        let call = async {
            let (mut conn, generation) = self.connection().await?;
            used = Some(generation);
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
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => Ok(result?.into_iter().map(|r| r == 1).collect()),
            Err(_) => {
                if let Some(generation) = used {
                    self.forget(generation);
                }
                Err(BackendError::timeout(self.timeout))
            }
        }
    }

    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        let call = async {
            let (mut conn, generation) = self.connection().await?;
            redis::cmd("PING")
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| {
                    self.forget(generation);
                    BackendError::from(e)
                })
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or_else(|_| Err(BackendError::timeout(self.timeout)))
    }
}
