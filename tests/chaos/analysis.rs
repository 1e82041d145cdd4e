//! What the chaos run checks, from the event log, the monitor's samples and the faults.
//!
//! **Instances.** A restart of the lock server loses every lock and record. The parent
//! appends `restart_begin` before killing the server and `restart_end` once the new one
//! answers. An acquisition whose `lk_try` and `lk_enter` lines have no restart line
//! between them was made by one known server instance (its epoch); two holders are
//! compared only when both are in the same epoch. Otherwise the overlap is counted as
//! explained by the restart.
//!
//! **Mutual exclusion** (pairs of bodies on one key, found in file order: B's `lk_enter`
//! written while A was between its `lk_enter` and `lk_exit`; `lk_exit` is written before
//! the release starts, also when the body is cancelled):
//! - *early takeover*: B got the key before A's lease could have ended in Redis. A's lease
//!   ends no earlier than A's `lk_try` + ttl, nor than any monitor sample showing A's token
//!   (send instant + PTTL). A violation whatever A was told.
//! - *unreported loss* (renewed locks): A was never told (no `lost()` wake-up, `is_held()`
//!   true at the end) and stayed in its body more than `command timeout + 150 ms` after B
//!   got the key (less the time A's process was stopped). Lease keeping marks a lock lost
//!   by the end of its last lease, which Redis cannot end earlier, plus at most one
//!   command timeout (a renewal in flight), so a shorter overlap is counted as a near miss.
//! - *release said Ok* (plain locks): A's release returned `Ok` although B held the key
//!   during A's body (a loss must be reported as `Lost`, or `Backend` when unknown).
//!
//! **Liveness** of the key (from the monitor's samples; `T` = 2 x command timeout +
//! 250 ms; a check applies only when no fault touched its window: a stall or restart of
//! redis, or a pause of the process concerned, within 2 x command timeout + 100 ms of it;
//! killed connections do not excuse anything):
//! - *handed-over key idle*: a token appeared in the key and its call's acquire returned
//!   more than `T` later (a local handoff that no waiter took up).
//! - *orphan token*: a token of a strict child (one that never cancels an acquisition)
//!   whose call never held the lock stayed in the key more than `T` (a waiter given the
//!   lock that returned without it, e.g. `Busy` on its own token).
//! - *release did not release*: a token still in the key more than `T` after its holder
//!   left the body, when the release did not return a backend error (a release cancelled
//!   before it was sent must still happen, in the background).
//!
//! **Idempotency** (bodies of one record key in file order; P = the previous body):
//! - *other payload ran*: a body ran with payload X although an earlier body of another
//!   payload had not given its own claim back first (its body returned `Err` or was
//!   dropped, before this one entered). Such a body may have acted on its payload (it ran
//!   to its end, or was still running: paused past its lease, crashed): whatever became of
//!   its record since (taken over, given back), another payload must get
//!   `PayloadMismatch`.
//! - *ran twice*: a body ran with P's payload after P's call had returned `Ok` from its own
//!   run, with no stall or restart of redis and no pause of P's process anywhere near P's
//!   call: it must have been replayed.
//! - *replayed another payload*: a call got a stored result of another payload.
//!
//! **Bounds**: a call without a cancelling timeout returns within its `wait` (plus its body
//! for idempotent calls) + 4 x command timeout + 400 ms (less the time its process was
//! stopped); a release within 4 x command timeout + 400 ms.
//!
//! Reentrancy: a nested acquisition of the key the task holds must re-enter (same token
//! and fence). End state: see `parent.rs`.

use std::collections::{BTreeMap, HashMap};

use crate::cfg;
use crate::events::Event;
use crate::parent::{Fault, Monitor};

/// One violation.
pub(crate) struct Finding {
    pub(crate) check: &'static str,
    pub(crate) text: String,
    pub(crate) calls: Vec<String>,
}

pub(crate) struct Report {
    pub(crate) findings: Vec<Finding>,
    pub(crate) stats: Vec<String>,
}

