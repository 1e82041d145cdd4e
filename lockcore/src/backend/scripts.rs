//! The Lua scripts, as text: the Redis backend loads them, and the benchmarks send the
//! same ones from a raw client (through `__private::scripts`).

/// A contended try for a lock (see the script's header).
pub const ACQUIRE: &str = include_str!("../scripts/acquire.lua");
/// The uncontended release: compare-and-delete unless someone waits.
pub const UNLOCK: &str = include_str!("../scripts/unlock.lua");
/// Release, hand over or yield a lock, waking its waiters.
pub const RELEASE: &str = include_str!("../scripts/release.lua");
/// Compare-and-extend leases.
pub const EXTEND: &str = include_str!("../scripts/extend.lua");
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
