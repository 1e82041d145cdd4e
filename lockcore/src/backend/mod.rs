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
//! A new topology (a Redis Cluster, Sentinel, independent masters) implements
//! [`Locking`], [`idem::Records`] and [`replicas::Acknowledging`], and is one more arm of
//! [`each!`] and one more `From` for [`Backend`]. It must give each operation the
//! meaning the scripts in `src/scripts/` define, atomically:
//!
//! - `try_acquire`: set the key to the token if free (or a yield marker that does not
//!   name this client, or the caller's own token: a lost handoff reply), with the ttl;
//!   a free key costs one plain `SET NX PX`. A waiter that will be woken by a message
//!   marks the holder's value (`<token> waiting`) when it finds the key held; every
//!   compare accepts a token with or without that mark.
//! - `fence`: the next value of the fencing counter (`<key>:fence`, same hash slot),
//!   max(counter + 1, the server's clock in microseconds), when the key holds the token
//!   from before the counter moved, else nothing (lost); the counter then expires after
//!   the idle window unless fenced again. `fence.lua`; while a cluster slot migrates,
//!   `fence_counter.lua` then a `GET` of the key.
//! - `release`: compare the token, then delete, hand to the next local waiter, or leave a
//!   yield marker; publish on the key's channel when someone listens. Without a
//!   successor and without a waiter's mark, a compare-and-delete and nothing more.
//!   The key gone or holding another token is `NotOurs` (the caller reads it, see
//!   `lock/guard.rs`); the key holding the successor's token is `Handed`.
//! - `extend_many`: compare-and-extend many leases in one round trip.
//! - `try_all` (where `one_call` says the keys are on one node): a multi-lock's locks
//!   all set if all are free, else none, as `multi_acquire.lua`.
//! - a semaphore's permits (`try_permit`, `release_permit`, `extend_permits`): a sorted
//!   set of the holders' tokens scored by their leases' ends, and its limit (the count of
//!   the latest acquire that took a permit, `key::limit_member`), as `permit_*.lua`; a
//!   release publishes on the key's channel when someone listens, and the key goes with
//!   its last live permit.
//! - a read/write lock (`try_read`, `try_write`; readers released and renewed as
//!   permits of `{key}:readers`): the writer's token at the key, the readers in
//!   `{key}:readers`, a waiting writer's mark in `{key}:writer`, waiting readers' in
//!   `{key}:readers-waiting` (a sorted set), as `read_acquire.lua` and `write_acquire.lua`.
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

/// What a batch of compare-and-extends found, lease by lease: extended or not, or the
/// call that carried it failed (a cluster node that hangs fails its keys' calls only).
pub(crate) type Extended = Vec<Result<bool, BackendError>>;

/// A batch's answer when one call carried all of it: the same for every lease.
pub(crate) fn extended_all(n: usize, answer: Result<Vec<bool>, BackendError>) -> Extended {
    match answer {
        Ok(each) => each.into_iter().map(Ok).collect(),
        Err(e) => vec![Err(e); n],
    }
}

/// What one acquire try found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Try {
    /// Taken.
    Taken,
    /// Held by someone else, for about this much longer (`None`: unknown).
    Busy(Option<Duration>),
    /// A lock's try found a read lock's readers holding the name (`readers` at the key),
    /// for about this much longer: the caller's next tries are a writer's
    /// ([`Locking::try_write`]), whose mark keeps new readers out, so a stream of readers
    /// never starves it.
    Readers(Option<Duration>),
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

/// What one look at a key found (`inspect.lua`): the raw values, read by
/// `crate::lock::inspect`.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Seen {
    /// A string key's value: a holder's token (maybe marked ` waiting`) or a yield marker.
    pub(crate) value: Option<String>,
    /// The key's ttl (`None`: no key, or no ttl).
    pub(crate) left: Option<Duration>,
    /// The last fence given.
    pub(crate) fence: Option<u64>,
    /// A semaphore's holders at the key, and a read/write lock's readers: each token
    /// and its lease left.
    pub(crate) permits: Vec<(String, Duration)>,
    /// A semaphore's limit, as the latest acquire that took a permit wrote it.
    pub(crate) limit: Option<u32>,
    pub(crate) readers: Vec<(String, Duration)>,
    /// A waiting writer's token.
    pub(crate) writer_waiting: Option<String>,
    /// Clients listening on the key's channel.
    pub(crate) listening: u64,
}

