//! The brief's faults, for each member of the lock family (a semaphore's permit, a read
//! share, a write lock, a multi-lock): a connection the server kills while it is held,
//! a release cancelled in flight, a reply that comes after the command timeout, a
//! Redis restart, one client shared by several runtimes, a Sentinel primary, Redlock.
//! For each: what the holder is told, and whether the next holder gets in long before
//! the 30 s ttl (the control of every "freed" below: the lease alone would hold it).
use crate::common;

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use common::*;
use distlock::{Error, Locks};

const LONG: Duration = Duration::from_secs(10);

/// One member of the family on `name`: taken, and released (`Ok` or the error).
#[derive(Clone, Copy, Debug)]
enum Member {
    Permit,
    Read,
    Write,
    Multi,
}

const MEMBERS: [Member; 4] = [Member::Permit, Member::Read, Member::Write, Member::Multi];

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A held member, released through `release`.
enum Held {
    One(distlock::LockGuard),
    Many(distlock::MultiLockGuard),
}

impl Held {
    fn release(self) -> Boxed<'static, Result<(), Error>> {
        match self {
            Held::One(g) => Box::pin(g.release()),
            Held::Many(g) => Box::pin(g.release()),
        }
    }
}

impl Member {
    /// Takes the member `name` through `locks`, waiting up to `wait`.
    fn take<'a>(
        self,
        locks: &'a Locks,
        name: &str,
        wait: Duration,
    ) -> Boxed<'a, Result<Held, Error>> {
        let name = name.to_owned();
        Box::pin(async move {
            let one = |r: Result<distlock::LockGuard, Error>| r.map(Held::One);
            match self {
                Member::Permit => one(locks.semaphore(name, 1).wait(wait).acquire().await),
                Member::Read => one(locks.read_lock(name).wait(wait).acquire().await),
                Member::Write => one(locks.write_lock(name).wait(wait).acquire().await),
                Member::Multi => locks
                    .multi_lock([format!("{name}:a"), format!("{name}:b")])
                    .wait(wait)
                    .acquire()
                    .await
                    .map(Held::Many),
            }
        })
    }

    /// What excludes this member once held: a write lock for a read share (readers
    /// share), the member itself otherwise.
    fn rival(self) -> Member {
        match self {
            Member::Read => Member::Write,
            other => other,
        }
    }
}

/// The next holder (`other`) gets `member`'s rival on `name` long before the ttl.
async fn next_holder_gets_in(other: &Locks, member: Member, name: &str) {
    let started = Instant::now();
    let next = member.rival().take(other, name, LONG).await;
    let next = next.unwrap_or_else(|e| panic!("{member:?}: the next holder: {e}"));
    assert!(started.elapsed() < LONG, "{member:?}");
    next.release().await.unwrap();
}

/// Every connection of the holder's client killed by the server while it holds: the
/// release reconnects and succeeds, and the next holder gets in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_while_held() {
    let server = RedisServer::start();
    let (locks, other) = (
        Locks::connect(&server.url()).await.unwrap(),
        Locks::connect(&server.url()).await.unwrap(),
    );
    let mut admin = server.raw().await;
    for member in MEMBERS {
        let name = format!("killed:{member:?}");
        let held = member.take(&locks, &name, Duration::ZERO).await.unwrap();
        let killed: i64 = redis::cmd("CLIENT")
            .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(killed >= 1, "{member:?}: no connection killed");
        tokio::time::sleep(Duration::from_millis(50)).await;
        held.release()
            .await
            .unwrap_or_else(|e| panic!("{member:?}: {e}"));
        let started = Instant::now();
        let next = member.rival().take(&other, &name, Duration::ZERO).await;
        next.unwrap_or_else(|e| panic!("{member:?}: {e}"))
            .release()
            .await
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

/// A release cancelled in flight (replies slowed, the caller drops it at its first
/// await) finishes in a task of its own: the next holder gets in long before the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cancelled_in_flight_still_releases() {
    let server = RedisServer::start();
    let proxy = common::proxy::FaultProxy::start(server.port);
    let locks = Locks::connect(&proxy.url()).await.unwrap();
    let other = Locks::connect(&server.url()).await.unwrap();
    for member in MEMBERS {
        let name = format!("cancelled:{member:?}");
        let held = member.take(&locks, &name, Duration::ZERO).await.unwrap();
        proxy.set_latency(common::proxy::Dir::ToClient, Duration::from_millis(50));
        assert!(
            cancelled_in_flight(held.release()).await,
            "{member:?}: the release was not in flight"
        );
        next_holder_gets_in(&other, member, &name).await;
        proxy.set_latency(common::proxy::Dir::ToClient, Duration::ZERO);
    }
}

