//! The lock protocol: `acquire.lua`, `release.lua`, `extend.lua` and the fence pipeline on
//! the server; the local queue of `local.rs`, `LockRequest::acquire`, `LockGuard::fence`
//! (a fence on demand), `Releasing` and `release_raw` of `lock/guard.rs` and the watchdog of
//! `watchdog.rs` on the clients.
//!
//! Three tasks: `A1` and `A2` share client `A` (one local queue, so a release can hand
//! the lock to the other), `B1` is client `B`'s. Each task takes the lock once: enters
//! its client's local queue, contends in Redis (or is handed the lock), holds it
//! (renewing it when its client renews, asking for a fence at any moment when its
//! client asks for fences), releases it, and is done.
//!
//! Time is kept relative: every deadline is the number of ticks left until it (the key's
//! expiry, a lease's end), so states that differ only in the clock's reading are one,
//! and the clock runs without bound.

use std::fmt;

use super::explore::Model;

/// No task / token / fence; a count of ticks that does not run.
const NO: u8 = u8::MAX;
/// A lease end that never comes: the lease is no longer watched (renewal stopped silently).
const NEVER: u8 = u8::MAX;

pub(crate) const TASKS: usize = 3;
const CLIENT_OF: [usize; TASKS] = [0, 0, 1];
const TASK_NAMES: [&str; TASKS] = ["A1", "A2", "B1"];
const CLIENT_NAMES: [&str; 2] = ["A", "B"];

/// Planted faults, each off in the protocol as fixed.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LockBugs {
    /// `release.lua` deletes (or hands over, or yields) whatever the key holds.
    pub(crate) release_no_compare: bool,
    /// `acquire.lua` before fault 1 was fixed: a contender that finds its own token in the
    /// key (a handoff written by a release whose reply was lost) counts it as someone
    /// else's and is told busy.
    pub(crate) acquire_ignores_own_token: bool,
    /// Fault 4 before its fix: renewal stops (the watchdog task gone with the runtime that
    /// started it, or a failed renewal dropped) without marking the lock lost: the holder
    /// believes it holds forever.
    pub(crate) renewal_stops_silently: bool,
    /// A retried release reports success whenever the key does not hold its token
    /// (`NotOurs` read as `Earlier` without looking at the lease), even when its lease
    /// ended and another holder has taken the lock since.
    pub(crate) retry_ok_when_taken: bool,
    /// Fault 2 before its fix: a `release()` whose future is dropped (cancelled) while a
    /// try is in flight is abandoned: the try may still run or not (the lock then stays
    /// held by nobody until its lease ends), the turn passes on, and the waiter the
    /// release had taken out of the queue contends (with its queue token).
    pub(crate) release_abandoned_on_cancel: bool,
    /// `local.rs` before its fix: a waiter that leaves the queue because the holder's lease ran
    /// out contends in Redis with the token it queued with, the token a late handoff of
    /// the holder writes, and then releases (the waiter having left). With fault 1 fixed
    /// the contender takes "its own" token, and the holder's clean-up deletes it.
    pub(crate) reuse_queue_token: bool,
    /// `LockRequest::taken` before its fix: the lease of a lock taken in Redis runs from when the
    /// reply arrived (`Instant::now()` after the round trip), not from when the try was
    /// sent; a slow reply makes the client's lease outlive the key's.
    pub(crate) lease_from_reply: bool,
    /// `watchdog::tick` before its fix: the lease-end check runs only between renewal round trips,
    /// so a renewal still in flight when the lease ends keeps the lock "held" until its
    /// reply (up to the command timeout) although the key may have expired.
    pub(crate) lost_check_waits_for_renewal: bool,
    /// The fence request takes the `INCR`'s value whatever the `GET` finds in the key: a
    /// holder paused past its lease gets a fence larger than the next holder's.
    pub(crate) fence_without_compare: bool,
}

/// Which invariants are checked (all, but for tests that look past one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LockChecks {
    /// What releases report: no silent Ok, no false Lost.
    pub(crate) reports: bool,
    /// A finished holder's token is not left in the key.
    pub(crate) orphans: bool,
}

/// The bounds and settings of one exploration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LockModel {
    pub(crate) bugs: LockBugs,
    /// The lease (`ttl`), in clock ticks.
    pub(crate) ttl: u8,
    /// Faults in the whole run: requests that time out (request or reply lost or late)
    /// and `release()` futures dropped.
    pub(crate) max_faults: u8,
    /// A request that timed out before Redis ran it may still run later.
    pub(crate) delayed: bool,
    /// Which clients keep their leases (`renew(true)`).
    pub(crate) renew: [bool; 2],
    /// The yield window in ticks (0: releases never yield).
    pub(crate) yield_window: u8,
    /// Local waiters may give up (deadline, or their future dropped).
    pub(crate) waiters_give_up: bool,
    /// A `release()` future may be dropped (cancelled) while a try is in flight (a fault,
    /// counted in `max_faults`).
    pub(crate) cancels: bool,
    /// Which of `A1`, `A2`, `B1` take part.
    pub(crate) tasks: [bool; TASKS],
    /// Which clients' holders ask for a fence (at any moment while they hold).
    pub(crate) fences: [bool; 2],
    /// Whose requests may time out.
    pub(crate) faulty: [bool; TASKS],
    pub(crate) checks: LockChecks,
    /// A transition to look for instead (to show a path is taken at all).
    pub(crate) goal: Option<fn(&LockStep) -> bool>,
    /// Renumber fences in each state (off to replay a trace with the fences a run sees).
    pub(crate) compress: bool,
}

impl LockModel {
    /// The protocol as fixed, with the bounds of the exhaustive test.
    pub(crate) fn fixed() -> Self {
        LockModel {
            bugs: LockBugs::default(),
            ttl: 2,
            max_faults: 2,
            delayed: true,
            renew: [false, true],
            yield_window: 1,
            waiters_give_up: true,
            cancels: true,
            tasks: [true; TASKS],
            fences: [true; 2],
            faulty: [true; TASKS],
            checks: LockChecks {
                reports: true,
                orphans: true,
            },
            goal: None,
            compress: true,
        }
    }

    /// The fixed protocol with `bugs` planted.
    pub(crate) fn with(bugs: LockBugs) -> Self {
        LockModel {
            bugs,
            ..LockModel::fixed()
        }
    }
}

/// What the lock key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Val {
    /// A token: `task * 2 + generation` (generation 1: a fresh token for a waiter that
    /// left the queue).
    Tok(u8),
    /// A yield marker naming this client (`yield: <id> `).
    Yield(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    val: Val,
    /// Ticks until it expires (at least 1).
    left: u8,
}

