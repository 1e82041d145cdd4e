//! Fair queueing of one client's tasks for one key, and handing the lock down the queue.
//!
//! Tasks of one [`Locks`](crate::Locks) client that want the same key line up in a FIFO
//! queue, and only the task whose turn it is contends in Redis. A task that has just
//! released cannot barge ahead of local waiters: it queues behind them. When the holder
//! releases while a local task waits, the release script gives the lock straight to that
//! task (its token and its ttl) in the same round trip, and the task is woken
//! in process holding it: one round trip per local handoff.
//!
//! A client's turn is bounded: it hands the lock down at most once to each task that was
//! waiting when its turn began. Then, if another client waits for the key, the release
//! leaves the lock to the other clients (see `yield_window` on the builder) and the next
//! local task contends like everyone else.
//!
//! The queue never outlives the holder's lease: once the lease the holder took has run
//! out (a holder stuck past its ttl, without `renew`), local waiters stop waiting for its
//! turn and contend in Redis, exactly as other processes may.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::backend::Successor;
use crate::watchdog::HeldState;

#[derive(Default)]
pub(crate) struct LocalQueues {
    keys: Mutex<HashMap<Arc<str>, Arc<Entry>>>,
}

#[derive(Default)]
struct Entry {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Some task has the turn: it holds the lock or contends for it.
    busy: bool,
    waiters: VecDeque<Waiter>,
    /// The current holder's lease, as far as this process knows it.
    lease: Option<HolderLease>,
    /// Local handoffs left in this client's turn.
    budget: usize,
    /// Until when this client left the lock to the other clients (its yield window).
    left_to_others: Option<Instant>,
}

impl State {
    /// Waiters that have not given up.
    fn live_waiters(&self) -> usize {
        self.waiters.iter().filter(|w| !w.tx.is_closed()).count()
    }

    /// Whether the holder's lease is known to have run out.
    fn lease_over(&self, now: Instant) -> bool {
        self.lease.as_ref().is_some_and(|l| l.is_over(now))
    }
}

struct Waiter {
    token: Arc<str>,
    ttl: Duration,
    tx: oneshot::Sender<Wake>,
}

enum Wake {
    /// Contend in Redis.
    Turn,
    /// The previous holder handed the lock over at this instant.
    Granted(Instant),
}

/// How long the holder of a turn holds its lock.
pub(crate) enum HolderLease {
    /// Until this instant (not renewed).
    Until(Instant),
    /// Renewed until released or found lost.
    Renewed(Arc<HeldState>),
}

impl HolderLease {
    fn is_over(&self, now: Instant) -> bool {
        match self {
            HolderLease::Until(end) => *end <= now,
            HolderLease::Renewed(state) => state.is_lost(),
        }
    }

    fn end(&self) -> Option<Instant> {
        match self {
            HolderLease::Until(end) => Some(*end),
            HolderLease::Renewed(_) => None,
        }
    }
}

/// What waiting in the local queue came to.
pub(crate) enum Entered {
    /// Contend in Redis. Without the turn when the holder's lease ran out before this
    /// task queued.
    Contend(Turn),
    /// The holder's lease ran out while this task waited: contend in Redis, without the
    /// turn and under a new token. The holder's release may still hand the lock to the
    /// token this task queued with, find it gone and release it: the lock must never
    /// count as this task's then.
    LeaseOver(Turn),
    /// The previous holder handed the lock over: held since this instant.
    Granted(Turn, Instant),
    /// The deadline passed first.
    Busy,
}

/// What to do with a lock that was handed to a waiter which had just given up.
pub(crate) type Orphan = Box<dyn FnOnce(Turn, Instant) + Send>;

/// A task's turn at the head of a key's local queue; dropping it passes the turn on.
pub(crate) struct Turn {
    entry: Arc<Entry>,
    key: Arc<str>,
    queues: Arc<LocalQueues>,
    /// Whether this is the queue's turn (false: contending because a lease ran out).
    owns: bool,
}

/// The waiter a release may hand the lock to.
pub(crate) struct Next {
    token: Arc<str>,
    ttl: Duration,
    tx: oneshot::Sender<Wake>,
    turn_over: bool,
}

impl Next {
    pub(crate) fn token(&self) -> &Arc<str> {
        &self.token
    }

    pub(crate) fn successor(&self) -> Successor<'_> {
        Successor {
            token: &self.token,
            ttl: self.ttl,
            turn_over: self.turn_over,
        }
    }
}

fn lock(entry: &Entry) -> MutexGuard<'_, State> {
    crate::util::lock(&entry.state)
}

