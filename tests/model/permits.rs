//! The model of semaphores (`permit_acquire.lua`, `permit_release.lua`,
//! `permit_extend.lua` and the lock's guard over them): three clients, two permits,
//! each client taking a permit once (trying again while busy) and releasing it, client
//! 0 renewing it once if it likes; up to two timeouts among clients 0 and 1 (a try,
//! renewal or release that may still run later, or whose reply is lost); a clock of
//! three ticks that expires the leases of two. 1.7 million states.
//!
//! | model step | code |
//! |---|---|
//! | `sends a try` / `the try runs` | `LockRequest::contend` → `try_permit`: expired holders removed, then the caller's own token refreshed, or added while fewer than the permits are live, else busy |
//! | `gets Taken` | `LockRequest::taken`: the lease is `ttl` from when the try was *sent* |
//! | a try times out | `Error::Backend`, and `spawn_cleanup` (a release of its token) in the background; the try may still run later |
//! | `sends a renewal` | the watchdog's `extend_permits`: live → the lease is `ttl` from its send; else lost |
//! | `sends a release` / a release times out | `release_raw` → `permit_release.lua`: the token live → removed, released; gone or expired → `NotOurs`; after a lost reply one retry, whose `NotOurs` is `Earlier` (success) while the lease surely runs by the client's clock, else `Unknown` |
//! | `the clock ticks` | leases end at the server (`ZREMRANGEBYSCORE` by the next try) and by the clients' clocks |
//!
//! Invariants: never more clients that believe they hold a permit (their lease running
//! by their clock, not found lost) than permits; a client told its permit was released
//! never had it expire at the server first.

use std::fmt;

use super::explore::Model;

const CLIENTS: usize = 3;
const PERMITS: usize = 2;
const TTL: u8 = 2;
/// The clock stops here (the model stays finite); a busy client gives up at the end.
const MAX_T: u8 = 3;
/// Timeouts in one run, at most.
const MAX_FAULTS: u8 = 2;

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

#[derive(Debug, Clone, Copy)]
pub(crate) struct PermitModel {
    pub(crate) bugs: PermitBugs,
}

