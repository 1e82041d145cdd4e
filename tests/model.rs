//! Model checking of the lock and idempotency protocols: an exhaustive explorer of every
//! state the protocols reach with a few clients, a clock, and a network that loses and
//! delays requests and replies, checking the safety invariants in each state.
//!
//! Run it (a few seconds, unoptimized; `--nocapture` shows the state counts and the
//! counterexample traces):
//!
//! ```text
//! cargo test --test model -- --nocapture
//! ```
//!
//! # What is modelled
//!
//! `model/explore.rs` is a breadth-first search with a visited set, so a violation comes
//! with a shortest trace. `model/lock.rs` and `model/idem.rs` are the two protocols as
//! fixed for the four faults (commit 0b8a0f7), the lock's with fences on demand (a
//! holder asks for its fence; acquiring assigns none); each fault's faulty variant is
//! kept as a planted bug the checker must find (see below).
//!
//! **Locks** (`model/lock.rs`): Redis holds the key (a token or a yield marker, with its
//! expiry) and the fence counter. Tasks `A1` and `A2` share client `A` (one local queue),
//! `B1` is client `B`'s (renewing); each takes the lock once, and asks for a fence when
//! it likes while it holds.
//!
//! | model step | code |
//! |---|---|
//! | `acquire() enters the local queue` | `LocalQueues::enter`: the turn, or a place in the queue, or (the holder's lease over) contending without the turn |
//! | `redis runs acquire(T)` | `acquire.lua`: `SET NX PX`, no fence; the contender's own token: `PEXPIRE` (fault 1, fixed); a yield marker not naming the client: taken over; else busy |
//! | `gets Taken` / `gets Busy` | `LockRequest::taken` (lease: `ttl` from when the try was *sent*, no fence yet; `Turn::begin`) / trying again later, or giving up at the deadline |
//! | an acquire try times out | `Error::Backend`, and `spawn_cleanup` (a release) in the background |
//! | `asks for a fence` | `LockGuard::fence`: modelled as a pipeline of `INCR` of the counter, then `GET` of the key, two steps (other clients' commands may run between them): weaker than `fence.lua`, which does both in one script, so what holds here holds there. The `GET` finding the token makes the `INCR`'s value the fence, kept for the acquisition (never asked again); else `Err(Lost)` and the value is skipped. Asked at any moment while holding, the lease over or not (a paused process does not look at its clock first). Either command may time out, run or not: no fence, asked again later with a new `INCR` |
//! | `release()` | `Releasing::finish`: `Turn::next` takes the first waiter out of the queue; `release_raw` sends `release.lua`, and after a transport error once more (a retry, the same call); a second error ends it (`Error::Backend`, the lock left to expire) |
//! | `the release() future is dropped` | `Releasing::drop` (fault 2, fixed): the release goes on in a task of its own, its first try a retry, its outcome heard by no one |
//! | `redis runs release(..)` | `release.lua`: the key holds the token → handoff to the waiter's token (no fence, the counter untouched), or the yield marker, or delete (`Now`); else the key holds the waiter's token → `Handed` (only this release's handoff writes it); else `NotOurs`. The uncontended release is `release.lua`'s fast path (compare-and-delete when no waiting marker is set): the free choice of `others` covers whether waiters are registered. `PUBSUB NUMSUB` (others listening) and the turn budget (`turn over`) are free choices |
//! | `gets NotOurs -> reports ..` | `release_raw` reads `NotOurs`: on a first try `Lost`; on a retry `Earlier` while the lease of the token released has not ended by the client's clock (the key outlives the lease: only a lost try of ours can have removed the token), `Unknown` (`Error::Backend`) once it has |
//! | `gets Handed` etc. | `Turn::grant` (the waiter holds, without a fence, its lease from the release's start), or, the waiter gone, the release of its token in turn (its lease the same); `Turn::give_back`; the `Turn` dropped (`Wake::Turn` to the next waiter) |
//! | `the watchdog sends extend` | `watchdog::tick`, `extend.lua`: success → lease end = send + `ttl`; `0` → marked lost; no answer → tried again; the lease end passing → marked lost (fault 4, fixed) |
//! | `stops waiting in the queue` / `gives up waiting` | `enter`'s timer finding the holder's lease over: the waiter contends (with a fresh token, see below) / its deadline, or its future dropped |
//! | `the clock ticks` | keys expire (`PX`), leases run out; a client pauses by not acting while it ticks |
//! | `times out` | the request is lost or late (it may still run later: `DELAYED`), or it ran and its reply is lost |
//!
//! **Idempotency** (`model/idem.rs`): Redis holds the record (none, in progress with
//! owner, fingerprint and lease, or completed). `C1(X)` and `C2(X)` send one payload,
//! `C3(Y)` another; each calls once.
//!
//! | model step | code |
//! |---|---|
//! | `sends Claim` | `begin` → `idem_claim.lua`: new; a retry of its own claim; another fingerprint → mismatch, even once the lease ended (fault 3, fixed); a live lease → in progress; an ended one → taken over; completed → replay |
//! | `gets InProgress` / a claim times out | claiming again later, or giving up / `Error::Backend`, and `spawn_release` in the background |
//! | `the body runs` | the body's effects (a body that fails has none) |
//! | `sends Renew` | the heartbeat of `Claim::keep`, `idem_renew.lua`: success → lease end = send + lease; `0`, or an error after a whole lease without renewal → reported lost: the body is cancelled, the call returns `Lost` (fault 4, fixed) |
//! | `the body returns Ok: complete` | `Claim::complete`: `APPEND` of the result, then `idem_settle.lua` when the length is not the expected one; the first result in the value is kept whoever holds the claim (1 stored, 2 stored by an earlier try, 0 another result came first) |
//! | `the body returns Err: release` | `Claim::release`, `idem_release.lua`, in the background |
//!
//! # What is abstracted away
//!
//! One clock for Redis and clients, in ticks (no drift): `ttl` and the claim lease are 2
//! ticks, the yield window 1. Time is relative (a deadline is kept as the ticks left until
//! it), so the clock runs without bound. A request may be delayed any number of ticks and
//! time out at any moment; the faults in a run (timeouts, dropped `release()` futures)
//! are bounded (0 to 2). Pub/Sub wake-ups and back-off timing are free (a waiter may try
//! again at any moment), so are `PUBSUB NUMSUB` and a client's turn budget. With two
//! clients a yield marker names only the releaser (the `turns` key is left out). Left out
//! as well: reentrancy, `max_hold`, more keys, Redis failover, the retention and lifetime
//! of idempotency records (longer than any run here), what a record stores. Tokens are
//! unique per acquisition; fences are renumbered 1, 2, ... in each state and the counter
//! lowered to the largest fence held (only their order matters, and that the next fence
//! is above them all; traces show them as a run would). A crashed client is one that
//! pauses forever.
//!
//! # Invariants, checked in every reachable state
//!
//! * Mutual exclusion: no two tasks believe they hold the lock with an unexpired lease (a
//!   task believes while its lease by its own clock has not ended and it was not marked
//!   lost; a task whose local lease ended does not count).
//! * Fences grow: a holder that obtains a fence after another holder obtained one gets a
//!   larger one. The holder whose token is in the key, if it has a fence, has one larger
//!   than every other holder's (a holder paused past its lease has a smaller fence than
//!   the next holder's, or is told `Lost` when it asks); no fence is above the counter.
//! * Release reports, judged where `release()` reads the answer: never success (`Now`,
//!   `Yielded`, `Earlier`, `Handed`) when none of the release's tries found its token (no
//!   silent Ok: the lock expired or was taken under it), never `Lost` for a release that
//!   happened (no false Lost); `Unknown` is neither.
//! * Every exit releases: once a holder's release has returned with an answer, or its
//!   `release()` was dropped, the key does not keep its token (a release that ran out of
//!   tries leaves the lock to expire, as documented).
//! * No contender is told busy by its own token (it would wait for itself: stuck).
//! * Idempotency: no two calls run the body believing they hold the claim with an
//!   unexpired lease; at most one call that ran the body ends without being told its
//!   claim was lost; the body never runs with two payload fingerprints for one key.
//!
//! `model_covers_the_protocol_paths` shows the explorations are not vacuous: handoffs,
//! yield take-overs, waiters leaving, each answer of a retried release (`Earlier`,
//! `Unknown`, `Handed`), fences obtained, a fence refused (`Lost`) to a holder past its
//! lease after another took the lock, delayed requests, dropped releases, fault 1's
//! own-token path, takeovers, replays, mismatches and lost claims all happen.
//!
//! # Planted bugs, each found (`LockBugs`, `IdemBugs`)
//!
//! Release without the token compare; acquire that counts its own token as another
//! holder's (fault 1); a dropped `release()` abandoned (fault 2); takeover without the
//! fingerprint check (fault 3); renewal that stops silently, for locks and for claims
//! (fault 4); a release retry that reports success whenever the key does not hold its
//! token, whatever the lease; a fence request that skips the `GET` check.
//!
//! # Fenced writes (`model/fenced.rs`)
//!
//! `set_fenced.lua` with three writers holding fences 1 to 3, whose writes the network
//! delays, reorders and duplicates (retries after a lost reply): no write lands after one
//! with a larger fence, the value stored is the highest fence's, and a refusal names a
//! larger fence. Planted (`FencedBugs`), each found: the check and the write as two steps
//! (a stale write lands after the next holder's), and an equal fence refused (a retry of
//! a write that landed is told it is stale).
//!
//! # Semaphores (`model/permits.rs`, on the clients and faults of `model/leases.rs`)
//!
//! `permit_*.lua` and the guard over them, with three clients and two permits, tries and
//! releases that time out and may run later, lost replies, a renewal, and the clean-up
//! of a try that timed out: never more clients believing they hold a permit than
//! permits, and no release told success for a permit that had run out. Planted
//! (`PermitBugs`), each found: the lease counted from the reply; the count checked,
//! then the token added, as two commands; a release that ignores an ended lease; a
//! release retry that reports success whatever the lease.
//!
//! # Read/write locks (`model/rw.rs`, on the same)
//!
//! `read_acquire.lua` and `write_acquire.lua` with two readers and a writer, the same
//! faults: never a writer believing it holds beside a reader that believes it does, and
//! no release told success after its lease ended. Planted (`RwBugs`), each found: a
//! reader's try that ignores the writer; the writer's that ignores the readers; a
//! reader's try that reads the writer's lease as ended a tick early.
//!
//! # Kinds on one name (`model/rw.rs`, `SharedName`, on the same)
//!
//! A reader, a lock and the write lock of one name: the lock and the writer keep their
//! tokens at the key, the readers `readers` (live while a share runs); the lock's tries
//! after it found `readers` are a writer's (its mark keeps new readers out). Never two of
//! them believing they hold at once. Planted (`SharedBugs`), each found: the lock's try
//! that ignores `readers` (the plain `SET NX` that once let a lock in beside readers);
//! the writer's that ignores the lock's token.
//!
//! # Issues the model found in the code, fixed since (`found_*` tests keep them planted)
//!
//! * `local.rs`: a waiter that stopped waiting because the holder's lease ended contended
//!   with the token it queued with, which the holder's release may write in a handoff.
//!   With the own-token acquire, it took the lock the handoff wrote; the holder, the
//!   waiter having left, released that token: it deleted the lock the waiter then held,
//!   and another client took it. No network fault needed, only a request slow enough.
//!   Fixed: such a waiter contends under a fresh token (`Entered::LeaseOver`).
//! * `lock/mod.rs` `taken`: a lock taken in Redis counted its lease from the reply, so it
//!   outlived the key by the round trip. Fixed: from the send.
//! * `watchdog.rs` `tick`: the lease end was checked between renewal round trips only: a
//!   renewal in flight when the lease ended kept the lock held, up to a command timeout
//!   after the key expired. Fixed: a renewal is not waited for past the first lease end.
//! * `Claim::keep`: the heartbeat counted the lease from when the body started, after the
//!   claim's reply. Fixed: from the claim's send.
//! * `Claim::complete`: a complete that found the claim taken over was only logged, the
//!   caller got `Ok`. Fixed: the call returns `Lost`.
//! * `idem_release.lua`: giving up a claim that took over (its body failed, or its
//!   claim's reply was lost) deleted the record, and with it the fingerprint of the body
//!   that may have run: another payload then ran under the key. Fixed: the record stays
//!   in progress with its fingerprint, no owner and an ended lease.
//!
//! # A limit, documented
//!
//! `Claim::complete` retries transient failures while the claim's lease lasts, then gives
//! up with a log line: the caller keeps its `Ok` (a caller told to retry would run the
//! body again too), the claim ends with its lease and a repeat then runs the body again.
//! The model, whose faults are bounded, retries until answered;
//! `limit_complete_giving_up_is_found` shows the double run when it gives up.

