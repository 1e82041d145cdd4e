//! Waiting by notification, fair local queueing, lease keeping and reentrancy, against a
//! real redis-server (and the in-memory backend where it makes sense): waiters woken by
//! the release message (control: messages off, the waiter sleeps its fallback); cancelled
//! waiters, for a lock and for an idempotent call in progress, leave no subscription; fair
//! shares; turns rotating across clients (control without the yield window: one client
//! keeps the lock for long runs); renewal, `max_hold`, stolen-lock cancellation and
//! `continue`; reentrancy.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::*;
use distlock::{Error, Locks, distributed_lock};

async fn redis_locks(server: &RedisServer) -> Locks {
    Locks::connect(&server.url()).await.unwrap()
}

/// A holder in another client (its own local queue, as another process would be) keeps
/// a 30 s lease; the waiter's fallback timer is then 100 ms, so only the release message
/// can wake it sooner.
/// `holder` takes the lock, `waiter` starts waiting for it, and 30 ms later (the waiter
/// subscribed and asleep on its 100 ms fallback timer) `holder` releases: the time from
/// that release to the waiter holding the lock.
async fn handoff_gap(holder: &Locks, waiter: &Locks) -> Duration {
    let g = holder.lock("handoff").acquire().await.unwrap();
    let w = take_and_release(waiter, "handoff", Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let released = Instant::now();
    g.release().await.unwrap();
    w.await.unwrap().duration_since(released)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_is_woken_by_the_release_message() {
    let server = RedisServer::start();
    let holder = redis_locks(&server).await;
    let waiter = redis_locks(&server).await;
    let mut gaps = Vec::new();
    for _ in 0..7 {
        gaps.push(handoff_gap(&holder, &waiter).await);
    }
    gaps.sort();
    let median = gaps[gaps.len() / 2];
    assert!(
        median < Duration::from_millis(50),
        "handoffs {gaps:?}: a median this close to the 100 ms fallback means no message woke the waiter"
    );
    assert_eq!(
        waiter.waiting_channels(),
        0,
        "served waiters leave their channel"
    );
}

/// Control: the same handoff with wake-ups turned off waits for the fallback timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_messages_the_waiter_sleeps_its_fallback() {
    let server = RedisServer::start();
    let holder = redis_locks(&server).await;
    let waiter = Locks::builder(server.url())
        .notify_waiters(false)
        .connect()
        .await
        .unwrap();
    let gap = handoff_gap(&holder, &waiter).await;
    // The waiter's last try was about 30 ms before the release and it sleeps 100 ms, so
    // the gap is about 70 ms; 20 ms leaves room for a waiter that started late, and is
    // still far above a handoff woken by the message (well under a millisecond).
    assert!(
        gap >= Duration::from_millis(20),
        "woken after {gap:?} without any message?"
    );
}

async fn numsub(server: &RedisServer, channel: &str) -> i64 {
    let mut raw = server.raw().await;
    let reply: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut raw)
        .await
        .unwrap();
    match &reply[1] {
        redis::Value::Int(n) => *n,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_no_subscription_behind() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let other = redis_locks(&server).await;
    let g = other.lock("cancel-wait").acquire().await.unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let locks = locks.clone();
            tokio::spawn(async move {
                locks
                    .lock("cancel-wait")
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        numsub(&server, "{lock:cancel-wait}:released").await,
        1,
        "one subscription shared by all waiters"
    );
    assert_eq!(locks.waiting_channels(), 1);
    for w in &waiters {
        w.abort();
    }
    for w in waiters {
        let _ = w.await;
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while numsub(&server, "{lock:cancel-wait}:released").await != 0 {
        assert!(
            Instant::now() < deadline,
            "the channel stayed subscribed after every waiter left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(locks.waiting_channels(), 0);
    g.release().await.unwrap();
}

#[distlock::idempotent(key = "wait:<id>", client = locks, wait = "30s", skip = [runs])]
async fn awaited(locks: &Locks, id: u32, runs: &Runs) -> Result<u32, AppError> {
    let n = runs.bump();
    tokio::time::sleep(Duration::from_millis(800)).await;
    Ok(n)
}

/// Repeats that wait for an idempotent call in progress (`wait`), cancelled while they
/// wait: the record's `:done` channel is subscribed once for all of them while they wait
/// (the control), and no longer once they are gone. The first call then completes, and
/// a later repeat replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_idempotency_waiters_leave_no_subscription_behind() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let other = redis_locks(&server).await;
    let runs = Arc::new(Runs::default());
    let first = tokio::spawn({
        let (other, runs) = (other.clone(), runs.clone());
        async move { awaited(&other, 1, &runs).await }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while runs.get() == 0 {
        assert!(Instant::now() < deadline, "the first call never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let (locks, runs) = (locks.clone(), runs.clone());
            tokio::spawn(async move { awaited(&locks, 1, &runs).await })
        })
        .collect();
    let channel = "{lock:idem:suite::waiting::awaited:wait:1}:done";
    until_subscribed(&server, channel).await;
    assert_eq!(
        numsub(&server, channel).await,
        1,
        "one subscription for all"
    );
    assert_eq!(locks.waiting_channels(), 1);
    for w in &waiters {
        w.abort();
    }
    for w in waiters {
        assert!(w.await.unwrap_err().is_cancelled());
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while numsub(&server, channel).await != 0 {
        assert!(
            Instant::now() < deadline,
            "the channel stayed subscribed after every waiter left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(locks.waiting_channels(), 0);
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(awaited(&locks, 1, &runs).await.unwrap(), 1, "replayed");
    assert_eq!(runs.get(), 1);
}

/// A holder whose process died never publishes: the waiter still gets the lock when the
/// lease ends, via its fallback timer bounded by the holder's remaining ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_holder_without_release_is_noticed() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let other = redis_locks(&server).await;
    let g = other
        .lock("crashed")
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    std::mem::forget(g); // like a crash: no release, no message
    let started = Instant::now();
    let w = locks
        .lock("crashed")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    w.release().await.unwrap();
}

/// `tasks` tasks, spread in turn over `clients`, share `tickets` acquisitions of `key`:
/// acquire (waiting up to 30 s), take a ticket, hold it `hold`, release. Checks that no two
/// hold it at once; returns the (client, task) of every acquisition, in order.
async fn share_tickets(
    clients: &[Locks],
    tasks: usize,
    key: &'static str,
    tickets: u32,
    hold: Duration,
) -> Vec<(usize, usize)> {
    let left = Arc::new(AtomicU32::new(tickets));
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let inside = Arc::new(AtomicU32::new(0));
    let mut handles = Vec::new();
    for task in 0..tasks {
        let client = task % clients.len();
        let (locks, left, order, inside) = (
            clients[client].clone(),
            left.clone(),
            order.clone(),
            inside.clone(),
        );
        handles.push(tokio::spawn(async move {
            loop {
                let g = locks
                    .lock(key)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .unwrap();
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                let done = left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_err();
                if !done {
                    order.lock().unwrap().push((client, task));
                    tokio::time::sleep(hold).await;
                }
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.unwrap();
                if done {
                    return;
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), tickets as usize);
    order
}

async fn fair_share(locks: Locks) {
    const TASKS: usize = 8;
    const TICKETS: u32 = 160;
    let order = share_tickets(&[locks], TASKS, "fair", TICKETS, Duration::from_millis(1)).await;
    let counts: Vec<u32> = (0..TASKS)
        .map(|task| order.iter().filter(|(_, t)| *t == task).count() as u32)
        .collect();
    let fair = TICKETS / TASKS as u32;
    assert_eq!(counts.iter().sum::<u32>(), TICKETS);
    for c in &counts {
        assert!(
            *c >= fair / 2 && *c <= fair * 2,
            "per-task acquisitions {counts:?}: some task was starved or barged (fair share {fair})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_task_is_starved_redis() {
    let server = RedisServer::start();
    fair_share(redis_locks(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_task_is_starved_in_memory() {
    fair_share(Locks::in_memory()).await;
}

async fn renewal_keeps_a_short_lease(locks: Locks) {
    let g = locks
        .lock("long-job")
        .ttl(Duration::from_secs(1))
        .renew(true)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(g.info().is_held());
    let thief = locks.lock("long-job").acquire().await;
    assert!(
        matches!(thief, Err(Error::Busy { .. })),
        "renewed lock must still be held"
    );
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_1s_lock_through_a_3s_body_redis() {
    let server = RedisServer::start();
    renewal_keeps_a_short_lease(redis_locks(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_1s_lock_through_a_3s_body_in_memory() {
    renewal_keeps_a_short_lease(Locks::in_memory()).await;
}

/// Control for the renewal test: without `renew` the same lock is gone after its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_renewal_the_lease_runs_out() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let g = locks
        .lock("long-job")
        .ttl(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(matches!(g.release().await, Err(Error::Lost { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_stops_renewal() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let g = locks
        .lock("capped")
        .ttl(Duration::from_millis(600))
        .renew(true)
        .max_hold(Duration::from_millis(900))
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("a lock past max_hold must count as lost when its last lease ends");
    let at = started.elapsed();
    assert!(at >= Duration::from_millis(900), "lost too early: {at:?}");
    assert!(!g.info().is_held());
    // Another holder can take it: renewal really stopped. (The local lease end is
    // counted from before each renewal was sent, so the key may outlive it by a round
    // trip: wait a little, far less than the renewals would keep it.)
    let other = locks
        .lock("capped")
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    assert!(matches!(g.release().await, Err(Error::Lost { .. })));
    other.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_detects_a_stolen_lock() {
    use redis::AsyncCommands;
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let g = locks
        .lock("stolen-renew")
        .ttl(Duration::from_millis(600))
        .renew(true)
        .acquire()
        .await
        .unwrap();
    let mut raw = server.raw().await;
    let _: () = raw.set("lock:stolen-renew", "someone-else").await.unwrap();
    tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("the next renewal must notice the foreign token");
    assert!(!g.info().is_held());
    assert!(matches!(g.release().await, Err(Error::Lost { .. })));
    let still: String = raw.get("lock:stolen-renew").await.unwrap();
    assert_eq!(still, "someone-else");
}

// ---- reentrancy ----

#[distributed_lock(key = "acct:<id>", client = locks)]
async fn outer(locks: &Locks, id: u32, server_url: String) -> Result<(u64, u64, bool), AppError> {
    // The nested call asks first: the outer one sees the fence it got, with no round trip.
    assert_eq!(distlock::current_lock().unwrap().cached_fence(), None);
    let inner_fence = inner(locks, id).await?;
    let outer_fence = distlock::current_lock().unwrap().cached_fence().unwrap();
    assert_eq!(
        distlock::current_lock().unwrap().fence().await?,
        outer_fence
    );
    // After the nested call returned, the lock is still held in Redis.
    let mut raw = redis::Client::open(server_url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let still: Option<String> = redis::AsyncCommands::get(&mut raw, format!("lock:acct:{id}"))
        .await
        .unwrap();
    Ok((outer_fence, inner_fence, still.is_some()))
}

#[distributed_lock(key = "acct:<id>", client = locks)]
async fn inner(locks: &Locks, id: u32) -> Result<u64, AppError> {
    Ok(distlock::current_lock().unwrap().fence().await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_call_on_the_same_key_reenters() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let (outer_fence, inner_fence, held_after_inner) =
        outer(&locks, 1, server.url()).await.unwrap();
    assert_eq!(
        outer_fence, inner_fence,
        "the nested call must not take a new lock"
    );
    assert!(held_after_inner, "only the outermost exit releases");
    // And the outermost exit did release.
    let g = locks.lock("acct:1").acquire().await.unwrap();
    assert_eq!(
        locks.inspect("acct:1").await.unwrap().last_fence,
        outer_fence,
        "one fence for the outer and nested calls"
    );
    assert!(g.fence().await.unwrap() > outer_fence);
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_task_contends_normally() {
    let locks = Locks::in_memory();
    #[distributed_lock(key = "acct:<id>", client = locks)]
    async fn spawns(locks: &Locks, id: u32) -> Result<bool, AppError> {
        let locks2 = locks.clone();
        let other = tokio::spawn(async move { inner(&locks2, id).await });
        Ok(matches!(
            other.await.unwrap(),
            Err(AppError::Lock(Error::Busy { .. }))
        ))
    }
    assert!(
        spawns(&locks, 2).await.unwrap(),
        "a different task must not re-enter"
    );
    // Another client is another holder, even in the same task.
    let other_client = Locks::in_memory();
    #[distributed_lock(key = "acct:<id>", client = locks)]
    async fn via_two_clients(locks: &Locks, id: u32, other: &Locks) -> Result<u64, AppError> {
        inner(other, id).await
    }
    assert!(via_two_clients(&locks, 3, &other_client).await.is_ok());
}

// ---- lease keeping through the attribute ----

#[distributed_lock(key = "report:<id>", ttl = "1s", renew = true, client = locks)]
async fn long_report(locks: &Locks, id: u32, steps: &AtomicU32) -> Result<bool, AppError> {
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        steps.fetch_add(1, Ordering::SeqCst);
    }
    Ok(distlock::current_lock().unwrap().is_held())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_attribute_holds_a_1s_lock_through_a_3s_body() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let steps = AtomicU32::new(0);
    let other = redis_locks(&server).await;
    let (result, busy) = tokio::join!(long_report(&locks, 1, &steps), async {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        other.lock("report:1").acquire().await
    });
    assert!(result.unwrap(), "still held at the end of the body");
    assert!(
        matches!(busy, Err(Error::Busy { .. })),
        "2.5 s into a 1 s ttl the lock is still held"
    );
    assert_eq!(steps.load(Ordering::SeqCst), 30);
}

#[distributed_lock(key = "report:<id>", ttl = "600ms", renew = true, on_lost = "continue", client = locks)]
async fn long_report_continue(locks: &Locks, id: u32, steps: &AtomicU32) -> Result<bool, AppError> {
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        steps.fetch_add(1, Ordering::SeqCst);
    }
    Ok(distlock::current_lock().unwrap().is_held())
}

async fn steal_after(server: &RedisServer, key: &str, after: Duration) {
    use redis::AsyncCommands;
    tokio::time::sleep(after).await;
    let mut raw = server.raw().await;
    let _: () = raw.set(key, "thief").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stolen_lock_cancels_the_body_by_default() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let steps = AtomicU32::new(0);
    let started = Instant::now();
    let (result, ()) = tokio::join!(
        long_report(&locks, 2, &steps),
        steal_after(&server, "lock:report:2", Duration::from_millis(500))
    );
    assert!(
        matches!(result, Err(AppError::Lock(Error::Lost { .. }))),
        "{result:?}"
    );
    let ran = steps.load(Ordering::SeqCst);
    assert!(
        ran < 30,
        "the body must be cancelled, not run to the end ({ran} steps)"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "cancelled at the next renewal, long before the 3 s body ends"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stolen_lock_with_continue_runs_on_and_reports_lost() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let steps = AtomicU32::new(0);
    let (result, ()) = tokio::join!(
        long_report_continue(&locks, 3, &steps),
        steal_after(&server, "lock:report:3", Duration::from_millis(300))
    );
    assert!(
        matches!(result, Err(AppError::Lock(Error::Lost { .. }))),
        "{result:?}"
    );
    assert_eq!(
        steps.load(Ordering::SeqCst),
        15,
        "`continue` lets the body finish"
    );
}

/// A thousand renewable locks through one client: all kept past their ttl by the one
/// batched renewal task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_renewed_locks_share_one_renewal_task() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let mut guards = Vec::new();
    for i in 0..1000 {
        guards.push(
            locks
                .lock(format!("many:{i}"))
                .ttl(Duration::from_millis(900))
                .renew(true)
                .acquire()
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let mut raw = server.raw().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("lock:many:*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        keys.len(),
        1000,
        "every lock must still be held after twice its ttl"
    );
    for g in guards {
        assert!(g.info().is_held());
        g.release().await.unwrap();
    }
}

/// Three clients (each with its own local queue and Pub/Sub connection, as separate
/// processes have) of three tasks each share 150 acquisitions of one key, holding it 2 ms.
/// Returns the client of every acquisition, in order.
async fn clients_take_turns(server: &RedisServer, window: Duration) -> Vec<usize> {
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(
            Locks::builder(server.url())
                .yield_window(window)
                .connect()
                .await
                .unwrap(),
        );
    }
    share_tickets(&clients, 9, "turns", 150, Duration::from_millis(2))
        .await
        .into_iter()
        .map(|(client, _)| client)
        .collect()
}

/// The longest run of consecutive acquisitions by one client.
fn longest_run(order: &[usize]) -> usize {
    order
        .chunk_by(|a, b| a == b)
        .map(<[usize]>::len)
        .max()
        .unwrap_or(0)
}

/// Across clients, turns rotate: a client whose tasks release while other clients wait
/// leaves the lock to them after one handoff per local waiter, so no client keeps the
/// lock for long runs and every client gets its share. (Before the marker named the
/// latest turns, the most recently subscribed client won each race: two clients could
/// pass the lock back and forth while a third got 24 of 150.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_take_turns_when_others_wait() {
    let server = RedisServer::start();
    // A generous window: a loaded machine may take a few ms to wake the other clients.
    let order = clients_take_turns(&server, Duration::from_millis(50)).await;
    let run = longest_run(&order);
    eprintln!("longest run with yielding: {run}");
    assert!(
        run <= 6,
        "one client held the lock {run} times in a row: {order:?}"
    );
    // Turns rotate through the waiting clients (the yield marker names the latest
    // ones), so shares stay near a third, not just within 0.5x-2x.
    let counts: Vec<usize> = (0..3)
        .map(|client| order.iter().filter(|c| **c == client).count())
        .collect();
    eprintln!("acquisitions per client: {counts:?}");
    for n in &counts {
        assert!(
            (35..=65).contains(n),
            "per client {counts:?} of 150: {order:?}"
        );
    }
}

/// Control: without the yield window the releasing client's next local task wins the race
/// against the other clients' woken waiters, and keeps the lock for long runs. A race: on
/// a loaded machine one run of 150 may rotate by chance, so it is shown within three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_yielding_one_client_keeps_the_lock() {
    let server = RedisServer::start();
    let mut runs = Vec::new();
    for _ in 0..3 {
        let order = clients_take_turns(&server, Duration::ZERO).await;
        let run = longest_run(&order);
        eprintln!("longest run without yielding: {run}");
        runs.push(run);
        if run > 6 {
            return;
        }
    }
    panic!("longest runs {runs:?}: the race did not show in three runs");
}

async fn evalsha_calls(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut server.raw().await)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Four tasks, spread over `clients`, take 100 turns on one key; returns the scripts run
/// per acquisition.
async fn scripts_per_acquisition(server: &RedisServer, clients: &[Locks]) -> f64 {
    const ACQUISITIONS: u32 = 100;
    let before = evalsha_calls(server).await;
    share_tickets(
        clients,
        4,
        "round-trips",
        ACQUISITIONS,
        Duration::from_millis(1),
    )
    .await;
    (evalsha_calls(server).await - before) as f64 / f64::from(ACQUISITIONS)
}

/// A contended lock passes between the tasks of one client in one script per
/// acquisition: the release hands it to the next local waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_handoff_costs_one_round_trip() {
    let server = RedisServer::start();
    let one = scripts_per_acquisition(&server, &[redis_locks(&server).await]).await;
    eprintln!("scripts per acquisition, one client: {one:.2}");
    assert!(one < 1.2, "{one:.2} scripts per acquisition");
    // Control: the same tasks spread over four clients take and release in separate
    // scripts, plus tries that find the lock held.
    let mut four = Vec::new();
    for _ in 0..4 {
        four.push(redis_locks(&server).await);
    }
    let spread = scripts_per_acquisition(&server, &four).await;
    eprintln!("scripts per acquisition, four clients: {spread:.2}");
    assert!(spread >= 2.0, "{spread:.2} scripts per acquisition");
}

/// Waiters that give up right around the release (their wait ends as the lock is handed
/// down the queue) never strand the lock: once they are gone, it is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_giving_up_during_handoffs_leave_the_lock_free() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    for round in 0..5 {
        let held = locks.lock("leavers").acquire().await.unwrap();
        let mut waiters = Vec::new();
        for i in 0..30u64 {
            let locks = locks.clone();
            waiters.push(tokio::spawn(async move {
                let g = locks
                    .lock("leavers")
                    .wait(Duration::from_micros(14_000 + i * 100 + round * 37))
                    .acquire()
                    .await;
                if let Ok(g) = g {
                    g.release().await.unwrap();
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
        held.release().await.unwrap();
        for w in waiters {
            w.await.unwrap();
        }
        let again = locks
            .lock("leavers")
            .wait(Duration::from_millis(500))
            .acquire()
            .await
            .expect("the lock is free once every waiter has gone");
        again.release().await.unwrap();
    }
}

/// Returns once some waiter is subscribed to `channel`; panics when none is within 5 s.
async fn until_subscribed(server: &RedisServer, channel: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while numsub(server, channel).await < 1 {
        assert!(Instant::now() < deadline, "`{channel}` never subscribed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A client's id, as its yielding releases name it (`{key}:turns` keeps the latest).
async fn client_id(server: &RedisServer, locks: &Locks) -> String {
    let other = redis_locks(server).await;
    let g = locks.lock("whoami").acquire().await.unwrap();
    let waiter = take_and_release(&other, "whoami", Duration::from_secs(5));
    until_subscribed(server, "{lock:whoami}:released").await;
    // The waiter marks the holder's value on its try after subscribing; a release before
    // the mark is a plain one that names no client.
    let mut raw = server.raw().await;
    common::wait_for_mark(&mut raw, "lock:whoami", Duration::from_secs(5)).await;
    g.release().await.unwrap();
    waiter.await.unwrap();
    let turns: String = redis::cmd("GET")
        .arg("{lock:whoami}:turns")
        .query_async(&mut server.raw().await)
        .await
        .unwrap();
    turns.split(' ').next().unwrap().to_owned()
}

/// How many tries a waiter of `waiting` makes while 20 release messages with `payload`
/// arrive 10 ms apart (the holder keeps a 30 s lease, so the waiter's own 100 ms timer
/// wakes it about twice in that time).
async fn tries_woken_by(server: &RedisServer, waiting: &Locks, payload: &str) -> u64 {
    let holder = redis_locks(server).await;
    let g = holder.lock("passed-over").acquire().await.unwrap();
    let waiter = take_and_release(waiting, "passed-over", Duration::from_secs(10));
    until_subscribed(server, "{lock:passed-over}:released").await;
    let before = evalsha_calls(server).await;
    let mut raw = server.raw().await;
    for _ in 0..20 {
        redis::cmd("PUBLISH")
            .arg("{lock:passed-over}:released")
            .arg(payload)
            .exec_async(&mut raw)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let tries = evalsha_calls(server).await - before;
    g.release().await.unwrap();
    waiter.await.unwrap();
    tries
}

/// A yield message names the clients that cannot take the lock: their waiters stay
/// asleep instead of trying in vain just as the client it is left to tries. Control: the
/// same messages naming another client wake the waiter every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yield_messages_do_not_wake_the_clients_they_name() {
    let server = RedisServer::start();
    let waiting = redis_locks(&server).await;
    let me = client_id(&server, &waiting).await;
    let named = tries_woken_by(&server, &waiting, &format!("yield: someone:1 {me} ")).await;
    let control = tries_woken_by(&server, &waiting, "yield: someone:1 ").await;
    eprintln!("tries: named {named}, control {control}");
    assert!(named <= 6, "{named} tries while passed over");
    assert!(
        control >= 12,
        "control: {control} tries: the messages did not wake"
    );
}