/// A try whose reply comes after the command timeout: the caller is told `Backend`
/// within it, and what the late try took is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_after_its_timeout_leaves_nothing_held() {
    let server = RedisServer::start();
    let proxy = common::proxy::FaultProxy::start(server.port);
    let locks = proxy.locks(Duration::from_millis(200));
    let other = Locks::connect(&server.url()).await.unwrap();
    for member in MEMBERS {
        let name = format!("late:{member:?}");
        // Connected, and the scripts loaded, before replies are slowed.
        let warm = member.take(&locks, &name, Duration::ZERO).await.unwrap();
        warm.release().await.unwrap();
        proxy.set_latency(common::proxy::Dir::ToClient, Duration::from_millis(400));
        let started = Instant::now();
        let late = member.take(&locks, &name, Duration::ZERO).await;
        assert!(
            matches!(late, Err(Error::Backend { .. })),
            "{member:?}: {:?}",
            late.map(|_| ())
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        proxy.set_latency(common::proxy::Dir::ToClient, Duration::ZERO);
        next_holder_gets_in(&other, member, &name).await;
    }
}

/// A restart that loses what was held: the holder is told `Lost` at release (or, for
/// a read share whose set is gone, the same), and the next holder gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_loses_what_was_held_and_says_so() {
    let mut server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut held = Vec::new();
    for member in MEMBERS {
        let name = format!("restart:{member:?}");
        held.push((
            member,
            member.take(&locks, &name, Duration::ZERO).await.unwrap(),
        ));
    }
    server.restart();
    let until = Instant::now() + LONG;
    while locks
        .lock("restart:probe")
        .acquire()
        .await
        .map(drop)
        .is_err()
    {
        assert!(Instant::now() < until, "Redis did not come back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (member, held) in held {
        let released = held.release().await;
        assert!(
            matches!(released, Err(Error::Lost { .. })),
            "{member:?}: {released:?}"
        );
    }
}

/// One client shared by four current-thread runtimes on their own threads: each runs
/// every member in turn, waiting for the others; all finish (no lost wake-up leaves a
/// waiter to its deadline: each runtime's turns take far less than the 10 s wait).
#[test]
fn runtimes_sharing_a_client_take_turns() {
    let server = RedisServer::start();
    let locks = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(Locks::connect(&server.url()))
        .unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let locks = locks.clone();
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(async move {
                        for _ in 0..5 {
                            for member in MEMBERS {
                                // The read and write sides of one lock contend.
                                let name = match member {
                                    Member::Read | Member::Write => "shared:rw".to_owned(),
                                    other => format!("shared:{other:?}"),
                                };
                                let g = member.take(&locks, &name, LONG).await.unwrap();
                                tokio::time::sleep(Duration::from_millis(2)).await;
                                g.release().await.unwrap();
                            }
                        }
                    })
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// Through Sentinel's primary: every member taken and released, and excluded while
/// held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_through_sentinel() {
    let primary = RedisServer::start();
    let sentinels: Vec<testkit::RedisSentinel> = (0..1)
        .map(|_| testkit::RedisSentinel::start(primary.port))
        .collect();
    sentinels[0].wait_ready(1, 0, Duration::from_secs(30));
    let urls: Vec<String> = sentinels.iter().map(testkit::RedisSentinel::url).collect();
    let locks = Locks::sentinel(testkit::RedisSentinel::MASTER, urls)
        .connect()
        .await
        .unwrap();
    for member in MEMBERS {
        let name = format!("sentinel:{member:?}");
        let held = member.take(&locks, &name, Duration::ZERO).await.unwrap();
        let rival = member.rival().take(&locks, &name, Duration::ZERO).await;
        assert!(
            matches!(rival, Err(Error::Busy { .. })),
            "{member:?}: {:?}",
            rival.map(|_| ())
        );
        held.release().await.unwrap();
        next_holder_gets_in(&locks, member, &name).await;
    }
}

/// Over Redlock a multi-lock is taken the ordered way, each key on a quorum; the
/// semaphore and read/write locks are refused (see `redlock.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_over_redlock() {
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let locks = Locks::redlock(masters.iter().map(RedisServer::url))
        .build()
        .unwrap();
    let both = locks.multi_lock(["r:b", "r:a"]).acquire().await.unwrap();
    assert!(!both.taken_at_once());
    assert!(matches!(
        locks.lock("r:a").acquire().await,
        Err(Error::Busy { .. })
    ));
    both.release().await.unwrap();
    let again = locks.multi_lock(["r:a", "r:b"]).acquire().await.unwrap();
    again.release().await.unwrap();
}
