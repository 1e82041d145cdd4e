//! Where kinds meet on one name: every pair of {lock, write lock, read lock, semaphore,
//! multi-lock member}, on a plain name, a hash-tagged one and names that end as a
//! companion key once did; each pair excludes the other (`Busy` while the first holds,
//! taken once it is released) or is refused with one `WrongKind` naming both, alike on
//! Redis and in memory (and on Valkey and as the least-privilege user, where
//! `scripts/test.sh` runs this module). Then the seams between kinds: a lock never granted
//! beside a reader (control: the write lock, refused before the change too), companions
//! that no name addresses (control: the raw keys), fences that never go backwards after
//! a restart without persistence (control: a plain counter does), a kept lock (`min_hold`)
//! that a late renewal cannot shorten (control: the same renewal before the keep does
//! set the lease), and the operations that refuse what is not theirs.
use crate::common;

use std::time::Duration;

use common::*;
use distlock::key::Kind;
use distlock::{Error, Locks, idempotent};

both!(
    every_pair_of_kinds_excludes_or_is_refused_alike,
    a_lock_and_a_multi_lock_wait_for_the_readers,
    a_write_lock_waiting_behind_a_lock_never_joins_a_reader,
    companions_are_never_another_names_keys,
    operations_refuse_what_is_not_theirs,
    a_lock_is_not_starved_by_a_stream_of_readers,
    a_name_taken_by_another_kind_is_lost_not_an_error,
    long_keys_are_hashed_and_large_values_not_stored,
    a_record_that_vanishes_mid_body_is_written_again,
    a_record_taken_over_mid_body_is_lost,
);

const LONG: Duration = Duration::from_secs(10);

/// The kinds of the matrix.
#[derive(Debug, Clone, Copy, PartialEq)]
enum K {
    Lock,
    Write,
    Read,
    Sem,
    Multi,
}

const KINDS: [K; 5] = [K::Lock, K::Write, K::Read, K::Sem, K::Multi];

/// A held kind, whatever its guard.
enum Held {
    One(distlock::LockGuard),
    Many(distlock::MultiLockGuard),
}

impl Held {
    async fn release(self) -> Result<(), Error> {
        match self {
            Held::One(g) => g.release().await,
            Held::Many(g) => g.release().await,
        }
    }
}

/// One try for `kind` on `name` with no wait (a multi-lock: `name` and a free name).
async fn take(locks: &Locks, kind: K, name: &str) -> Result<Held, Error> {
    let request = match kind {
        K::Lock => locks.lock(name),
        K::Write => locks.write_lock(name),
        K::Read => locks.read_lock(name),
        K::Sem => locks.semaphore(name, 2),
        K::Multi => {
            let other = format!("{name}-other");
            return locks
                .multi_lock([name.to_owned(), other])
                .acquire()
                .await
                .map(Held::Many);
        }
    };
    request.acquire().await.map(Held::One)
}

/// What a second kind gets on a name the first holds.
#[derive(Debug, PartialEq)]
enum Meet {
    /// Both at once (readers share, permits count).
    Share,
    /// `Busy` while the first holds.
    Exclude,
    /// `WrongKind { held, asked }`.
    Refuse(Kind, Kind),
}

fn kind_of(k: K) -> Kind {
    match k {
        K::Lock | K::Multi => Kind::Lock,
        K::Write => Kind::WriteLock,
        K::Read => Kind::ReadLock,
        K::Sem => Kind::Semaphore,
    }
}

/// What the crate docs ("What each primitive writes") promise for `first` held, then
/// `second` asked for.
fn expected(first: K, second: K) -> Meet {
    match (first, second) {
        (K::Read, K::Read) | (K::Sem, K::Sem) => Meet::Share,
        // A semaphore is a sorted set at the key; every other kind keeps a string there.
        (K::Sem, other) => Meet::Refuse(Kind::Semaphore, kind_of(other)),
        (K::Read, K::Sem) => Meet::Refuse(Kind::ReadLock, Kind::Semaphore),
        (_, K::Sem) => Meet::Refuse(Kind::Lock, Kind::Semaphore),
        _ => Meet::Exclude,
    }
}