impl Turn {
    /// Records the lease of a lock taken in Redis; the client's turn starts, with one
    /// handoff for each task waiting now.
    pub(crate) fn begin(&self, lease: HolderLease) {
        let mut st = lock(&self.entry);
        st.lease = Some(lease);
        if self.owns {
            st.budget = st.live_waiters();
        }
    }

    /// Records the lease of the lock this turn holds.
    pub(crate) fn set_lease(&self, lease: HolderLease) {
        lock(&self.entry).lease = Some(lease);
    }

    /// The first waiter still waiting, taken out of the queue for a release to hand the
    /// lock to. Give it back with [`give_turn`](Self::give_turn) or [`grant`](Self::grant).
    pub(crate) fn next(&self) -> Option<Next> {
        if !self.owns {
            return None;
        }
        let mut st = lock(&self.entry);
        while let Some(w) = st.waiters.pop_front() {
            if !w.tx.is_closed() {
                return Some(Next {
                    token: w.token,
                    ttl: w.ttl,
                    tx: w.tx,
                    turn_over: st.budget == 0,
                });
            }
        }
        None
    }

    /// The release handed the lock to `next`: its turn starts now. `false` when it had
    /// given up meanwhile (the lock, under its token, is then the caller's to release).
    pub(crate) fn grant(&mut self, next: Next, at: Instant) -> bool {
        let mut st = lock(&self.entry);
        if next.tx.send(Wake::Granted(at)).is_err() {
            return false;
        }
        st.lease = Some(HolderLease::Until(at + next.ttl));
        st.budget = if next.turn_over {
            st.live_waiters()
        } else {
            st.budget.saturating_sub(1)
        };
        self.owns = false; // the turn went with the lock
        true
    }

    /// The release left the lock to the other clients until `until`: whoever contends
    /// next in this client waits for a release message or that instant before trying.
    pub(crate) fn left_to_others(&self, until: Instant) {
        lock(&self.entry).left_to_others = Some(until);
    }

    /// Until when this client's last release left the lock to the others, if that is
    /// still ahead.
    pub(crate) fn left_to_others_until(&self) -> Option<Instant> {
        let until = lock(&self.entry).left_to_others?;
        (until > Instant::now()).then_some(until)
    }

    /// The release did not hand the lock over (or cannot tell): `next` goes back to the
    /// front of the queue, to get the turn when this one ends. Its token when it had
    /// given up meanwhile.
    pub(crate) fn give_back(&self, next: Next) -> Option<Arc<str>> {
        if next.tx.is_closed() {
            return Some(next.token);
        }
        lock(&self.entry).waiters.push_front(Waiter {
            token: next.token,
            ttl: next.ttl,
            tx: next.tx,
        });
        None
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut st = lock(&self.entry);
        if self.owns {
            let mut passed = false;
            while let Some(w) = st.waiters.pop_front() {
                if w.tx.send(Wake::Turn).is_ok() {
                    passed = true;
                    break;
                }
            }
            if !passed {
                st.busy = false;
                st.lease = None;
                st.budget = 0;
            }
        }
        let idle = !st.busy && st.waiters.is_empty();
        drop(st);
        if idle {
            let mut keys = crate::util::lock(&self.queues.keys);
            // Only the map and this turn hold it (every waiter holds it too, and taking it
            // from the map needs this lock): nobody can have changed it since, forget it.
            if keys.get(&*self.key).is_some_and(|entry| {
                Arc::ptr_eq(entry, &self.entry) && Arc::strong_count(entry) == 2
            }) {
                keys.remove(&*self.key);
            }
        }
    }
}

/// A place in the queue; dropped before its wake-up was taken, it passes the turn on or
/// hands the lock it was given to its orphan handler.
struct Place {
    rx: Option<oneshot::Receiver<Wake>>,
    orphan: Option<Orphan>,
    turn: Option<Turn>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        rx.close();
        let Ok(wake) = rx.try_recv() else {
            return;
        };
        let Some(mut turn) = self.turn.take() else {
            return;
        };
        turn.owns = true;
        match wake {
            Wake::Turn => drop(turn),
            Wake::Granted(at) => {
                if let Some(orphan) = self.orphan.take() {
                    orphan(turn, at);
                }
            }
        }
    }
}

impl LocalQueues {
    fn entry(&self, key: &Arc<str>) -> Arc<Entry> {
        let mut keys = crate::util::lock(&self.keys);
        if let Some(entry) = keys.get(&**key) {
            return entry.clone();
        }
        keys.entry(key.clone()).or_default().clone()
    }

