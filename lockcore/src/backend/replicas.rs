//! Replica acknowledgement: a write, then `WAIT replicas timeout`, pipelined on one
//! connection. `WAIT` counts the replicas that acknowledged every write the connection
//! it is sent on made, so it must follow the write there; since the replication stream
//! is one ordered log, acknowledging this write acknowledges every earlier one too (the
//! write that took the lock or claimed the record, whichever connection sent it).
//!
//! `WAIT` holds its connection (for up to half the command timeout) while replicas
//! catch up, so these pipelines go on a connection no other call uses meanwhile (see
//! `RedisBackend::query_pipe_alone`): a lagging replica slows only the calls that wait
//! for it.
//!
//! In memory there is nothing to replicate to: every count is acknowledged; independent
//! masters (Redlock) cannot count replicas, and say so.

use std::time::Duration;

use super::memory::MemoryBackend;
use super::redis::RedisBackend;
use super::{Backend, Locking, each, millis};
use crate::error::{BackendError, Error};
use crate::key::Companion;

/// What a write made to be acknowledged found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acked<T> {
    /// The write's own answer.
    pub(crate) value: T,
    /// Replicas that acknowledged it within the wait.
    pub(crate) replicas: u32,
}

/// Replica acknowledgement by a topology. One that cannot count replicas (independent
/// masters) keeps the defaults: every call is an error saying so.
pub(crate) trait Acknowledging: Send + Sync {
    /// A compare-and-extend of a lock just taken (lease `ttl` again), then `WAIT`:
    /// `value` is whether the key still held the token.
    async fn confirm_lock(
        &self,
        _key: &str,
        _token: &str,
        _ttl: Duration,
        _replicas: u32,
    ) -> Result<Acked<bool>, BackendError> {
        Err(super::redlock::unsupported("replica acknowledgement"))
    }

    /// [`confirm_lock`](Self::confirm_lock) of a semaphore's permit or a read share:
    /// `permit_extend.lua` on the sorted set `set`, then `WAIT`, on one connection (a
    /// failover between the two breaks it: never an acknowledgement of a write the new
    /// primary lacks).
    async fn confirm_permit(
        &self,
        _set: &str,
        _token: &str,
        _ttl: Duration,
        _replicas: u32,
    ) -> Result<Acked<bool>, BackendError> {
        Err(super::redlock::unsupported("replica acknowledgement"))
    }

    /// [`Locking::fence`], then `WAIT`.
    async fn fence_acked(
        &self,
        _key: &str,
        _token: &str,
        _replicas: u32,
    ) -> Result<Acked<Option<u64>>, BackendError> {
        Err(super::redlock::unsupported("replica acknowledgement"))
    }

    /// An idempotency claim's renewal (`idem_renew.lua`: the record still this owner's
    /// claim, written again if it was gone), then `WAIT`, on one connection: a failover
    /// between the claim and the acknowledgement makes the renewal find the claim on the
    /// new primary (or write it there) before the replicas count it.
    async fn confirm_claim(
        &self,
        _key: &str,
        _owner: &super::idem::Owner<'_>,
        _lease: (Duration, Duration),
        _replicas: u32,
    ) -> Result<Acked<super::idem::Renewal>, BackendError> {
        Err(super::redlock::unsupported("replica acknowledgement"))
    }

    /// A write of `{record}:acked` (gone after a second), then `WAIT`: every write made
    /// before it, the record's included, reached this many replicas.
    async fn barrier(&self, _record: &str, _replicas: u32) -> Result<u32, BackendError> {
        Err(super::redlock::unsupported("replica acknowledgement"))
    }

    /// Which barrier covers a write to `key`: writes whose keys are in one group are
    /// made on one primary, so one [`barrier`](Self::barrier) after them covers them
    /// all. One group for a single server (Sentinel's primary included); on a cluster,
    /// one per slot (a slot is served by one primary, whatever a reshard is doing).
    fn barrier_group(&self, _key: &str) -> u64 {
        0
    }
}