/// A script call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Req {
    /// `acquire.lua` with this token.
    Acquire { tok: u8 },
    /// `release.lua`: the token, the next local waiter's token (`NO`: none) and whether
    /// this client's turn is over.
    Release { tok: u8, next: u8, turn_over: bool },
    /// `extend.lua` (the watchdog's renewal).
    Extend { tok: u8 },
    /// The fence request's first command: `INCR` of the counter.
    Incr,
    /// Its second, pipelined right after: `GET` of the key, the check that this token
    /// still holds it (then the `INCR`'s value is the fence).
    Fence { tok: u8 },
}

/// `release.lua`'s answer, and what `release()` makes of it (the `Released` of
/// `backend/mod.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Rel {
    /// Deleted (the script's answer, reported as is).
    Now,
    /// Left to the other clients for the yield window (idem).
    Yielded,
    /// Handed to the next local waiter (idem).
    Handed,
    /// The script's answer when the key is gone or holds something else; the client
    /// reads it as one of the three below.
    NotOurs,
    /// `NotOurs` on a retry within the lease: an earlier try released it.
    Earlier,
    /// `NotOurs` on a first try.
    Lost,
    /// `NotOurs` on a retry after the lease ended: whether an earlier try released it
    /// cannot be told (`Error::Backend`).
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Reply {
    /// Taken; `found` (ghost): what the key held.
    Taken {
        found: Found,
    },
    /// Held by someone else; `own` (ghost): the key held the contender's own token.
    Busy {
        own: bool,
    },
    /// The script's answer (`Now`, `Yielded`, `Handed` or `NotOurs`).
    Released {
        rel: Rel,
    },
    Extended(bool),
    /// The new fence, or `None`: lost; `other` (ghost): the key holds another token.
    Fenced {
        fence: Option<u8>,
        other: bool,
    },
}

/// What is wrong with a release's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Flaw {
    /// Success, though no try of the release found its token (the lock was lost).
    SilentOk,
    /// Lost, though the release happened.
    FalseLost,
}

impl Flaw {
    fn message(self) -> &'static str {
        match self {
            Flaw::SilentOk => {
                "a release reported success although none of its tries found its token: the \
                 lock was lost, expired or taken by another holder (silent Ok)"
            }
            Flaw::FalseLost => "a release that happened was reported Lost (false Lost)",
        }
    }
}

/// What a successful acquire found in the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Found {
    Nothing,
    /// A yield marker not naming this client.
    Yield,
    /// The contender's own token (fault 1's case).
    Own,
}

/// A request in flight on a task's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Net {
    /// Sent, not yet run by Redis.
    Sent(Req),
    /// Run; the reply is on its way.
    Replied(Reply),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Holding {
    tok: u8,
    /// The fence it obtained (`NO`: none yet; asked for on demand, once obtained kept).
    fence: u8,
    /// The counter value its fence request's `INCR` returned, while the request's `GET`
    /// of the key (the check) has not run yet (`NO`: none).
    incr: u8,
    /// Ticks left on the lease by this client's clock (`NEVER`: no longer watched).
    left: u8,
    /// Known lost (marked by the watchdog, or the lease ran out).
    lost: bool,
    /// This task has its client's turn (the local queue's head).
    owns: bool,
    /// A renewal in flight, and the lease it gives when it succeeds (ttl from its send).
    renew: Option<Net>,
    rleft: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Releasing {
    /// The token released by this try (the task's own, or a waiter's that left).
    tok: u8,
    /// Ticks left by this client's clock on the lease of the token released (`NEVER`:
    /// not watched, so not ended): a retry's `NotOurs` within it means an earlier try
    /// released it.
    left: u8,
    /// The local waiter taken out of the queue for this release (`NO`: none), and its
    /// token.
    next: u8,
    next_tok: u8,
    turn_over: bool,
    /// The lease a handed-over lock has left (ttl from when this release began).
    grant: u8,
    net: Option<Net>,
    /// A try may have reached Redis: the next one is a retry.
    sent: bool,
    /// This `release_raw` call already retried once: the next transport error ends it.
    second: bool,
    /// The caller's `release()` was dropped; it goes on in a task of its own.
    cancelled: bool,
    owns: bool,
    /// The token this task held (reported on as `Done`).
    own: u8,
    /// This is the release whose outcome the caller gets (the first of `finish`).
    report: bool,
    /// Ghost: some try of it found the token and released (handed, yielded) it.
    happened: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Phase {
    Idle,
    /// Waiting in the local queue.
    Queued {
        tok: u8,
    },
    /// Contending in Redis: a try in flight (`left`: the lease it gives, ttl from its
    /// send), or `net: None` backing off after a busy answer.
    Contend {
        tok: u8,
        owns: bool,
        net: Option<Net>,
        left: u8,
    },
    Hold(Holding),
    Release(Releasing),
    /// Finished; `held`: the token it held, while the key may still hold it (`NO`
    /// otherwise).
    Done {
        held: u8,
    },
}

/// The local queue's view of the holder's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum QLease {
    None,
    /// `Lease::Until`: ticks left (`NEVER`: a renewed lease, released before it was lost).
    Until(u8),
    /// `Lease::Renewed`: over when this holding task is marked lost.
    Renewed(u8),
}

/// One client's local queue for the key (`local.rs` `State`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Queue {
    busy: bool,
    waiters: [u8; 2],
    lease: QLease,
}

impl Queue {
    fn push_back(&mut self, task: u8) {
        let slot = self.waiters.iter().position(|&w| w == NO).expect("room");
        self.waiters[slot] = task;
    }
    fn push_front(&mut self, task: u8) {
        self.waiters = [task, self.waiters[0]];
    }
    fn pop_front(&mut self) -> u8 {
        let first = self.waiters[0];
        self.waiters = [self.waiters[1], NO];
        first
    }
    fn remove(&mut self, task: u8) {
        if self.waiters[0] == task {
            self.pop_front();
        } else if self.waiters[1] == task {
            self.waiters[1] = NO;
        }
    }
}

/// One state of the whole system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct LockState {
    faults: u8,
    /// The fencing counter.
    counter: u8,
    key: Option<Key>,
    tasks: [Phase; TASKS],
    queues: [Queue; 2],
    /// Requests that timed out on their client but may still run, and background
    /// clean-ups (sorted).
    ghosts: [Option<(u8, Req)>; 2],
    /// A violation seen on a transition (a report), checked with the state invariant.
    bad: Option<&'static str>,
}

