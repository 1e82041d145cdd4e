//! An exhaustive breadth-first explorer of finite state machines.
//!
//! Every state reachable from the initial one is visited once (a hash set of the states
//! seen); the invariant is checked in each. Breadth-first, so the first violation found
//! comes with a shortest trace from the initial state.

use std::collections::HashSet;
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::time::{Duration, Instant};

/// The "violation" of a goal transition found.
pub(crate) const REACHED: &str = "reached the transition looked for";

/// A state machine to explore.
pub(crate) trait Model {
    /// One state: small, cheap to clone and hash.
    type State: Clone + Eq + Hash;
    /// What one transition did, for traces.
    type Step: Copy + fmt::Display;

    /// The initial state.
    fn init(&self) -> Self::State;
    /// Every transition enabled in `s`.
    fn next(&self, s: &Self::State, out: &mut Vec<(Self::Step, Self::State)>);
    /// The invariant: `Some(why)` when `s` violates it.
    fn check(&self, s: &Self::State) -> Option<String>;
    /// Whether `step` is a transition looked for (reported like a violation, with its
    /// trace: to show that a path of the protocol is taken at all).
    fn goal(&self, _step: &Self::Step) -> bool {
        false
    }
    /// A one-line picture of `s`, for traces.
    fn show(&self, s: &Self::State) -> String;
    /// The same model for replaying a trace: without the renamings that make equivalent
    /// states equal (so a trace shows the values a run would see), its transitions
    /// listed in the same order.
    fn for_trace(&self) -> Self;
}

/// What an exploration that found no violation covered.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Explored {
    pub(crate) states: usize,
    pub(crate) transitions: usize,
    /// The longest shortest path from the initial state.
    pub(crate) depth: usize,
    pub(crate) took: Duration,
}

impl fmt::Display for Explored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} states, {} transitions, depth {}, {} ms",
            self.states,
            self.transitions,
            self.depth,
            self.took.as_millis()
        )
    }
}

/// A violation, with the shortest trace that reaches it.
#[derive(Debug, Clone)]
pub(crate) struct Counterexample {
    pub(crate) violation: String,
    /// The initial state, then one line per step: the step and the state it led to.
    pub(crate) trace: Vec<String>,
    /// States visited before it was found.
    pub(crate) states: usize,
}

impl fmt::Display for Counterexample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "VIOLATION: {} (after {} states, {} steps)",
            self.violation,
            self.states,
            self.trace.len().saturating_sub(1)
        )?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// FxHash (as in rustc): much faster than SipHash, and states are not adversarial.
#[derive(Default, Clone, Copy)]
pub(crate) struct Fx(u64);

impl Fx {
    // Shifts rather than `rotate_left`: the tests run unoptimized, where that is a call.
    #[allow(clippy::manual_rotate)]
    #[inline]
    fn add(&mut self, word: u64) {
        let x = ((self.0 << 5) | (self.0 >> 59)) ^ word;
        self.0 = x.wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.add(u64::from(byte));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn write_isize(&mut self, i: isize) {
        self.add(i as u64);
    }
}

/// Explores every state reachable in `model`. `Ok` when the invariant holds in all of
/// them; the first violation found otherwise. Panics past `max_states` (the bounds are
/// too loose for a test).
pub(crate) fn explore<M: Model>(model: &M, max_states: usize) -> Result<Explored, Counterexample> {
    let started = Instant::now();
    let mut seen: HashSet<M::State, BuildHasherDefault<Fx>> = HashSet::default();
    // Every state once, with the index of the state it was first reached from and which
    // of its transitions led here.
    let mut arena: Vec<(M::State, u32, u16)> = Vec::new();
    let mut depth_of: Vec<u16> = Vec::new();
    let init = model.init();
    seen.insert(init.clone());
    arena.push((init, 0, 0));
    depth_of.push(0);
    if let Some(violation) = model.check(&arena[0].0) {
        return Err(counterexample(model, &arena, 0, violation));
    }
    let mut out = Vec::new();
    let mut transitions = 0;
    let mut i = 0;
    while i < arena.len() {
        out.clear();
        model.next(&arena[i].0, &mut out);
        let reached = out.iter().position(|(step, _)| model.goal(step));
        if let Some(n) = reached {
            let parent = u32::try_from(i).expect("fewer than 2^32 states");
            let n = u16::try_from(n).expect("fewer than 2^16 transitions per state");
            arena.push((out.swap_remove(usize::from(n)).1, parent, n));
            let at = arena.len() - 1;
            return Err(counterexample(model, &arena, at, REACHED.to_string()));
        }
        for (n, (_, state)) in out.drain(..).enumerate() {
            transitions += 1;
            if !seen.insert(state.clone()) {
                continue;
            }
            let at = arena.len();
            assert!(
                at < max_states,
                "more than {max_states} states: tighten the model's bounds"
            );
            let parent = u32::try_from(i).expect("fewer than 2^32 states");
            let n = u16::try_from(n).expect("fewer than 2^16 transitions per state");
            arena.push((state, parent, n));
            depth_of.push(depth_of[i] + 1);
            if let Some(violation) = model.check(&arena[at].0) {
                return Err(counterexample(model, &arena, at, violation));
            }
        }
        i += 1;
    }
    Ok(Explored {
        states: arena.len(),
        transitions,
        depth: depth_of.last().copied().map_or(0, usize::from),
        took: started.elapsed(),
    })
}

fn counterexample<M: Model>(
    model: &M,
    arena: &[(M::State, u32, u16)],
    mut at: usize,
    violation: String,
) -> Counterexample {
    let mut path = Vec::new();
    while at != 0 {
        path.push(usize::from(arena[at].2));
        at = arena[at].1 as usize;
    }
    path.reverse();
    // Replay the path on the model as a run would see it.
    let replay = model.for_trace();
    let mut state = replay.init();
    let mut trace = vec![format!("[init] {}", replay.show(&state))];
    let mut out = Vec::new();
    for (n, &which) in path.iter().enumerate() {
        out.clear();
        replay.next(&state, &mut out);
        let (step, next) = out.swap_remove(which);
        trace.push(format!(
            "{:>2}. {step}\n        => {}",
            n + 1,
            replay.show(&next)
        ));
        state = next;
    }
    // The violation as the replayed state shows it.
    let violation = match replay.check(&state) {
        Some(shown) if violation != REACHED => shown,
        _ => violation,
    };
    Counterexample {
        violation,
        trace,
        states: arena.len(),
    }
}