mod model {
    pub(crate) mod explore;
    pub(crate) mod fenced;
    pub(crate) mod idem;
    pub(crate) mod leases;
    pub(crate) mod lock;
    pub(crate) mod permits;
    pub(crate) mod rw;
}

use model::explore::{Counterexample, Explored, Model, REACHED, explore};
use model::fenced::{FencedBugs, FencedModel};
use model::idem::{IdemBugs, IdemModel, IdemStep};
use model::leases::Leases;
use model::lock::{Found, LockBugs, LockChecks, LockModel, LockStep, Rel, Reply};
use model::permits::{PermitBugs, PermitModel, Permits};
use model::rw::{ReadWrite, RwBugs, RwModel, SharedBugs, SharedModel, SharedName};

/// Far more than any exploration here needs: a model whose bounds were loosened by
/// mistake fails instead of running for minutes.
const MAX_STATES: usize = 2_000_000;

/// Explores `model` exhaustively; every invariant must hold in every reachable state.
fn holds<M: Model>(name: &str, model: &M) -> Explored {
    match explore(model, MAX_STATES) {
        Ok(explored) => {
            println!("{name}: every invariant holds in every reachable state: {explored}");
            explored
        }
        Err(cex) => panic!("{name}: the protocol as fixed violates an invariant\n{cex}"),
    }
}