/// One transition.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LockStep {
    Tick,
    Start(u8),
    Leave(u8),
    GiveUp(u8),
    Send(u8, Req),
    Renew(u8),
    Release(u8, bool),
    Cancel(u8),
    Exec {
        task: u8,
        req: Req,
        reply: Reply,
        ghost: bool,
    },
    Deliver {
        task: u8,
        reply: Reply,
        gives_up: bool,
    },
    /// A release's answer reaches `release()` (`rel`: the script's), which reports `read`;
    /// `retry`: the try was a retry.
    Answer {
        task: u8,
        rel: Rel,
        read: Rel,
        retry: bool,
    },
    /// A holder asks for a fence and gets the script's answer.
    Fence {
        task: u8,
        reply: Reply,
    },
    Timeout {
        task: u8,
        what: &'static str,
        ran: bool,
    },
}

impl LockState {
    /// The token task `task` queued with, or [`NO`] (no such task, or not queued).
    fn queued_token(&self, task: u8) -> u8 {
        match self.tasks.get(usize::from(task)) {
            Some(Phase::Queued { tok }) => *tok,
            _ => NO,
        }
    }
}

fn tok_name(tok: u8) -> String {
    if tok == NO {
        return "-".into();
    }
    let task = TASK_NAMES[usize::from(tok / 2)];
    if tok % 2 == 1 {
        format!("T({task}')")
    } else {
        format!("T({task})")
    }
}

fn ticks(left: u8) -> String {
    if left == NEVER {
        "forever".into()
    } else {
        format!("{left} left")
    }
}

impl fmt::Display for Req {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Req::Acquire { tok } => write!(f, "acquire({})", tok_name(tok)),
            Req::Extend { tok } => write!(f, "extend({})", tok_name(tok)),
            Req::Incr => write!(f, "INCR fence"),
            Req::Fence { tok } => write!(f, "GET key for {}", tok_name(tok)),
            Req::Release {
                tok,
                next,
                turn_over,
            } => {
                write!(f, "release({}", tok_name(tok))?;
                if next != NO {
                    write!(f, ", next={}", tok_name(next))?;
                    if turn_over {
                        write!(f, ", turn over")?;
                    }
                }
                write!(f, ")")
            }
        }
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Reply::Taken { found } => match found {
                Found::Nothing => write!(f, "Taken"),
                Found::Yield => write!(f, "Taken over a yield marker"),
                Found::Own => write!(f, "Taken finding its own token"),
            },
            Reply::Busy { own: false } => write!(f, "Busy"),
            Reply::Busy { own: true } => write!(f, "Busy (the key holds its OWN token)"),
            Reply::Released { rel } => write!(f, "{rel:?}"),
            Reply::Extended(ok) => write!(f, "Extended({ok})"),
            Reply::Fenced {
                fence: Some(fence), ..
            } => write!(f, "Fenced({fence})"),
            Reply::Fenced {
                fence: None,
                other: false,
            } => write!(f, "Fenced: Lost (the key is gone)"),
            Reply::Fenced {
                fence: None,
                other: true,
            } => write!(f, "Fenced: Lost (the key holds another token)"),
        }
    }
}

impl fmt::Display for LockStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |t: &u8| TASK_NAMES[usize::from(*t)];
        match self {
            LockStep::Tick => write!(f, "the clock ticks"),
            LockStep::Start(t) => write!(f, "{}: acquire() enters the local queue", name(t)),
            LockStep::Leave(t) => write!(
                f,
                "{}: stops waiting in the queue (the holder's lease is over) and contends",
                name(t)
            ),
            LockStep::GiveUp(t) => write!(f, "{}: gives up waiting in the queue", name(t)),
            LockStep::Send(t, req) => write!(f, "{}: tries again: {req}", name(t)),
            LockStep::Renew(t) => write!(f, "{}: the watchdog sends extend", name(t)),
            LockStep::Cancel(t) => write!(f, "{}: the release() future is dropped", name(t)),
            LockStep::Release(t, turn_over) => write!(
                f,
                "{}: release(){}",
                name(t),
                if *turn_over {
                    " (its client's turn is over)"
                } else {
                    ""
                }
            ),
            LockStep::Exec {
                task,
                req,
                reply,
                ghost,
            } => write!(
                f,
                "redis runs {}{req} of {} -> {reply}",
                if *ghost { "the DELAYED " } else { "" },
                name(task)
            ),
            LockStep::Deliver {
                task,
                reply,
                gives_up,
            } => write!(
                f,
                "{}: gets {reply}{}",
                name(task),
                if *gives_up { ", gives up" } else { "" }
            ),
            LockStep::Answer {
                task,
                rel,
                read,
                retry,
            } => {
                write!(f, "{}: gets {rel:?}", name(task))?;
                if *retry {
                    write!(f, " on a retry")?;
                }
                if rel != read {
                    write!(f, " -> reports {read:?}")?;
                }
                Ok(())
            }
            LockStep::Fence { task, reply } => {
                write!(f, "{}: asks for a fence -> {reply}", name(task))
            }
            LockStep::Timeout { task, what, ran } => write!(
                f,
                "{}: {what} times out ({})",
                name(task),
                if *ran {
                    "it ran; the reply is lost"
                } else {
                    "not run yet"
                }
            ),
        }
    }
}

fn show_net(net: &Option<Net>) -> String {
    match net {
        None => String::new(),
        Some(Net::Sent(req)) => format!(" [{req} sent]"),
        Some(Net::Replied(r)) => format!(" [reply {r} in flight]"),
    }
}

/// One tick less (sentinels do not run).
fn tick(left: &mut u8) {
    if *left != NO {
        *left = left.saturating_sub(1);
    }
}

impl LockModel {
    /// Whether the local queue of client `c` sees its holder's lease as over.
    fn lease_over(&self, s: &LockState, c: usize) -> bool {
        match s.queues[c].lease {
            QLease::None => false,
            QLease::Until(left) => left == 0,
            QLease::Renewed(h) => matches!(s.tasks[usize::from(h)], Phase::Hold(x) if x.lost),
        }
    }

