//! Chaos run: a seeded, bounded stress test of locks and idempotency under faults.
//!
//! The test binary re-runs itself as three child processes (`chaos_child`, as
//! `tests/processes.rs` does). Each child shares ONE `Locks` client between more tokio
//! runtimes than the machine has cores (at least four), on threads of their own (one
//! multi-thread runtime with one worker, the others current-thread). On the first three, tasks take and release a few lock keys
//! (short ttls, `renew`, bodies longer than the ttl, `wait`, reentrant nested
//! acquisitions in `guard.scope`, several locks at once) and call an `#[idempotent]` fn
//! (the same key with another payload now and then); the fourth only calls the
//! idempotent fn, whose body there sometimes blocks its thread past the claim's lease (a
//! claimer stalled like a GC pause). Calls are cut short at random: by timeouts, often
//! of 0-2 ms, and by dropping the future right after its first, second or third
//! suspension (tokio timers tick in milliseconds, longer than a round trip to a local
//! redis, so only counting polls lands a cancellation at every await). Meanwhile the
//! parent injects faults at random points: `DEBUG SLEEP` and SIGSTOP of the
//! redis-server, `CLIENT KILL` of normal and Pub/Sub connections, redis-server restarts
//! (kill -9 and start on the same port) and SIGSTOP of whole child processes.
//!
//! Nothing the detectors use goes through the lock:
//! - every event (body entered / left, what the holder was told, release outcomes,
//!   restarts) is appended to one file with `O_APPEND` (one `write` per line, so the file
//!   order is the real order of those writes across processes);
//! - a monitor thread in the parent samples every lock key (token and PTTL, atomically in
//!   one Lua call) every few milliseconds on its own connection.
//!
//! After the run (faults stopped, calls drained, a settle period longer than every ttl)
//! the parent checks the end state and analyses the log; see `chaos/analysis.rs` for the
//! exact rules (mutual exclusion, loss reporting, liveness of released and handed-over
//! keys, idempotency, call duration bounds).
//!
//! `DISTLOCK_CHAOS_SEED` reruns a seed; `DISTLOCK_CHAOS_SECS` sets the duration of the
//! whole test (default 60 s). `scripts/chaos.sh [SECONDS] [SEED]` runs it in release mode.
//! `DISTLOCK_CHAOS_KEEP=1` keeps the event log (and the monitor's samples) of a passing
//! run; `DISTLOCK_CHAOS_REPLAY=<events log>` analyses a kept run again.
//!
//! **Checking the analysis against a planted bug.** `DISTLOCK_CHAOS_PLANT=<bug>` plants a
//! bug in the children (read by the test's children only, never by the library; see
//! `child::plant`): `renewal-ignores-token` makes holders act as if each renewal had
//! extended the key whoever held it and said "renewed": they are never told their lock
//! is lost, and work on to their body's end and 1 s more. The run must then fail with
//! *unreported loss* violations. Two ways to run it:
//!
//! ```text
//! # the check itself (ignored in the suite): passes when the analysis reports the bug
//! DISTLOCK_CHAOS_SECS=60 DISTLOCK_CHAOS_SEED=546486926 \
//!   cargo test --all-features --test chaos -- --ignored --nocapture planted
//! # any run with the bug planted: fails, listing the violations
//! DISTLOCK_CHAOS_PLANT=renewal-ignores-token cargo test --all-features --test chaos -- chaos_cluster_run
//! ```
//!
//! Figures (cluster run, debug build, 2 cores): seed 546486926, 60 s (7 pauses of the
//! replica, 8 failovers, 3 child pauses): 33 unreported losses (e.g. a renewed holder of
//! `{c}k3`, ttl 501 ms, never told, while another held the key 1689 ms of its body), 174
//! overlaps of plain locks past their ttl (excused: their releases reported the loss), 8
//! near misses; the same seed without the plant: no violation (57 bodies told their lock
//! was lost, 9 overlaps of renewed holders that had been told). Without the 1 s of work
//! after the loss, the same seed gave no violation: its 15 overlaps of renewed locks
//! were all shorter than the tolerance (command timeout + 150 ms), since a renewed lock
//! is lost near its body's end (the key expires a ttl after its last renewal). Seed
//! 859416882, 30 s, paused the replica once: no renewed lock changed hands, and the plant
//! went unseen (70 plain overlaps, excused); without it, 13 bodies were told their lock
//! was lost and none overlapped. So the cluster run catches this bug only when it pauses
//! the replica often enough: use 60 s or more, and a seed that does (the `faults:` line
//! counts `sigstop_replica`).
mod common;

#[path = "chaos/analysis.rs"]
mod analysis;
#[path = "chaos/child.rs"]
mod child;
#[path = "chaos/events.rs"]
mod events;
#[path = "chaos/parent.rs"]
mod parent;

use std::time::Duration;

/// Environment variable naming a child's role (unset in a normal test run).
const ROLE_VAR: &str = "DISTLOCK_CHAOS_ROLE";

/// Settings shared by parent and children.
mod cfg {
    use super::Duration;

