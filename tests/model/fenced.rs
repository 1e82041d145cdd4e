//! The model of fenced writes (`set_fenced.lua`): writers holding fences 1, 2 and 3
//! (each a later holder of one lock, so a larger fence; the lock protocol's own model
//! checks that fences grow), whose writes the network delays, reorders and duplicates (a
//! client's retry after a timeout), against storage that keeps the highest fence seen.
//!
//! Invariants: a write never lands after a write with a larger fence (a paused holder
//! cannot overwrite the next holder's value); the value stored is always the one of the
//! highest fence seen; a writer refused was refused by a larger fence than its own.

use std::fmt;

use super::explore::Model;

/// Writers, with fences 1..=WRITERS.
pub(crate) const WRITERS: usize = 3;

/// Planted faults, each off in the script as it is.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FencedBugs {
    /// The check and the write as two steps (a `GET` of the fence, then a `SET`), as a
    /// client doing it by hand would: another write may come between them.
    pub(crate) check_then_write: bool,
    /// An equal fence refused (`>` instead of `>=`): the retry of a write that landed is
    /// told it is stale.
    pub(crate) equal_refused: bool,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct FencedModel {
    pub(crate) bugs: FencedBugs,
    /// Copies of one writer's request in flight at most (1: no retries).
    pub(crate) copies: u8,
}

impl FencedModel {
    /// The script as it is.
    pub(crate) fn fixed() -> Self {
        FencedModel {
            bugs: FencedBugs::default(),
            copies: 2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Told {
    Nothing,
    Stored,
    /// Refused, by this fence seen.
    Refused(u8),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct FencedState {
    /// The value stored: whose write (its fence), 0 for none.
    value: u8,
    /// The highest fence seen.
    seen: u8,
    /// Per writer: copies sent so far, copies in flight, copies checked and waiting to
    /// write (`check_then_write` only), and what it was told last.
    sent: [u8; WRITERS],
    in_flight: [u8; WRITERS],
    checked: [u8; WRITERS],
    told: [Told; WRITERS],
    /// The largest fence whose write has landed, and a write found landing after it.
    landed_max: u8,
    out_of_order: Option<(u8, u8)>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum FencedStep {
    Send(u8),
    Run(u8),
    Check(u8),
    Write(u8),
    Drop(u8),
}

impl fmt::Display for FencedStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FencedStep::Send(w) => write!(f, "writer {w} sends its write"),
            FencedStep::Run(w) => write!(f, "the script runs writer {w}'s write"),
            FencedStep::Check(w) => write!(f, "writer {w}'s fence is checked"),
            FencedStep::Write(w) => write!(f, "writer {w}'s value is written"),
            FencedStep::Drop(w) => write!(f, "writer {w}'s reply is lost"),
        }
    }
}

impl FencedModel {
    /// A write of fence `w` landing: stored, and checked against the order of landings.
    fn land(s: &mut FencedState, w: u8) {
        if w < s.landed_max && s.out_of_order.is_none() {
            s.out_of_order = Some((w, s.landed_max));
        }
        s.landed_max = s.landed_max.max(w);
        s.value = w;
        s.seen = s.seen.max(w);
    }
}

impl Model for FencedModel {
    type State = FencedState;
    type Step = FencedStep;

    fn init(&self) -> FencedState {
        FencedState {
            value: 0,
            seen: 0,
            sent: [0; WRITERS],
            in_flight: [0; WRITERS],
            checked: [0; WRITERS],
            told: [Told::Nothing; WRITERS],
            landed_max: 0,
            out_of_order: None,
        }
    }

    fn next(&self, s: &FencedState, out: &mut Vec<(FencedStep, FencedState)>) {
        for i in 0..WRITERS {
            let w = u8::try_from(i + 1).expect("few writers");
            // The writer sends (again, after a timeout, while it was told nothing).
            if s.sent[i] < self.copies && s.told[i] == Told::Nothing {
                let mut n = s.clone();
                n.sent[i] += 1;
                n.in_flight[i] += 1;
                out.push((FencedStep::Send(w), n));
            }
            if s.in_flight[i] > 0 {
                // The request reaches the server and runs; or its reply is lost after.
                for lose_reply in [false, true] {
                    let mut n = s.clone();
                    n.in_flight[i] -= 1;
                    let refused = if self.bugs.equal_refused {
                        w <= s.seen && s.seen != 0
                    } else {
                        w < s.seen
                    };
                    let told = if self.bugs.check_then_write {
                        if refused {
                            Told::Refused(s.seen)
                        } else {
                            n.checked[i] += 1;
                            Told::Nothing
                        }
                    } else if refused {
                        Told::Refused(s.seen)
                    } else {
                        FencedModel::land(&mut n, w);
                        Told::Stored
                    };
                    if lose_reply {
                        out.push((FencedStep::Drop(w), n));
                    } else {
                        if told != Told::Nothing {
                            n.told[i] = told;
                        }
                        let step = if self.bugs.check_then_write {
                            FencedStep::Check(w)
                        } else {
                            FencedStep::Run(w)
                        };
                        out.push((step, n));
                    }
                }
            }
            if s.checked[i] > 0 {
                let mut n = s.clone();
                n.checked[i] -= 1;
                FencedModel::land(&mut n, w);
                n.told[i] = Told::Stored;
                out.push((FencedStep::Write(w), n));
            }
        }
    }

    fn check(&self, s: &FencedState) -> Option<String> {
        if let Some((w, after)) = s.out_of_order {
            return Some(format!(
                "a write under fence {w} landed after one under fence {after}"
            ));
        }
        if s.value != s.seen {
            return Some(format!(
                "the value stored is fence {}'s, but fence {} was seen",
                s.value, s.seen
            ));
        }
        for (i, told) in s.told.iter().enumerate() {
            if let Told::Refused(seen) = told
                && usize::from(*seen) <= i + 1
            {
                return Some(format!(
                    "writer {} was refused by fence {seen}, not larger than its own",
                    i + 1
                ));
            }
        }
        None
    }

    fn show(&self, s: &FencedState) -> String {
        format!(
            "value={} seen={} in_flight={:?} checked={:?} told={:?}",
            s.value, s.seen, s.in_flight, s.checked, s.told
        )
    }

    fn for_trace(&self) -> Self {
        *self
    }
}
