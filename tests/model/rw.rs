//! The model of read/write locks (`read_acquire.lua`, `write_acquire.lua`, a reader's
//! release and renewal as a permit's, the writer's as a lock's): readers 0 and 1 and
//! writer 2 each take their side once (trying again while busy) and release it, reader
//! 0 renewing once if it likes; up to two timeouts among reader 0 and the writer (a try,
//! renewal or release that may still run later, or whose reply is lost), the clean-up of
//! a try that timed out; a clock of three ticks that expires leases of two. 1.4
//! million states.
//!
//! | model step | code |
//! |---|---|
//! | a reader's try | `read_acquire.lua`: expired readers removed; its own token refreshed; else busy while the writer's key is live or a writer's mark is; else added |
//! | the writer's try | `write_acquire.lua`: expired readers removed; a live reader → the mark set, busy; else the lock taken (its own token refreshed), its mark removed |
//! | releases, renewals, retries | as `model/permits.rs` (a reader) and `model/lock.rs` (the writer, compare-and-delete) |
//!
//! Not modelled: the readers that waited behind a writer (`{key}:readers-waiting`), who
//! go before the next writer. They only make a writer's try refuse more, and let those
//! readers past a waiting writer's mark, never past a writer's key: safety does not
//! depend on them (`rwlocks::readers_that_waited_go_before_the_next_writer` tests the
//! order).
//!
//! Invariants: never a writer that believes it holds beside a reader that believes it
//! does (each by its own lease and clock); a client told its release succeeded never
//! had its lease end at the server first.

use std::fmt;

use super::explore::Model;

const CLIENTS: usize = 3;
/// The writer; the others read.
const WRITER: usize = 2;
const TTL: u8 = 2;
/// The clock stops here (the model stays finite); a busy client gives up at the end.
const MAX_T: u8 = 3;
/// Timeouts in one run, at most.
const MAX_FAULTS: u8 = 2;

/// Planted faults, each off in the scripts as they are.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RwBugs {
    /// A reader's try that does not look at the writer's key.
    pub(crate) reader_ignores_writer: bool,
    /// The writer's try that does not look at the readers.
    pub(crate) writer_ignores_readers: bool,
    /// A reader's try that reads the writer's lease as ended one tick early (a
    /// `PTTL` of 1 taken for "gone").
    pub(crate) writer_ends_early: bool,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct RwModel {
    pub(crate) bugs: RwBugs,
}