    /// What follows every transition: the watchdog marks a lease past its end lost
    /// (unless the faulty check waits for a renewal in flight); requests are sent as soon
    /// as their phase begins (a delay before sending is the same as a later start);
    /// equivalent states are made equal.
    fn settle(&self, s: &mut LockState) {
        let key = s.key.map(|k| k.val);
        let ghosts = s.ghosts;
        for p in s.tasks.iter_mut() {
            match p {
                Phase::Hold(h) => {
                    let blocked = self.bugs.lost_check_waits_for_renewal && h.renew.is_some();
                    if !h.lost && h.left == 0 && !blocked {
                        h.lost = true;
                    }
                    if h.renew.is_none() {
                        h.rleft = 0;
                    }
                }
                Phase::Contend {
                    tok, net, left: l, ..
                } if net.is_none() && *l != NO => {
                    *net = Some(Net::Sent(Req::Acquire { tok: *tok }));
                    *l = self.ttl;
                }
                Phase::Release(r) if r.net.is_none() => {
                    r.net = Some(Net::Sent(Req::Release {
                        tok: r.tok,
                        next: r.next_tok,
                        turn_over: r.turn_over,
                    }));
                }
                Phase::Done { held } if *held != NO => {
                    // Only an acquire can write a token back, and only the try that
                    // took it carried it: once gone from the key, it is gone.
                    let back = ghosts
                        .iter()
                        .flatten()
                        .any(|(_, r)| *r == Req::Acquire { tok: *held });
                    if key != Some(Val::Tok(*held)) && !back {
                        *held = NO;
                    }
                }
                _ => {}
            }
        }
        for p in s.tasks.iter_mut() {
            if let Phase::Release(r) = p {
                if r.next == NO {
                    r.grant = 0;
                }
                if !r.report {
                    r.happened = false;
                }
            }
        }
        if self.compress {
            compress_fences(s);
        }
        if s.ghosts[0].is_none() || (s.ghosts[1].is_some() && s.ghosts[1] < s.ghosts[0]) {
            s.ghosts.swap(0, 1);
        }
    }

    fn take(&self, s: &mut LockState, val: Val) {
        s.key = Some(Key {
            val,
            left: self.ttl,
        });
    }

    /// Runs one script on the server for task `task`.
    fn exec(&self, s: &mut LockState, task: usize, req: Req, others: bool) -> Reply {
        let client = CLIENT_OF[task] as u8;
        let held = s.key.map(|k| k.val);
        match req {
            Req::Acquire { tok } => {
                let free = match held {
                    None => true,
                    Some(Val::Yield(c)) => c != client,
                    Some(Val::Tok(t)) => t == tok && !self.bugs.acquire_ignores_own_token,
                };
                if free && held == Some(Val::Tok(tok)) {
                    // Its own token: the lease starts again.
                    if let Some(k) = s.key.as_mut() {
                        k.left = self.ttl;
                    }
                    Reply::Taken { found: Found::Own }
                } else if free {
                    let found = match held {
                        Some(Val::Yield(_)) => Found::Yield,
                        _ => Found::Nothing,
                    };
                    self.take(s, Val::Tok(tok));
                    Reply::Taken { found }
                } else {
                    Reply::Busy {
                        own: held == Some(Val::Tok(tok)),
                    }
                }
            }
            Req::Extend { tok } => {
                if held == Some(Val::Tok(tok)) {
                    if let Some(k) = s.key.as_mut() {
                        k.left = self.ttl;
                    }
                    Reply::Extended(true)
                } else {
                    Reply::Extended(false)
                }
            }
            Req::Incr => {
                s.counter += 1;
                Reply::Fenced {
                    fence: Some(s.counter),
                    other: false,
                }
            }
            Req::Fence { tok } => {
                let incr = match s.tasks[task] {
                    Phase::Hold(h) => h.incr,
                    _ => NO,
                };
                if held == Some(Val::Tok(tok)) || self.bugs.fence_without_compare {
                    Reply::Fenced {
                        fence: Some(incr),
                        other: false,
                    }
                } else {
                    Reply::Fenced {
                        fence: None,
                        other: matches!(held, Some(Val::Tok(_))),
                    }
                }
            }
            Req::Release {
                tok,
                next,
                turn_over,
            } => Reply::Released {
                rel: self.release_script(s, task, tok, next, turn_over, others),
            },
        }
    }

    /// `release.lua`; `others`: whether other clients' waiters listen on the channel.
    fn release_script(
        &self,
        s: &mut LockState,
        task: usize,
        tok: u8,
        next: u8,
        turn_over: bool,
        others: bool,
    ) -> Rel {
        let client = CLIENT_OF[task] as u8;
        let held = s.key.map(|k| k.val);
        let matched = held == Some(Val::Tok(tok));
        if matched || (self.bugs.release_no_compare && held.is_some()) {
            if matched
                && let Phase::Release(r) = &mut s.tasks[task]
                && r.report
                && r.tok == tok
            {
                r.happened = true;
            }
            if next != NO && (!turn_over || !others) {
                // Handed over without a fence: the waiter asks for one when it needs it.
                self.take(s, Val::Tok(next));
                return Rel::Handed;
            }
            if self.yield_window > 0 && others {
                s.key = Some(Key {
                    val: Val::Yield(client),
                    left: self.yield_window,
                });
                return Rel::Yielded;
            }
            s.key = None;
            return Rel::Now;
        }
        if next != NO && held == Some(Val::Tok(next)) {
            // Only this release's handoff writes the queued waiter's token.
            return Rel::Handed;
        }
        Rel::NotOurs
    }

    /// What `release()` makes of the script's answer `rel` to a try of `r`: `NotOurs` is
    /// `Lost` on a first try; on a retry (an earlier try may have run), `Earlier` while
    /// the lease of the token released has not ended by this client's clock (the key
    /// cannot have expired: only our own try can have removed the token), else `Unknown`.
    fn read(&self, r: &Releasing, rel: Rel) -> Rel {
        match rel {
            Rel::NotOurs if !r.sent => Rel::Lost,
            Rel::NotOurs if r.left > 0 || self.bugs.retry_ok_when_taken => Rel::Earlier,
            Rel::NotOurs => Rel::Unknown,
            rel => rel,
        }
    }

    /// Drops a turn that owns the queue (`Turn::drop`): the next waiter contends, or the
    /// queue is idle.
    fn drop_turn(&self, s: &mut LockState, c: usize) {
        loop {
            let w = s.queues[c].pop_front();
            if w == NO {
                s.queues[c].busy = false;
                s.queues[c].lease = QLease::None;
                return;
            }
            if let Phase::Queued { tok } = s.tasks[usize::from(w)] {
                s.tasks[usize::from(w)] = Phase::Contend {
                    tok,
                    owns: true,
                    net: None,
                    left: 0,
                };
                return;
            }
        }
    }

    fn lease_of(&self, c: usize, task: usize, left: u8) -> QLease {
        if self.renew[c] {
            QLease::Renewed(task as u8)
        } else {
            QLease::Until(left)
        }
    }