impl Acknowledging for super::redlock::RedlockBackend {}

/// In memory there is nothing to replicate to: every count is acknowledged.
impl Acknowledging for MemoryBackend {
    async fn confirm_lock(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        replicas: u32,
    ) -> Result<Acked<bool>, BackendError> {
        Ok(Acked {
            value: self.extend(key, token, ttl),
            replicas,
        })
    }

    async fn fence_acked(
        &self,
        key: &str,
        token: &str,
        replicas: u32,
    ) -> Result<Acked<Option<u64>>, BackendError> {
        Ok(Acked {
            value: self.fence(key, token).await?,
            replicas,
        })
    }

    async fn barrier(&self, _record: &str, replicas: u32) -> Result<u32, BackendError> {
        Ok(replicas)
    }

    async fn confirm_claim(
        &self,
        key: &str,
        owner: &super::idem::Owner<'_>,
        (lease, lifetime): (Duration, Duration),
        replicas: u32,
    ) -> Result<Acked<super::idem::Renewal>, BackendError> {
        use super::idem::Records;
        Ok(Acked {
            value: self.idem_renew(key, owner, lease, lifetime).await?,
            replicas,
        })
    }

    async fn confirm_permit(
        &self,
        set: &str,
        token: &str,
        ttl: Duration,
        replicas: u32,
    ) -> Result<Acked<bool>, BackendError> {
        Ok(Acked {
            value: self
                .extend_permits(&[(set, token, ttl)])
                .await
                .into_iter()
                .next()
                .unwrap_or(Ok(false))?,
            replicas,
        })
    }
}

impl Acknowledging for Backend {
    async fn confirm_lock(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        replicas: u32,
    ) -> Result<Acked<bool>, BackendError> {
        each!(self, b => b.confirm_lock(key, token, ttl, replicas))
    }

    async fn fence_acked(
        &self,
        key: &str,
        token: &str,
        replicas: u32,
    ) -> Result<Acked<Option<u64>>, BackendError> {
        each!(self, b => b.fence_acked(key, token, replicas))
    }

    async fn barrier(&self, record: &str, replicas: u32) -> Result<u32, BackendError> {
        each!(self, b => b.barrier(record, replicas))
    }

    async fn confirm_claim(
        &self,
        key: &str,
        owner: &super::idem::Owner<'_>,
        lease: (Duration, Duration),
        replicas: u32,
    ) -> Result<Acked<super::idem::Renewal>, BackendError> {
        each!(self, b => b.confirm_claim(key, owner, lease, replicas))
    }

    async fn confirm_permit(
        &self,
        set: &str,
        token: &str,
        ttl: Duration,
        replicas: u32,
    ) -> Result<Acked<bool>, BackendError> {
        each!(self, b => b.confirm_permit(set, token, ttl, replicas))
    }

    fn barrier_group(&self, key: &str) -> u64 {
        each!(sync self, b => b.barrier_group(key))
    }
}

impl Backend {
    /// [`barrier`](Self::barrier) as the caller's answer: `Ok` when `replicas`
    /// acknowledged, else [`Error::NotReplicated`] (or `Backend`) about `key`.
    pub(crate) async fn require_acked(&self, key: &str, replicas: u32) -> Result<(), Error> {
        match self.barrier(key, replicas).await {
            Ok(acked) if acked >= replicas => Ok(()),
            Ok(acked) => {
                tracing::warn!(target: "distlock", key, acked, wanted = replicas, "write not acknowledged by enough replicas");
                Err(Error::NotReplicated {
                    key: key.to_owned(),
                    acked,
                    wanted: replicas,
                })
            }
            Err(e) => Err(Error::backend(key, e)),
        }
    }
}

impl RedisBackend {
    /// How long `WAIT` waits: half the command timeout, so its answer comes back within it.
    fn replica_wait(&self) -> u64 {
        millis(self.timeout() / 2).max(1)
    }

