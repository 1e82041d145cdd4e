//! Looking at locks from the outside (`Locks::inspect`) and releasing a stuck one
//! (`Locks::force_release`): what an on-call engineer sees of a lock, a semaphore and a
//! read/write lock, and what the holder, the next holder and a waiter see after a
//! forced release (control: without it, the waiter would wait for the 30 s lease).
use crate::common;

use std::time::{Duration, Instant};

use common::*;
use distlock::idempotency::RecordState;
use distlock::key::Kind;
use distlock::{Error, Locks, idempotent};
use futures_util::{StreamExt, TryStreamExt};

both!(
    a_held_lock_shows_its_holder_lease_and_fence,
    a_free_key_shows_nothing,
    a_semaphore_shows_its_permits,
    a_read_write_lock_shows_readers_and_a_waiting_writer,
    a_write_lock_is_told_from_a_lock,
    a_forced_release_makes_the_holder_lost,
    a_forced_release_frees_permits_and_readers,
    a_list_finds_every_held_lock_and_nothing_else,
    a_list_walks_many_keys_once_each,
    a_record_shows_its_claim_then_its_result,
);

const LONG: Duration = Duration::from_secs(10);

async fn a_held_lock_shows_its_holder_lease_and_fence(locks: Locks) {
    let g = locks
        .lock("ops:a")
        .ttl(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let fence = g.fence().await.unwrap();
    let state = locks.inspect("ops:a").await.unwrap();
    assert_eq!(state.key, "lock:ops:a");
    assert!(state.is_held());
    let holder = state.holder.clone().unwrap();
    assert_eq!(holder.token, g.token());
    assert_eq!(holder.pid, Some(std::process::id()));
    assert!(holder.host.is_some());
    let left = state.lease_left.unwrap();
    assert!(
        left > Duration::from_secs(15) && left <= Duration::from_secs(20),
        "{left:?}"
    );
    assert_eq!(state.last_fence, fence);
    assert!(state.permits.is_empty() && state.readers.is_empty());
    assert_eq!((state.kind, state.permit_limit), (Kind::Lock, None));
    g.release().await.unwrap();
}

async fn a_free_key_shows_nothing(locks: Locks) {
    let state = locks.inspect("ops:b").await.unwrap();
    assert!(!state.is_held());
    assert_eq!(
        (state.holder, state.lease_left, state.last_fence),
        (None, None, 0)
    );
    assert!(!locks.force_release("ops:b").await.unwrap());
}

async fn a_semaphore_shows_its_permits(locks: Locks) {
    let a = locks.semaphore("ops:c", 3).acquire().await.unwrap();
    let b = locks.semaphore("ops:c", 3).acquire().await.unwrap();
    let state = locks.inspect("ops:c").await.unwrap();
    assert!(state.holder.is_none());
    let mut tokens: Vec<String> = state
        .permits
        .iter()
        .map(|s| s.holder.token.clone())
        .collect();
    tokens.sort();
    let mut want = vec![a.token().to_owned(), b.token().to_owned()];
    want.sort();
    assert_eq!(tokens, want, "the limit is no permit");
    assert_eq!((state.kind, state.permit_limit), (Kind::Semaphore, Some(3)));
    assert!(
        state
            .permits
            .iter()
            .all(|s| s.lease_left > Duration::from_secs(25))
    );
    a.release().await.unwrap();
    b.release().await.unwrap();
}

async fn a_read_write_lock_shows_readers_and_a_waiting_writer(locks: Locks) {
    let r = locks.read_lock("ops:d").acquire().await.unwrap();
    // A second, longer share: the lock's lease is the longest reader's.
    let long = locks
        .read_lock("ops:d")
        .ttl(Duration::from_secs(50))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let writer = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let w = locks
                .write_lock("ops:d")
                .wait(LONG)
                .acquire()
                .await
                .unwrap();
            w.release().await.unwrap();
        })
    };
    let until = Instant::now() + Duration::from_secs(5);
    let state = loop {
        let state = locks.inspect("ops:d").await.unwrap();
        if state.writer_waiting.is_some() {
            break state;
        }
        assert!(Instant::now() < until, "no waiting writer seen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(state.readers.len(), 2);
    assert!(state.readers.iter().any(|s| s.holder.token == r.token()));
    assert!(state.holder.is_none());
    assert_eq!(state.kind, Kind::ReadLock);
    let left = state.lease_left.expect("a read lock's lease");
    assert!(
        left > Duration::from_secs(40) && left <= Duration::from_secs(50),
        "the longest reader's: {left:?}"
    );
    r.release().await.unwrap();
    long.release().await.unwrap();
    writer.await.unwrap();
}

/// A held write lock says so; a lock (one that waited for readers, too) does not.
async fn a_write_lock_is_told_from_a_lock(locks: Locks) {
    let w = locks.write_lock("ops:w").acquire().await.unwrap();
    let state = locks.inspect("ops:w").await.unwrap();
    assert_eq!(state.kind, Kind::WriteLock);
    assert_eq!(state.holder.unwrap().token, w.token());
    w.release().await.unwrap();
    // Control: a lock of the same name, taken once a reader left.
    let r = locks
        .read_lock("ops:w")
        .ttl(Duration::from_millis(300))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let l = locks.lock("ops:w").wait(LONG).acquire().await.unwrap();
    let state = locks.inspect("ops:w").await.unwrap();
    assert_eq!(state.kind, Kind::Lock);
    assert_eq!(state.holder.unwrap().token, l.token());
    l.release().await.unwrap();
    drop(r);
}

async fn a_forced_release_makes_the_holder_lost(locks: Locks) {
    let stuck = locks.lock("ops:e").acquire().await.unwrap();
    assert!(locks.force_release("ops:e").await.unwrap());
    assert!(!locks.inspect("ops:e").await.unwrap().is_held());
    assert!(matches!(stuck.release().await, Err(Error::Lost { .. })));
}

/// Another instance's waiter is woken by the forced release (control: the stuck
/// holder's lease is 30 s, the waiter gets in within 5). The stuck holder's own
/// client's waiters queue behind it until its lease ends or a renewal finds it lost,
/// as after any lost lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_wakes_another_clients_waiter() {
    let server = RedisServer::start();
    let (locks, other) = (
        Locks::connect(&server.url()).await.unwrap(),
        Locks::connect(&server.url()).await.unwrap(),
    );
    let stuck = locks
        .lock("ops:i")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        let g = other.lock("ops:i").wait(LONG).acquire().await.unwrap();
        let at = Instant::now();
        g.release().await.unwrap();
        at
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let forced = Instant::now();
    assert!(locks.force_release("ops:i").await.unwrap());
    let at = waiter.await.unwrap();
    assert!(at - forced < Duration::from_secs(5), "{:?}", at - forced);
    assert!(matches!(stuck.release().await, Err(Error::Lost { .. })));
}