/// Where one SCAN runs (see [`Locking::scan_nodes`]): the one server (`None`), or a
/// cluster's primary at this host and port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ScanNode(pub(crate) Option<(String, u16)>);

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

/// The lock operations of a topology, with the meanings the module docs give. Every
/// topology implements this, [`idem::Records`] and [`replicas::Acknowledging`]; so does
/// [`Backend`], which dispatches to the one it was built with (see [`each!`]).
///
/// What differs between topologies is said by the operations themselves: a fence or a
/// replica count that a topology cannot give is an error from that call, a native
/// compare-and-delete that it lacks is `false` from [`delete_if`](Self::delete_if).
/// Nothing above this layer asks which topology it talks to.
pub(crate) trait Locking: Send + Sync {
    /// One atomic try. `client` is this client's id (see `release.lua`).
    async fn try_acquire(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        client: &str,
        attempt: Attempt,
    ) -> Result<Try, BackendError>;

    /// The next fencing token of the lock `key` while it holds `token`; `None`: lost.
    /// The counter expires once no fence was given for `idle` (see `fence.lua`).
    async fn fence(
        &self,
        key: &str,
        token: &str,
        idle: Duration,
    ) -> Result<Option<u64>, BackendError>;

    /// One compare-and-delete that also wakes the key's waiters, or hands the lock to
    /// the next local waiter.
    async fn release(&self, call: &ReleaseCall<'_>) -> Result<Released, BackendError>;

    /// A compare-and-delete that wakes nobody, where the server has one natively:
    /// `false` when it has none (release instead).
    async fn delete_if(&self, _key: &str, _token: &str) -> Result<bool, BackendError> {
        Ok(false)
    }

    /// A release before `min_hold` ran out (`keep.lua`): the lock's lease set to `left`,
    /// shorter or longer, and marked kept, so that no renewal still in flight sets it
    /// back: `true` when the key held `token` (or was kept by it already).
    async fn keep(&self, key: &str, token: &str, left: Duration) -> Result<bool, BackendError> {
        let extended = self.extend_many(&[(key, token, left)]).await;
        extended.into_iter().next().unwrap_or(Ok(false))
    }

    /// Stores `value` at `key` when `fence` is at least the highest fence seen for it
    /// (kept beside it, in its hash slot), which `fence` then becomes. `Some(seen)`:
    /// refused, `seen` being that highest fence. The value and the record of the highest
    /// fence both expire after `ttl`, or neither does (`None`).
    async fn set_fenced(
        &self,
        key: &str,
        value: &str,
        fence: u64,
        ttl: Option<Duration>,
    ) -> Result<Option<u64>, BackendError>;

    /// The value [`set_fenced`](Self::set_fenced) stored at `key`, with the highest fence
    /// seen for it (0 when none).
    async fn fenced_value(&self, key: &str) -> Result<(Option<String>, u64), BackendError>;

    /// One try for one of the `permits` of the semaphore `key` (see
    /// `permit_acquire.lua`): taken when fewer than `permits` leases run, else busy until
    /// about when the first one ends.
    async fn try_permit(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        permits: u32,
    ) -> Result<Try, BackendError>;

    /// Gives the permit `token` of the semaphore (or the readers) `set` back, waking the
    /// waiters on `of`'s channel (`last`: only when no holder is left): `Now`, or
    /// `NotOurs` when the set no longer held it or its lease had ended.
    async fn release_permit(
        &self,
        set: &str,
        token: &str,
        wake: (&str, bool),
    ) -> Result<Released, BackendError>;

    /// One try for a share of the read lock `key` (`read_acquire.lua`): busy while a
    /// writer holds it or waits; `mark`: the caller will be woken by a message. Refused
    /// by a writer that holds, it keeps the next writer out for `waiting` (zero: it will
    /// not try again), until a waiting reader is in.
    async fn try_read(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        mark: bool,
        waiting: Duration,
    ) -> Result<Try, BackendError>;

    /// One try for the write lock `key` (`write_acquire.lua`): a lock's try once no
    /// reader holds; refused, it keeps new readers out for `waiting` (zero: it will not
    /// try again).
    async fn try_write(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        who: (&str, bool),
        waiting: Duration,
    ) -> Result<Try, BackendError>;

    /// Compare-and-extend of many permits in one round trip: `true` where extended,
    /// each lease's own error where its call failed.
    async fn extend_permits(&self, leases: &[(&str, &str, Duration)]) -> Extended;

    /// Whether [`try_all`](Self::try_all) can run over `keys`: all on one server, or
    /// in one slot of a cluster.
    fn one_call(&self, _keys: &[&str]) -> bool {
        false
    }

    /// Every lock `keys[i]` set to `tokens[i]` with the ttl if all are free, else none
    /// (`multi_acquire.lua`): `true` when taken.
    async fn try_all(
        &self,
        _keys: &[&str],
        _tokens: &[&str],
        _ttl: Duration,
    ) -> Result<bool, BackendError> {
        Ok(false)
    }

    /// One atomic look at what holds `key` and its companions.
    async fn inspect(&self, key: &str) -> Result<Seen, BackendError>;

    /// Deletes whatever holds `key` (the key, its readers and marks) and wakes its
    /// waiters: `true` when something did.
    async fn force_release(&self, key: &str) -> Result<bool, BackendError>;

    /// The nodes a walk over the keys must visit: every primary of a cluster (as last
    /// read, `CLUSTER SLOTS`), the one server elsewhere.
    async fn scan_nodes(&self) -> Result<Vec<ScanNode>, BackendError>;

    /// One `SCAN cursor MATCH pattern` step on `node`: the next cursor (0: the walk is
    /// over) and the keys it found (a key may come twice in one walk).
    async fn scan(
        &self,
        node: &ScanNode,
        cursor: u64,
        pattern: &str,
    ) -> Result<(u64, Vec<String>), BackendError>;

    /// Compare-and-extend of many locks in one round trip: `true` where extended, each
    /// lease's own error where its call failed.
    async fn extend_many(&self, leases: &[(&str, &str, Duration)]) -> Extended;

    /// Whether the backend answers, within the command timeout.
    async fn ping(&self) -> Result<(), BackendError>;

    /// How long one command may take (zero in memory).
    fn command_timeout(&self) -> Duration;

    /// Changes whenever the server may have lost keys (see `RedisBackend::epoch`); a
    /// backend that never loses any keeps zero.
    fn epoch(&self) -> u64 {
        0
    }

    /// Whether a write lands on several nodes independently (Redlock's masters): a try
    /// refused for want of a quorum was given back everywhere, and a give-back may still
    /// reach a node late, so the next try takes a fresh token (a late give-back must not
    /// remove it), and a release that found its write on some nodes may not have found
    /// a copy still in flight to another.
    fn independent_writes(&self) -> bool {
        false
    }

    /// Whether the locks live in this process (for [`crate::Locks::is_in_memory`]).
    fn in_process(&self) -> bool {
        false
    }
}

/// One client's backend: which topology is private to this layer (see [`Locking`]).
pub(crate) struct Backend(Flavor);

// One per client, behind its `Arc`: its size costs nothing, a box would cost a
// dereference on every call (the redis-rs client grows with the `tls` feature).
#[allow(clippy::large_enum_variant)]
enum Flavor {
    Redis(redis::RedisBackend),
    /// Independent masters (see `redlock.rs`).
    Redlock(redlock::RedlockBackend),
    Memory(memory::MemoryBackend),
}

impl From<redis::RedisBackend> for Backend {
    fn from(backend: redis::RedisBackend) -> Backend {
        Backend(Flavor::Redis(backend))
    }
}

impl From<redlock::RedlockBackend> for Backend {
    fn from(backend: redlock::RedlockBackend) -> Backend {
        Backend(Flavor::Redlock(backend))
    }
}

impl From<memory::MemoryBackend> for Backend {
    fn from(backend: memory::MemoryBackend) -> Backend {
        Backend(Flavor::Memory(backend))
    }
}

/// The one dispatch of a [`Backend`] call to its topology, as tokio's `match_flavor!`:
/// `each!(self, b => b.call(args))` awaits `call` on whichever topology `self` holds;
/// `each!(sync self, b => b.call(args))` for a call that does not wait. Redlock's calls
/// are boxed: each nests a call per master, and every caller's future (up to the
/// users' functions) would otherwise carry that type.
macro_rules! each {
    ($backend:expr, $b:ident => $call:expr) => {
        match &$backend.0 {
            $crate::backend::Flavor::Redis($b) => $call.await,
            $crate::backend::Flavor::Redlock($b) => $crate::util::erased($call).await,
            $crate::backend::Flavor::Memory($b) => $call.await,
        }
    };
    (sync $backend:expr, $b:ident => $call:expr) => {
        match &$backend.0 {
            $crate::backend::Flavor::Redis($b) => $call,
            $crate::backend::Flavor::Redlock($b) => $call,
            $crate::backend::Flavor::Memory($b) => $call,
        }
    };
}
pub(crate) use each;

impl Locking for Backend {
    async fn try_acquire(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        client: &str,
        attempt: Attempt,
    ) -> Result<Try, BackendError> {
        each!(self, b => b.try_acquire(key, token, ttl, client, attempt))
    }

