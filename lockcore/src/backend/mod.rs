//! Where locks and idempotency records live: a standalone Redis (multiplexed and direct
//! connections, `redis` and `direct`), a Redis Cluster (`redis` over a cluster
//! connection: the same commands and scripts, redirects followed there, sharded Pub/Sub
//! in the scripts' cluster forms, `scripts::sharded`), the primary Sentinel names
//! (`redis` connecting through `sentinel`), independent masters (`redlock`: locks only),
//! or process memory (`memory`, for tests and examples). Nothing above this layer knows
//! which.
//!
//! # What a topology provides
//!
//! A new topology (a Redis Cluster, Sentinel, independent masters) is one more variant of
//! [`Backend`], and must give each operation the meaning the scripts in `src/scripts/`
//! define, atomically:
//!
//! - `try_acquire`: set the key to the token if free (or a yield marker that does not
//!   name this client, or the caller's own token: a lost handoff reply), with the ttl;
//!   a free key costs one plain `SET NX PX`. A waiter that will be woken by a message
//!   marks the holder's value (`<token> waiting`) when it finds the key held; every
//!   compare accepts a token with or without that mark.
//! - `fence`: the next value of the fencing counter (`<key>:fence`, same hash slot)
//!   when the key holds the token from before the counter moved, else nothing (lost):
//!   one Redis pipelines `INCR` then `GET` (see `redis.rs`), a cluster runs `fence.lua`.
//! - `release`: compare the token, then delete, hand to the next local waiter, or leave a
//!   yield marker; publish on the key's channel when someone listens. Without a
//!   successor and without a waiter's mark, a compare-and-delete and nothing more.
//!   The key gone or holding another token is `NotOurs` (the caller reads it, see
//!   `lock.rs`); the key holding the successor's token is `Handed`.
//! - `extend_many`: compare-and-extend many leases in one round trip.
//! - the idempotency operations (`idem.rs`): claim, complete, release, renew, each
//!   checking the owner token, as `idem_*.lua`.
//! - replica acknowledgement (`replicas.rs`): a write, then `WAIT` on the same
//!   connection, for locks, fences and idempotency records.
//! - `ping`, and wake-ups: every key's companions (fence, turns, channel, `:done`) are
//!   named by `crate::key::companion`, so one lock's keys share a slot; the notifier must
//!   deliver the channel's messages to this client's subscribers.
//!
//! Every call is bounded by the command timeout; a failure says whether the command may
//! have run (`BackendError::is_transient`), since the callers retry or clean up on it.

use std::time::Duration;

use crate::error::BackendError;

pub(crate) mod direct;
pub(crate) mod idem;
pub(crate) mod memory;
pub(crate) mod native;
pub(crate) mod redis;
pub(crate) mod redlock;
pub(crate) mod replicas;
pub mod scripts;
pub(crate) mod sentinel;

/// What one acquire try found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Try {
    /// Taken.
    Taken,
    /// Held by someone else, for about this much longer (`None`: unknown).
    Busy(Option<Duration>),
}

/// What a release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// The token matched and the key was deleted now.
    Now,
    /// The token matched and the lock was left to the other clients waiting for it, for
    /// this client's yield window.
    Yielded,
    /// The key was gone or held another token: on a first try, the lock was lost; on a
    /// retry, see [`Released::Earlier`] and [`Released::Unknown`] (the caller decides).
    NotOurs,
    /// On a retry, the key no longer held the token before this lease could have ended:
    /// the lost try released it.
    Earlier,
    /// On a retry past the lease's end: whether the lost try released the lock before it
    /// expired cannot be told.
    Unknown,
    /// The lock now belongs to the next local waiter.
    Handed,
}

/// How one acquire try is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The first: a plain `SET NX PX GET`, the script only when the key holds something
    /// this caller may take over.
    First,
    /// A later one, through the script; `true`: the caller will be woken by a message,
    /// so the script marks the holder's value.
    Again(bool),
}

/// One release: whose lock, and what to do with it.
pub(crate) struct ReleaseCall<'a> {
    pub(crate) key: &'a str,
    pub(crate) token: &'a str,
    /// The next local waiter to hand the lock to, if any.
    pub(crate) successor: Option<Successor<'a>>,
    /// Others likely wait (the lock was waited for or handed over): skip the plain
    /// compare-and-delete that would find the waiters' mark and defer anyway.
    pub(crate) contended: bool,
    /// This client's id and yield window (`None`: never yield).
    pub(crate) yield_to: Option<(&'a str, Duration)>,
    /// Whether this client's own Pub/Sub connection may be subscribed to the key's
    /// channel (`crate::notify::channel_of`): asked only by a release that wakes waiters.
    pub(crate) self_subscribed: &'a (dyn Fn(&str) -> bool + Sync),
}