impl PermitModel {
    /// The scripts and guard as they are.
    pub(crate) fn fixed() -> Self {
        PermitModel {
            bugs: PermitBugs::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Try,
    /// With `check_then_add`: the `ZADD` after a check that found room.
    Add,
    Release {
        retry: bool,
    },
    Extend,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Reply {
    Taken,
    Busy,
    Room,
    Released,
    NotOurs,
    Extended(bool),
}

/// One request: what, when sent, and its reply once it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Req {
    kind: Kind,
    sent: u8,
    reply: Option<Reply>,
}

impl Req {
    fn new(kind: Kind, sent: u8) -> Req {
        Req {
            kind,
            sent,
            reply: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Outcome {
    Busy,
    Ok,
    Lost,
    Unknown,
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Client {
    Idle,
    Trying(Req),
    Holding {
        lease_end: u8,
        renewal: Option<Req>,
        renewed: bool,
    },
    Releasing {
        req: Req,
        lease_end: u8,
    },
    Done(Outcome),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PermitState {
    now: u8,
    /// The server's sorted set: each client's token and when its lease ends.
    held: [Option<u8>; CLIENTS],
    /// A client's token ended at the server while it was in the set.
    expired: [bool; CLIENTS],
    clients: [Client; CLIENTS],
    /// A request that timed out and may still run (a try, `Add`, or a release), and the
    /// background clean-up of a try that timed out.
    stray: [Option<Kind>; CLIENTS],
    cleanup: [bool; CLIENTS],
    faults: u8,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum PermitStep {
    Send(usize, &'static str),
    Run(usize, Kind),
    Receive(usize, Reply),
    TimeOut(usize),
    Stray(usize, Kind),
    Cleanup(usize),
    Tick,
}

impl fmt::Display for PermitStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PermitStep::Send(c, what) => write!(f, "client {c} sends {what}"),
            PermitStep::Run(c, kind) => write!(f, "the server runs client {c}'s {kind:?}"),
            PermitStep::Receive(c, reply) => write!(f, "client {c} gets {reply:?}"),
            PermitStep::TimeOut(c) => write!(f, "client {c}'s request times out"),
            PermitStep::Stray(c, kind) => write!(f, "client {c}'s timed-out {kind:?} runs late"),
            PermitStep::Cleanup(c) => write!(f, "client {c}'s clean-up release runs"),
            PermitStep::Tick => write!(f, "the clock ticks"),
        }
    }
}

impl PermitModel {
    /// What the server does with client `c`'s request `kind` now.
    fn run(&self, s: &mut PermitState, c: usize, kind: Kind) -> Reply {
        let now = s.now;
        let live = |s: &PermitState, j: usize| s.held[j].is_some_and(|end| end > now);
        match kind {
            Kind::Try => {
                // `ZREMRANGEBYSCORE -inf now`.
                for j in 0..CLIENTS {
                    if !live(s, j) {
                        s.held[j] = None;
                    }
                }
                let count = (0..CLIENTS).filter(|&j| live(s, j)).count();
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
            Kind::Add => {
                s.held[c] = Some(now + TTL);
                Reply::Taken
            }
            Kind::Release { .. } => match s.held[c] {
                Some(end) if end > now || self.bugs.release_ignores_expiry => {
                    s.held[c] = None;
                    Reply::Released
                }
                Some(_) => {
                    s.held[c] = None;
                    Reply::NotOurs
                }
                None => Reply::NotOurs,
            },
            Kind::Extend => Reply::Extended(if live(s, c) {
                s.held[c] = Some(now + TTL);
                true
            } else {
                false
            }),
        }
    }

    /// Client `c` reads `reply` to its request `req`.
    fn receive(&self, s: &PermitState, c: usize, req: Req, reply: Reply) -> Client {
        let now = s.now;
        match (s.clients[c], reply) {
            (Client::Trying(_), Reply::Taken) => Client::Holding {
                lease_end: if self.bugs.lease_from_reply {
                    now
                } else {
                    req.sent
                } + TTL,
                renewal: None,
                renewed: false,
            },
            (Client::Trying(_), Reply::Room) => Client::Trying(Req::new(Kind::Add, req.sent)),
            (Client::Trying(_), _) if now + 1 < MAX_T => Client::Trying(Req::new(Kind::Try, now)),
            (Client::Trying(_), _) => Client::Done(Outcome::Busy),
            (Client::Holding { lease_end, .. }, Reply::Extended(extended)) => Client::Holding {
                lease_end: if extended {
                    req.sent + TTL
                } else {
                    lease_end.min(now)
                },
                renewal: None,
                renewed: true,
            },
            (Client::Releasing { .. }, Reply::Released) => Client::Done(Outcome::Ok),
            (Client::Releasing { req, lease_end }, _) => Client::Done(match req.kind {
                Kind::Release { retry: false } => Outcome::Lost,
                _ if self.bugs.retry_always_ok || now < lease_end => Outcome::Ok,
                _ => Outcome::Unknown,
            }),
            (other, _) => other,
        }
    }
}

impl Model for PermitModel {
    type State = PermitState;
    type Step = PermitStep;

    fn init(&self) -> PermitState {
        PermitState {
            now: 0,
            held: [None; CLIENTS],
            expired: [false; CLIENTS],
            clients: [Client::Idle; CLIENTS],
            stray: [None; CLIENTS],
            cleanup: [false; CLIENTS],
            faults: 0,
        }
    }

    fn next(&self, s: &PermitState, out: &mut Vec<(PermitStep, PermitState)>) {
        for c in 0..CLIENTS {
            self.client_steps(s, c, out);
            if let Some(kind) = s.stray[c] {
                let mut n = s.clone();
                n.stray[c] = None;
                self.run(&mut n, c, kind);
                out.push((PermitStep::Stray(c, kind), n));
            }
            if s.cleanup[c] {
                let mut n = s.clone();
                n.cleanup[c] = false;
                self.run(&mut n, c, Kind::Release { retry: true });
                out.push((PermitStep::Cleanup(c), n));
            }
        }
        if s.now < MAX_T {
            let mut n = s.clone();
            n.now += 1;
            for c in 0..CLIENTS {
                // Only a client that may still be told its release succeeded needs it.
                let may_be_told = matches!(
                    n.clients[c],
                    Client::Holding { .. } | Client::Releasing { .. }
                );
                if may_be_told && n.held[c].is_some_and(|end| end <= n.now) {
                    n.expired[c] = true;
                }
            }
            out.push((PermitStep::Tick, n));
        }
        // Whether a permit ran out matters only while its client may be told it was
        // released: forgotten otherwise, so equal futures are one state.
        for (_, n) in out.iter_mut() {
            for c in 0..CLIENTS {
                if matches!(n.clients[c], Client::Idle | Client::Trying(_))
                    || matches!(n.clients[c], Client::Done(o) if o != Outcome::Ok)
                {
                    n.expired[c] = false;
                }
            }
        }
    }

    fn check(&self, s: &PermitState) -> Option<String> {
        let believers: Vec<usize> = (0..CLIENTS)
            .filter(
                |&c| matches!(s.clients[c], Client::Holding { lease_end, .. } if s.now < lease_end),
            )
            .collect();
        if believers.len() > PERMITS {
            return Some(format!(
                "clients {believers:?} believe they hold one of {PERMITS} permits"
            ));
        }
        for c in 0..CLIENTS {
            if s.clients[c] == Client::Done(Outcome::Ok) && s.expired[c] {
                return Some(format!(
                    "client {c} was told its permit was released, but it had run out first"
                ));
            }
        }
        None
    }

    fn show(&self, s: &PermitState) -> String {
        format!(
            "now={} held={:?} clients={:?} stray={:?} cleanup={:?}",
            s.now, s.held, s.clients, s.stray, s.cleanup
        )
    }

    fn for_trace(&self) -> Self {
        *self
    }
}

impl PermitModel {
    /// Client `c`'s own transitions: send, the server running what it sent, its reply,
    /// or a timeout.
    fn client_steps(&self, s: &PermitState, c: usize, out: &mut Vec<(PermitStep, PermitState)>) {
        let now = s.now;
        let with = |client: Client| {
            let mut n = s.clone();
            n.clients[c] = client;
            n
        };
        match s.clients[c] {
            Client::Idle => out.push((
                PermitStep::Send(c, "a try"),
                with(Client::Trying(Req::new(Kind::Try, now))),
            )),
            Client::Holding {
                lease_end,
                renewal: None,
                renewed,
            } => {
                // When a release was sent does not matter: 0, so fewer states.
                let release = Req::new(Kind::Release { retry: false }, 0);
                out.push((
                    PermitStep::Send(c, "a release"),
                    with(Client::Releasing {
                        req: release,
                        lease_end,
                    }),
                ));
                // Client 0 renews (the others' renewals add states, not paths).
                if !renewed && c == 0 {
                    out.push((
                        PermitStep::Send(c, "a renewal"),
                        with(Client::Holding {
                            lease_end,
                            renewal: Some(Req::new(Kind::Extend, now)),
                            renewed,
                        }),
                    ));
                }
            }
            _ => {}
        }
        let Some(req) = in_flight(s.clients[c]) else {
            return;
        };
        match req.reply {
            None => {
                let mut n = s.clone();
                let reply = self.run(&mut n, c, req.kind);
                n.clients[c] = with_reply(n.clients[c], reply);
                out.push((PermitStep::Run(c, req.kind), n));
            }
            Some(reply) => {
                let mut n = s.clone();
                n.clients[c] = self.receive(s, c, req, reply);
                out.push((PermitStep::Receive(c, reply), n));
            }
        }
        // A timeout, whether the request ran (its reply lost) or not (it may run later).
        // Clients 0 and 1 meet the faults; client 2's requests are answered.
        if s.faults >= MAX_FAULTS || c == 2 {
            return;
        }
        let mut n = s.clone();
        n.faults += 1;
        if req.reply.is_none() {
            n.stray[c] = Some(req.kind);
        }
        n.clients[c] = match s.clients[c] {
            Client::Trying(_) => {
                n.cleanup[c] = true;
                Client::Done(Outcome::Failed)
            }
            Client::Holding { lease_end, .. } => Client::Holding {
                lease_end,
                renewal: None,
                renewed: true,
            },
            Client::Releasing { req, lease_end }
                if req.kind == (Kind::Release { retry: false }) =>
            {
                Client::Releasing {
                    req: Req::new(Kind::Release { retry: true }, 0),
                    lease_end,
                }
            }
            _ => Client::Done(Outcome::Failed),
        };
        // One stray per client: a second timeout while one may still run is not modelled.
        if s.stray[c].is_none() || req.reply.is_some() {
            out.push((PermitStep::TimeOut(c), n));
        }
    }
}

/// The request client state `c` has in flight.
fn in_flight(c: Client) -> Option<Req> {
    match c {
        Client::Trying(req) | Client::Releasing { req, .. } => Some(req),
        Client::Holding {
            renewal: Some(req), ..
        } => Some(req),
        _ => None,
    }
}

/// `c` with its request's reply recorded.
fn with_reply(c: Client, reply: Reply) -> Client {
    let done = |req: Req| Req {
        reply: Some(reply),
        ..req
    };
    match c {
        Client::Trying(req) => Client::Trying(done(req)),
        Client::Releasing { req, lease_end } => Client::Releasing {
            req: done(req),
            lease_end,
        },
        Client::Holding {
            lease_end,
            renewal: Some(req),
            renewed,
        } => Client::Holding {
            lease_end,
            renewal: Some(done(req)),
            renewed,
        },
        other => other,
    }
}