/// Explores `model` (with a bug planted): the checker must find a violation, and the one
/// it finds first (on a shortest trace) must be about `expected`.
fn found<M: Model>(name: &str, model: &M, expected: &[&str]) -> Counterexample {
    match explore(model, MAX_STATES) {
        Ok(explored) => panic!("{name}: the checker found nothing ({explored})"),
        Err(cex) => {
            println!("{name}: found\n{cex}");
            assert!(
                expected.iter().any(|e| cex.violation.contains(e)),
                "{name}: expected a violation about {expected:?}, found {:?}",
                cex.violation
            );
            cex
        }
    }
}

/// A transition `goal` is reachable in `model`: the path it stands for is explored.
fn reaches<M: Model>(name: &str, model: &M) {
    match explore(model, MAX_STATES) {
        Ok(explored) => panic!("{name}: never happens ({explored})"),
        Err(cex) if cex.violation == REACHED => {
            println!("{name}: reached in {} steps", cex.trace.len() - 1)
        }
        Err(cex) => panic!("{name}: an invariant fails first\n{cex}"),
    }
}

/// `A1`, `A2` and `B1`, one network fault, on `A1`'s requests (no renewal, no yield, no
/// waiter giving up, no delayed requests, no cancelled release, to keep it small).
fn three_tasks_one_fault() -> LockModel {
    LockModel {
        max_faults: 1,
        faulty: [true, false, false],
        delayed: false,
        cancels: false,
        renew: [false, false],
        yield_window: 0,
        waiters_give_up: false,
        ..LockModel::fixed()
    }
}