/// The next local waiter of a release.
#[derive(Clone, Copy)]
pub(crate) struct Successor<'a> {
    pub(crate) token: &'a str,
    pub(crate) ttl: Duration,
    /// This client's turn is over: hand over only when no other client waits.
    pub(crate) turn_over: bool,
}

// Redlock's calls are boxed: each nests a call per master, and every caller's future
// (up to the users' functions) would carry that type.
// One per client, behind its `Arc`: its size costs nothing, a box would cost a
// dereference on every call (the redis-rs client grows with the `tls` feature).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    Redis(redis::RedisBackend),
    /// Independent masters (see `redlock.rs`).
    Redlock(redlock::RedlockBackend),
    Memory(memory::MemoryBackend),
}

impl Backend {
    /// One atomic try. `client` is this client's id (see `release.lua`).
    pub(crate) async fn try_acquire(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        client: &str,
        attempt: Attempt,
    ) -> Result<Try, BackendError> {
        match self {
            Backend::Redis(r) => r.try_acquire(key, token, ttl, client, attempt).await,
            Backend::Redlock(r) => {
                crate::util::erased(r.try_acquire(key, token, ttl, attempt)).await
            }
            Backend::Memory(m) => Ok(m.try_acquire(key, token, ttl)),
        }
    }

    /// The next fencing token of the lock `key` while it holds `token`; `None`: lost.
    pub(crate) async fn fence(&self, key: &str, token: &str) -> Result<Option<u64>, BackendError> {
        match self {
            Backend::Redis(r) => r.fence(key, token).await,
            Backend::Redlock(_) => Err(redlock::unsupported("fencing tokens")),
            Backend::Memory(m) => Ok(m.fence(key, token)),
        }
    }

    /// One compare-and-delete that also wakes the key's waiters, or hands the lock to
    /// the next local waiter.
    pub(crate) async fn release(&self, call: &ReleaseCall<'_>) -> Result<Released, BackendError> {
        match self {
            Backend::Redis(r) => r.release(call).await,
            Backend::Redlock(r) => crate::util::erased(r.release(call)).await,
            Backend::Memory(m) => Ok(m.release(call)),
        }
    }

    /// A compare-and-delete that wakes nobody, where the server has one natively:
    /// `false` when it has none (release instead).
    pub(crate) async fn delete_if(&self, key: &str, token: &str) -> Result<bool, BackendError> {
        match self {
            Backend::Redis(r) => r.delete_if(key, token).await,
            Backend::Redlock(_) | Backend::Memory(_) => Ok(false),
        }
    }

    /// Compare-and-extend of many locks in one round trip: `true` where extended.
    pub(crate) async fn extend_many(
        &self,
        leases: &[(&str, &str, Duration)],
    ) -> Result<Vec<bool>, BackendError> {
        match self {
            Backend::Redis(r) => r.extend_many(leases).await,
            Backend::Redlock(r) => crate::util::erased(r.extend_many(leases)).await,
            Backend::Memory(m) => Ok(leases
                .iter()
                .map(|(key, token, ttl)| m.extend(key, token, *ttl))
                .collect()),
        }
    }

    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        match self {
            Backend::Redis(r) => r.ping().await,
            Backend::Redlock(r) => crate::util::erased(r.ping()).await,
            Backend::Memory(_) => Ok(()),
        }
    }

    /// How long one command may take (zero in memory).
    pub(crate) fn command_timeout(&self) -> Duration {
        match self {
            Backend::Redis(r) => r.timeout(),
            Backend::Redlock(r) => r.timeout(),
            Backend::Memory(_) => Duration::ZERO,
        }
    }

    /// Changes whenever the server may have lost keys (see `RedisBackend::epoch`); the
    /// in-memory backend never loses any.
    pub(crate) fn epoch(&self) -> u64 {
        match self {
            Backend::Redis(r) => r.epoch(),
            Backend::Redlock(r) => r.epoch(),
            Backend::Memory(_) => 0,
        }
    }

    pub(crate) fn is_memory(&self) -> bool {
        matches!(self, Backend::Memory(_))
    }

    /// Redlock: a try that a quorum did not give was given back on every master, so the
    /// next try takes a new token (a late give-back must not remove it).
    pub(crate) fn is_redlock(&self) -> bool {
        matches!(self, Backend::Redlock(_))
    }
}

/// Milliseconds for `PX`, at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
