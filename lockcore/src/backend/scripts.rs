//! The Lua scripts, as text: the Redis backend loads them, and the benchmarks send the
//! same ones from a raw client (through `__private::scripts`).

/// A contended try for a lock (see the script's header).
pub const ACQUIRE: &str = include_str!("../scripts/acquire.lua");
/// The uncontended release: compare-and-delete unless someone waits.
pub const UNLOCK: &str = include_str!("../scripts/unlock.lua");
/// Release, hand over or yield a lock, waking its waiters.
pub const RELEASE: &str = include_str!("../scripts/release.lua");
/// A fence: the counter's next value while the key holds the token, a new counter
/// seeded from the server's clock.
pub const FENCE: &str = concat!(
    include_str!("../scripts/fence_next.lua"),
    include_str!("../scripts/fence.lua")
);
/// The fence counter's step alone (a cluster slot migrating).
pub const FENCE_COUNTER: &str = concat!(
    include_str!("../scripts/fence_next.lua"),
    include_str!("../scripts/fence_counter.lua")
);
/// A release before `min_hold` ran out: the lock kept until then, marked kept.
pub const KEEP: &str = include_str!("../scripts/keep.lua");
/// Compare-and-extend leases.
pub const EXTEND: &str = include_str!("../scripts/extend.lua");
/// Store a value only under a fence at least the highest seen for it.
pub const SET_FENCED: &str = include_str!("../scripts/set_fenced.lua");
/// A try for one of a semaphore's permits.
pub const PERMIT_ACQUIRE: &str = include_str!("../scripts/permit_acquire.lua");
/// Give a semaphore's permit back, waking its waiters.
pub const PERMIT_RELEASE: &str = include_str!("../scripts/permit_release.lua");
/// Compare-and-extend of a semaphore's permit.
pub const PERMIT_EXTEND: &str = include_str!("../scripts/permit_extend.lua");
/// A read lock's `readers` kept alone (a renewal split by a migrating slot).
pub const MARK_READERS: &str = include_str!("../scripts/mark_readers.lua");
/// A try for a share of a read lock, behind a writer that holds or waits.
pub const READ_ACQUIRE: &str = include_str!("../scripts/read_acquire.lua");
/// A writer's try: the lock's try once no reader holds, and the writer-waiting mark.
pub const WRITE_ACQUIRE: &str = concat!(
    "local function lock_try()\n",
    include_str!("../scripts/acquire.lua"),
    "end\n",
    include_str!("../scripts/write_acquire.lua")
);
/// Every lock of a multi-lock at once, or none.
pub const MULTI_ACQUIRE: &str = include_str!("../scripts/multi_acquire.lua");
/// One atomic, read-only look at what holds a key.
pub const INSPECT: &str = include_str!("../scripts/inspect.lua");
/// Release whatever holds a key and wake its waiters.
pub const FORCE_RELEASE: &str = include_str!("../scripts/force_release.lua");
/// Claim an idempotency record.
pub const IDEM_CLAIM: &str = include_str!("../scripts/idem_claim.lua");
/// After a store whose `APPEND` found something else than its claim: whose result is
/// stored, and wake waiters.
pub const IDEM_SETTLE: &str = include_str!("../scripts/idem_settle.lua");
/// Give an idempotency claim up.
pub const IDEM_RELEASE: &str = include_str!("../scripts/idem_release.lua");
/// Renew an idempotency claim's lease.
pub const IDEM_RENEW: &str = concat!(
    include_str!("../scripts/idem_owned.lua"),
    include_str!("../scripts/idem_renew.lua")
);

/// Make sure a stored result is there before `WAIT` counts it (written again if a
/// failover lost it).
pub const IDEM_CONFIRM_STORE: &str = concat!(
    include_str!("../scripts/idem_owned.lua"),
    include_str!("../scripts/idem_confirm_store.lua")
);

/// One read-only look at an idempotency record, with the server's time.
pub const IDEM_LOOK: &str = include_str!("../scripts/idem_look.lua");
/// The first bytes of an idempotency record, its length and ttl, with the server's time.
pub const IDEM_PEEK: &str = include_str!("../scripts/idem_peek.lua");
/// Forget an idempotency record and wake the repeats that wait on it.
pub const IDEM_FORGET: &str = include_str!("../scripts/idem_forget.lua");

/// The form of a script for a Redis Cluster: sharded Pub/Sub (`SPUBLISH` to, and
/// `PUBSUB SHARDNUMSUB` of, the key's channel, which lives in the key's slot), since a
/// cluster node counts and delivers plain Pub/Sub on its own connections only.
pub fn sharded(script: &str) -> String {
    script
        .replace("'PUBLISH'", "'SPUBLISH'")
        .replace("'NUMSUB'", "'SHARDNUMSUB'")
}

/// A script as loaded for one server (`[0]`) and for a cluster (`[1]`, [`sharded`]).
pub(crate) fn both(script: &str) -> [redis::Script; 2] {
    [
        redis::Script::new(script),
        redis::Script::new(&sharded(script)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_forms_publish_and_count_in_the_slot() {
        for script in [
            RELEASE,
            PERMIT_RELEASE,
            FORCE_RELEASE,
            IDEM_RELEASE,
            IDEM_SETTLE,
            IDEM_FORGET,
            IDEM_CONFIRM_STORE,
        ] {
            assert!(script.contains("'PUBLISH'"));
            let cluster = sharded(script);
            assert!(!cluster.contains("'PUBLISH'") && cluster.contains("'SPUBLISH'"));
            assert!(!cluster.contains("'NUMSUB'"));
        }
        assert!(sharded(RELEASE).contains("'PUBSUB', 'SHARDNUMSUB'"));
        for script in [
            ACQUIRE,
            UNLOCK,
            FENCE,
            FENCE_COUNTER,
            KEEP,
            EXTEND,
            SET_FENCED,
            PERMIT_ACQUIRE,
            PERMIT_EXTEND,
            MARK_READERS,
            READ_ACQUIRE,
            WRITE_ACQUIRE,
            MULTI_ACQUIRE,
            IDEM_CLAIM,
            IDEM_RENEW,
            IDEM_LOOK,
            IDEM_PEEK,
        ] {
            assert_eq!(sharded(script), script, "publishes nothing");
        }
    }
}