/// Which known fault a check's violations point to.
fn hint(check: &str) -> &'static str {
    match check {
        "unreported loss" => {
            "fault 1 signature: lease keeping stopped without marking the lock lost \
             (watchdog of one runtime replaced by another's)"
        }
        "handed-over key idle" | "orphan token" => {
            "fault 2 signature: a local handoff landed after the releaser gave up; \
             the waiter never took it up (Busy on its own token) and the key idled for a ttl"
        }
        "release did not release" => {
            "fault 3 signature: a release() cancelled before its script was sent released \
             nothing; the key stayed until its ttl"
        }
        "other payload ran" => {
            "fault 4 signature: an expired in-progress claim was taken over without the \
             fingerprint check; with the check in place, the record of the first payload must \
             also not vanish by other means (e.g. a same-payload takeover that is then released)"
        }
        _ => "",
    }
}

#[derive(Default, Clone)]
struct LockCall {
    call: String,
    child: usize,
    key: String,
    renew: bool,
    ttl_us: u64,
    wait_us: u64,
    strict: bool,
    outer: bool,
    relto: bool,
    try_idx: usize,
    try_ts: u64,
    enter: Option<(usize, u64)>,
    token: Option<String>,
    acq_dur: Option<u64>,
    fail: Option<String>,
    fail_ts: u64,
    lost: bool,
    exit: Option<(usize, u64, String)>,
    rel: Option<(String, u64, u64)>,
    cancel: Option<String>,
}

#[derive(Default, Clone)]
struct IdemCall {
    call: String,
    child: usize,
    key: String,
    payload: u64,
    work_us: u64,
    timed: bool,
    try_idx: usize,
    try_ts: u64,
    enter: Option<(usize, u64)>,
    exit: Option<(usize, u64, String)>,
    ret: Option<(usize, u64, String, Option<u64>, u64)>,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

struct Windows<'a> {
    faults: &'a [Fault],
    margin: u64,
}

impl Windows<'_> {
    /// Whether a fault that stops commands for a while (a stall, a restart; a pause of
    /// `child` only) comes within the margin of `[t0, t1]`. A killed connection does not
    /// count: the next try reconnects at once, so whatever was cut short finishes within
    /// round trips (and an acquire that failed on it is excused by its own rule).
    fn disturbed(&self, t0: u64, t1: u64, child: Option<usize>) -> bool {
        self.faults.iter().any(|f| {
            !f.kind.starts_with("kill_")
                && (f.child.is_none() || f.child == child)
                && f.begin <= t1 + self.margin
                && f.end + self.margin >= t0
        })
    }

    /// Time `child` was stopped within `[t0, t1]`.
    fn paused(&self, child: usize, t0: u64, t1: u64) -> u64 {
        self.faults
            .iter()
            .filter(|f| f.child == Some(child))
            .map(|f| t1.min(f.end).saturating_sub(t0.max(f.begin)))
            .sum()
    }
}