fn lock_bugs(bugs: LockBugs) -> LockModel {
    LockModel::with(bugs)
}

fn idem_bugs(bugs: IdemBugs) -> IdemModel {
    IdemModel::with(bugs)
}

const NO_BUGS: LockBugs = LockBugs {
    release_no_compare: false,
    acquire_ignores_own_token: false,
    renewal_stops_silently: false,
    retry_ok_when_taken: false,
    release_abandoned_on_cancel: false,
    reuse_queue_token: false,
    lease_from_reply: false,
    lost_check_waits_for_renewal: false,
    fence_without_compare: false,
};

const NO_IDEM_BUGS: IdemBugs = IdemBugs {
    takeover_without_fingerprint: false,
    renewal_stops_silently: false,
    complete_gives_up: false,
    release_forgets_takeover: false,
    complete_lost_only_logged: false,
    lease_from_keep_start: false,
};

// The protocols as fixed.

/// The acquire script's branch for a contender that finds its own token (fault 1's fix).
fn finds_own_token(step: &LockStep) -> bool {
    matches!(
        step,
        LockStep::Exec {
            reply: Reply::Taken {
                found: Found::Own,
                ..
            },
            ..
        }
    )
}

#[test]
fn model_lock_protocol_holds() {
    let all = LockModel::fixed();
    let mut states = 0;
    for (name, model) in [
        (
            "lock: A1 A2 B1, handoff, yield, B renewing, waiters leaving or giving up; no \
             network faults",
            LockModel {
                max_faults: 0,
                ..all
            },
        ),
        (
            "lock: A1 A2 B1, one network fault on A1's requests",
            three_tasks_one_fault(),
        ),
        (
            "lock: A1 B1 (B renewing, yield), two network faults, delayed requests",
            LockModel {
                tasks: [true, false, true],
                ..all
            },
        ),
        (
            "lock: A1 A2 (handoff, waiters leaving or giving up), two network faults, delayed \
             requests",
            LockModel {
                tasks: [true, true, false],
                ..all
            },
        ),
    ] {
        states += holds(name, &model).states;
    }
    println!("lock: {states} states explored in all");
}