    /// A release try of task `i` ended with `outcome` (what `release()` reports; `None`:
    /// a transport error, given up): the rest of `Releasing::finish`.
    fn finish(
        &self,
        mut s: LockState,
        i: usize,
        mut r: Releasing,
        outcome: Option<Rel>,
        out: &mut Vec<LockState>,
    ) {
        let c = CLIENT_OF[i];
        if r.report {
            r.report = false;
            // Judged where the caller learns it: a success none of whose tries found the
            // token, a `Lost` for a release that happened.
            let flaw = match outcome {
                Some(Rel::Lost) if r.happened => Some(Flaw::FalseLost),
                Some(Rel::Now | Rel::Yielded | Rel::Earlier | Rel::Handed) if !r.happened => {
                    Some(Flaw::SilentOk)
                }
                _ => None,
            };
            if let Some(flaw) = flaw
                && self.checks.reports
            {
                s.bad = Some(flaw.message());
            }
        }
        let next = usize::from(r.next);
        match outcome {
            Some(Rel::Handed) if r.next != NO => {
                if s.tasks[next] == (Phase::Queued { tok: r.next_tok }) {
                    // `Turn::grant`: the waiter holds it, with the turn, without a fence.
                    s.tasks[next] = Phase::Hold(Holding {
                        tok: r.next_tok,
                        fence: NO,
                        incr: NO,
                        left: r.grant,
                        lost: false,
                        owns: true,
                        renew: None,
                        rleft: 0,
                    });
                    s.queues[c].lease = self.lease_of(c, next, r.grant);
                    r.owns = false;
                } else {
                    // The waiter left as the lock reached it: release its token in turn.
                    let then = if r.owns { s.queues[c].pop_front() } else { NO };
                    let then_tok = s.queued_token(then);
                    for turn_over in [false, true] {
                        if turn_over && then == NO {
                            continue;
                        }
                        let mut s = s;
                        s.tasks[i] = Phase::Release(Releasing {
                            tok: r.next_tok,
                            left: r.grant,
                            next: then,
                            next_tok: then_tok,
                            turn_over,
                            grant: self.ttl,
                            net: None,
                            sent: false,
                            second: false,
                            cancelled: r.cancelled,
                            owns: r.owns,
                            own: r.own,
                            report: false,
                            happened: false,
                        });
                        out.push(s);
                    }
                    return;
                }
            }
            _ if r.next != NO => {
                // `Turn::give_back`.
                if let Phase::Queued { .. } = s.tasks[next] {
                    s.queues[c].push_front(r.next);
                }
            }
            _ => {}
        }
        // A release that ended in a transport error leaves the lock to expire (the
        // documented outcome); every other end has released it.
        s.tasks[i] = Phase::Done {
            held: if outcome.is_some() { r.own } else { NO },
        };
        if r.owns {
            self.drop_turn(&mut s, c);
        }
        out.push(s);
    }

    /// A timeout of task `i`'s request: counts a fault; a request not yet run may still
    /// run later. Whether it had run.
    fn time_out(&self, s: &mut LockState, i: usize, net: Net) -> bool {
        s.faults += 1;
        match net {
            Net::Sent(req) => {
                if self.delayed {
                    add_ghost(s, i, req);
                }
                false
            }
            Net::Replied(_) => true,
        }
    }

    /// Runs task `i`'s request in flight, for each answer of `PUBSUB NUMSUB` that matters.
    fn exec_live(&self, s: &LockState, i: usize, req: Req, out: &mut Vec<(LockState, Reply)>) {
        let mut first = None;
        for others in [false, true] {
            let mut n = *s;
            let reply = self.exec(&mut n, i, req, others);
            if first == Some(n) || (others && !matches!(req, Req::Release { .. })) {
                continue;
            }
            first = Some(n);
            out.push((n, reply));
        }
    }

