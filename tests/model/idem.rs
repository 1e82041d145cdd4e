//! The idempotency protocol: `idem_claim.lua`, `idem_renew.lua`, the store (`APPEND`, `idem_settle.lua`),
//! `idem_release.lua` on the server; `idempotency::begin`, `Claim::keep` (the heartbeat),
//! `Claim::complete` and `Claim::release` on the clients.
//!
//! Three callers of one idempotency key, one call each: `C1` and `C2` with payload `X`,
//! `C3` with payload `Y` (another fingerprint). Time is relative, as in the lock model.

use std::fmt;

use super::explore::Model;

/// A count of ticks that does not run: a lease no longer watched, or no claim in flight.
const NEVER: u8 = u8::MAX;
/// The owner of a record given up after a takeover.
const NOBODY: u8 = u8::MAX;

pub(crate) const CALLERS: usize = 3;
const FP_OF: [u8; CALLERS] = [0, 0, 1];
const CALLER_NAMES: [&str; CALLERS] = ["C1(X)", "C2(X)", "C3(Y)"];
const FP_NAMES: [&str; 2] = ["X", "Y"];
const GHOSTS: usize = 3;

/// Planted faults, each off in the protocol as fixed.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IdemBugs {
    /// Fault 3 before its fix (`idem_claim.lua`): an in-progress record whose lease ended
    /// is taken over whatever the claimer's payload fingerprint.
    pub(crate) takeover_without_fingerprint: bool,
    /// Fault 4 before its fix (`Claim::keep`): a renewal that finds the claim gone stops
    /// the heartbeat, and failing renewals are retried for ever, without reporting the
    /// claim lost: the claimer goes on as if it held the claim.
    pub(crate) renewal_stops_silently: bool,
    /// `Claim::complete` before its fix: tries twice, then gives up with only a log line; the
    /// claim is left to end with its lease, and a repeat then runs the body again.
    pub(crate) complete_gives_up: bool,
    /// `idem_release.lua` before its fix: a claim that took over an expired one deletes the record
    /// when given up (its body failed, or its claim's reply was lost), forgetting that
    /// the first claimer's body may have run with this fingerprint: a call with another
    /// payload then claims the key and runs. As fixed in the model, such a release
    /// leaves the record in progress with its fingerprint and an ended lease.
    pub(crate) release_forgets_takeover: bool,
    /// `Claim::complete` before its fix: a complete that finds the claim lost (taken over while
    /// the body ran) is only logged; the caller gets the body's `Ok`.
    pub(crate) complete_lost_only_logged: bool,
    /// `Claim::keep` before its fix: the heartbeat counts the lease from when `keep` starts (after
    /// the claim's reply), not from when the claim was sent.
    pub(crate) lease_from_keep_start: bool,
}

/// The bounds and settings of one exploration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdemModel {
    pub(crate) bugs: IdemBugs,
    /// The claim's lease, in clock ticks.
    pub(crate) lease: u8,
    /// Requests that time out (request or reply lost or late), in the whole run.
    pub(crate) max_faults: u8,
    /// A request that timed out before Redis ran it may still run later.
    pub(crate) delayed: bool,
    /// Which of `C1`, `C2`, `C3` take part.
    pub(crate) callers: [bool; CALLERS],
    /// A transition to look for instead (to show a path is taken at all).
    pub(crate) goal: Option<fn(&IdemStep) -> bool>,
}

impl IdemModel {
    /// The protocol as fixed, with the bounds of the exhaustive test.
    pub(crate) fn fixed() -> Self {
        IdemModel {
            bugs: IdemBugs::default(),
            lease: 2,
            max_faults: 2,
            delayed: true,
            callers: [true; CALLERS],
            goal: None,
        }
    }

    /// The fixed protocol with `bugs` planted.
    pub(crate) fn with(bugs: IdemBugs) -> Self {
        IdemModel {
            bugs,
            ..IdemModel::fixed()
        }
    }
}