async fn every_pair_of_kinds_excludes_or_is_refused_alike(locks: Locks) {
    // A plain name, a tagged one, and names that end as companions once did.
    let names = ["cat:7", "{acct}:7", "{acct}:7:fence", "{doc}:1:readers"];
    let mut n = 0;
    for name in names {
        for first in KINDS {
            for second in KINDS {
                n += 1;
                // A name of its own for each pair: nothing left by the last one.
                let name = format!("{name}-{n}");
                let held = take(&locks, first, &name).await.unwrap();
                let got = take(&locks, second, &name).await;
                let want = expected(first, second);
                let what = format!("{first:?} held, {second:?} asked on {name}: {want:?}");
                match (&want, got) {
                    (Meet::Share, Ok(g)) => g.release().await.unwrap(),
                    (Meet::Exclude, Err(Error::Busy { .. })) => {}
                    (
                        Meet::Refuse(held, asked),
                        Err(Error::WrongKind {
                            held: h, asked: a, ..
                        }),
                    ) if (h, a) == (*held, *asked) => {}
                    (_, got) => panic!("{what}, got {:?}", got.map(|_| "taken")),
                }
                held.release().await.unwrap();
                // Control: once the first is gone, the second takes the name.
                let after = take(&locks, second, &name).await;
                let after = after.unwrap_or_else(|e| panic!("{what}: after the release, {e:?}"));
                after.release().await.unwrap();
            }
        }
    }
}

/// Fault: a lock and a multi-lock were granted while readers held the read lock of the
/// same name (the `SET NX` and the multi-acquire script never looked at the readers).
/// Control: the write lock was refused there all along.
async fn a_lock_and_a_multi_lock_wait_for_the_readers(locks: Locks) {
    let reader = locks.read_lock("cat:7").acquire().await.unwrap();
    let w = locks.write_lock("cat:7").acquire().await;
    assert!(matches!(w, Err(Error::Busy { .. })), "control: {w:?}");
    let l = locks.lock("cat:7").acquire().await;
    assert!(matches!(l, Err(Error::Busy { .. })), "{l:?}");
    let m = locks.multi_lock(["cat:7", "cat:8"]).acquire().await;
    assert!(matches!(m, Err(Error::Busy { .. })), "{m:?}");
    // A waiting lock gets it once the last reader leaves, woken by its release.
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock("cat:7").wait(LONG).acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "a lock beside a reader");
    reader.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("woken by the last reader")
        .unwrap()
        .unwrap();
    // And a reader waits for it in turn.
    let r = locks.read_lock("cat:7").acquire().await;
    assert!(matches!(r, Err(Error::Busy { .. })), "{r:?}");
    g.release().await.unwrap();
    let both = locks
        .multi_lock(["cat:7", "cat:8"])
        .acquire()
        .await
        .unwrap();
    both.release().await.unwrap();
}

/// Fault: a plain lock's release handed the key to a write lock waiting in the same
/// client's queue while another client's reader held. With readers keeping the lock out,
/// neither the lock nor the write lock behind it gets in until the reader leaves.
async fn a_write_lock_waiting_behind_a_lock_never_joins_a_reader(locks: Locks) {
    let other = locks.clone();
    let reader = other.read_lock("doc:9").acquire().await.unwrap();
    let first = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let g = locks.lock("doc:9").wait(LONG).acquire().await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            g.release().await.unwrap();
        })
    };
    let writer = {
        let locks = locks.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            locks.write_lock("doc:9").wait(LONG).acquire().await
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !first.is_finished() && !writer.is_finished(),
        "in beside a reader"
    );
    assert!(other.inspect("doc:9").await.unwrap().holder.is_none());
    reader.release().await.unwrap();
    first.await.unwrap();
    let w = writer.await.unwrap().unwrap();
    let state = other.inspect("doc:9").await.unwrap();
    assert!(state.readers.is_empty() && state.holder.is_some());
    w.release().await.unwrap();
}