#[test]
fn model_idempotency_protocol_holds() {
    let all = IdemModel::fixed();
    let mut states = 0;
    for (name, model) in [
        (
            "idempotency: C1(X) C2(X) C3(Y), one network fault, delayed requests",
            IdemModel {
                max_faults: 1,
                ..all
            },
        ),
        (
            "idempotency: C1(X) C2(X), two network faults, delayed requests",
            IdemModel {
                callers: [true, true, false],
                ..all
            },
        ),
        (
            "idempotency: C1(X) C3(Y), two network faults, delayed requests",
            IdemModel {
                callers: [true, false, true],
                ..all
            },
        ),
    ] {
        states += holds(name, &model).states;
    }
    println!("idempotency: {states} states explored in all");
}

/// The exhaustive explorations are not vacuous: every path of the protocol they are
/// meant to cover is taken.
#[test]
fn model_covers_the_protocol_paths() {
    let lock = |goal: fn(&LockStep) -> bool| LockModel {
        goal: Some(goal),
        ..LockModel::fixed()
    };
    let faulty = |goal: fn(&LockStep) -> bool| LockModel {
        goal: Some(goal),
        max_faults: 2,
        tasks: [true, true, false],
        ..LockModel::fixed()
    };
    /// A retried release's answer, as `release()` reports it.
    fn retry(step: &LockStep, read: Rel) -> bool {
        matches!(step, LockStep::Answer { read: r, retry: true, .. } if *r == read)
    }
    reaches(
        "lock: a release hands the lock to a local waiter",
        &lock(|s| {
            matches!(
                s,
                LockStep::Answer {
                    read: Rel::Handed,
                    ..
                }
            )
        }),
    );
    reaches(
        "lock: another client takes over a yield marker",
        &lock(|s| {
            matches!(
                s,
                LockStep::Exec {
                    reply: Reply::Taken {
                        found: Found::Yield,
                        ..
                    },
                    ..
                }
            )
        }),
    );
    reaches(
        "lock: a waiter leaves the queue when the holder's lease ends",
        &lock(|s| matches!(s, LockStep::Leave(_))),
    );
    reaches(
        "lock: a renewal finds the lock gone",
        &lock(|s| {
            matches!(
                s,
                LockStep::Deliver {
                    reply: Reply::Extended(false),
                    ..
                }
            )
        }),
    );
    reaches(
        "lock: a retried release answers Earlier (its token gone within its lease)",
        &faulty(|s| retry(s, Rel::Earlier)),
    );
    reaches(
        "lock: a retried release answers Unknown (its token gone, its lease over)",
        &faulty(|s| retry(s, Rel::Unknown)),
    );
    reaches(
        "lock: a retried release finds its handoff done",
        &faulty(|s| retry(s, Rel::Handed)),
    );
    reaches(
        "lock: a holder obtains a fence",
        &lock(|s| {
            matches!(
                s,
                LockStep::Fence {
                    reply: Reply::Fenced { fence: Some(_), .. },
                    ..
                }
            )
        }),
    );
    reaches(
        "lock: a holder past its lease asks for a fence after another took the lock: Lost",
        &lock(|s| {
            matches!(
                s,
                LockStep::Fence {
                    reply: Reply::Fenced {
                        fence: None,
                        other: true
                    },
                    ..
                }
            )
        }),
    );
    reaches(
        "lock: a delayed request runs after its client gave up on it",
        &faulty(|s| matches!(s, LockStep::Exec { ghost: true, .. })),
    );
    reaches(
        "lock: a release() future is dropped and the release goes on",
        &lock(|s| matches!(s, LockStep::Cancel(_))),
    );
    reaches(
        "lock: a waiter handed back by a release that gave up finds its own token (fault 1)",
        &faulty(finds_own_token),
    );
    let idem = |goal: fn(&IdemStep) -> bool| IdemModel {
        goal: Some(goal),
        ..IdemModel::fixed()
    };
    use model::idem::Reply as R;
    for (name, goal) in [
        (
            "idempotency: a claim takes over an expired one",
            (|s: &IdemStep| {
                matches!(
                    s,
                    IdemStep::Deliver {
                        reply: R::TookOver,
                        ..
                    }
                )
            }) as fn(&IdemStep) -> bool,
        ),
        ("idempotency: a repeat replays the stored result", |s| {
            matches!(
                s,
                IdemStep::Deliver {
                    reply: R::Replay,
                    ..
                }
            )
        }),
        ("idempotency: another payload is refused", |s| {
            matches!(
                s,
                IdemStep::Deliver {
                    reply: R::Mismatch,
                    ..
                }
            )
        }),
        ("idempotency: a renewal finds the claim lost", |s| {
            matches!(
                s,
                IdemStep::Deliver {
                    reply: R::Renewed(false),
                    ..
                }
            )
        }),
        (
            "idempotency: a complete finds another result stored first",
            |s| {
                matches!(
                    s,
                    IdemStep::Deliver {
                        reply: R::Stored(0),
                        ..
                    }
                )
            },
        ),
        (
            "idempotency: a retried complete finds its first try stored",
            |s| {
                matches!(
                    s,
                    IdemStep::Deliver {
                        reply: R::Stored(2),
                        ..
                    }
                )
            },
        ),
    ] {
        reaches(name, &idem(goal));
    }
}