pub(crate) fn analyse(
    events: &[Event],
    mon: &Monitor,
    faults: &[Fault],
    problems: &[String],
) -> Report {
    let ct = cfg::COMMAND_TIMEOUT.as_micros() as u64;
    let windows = Windows {
        faults,
        margin: 2 * ct + 100_000,
    };
    let liveness = 2 * ct + 250_000;
    let tolerance = ct + 150_000;
    let bound = 4 * ct + 400_000;
    let end_ts = events.last().map_or(0, |e| e.ts);

    let mut findings: Vec<Finding> = Vec::new();
    let mut stats: Vec<String> = Vec::new();
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut count = |what: String| *counts.entry(what).or_default() += 1;

    // -- Assemble calls. ----------------------------------------------------------------
    let mut locks: Vec<LockCall> = Vec::new();
    let mut lock_of: HashMap<String, usize> = HashMap::new();
    let mut idems: Vec<IdemCall> = Vec::new();
    let mut idem_of: HashMap<String, usize> = HashMap::new();
    let mut restart_marks: Vec<usize> = Vec::new();
    let mut restart_begins: Vec<usize> = Vec::new();
    // Overlaps found in file order: (first holder, second holder).
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    let mut inside: HashMap<String, Vec<usize>> = HashMap::new();
    let mut bad: Vec<(String, String)> = Vec::new();
    for e in events {
        let call = e.get("call").unwrap_or("").to_owned();
        match e.kind.as_str() {
            "lk_try" => {
                lock_of.insert(call.clone(), locks.len());
                locks.push(LockCall {
                    call,
                    child: e.num("child").unwrap_or(0) as usize,
                    key: e.str("key").to_owned(),
                    renew: e.str("renew") == "1",
                    ttl_us: e.num("ttl").unwrap_or(0) * 1000,
                    wait_us: e.num("wait").unwrap_or(0) * 1000,
                    strict: e.str("strict") == "1",
                    outer: e.str("outer") != "-",
                    relto: e.str("relto") != "-",
                    try_idx: e.idx,
                    try_ts: e.ts,
                    ..LockCall::default()
                });
            }
            "lk_fail" | "lk_enter" | "lk_lost" | "lk_exit" | "lk_rel" | "lk_cancel" => {
                let Some(&i) = lock_of.get(&call) else {
                    continue;
                };
                let c = &mut locks[i];
                match e.kind.as_str() {
                    "lk_fail" => {
                        c.fail = Some(e.str("err").to_owned());
                        c.fail_ts = e.ts;
                        c.acq_dur = e.num("dur");
                        count(format!("lock acquire: {}", e.str("err")));
                    }
                    "lk_enter" => {
                        c.enter = Some((e.idx, e.ts));
                        c.token = Some(e.str("token").to_owned());
                        c.acq_dur = e.num("dur");
                        count("lock acquire: ok".to_owned());
                        let holders = inside.entry(c.key.clone()).or_default();
                        pairs.extend(holders.iter().map(|&a| (a, i)));
                        holders.push(i);
                    }
                    "lk_lost" => c.lost = true,
                    "lk_exit" => {
                        c.lost |= e.get("lost") == Some("1");
                        c.exit = Some((e.idx, e.ts, e.str("how").to_owned()));
                        if let Some(holders) = inside.get_mut(&c.key) {
                            holders.retain(|&h| h != i);
                        }
                        if c.lost {
                            count("lock body: told the lock was lost".to_owned());
                        }
                    }
                    "lk_rel" => {
                        c.rel = Some((e.str("res").to_owned(), e.ts, e.num("dur").unwrap_or(0)));
                        count(format!("lock release: {}", e.str("res")));
                    }
                    _ => {
                        let phase = e.str("phase").to_owned();
                        if phase == "release" && c.rel.is_none() {
                            c.rel = Some(("cancelled".to_owned(), e.ts, 0));
                            count("lock release: cancelled (outer timeout)".to_owned());
                        }
                        count(format!("lock call cancelled in: {phase}"));
                        c.cancel = Some(phase);
                    }
                }
            }
            "lk_bad" => bad.push((call, e.line.clone())),
            "id_try" => {
                idem_of.insert(call.clone(), idems.len());
                idems.push(IdemCall {
                    call,
                    child: e.num("child").unwrap_or(0) as usize,
                    key: e.str("key").to_owned(),
                    payload: e.num("payload").unwrap_or(0),
                    work_us: e.num("work").unwrap_or(0) * 1000,
                    timed: e.str("to") != "-",
                    try_idx: e.idx,
                    try_ts: e.ts,
                    ..IdemCall::default()
                });
            }
            "id_enter" | "id_exit" | "id_ret" => {
                let Some(&i) = idem_of.get(&call) else {
                    continue;
                };
                let c = &mut idems[i];
                match e.kind.as_str() {
                    "id_enter" => c.enter = Some((e.idx, e.ts)),
                    "id_exit" => c.exit = Some((e.idx, e.ts, e.str("how").to_owned())),
                    _ => {
                        count(format!("idempotent call: {}", e.str("res")));
                        c.ret = Some((
                            e.idx,
                            e.ts,
                            e.str("res").to_owned(),
                            e.num("rp"),
                            e.num("dur").unwrap_or(0),
                        ));
                    }
                }
            }
            "restart_begin" => {
                restart_marks.push(e.idx);
                restart_begins.push(e.idx);
            }
            "restart_end" => restart_marks.push(e.idx),
            _ => {}
        }
    }
    let restart_between = |a: usize, b: usize| restart_marks.iter().any(|&r| a < r && r < b);
    let epoch = |idx: usize| restart_begins.iter().filter(|&&r| r < idx).count();

    // -- Mutual exclusion. --------------------------------------------------------------
    let mut near_miss_max = 0u64;
    for &(a, b) in &pairs {
        let (first, second) = (&locks[a], &locks[b]);
        let (Some((a_enter, _)), Some((b_enter, b_at))) = (first.enter, second.enter) else {
            continue;
        };
        if restart_between(first.try_idx, a_enter)
            || restart_between(second.try_idx, b_enter)
            || epoch(first.try_idx) != epoch(second.try_idx)
        {
            count("overlap: across a restart (locks wiped)".to_owned());
            continue;
        }
        let token = first.token.as_deref().unwrap_or("");
        let lease_end =
            (first.try_ts + first.ttl_us).max(mon.expiry.get(token).copied().unwrap_or(0));
        let a_exit = first.exit.as_ref().map_or(end_ts, |x| x.1);
        if b_at + 15_000 < lease_end {
            findings.push(Finding {
                check: "early takeover",
                text: format!(
                    "{} took `{}` at {} while {} held it with a lease that could not end before {} \
                     ({:.1} ms later; {} tried at {}, ttl {} ms, renew {})",
                    second.call,
                    first.key,
                    b_at,
                    first.call,
                    lease_end,
                    ms(lease_end - b_at),
                    first.call,
                    first.try_ts,
                    first.ttl_us / 1000,
                    first.renew
                ),
                calls: vec![first.call.clone(), second.call.clone()],
            });
        } else if first.renew {
            if first.lost {
                count("overlap: renewed holder told it lost the lock".to_owned());
                continue;
            }
            let overlap = a_exit.saturating_sub(b_at);
            let effective = overlap.saturating_sub(windows.paused(first.child, b_at, a_exit));
            if effective <= tolerance {
                near_miss_max = near_miss_max.max(effective);
                count("overlap: renewed holder left before being told (near miss)".to_owned());
                continue;
            }
            findings.push(Finding {
                check: "unreported loss",
                text: format!(
                    "{} held `{}` (renew, ttl {} ms, taken from runtime {}) and was never told \
                     the lock was lost (lost() never fired, is_held() stayed true), yet {} held \
                     the same key during {:.1} ms of its body ({} ms after subtracting pauses); \
                     {}'s release: {}",
                    first.call,
                    first.key,
                    first.ttl_us / 1000,
                    runtime_of(&first.call),
                    second.call,
                    ms(overlap),
                    effective / 1000,
                    first.call,
                    first.rel.as_ref().map_or("none", |r| r.0.as_str())
                ),
                calls: vec![first.call.clone(), second.call.clone()],
            });
        } else {
            match first.rel.as_ref().map(|r| r.0.as_str()) {
                Some("ok") => findings.push(Finding {
                    check: "release said Ok",
                    text: format!(
                        "{} held `{}` (ttl {} ms) and {} took it during {}'s body, yet {}'s \
                         release returned Ok",
                        first.call,
                        first.key,
                        first.ttl_us / 1000,
                        second.call,
                        first.call,
                        first.call
                    ),
                    calls: vec![first.call.clone(), second.call.clone()],
                }),
                _ => count(
                    "overlap: plain lock past its ttl, loss reported at release (or unknown)"
                        .to_owned(),
                ),
            }
        }
    }

    // -- Liveness of the keys. ----------------------------------------------------------
    struct TokenSeen {
        key: usize,
        born: u64,
        last: u64,
    }
    let mut tokens: HashMap<&str, TokenSeen> = HashMap::new();
    for s in &mon.seen {
        let t = tokens.entry(s.token.as_str()).or_insert(TokenSeen {
            key: s.key,
            born: s.first_recv,
            last: s.last_send,
        });
        t.born = t.born.min(s.first_recv);
        t.last = t.last.max(s.last_send);
    }
    let by_token: HashMap<&str, usize> = locks
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.token.as_deref().map(|t| (t, i)))
        .collect();
    let strict: HashMap<usize, bool> = locks.iter().map(|c| (c.child, c.strict)).collect();
    let mut checked = (0u64, 0u64);
    // The worst value seen by each liveness check (how close the run came to `liveness`).
    let mut closest = [0u64; 3];
    for (token, seen) in &tokens {
        if token.starts_with("yield: ") {
            continue;
        }
        let child = token
            .rsplit(':')
            .next()
            .and_then(|h| h.strip_prefix("chaos-c"))
            .and_then(|c| c.parse::<usize>().ok());
        let key_name = cfg::LOCK_KEYS[seen.key];
        let call = by_token.get(token).map(|&i| &locks[i]);
        if !windows.disturbed(seen.born, seen.born + liveness, child) {
            checked.0 += 1;
            match call {
                Some(c) => {
                    let entered = c.enter.map_or(end_ts, |x| x.1);
                    closest[0] = closest[0].max(entered.saturating_sub(seen.born));
                    if entered > seen.born + liveness {
                        findings.push(Finding {
                            check: "handed-over key idle",
                            text: format!(
                                "`{}{key_name}` held {}'s token from {} but {}'s acquire returned only at {} \
                                 ({:.1} ms later, with no fault near): the key idled under a token whose \
                                 call did not have the lock",
                                cfg::PREFIX,
                                c.call,
                                seen.born,
                                c.call,
                                entered,
                                ms(entered - seen.born)
                            ),
                            calls: vec![c.call.clone()],
                        });
                    }
                }
                None if child.is_some_and(|c| strict.get(&c).copied().unwrap_or(false)) => {
                    let failed_nearby = locks.iter().any(|c| {
                        Some(c.child) == child
                            && c.key == key_name
                            && c.fail.as_deref() == Some("backend")
                            && c.fail_ts + liveness >= seen.born
                            && c.fail_ts <= seen.born + liveness
                    });
                    if !failed_nearby {
                        closest[1] = closest[1].max(seen.last.saturating_sub(seen.born));
                    }
                    if seen.last > seen.born + liveness && !failed_nearby {
                        findings.push(Finding {
                            check: "orphan token",
                            text: format!(
                                "`{}{key_name}` held token {token} (child {}, which never cancels an \
                                 acquisition) for {:.1} ms from {}, with no fault near, and no call ever \
                                 held the lock under it",
                                cfg::PREFIX,
                                child.unwrap_or(99),
                                ms(seen.last - seen.born),
                                seen.born
                            ),
                            calls: Vec::new(),
                        });
                    }
                }
                None => {}
            }
        }
        if let Some(c) = call
            && let Some((_, left, how)) = &c.exit
            && c.rel.as_ref().is_none_or(|r| r.0 != "backend")
            && !windows.disturbed(*left, left + liveness, child)
        {
            checked.1 += 1;
            closest[2] = closest[2].max(seen.last.saturating_sub(*left));
            if seen.last > left + liveness {
                findings.push(Finding {
                    check: "release did not release",
                    text: format!(
                        "`{}{key_name}` still held {}'s token {:.1} ms after it left its body \
                         (body {how}; release: {}), with no fault near",
                        cfg::PREFIX,
                        c.call,
                        ms(seen.last - left),
                        c.rel.as_ref().map_or("none", |r| r.0.as_str())
                    ),
                    calls: vec![c.call.clone()],
                });
            }
        }
    }

    // -- Idempotency. -------------------------------------------------------------------
    let mut bodies: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, c) in idems.iter().enumerate() {
        if c.enter.is_some() {
            bodies.entry(c.key.as_str()).or_default().push(i);
        }
        if let Some((_, _, res, Some(rp), _)) = &c.ret
            && res == "replay"
            && *rp != c.payload
        {
            findings.push(Finding {
                check: "replayed another payload",
                text: format!(
                    "{} (payload {}) got the stored result of payload {rp} for `{}`",
                    c.call, c.payload, c.key
                ),
                calls: vec![c.call.clone()],
            });
        }
    }
    for runs in bodies.values_mut() {
        runs.sort_by_key(|&i| idems[i].enter.map_or(0, |e| e.0));
        for w in runs.windows(2) {
            let (prev, next) = (&idems[w[0]], &idems[w[1]]);
            let next_enter = next.enter.map_or(0, |e| e.0);
            if restart_between(prev.try_idx, next_enter) {
                count("idempotent rerun: across a restart (records wiped)".to_owned());
                continue;
            }
            if next.payload != prev.payload {
                // Handled below against every earlier body of another payload.
                continue;
            }
            let completed = prev.ret.as_ref().is_some_and(|(idx, at, res, _, _)| {
                res == "ran"
                    && *idx < next.try_idx
                    && !windows.disturbed(prev.try_ts, *at, Some(prev.child))
            });
            if completed {
                findings.push(Finding {
                    check: "ran twice",
                    text: format!(
                        "{} ran the body of `{}` (payload {}) again after {}'s call had returned its own \
                         Ok result, with no fault near that call: it should have been replayed",
                        next.call, next.key, next.payload, prev.call
                    ),
                    calls: vec![prev.call.clone(), next.call.clone()],
                });
            } else {
                count("idempotent rerun: same payload (claim released or lost)".to_owned());
            }
        }
    }

    // Another payload may run only once every earlier body of another payload had given
    // its own claim back (its body returned `Err` or was dropped) before it entered:
    // otherwise that body may have acted on its payload (it ran to its end, or was still
    // running), whatever became of its record since.
    for runs in bodies.values() {
        for (at, &n) in runs.iter().enumerate() {
            let next = &idems[n];
            let next_enter = next.enter.map_or(0, |e| e.0);
            let acted = runs[..at].iter().rev().map(|&p| &idems[p]).find(|prev| {
                prev.payload != next.payload
                    && !restart_between(prev.try_idx, next_enter)
                    && !prev.exit.as_ref().is_some_and(|(idx, _, how)| {
                        *idx < next_enter && (how == "err" || how == "dropped")
                    })
            });
            let Some(prev) = acted else {
                if runs[..at].iter().any(|&p| idems[p].payload != next.payload) {
                    count("idempotent rerun: other payload after a released claim".to_owned());
                }
                continue;
            };
            findings.push(Finding {
                check: "other payload ran",
                text: format!(
                    "{} ran the body of `{}` with payload {} although {} had run it with payload {} \
                     (its body {}; its call returned {})",
                    next.call,
                    next.key,
                    next.payload,
                    prev.call,
                    prev.payload,
                    match &prev.exit {
                        Some((idx, _, how)) if *idx < next_enter => format!("had ended: {how}"),
                        _ => "was still running".to_owned(),
                    },
                    match prev.ret.as_ref().map(|r| r.2.as_str()) {
                        Some("ran") => "its own Ok: that caller was never told",
                        Some("lost") => "Lost: that caller was told, after its body had run",
                        Some(other) => other,
                        None => "nothing yet",
                    }
                ),
                calls: vec![prev.call.clone(), next.call.clone()],
            });
        }
    }

    // -- Reentrancy. --------------------------------------------------------------------
    for (call, line) in bad {
        findings.push(Finding {
            check: "reentrancy",
            text: format!("nested acquisition did not re-enter: {line}"),
            calls: vec![call],
        });
    }

    // -- Bounds. ------------------------------------------------------------------------
    let mut worst = [
        (0i64, String::new()),
        (0, String::new()),
        (0, String::new()),
    ];
    // A call of kind `k` (acquire, release, idempotent) that took `over` µs past what it
    // may take: the worst of its kind so far, and a finding past `bound`.
    let mut slow = |k: usize, over: i64, call: &str, text: &dyn Fn() -> String| {
        if over > worst[k].0 {
            worst[k] = (over, call.to_owned());
        }
        if over > bound as i64 {
            findings.push(Finding {
                check: "slow call",
                text: text(),
                calls: vec![call.to_owned()],
            });
        }
    };
    for c in &locks {
        if c.outer {
            continue;
        }
        if let Some(dur) = c.acq_dur {
            let stopped = windows.paused(c.child, c.try_ts, c.try_ts + dur);
            let over = dur as i64 - c.wait_us as i64 - stopped as i64;
            slow(0, over, &c.call, &|| {
                format!(
                    "{}'s acquire took {:.1} ms with wait {} ms ({} ms past its wait; bound {} ms)",
                    c.call,
                    ms(dur),
                    c.wait_us / 1000,
                    over / 1000,
                    bound / 1000
                )
            });
        }
        if let Some((res, at, dur)) = &c.rel
            && !c.relto
            && res != "cancelled"
        {
            let stopped = windows.paused(c.child, at.saturating_sub(*dur), *at);
            let over = *dur as i64 - stopped as i64;
            slow(1, over, &c.call, &|| {
                format!(
                    "{}'s release took {:.1} ms (bound {} ms)",
                    c.call,
                    ms(*dur),
                    bound / 1000
                )
            });
        }
    }
    let idem_wait = cfg::IDEM_WAIT_MS * 1000;
    for c in &idems {
        let Some((_, at, res, _, dur)) = &c.ret else {
            continue;
        };
        if c.timed || res == "cancelled" {
            continue;
        }
        let stopped = windows.paused(c.child, at.saturating_sub(*dur), *at);
        let over = *dur as i64 - (idem_wait + c.work_us) as i64 - stopped as i64;
        slow(2, over, &c.call, &|| {
            format!(
                "{}'s idempotent call took {:.1} ms (wait {} ms + body {} ms + bound {} ms)",
                c.call,
                ms(*dur),
                cfg::IDEM_WAIT_MS,
                c.work_us / 1000,
                bound / 1000
            )
        });
    }

    // -- End state and monitor. ---------------------------------------------------------
    for p in problems {
        findings.push(Finding {
            check: "end state",
            text: p.clone(),
            calls: Vec::new(),
        });
    }
    for b in mon.bad.iter().take(20) {
        findings.push(Finding {
            check: "lock key ttl",
            text: b.clone(),
            calls: Vec::new(),
        });
    }

    // -- Stats. -------------------------------------------------------------------------
    let mut kinds: BTreeMap<&str, u64> = BTreeMap::new();
    for f in faults {
        *kinds.entry(f.kind).or_default() += 1;
    }
    stats.push(format!(
        "faults: {}",
        kinds
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    ));
    stats.push(format!(
        "lock calls: {}, idempotent calls: {}, bodies overlapping another: {} pairs",
        locks.len(),
        idems.len(),
        pairs.len()
    ));
    for (what, n) in &counts {
        stats.push(format!("{what}: {n}"));
    }
    stats.push(format!(
        "near misses: longest {:.1} ms (tolerance {} ms)",
        ms(near_miss_max),
        tolerance / 1000
    ));
    stats.push(format!(
        "monitor: {} samples, {} errors, {} tokens seen; liveness checked for {} new tokens and {} releases \
         (fault-free windows)",
        mon.samples,
        mon.errors,
        tokens.len(),
        checked.0,
        checked.1
    ));
    stats.push(format!(
        "liveness, worst seen (limit {} ms): token in the key before its acquire returned {:.1} ms, \
         strict child's token never entered {:.1} ms, token left after its body {:.1} ms",
        liveness / 1000,
        ms(closest[0]),
        ms(closest[1]),
        ms(closest[2])
    ));
    stats.push(format!(
        "longest past bound: acquire {:.1} ms past wait ({}), release {:.1} ms ({}), idempotent {:.1} ms past \
         wait+body ({}); bound {} ms",
        worst[0].0 as f64 / 1000.0,
        worst[0].1,
        worst[1].0 as f64 / 1000.0,
        worst[1].1,
        worst[2].0 as f64 / 1000.0,
        worst[2].1,
        bound / 1000
    ));
    Report { findings, stats }
}