/// Fault: on a hash-tagged name, `lock("{acct}:7:fence")` was `lock("{acct}:7")`'s fence
/// counter, and `semaphore("{doc}:1:readers")` was `read_lock("{doc}:1")`'s readers.
async fn companions_are_never_another_names_keys(locks: Locks) {
    let g = locks.lock("{acct}:7").acquire().await.unwrap();
    let fence = g.fence().await.unwrap();
    // The name that was its counter is a lock of its own, free.
    let named = locks.lock("{acct}:7:fence").acquire().await.unwrap();
    assert!(named.fence().await.unwrap() > 0);
    g.release().await.unwrap();
    // `{acct}:7`'s counter still holds its last fence: the other name's fence did not
    // step it (fences follow the clock, so the next one is not `fence + 1`).
    assert_eq!(locks.inspect("{acct}:7").await.unwrap().last_fence, fence);
    let again = locks.lock("{acct}:7").acquire().await.unwrap();
    assert!(again.fence().await.unwrap() > fence);
    again.release().await.unwrap();
    named.release().await.unwrap();

    let readers = locks.read_lock("{doc}:1").acquire().await.unwrap();
    let sem = locks
        .semaphore("{doc}:1:readers", 1)
        .acquire()
        .await
        .unwrap();
    let state = locks.inspect("{doc}:1").await.unwrap();
    assert_eq!(state.readers.len(), 1);
    assert!(state.permits.is_empty());
    let state = locks.inspect("{doc}:1:readers").await.unwrap();
    assert_eq!((state.permits.len(), state.readers.len()), (1, 0));
    sem.release().await.unwrap();
    readers.release().await.unwrap();

    // A name with a second brace group would be a companion's: refused before Redis.
    for bad in ["{acct}:7{:fence}", "{a}}", "x{y}z{w}"] {
        let e = locks.lock(bad).acquire().await;
        assert!(matches!(e, Err(Error::InvalidKey { .. })), "{bad}: {e:?}");
    }
}

/// `inspect`, `force_release`, `idem_record`, `forget_idem` and `set_fenced` each refuse a
/// key of another kind, and say what it is; nothing is deleted or overwritten.
async fn operations_refuse_what_is_not_theirs(locks: Locks) {
    let held = locks.lock("order:1").acquire().await.unwrap();
    // A lock's key is not a record: no look, no delete.
    for key in ["order:1", "lock:order:1"] {
        let e = locks.forget_idem(key).await;
        assert!(matches!(e, Err(Error::InvalidKey { .. })), "{key}: {e:?}");
        let e = locks.idem_record(key).await;
        assert!(matches!(e, Err(Error::InvalidKey { .. })), "{key}: {e:?}");
    }
    // A record's key is not a lock.
    for name in ["idem:app::pay:K1"] {
        let e = locks.inspect(name).await;
        assert!(
            matches!(&e, Err(Error::InvalidKey { reason, .. }) if reason.contains("idem")),
            "{e:?}"
        );
        let e = locks.force_release(name).await;
        assert!(matches!(e, Err(Error::InvalidKey { .. })), "{e:?}");
        let e = locks.lock(name).acquire().await;
        assert!(matches!(e, Err(Error::InvalidKey { .. })), "{e:?}");
    }
    // A fenced value never writes over a lock's key or a companion.
    let fence = held.fence().await.unwrap();
    for key in ["lock:order:1", "{lock:order:1}:fence"] {
        let e = locks.set_fenced(key, "x", fence).await;
        assert!(matches!(e, Err(Error::InvalidKey { .. })), "{key}: {e:?}");
    }
    locks.set_fenced("order:1:value", "x", fence).await.unwrap();
    // Still held, by its holder alone.
    assert!(locks.lock("order:1").acquire().await.is_err());
    held.release().await.unwrap();
}