// Planted bugs: each must be found.

/// A release (here a timed-out acquire's clean-up) removes the holder's token; the
/// holder's own release then reports success.
#[test]
fn planted_release_without_token_compare_is_found() {
    let model = lock_bugs(LockBugs {
        release_no_compare: true,
        ..NO_BUGS
    });
    found(
        "planted: release without the token compare",
        &model,
        &["silent Ok"],
    );
    found(
        "planted: release without the token compare (looking past the report)",
        &LockModel {
            checks: LockChecks {
                reports: false,
                orphans: true,
            },
            ..model
        },
        &["both believe they hold", "fences out of order"],
    );
}

/// A holder paused past its lease asks for a fence after the next holder got one.
#[test]
fn planted_fence_without_compare_is_found() {
    found(
        "planted: the fence request does not check the key",
        &lock_bugs(LockBugs {
            fence_without_compare: true,
            ..NO_BUGS
        }),
        &["fences out of order"],
    );
}

/// Fault 1: a release hands the lock to the next local waiter, but both its tries time
/// out (the first ran, its reply was lost): it gives up and the waiter, handed back,
/// contends with the token the handoff wrote.
#[test]
fn planted_acquire_ignoring_its_own_token_is_found() {
    found(
        "planted: acquire that counts its own token as another holder's",
        &lock_bugs(LockBugs {
            acquire_ignores_own_token: true,
            ..NO_BUGS
        }),
        &["told busy by its own token"],
    );
}

/// Fault 2: a cancelled release is abandoned, the lock left held by no one.
#[test]
fn planted_release_abandoned_on_cancel_is_found() {
    found(
        "planted: a cancelled release is abandoned",
        &lock_bugs(LockBugs {
            release_abandoned_on_cancel: true,
            ..NO_BUGS
        }),
        &["a release that never happened"],
    );
}

/// Fault 4 (locks): renewal that stops watching the lease without marking it lost.
#[test]
fn planted_lock_renewal_stopping_silently_is_found() {
    found(
        "planted: lock renewal that stops silently",
        &lock_bugs(LockBugs {
            renewal_stops_silently: true,
            ..NO_BUGS
        }),
        &["both believe they hold"],
    );
}

/// A retry whose lease ended reports `Earlier` for a token that expired.
#[test]
fn planted_retry_reporting_ok_when_taken_is_found() {
    found(
        "planted: release retry that reports Ok whenever the key does not hold its token",
        &lock_bugs(LockBugs {
            retry_ok_when_taken: true,
            ..NO_BUGS
        }),
        &["silent Ok"],
    );
}

/// Fault 3: takeover of an expired claim without the fingerprint check.
#[test]
fn planted_takeover_without_fingerprint_is_found() {
    found(
        "planted: takeover without the fingerprint check",
        &idem_bugs(IdemBugs {
            takeover_without_fingerprint: true,
            ..NO_IDEM_BUGS
        }),
        &["two payload fingerprints"],
    );
}

/// Fault 4 (idempotency): a heartbeat that stops without reporting the claim lost.
#[test]
fn planted_idempotency_renewal_stopping_silently_is_found() {
    found(
        "planted: claim renewal that stops silently",
        &idem_bugs(IdemBugs {
            renewal_stops_silently: true,
            ..NO_IDEM_BUGS
        }),
        &["told its claim was lost", "believing they hold the claim"],
    );
}