    fn task_steps(&self, s: &LockState, i: usize, out: &mut Vec<(LockStep, LockState)>) {
        let c = CLIENT_OF[i];
        let t = i as u8;
        let can_fail = s.faults < self.max_faults && self.faulty[i];
        let mut runs = Vec::new();
        let mut states = Vec::new();
        match s.tasks[i] {
            Phase::Idle => {
                // `LocalQueues::enter`.
                let mut n = *s;
                let tok = t * 2;
                let contend = |owns| Phase::Contend {
                    tok,
                    owns,
                    net: None,
                    left: 0,
                };
                n.tasks[i] = if !n.queues[c].busy {
                    n.queues[c].busy = true;
                    contend(true)
                } else if self.lease_over(s, c) {
                    contend(false)
                } else {
                    n.queues[c].push_back(t);
                    Phase::Queued { tok }
                };
                out.push((LockStep::Start(t), n));
            }
            Phase::Queued { tok } => {
                if self.lease_over(s, c) {
                    let mut n = *s;
                    n.queues[c].remove(t);
                    let tok = if self.bugs.reuse_queue_token {
                        tok
                    } else {
                        tok + 1
                    };
                    n.tasks[i] = Phase::Contend {
                        tok,
                        owns: false,
                        net: None,
                        left: 0,
                    };
                    out.push((LockStep::Leave(t), n));
                }
                if self.waiters_give_up {
                    let mut n = *s;
                    n.queues[c].remove(t);
                    n.tasks[i] = Phase::Done { held: NO };
                    out.push((LockStep::GiveUp(t), n));
                }
            }
            Phase::Contend {
                tok,
                owns,
                net,
                left,
            } => match net {
                None => {
                    // The back-off after a busy answer is over: try again.
                    let mut n = *s;
                    n.tasks[i] = Phase::Contend {
                        tok,
                        owns,
                        net: None,
                        left: 0,
                    };
                    out.push((LockStep::Send(t, Req::Acquire { tok }), n));
                }
                Some(net) => {
                    match net {
                        Net::Sent(req) => {
                            self.exec_live(s, i, req, &mut runs);
                            for (mut n, reply) in runs.drain(..) {
                                n.tasks[i] = Phase::Contend {
                                    tok,
                                    owns,
                                    net: Some(Net::Replied(reply)),
                                    left,
                                };
                                out.push((exec_step(t, req, reply), n));
                            }
                        }
                        Net::Replied(reply @ Reply::Taken { .. }) => {
                            let mut n = *s;
                            let left = if self.bugs.lease_from_reply {
                                self.ttl
                            } else {
                                left
                            };
                            n.tasks[i] = Phase::Hold(Holding {
                                tok,
                                fence: NO,
                                incr: NO,
                                left,
                                lost: false,
                                owns,
                                renew: None,
                                rleft: 0,
                            });
                            // `Turn::begin`.
                            n.queues[c].lease = self.lease_of(c, i, left);
                            out.push((deliver_step(t, reply, false), n));
                        }
                        Net::Replied(reply @ Reply::Busy { own }) => {
                            for gives_up in [false, true] {
                                let mut n = *s;
                                if own {
                                    n.bad = Some(
                                        "a contender was told busy by its own token: it waits \
                                         for itself until the lease ends (stuck)",
                                    );
                                }
                                if gives_up {
                                    n.tasks[i] = Phase::Done { held: NO };
                                    if owns {
                                        self.drop_turn(&mut n, c);
                                    }
                                } else {
                                    n.tasks[i] = Phase::Contend {
                                        tok,
                                        owns,
                                        net: None,
                                        left: NO,
                                    };
                                }
                                out.push((deliver_step(t, reply, gives_up), n));
                            }
                        }
                        Net::Replied(_) => unreachable!("acquire replies"),
                    }
                    // A try that times out: the caller gets an error and the lock it may
                    // have taken is released in the background (`spawn_cleanup`). Whether
                    // and when the clean-up runs is all that matters (retried or not, it
                    // is the same request): it is a delayed request of its own.
                    if can_fail {
                        let mut n = *s;
                        let ran = self.time_out(&mut n, i, net);
                        n.tasks[i] = Phase::Done { held: NO };
                        add_ghost(
                            &mut n,
                            i,
                            Req::Release {
                                tok,
                                next: NO,
                                turn_over: false,
                            },
                        );
                        if owns {
                            self.drop_turn(&mut n, c);
                        }
                        out.push((timeout_step(t, "the acquire", ran), n));
                    }
                }
            },
            Phase::Hold(h) => {
                self.fence_steps(s, i, h, can_fail, out);
                self.hold_steps(s, i, h, can_fail, out);
            }
            Phase::Release(r) => {
                let Some(net) = r.net else {
                    unreachable!("sent at once")
                };
                match net {
                    Net::Sent(req) => {
                        self.exec_live(s, i, req, &mut runs);
                        for (mut n, reply) in runs.drain(..) {
                            // `exec` may have marked the release as happened.
                            let Phase::Release(r2) = n.tasks[i] else {
                                unreachable!()
                            };
                            n.tasks[i] = Phase::Release(Releasing {
                                net: Some(Net::Replied(reply)),
                                ..r2
                            });
                            out.push((exec_step(t, req, reply), n));
                        }
                    }
                    Net::Replied(reply) => {
                        let Reply::Released { rel } = reply else {
                            unreachable!("release replies")
                        };
                        let read = self.read(&r, rel);
                        let r2 = Releasing { net: None, ..r };
                        self.finish(*s, i, r2, Some(read), &mut states);
                        for n in states.drain(..) {
                            let answer = LockStep::Answer {
                                task: t,
                                rel,
                                read,
                                retry: r.sent,
                            };
                            out.push((answer, n));
                        }
                    }
                }
                if can_fail {
                    // `release_raw`: retried once, then an error.
                    let mut n = *s;
                    let ran = self.time_out(&mut n, i, net);
                    if r.second {
                        let r2 = Releasing { net: None, ..r };
                        self.finish(n, i, r2, None, &mut states);
                    } else {
                        n.tasks[i] = Phase::Release(Releasing {
                            net: None,
                            sent: true,
                            second: true,
                            ..r
                        });
                        states.push(n);
                    }
                    for n in states.drain(..) {
                        out.push((timeout_step(t, "the release", ran), n));
                    }
                }
                if self.cancels && !r.cancelled && s.faults < self.max_faults {
                    out.push((LockStep::Cancel(t), self.cancel(s, i, r, net)));
                }
            }
            Phase::Done { .. } => {}
        }
    }

    /// A holder without a fence asks for one at any moment (its client asking for
    /// fences), its lease over or not (a paused process does not look at its clock
    /// first). The request is a pipeline of two plain commands: `INCR` of the counter,
    /// then `GET` of the key; other clients' commands may run between the two. The `GET`
    /// finding the holder's token makes the `INCR`'s value its fence, else the answer is
    /// `Err(Lost)` (the value is skipped). Each command is one step: a reply on its way
    /// changes nothing until the next command. Either may time out, ran or not; the fence
    /// stays unset (asked for again later, with a new `INCR`).
    fn fence_steps(
        &self,
        s: &LockState,
        i: usize,
        h: Holding,
        can_fail: bool,
        out: &mut Vec<(LockStep, LockState)>,
    ) {
        if h.fence != NO || !self.fences[CLIENT_OF[i]] {
            return;
        }
        let t = i as u8;
        if h.incr == NO {
            let mut n = *s;
            let reply = self.exec(&mut n, i, Req::Incr, false);
            let Reply::Fenced { fence, .. } = reply else {
                unreachable!("INCR replies")
            };
            n.tasks[i] = Phase::Hold(Holding {
                incr: fence.unwrap_or(NO),
                ..h
            });
            out.push((LockStep::Fence { task: t, reply }, n));
            if can_fail {
                // Not run (it may not run later either: a lone INCR changes nothing
                // but the counter), or run with its reply lost.
                for ran in [false, true] {
                    let mut n = *s;
                    if ran {
                        self.exec(&mut n, i, Req::Incr, false);
                    }
                    n.faults += 1;
                    out.push((timeout_step(t, "a fence request", ran), n));
                }
            }
            return;
        }
        let req = Req::Fence { tok: h.tok };
        let mut n = *s;
        let reply = self.exec(&mut n, i, req, false);
        let Reply::Fenced { fence, .. } = reply else {
            unreachable!("fence replies")
        };
        n.tasks[i] = Phase::Hold(Holding {
            fence: fence.unwrap_or(NO),
            incr: NO,
            ..h
        });
        out.push((LockStep::Fence { task: t, reply }, n));
        if can_fail {
            // The GET's reply lost (a GET changes nothing): no fence this time.
            let mut n = *s;
            n.tasks[i] = Phase::Hold(Holding { incr: NO, ..h });
            n.faults += 1;
            out.push((timeout_step(t, "a fence request", true), n));
        }
    }