impl RwModel {
    /// The scripts and guard as they are.
    pub(crate) fn fixed() -> Self {
        RwModel {
            bugs: RwBugs::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Try,
    Release { retry: bool },
    Extend,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Reply {
    Taken,
    Busy,
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
pub(crate) struct RwState {
    now: u8,
    /// Each client's token at the server and when its lease ends: the readers' in
    /// `{key}:readers`, the writer's at the key.
    held: [Option<u8>; CLIENTS],
    /// The waiting writer's mark, until when.
    mark: Option<u8>,
    /// A client's token ended at the server while it was in the set.
    expired: [bool; CLIENTS],
    clients: [Client; CLIENTS],
    /// A request that timed out and may still run (a try, a renewal or a release), and the
    /// background clean-up of a try that timed out.
    stray: [Option<Kind>; CLIENTS],
    cleanup: [bool; CLIENTS],
    faults: u8,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum RwStep {
    Send(usize, &'static str),
    Run(usize, Kind),
    Receive(usize, Reply),
    TimeOut(usize),
    Stray(usize, Kind),
    Cleanup(usize),
    Tick,
}

impl fmt::Display for RwStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RwStep::Send(c, what) => write!(f, "client {c} sends {what}"),
            RwStep::Run(c, kind) => write!(f, "the server runs client {c}'s {kind:?}"),
            RwStep::Receive(c, reply) => write!(f, "client {c} gets {reply:?}"),
            RwStep::TimeOut(c) => write!(f, "client {c}'s request times out"),
            RwStep::Stray(c, kind) => write!(f, "client {c}'s timed-out {kind:?} runs late"),
            RwStep::Cleanup(c) => write!(f, "client {c}'s clean-up release runs"),
            RwStep::Tick => write!(f, "the clock ticks"),
        }
    }
}

impl RwModel {
    /// What the server does with client `c`'s request `kind` now.
    fn run(&self, s: &mut RwState, c: usize, kind: Kind) -> Reply {
        let now = s.now;
        let live = |s: &RwState, j: usize| s.held[j].is_some_and(|end| end > now);
        match kind {
            Kind::Try if c == WRITER => {
                for j in 0..CLIENTS {
                    if j != WRITER && !live(s, j) {
                        s.held[j] = None;
                    }
                }
                let reading = (0..CLIENTS).any(|j| j != WRITER && live(s, j));
                if reading && !self.bugs.writer_ignores_readers {
                    s.mark = Some(now + 1);
                    return Reply::Busy;
                }
                s.held[c] = Some(now + TTL);
                s.mark = None;
                Reply::Taken
            }
            Kind::Try => {
                if live(s, c) {
                    s.held[c] = Some(now + TTL);
                    return Reply::Taken;
                }
                let writer_end = s.held[WRITER].unwrap_or(0);
                let writing = if self.bugs.writer_ends_early {
                    writer_end > now + 1
                } else {
                    writer_end > now
                };
                let marked = s.mark.is_some_and(|end| end > now);
                if (writing && !self.bugs.reader_ignores_writer) || marked {
                    return Reply::Busy;
                }
                s.held[c] = Some(now + TTL);
                Reply::Taken
            }
            Kind::Release { .. } => match s.held[c] {
                Some(end) if end > now => {
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
    fn receive(&self, s: &RwState, c: usize, req: Req, reply: Reply) -> Client {
        let now = s.now;
        match (s.clients[c], reply) {
            (Client::Trying(_), Reply::Taken) => Client::Holding {
                lease_end: req.sent + TTL,
                renewal: None,
                renewed: false,
            },
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
                _ if now < lease_end => Outcome::Ok,
                _ => Outcome::Unknown,
            }),
            (other, _) => other,
        }
    }
}

impl Model for RwModel {
    type State = RwState;
    type Step = RwStep;

    fn init(&self) -> RwState {
        RwState {
            now: 0,
            held: [None; CLIENTS],
            expired: [false; CLIENTS],
            clients: [Client::Idle; CLIENTS],
            stray: [None; CLIENTS],
            cleanup: [false; CLIENTS],
            faults: 0,
            mark: None,
        }
    }

    fn next(&self, s: &RwState, out: &mut Vec<(RwStep, RwState)>) {
        for c in 0..CLIENTS {
            self.client_steps(s, c, out);
            if let Some(kind) = s.stray[c] {
                let mut n = s.clone();
                n.stray[c] = None;
                self.run(&mut n, c, kind);
                out.push((RwStep::Stray(c, kind), n));
            }
            if s.cleanup[c] {
                let mut n = s.clone();
                n.cleanup[c] = false;
                self.run(&mut n, c, Kind::Release { retry: true });
                out.push((RwStep::Cleanup(c), n));
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
            out.push((RwStep::Tick, n));
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

    fn check(&self, s: &RwState) -> Option<String> {
        let believes = |c: usize| matches!(s.clients[c], Client::Holding { lease_end, .. } if s.now < lease_end);
        if believes(WRITER)
            && let Some(r) = (0..CLIENTS).find(|&c| c != WRITER && believes(c))
        {
            return Some(format!(
                "the writer believes it holds beside reader {r}, which believes it does"
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

    fn show(&self, s: &RwState) -> String {
        format!(
            "now={} held={:?} mark={:?} clients={:?} stray={:?} cleanup={:?}",
            s.now, s.held, s.mark, s.clients, s.stray, s.cleanup
        )
    }

    fn for_trace(&self) -> Self {
        *self
    }
}

impl RwModel {
    /// Client `c`'s own transitions: send, the server running what it sent, its reply,
    /// or a timeout.
    fn client_steps(&self, s: &RwState, c: usize, out: &mut Vec<(RwStep, RwState)>) {
        let now = s.now;
        let with = |client: Client| {
            let mut n = s.clone();
            n.clients[c] = client;
            n
        };
        match s.clients[c] {
            Client::Idle => out.push((
                RwStep::Send(c, "a try"),
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
                    RwStep::Send(c, "a release"),
                    with(Client::Releasing {
                        req: release,
                        lease_end,
                    }),
                ));
                // Reader 0 renews (the others' renewals add states, not paths).
                if !renewed && c == 0 {
                    out.push((
                        RwStep::Send(c, "a renewal"),
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
                out.push((RwStep::Run(c, req.kind), n));
            }
            Some(reply) => {
                let mut n = s.clone();
                n.clients[c] = self.receive(s, c, req, reply);
                out.push((RwStep::Receive(c, reply), n));
            }
        }
        // A timeout, whether the request ran (its reply lost) or not (it may run later).
        // Reader 0 and the writer meet the faults; reader 1's requests are answered.
        if s.faults >= MAX_FAULTS || c == 1 {
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
            out.push((RwStep::TimeOut(c), n));
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