// Issues the model found in the code (fixed since; planted here).

/// `local.rs`: a waiter that stops waiting because the holder's lease ended contends
/// with the token it queued with; the holder's late release finds that token in the key
/// and reports a handoff (Ok) although the lock had expired and the waiter took it
/// afresh; the holder then releases "the waiter's" lock, which the waiter holds.
#[test]
fn found_queue_token_reuse_is_found() {
    let model = LockModel {
        bugs: LockBugs {
            reuse_queue_token: true,
            ..NO_BUGS
        },
        ..three_tasks_one_fault()
    };
    found(
        "before its fix: a waiter that left the queue contends with its queue token",
        &model,
        &["silent Ok"],
    );
    found(
        "before its fix: a waiter that left the queue contends with its queue token (looking past \
         the report)",
        &LockModel {
            checks: LockChecks {
                reports: false,
                orphans: true,
            },
            ..model
        },
        &["both believe they hold"],
    );
}

/// `lock/mod.rs` `taken`: the lease of a lock taken in Redis is counted from the reply.
#[test]
fn found_lease_from_reply_is_found() {
    found(
        "before its fix: lease counted from the acquire's reply",
        &lock_bugs(LockBugs {
            lease_from_reply: true,
            ..NO_BUGS
        }),
        &["both believe they hold"],
    );
}

/// `watchdog.rs` `tick`: a lease end passes unnoticed while a renewal is in flight.
#[test]
fn found_lost_check_waiting_for_renewal_is_found() {
    found(
        "before its fix: the lost check waits for the renewal in flight",
        &lock_bugs(LockBugs {
            lost_check_waits_for_renewal: true,
            ..NO_BUGS
        }),
        &["both believe they hold"],
    );
}

/// `idempotency/mod.rs` `Claim::complete`: gives up (after its lease) with a log line.
#[test]
fn limit_complete_giving_up_is_found() {
    found(
        "limit: complete that gives up",
        &IdemModel {
            callers: [true, true, false],
            ..idem_bugs(IdemBugs {
                complete_gives_up: true,
                ..NO_IDEM_BUGS
            })
        },
        &["told its claim was lost", "believing they hold the claim"],
    );
}

/// `idem_release.lua`: giving up a claim that took over deletes the record, and with it
/// the fingerprint of the body that may have run.
#[test]
fn found_release_forgetting_takeover_is_found() {
    found(
        "before its fix: giving up a taken-over claim deletes the record",
        &IdemModel {
            max_faults: 0,
            ..idem_bugs(IdemBugs {
                release_forgets_takeover: true,
                ..NO_IDEM_BUGS
            })
        },
        &["two payload fingerprints"],
    );
}

/// `Claim::complete`: a complete that finds the claim taken over is only logged.
#[test]
fn found_complete_finding_the_claim_lost_is_found() {
    found(
        "before its fix: a complete that finds the claim lost is only logged",
        &IdemModel {
            callers: [true, true, false],
            max_faults: 0,
            ..idem_bugs(IdemBugs {
                complete_lost_only_logged: true,
                ..NO_IDEM_BUGS
            })
        },
        &["told its claim was lost"],
    );
}

/// `Claim::keep`: the heartbeat counts the lease from when the body starts.
#[test]
fn found_claim_lease_from_keep_start_is_found() {
    found(
        "before its fix: the claim's lease counted from the start of the body",
        &IdemModel {
            callers: [true, true, false],
            max_faults: 0,
            ..idem_bugs(IdemBugs {
                lease_from_keep_start: true,
                ..NO_IDEM_BUGS
            })
        },
        &["believing they hold the claim"],
    );
}

/// Fenced writes (`set_fenced.lua`): with the check and the write in one script, no
/// write lands after one with a larger fence, whatever the network does.
#[test]
fn model_fenced_writes_hold() {
    let explored = holds("fenced writes", &FencedModel::fixed());
    assert!(explored.states > 100, "{explored}");
}

/// The check and the write as two steps: a stale write checked before the next holder's
/// write lands after it.
#[test]
fn planted_fence_check_then_write_is_found() {
    found(
        "planted: the fence checked, then the value written",
        &FencedModel {
            bugs: FencedBugs {
                check_then_write: true,
                ..FencedBugs::default()
            },
            ..FencedModel::fixed()
        },
        &["landed after"],
    );
}

