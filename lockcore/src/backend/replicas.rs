//! Replica acknowledgement: a write, then `WAIT replicas timeout`, pipelined on one
//! connection. `WAIT` counts the replicas that acknowledged every write the connection
//! it is sent on made, so it must follow the write there; since the replication stream
//! is one ordered log, acknowledging this write acknowledges every earlier one too (the
//! write that took the lock or claimed the record, whichever connection sent it).
//!
//! The write in front of each `WAIT` is one that is safe to repeat and checks what it
//! finds: a compare-and-extend, a claim's renewal (which writes a vanished claim again),
//! a stored result made sure of (written again if missing). A `WAIT` sent alone, or
//! after a write on another connection, could be acknowledged by a new primary that
//! lacks the write a failover lost; in front of its own write, it counts that write on
//! the primary it reaches.
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
use crate::error::BackendError;
use crate::key::Companion;

/// What a write made to be acknowledged found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acked<T> {
    /// The write's own answer.
    pub(crate) value: T,
    /// Replicas that acknowledged it within the wait.
    pub(crate) replicas: u32,
}

/// A stored idempotency result to make sure of (see [`Acknowledging::confirm_store`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreArgs<'a> {
    /// The record's key.
    pub(crate) key: &'a str,
    /// The completed record that was stored.
    pub(crate) record: &'a str,
    /// The claim's owner token.
    pub(crate) owner: &'a str,
    /// How long the record stays when written alone.
    pub(crate) retention: Duration,
    /// The channel that wakes waiting repeats.
    pub(crate) channel: &'a str,
}