    /// Child processes.
    pub(crate) const CHILDREN: usize = 3;
    /// Tokio runtimes per child, all sharing the child's one `Locks` client: more than
    /// the machine has cores (actix-web runs one per worker, and the default client is
    /// shared by all), at least 4. The first is multi-thread (one worker), the others
    /// current-thread; the last one only makes idempotent calls, whose bodies sometimes
    /// block its thread past their lease (a claimer stalled like a GC pause; no lock is
    /// ever held on that runtime).
    pub(crate) fn runtimes() -> usize {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        (cores + 2).max(4)
    }
    /// Worker tasks per runtime (the idempotency-only runtime has one).
    pub(crate) const WORKERS: usize = 3;
    /// Command timeout of every child's client.
    pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_millis(150);
    /// The lock names (keys `lock:<name>`), in one hash slot: on a cluster one primary
    /// serves them all, and the monitor samples them in one atomic call.
    pub(crate) const LOCK_KEYS: [&str; 5] = ["{c}k0", "{c}k1", "{c}k2", "{c}k3", "{c}k4"];
    /// Key prefix of the clients (the default).
    pub(crate) const PREFIX: &str = "lock:";
    /// ttl range of renewed locks, in ms.
    pub(crate) const RENEW_TTL_MS: (u64, u64) = (300, 600);
    /// ttl range of locks that are not renewed, in ms.
    pub(crate) const PLAIN_TTL_MS: (u64, u64) = (800, 1400);
    /// The longest ttl any lock is taken with.
    pub(crate) const MAX_TTL: Duration = Duration::from_millis(1400);
    /// Longest `wait` of a lock call, in ms.
    pub(crate) const MAX_WAIT_MS: u64 = 2000;
    /// Lease and wait of the idempotent fn (must match its attribute).
    pub(crate) const IDEM_LEASE_MS: u64 = 450;
    pub(crate) const IDEM_WAIT_MS: u64 = 800;
    /// How long one generation of idempotency keys is in use (fresh keys keep bodies
    /// running instead of replaying forever).
    pub(crate) const IDEM_GENERATION_MS: u64 = 1500;
    /// Idempotency keys per generation.
    pub(crate) const IDEM_KEYS: u64 = 3;
}

/// The two runs take turns: each alone loads the machine as much as it may.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The seed (`DISTLOCK_CHAOS_SEED`, else from the clock) and the duration
/// (`DISTLOCK_CHAOS_SECS`, else `default_secs`) of a run, printed.
fn seed_and_secs(what: &str, default_secs: u64) -> (u64, u64) {
    let seed = std::env::var("DISTLOCK_CHAOS_SEED")
        .ok()
        .map(|s| {
            s.trim()
                .parse::<u64>()
                .expect("DISTLOCK_CHAOS_SEED must be a number")
        })
        .unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            (t.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32)) % 1_000_000_000
        });
    let secs = std::env::var("DISTLOCK_CHAOS_SECS")
        .ok()
        .map(|s| {
            s.trim()
                .parse::<u64>()
                .expect("DISTLOCK_CHAOS_SECS must be a number of seconds")
        })
        .unwrap_or(default_secs);
    println!("{what} seed = {seed}");
    eprintln!("{what} seed = {seed} ({secs} s; rerun with DISTLOCK_CHAOS_SEED={seed})");
    (seed, secs)
}

/// The chaos run (the parent).
#[test]
fn chaos_run() {
    if std::env::var(ROLE_VAR).is_ok() {
        return; // a child runs only `chaos_child`
    }
    if let Some(kept) = std::env::var_os("DISTLOCK_CHAOS_REPLAY") {
        parent::replay(kept.as_ref());
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (seed, secs) = seed_and_secs("chaos", 60);
    parent::run(seed, secs);
}

/// The chaos run on a Redis Cluster with a replica per primary, every lock and record
/// taken with `replicas = 1` (about 30 s; `DISTLOCK_CHAOS_SECS` applies to it too): the
/// faults are failovers of the lock keys' primary (`CLUSTER FAILOVER`, which loses no
/// acknowledged write), its replica paused past the command timeout (waits for it fail,
/// renewals go unacknowledged), connections killed and children paused; no two bodies
/// may overlap unless a loss was reported (nothing excuses an overlap across a failover).
#[test]
fn chaos_cluster_run() {
    if std::env::var(ROLE_VAR).is_ok() || std::env::var_os("DISTLOCK_CHAOS_REPLAY").is_some() {
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (seed, secs) = seed_and_secs("chaos (cluster)", 30);
    parent::run_cluster(seed, secs);
}

/// The cluster run with a bug planted in every child (`renewal-ignores-token`, see
/// `child::plant`: holders are never told their lock is lost, as if each renewal had
/// extended the key whoever held it): the analysis must report it as two holders, one
/// of them lost but told it held (*unreported loss*). A check of the analysis, not of
/// the library: ignored in the suite, run by hand (about 75 s; seed 546486926 for 60 s
/// unless `DISTLOCK_CHAOS_SEED` and `DISTLOCK_CHAOS_SECS` say otherwise):
/// `cargo test --all-features --test chaos -- --ignored --nocapture planted`.
#[test]
#[ignore = "a check of the chaos analysis against a planted bug, about 75 s: run by hand"]
fn chaos_cluster_run_catches_a_planted_bug() {
    if std::env::var(ROLE_VAR).is_ok() || std::env::var_os("DISTLOCK_CHAOS_REPLAY").is_some() {
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // A seed and a length known to catch it (a 30 s run, or a seed that seldom pauses
    // the replica, may pass no renewed lock to another holder): unless given.
    let (seed, secs) = seed_and_secs("chaos (cluster, planted)", 60);
    let seed = match std::env::var_os("DISTLOCK_CHAOS_SEED") {
        Some(_) => seed,
        None => 546_486_926,
    };
    let found = parent::run_cluster_planted(seed, secs, "renewal-ignores-token");
    let unreported = found.iter().filter(|c| **c == "unreported loss").count();
    println!(
        "planted renewal-ignores-token: {} violation(s), {unreported} unreported loss(es): {found:?}",
        found.len()
    );
    assert!(
        unreported > 0,
        "the analysis did not catch the planted bug (seed {seed}): {found:?}"
    );
}

/// Entry point of the child processes; does nothing in a normal test run.
#[test]
fn chaos_child() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    assert_eq!(role, "child", "unknown chaos role `{role}`");
    child::main();
}
