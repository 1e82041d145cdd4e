//! What the semaphore and read/write lock models share: three clients, each holding a
//! lease in a sorted set (a permit, a read share) or at a key (a writer), taking it once
//! (trying again while busy) and releasing it, client 0 renewing it once if it likes;
//! up to two timeouts among the clients other than [`Scripts::ANSWERED`] (a try,
//! renewal or release that may still run later, or whose reply is lost), the clean-up
//! of a try that timed out; a clock of three ticks that expires leases of two. The
//! scripts that take a lease are each model's own ([`Scripts`]); releasing and renewing
//! are the same compare of the token and its lease end (`permit_release.lua`,
//! `permit_extend.lua`, and a lock's compare-and-delete, compare-and-extend).
//!
//! | model step | code |
//! |---|---|
//! | `gets Taken` | `LockRequest::taken`: the lease is `ttl` from when the try was *sent* |
//! | a try times out | `Error::Backend`, and `spawn_cleanup` (a release of its token) in the background; the try may still run later |
//! | `sends a renewal` | the watchdog's renewal: live → the lease is `ttl` from its send; else lost |
//! | `sends a release` / a release times out | `release_raw`: the token live → removed, released; gone or expired → `NotOurs`; after a lost reply one retry, whose `NotOurs` is `Earlier` (success) while the lease surely runs by the client's clock, else `Unknown` |
//! | `the clock ticks` | leases end at the server and by the clients' clocks |
//!
//! Invariants: the model's own on the clients that believe they hold (their lease
//! running by their clock, not found lost); and a client told its release succeeded
//! never had its lease end at the server first.

use std::fmt;
use std::hash::Hash;

use super::explore::Model;

pub(crate) const CLIENTS: usize = 3;
pub(crate) const TTL: u8 = 2;
/// The clock stops here (the model stays finite); a busy client gives up at the end.
const MAX_T: u8 = 3;
/// Timeouts in one run, at most.
const MAX_FAULTS: u8 = 2;

/// What a model's scripts do, and its invariant on the holders.
pub(crate) trait Scripts: Copy {
    /// The server's state besides the leases (a waiting writer's mark).
    type Extra: Clone + PartialEq + Eq + Hash + fmt::Debug + Default;
    /// The client whose requests are always answered; the others meet the faults.
    const ANSWERED: usize;
    /// Client `c`'s try (or, with a planted check-then-add, its `Add`) run now.
    fn take(&self, s: &mut LeaseState<Self::Extra>, c: usize, kind: Kind) -> Reply;
    /// Why the clients in `believers` may not all hold at once, if they may not.
    fn holders(&self, believers: &[usize]) -> Option<String>;
    /// Planted: the lease counted from the reply instead of the send.
    fn lease_from_reply(&self) -> bool {
        false
    }
    /// Planted: a release that finds its token after its lease ended says released.
    fn release_ignores_expiry(&self) -> bool {
        false
    }
    /// Planted: a release retry that finds its token gone reports success.
    fn retry_always_ok(&self) -> bool {
        false
    }
}

/// The model of one kind of lease, by its scripts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Leases<S>(pub(crate) S);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Try,
    /// With a planted check-then-add: the `ZADD` after a check that found room.
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
pub(crate) struct LeaseState<X> {
    pub(crate) now: u8,
    /// Each client's token at the server and when its lease ends.
    pub(crate) held: [Option<u8>; CLIENTS],
    /// A client's token ended at the server while it was held.
    expired: [bool; CLIENTS],
    clients: [Client; CLIENTS],
    /// A request that timed out and may still run (a try, `Add`, a renewal or a
    /// release), and the background clean-up of a try that timed out.
    stray: [Option<Kind>; CLIENTS],
    cleanup: [bool; CLIENTS],
    faults: u8,
    /// The model's own server state.
    pub(crate) extra: X,
}

impl<X> LeaseState<X> {
    /// Whether client `j`'s lease runs at the server now.
    pub(crate) fn live(&self, j: usize) -> bool {
        self.held[j].is_some_and(|end| end > self.now)
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum LeaseStep {
    Send(usize, &'static str),
    Run(usize, Kind),
    Receive(usize, Reply),
    TimeOut(usize),
    Stray(usize, Kind),
    Cleanup(usize),
    Tick,
}

impl fmt::Display for LeaseStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseStep::Send(c, what) => write!(f, "client {c} sends {what}"),
            LeaseStep::Run(c, kind) => write!(f, "the server runs client {c}'s {kind:?}"),
            LeaseStep::Receive(c, reply) => write!(f, "client {c} gets {reply:?}"),
            LeaseStep::TimeOut(c) => write!(f, "client {c}'s request times out"),
            LeaseStep::Stray(c, kind) => write!(f, "client {c}'s timed-out {kind:?} runs late"),
            LeaseStep::Cleanup(c) => write!(f, "client {c}'s clean-up release runs"),
            LeaseStep::Tick => write!(f, "the clock ticks"),
        }
    }
}

