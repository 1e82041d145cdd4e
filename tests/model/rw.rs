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