    async fn fence(
        &self,
        key: &str,
        token: &str,
        idle: Duration,
    ) -> Result<Option<u64>, BackendError> {
        each!(self, b => b.fence(key, token, idle))
    }

    async fn release(&self, call: &ReleaseCall<'_>) -> Result<Released, BackendError> {
        each!(self, b => b.release(call))
    }

    async fn delete_if(&self, key: &str, token: &str) -> Result<bool, BackendError> {
        each!(self, b => b.delete_if(key, token))
    }

    async fn keep(&self, key: &str, token: &str, left: Duration) -> Result<bool, BackendError> {
        each!(self, b => b.keep(key, token, left))
    }

    async fn set_fenced(
        &self,
        key: &str,
        value: &str,
        fence: u64,
        ttl: Option<Duration>,
    ) -> Result<Option<u64>, BackendError> {
        each!(self, b => b.set_fenced(key, value, fence, ttl))
    }

    async fn fenced_value(&self, key: &str) -> Result<(Option<String>, u64), BackendError> {
        each!(self, b => b.fenced_value(key))
    }

    async fn extend_many(&self, leases: &[(&str, &str, Duration)]) -> Extended {
        each!(self, b => b.extend_many(leases))
    }

    async fn try_permit(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        permits: u32,
    ) -> Result<Try, BackendError> {
        each!(self, b => b.try_permit(key, token, ttl, permits))
    }