async fn a_forced_release_frees_permits_and_readers(locks: Locks) {
    let p = locks.semaphore("ops:f", 1).acquire().await.unwrap();
    let r = locks.read_lock("ops:g").acquire().await.unwrap();
    assert!(locks.force_release("ops:f").await.unwrap());
    assert!(locks.force_release("ops:g").await.unwrap());
    let p2 = locks.semaphore("ops:f", 1).acquire().await.unwrap();
    let w = locks.write_lock("ops:g").acquire().await.unwrap();
    assert!(matches!(p.release().await, Err(Error::Lost { .. })));
    assert!(matches!(r.release().await, Err(Error::Lost { .. })));
    p2.release().await.unwrap();
    w.release().await.unwrap();
}

/// On Redis, a waiter that will be woken by a message marks the holder's value, and
/// its client listens on the key's channel: both show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_shows_as_a_mark_and_a_listener() {
    let server = RedisServer::start();
    let (locks, other) = (
        Locks::connect(&server.url()).await.unwrap(),
        Locks::connect(&server.url()).await.unwrap(),
    );
    let g = locks.lock("ops:h").acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        let w = other.lock("ops:h").wait(LONG).acquire().await.unwrap();
        w.release().await.unwrap();
    });
    let until = Instant::now() + Duration::from_secs(5);
    let state = loop {
        let state = locks.inspect("ops:h").await.unwrap();
        if state.marked_waiting && state.listening > 0 {
            break state;
        }
        assert!(Instant::now() < until, "{state:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(state.holder.unwrap().token, g.token());
    g.release().await.unwrap();
    waiter.await.unwrap();
}

async fn names(locks: &Locks, pattern: &str) -> Vec<String> {
    let listed: Vec<distlock::LockState> = locks.list(pattern).try_collect().await.unwrap();
    let mut names: Vec<String> = listed
        .iter()
        .map(|state| state.key.strip_prefix("lock:").unwrap().to_owned())
        .collect();
    names.sort();
    names
}

async fn a_list_finds_every_held_lock_and_nothing_else(locks: Locks) {
    let a = locks.lock("ls:a").acquire().await.unwrap();
    let b = locks.lock("ls:b").acquire().await.unwrap();
    b.fence().await.unwrap();
    let permit = locks.semaphore("ls:gpu", 2).acquire().await.unwrap();
    // Held by readers alone: no key at `lock:ls:doc`, only its readers' set.
    let reader = locks.read_lock("ls:doc").acquire().await.unwrap();
    let tagged = locks.read_lock("ls:{t}:doc").acquire().await.unwrap();
    // Released, with a fence left behind: not listed.
    let gone = locks.lock("ls:gone").acquire().await.unwrap();
    gone.fence().await.unwrap();
    gone.release().await.unwrap();
    // An idempotency record under the same prefix: not a lock.
    record_one(&locks, "ls-rec").await;
    let other = locks.lock("other:x").acquire().await.unwrap();

    assert_eq!(
        names(&locks, "ls:*").await,
        ["ls:a", "ls:b", "ls:doc", "ls:gpu", "ls:{t}:doc"]
    );
    assert_eq!(names(&locks, "ls:?").await, ["ls:a", "ls:b"]);
    // A hash-tagged lock held by readers alone, named exactly.
    assert_eq!(names(&locks, "ls:{t}:doc").await, ["ls:{t}:doc"]);
    assert_eq!(names(&locks, "*").await.len(), 6);
    let doc: Vec<distlock::LockState> = locks.list("ls:doc").try_collect().await.unwrap();
    assert_eq!(doc[0].readers[0].holder.token, reader.token());
    assert!(names(&locks, "nothing:*").await.is_empty());
    for g in [a, b, permit, reader, tagged, other] {
        g.release().await.unwrap();
    }
    assert!(names(&locks, "*").await.is_empty());
}

async fn a_list_walks_many_keys_once_each(locks: Locks) {
    // More than one SCAN step's worth (500 a step).
    let mut guards = Vec::new();
    for i in 0..1_200 {
        guards.push(locks.lock(format!("bulk:{i}")).acquire().await.unwrap());
    }
    let listed = names(&locks, "bulk:*").await;
    let mut unique = listed.clone();
    unique.dedup();
    assert_eq!((listed.len(), unique.len()), (1_200, 1_200));
    for g in guards {
        g.release().await.unwrap();
    }
}

/// Runs once `gate` gives it a permit; a repeat waits for a call in progress.
#[idempotent(key = "<k>", client = locks, lease = "20s", wait = "30s", skip = [gate, runs])]
async fn gated(
    locks: &Locks,
    k: &str,
    gate: &tokio::sync::Semaphore,
    runs: &Runs,
) -> Result<u32, Error> {
    runs.bump();
    drop(gate.acquire().await);
    Ok(7)
}

/// One completed record under `k`.
async fn record_one(locks: &Locks, k: &str) {
    let gate = tokio::sync::Semaphore::new(1);
    gated(locks, k, &gate, &Runs::default()).await.unwrap();
}

/// The one record whose key ends with `:<k>`.
async fn record_of(locks: &Locks, k: &str) -> Option<distlock::idempotency::IdemRecord> {
    let all: Vec<_> = locks.idem_records("*").try_collect().await.unwrap();
    let mut of_k = all
        .into_iter()
        .filter(|r| r.key.ends_with(&format!(":{k}")));
    let found = of_k.next();
    assert!(of_k.next().is_none());
    found
}

async fn a_record_shows_its_claim_then_its_result(locks: Locks) {
    assert!(locks.idem_record("idem:nothing").await.unwrap().is_none());
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let runs = std::sync::Arc::new(Runs::default());
    let call = tokio::spawn({
        let (locks, gate, runs) = (locks.clone(), gate.clone(), runs.clone());
        async move { gated(&locks, "rec-1", &gate, &runs).await }
    });
    let deadline = Instant::now() + LONG;
    let claim = loop {
        if let Some(record) = record_of(&locks, "rec-1").await {
            break record;
        }
        assert!(Instant::now() < deadline, "no record while the body runs");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(claim.key.starts_with("lock:idem:") && claim.key.ends_with("::gated:rec-1"));
    assert_eq!(claim.state, RecordState::InProgress);
    assert_eq!(claim.owner.as_ref().unwrap().pid, Some(std::process::id()));
    let lease = claim.lease_left.unwrap();
    assert!(
        lease > Duration::from_secs(10) && lease <= Duration::from_secs(20),
        "{lease:?}"
    );
    assert!(!claim.is_stuck() && claim.fingerprint.is_some() && claim.stored.is_none());
    // The same record by its key without the prefix, as an operator would type it.
    let short = claim.key.strip_prefix("lock:").unwrap();
    assert_eq!(
        locks.idem_record(short).await.unwrap().unwrap().state,
        RecordState::InProgress
    );

    gate.add_permits(1);
    assert_eq!(call.await.unwrap().unwrap(), 7);
    let done = locks.idem_record(&claim.key).await.unwrap().unwrap();
    assert_eq!(done.state, RecordState::Completed);
    assert_eq!(done.stored.as_deref(), Some(r#"{"value":7}"#));
    assert_eq!(
        (done.owner.clone(), done.lease_left, done.status),
        (None, None, None)
    );
    assert_eq!(done.fingerprint, claim.fingerprint);
    assert!(done.expires_in.unwrap() > Duration::from_secs(23 * 3600));
    assert!(done.raw.contains(r#""status":"completed""#));

    // A replay does not run the body; once forgotten, the next call does.
    gate.add_permits(2);
    gated(&locks, "rec-1", &gate, &runs).await.unwrap();
    assert_eq!(runs.get(), 1);
    assert!(locks.forget_idem(&claim.key).await.unwrap());
    assert!(!locks.forget_idem(&claim.key).await.unwrap());
    assert!(locks.idem_record(&claim.key).await.unwrap().is_none());
    gated(&locks, "rec-1", &gate, &runs).await.unwrap();
    assert_eq!(runs.get(), 2);
}

/// A repeat that waits behind a claim whose caller hangs (another instance, its lease
/// renewed) runs the body once an operator forgets the record: the forget wakes it.
/// Control: without the forget, the repeat is still waiting a second later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgetting_a_record_wakes_a_waiting_repeat() {
    let server = RedisServer::start();
    let hung = Locks::connect(&server.url()).await.unwrap();
    let other = Locks::connect(&server.url()).await.unwrap();
    // Each call's own gate: the hung one's stays shut until the end.
    let (shut, open) = (
        std::sync::Arc::new(tokio::sync::Semaphore::new(0)),
        std::sync::Arc::new(tokio::sync::Semaphore::new(1)),
    );
    let runs = std::sync::Arc::new(Runs::default());
    let first = tokio::spawn({
        let (locks, gate, runs) = (hung.clone(), shut.clone(), runs.clone());
        async move { gated(&locks, "w-1", &gate, &runs).await }
    });
    while runs.get() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let repeat = tokio::spawn({
        let (locks, gate, runs) = (other.clone(), open.clone(), runs.clone());
        async move { gated(&locks, "w-1", &gate, &runs).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !repeat.is_finished(),
        "control: the repeat waits for the claim"
    );
    assert_eq!(runs.get(), 1);
    let key = record_of(&other, "w-1").await.unwrap().key;
    let forgot_at = Instant::now();
    assert!(other.forget_idem(&key).await.unwrap());
    assert_eq!(repeat.await.unwrap().unwrap(), 7);
    assert!(forgot_at.elapsed() < LONG, "woken, not polled out");
    assert_eq!(runs.get(), 2);
    // The hung call's claim was taken from it: when it ends it gets `Lost`, or its own
    // result, not stored, since the repeat stored the same payload's result first.
    shut.add_permits(1);
    assert!(matches!(
        first.await.unwrap(),
        Ok(7) | Err(Error::Lost { .. })
    ));
    let record = other.idem_record(&key).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.stored.as_deref(), Some(r#"{"value":7}"#));
}

/// A claim whose process died (its lease ended, written as a dead instance leaves it)
/// shows as stuck; a forget clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_claim_shows_as_stuck() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let claim = r#"{"claimed_at_ms":1764485970000,"fp":"ab","lease_until_ms":1764486000000,"owner":"0b5c6a8e-3f4d-4c2a-9d61-7e1f2a3b4c5d:web-9:4242","retention_ms":86400000,"status":"in_progress"}"#;
    let key = "lock:idem:app::pay:K9";
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(claim)
        .arg("EX")
        .arg(3600)
        .query_async(&mut raw)
        .await
        .unwrap();
    let record = locks
        .idem_record("idem:app::pay:K9")
        .await
        .unwrap()
        .unwrap();
    assert!(record.is_stuck());
    let owner = record.owner.unwrap();
    assert_eq!(
        (owner.host.as_deref(), owner.pid),
        (Some("web-9"), Some(4242))
    );
    assert_eq!(record.claimed_at_ms, Some(1764485970000));
    let stuck: Vec<_> = locks.idem_records("app::*").try_collect().await.unwrap();
    assert_eq!(stuck.len(), 1);
    assert!(locks.forget_idem(key).await.unwrap());
    assert!(
        locks
            .idem_records("*")
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
            .is_empty()
    );
}

/// The operations under faults: replies held past the command timeout end a walk, a
/// look and a forget with `Backend` within a bounded time (and a late reply does not
/// reach the next call); connections reset mid-walk, the next walk works; after a
/// restart that lost everything, a walk finds nothing and a look finds no record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_fail_within_the_timeout_and_recover() {
    let mut server = RedisServer::start();
    let proxy = common::proxy::FaultProxy::start(server.port);
    let ops = proxy.locks(Duration::from_millis(300));
    let holder = Locks::connect(&server.url()).await.unwrap();
    let mut guards = Vec::new();
    for i in 0..600 {
        guards.push(holder.lock(format!("f:{i}")).acquire().await.unwrap());
    }
    record_one(&holder, "f-rec").await;
    assert_eq!(names(&ops, "f:*").await.len(), 600, "warm");

    proxy.set_latency(common::proxy::Dir::ToClient, Duration::from_millis(600));
    let started = Instant::now();
    let walked: Vec<_> = ops.list("f:*").collect::<Vec<_>>().await;
    assert!(
        matches!(walked.last(), Some(Err(Error::Backend { .. }))),
        "{:?}",
        walked.len()
    );
    assert_eq!(
        walked.iter().filter(|r| r.is_err()).count(),
        1,
        "an error ends the walk"
    );
    let looked = ops.idem_record("idem:nothing").await;
    assert!(matches!(looked, Err(Error::Backend { .. })));
    let forgot = ops.forget_idem("idem:nothing").await;
    assert!(matches!(forgot, Err(Error::Backend { .. })));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    proxy.set_latency(common::proxy::Dir::ToClient, Duration::ZERO);
    // The late replies are not taken for the next calls' answers.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(names(&ops, "f:*").await.len(), 600);
    assert!(record_of(&ops, "f-rec").await.is_some());

    // Connections reset in the middle of a walk.
    let mut walk = Box::pin(ops.list("f:*"));
    assert!(walk.next().await.unwrap().is_ok());
    proxy.reset_all();
    let rest: Vec<_> = walk.collect::<Vec<_>>().await;
    assert!(
        rest.iter().all(|r| r.is_ok()) || matches!(rest.last(), Some(Err(Error::Backend { .. })))
    );
    assert_eq!(names(&ops, "f:*").await.len(), 600, "the next walk works");

    // A restart without persistence: nothing held, no record.
    server.restart();
    let deadline = Instant::now() + LONG;
    loop {
        match ops.list("*").try_collect::<Vec<_>>().await {
            Ok(found) => {
                assert!(found.is_empty());
                break;
            }
            Err(_) => assert!(Instant::now() < deadline, "no walk after the restart"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(record_of(&ops, "f-rec").await.is_none());
    for g in guards {
        assert!(matches!(
            g.release().await,
            Err(Error::Lost { .. }) | Err(Error::Backend { .. })
        ));
    }
}