    /// Waits for this task's turn until `deadline` (with `deadline` already past: one
    /// immediate try). `token` and `ttl` are what a release handing the lock to this task
    /// writes; `orphan` takes a lock handed over just as this wait was given up.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        key: &Arc<str>,
        token: &Arc<str>,
        ttl: Duration,
        deadline: Instant,
        orphan: impl FnOnce(Turn, Instant) + Send + 'static,
        template: &'static str,
    ) -> Entered {
        let entry = self.entry(key);
        let turn = |owns| Turn {
            entry: entry.clone(),
            key: key.clone(),
            queues: self.clone(),
            owns,
        };
        let rx = {
            let mut st = lock(&entry);
            if !st.busy {
                st.busy = true;
                drop(st);
                return Entered::Contend(turn(true));
            }
            let now = Instant::now();
            if st.lease_over(now) {
                drop(st);
                return Entered::Contend(turn(false));
            }
            if now >= deadline {
                drop(st);
                drop(turn(false)); // tidies the map
                return Entered::Busy;
            }
            let (tx, rx) = oneshot::channel();
            st.waiters.retain(|w| !w.tx.is_closed());
            st.waiters.push_back(Waiter {
                token: token.clone(),
                ttl,
                tx,
            });
            rx
        };
        // Counted as waiting while in line (a free key is entered without waiting).
        let _waiting = crate::metrics::Waiting::start(template);
        let mut place = Place {
            rx: Some(rx),
            orphan: Some(Box::new(orphan)),
            turn: Some(turn(false)),
        };
        loop {
            let rx = place.rx.as_mut().expect("taken only on return");
            let now = Instant::now();
            // Re-check the holder's lease at least every 100 ms (a new holder may have
            // taken a shorter one).
            let lease_end = lock(&entry).lease.as_ref().and_then(HolderLease::end);
            let until = lease_end
                .unwrap_or(deadline)
                .min(deadline)
                .min(now + Duration::from_millis(100));
            let woken = match tokio::time::timeout_at(until, &mut *rx).await {
                Ok(Ok(wake)) => Some(wake),
                // The release holding this waiter dropped it without a word (it could
                // not finish): contend, under the queued token, which that release may
                // have written into the key.
                Ok(Err(_)) => None,
                Err(_elapsed) => {
                    let now = Instant::now();
                    let over = lock(&entry).lease_over(now);
                    if !over && now < deadline {
                        continue;
                    }
                    // Leaving: a wake-up that raced with the timer still counts.
                    rx.close();
                    match rx.try_recv() {
                        Ok(wake) => Some(wake),
                        Err(_) if over => {
                            place.rx = None;
                            let turn = place.turn.take().expect("taken only on return");
                            return Entered::LeaseOver(turn);
                        }
                        Err(_) => {
                            place.rx = None;
                            return Entered::Busy;
                        }
                    }
                }
            };
            place.rx = None;
            let mut turn = place.turn.take().expect("taken only on return");
            return match woken {
                Some(Wake::Turn) => {
                    turn.owns = true;
                    Entered::Contend(turn)
                }
                Some(Wake::Granted(at)) => {
                    turn.owns = true;
                    Entered::Granted(turn, at)
                }
                None => Entered::Contend(turn),
            };
        }
    }

    /// Keys with a queue right now (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        crate::util::lock(&self.keys).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never(_: Turn, _: Instant) {}

    async fn enter(q: &Arc<LocalQueues>, deadline: Instant) -> Entered {
        q.enter(
            &Arc::from("k"),
            &Arc::from("t"),
            Duration::from_secs(1),
            deadline,
            never,
            "t",
        )
        .await
    }

    fn contend(e: Entered) -> Turn {
        match e {
            Entered::Contend(t) => t,
            _ => panic!("expected the turn"),
        }
    }

    #[tokio::test]
    async fn fifo_and_tidy() {
        let q = Arc::new(LocalQueues::default());
        let far = Instant::now() + Duration::from_secs(5);
        let first = contend(enter(&q, far).await);
        assert!(
            matches!(enter(&q, Instant::now()).await, Entered::Busy),
            "held: an immediate try fails"
        );
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (q, order) = (q.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let t = contend(enter(&q, far).await);
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(1)).await;
                drop(t);
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        assert_eq!(q.len(), 0);
    }

    /// Waits longer than the 100 ms lease re-check keep their place in the queue.
    #[tokio::test]
    async fn long_waits_keep_fifo_order() {
        let q = Arc::new(LocalQueues::default());
        let far = Instant::now() + Duration::from_secs(10);
        let first = contend(enter(&q, far).await);
        first.set_lease(HolderLease::Until(far));
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let (q, order) = (q.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let t = contend(enter(&q, far).await);
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(130)).await;
                drop(t);
            }));
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
    }

    /// A handoff wakes the next waiter holding the lock; one whose wait timed out is
    /// skipped; the turn's budget is one handoff per task waiting when it began.
    #[tokio::test]
    async fn grants_skip_leavers_and_count_the_turn() {
        let q = Arc::new(LocalQueues::default());
        let far = Instant::now() + Duration::from_secs(5);
        let mut holder = contend(enter(&q, far).await);
        let soon = Instant::now() + Duration::from_millis(20);
        let leaver = tokio::spawn({
            let q = q.clone();
            async move { matches!(enter(&q, soon).await, Entered::Busy) }
        });
        let waiter = tokio::spawn({
            let q = q.clone();
            async move {
                match enter(&q, far).await {
                    Entered::Granted(turn, at) => (turn, at),
                    _ => panic!("expected a grant"),
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        holder.begin(HolderLease::Until(far));
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(leaver.await.unwrap(), "the leaver timed out");
        let next = holder.next().expect("the waiter");
        assert!(!next.turn_over, "one handoff left in this turn");
        let at = Instant::now();
        assert!(holder.grant(next, at));
        drop(holder);
        let (turn, granted_at) = waiter.await.unwrap();
        assert_eq!(granted_at, at);
        assert!(turn.next().is_none());
        drop(turn);
        assert_eq!(q.len(), 0);
    }

    /// A waiter dropped after the lock was handed to it gives the lock to its orphan
    /// handler, which owns the turn.
    #[tokio::test]
    async fn a_grant_to_a_dropped_waiter_reaches_the_orphan_handler() {
        let q = Arc::new(LocalQueues::default());
        let far = Instant::now() + Duration::from_secs(5);
        let mut holder = contend(enter(&q, far).await);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut waiting = Box::pin({
            let q = q.clone();
            async move {
                q.enter(
                    &Arc::from("k"),
                    &Arc::from("w"),
                    Duration::from_secs(1),
                    far,
                    move |t, at| {
                        tx.send((t.owns, at)).unwrap();
                    },
                    "t",
                )
                .await
            }
        });
        let queued = tokio::time::timeout(Duration::from_millis(10), waiting.as_mut()).await;
        assert!(queued.is_err(), "still waiting");
        let next = holder.next().unwrap();
        let at = Instant::now();
        assert!(holder.grant(next, at));
        drop(waiting);
        assert_eq!(rx.try_recv().unwrap(), (true, at));
    }
}

/// One client's waiters for semaphores, key by key: the first in line contends in
/// Redis while the others wait their turn in FIFO order (tokio's fair mutex), and a
/// task that takes a permit passes the line on at once, so the next tries for another.
/// A task that does not wait (`wait` zero) tries once without queueing.
#[derive(Default)]
pub(crate) struct Lines {
    keys: Mutex<HashMap<Arc<str>, Arc<tokio::sync::Mutex<()>>>>,
}

/// A task at the head of a key's line; dropping it lets the next one in.
pub(crate) struct InLine {
    lines: Arc<Lines>,
    key: Arc<str>,
    /// Taken (and dropped) under the map's lock when this task leaves.
    line: Option<Arc<tokio::sync::Mutex<()>>>,
    head: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Lines {
    /// Waits until `key`'s line reaches this task: `None` when `deadline` passes first.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        key: &Arc<str>,
        deadline: Instant,
        template: &'static str,
    ) -> Option<InLine> {
        let mut entered = InLine {
            lines: self.clone(),
            key: key.clone(),
            line: Some(
                crate::util::lock(&self.keys)
                    .entry(key.clone())
                    .or_default()
                    .clone(),
            ),
            head: None,
        };
        // A free line is entered at once, even past the deadline (`timeout_at` polls
        // the lock first). Given up, `entered` leaves the map if it was the last.
        let line = entered.line.clone().expect("set above");
        let head = match line.clone().try_lock_owned() {
            Ok(head) => head,
            // Counted as waiting while in line.
            Err(_) => {
                let _waiting = crate::metrics::Waiting::start(template);
                tokio::time::timeout_at(deadline, line.lock_owned())
                    .await
                    .ok()?
            }
        };
        entered.head = Some(head);
        Some(entered)
    }
}

impl Drop for InLine {
    fn drop(&mut self) {
        self.head = None;
        let mut keys = crate::util::lock(&self.lines.keys);
        // Dropped under the map's lock, so two tasks leaving at once see each other
        // gone: the map's own is then the last, and nobody else is in line (a task
        // joining takes the map's lock first).
        drop(self.line.take());
        if keys
            .get(&self.key)
            .is_some_and(|line| Arc::strong_count(line) == 1)
        {
            keys.remove(&self.key);
        }
    }
}