/// Fault: `forget_idem` deleted any key under the prefix, a held lock included, and a
/// second client took the lock while the first held it. Redis only: the in-memory
/// backend keeps records and locks apart. Application data under `<prefix>idem:` is
/// refused the same way (control: a real record is forgotten).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_deletes_records_and_nothing_else() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let set = |key: &'static str, value: &'static str| {
        let mut raw = raw.clone();
        async move {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg(value)
                .query_async(&mut raw)
                .await
                .unwrap();
        }
    };
    set("lock:idem:config", "eu:west-1").await;
    let control = set(
        "lock:idem:app::pay:K1",
        r#"{"status":"completed","fp":"ab","value":7}"#,
    );
    let e = locks.forget_idem("idem:config").await;
    assert!(
        matches!(
            e,
            Err(Error::WrongKind {
                held: Kind::Unknown,
                asked: Kind::IdempotencyRecord,
                ..
            })
        ),
        "{e:?}"
    );
    let kept: Option<String> = redis::cmd("GET")
        .arg("lock:idem:config")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(kept.as_deref(), Some("eu:west-1"), "nothing deleted");
    // Control: a record is forgotten.
    control.await;
    assert!(locks.forget_idem("idem:app::pay:K1").await.unwrap());
    assert!(!locks.forget_idem("idem:app::pay:K1").await.unwrap());
}

/// Fault: application data under the prefix (`lock:config:region = eu:west-1`) was listed
/// as a held lock. Only what distlock wrote is listed (control: a lock beside it is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_only_what_distlock_wrote() {
    use futures_util::TryStreamExt;
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    // Application data, and another application's records under a longer prefix.
    let claim = r#"{"claimed_at_ms":1,"fp":"ab","lease_until_ms":2,"owner":"0b5c6a8e-3f4d-4c2a-9d61-7e1f2a3b4c5d:web:1","retention_ms":3,"status":"in_progress"}"#;
    for (key, value) in [
        ("lock:config:region", "eu:west-1"),
        ("lock:config:owner", "team:payments:7"),
        ("lock:app2:idem:pay:K1", claim),
    ] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    let g = locks.lock("config:lock").acquire().await.unwrap();
    let listed: Vec<_> = locks.list("*").try_collect().await.unwrap();
    let keys: Vec<_> = listed.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, ["lock:config:lock"]);
    g.release().await.unwrap();
}

/// Fault: with `min_hold` longer than `ttl` and `renew`, a renewal in flight at the release
/// set the kept lease back to `ttl`, and the next holder got in early. The renewal is sent
/// as the client sends it (its script, and the native `SET ... IFEQ` where the server has
/// one), late, after the keep: the kept lease stands. Control: the same renewal before
/// the release does set the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_renewal_never_shortens_a_kept_lock() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let extend = redis::Script::new(distlock::__private::scripts::EXTEND);
    let renew = |key: String, token: String| {
        let (extend, mut raw) = (extend.clone(), raw.clone());
        async move {
            let by_script: i64 = extend
                .key(&key)
                .arg(&token)
                .arg(300)
                .invoke_async(&mut raw)
                .await
                .unwrap();
            // Where the server has it (Valkey 9, Redis 8.4); refused elsewhere.
            let native: redis::RedisResult<Option<String>> = redis::cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("IFEQ")
                .arg(&token)
                .arg("PX")
                .arg(300)
                .query_async(&mut raw)
                .await;
            (by_script, native.is_ok_and(|r| r.is_some()))
        }
    };
    let pttl = |mut raw: redis::aio::MultiplexedConnection| async move {
        let left: i64 = redis::cmd("PTTL")
            .arg("lock:job")
            .query_async(&mut raw)
            .await
            .unwrap();
        left
    };
    let g = locks
        .lock("job")
        .ttl(Duration::from_millis(300))
        .renew(true)
        .min_hold(Duration::from_millis(3000))
        .acquire()
        .await
        .unwrap();
    let (key, token) = (g.key().to_owned(), g.token().to_owned());
    // Control: before the keep, the renewal sets the lease to its ttl.
    let (extended, _) = renew(key.clone(), token.clone()).await;
    assert_eq!(extended, 1);
    assert!(pttl(raw.clone()).await <= 300);
    g.release().await.unwrap();
    assert!(pttl(raw.clone()).await > 2000, "kept for min_hold");
    // The renewal that was in flight arrives now.
    let (extended, native) = renew(key, token).await;
    assert_eq!(
        (extended, native),
        (0, false),
        "no renewal finds a kept lock"
    );
    assert!(pttl(raw.clone()).await > 2000, "the keep stands");
    let next = locks.lock("job").acquire().await;
    assert!(matches!(next, Err(Error::Busy { .. })), "{next:?}");
    let state = locks.inspect("job").await.unwrap();
    assert!(state.holder.is_some(), "a kept lock shows its holder");
    let _: () = redis::cmd("DEL")
        .arg("lock:job")
        .query_async(&mut raw)
        .await
        .unwrap();
}