    fn one_call(&self, keys: &[&str]) -> bool {
        each!(sync self, b => b.one_call(keys))
    }

    async fn inspect(&self, key: &str) -> Result<Seen, BackendError> {
        each!(self, b => b.inspect(key))
    }

    async fn force_release(&self, key: &str) -> Result<bool, BackendError> {
        each!(self, b => b.force_release(key))
    }

    async fn scan_nodes(&self) -> Result<Vec<ScanNode>, BackendError> {
        each!(self, b => b.scan_nodes())
    }

    async fn scan(
        &self,
        node: &ScanNode,
        cursor: u64,
        pattern: &str,
    ) -> Result<(u64, Vec<String>), BackendError> {
        each!(self, b => b.scan(node, cursor, pattern))
    }

    async fn try_all(
        &self,
        keys: &[&str],
        tokens: &[&str],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        each!(self, b => b.try_all(keys, tokens, ttl))
    }

    async fn release_permit(
        &self,
        set: &str,
        token: &str,
        wake: (&str, bool),
    ) -> Result<Released, BackendError> {
        each!(self, b => b.release_permit(set, token, wake))
    }

    async fn try_read(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        mark: bool,
        waiting: Duration,
    ) -> Result<Try, BackendError> {
        each!(self, b => b.try_read(key, token, ttl, mark, waiting))
    }

    async fn try_write(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        who: (&str, bool),
        waiting: Duration,
    ) -> Result<Try, BackendError> {
        each!(self, b => b.try_write(key, token, ttl, who, waiting))
    }

    async fn extend_permits(&self, leases: &[(&str, &str, Duration)]) -> Extended {
        each!(self, b => b.extend_permits(leases))
    }

    async fn ping(&self) -> Result<(), BackendError> {
        each!(self, b => b.ping())
    }

    fn command_timeout(&self) -> Duration {
        each!(sync self, b => b.command_timeout())
    }

    fn epoch(&self) -> u64 {
        each!(sync self, b => b.epoch())
    }

    fn independent_writes(&self) -> bool {
        each!(sync self, b => b.independent_writes())
    }

    fn in_process(&self) -> bool {
        each!(sync self, b => b.in_process())
    }
}

/// Milliseconds for `PX`, at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