impl<S: Scripts> Leases<S> {
    /// What the server does with client `c`'s request `kind` now.
    fn run(&self, s: &mut LeaseState<S::Extra>, c: usize, kind: Kind) -> Reply {
        let now = s.now;
        match kind {
            Kind::Try | Kind::Add => self.0.take(s, c, kind),
            Kind::Release { .. } => match s.held[c] {
                Some(end) if end > now || self.0.release_ignores_expiry() => {
                    s.held[c] = None;
                    Reply::Released
                }
                Some(_) => {
                    s.held[c] = None;
                    Reply::NotOurs
                }
                None => Reply::NotOurs,
            },
            Kind::Extend => Reply::Extended(if s.live(c) {
                s.held[c] = Some(now + TTL);
                true
            } else {
                false
            }),
        }
    }

    /// Client `c` reads `reply` to its request `req`.
    fn receive(&self, s: &LeaseState<S::Extra>, c: usize, req: Req, reply: Reply) -> Client {
        let now = s.now;
        match (s.clients[c], reply) {
            (Client::Trying(_), Reply::Taken) => Client::Holding {
                lease_end: if self.0.lease_from_reply() {
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
                _ if self.0.retry_always_ok() || now < lease_end => Outcome::Ok,
                _ => Outcome::Unknown,
            }),
            (other, _) => other,
        }
    }
}

impl<S: Scripts> Model for Leases<S> {
    type State = LeaseState<S::Extra>;
    type Step = LeaseStep;

    fn init(&self) -> Self::State {
        LeaseState {
            now: 0,
            held: [None; CLIENTS],
            expired: [false; CLIENTS],
            clients: [Client::Idle; CLIENTS],
            stray: [None; CLIENTS],
            cleanup: [false; CLIENTS],
            faults: 0,
            extra: S::Extra::default(),
        }
    }

    fn next(&self, s: &Self::State, out: &mut Vec<(LeaseStep, Self::State)>) {
        for c in 0..CLIENTS {
            self.client_steps(s, c, out);
            if let Some(kind) = s.stray[c] {
                let mut n = s.clone();
                n.stray[c] = None;
                self.run(&mut n, c, kind);
                out.push((LeaseStep::Stray(c, kind), n));
            }
            if s.cleanup[c] {
                let mut n = s.clone();
                n.cleanup[c] = false;
                self.run(&mut n, c, Kind::Release { retry: true });
                out.push((LeaseStep::Cleanup(c), n));
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
            out.push((LeaseStep::Tick, n));
        }
        // Whether a lease ran out matters only while its client may be told it was
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

    fn check(&self, s: &Self::State) -> Option<String> {
        let believers: Vec<usize> = (0..CLIENTS)
            .filter(
                |&c| matches!(s.clients[c], Client::Holding { lease_end, .. } if s.now < lease_end),
            )
            .collect();
        if let Some(why) = self.0.holders(&believers) {
            return Some(why);
        }
        for c in 0..CLIENTS {
            if s.clients[c] == Client::Done(Outcome::Ok) && s.expired[c] {
                return Some(format!(
                    "client {c} was told its release succeeded, but its lease had run out first"
                ));
            }
        }
        None
    }

    fn show(&self, s: &Self::State) -> String {
        format!(
            "now={} held={:?} extra={:?} clients={:?} stray={:?} cleanup={:?}",
            s.now, s.held, s.extra, s.clients, s.stray, s.cleanup
        )
    }

    fn for_trace(&self) -> Self {
        *self
    }
}

impl<S: Scripts> Leases<S> {
    /// Client `c`'s own transitions: send, the server running what it sent, its reply,
    /// or a timeout.
    fn client_steps(
        &self,
        s: &LeaseState<S::Extra>,
        c: usize,
        out: &mut Vec<(LeaseStep, LeaseState<S::Extra>)>,
    ) {
        let now = s.now;
        let with = |client: Client| {
            let mut n = s.clone();
            n.clients[c] = client;
            n
        };
        match s.clients[c] {
            Client::Idle => out.push((
                LeaseStep::Send(c, "a try"),
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
                    LeaseStep::Send(c, "a release"),
                    with(Client::Releasing {
                        req: release,
                        lease_end,
                    }),
                ));
                // Client 0 renews (the others' renewals add states, not paths).
                if !renewed && c == 0 {
                    out.push((
                        LeaseStep::Send(c, "a renewal"),
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
                out.push((LeaseStep::Run(c, req.kind), n));
            }
            Some(reply) => {
                let mut n = s.clone();
                n.clients[c] = self.receive(s, c, req, reply);
                out.push((LeaseStep::Receive(c, reply), n));
            }
        }
        // A timeout, whether the request ran (its reply lost) or not (it may run later).
        if s.faults >= MAX_FAULTS || c == S::ANSWERED {
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
            out.push((LeaseStep::TimeOut(c), n));
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