/// Fault: fences went backwards after a restart of a Redis without persistence (the
/// counter started again from 1): Postgres `advance` then refused every new holder until
/// it caught up. Control: a plain `INCR` counter does start again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_never_go_backwards_across_a_restart_without_persistence() {
    let mut server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut before = 0;
    for _ in 0..3 {
        let g = locks.lock("acct:7").acquire().await.unwrap();
        before = g.fence().await.unwrap();
        g.release().await.unwrap();
    }
    let mut raw = server.raw().await;
    let plain: u64 = redis::cmd("INCR")
        .arg("plain-counter")
        .query_async(&mut raw)
        .await
        .unwrap();
    server.restart();
    let mut raw = server.raw().await;
    let plain_after: u64 = redis::cmd("INCR")
        .arg("plain-counter")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        plain_after <= plain,
        "control: a plain counter starts again"
    );
    let mut after = None;
    for _ in 0..20 {
        match locks.lock("acct:7").acquire().await {
            Ok(g) => {
                after = Some(g.fence().await.unwrap());
                g.release().await.unwrap();
                break;
            }
            Err(Error::Backend { .. }) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("{e:?}"),
        }
    }
    let after = after.expect("the client came back");
    assert!(after > before, "{after} after {before}");
}

/// Runs once `gate` opens; its lease is short so renewals come every 200 ms.
#[idempotent(key = "vanish:<k>", client = locks, lease = "600ms", skip = [gate, runs])]
async fn charge(
    locks: &Locks,
    k: &str,
    gate: &tokio::sync::Semaphore,
    runs: &Runs,
) -> Result<u32, Error> {
    let n = runs.bump();
    drop(gate.acquire().await);
    Ok(n)
}

/// The record of `k` under `charge`'s namespace.
async fn charge_record(locks: &Locks, k: &str) -> Option<distlock::idempotency::IdemRecord> {
    use futures_util::TryStreamExt;
    let all: Vec<_> = locks.idem_records("*").try_collect().await.unwrap();
    all.into_iter()
        .find(|r| r.key.ends_with(&format!("vanish:{k}")))
}

/// Fault: a record that vanished while its body ran (a restart without persistence, a
/// failover that lost it, eviction, a forget) made the renewal answer "lost": the body was
/// cancelled or its result dropped, and the retry ran it again. Gone is not taken: the
/// renewal writes the claim again, the body finishes, its result is stored, and the retry
/// replays it.
async fn a_record_that_vanishes_mid_body_is_written_again(locks: Locks) {
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let runs = std::sync::Arc::new(Runs::default());
    let first = tokio::spawn({
        let (locks, gate, runs) = (locks.clone(), gate.clone(), runs.clone());
        async move { charge(&locks, "v1", &gate, &runs).await }
    });
    while runs.get() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let key = charge_record(&locks, "v1").await.unwrap().key;
    assert!(locks.forget_idem(&key).await.unwrap());
    // A renewal (every 200 ms) finds it gone and writes the claim again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = locks
        .idem_record(&key)
        .await
        .unwrap()
        .expect("written again");
    assert_eq!(again.state, distlock::idempotency::RecordState::InProgress);
    gate.add_permits(10);
    assert_eq!(first.await.unwrap().unwrap(), 1);
    // The retry replays the stored result: the body ran once.
    assert_eq!(charge(&locks, "v1", &gate, &runs).await.unwrap(), 1);
    assert_eq!(runs.get(), 1);
}