/// One lease to renew in [`Acknowledging::extend_acked_many`]: a lock key, or a
/// permit's (or read share's) sorted set, its token and its ttl.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Extension<'a> {
    /// The lock key, or the sorted set of a permit or read share.
    pub(crate) key: &'a str,
    /// The holder's token.
    pub(crate) token: &'a str,
    /// The lease to set again; zero: kept as it is (its expiry written again, so that
    /// the `WAIT` behind counts a write).
    pub(crate) ttl: Duration,
    /// A permit or a read share (`permit_extend.lua`), not a lock.
    pub(crate) permit: bool,
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
        _idle: Duration,
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

    /// A stored result made sure of (`idem_confirm_store.lua`: there, or written again
    /// after the owner's claim, or alone if the key is gone), then `WAIT`, on one
    /// connection: a failover between the store and the acknowledgement makes the
    /// result be written on the new primary before its replicas count it. `value`: the
    /// result is the record's (false: another call's result or claim is there).
    async fn confirm_store(
        &self,
        _store: &StoreArgs<'_>,
        _replicas: u32,
    ) -> Result<Acked<bool>, BackendError> {
        Err(super::redlock::unsupported("replica acknowledgement"))
    }

    /// Compare-and-extends of locks (`extend.lua`) and of permits or read shares
    /// (`permit_extend.lua`), all on one primary, then `WAIT`, pipelined on one
    /// connection: each lease's answer, and how many replicas acknowledged them all.
    /// A renewal counted by a `WAIT` sent on another connection could be acknowledged
    /// by a new primary that lacks it.
    async fn extend_acked_many(
        &self,
        _leases: &[Extension<'_>],
        _replicas: u32,
    ) -> Result<Acked<Vec<bool>>, BackendError> {
        Err(super::redlock::unsupported("replica acknowledgement"))
    }

    /// Which renewals go in one [`extend_acked_many`](Self::extend_acked_many): keys
    /// of one group are on one primary, whose `WAIT` then counts them all. One group
    /// for a single server (Sentinel's primary included); on a cluster, one per slot (a
    /// slot is served by one primary, whatever a reshard is doing).
    fn ack_group(&self, _key: &str) -> u64 {
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
        idle: Duration,
        replicas: u32,
    ) -> Result<Acked<Option<u64>>, BackendError> {
        Ok(Acked {
            value: self.fence(key, token, idle).await?,
            replicas,
        })
    }

    async fn confirm_store(
        &self,
        _store: &StoreArgs<'_>,
        replicas: u32,
    ) -> Result<Acked<bool>, BackendError> {
        Ok(Acked {
            value: true,
            replicas,
        })
    }

    async fn extend_acked_many(
        &self,
        leases: &[Extension<'_>],
        replicas: u32,
    ) -> Result<Acked<Vec<bool>>, BackendError> {
        let mut value = Vec::with_capacity(leases.len());
        for l in leases {
            value.push(if l.permit {
                self.extend_permits(&[(l.key, l.token, l.ttl)])
                    .await
                    .into_iter()
                    .next()
                    .unwrap_or(Ok(false))?
            } else {
                self.extend(l.key, l.token, l.ttl)
            });
        }
        Ok(Acked { value, replicas })
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
        idle: Duration,
        replicas: u32,
    ) -> Result<Acked<Option<u64>>, BackendError> {
        each!(self, b => b.fence_acked(key, token, idle, replicas))
    }

    async fn confirm_store(
        &self,
        store: &StoreArgs<'_>,
        replicas: u32,
    ) -> Result<Acked<bool>, BackendError> {
        each!(self, b => b.confirm_store(store, replicas))
    }

    async fn extend_acked_many(
        &self,
        leases: &[Extension<'_>],
        replicas: u32,
    ) -> Result<Acked<Vec<bool>>, BackendError> {
        each!(self, b => b.extend_acked_many(leases, replicas))
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

    fn ack_group(&self, key: &str) -> u64 {
        each!(sync self, b => b.ack_group(key))
    }
}

impl RedisBackend {
    /// How long `WAIT` waits: half the command timeout, so its answer comes back within it.
    fn replica_wait(&self) -> u64 {
        millis(self.timeout() / 2).max(1)
    }
}

/// One compare-and-extend in a pipeline: `extend.lua` of a lock, `permit_extend.lua` of
/// a permit or a read share (which keeps its lock key's `readers` with it). EVAL, not
/// EVALSHA: a NOSCRIPT inside a pipeline would leave the WAIT alone.
fn extend_call(pipe: &mut redis::Pipeline, l: &Extension<'_>) {
    let script = match l.permit {
        true => super::scripts::PERMIT_EXTEND,
        false => super::scripts::EXTEND,
    };
    let lock = crate::key::readers_of(l.key).filter(|_| l.permit);
    pipe.cmd("EVAL")
        .arg(script)
        .arg(1 + usize::from(lock.is_some()))
        .arg(l.key);
    if let Some(lock) = lock {
        pipe.arg(lock);
    }
    // A zero ttl keeps the lease as it is (see the scripts).
    let ms = if l.ttl.is_zero() { 0 } else { millis(l.ttl) };
    pipe.arg(l.token).arg(ms);
}

impl Acknowledging for RedisBackend {
    fn ack_group(&self, key: &str) -> u64 {
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
        let lease = Extension {
            key,
            token,
            ttl,
            permit: false,
        };
        let Acked { value, replicas } = self.extend_acked_many(&[lease], replicas).await?;
        Ok(Acked {
            value: value.first().copied().unwrap_or(false),
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
        let lease = Extension {
            key: set,
            token,
            ttl,
            permit: true,
        };
        let Acked { value, replicas } = self.extend_acked_many(&[lease], replicas).await?;
        Ok(Acked {
            value: value.first().copied().unwrap_or(false),
            replicas,
        })
    }

    async fn fence_acked(
        &self,
        key: &str,
        token: &str,
        idle: Duration,
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
            .arg(super::millis(idle))
            .cmd("WAIT")
            .arg(replicas)
            .arg(self.replica_wait());
        let (fence, acked): (Option<u64>, u32) = match self.query_pipe_alone(&pipe).await {
            // The key and its counter split between the two nodes of a migrating cluster
            // slot: as the plain fence goes (`fence_split`), the counter's step where the
            // counter goes, its `WAIT` on that connection, then the key.
            Err(e) if e.is_split() => {
                let wait = (replicas, self.replica_wait());
                Box::pin(self.fence_split_acked(key, token, idle, wait)).await?
            }
            asked => asked?,
        };
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

    async fn confirm_store(
        &self,
        store: &StoreArgs<'_>,
        replicas: u32,
    ) -> Result<Acked<bool>, BackendError> {
        let script = match self.is_cluster() {
            true => super::scripts::sharded(super::scripts::IDEM_CONFIRM_STORE),
            false => super::scripts::IDEM_CONFIRM_STORE.to_owned(),
        };
        let mut pipe = redis::pipe();
        // EVAL for the reason above.
        pipe.cmd("EVAL")
            .arg(script)
            .arg(1)
            .arg(store.key)
            .arg(store.record)
            .arg(store.owner)
            .arg(millis(store.retention))
            .arg(store.channel)
            .cmd("WAIT")
            .arg(replicas)
            .arg(self.replica_wait());
        let (stored, acked): (i64, u32) = self.query_pipe_alone(&pipe).await?;
        if stored == 2 {
            tracing::warn!(target: "distlock", key = store.key, "stored idempotency result missing when its replicas were asked (a failover lost it): written again");
        }
        Ok(Acked {
            value: stored != 0,
            replicas: acked,
        })
    }

    async fn extend_acked_many(
        &self,
        leases: &[Extension<'_>],
        replicas: u32,
    ) -> Result<Acked<Vec<bool>>, BackendError> {
        let mut pipe = redis::pipe();
        for l in leases {
            extend_call(&mut pipe, l);
        }
        pipe.cmd("WAIT").arg(replicas).arg(self.replica_wait());
        let mut replies: Vec<redis::Value> = self.query_pipe_alone(&pipe).await?;
        let acked = match replies.pop() {
            Some(redis::Value::Int(n)) => u32::try_from(n).unwrap_or(0),
            other => {
                return Err(BackendError::new(
                    crate::error::BackendErrorKind::Response,
                    format!("WAIT answered {other:?}"),
                ));
            }
        };
        let value = replies
            .into_iter()
            .map(|v| matches!(v, redis::Value::Int(1)))
            .collect();
        Ok(Acked {
            value,
            replicas: acked,
        })
    }
}