/// The record (retention and the in-progress key's lifetime are longer than anything
/// modelled: abstracted away).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Rec {
    None,
    /// `left`: ticks left on the lease (0: ended). `took_over` (what the fix adds to the
    /// record): this claim took over an expired one, whose body may have run.
    InProgress {
        owner: u8,
        fp: u8,
        left: u8,
        took_over: bool,
    },
    /// `by`: whose complete wrote it (the raw record differs between callers).
    Completed {
        fp: u8,
        by: u8,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Req {
    Claim,
    Renew,
    Complete,
    Release,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Reply {
    New,
    TookOver,
    Replay,
    InProgress,
    Mismatch,
    Renewed(bool),
    /// The store: 1 stored (first), 2 stored by an earlier try, 0 another result first.
    Stored(u8),
    Released(bool),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Net {
    Sent(Req),
    Replied(Reply),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Phase {
    Idle,
    /// `begin`: a claim in flight (`left`: the lease it gives, from its send), or
    /// `net: None` (and `left: NEVER`) waiting after `InProgress`.
    Claim {
        net: Option<Net>,
        left: u8,
    },
    /// The body runs under the claim, the heartbeat renewing it.
    Run {
        /// Ticks left on the lease by this caller's clock (`NEVER`: not watched).
        left: u8,
        /// Reported lost by the heartbeat (a renewal found the claim gone, or failed after
        /// the lease ended): the body is cancelled, the call returns `Lost`.
        lost: bool,
        /// The body has run (its effects are done).
        ran: bool,
        /// A renewal in flight, and the lease it gives when it succeeds.
        renew: Option<Net>,
        rleft: u8,
    },
    /// Storing the result (sent at once, retried at once).
    Complete {
        net: Option<Net>,
        retried: bool,
    },
    /// Finished; `ran`: its body ran; `lost`: it was told its claim was lost.
    Done {
        ran: bool,
        lost: bool,
    },
}

/// One state of the whole system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct IdemState {
    faults: u8,
    rec: Rec,
    callers: [Phase; CALLERS],
    /// Requests that timed out on their caller but may still run, and releases (their
    /// outcome matters to no one: whether and when they run is all), sorted.
    ghosts: [Option<(u8, Req)>; GHOSTS],
    /// Ghost: the fingerprints the body has run with (a bit each).
    fps_run: u8,
}

/// One transition.
#[derive(Debug, Clone, Copy)]
pub(crate) enum IdemStep {
    Tick,
    Send(u8, Req),
    Body(u8),
    Finish(u8, bool),
    Exec {
        caller: u8,
        req: Req,
        reply: Reply,
        ghost: bool,
    },
    Deliver {
        caller: u8,
        reply: Reply,
        gives_up: bool,
    },
    Timeout {
        caller: u8,
        renewal: bool,
        ran: bool,
    },
}

impl fmt::Display for IdemStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |c: &u8| CALLER_NAMES[usize::from(*c)];
        match self {
            IdemStep::Tick => write!(f, "the clock ticks"),
            IdemStep::Send(c, req) => write!(f, "{}: sends {req:?}", name(c)),
            IdemStep::Body(c) => write!(f, "{}: the body runs (its effects happen)", name(c)),
            IdemStep::Finish(c, ok) => write!(
                f,
                "{}: the body returns {}",
                name(c),
                if *ok {
                    "Ok: complete"
                } else {
                    "Err: release (in the background)"
                }
            ),
            IdemStep::Exec {
                caller,
                req,
                reply,
                ghost,
            } => write!(
                f,
                "redis runs {}{req:?} of {} -> {reply:?}",
                if *ghost { "the DELAYED " } else { "" },
                name(caller)
            ),
            IdemStep::Deliver {
                caller,
                reply,
                gives_up,
            } => write!(
                f,
                "{}: gets {reply:?}{}",
                name(caller),
                if *gives_up { ", gives up" } else { "" }
            ),
            IdemStep::Timeout {
                caller,
                renewal,
                ran,
            } => write!(
                f,
                "{}: {} times out ({})",
                name(caller),
                if *renewal {
                    "the renewal"
                } else {
                    "the request"
                },
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
        Some(Net::Sent(req)) => format!(" [{req:?} sent]"),
        Some(Net::Replied(r)) => format!(" [reply {r:?} in flight]"),
    }
}

fn ticks(left: u8) -> String {
    if left == NEVER {
        "forever".into()
    } else {
        format!("{left} left")
    }
}

/// One tick less (sentinels do not run).
fn tick(left: &mut u8) {
    if *left != NEVER {
        *left = left.saturating_sub(1);
    }
}

fn add_ghost(s: &mut IdemState, c: usize, req: Req) {
    if let Some(slot) = s.ghosts.iter_mut().find(|g| g.is_none()) {
        *slot = Some((c as u8, req));
    }
}

impl IdemModel {
    /// Runs one script on the server for caller `c` (its owner token is its own).
    fn exec(&self, s: &mut IdemState, c: usize, req: Req) -> Reply {
        let me = c as u8;
        let fp = FP_OF[c];
        let claim = |took_over| Rec::InProgress {
            owner: me,
            fp,
            left: self.lease,
            took_over,
        };
        match req {
            Req::Claim => match s.rec {
                Rec::None => {
                    s.rec = claim(false);
                    Reply::New
                }
                Rec::Completed { fp: f, .. } => {
                    if f == fp {
                        Reply::Replay
                    } else {
                        Reply::Mismatch
                    }
                }
                Rec::InProgress {
                    owner,
                    fp: f,
                    left,
                    took_over,
                } => {
                    if owner == me {
                        // A retry of this same claim whose first reply was lost.
                        s.rec = claim(took_over);
                        Reply::New
                    } else if left > 0 {
                        if f == fp {
                            Reply::InProgress
                        } else {
                            Reply::Mismatch
                        }
                    } else if f != fp && !self.bugs.takeover_without_fingerprint {
                        Reply::Mismatch
                    } else {
                        s.rec = claim(true);
                        Reply::TookOver
                    }
                }
            },
            Req::Renew => match s.rec {
                Rec::InProgress {
                    owner,
                    fp,
                    took_over,
                    ..
                } if owner == me => {
                    s.rec = Rec::InProgress {
                        owner,
                        fp,
                        left: self.lease,
                        took_over,
                    };
                    Reply::Renewed(true)
                }
                _ => Reply::Renewed(false),
            },
            // `APPEND`: the first completed record stays the result, whoever holds the
            // claim of this payload; `idem_settle.lua` (or the exact record found in
            // front) says whose it is, and takes a result back out of another payload's
            // claim.
            Req::Complete => match s.rec {
                Rec::None => {
                    s.rec = Rec::Completed { fp, by: me };
                    Reply::Stored(1)
                }
                Rec::InProgress { fp: f, .. } if f == fp => {
                    s.rec = Rec::Completed { fp, by: me };
                    Reply::Stored(1)
                }
                Rec::InProgress { .. } => Reply::Stored(0),
                Rec::Completed { by, .. } if by == me => Reply::Stored(2),
                Rec::Completed { .. } => Reply::Stored(0),
            },
            Req::Release => match s.rec {
                Rec::InProgress {
                    owner,
                    fp,
                    took_over,
                    ..
                } if owner == me => {
                    s.rec = if took_over && !self.bugs.release_forgets_takeover {
                        Rec::InProgress {
                            owner: NOBODY,
                            fp,
                            left: 0,
                            took_over,
                        }
                    } else {
                        Rec::None
                    };
                    Reply::Released(true)
                }
                _ => Reply::Released(false),
            },
        }
    }

    /// What follows every transition: a complete is sent as soon as its phase begins;
    /// equivalent states are made equal.
    fn settle(&self, s: &mut IdemState) {
        for p in s.callers.iter_mut() {
            match p {
                Phase::Run { renew, rleft, .. } if renew.is_none() => *rleft = 0,
                Phase::Complete { net, .. } if net.is_none() => {
                    *net = Some(Net::Sent(Req::Complete));
                }
                _ => {}
            }
        }
        s.ghosts.sort_by_key(|g| (g.is_none(), *g));
    }

    fn time_out(&self, s: &mut IdemState, c: usize, net: Net) -> bool {
        s.faults += 1;
        match net {
            Net::Sent(req) => {
                if self.delayed {
                    add_ghost(s, c, req);
                }
                false
            }
            Net::Replied(_) => true,
        }
    }

    fn caller_steps(&self, s: &IdemState, c: usize, out: &mut Vec<(IdemStep, IdemState)>) {
        let me = c as u8;
        let can_fail = s.faults < self.max_faults;
        let with = |p: Phase| {
            let mut n = *s;
            n.callers[c] = p;
            n
        };
        let done = |ran, lost| Phase::Done { ran, lost };
        match s.callers[c] {
            Phase::Idle => out.push((
                IdemStep::Send(me, Req::Claim),
                with(Phase::Claim {
                    net: Some(Net::Sent(Req::Claim)),
                    left: self.lease,
                }),
            )),
            Phase::Claim { net: None, .. } => out.push((
                IdemStep::Send(me, Req::Claim),
                with(Phase::Claim {
                    net: Some(Net::Sent(Req::Claim)),
                    left: self.lease,
                }),
            )),
            Phase::Claim {
                net: Some(net),
                left,
            } => {
                match net {
                    Net::Sent(req) => {
                        let mut n = *s;
                        let reply = self.exec(&mut n, c, req);
                        n.callers[c] = Phase::Claim {
                            net: Some(Net::Replied(reply)),
                            left,
                        };
                        out.push((exec_step(me, req, reply), n));
                    }
                    Net::Replied(reply) => {
                        let run = Phase::Run {
                            left: if self.bugs.lease_from_keep_start {
                                self.lease
                            } else {
                                left
                            },
                            lost: false,
                            ran: false,
                            renew: None,
                            rleft: 0,
                        };
                        let wait = Phase::Claim {
                            net: None,
                            left: NEVER,
                        };
                        let next: &[(bool, Phase)] = match reply {
                            Reply::New | Reply::TookOver => &[(false, run)],
                            Reply::Replay | Reply::Mismatch => &[(false, done(false, false))],
                            Reply::InProgress => &[(false, wait), (true, done(false, false))],
                            _ => unreachable!("claim replies"),
                        };
                        for &(gives_up, p) in next {
                            out.push((deliver_step(me, reply, gives_up), with(p)));
                        }
                    }
                }
                if can_fail {
                    // The claim may have landed: give it back (`spawn_release`).
                    let mut n = with(done(false, false));
                    let ran = self.time_out(&mut n, c, net);
                    add_ghost(&mut n, c, Req::Release);
                    out.push((timeout_step(me, false, ran), n));
                }
            }
            Phase::Run {
                left,
                lost,
                ran,
                renew,
                rleft,
            } => {
                let run = |left, lost, ran, renew, rleft| Phase::Run {
                    left,
                    lost,
                    ran,
                    renew,
                    rleft,
                };
                match renew {
                    None if lost => {
                        // The heartbeat ended: `keep` returns `Lost`, nothing is stored.
                        out.push((IdemStep::Finish(me, false), with(done(ran, true))));
                    }
                    None => {
                        // The heartbeat, every lease / 3 (at any moment here).
                        if left != NEVER {
                            out.push((
                                IdemStep::Send(me, Req::Renew),
                                with(run(
                                    left,
                                    lost,
                                    ran,
                                    Some(Net::Sent(Req::Renew)),
                                    self.lease,
                                )),
                            ));
                        }
                        if ran {
                            out.push((
                                IdemStep::Finish(me, true),
                                with(Phase::Complete {
                                    net: None,
                                    retried: false,
                                }),
                            ));
                        } else {
                            let mut n = with(done(false, false));
                            add_ghost(&mut n, c, Req::Release);
                            out.push((IdemStep::Finish(me, false), n));
                        }
                    }
                    Some(Net::Sent(req)) => {
                        let mut n = *s;
                        let reply = self.exec(&mut n, c, req);
                        n.callers[c] = run(left, lost, ran, Some(Net::Replied(reply)), rleft);
                        out.push((exec_step(me, req, reply), n));
                    }
                    Some(Net::Replied(reply @ Reply::Renewed(ok))) => {
                        let (left, lost) = match ok {
                            true if !lost => (rleft, false),
                            true => (left, lost),
                            false if self.bugs.renewal_stops_silently => (NEVER, lost),
                            false => (left, true),
                        };
                        out.push((
                            deliver_step(me, reply, false),
                            with(run(left, lost, ran, None, 0)),
                        ));
                    }
                    Some(Net::Replied(_)) => unreachable!("renew replies"),
                }
                if let Some(net) = renew
                    && can_fail
                {
                    // Retried later; after a whole lease without a renewal, the claim is
                    // reported lost. The faulty heartbeat stops watching the lease.
                    let (left, lost) = if self.bugs.renewal_stops_silently {
                        (NEVER, lost)
                    } else {
                        (left, lost || left == 0)
                    };
                    let mut n = with(run(left, lost, ran, None, 0));
                    let ran_ = self.time_out(&mut n, c, net);
                    out.push((timeout_step(me, true, ran_), n));
                }
                if !ran {
                    let mut n = with(run(left, lost, true, renew, rleft));
                    n.fps_run |= 1 << FP_OF[c];
                    out.push((IdemStep::Body(me), n));
                }
            }
            Phase::Complete { net, retried } => {
                let Some(net) = net else {
                    unreachable!("sent at once")
                };
                match net {
                    Net::Sent(req) => {
                        let mut n = *s;
                        let reply = self.exec(&mut n, c, req);
                        n.callers[c] = Phase::Complete {
                            net: Some(Net::Replied(reply)),
                            retried,
                        };
                        out.push((exec_step(me, req, reply), n));
                    }
                    Net::Replied(reply @ Reply::Stored(code)) => {
                        let told = code == 0 && !self.bugs.complete_lost_only_logged;
                        out.push((deliver_step(me, reply, false), with(done(true, told))));
                    }
                    Net::Replied(_) => unreachable!("complete replies"),
                }
                if can_fail {
                    let p = if retried && self.bugs.complete_gives_up {
                        done(true, false)
                    } else {
                        Phase::Complete {
                            net: None,
                            retried: true,
                        }
                    };
                    let mut n = with(p);
                    let ran = self.time_out(&mut n, c, net);
                    out.push((timeout_step(me, false, ran), n));
                }
            }
            Phase::Done { .. } => {}
        }
    }
}

fn exec_step(caller: u8, req: Req, reply: Reply) -> IdemStep {
    IdemStep::Exec {
        caller,
        req,
        reply,
        ghost: false,
    }
}

fn deliver_step(caller: u8, reply: Reply, gives_up: bool) -> IdemStep {
    IdemStep::Deliver {
        caller,
        reply,
        gives_up,
    }
}

fn timeout_step(caller: u8, renewal: bool, ran: bool) -> IdemStep {
    IdemStep::Timeout {
        caller,
        renewal,
        ran,
    }
}

/// Whether caller `p` runs its body believing it holds the claim: not reported lost, and
/// its lease by its own clock not over.
fn believes(p: &Phase) -> bool {
    matches!(*p, Phase::Run { left, lost, .. } if !lost && left > 0)
}

/// Whether caller `p` finished, its body having run, without being told its claim was
/// lost.
fn ran_unreported(p: &Phase) -> bool {
    matches!(
        *p,
        Phase::Done {
            ran: true,
            lost: false
        }
    )
}

impl Model for IdemModel {
    type State = IdemState;
    type Step = IdemStep;

    fn init(&self) -> IdemState {
        IdemState {
            faults: 0,
            rec: Rec::None,
            callers: self.callers.map(|on| {
                if on {
                    Phase::Idle
                } else {
                    Phase::Done {
                        ran: false,
                        lost: false,
                    }
                }
            }),
            ghosts: [None; GHOSTS],
            fps_run: 0,
        }
    }

    fn next(&self, s: &IdemState, out: &mut Vec<(IdemStep, IdemState)>) {
        let from = out.len();
        // The clock: every deadline comes one tick nearer.
        let mut n = *s;
        if let Rec::InProgress { left, .. } = &mut n.rec {
            *left = left.saturating_sub(1);
        }
        for p in n.callers.iter_mut() {
            match p {
                Phase::Claim { left, .. } => tick(left),
                Phase::Run { left, rleft, .. } => {
                    tick(left);
                    tick(rleft);
                }
                _ => {}
            }
        }
        out.push((IdemStep::Tick, n));
        for g in 0..GHOSTS {
            let Some((caller, req)) = s.ghosts[g] else {
                continue;
            };
            let mut n = *s;
            n.ghosts[g] = None;
            let reply = self.exec(&mut n, usize::from(caller), req);
            out.push((
                IdemStep::Exec {
                    caller,
                    req,
                    reply,
                    ghost: true,
                },
                n,
            ));
        }
        for c in 0..CALLERS {
            self.caller_steps(s, c, out);
        }
        for (_, n) in &mut out[from..] {
            self.settle(n);
        }
    }

    fn check(&self, s: &IdemState) -> Option<String> {
        if s.fps_run.count_ones() > 1 {
            return Some(
                "the body ran with two payload fingerprints for one key (X and Y)".to_string(),
            );
        }
        let names = |f: fn(&Phase) -> bool| {
            (0..CALLERS)
                .filter(|&c| f(&s.callers[c]))
                .map(|c| CALLER_NAMES[c])
                .collect::<Vec<_>>()
                .join(" and ")
        };
        if s.callers.iter().filter(|p| believes(p)).count() > 1 {
            return Some(format!(
                "{} both run the body believing they hold the claim with an unexpired lease",
                names(believes)
            ));
        }
        if s.callers.iter().filter(|p| ran_unreported(p)).count() > 1 {
            return Some(format!(
                "the body ran twice ({}) and neither call was told its claim was lost",
                names(ran_unreported)
            ));
        }
        None
    }

    fn goal(&self, step: &IdemStep) -> bool {
        self.goal.is_some_and(|goal| goal(step))
    }

    fn for_trace(&self) -> Self {
        *self
    }

    fn show(&self, s: &IdemState) -> String {
        let rec = match s.rec {
            Rec::None => "none".to_string(),
            Rec::InProgress {
                owner,
                fp,
                left,
                took_over,
            } => format!(
                "in_progress({}, fp {}, lease {}{})",
                CALLER_NAMES.get(usize::from(owner)).unwrap_or(&"nobody"),
                FP_NAMES[usize::from(fp)],
                if left == 0 {
                    "ended".to_string()
                } else {
                    ticks(left)
                },
                if took_over { ", taken over" } else { "" }
            ),
            Rec::Completed { fp, by } => format!(
                "completed(fp {}, by {})",
                FP_NAMES[usize::from(fp)],
                CALLER_NAMES[usize::from(by)]
            ),
        };
        let mut line = format!("record={rec} |");
        for (c, p) in s.callers.iter().enumerate() {
            if !self.callers[c] {
                continue;
            }
            let what = match p {
                Phase::Idle => "idle".to_string(),
                Phase::Claim { net, .. } => format!("claims{}", show_net(net)),
                Phase::Run {
                    left,
                    lost,
                    ran,
                    renew,
                    ..
                } => format!(
                    "RUNS (lease {}{}{}){}",
                    ticks(*left),
                    if *lost { ", reported lost" } else { "" },
                    if *ran { ", body ran" } else { "" },
                    show_net(renew)
                ),
                Phase::Complete { net, .. } => format!("completes{}", show_net(net)),
                Phase::Done { ran, lost } => format!(
                    "done{}{}",
                    if *ran { ", body ran" } else { "" },
                    if *lost { ", told lost" } else { "" }
                ),
            };
            line.push_str(&format!(" {}: {what};", CALLER_NAMES[c]));
        }
        for (c, req) in s.ghosts.iter().flatten() {
            line.push_str(&format!(
                " delayed: {req:?} of {};",
                CALLER_NAMES[usize::from(*c)]
            ));
        }
        line
    }
}