    /// A compare-and-extend `script` (`extend.lua`, `permit_extend.lua`) of `key`
    /// holding `token` (lease `ttl` again), then `WAIT` for `replicas`, pipelined on one
    /// connection: `value` is whether the key still held the token.
    async fn extend_acked(
        &self,
        script: &str,
        key: &str,
        token: &str,
        (ttl, replicas): (Duration, u32),
    ) -> Result<Acked<bool>, BackendError> {
        let mut pipe = redis::pipe();
        // EVAL, not EVALSHA: a NOSCRIPT inside a pipeline would leave the WAIT alone.
        // A read share keeps its lock key's `readers` with it (permit_extend.lua).
        let lock = crate::key::readers_of(key).filter(|_| script == super::scripts::PERMIT_EXTEND);
        pipe.cmd("EVAL")
            .arg(script)
            .arg(1 + usize::from(lock.is_some()))
            .arg(key);
        if let Some(lock) = lock {
            pipe.arg(lock);
        }
        pipe.arg(token)
            .arg(millis(ttl))
            .cmd("WAIT")
            .arg(replicas)
            .arg(self.replica_wait());
        let (held, acked): (i64, u32) = self.query_pipe_alone(&pipe).await?;
        Ok(Acked {
            value: held == 1,
            replicas: acked,
        })
    }
}

impl Acknowledging for RedisBackend {
    fn barrier_group(&self, key: &str) -> u64 {
        if self.is_cluster() {
            u64::from(crate::key::slot(key.as_bytes()))
        } else {
            0
        }
    }

    async fn confirm_lock(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        replicas: u32,
    ) -> Result<Acked<bool>, BackendError> {
        self.extend_acked(super::scripts::EXTEND, key, token, (ttl, replicas))
            .await
    }

    async fn confirm_permit(
        &self,
        set: &str,
        token: &str,
        ttl: Duration,
        replicas: u32,
    ) -> Result<Acked<bool>, BackendError> {
        self.extend_acked(super::scripts::PERMIT_EXTEND, set, token, (ttl, replicas))
            .await
    }

    async fn fence_acked(
        &self,
        key: &str,
        token: &str,
        replicas: u32,
    ) -> Result<Acked<Option<u64>>, BackendError> {
        // One script (see `RedisBackend::fence`), EVAL for the reason above.
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(super::scripts::FENCE)
            .arg(2)
            .arg(key)
            .arg(Companion(key, ":fence"))
            .arg(token)
            .cmd("WAIT")
            .arg(replicas)
            .arg(self.replica_wait());
        let (fence, acked): (Option<u64>, u32) = self.query_pipe_alone(&pipe).await?;
        Ok(Acked {
            value: fence,
            replicas: acked,
        })
    }

    async fn confirm_claim(
        &self,
        key: &str,
        owner: &super::idem::Owner<'_>,
        (lease, lifetime): (Duration, Duration),
        replicas: u32,
    ) -> Result<Acked<super::idem::Renewal>, BackendError> {
        let mut pipe = redis::pipe();
        // EVAL for the reason above.
        pipe.cmd("EVAL")
            .arg(super::scripts::IDEM_RENEW)
            .arg(1)
            .arg(key)
            .arg(owner.token)
            .arg(millis(lease))
            .arg(millis(lifetime))
            .arg(owner.fp)
            .cmd("WAIT")
            .arg(replicas)
            .arg(self.replica_wait());
        let (renewed, acked): (i64, u32) = self.query_pipe_alone(&pipe).await?;
        Ok(Acked {
            value: super::idem::renewal(renewed),
            replicas: acked,
        })
    }

    async fn barrier(&self, record: &str, replicas: u32) -> Result<u32, BackendError> {
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(Companion(record, ":acked"))
            .arg(1)
            .arg("PX")
            .arg(1000)
            .ignore()
            .cmd("WAIT")
            .arg(replicas)
            .arg(self.replica_wait());
        let (acked,): (u32,) = self.query_pipe_alone(&pipe).await?;
        Ok(acked)
    }
}