/// Control: a record another call claimed while the body ran (written as another
/// owner's claim) is lost, as before: its result is not stored over the other's.
async fn a_record_taken_over_mid_body_is_lost(locks: Locks) {
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let runs = std::sync::Arc::new(Runs::default());
    let first = tokio::spawn({
        let (locks, gate, runs) = (locks.clone(), gate.clone(), runs.clone());
        async move { charge(&locks, "v2", &gate, &runs).await }
    });
    while runs.get() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let key = charge_record(&locks, "v2").await.unwrap().key;
    assert!(locks.forget_idem(&key).await.unwrap());
    // Another call claims the key before the first one's renewal comes.
    let second = tokio::spawn({
        let (locks, gate, runs) = (locks.clone(), gate.clone(), runs.clone());
        async move { charge(&locks, "v2", &gate, &runs).await }
    });
    while runs.get() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    gate.add_permits(10);
    let (a, b) = (first.await.unwrap(), second.await.unwrap());
    assert!(matches!(a, Err(Error::Lost { .. })), "{a:?}");
    assert_eq!(b.unwrap(), 2);
}

/// A lock waiting behind readers keeps new readers out as a waiting writer does, so a
/// stream of overlapping readers never starves it. Control: tries that never wait (and so
/// never mark) find the readers every time while the stream runs.
async fn a_lock_is_not_starved_by_a_stream_of_readers(locks: Locks) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let stream = tokio::spawn({
        let (locks, stop) = (locks.clone(), stop.clone());
        async move {
            let mut readers = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let locks = locks.clone();
                readers.push(tokio::spawn(async move {
                    if let Ok(r) = locks.read_lock("feed").wait(LONG).acquire().await {
                        tokio::time::sleep(Duration::from_millis(120)).await;
                        r.release().await.unwrap();
                    }
                }));
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            for r in readers {
                r.await.unwrap();
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Control: no try that does not wait gets in while the readers overlap.
    for _ in 0..20 {
        let r = locks.lock("feed").acquire().await;
        assert!(matches!(r, Err(Error::Busy { .. })), "control: {r:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let g = locks
        .lock("feed")
        .wait(Duration::from_secs(5))
        .acquire()
        .await;
    let still_streaming = !stop.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    let g = g.expect("a waiting lock gets in between the readers");
    assert!(still_streaming);
    assert!(locks.inspect("feed").await.unwrap().readers.is_empty());
    g.release().await.unwrap();
    stream.await.unwrap();
}

/// A lock whose name another kind took while it was held (force-released, then a
/// semaphore took the name): its holder is told `Lost` at its renewal and its release,
/// and the other locks renewed in the same batch stay held (a `WRONGTYPE` once failed the
/// whole batch, and leases with shorter ttls ran out). Likewise a semaphore's permit
/// whose name a lock took.
async fn a_name_taken_by_another_kind_is_lost_not_an_error(locks: Locks) {
    let ttl = Duration::from_millis(600);
    let taken = locks
        .lock("swap:x")
        .ttl(ttl)
        .renew(true)
        .acquire()
        .await
        .unwrap();
    let kept = locks
        .lock("swap:y")
        .ttl(ttl)
        .renew(true)
        .acquire()
        .await
        .unwrap();
    let permit = locks
        .semaphore("swap:p", 2)
        .ttl(ttl)
        .renew(true)
        .acquire()
        .await
        .unwrap();
    assert!(locks.force_release("swap:x").await.unwrap());
    assert!(locks.force_release("swap:p").await.unwrap());
    let sem = locks.semaphore("swap:x", 2).acquire().await.unwrap();
    let lock = locks.lock("swap:p").acquire().await.unwrap();
    // Two renewal periods and more than a ttl.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(kept.info().is_held(), "renewed beside the lost one");
    assert!(!taken.info().is_held());
    let r = taken.release().await;
    assert!(matches!(r, Err(Error::Lost { .. })), "{r:?}");
    let r = permit.release().await;
    assert!(matches!(r, Err(Error::Lost { .. })), "{r:?}");
    kept.release().await.unwrap();
    sem.release().await.unwrap();
    lock.release().await.unwrap();
}

/// Keyed by a whole argument, however large.
#[idempotent(key = "doc:<body>", client = locks, max_body = "1KiB", skip = [runs])]
async fn file_doc(locks: &Locks, body: String, runs: &Runs) -> Result<String, Error> {
    let n = runs.bump();
    Ok(format!("{n}:{}", &body[..body.len().min(2048)]))
}

/// Fault: a fn's key and stored value had no cap: a 1 MiB argument made a 1 MiB Redis key
/// (and a result of any size was stored). A long key is hashed (two long keys stay two
/// records, the same one replays); a value past `max_body` is not stored, and repeats get
/// `Unrepresentable` without running the body. Control: short keys stay readable and a
/// small value replays.
async fn long_keys_are_hashed_and_large_values_not_stored(locks: Locks) {
    use futures_util::TryStreamExt;
    let runs = Runs::default();
    let big = "x".repeat(1 << 20);
    let other = format!("{}y", "x".repeat(1 << 20));
    let first = file_doc(&locks, big.clone(), &runs).await.unwrap();
    let e = file_doc(&locks, big.clone(), &runs).await;
    assert!(
        matches!(&e, Err(Error::Unrepresentable { reason, .. }) if reason.contains("max_body")),
        "{e:?}"
    );
    assert_eq!(runs.get(), 1, "never run again: {first:.8}");
    file_doc(&locks, other, &runs).await.unwrap();
    assert_eq!(runs.get(), 2, "another long key is another record");
    // Control: a short key and a small value.
    let small = file_doc(&locks, "k".into(), &runs).await.unwrap();
    assert_eq!(file_doc(&locks, "k".into(), &runs).await.unwrap(), small);
    assert_eq!(runs.get(), 3);
    let records: Vec<_> = locks.idem_records("*").try_collect().await.unwrap();
    let keys: Vec<_> = records.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert!(keys.iter().all(|k| k.len() < 200), "{keys:?}");
    assert!(keys.iter().any(|k| k.ends_with(":doc:k")), "{keys:?}");
    assert_eq!(keys.iter().filter(|k| k.contains(":sha256:")).count(), 2);
}

/// Fault: a claim's lease end was written from its client's clock while `idem_record`
/// and `distlock leaks` compared it with the server's: a client whose clock ran an hour
/// ahead made a dead claim look alive (and one behind, a live claim stuck). The lease is
/// read as the claim script judges it, the key's ttl minus the retention (the server's
/// clock). Control: a record written with the clocks agreeing reads the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_lease_is_read_on_the_servers_clock() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let owner = "0b5c6a8e-3f4d-4c2a-9d61-7e1f2a3b4c5d:web-9:4242";
    let retention = 3_600_000u64;
    // (lease_until_ms as the writer's clock had it, the lease left on the server, stuck?)
    let cases = [
        ("ahead", now + 3_600_000, 0u64, true),
        ("behind", now - 3_600_000, 20_000, false),
        ("agreeing", now + 20_000, 20_000, false),
    ];
    for (name, until, left, stuck) in cases {
        let claim = format!(
            r#"{{"claimed_at_ms":{now},"fp":"ab","lease_until_ms":{until},"owner":"{owner}","retention_ms":{retention},"status":"in_progress"}}"#
        );
        let _: () = redis::cmd("SET")
            .arg(format!("lock:idem:app::pay:{name}"))
            .arg(&claim)
            .arg("PX")
            .arg(retention + left)
            .query_async(&mut raw)
            .await
            .unwrap();
        let record = locks
            .idem_record(&format!("idem:app::pay:{name}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.is_stuck(), stuck, "{name}: {record:?}");
        let lease = record.lease_left.unwrap();
        assert!(
            lease <= Duration::from_millis(left + 5),
            "{name}: {lease:?}"
        );
    }
}