    /// A holder's watchdog renews; it releases (no renewal in flight).
    fn hold_steps(
        &self,
        s: &LockState,
        i: usize,
        h: Holding,
        can_fail: bool,
        out: &mut Vec<(LockStep, LockState)>,
    ) {
        let c = CLIENT_OF[i];
        let t = i as u8;
        match h.renew {
            None => {
                if self.renew[c] && !h.lost && h.left != NEVER {
                    let mut n = *s;
                    n.tasks[i] = Phase::Hold(Holding {
                        renew: Some(Net::Sent(Req::Extend { tok: h.tok })),
                        rleft: self.ttl,
                        ..h
                    });
                    out.push((LockStep::Renew(t), n));
                }
                // `release()`: the first waiter still waiting is taken out of the queue
                // (`Turn::next`) for the script to hand the lock to.
                let next = if h.owns { s.queues[c].waiters[0] } else { NO };
                let next_tok = s.queued_token(next);
                for turn_over in [false, true] {
                    if turn_over && next == NO {
                        continue;
                    }
                    let mut n = *s;
                    if h.owns {
                        n.queues[c].pop_front();
                    }
                    if n.queues[c].lease == QLease::Renewed(t) {
                        // Released: the watchdog forgets it; lost or not, it stays so.
                        n.queues[c].lease = QLease::Until(if h.lost { 0 } else { NEVER });
                    }
                    n.tasks[i] = Phase::Release(Releasing {
                        tok: h.tok,
                        left: h.left,
                        next,
                        next_tok,
                        turn_over,
                        grant: self.ttl,
                        net: None,
                        sent: false,
                        second: false,
                        cancelled: false,
                        owns: h.owns,
                        own: h.tok,
                        report: true,
                        happened: false,
                    });
                    out.push((LockStep::Release(t, turn_over), n));
                }
            }
            Some(net) => {
                match net {
                    Net::Sent(req) => {
                        let mut n = *s;
                        let reply = self.exec(&mut n, i, req, false);
                        n.tasks[i] = Phase::Hold(Holding {
                            renew: Some(Net::Replied(reply)),
                            ..h
                        });
                        out.push((exec_step(t, req, reply), n));
                    }
                    Net::Replied(reply) => {
                        let mut n = *s;
                        let h2 = match reply {
                            Reply::Extended(true) if !h.lost => Holding {
                                left: h.rleft,
                                renew: None,
                                ..h
                            },
                            Reply::Extended(true) => Holding { renew: None, ..h },
                            _ if self.bugs.renewal_stops_silently => Holding {
                                left: NEVER,
                                renew: None,
                                ..h
                            },
                            _ => Holding {
                                lost: true,
                                renew: None,
                                ..h
                            },
                        };
                        n.tasks[i] = Phase::Hold(h2);
                        out.push((deliver_step(t, reply, false), n));
                    }
                }
                if can_fail {
                    // The watchdog retries later (the lease ends on its own); the
                    // faulty one stops watching the lease.
                    let mut n = *s;
                    let ran = self.time_out(&mut n, i, net);
                    let left = if self.bugs.renewal_stops_silently {
                        NEVER
                    } else {
                        h.left
                    };
                    n.tasks[i] = Phase::Hold(Holding {
                        left,
                        renew: None,
                        ..h
                    });
                    out.push((timeout_step(t, "the renewal", ran), n));
                }
            }
        }
    }
}

/// Every fence held in `s` (the counter first, then the holders'), for `f` to read or
/// rewrite (a fence reply is delivered as it is made: none is on its way).
fn each_fence(s: &mut LockState, mut f: impl FnMut(&mut u8)) {
    f(&mut s.counter);
    for p in s.tasks.iter_mut() {
        if let Phase::Hold(h) = p {
            if h.fence != NO {
                f(&mut h.fence);
            }
            if h.incr != NO {
                f(&mut h.incr);
            }
        }
    }
}

/// Renumbers the fences in `s` 1, 2, 3... in their order: the protocol only compares
/// fences (equal, larger) and takes the next one, so states that differ only in the
/// numbers are one.
fn compress_fences(s: &mut LockState) {
    // The counter matters only as above every fence present (the next fence is larger
    // than all of them): it is taken down to the largest.
    s.counter = 0;
    let mut top = 0;
    each_fence(s, |f| top = top.max(*f));
    s.counter = top;
    // Fences stay far below 64: one per fence request, at most one a holder.
    let mut seen = 0u64;
    each_fence(s, |f| seen |= 1 << *f);
    let seen = seen & !1;
    if seen & (seen + 2) == 0 {
        return; // already 1, 2, ..., n
    }
    let mut rank = [0u8; 64];
    let mut next = 0;
    for (value, rank) in rank.iter_mut().enumerate() {
        if seen & (1 << value) != 0 {
            next += 1;
            *rank = next;
        }
    }
    each_fence(s, |f| *f = rank[usize::from(*f)]);
}

impl LockModel {
    /// The caller's `release()` future is dropped while a try is in flight: the try may
    /// still run (it is on its way), its answer is lost.
    fn cancel(&self, s: &LockState, i: usize, r: Releasing, net: Net) -> LockState {
        let mut n = *s;
        n.faults += 1;
        if let Net::Sent(req) = net {
            add_ghost(&mut n, i, req);
        }
        if !self.bugs.release_abandoned_on_cancel {
            // As fixed (`Releasing::drop`): it goes on in a task of its own, its first
            // try a retry, its outcome heard by no one.
            n.tasks[i] = Phase::Release(Releasing {
                net: None,
                sent: true,
                second: false,
                cancelled: true,
                report: false,
                ..r
            });
            return n;
        }
        // Before the fix: the turn and the waiter taken out of the queue are dropped;
        // the waiter wakes without a grant and contends without the turn.
        let c = CLIENT_OF[i];
        if r.next != NO
            && let Phase::Queued { tok } = n.tasks[usize::from(r.next)]
        {
            n.tasks[usize::from(r.next)] = Phase::Contend {
                tok,
                owns: false,
                net: None,
                left: 0,
            };
        }
        n.tasks[i] = Phase::Done { held: r.own };
        if r.owns {
            self.drop_turn(&mut n, c);
        }
        n
    }
}

fn add_ghost(s: &mut LockState, i: usize, req: Req) {
    if let Some(slot) = s.ghosts.iter_mut().find(|g| g.is_none()) {
        *slot = Some((i as u8, req));
    }
}

fn exec_step(task: u8, req: Req, reply: Reply) -> LockStep {
    LockStep::Exec {
        task,
        req,
        reply,
        ghost: false,
    }
}

fn deliver_step(task: u8, reply: Reply, gives_up: bool) -> LockStep {
    LockStep::Deliver {
        task,
        reply,
        gives_up,
    }
}

