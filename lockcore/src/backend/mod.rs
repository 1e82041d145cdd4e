//! Where locks and idempotency records live: a standalone Redis (multiplexed and direct
//! connections, `redis` and `direct`), or process memory (`memory`, for tests and
//! examples). Nothing above this layer knows which.
//!
//! # What a topology provides
//!
//! A new topology (a Redis Cluster, Sentinel, independent masters) is one more variant of
//! [`Backend`], and must give each operation the meaning the scripts in `src/scripts/`
//! define, atomically:
//!
//! - `try_acquire`: set the key to the token if free (or a yield marker that does not
//!   name this client, or the caller's own token: a lost handoff reply), with the ttl;
//!   the fencing counter (`<key>:fence`, same hash slot) increments on each taking.
//! - `release`: compare the token, then delete, hand to the next local waiter, or leave a
//!   yield marker; publish on the key's channel when someone listens; answer a retry of
//!   a release whose reply was lost as `release.lua` does.
//! - `extend_many`: compare-and-extend many leases in one round trip.
//! - the idempotency operations (`idem.rs`): claim, complete, release, renew, each
//!   checking the owner token, as `idem_*.lua`.
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
pub(crate) mod redis;
pub mod scripts;

/// What one acquire try found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Try {
    /// Taken, with this fencing token.
    Taken(u64),
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
    /// On a retry: the key is gone and nobody took the lock since (the lost try
    /// released it, or it expired with no other holder: no overlap either way).
    Earlier,
    /// The key was gone or held another token.
    Lost,
    /// On a retry: someone took the lock since; whether the lost try released it first
    /// cannot be told.
    Unknown,
    /// The token matched and the lock now belongs to the next local waiter, with this
    /// fencing token.
    Handed(u64),
}

/// One release: whose lock, and what to do with it.
pub(crate) struct ReleaseCall<'a> {
    pub(crate) key: &'a str,
    pub(crate) fence_key: &'a str,
    pub(crate) token: &'a str,
    /// The channel that wakes the key's waiters.
    pub(crate) channel: &'a str,
    /// This acquisition's fence when an earlier try's reply was lost.
    pub(crate) retry_of: Option<u64>,
    /// The next local waiter to hand the lock to, if any.
    pub(crate) successor: Option<Successor<'a>>,
    /// This client's id and yield window (`None`: never yield).
    pub(crate) yield_to: Option<(&'a str, Duration)>,
    /// Whether this client's own Pub/Sub connection may be subscribed to the key's channel.
    pub(crate) self_subscribed: bool,
}

/// The next local waiter of a release.
#[derive(Clone, Copy)]
pub(crate) struct Successor<'a> {
    pub(crate) token: &'a str,
    pub(crate) ttl: Duration,
    /// This client's turn is over: hand over only when no other client waits.
    pub(crate) turn_over: bool,
}

pub(crate) enum Backend {
    Redis(redis::RedisBackend),
    Memory(memory::MemoryBackend),
}

impl Backend {
    /// One atomic try. `client` is this client's id (see `release.lua`).
    pub(crate) async fn try_acquire(
        &self,
        key: &str,
        fence_key: &str,
        token: &str,
        ttl: Duration,
        client: &str,
    ) -> Result<Try, BackendError> {
        match self {
            Backend::Redis(r) => r.try_acquire(key, fence_key, token, ttl, client).await,
            Backend::Memory(m) => Ok(m.try_acquire(key, token, ttl)),
        }
    }

    /// One compare-and-delete that also wakes the key's waiters, or hands the lock to
    /// the next local waiter.
    pub(crate) async fn release(&self, call: &ReleaseCall<'_>) -> Result<Released, BackendError> {
        match self {
            Backend::Redis(r) => r.release(call).await,
            Backend::Memory(m) => Ok(m.release(call)),
        }
    }

    /// Compare-and-extend of many locks in one round trip: `true` where extended.
    pub(crate) async fn extend_many(
        &self,
        leases: &[(&str, &str, Duration)],
    ) -> Result<Vec<bool>, BackendError> {
        match self {
            Backend::Redis(r) => r.extend_many(leases).await,
            Backend::Memory(m) => Ok(leases
                .iter()
                .map(|(key, token, ttl)| m.extend(key, token, *ttl))
                .collect()),
        }
    }

    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        match self {
            Backend::Redis(r) => r.ping().await,
            Backend::Memory(_) => Ok(()),
        }
    }

    pub(crate) fn is_memory(&self) -> bool {
        matches!(self, Backend::Memory(_))
    }
}

/// Milliseconds for `PX`, at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