/// An equal fence refused: the retry of a write that landed is told it is stale.
#[test]
fn planted_equal_fence_refused_is_found() {
    found(
        "planted: an equal fence refused",
        &FencedModel {
            bugs: FencedBugs {
                equal_refused: true,
                ..FencedBugs::default()
            },
            ..FencedModel::fixed()
        },
        &["not larger than its own"],
    );
}

/// Semaphores (`permit_*.lua` and the guard): never more believers than permits, no
/// release told success for a permit that ran out, whatever the network does.
#[test]
fn model_semaphore_holds() {
    let explored = holds("semaphore", &PermitModel::fixed());
    assert!(explored.states > 1000, "{explored}");
}

fn permit_bug(bugs: PermitBugs) -> PermitModel {
    Leases(Permits { bugs })
}

/// The lease counted from the reply: a holder believes it holds after the server let
/// its permit go to another, or a release retry reads its ended permit as released.
#[test]
fn planted_permit_lease_from_reply_is_found() {
    found(
        "planted: a permit's lease counted from the reply",
        &permit_bug(PermitBugs {
            lease_from_reply: true,
            ..PermitBugs::default()
        }),
        &["believe they hold", "had run out first"],
    );
}

/// The count checked, then the token added: two clients both find room for the last
/// permit.
#[test]
fn planted_permit_check_then_add_is_found() {
    found(
        "planted: the count checked, then the token added",
        &permit_bug(PermitBugs {
            check_then_add: true,
            ..PermitBugs::default()
        }),
        &["believe they hold"],
    );
}

/// A release that ignores an ended lease: its holder is told released, not lost.
#[test]
fn planted_permit_release_ignoring_expiry_is_found() {
    found(
        "planted: a release that ignores an ended lease",
        &permit_bug(PermitBugs {
            release_ignores_expiry: true,
            ..PermitBugs::default()
        }),
        &["had run out first"],
    );
}

/// A release retry that reports success whatever the lease.
#[test]
fn planted_permit_retry_always_ok_is_found() {
    found(
        "planted: a release retry that always reports success",
        &permit_bug(PermitBugs {
            retry_always_ok: true,
            ..PermitBugs::default()
        }),
        &["had run out first"],
    );
}

/// Read/write locks: never a writer beside a reader, whatever the network does.
#[test]
fn model_read_write_lock_holds() {
    let explored = holds("read/write lock", &RwModel::fixed());
    assert!(explored.states > 1000, "{explored}");
}

fn rw_bug(bugs: RwBugs) -> RwModel {
    Leases(ReadWrite { bugs })
}

#[test]
fn planted_reader_ignoring_the_writer_is_found() {
    found(
        "planted: a reader's try that ignores the writer",
        &rw_bug(RwBugs {
            reader_ignores_writer: true,
            ..RwBugs::default()
        }),
        &["beside reader"],
    );
}

#[test]
fn planted_writer_ignoring_the_readers_is_found() {
    found(
        "planted: the writer's try that ignores the readers",
        &rw_bug(RwBugs {
            writer_ignores_readers: true,
            ..RwBugs::default()
        }),
        &["beside reader"],
    );
}

#[test]
fn planted_writer_lease_read_as_ended_early_is_found() {
    found(
        "planted: a reader that reads the writer's lease as ended a tick early",
        &rw_bug(RwBugs {
            writer_ends_early: true,
            ..RwBugs::default()
        }),
        &["beside reader"],
    );
}

/// A lock, a write lock and a read lock on one name: never two of them at once, whatever
/// the network does.
#[test]
fn model_kinds_on_one_name_hold() {
    let explored = holds(
        "a lock, a write lock and a reader on one name",
        &SharedModel::fixed(),
    );
    assert!(explored.states > 1000, "{explored}");
}

#[test]
fn planted_lock_ignoring_the_readers_is_found() {
    found(
        "planted: a lock's try that ignores `readers` (a plain SET NX beside readers)",
        &Leases(SharedName {
            bugs: SharedBugs {
                lock_ignores_readers: true,
                ..SharedBugs::default()
            },
        }),
        &["beside reader 0", "reader 0 believes"],
    );
}

#[test]
fn planted_writer_ignoring_the_lock_is_found() {
    found(
        "planted: the writer's try that ignores the lock's token",
        &Leases(SharedName {
            bugs: SharedBugs {
                writer_ignores_lock: true,
                ..SharedBugs::default()
            },
        }),
        &["the lock believes", "beside the lock"],
    );
}