/// `c0r1w2n7` -> 1.
fn runtime_of(call: &str) -> &str {
    call.split_once('r')
        .and_then(|(_, rest)| rest.split_once('w'))
        .map_or("?", |(rt, _)| rt)
}

impl Report {
    /// The violations, grouped by check, each with the events of the calls involved.
    pub(crate) fn render(&self, events: &[Event]) -> String {
        let mut by_check: BTreeMap<&str, Vec<&Finding>> = BTreeMap::new();
        for f in &self.findings {
            by_check.entry(f.check).or_default().push(f);
        }
        let mut out = String::from("\n=== chaos violations ===\n");
        for (check, found) in &by_check {
            out.push_str(&format!("\n## {check}: {} violation(s)\n", found.len()));
            let h = hint(check);
            if !h.is_empty() {
                out.push_str(&format!("   ({h})\n"));
            }
            for f in found.iter().take(4) {
                out.push_str(&format!("- {}\n", f.text));
                for call in &f.calls {
                    let needle = format!("call={call} ");
                    for e in events.iter().filter(|e| {
                        e.line.contains(&needle) || e.line.ends_with(&format!("call={call}"))
                    }) {
                        out.push_str(&format!("    {}\n", e.line));
                    }
                }
            }
            if found.len() > 4 {
                out.push_str(&format!("  ... and {} more\n", found.len() - 4));
            }
        }
        out
    }
}