fn timeout_step(task: u8, what: &'static str, ran: bool) -> LockStep {
    LockStep::Timeout { task, what, ran }
}

impl Model for LockModel {
    type State = LockState;
    type Step = LockStep;

    fn init(&self) -> LockState {
        LockState {
            faults: 0,
            counter: 0,
            key: None,
            tasks: self.tasks.map(|on| {
                if on {
                    Phase::Idle
                } else {
                    Phase::Done { held: NO }
                }
            }),
            queues: [Queue {
                busy: false,
                waiters: [NO; 2],
                lease: QLease::None,
            }; 2],
            ghosts: [None; 2],
            bad: None,
        }
    }

    fn next(&self, s: &LockState, out: &mut Vec<(LockStep, LockState)>) {
        if s.bad.is_some() {
            return;
        }
        let from = out.len();
        // The clock: every deadline comes one tick nearer.
        let mut n = *s;
        if let Some(k) = n.key.as_mut() {
            k.left -= 1;
            if k.left == 0 {
                n.key = None;
            }
        }
        for p in n.tasks.iter_mut() {
            match p {
                Phase::Contend { left, .. } => tick(left),
                Phase::Hold(h) => {
                    tick(&mut h.left);
                    tick(&mut h.rleft);
                }
                Phase::Release(r) => {
                    tick(&mut r.grant);
                    tick(&mut r.left);
                }
                _ => {}
            }
        }
        for q in n.queues.iter_mut() {
            if let QLease::Until(left) = &mut q.lease {
                tick(left);
            }
        }
        out.push((LockStep::Tick, n));
        // Requests that timed out on their client, and clean-ups, run when they run.
        for g in 0..2 {
            let Some((task, req)) = s.ghosts[g] else {
                continue;
            };
            let mut runs = Vec::new();
            let mut without = *s;
            without.ghosts[g] = None;
            self.exec_live(&without, usize::from(task), req, &mut runs);
            for (n, reply) in runs {
                out.push((
                    LockStep::Exec {
                        task,
                        req,
                        reply,
                        ghost: true,
                    },
                    n,
                ));
            }
        }
        for i in 0..TASKS {
            self.task_steps(s, i, out);
        }
        for (_, n) in &mut out[from..] {
            self.settle(n);
        }
    }

    fn check(&self, s: &LockState) -> Option<String> {
        if let Some(bad) = s.bad {
            return Some(bad.into());
        }
        let holds = |i: usize| match s.tasks[i] {
            Phase::Hold(h) => Some(h),
            _ => None,
        };
        let believers: Vec<usize> = (0..TASKS)
            .filter(|&i| holds(i).is_some_and(|h| !h.lost))
            .collect();
        if believers.len() > 1 {
            return Some(format!(
                "{} and {} both believe they hold the lock with an unexpired lease",
                TASK_NAMES[believers[0]], TASK_NAMES[believers[1]]
            ));
        }
        // Fences grow: a holder that obtains a fence after another holder obtained one
        // gets a larger one. The holder whose token is in the key, if it has a fence, has
        // one larger than every other holder's (a holder paused past its lease has a
        // smaller one, or is told `Lost` when it asks); no fence is above the counter.
        let fenced =
            || (0..TASKS).filter_map(|i| holds(i).filter(|h| h.fence != NO).map(|h| (i, h)));
        if let Some((i, h)) = fenced().find(|(_, h)| h.fence > s.counter) {
            return Some(format!(
                "{} holds with fence {}, above the counter {}",
                TASK_NAMES[i], h.fence, s.counter
            ));
        }
        for (i, h) in fenced() {
            if s.key.is_none_or(|k| k.val != Val::Tok(h.tok)) {
                continue;
            }
            if let Some((j, g)) = fenced().find(|&(j, g)| j != i && g.fence >= h.fence) {
                return Some(format!(
                    "{} holds with fence {}, not below the fence {} of {}, whose token is in \
                     the key (fences out of order)",
                    TASK_NAMES[j], g.fence, h.fence, TASK_NAMES[i]
                ));
            }
        }
        for (i, p) in s.tasks.iter().enumerate() {
            if let Phase::Done { held } = *p
                && self.checks.orphans
                && held != NO
                && s.key.is_some_and(|k| k.val == Val::Tok(held))
            {
                return Some(format!(
                    "{} has finished, but the key still holds the token it held: a release \
                     that never happened (the lock is stuck until its lease ends)",
                    TASK_NAMES[i]
                ));
            }
        }
        None
    }

    fn goal(&self, step: &LockStep) -> bool {
        self.goal.is_some_and(|goal| goal(step))
    }

    fn for_trace(&self) -> Self {
        LockModel {
            compress: false,
            ..*self
        }
    }

    fn show(&self, s: &LockState) -> String {
        let key = match s.key {
            None => "none".to_string(),
            Some(k) => match k.val {
                Val::Tok(t) => format!("{} ({})", tok_name(t), ticks(k.left)),
                Val::Yield(c) => {
                    format!("yield:{} ({})", CLIENT_NAMES[usize::from(c)], ticks(k.left))
                }
            },
        };
        let mut line = format!("key={key} fence={} |", s.counter);
        for (i, p) in s.tasks.iter().enumerate() {
            if !self.tasks[i] {
                continue;
            }
            let what = match p {
                Phase::Idle => "idle".to_string(),
                Phase::Queued { tok } => format!("queued with {}", tok_name(*tok)),
                Phase::Contend { tok, owns, net, .. } => format!(
                    "contends with {}{}{}",
                    tok_name(*tok),
                    if *owns { "" } else { " (without the turn)" },
                    show_net(net)
                ),
                Phase::Hold(h) => format!(
                    "HOLDS {} {} ({}){}{}",
                    tok_name(h.tok),
                    if h.fence == NO {
                        "without a fence".to_string()
                    } else {
                        format!("fence {}", h.fence)
                    },
                    ticks(h.left),
                    if h.lost { ", known lost" } else { "" },
                    show_net(&h.renew)
                ),
                Phase::Release(r) => format!(
                    "releases {} ({}){}{}",
                    tok_name(r.tok),
                    ticks(r.left),
                    if r.sent { " (retrying)" } else { "" },
                    show_net(&r.net)
                ),
                Phase::Done { .. } => "done".to_string(),
            };
            line.push_str(&format!(" {}: {what};", TASK_NAMES[i]));
        }
        for (task, req) in s.ghosts.iter().flatten() {
            line.push_str(&format!(
                " delayed: {req} of {};",
                TASK_NAMES[usize::from(*task)]
            ));
        }
        line
    }
}
