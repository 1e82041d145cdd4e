//! The model of read/write locks (`read_acquire.lua`, `write_acquire.lua`, a reader's
//! release and renewal as a permit's, the writer's as a lock's), on the clients, faults
//! and clock of `model/leases.rs`: readers 0 and 1 and writer 2; reader 1's requests are
//! always answered. 1.4 million states.
//!
//! | model step | code |
//! |---|---|
//! | a reader's try | `read_acquire.lua`: expired readers removed; its own token refreshed; else busy while the writer's key is live or a writer's mark is; else added |
//! | the writer's try | `write_acquire.lua`: expired readers removed; a live reader → the mark set, busy; else the lock taken (its own token refreshed), its mark removed |
//! | releases, renewals, retries, the clock | as `model/leases.rs`: a reader's with `permit_release.lua` and `permit_extend.lua`, the writer's as `model/lock.rs` (compare-and-delete) |
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

use super::leases::{CLIENTS, Kind, LeaseState, Leases, Reply, Scripts, TTL};

/// The writer; the others read.
const WRITER: usize = 2;

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

/// The read/write lock's scripts, with `bugs` planted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadWrite {
    pub(crate) bugs: RwBugs,
}

pub(crate) type RwModel = Leases<ReadWrite>;

impl RwModel {
    /// The scripts and guard as they are.
    pub(crate) fn fixed() -> Self {
        Leases(ReadWrite {
            bugs: RwBugs::default(),
        })
    }
}

impl Scripts for ReadWrite {
    /// The waiting writer's mark, until when.
    type Extra = Option<u8>;
    const ANSWERED: usize = 1;

    fn take(&self, s: &mut LeaseState<Option<u8>>, c: usize, _kind: Kind) -> Reply {
        let now = s.now;
        if c == WRITER {
            for j in 0..CLIENTS {
                if j != WRITER && !s.live(j) {
                    s.held[j] = None;
                }
            }
            let reading = (0..CLIENTS).any(|j| j != WRITER && s.live(j));
            if reading && !self.bugs.writer_ignores_readers {
                s.extra = Some(now + 1);
                return Reply::Busy;
            }
            s.held[c] = Some(now + TTL);
            s.extra = None;
            return Reply::Taken;
        }
        if s.live(c) {
            s.held[c] = Some(now + TTL);
            return Reply::Taken;
        }
        let writer_end = s.held[WRITER].unwrap_or(0);
        let writing = if self.bugs.writer_ends_early {
            writer_end > now + 1
        } else {
            writer_end > now
        };
        let marked = s.extra.is_some_and(|end| end > now);
        if (writing && !self.bugs.reader_ignores_writer) || marked {
            return Reply::Busy;
        }
        s.held[c] = Some(now + TTL);
        Reply::Taken
    }

    fn holders(&self, believers: &[usize]) -> Option<String> {
        if !believers.contains(&WRITER) {
            return None;
        }
        let reader = believers.iter().find(|&&c| c != WRITER)?;
        Some(format!(
            "the writer believes it holds beside reader {reader}, which believes it does"
        ))
    }
}

/// The kinds that meet on one name (see "What each primitive writes" in the crate docs):
/// reader 0 (`read_acquire.lua`), a lock 1 (`acquire.lua`, whose tries after it found
/// `readers` at the key are a writer's) and the write lock 2 (`write_acquire.lua`), on
/// the clients, faults and clock of `model/leases.rs`. The lock and the writer keep their
/// tokens at the one key; the readers keep `readers` there, whose ttl ends with the
/// longest share: in the model, live while a reader's lease runs at the server.
///
/// Invariant: never two of them believing they hold at once (each by its own lease).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SharedName {
    pub(crate) bugs: SharedBugs,
}

/// Planted faults, each off in the scripts as they are.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SharedBugs {
    /// The lock's try that does not look at `readers` (a plain `SET NX` beside readers,
    /// as before the key space had one owner).
    pub(crate) lock_ignores_readers: bool,
    /// The writer's try that does not look at the lock's token at the key.
    pub(crate) writer_ignores_lock: bool,
}

/// The reader, the lock and the writer of [`SharedName`].
const READER: usize = 0;
const LOCK: usize = 1;

pub(crate) type SharedModel = Leases<SharedName>;

impl SharedModel {
    /// The scripts as they are.
    pub(crate) fn fixed() -> Self {
        Leases(SharedName {
            bugs: SharedBugs::default(),
        })
    }
}

impl Scripts for SharedName {
    /// A waiting writer's (or lock's) mark, until when.
    type Extra = Option<u8>;
    const ANSWERED: usize = READER;

    fn take(&self, s: &mut LeaseState<Option<u8>>, c: usize, _kind: Kind) -> Reply {
        let now = s.now;
        // The key's holder by its token, and `readers` while a reader's share runs.
        let token_at_key = |s: &LeaseState<Option<u8>>, other: usize| s.live(other);
        let readers = s.live(READER);
        if s.live(c) {
            s.held[c] = Some(now + TTL);
            return Reply::Taken;
        }
        match c {
            READER => {
                let marked = s.extra.is_some_and(|end| end > now);
                if token_at_key(s, LOCK) || token_at_key(s, WRITER) || marked {
                    return Reply::Busy;
                }
            }
            LOCK => {
                if token_at_key(s, WRITER) {
                    return Reply::Busy;
                }
                if readers && !self.bugs.lock_ignores_readers {
                    // `readers` at the key: busy, and tries as a writer from then on,
                    // whose mark keeps new readers out.
                    s.extra = Some(now + 1);
                    return Reply::Busy;
                }
            }
            _ => {
                if readers || (token_at_key(s, LOCK) && !self.bugs.writer_ignores_lock) {
                    s.extra = Some(now + 1);
                    return Reply::Busy;
                }
                s.extra = None;
            }
        }
        s.held[c] = Some(now + TTL);
        Reply::Taken
    }

    fn holders(&self, believers: &[usize]) -> Option<String> {
        let name = |c: usize| ["reader 0", "the lock", "the writer"][c];
        match believers {
            [a, b, ..] => Some(format!(
                "{} believes it holds beside {}, which believes it does",
                name(*a),
                name(*b)
            )),
            _ => None,
        }
    }
}
