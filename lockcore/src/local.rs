//! Fair queueing of one process's tasks for one key.
//!
//! Tasks of one [`Locks`](crate::Locks) client that want the same key line up in a FIFO
//! queue (tokio's fair semaphore), and only the head of the queue contends in Redis. A
//! task that has just released cannot barge ahead of local waiters: it queues behind them.
//! Across processes there is no queue: each process's head is woken by the release
//! message and the first `SET NX` to arrive wins.
//!
//! The queue never outlives the holder's lease: once the lease the holder took has run
//! out (a holder stuck past its ttl, without `renew`), local waiters stop waiting for its
//! turn and contend in Redis, exactly as other processes may.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::Instant;

use crate::watchdog::HeldState;

#[derive(Default)]
pub(crate) struct LocalQueues {
    keys: Mutex<HashMap<String, Arc<Entry>>>,
}

struct Entry {
    sem: Arc<Semaphore>,
    /// The current holder's lease, as far as this process knows it.
    lease: Mutex<Option<Lease>>,
}

/// How long the holder of a turn holds its lock.
pub(crate) enum Lease {
    /// Until this instant (not renewed).
    Until(Instant),
    /// Renewed until released or found lost.
    Renewed(Arc<HeldState>),
}

impl Lease {
    fn is_over(&self, now: Instant) -> bool {
        match self {
            Lease::Until(end) => *end <= now,
            Lease::Renewed(state) => state.is_lost(),
        }
    }
}

/// This task's turn at the head of a key's local queue; the next task's turn starts
/// when it is dropped.
pub(crate) struct Turn {
    permit: Option<OwnedSemaphorePermit>,
    entry: Arc<Entry>,
    key: String,
    queues: Arc<LocalQueues>,
}

impl Turn {
    /// Records the lease just taken, so waiters know when to stop waiting for this turn.
    pub(crate) fn set_lease(&self, lease: Option<Lease>) {
        *self.entry.lease.lock().unwrap_or_else(|e| e.into_inner()) = lease;
    }
}

impl LocalQueues {
    fn entry(&self, key: &str) -> Arc<Entry> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.entry(key.to_owned())
            .or_insert_with(|| {
                Arc::new(Entry {
                    sem: Arc::new(Semaphore::new(1)),
                    lease: Mutex::new(None),
                })
            })
            .clone()
    }

    /// Waits for this task's turn until `deadline`; `None` when the deadline passed first
    /// (with `deadline` already past: one immediate try). When the holder's lease runs
    /// out first, the turn comes without the queue's permit.
    pub(crate) async fn enter(self: &Arc<Self>, key: &str, deadline: Instant) -> Option<Turn> {
        let entry = self.entry(key);
        let mut permit = None;
        let mut granted = false;
        // One pending wait for the whole loop: re-checking the holder's lease must not
        // send this task to the back of the queue.
        let mut pending = std::pin::pin!(entry.sem.clone().acquire_owned());
        loop {
            match entry.sem.clone().try_acquire_owned() {
                Ok(p) => {
                    permit = Some(p);
                    granted = true;
                    break;
                }
                Err(TryAcquireError::Closed) => break,
                Err(TryAcquireError::NoPermits) => {}
            }
            let now = Instant::now();
            let (over, lease_end) = match &*entry.lease.lock().unwrap_or_else(|e| e.into_inner()) {
                Some(lease) => (
                    lease.is_over(now),
                    match lease {
                        Lease::Until(end) => Some(*end),
                        Lease::Renewed(_) => None,
                    },
                ),
                None => (false, None),
            };
            if over {
                granted = true; // the holder's lease is over: contend without the permit
                break;
            }
            if now >= deadline {
                break;
            }
            // Re-check the holder's lease at least every 100 ms (a new holder may have
            // taken a shorter one).
            let until = lease_end
                .unwrap_or(deadline)
                .min(deadline)
                .min(now + std::time::Duration::from_millis(100));
            match tokio::time::timeout_at(until, pending.as_mut()).await {
                Ok(Ok(p)) => {
                    permit = Some(p);
                    granted = true;
                    break;
                }
                Ok(Err(_closed)) => break,
                Err(_elapsed) => {}
            }
        }
        let turn = Turn {
            permit,
            entry,
            key: key.to_owned(),
            queues: self.clone(),
        };
        // Without a turn, dropping it here also tidies the map.
        granted.then_some(turn)
    }

    /// Keys with a queue right now (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.keys.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if self.permit.take().is_some() {
            self.set_lease(None);
        }
        let mut keys = self.queues.keys.lock().unwrap_or_else(|e| e.into_inner());
        // Only the map and this turn hold it, and nobody holds the permit: forget the key.
        if keys.get(&self.key).is_some_and(|entry| {
            Arc::ptr_eq(entry, &self.entry)
                && Arc::strong_count(entry) == 2
                && entry.sem.available_permits() == 1
        }) {
            keys.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn fifo_and_tidy() {
        let q = Arc::new(LocalQueues::default());
        let far = Instant::now() + Duration::from_secs(5);
        let first = q.enter("k", far).await.unwrap();
        assert!(
            q.enter("k", Instant::now()).await.is_none(),
            "held: an immediate try fails"
        );
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (q, order) = (q.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let t = q.enter("k", far).await.unwrap();
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
        let first = q.enter("k", far).await.unwrap();
        first.set_lease(Some(Lease::Until(far)));
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let (q, order) = (q.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let t = q.enter("k", far).await.unwrap();
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
}
