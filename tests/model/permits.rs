//! The model of semaphores (`permit_acquire.lua`, `permit_release.lua`,
//! `permit_extend.lua` and the lock's guard over them), on the clients, faults and clock
//! of `model/leases.rs`: three clients, two permits; client 2's requests are always
//! answered. 1.7 million states.
//!
//! | model step | code |
//! |---|---|
//! | `sends a try` / `the try runs` | `LockRequest::contend` → `try_permit`: expired holders removed, then the caller's own token refreshed, or added while fewer than the permits are live, else busy |
//! | releases, renewals, retries, the clock | as `model/leases.rs`, with `permit_release.lua` and `permit_extend.lua` |
//!
//! Invariants: never more clients that believe they hold a permit (their lease running
//! by their clock, not found lost) than permits; a client told its permit was released
//! never had it expire at the server first.

use super::leases::{CLIENTS, Kind, LeaseState, Leases, Reply, Scripts, TTL};

const PERMITS: usize = 2;

/// Planted faults, each off in the code as it is.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PermitBugs {
    /// The lease counted from the reply instead of the send: it outlives the server's.
    pub(crate) lease_from_reply: bool,
    /// The count checked, then the token added, as two commands (`ZCARD`, then `ZADD`).
    pub(crate) check_then_add: bool,
    /// A release that finds its token but its lease ended removes it and says released.
    pub(crate) release_ignores_expiry: bool,
    /// A release retry that finds its token gone reports success whatever the lease.
    pub(crate) retry_always_ok: bool,
}

/// The semaphore's scripts, with `bugs` planted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Permits {
    pub(crate) bugs: PermitBugs,
}

pub(crate) type PermitModel = Leases<Permits>;

impl PermitModel {
    /// The scripts and guard as they are.
    pub(crate) fn fixed() -> Self {
        Leases(Permits {
            bugs: PermitBugs::default(),
        })
    }
}

impl Scripts for Permits {
    type Extra = ();
    const ANSWERED: usize = 2;

    fn take(&self, s: &mut LeaseState<()>, c: usize, kind: Kind) -> Reply {
        let now = s.now;
        if kind == Kind::Add {
            s.held[c] = Some(now + TTL);
            return Reply::Taken;
        }
        // `ZREMRANGEBYSCORE -inf now`.
        for j in 0..CLIENTS {
            if !s.live(j) {
                s.held[j] = None;
            }
        }
        let count = (0..CLIENTS).filter(|&j| s.live(j)).count();
        if s.held[c].is_some() {
            s.held[c] = Some(now + TTL);
            Reply::Taken
        } else if count < PERMITS && self.bugs.check_then_add {
            Reply::Room
        } else if count < PERMITS {
            s.held[c] = Some(now + TTL);
            Reply::Taken
        } else {
            Reply::Busy
        }
    }

    fn holders(&self, believers: &[usize]) -> Option<String> {
        (believers.len() > PERMITS)
            .then(|| format!("clients {believers:?} believe they hold one of {PERMITS} permits"))
    }

    fn lease_from_reply(&self) -> bool {
        self.bugs.lease_from_reply
    }

    fn release_ignores_expiry(&self) -> bool {
        self.bugs.release_ignores_expiry
    }

    fn retry_always_ok(&self) -> bool {
        self.bugs.retry_always_ok
    }
}
