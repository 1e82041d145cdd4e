//! Fences that the storage checks (`Locks::set_fenced`): the field's story end to end (a
//! holder paused past its lease writes after the next holder and is refused, the later
//! write stays), equal fences, concurrent writers, and the value readable by any client.
//! The control in each story: the same late write to storage that checks nothing
//! overwrites the later holder's value.
use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use distlock::{Error, Locks};

both!(
    a_paused_holders_late_write_is_refused,
    an_equal_fence_is_accepted,
);

async fn a_paused_holders_late_write_is_refused(locks: Locks) {
    let mut unchecked: HashMap<&str, &str> = HashMap::new();
    let a = locks
        .lock("account:7")
        .ttl(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap();
    let fence_a = a.fence().await.unwrap();
    // A pauses past its lease; B takes the lock and writes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = locks.lock("account:7").acquire().await.unwrap();
    let fence_b = b.fence().await.unwrap();
    assert!(fence_b > fence_a);
    locks.set_fenced("balance:7", "B", fence_b).await.unwrap();
    unchecked.insert("balance:7", "B");
    // A wakes and writes, unaware.
    let late = locks.set_fenced("balance:7", "A", fence_a).await;
    match late {
        Err(Error::StaleFence {
            resource,
            fence,
            seen,
        }) => {
            assert_eq!(
                (resource.as_str(), fence, seen),
                ("balance:7", fence_a, fence_b)
            );
        }
        other => panic!("expected StaleFence, got {other:?}"),
    }
    assert_eq!(
        locks.fenced_value("balance:7").await.unwrap(),
        (Some("B".to_owned()), fence_b)
    );
    // Control: storage that checks no fence keeps A's late write over B's.
    unchecked.insert("balance:7", "A");
    assert_eq!(unchecked["balance:7"], "A");
    assert!(matches!(a.release().await, Err(Error::Lost { .. })));
    b.release().await.unwrap();
}

async fn an_equal_fence_is_accepted(locks: Locks) {
    let g = locks.lock("doc:1").acquire().await.unwrap();
    let fence = g.fence().await.unwrap();
    locks
        .set_fenced("doc:1:body", "draft", fence)
        .await
        .unwrap();
    locks
        .set_fenced("doc:1:body", "final", fence)
        .await
        .unwrap();
    assert_eq!(
        locks.fenced_value("doc:1:body").await.unwrap(),
        (Some("final".to_owned()), fence)
    );
    assert_eq!(locks.fenced_value("doc:2:body").await.unwrap(), (None, 0));
    g.release().await.unwrap();
}

/// Writers racing with fences in any order: the value is the largest fence's, whatever
/// order they arrive in; every smaller one that came after it was refused. On Redis, the
/// value and the fence are plain strings any client reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_leave_the_largest_fences_value() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut fences: Vec<u64> = (1..=40).collect();
    fastrand::shuffle(&mut fences);
    let writers: Vec<_> = fences
        .iter()
        .map(|&fence| {
            let locks = locks.clone();
            tokio::spawn(async move {
                match locks
                    .set_fenced("report", &format!("v{fence}"), fence)
                    .await
                {
                    Ok(()) => true,
                    Err(Error::StaleFence { seen, .. }) => {
                        assert!(seen > fence);
                        false
                    }
                    Err(e) => panic!("{e}"),
                }
            })
        })
        .collect();
    let mut stored = 0;
    for w in writers {
        stored += usize::from(w.await.unwrap());
    }
    assert!(stored >= 1);
    let mut raw = server.raw().await;
    let value: Option<String> = redis::AsyncCommands::get(&mut raw, "report").await.unwrap();
    let seen: Option<String> = redis::AsyncCommands::get(&mut raw, "{report}:fence-seen")
        .await
        .unwrap();
    assert_eq!(value.as_deref(), Some("v40"));
    assert_eq!(seen.as_deref(), Some("40"));
}

/// Fences compare as numbers, also past what a Lua number holds exactly (2^53).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_fences_compare_exactly() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let big = (1u64 << 60) + 1;
    locks.set_fenced("big", "later", big).await.unwrap();
    let late = locks.set_fenced("big", "earlier", big - 1).await;
    assert!(
        matches!(late, Err(Error::StaleFence { seen, .. }) if seen == big),
        "{late:?}"
    );
    locks.set_fenced("big", "same", big).await.unwrap();
    locks.set_fenced("big", "shorter", 9).await.unwrap_err();
    assert_eq!(
        locks.fenced_value("big").await.unwrap(),
        (Some("same".to_owned()), big)
    );
}

/// Fence counters that expire once their name has been idle: every fence sets
/// the counter's ttl to the client's fence idle window, and a counter made afresh starts
/// from the clock, so the fence after an expiry is still above every earlier one.
mod idle_counters {
    use std::time::Duration;

    use distlock::{Error, Locks};
    use redis::AsyncCommands;
    use redis::aio::MultiplexedConnection;

    use crate::common::RedisServer;

    /// The short window these tests configure, and the ttl of their locks (below it).
    const WINDOW: Duration = Duration::from_millis(500);
    const TTL: Duration = Duration::from_millis(100);

    /// A client of `server` (or in memory) whose counters expire after `WINDOW`.
    async fn short_window(server: Option<&RedisServer>) -> Locks {
        let builder = match server {
            Some(server) => Locks::builder(server.url()),
            None => Locks::builder("memory"),
        }
        .fence_idle_window(WINDOW)
        .command_timeout(Duration::from_millis(500));
        match server {
            Some(_) => builder.connect().await.unwrap(),
            None => builder.build_in_memory().unwrap(),
        }
    }

    /// One acquisition of `name` for `ttl`, its fence, and its release.
    async fn fence_once(locks: &Locks, name: &str, ttl: Duration) -> Result<u64, Error> {
        let g = locks.lock(name).ttl(ttl).acquire().await?;
        let fence = g.fence().await?;
        g.release().await?;
        Ok(fence)
    }

    /// `fence_once`, tried again while a restarted server is reconnected to.
    async fn fence_after_restart(locks: &Locks, name: &str) -> u64 {
        for _ in 0..20 {
            match fence_once(locks, name, TTL).await {
                Ok(fence) => return fence,
                Err(Error::Backend { .. } | Error::Lost { .. }) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("{e}"),
            }
        }
        panic!("no fence within 2 s of the restart");
    }

    /// The counter's ttl in ms (-2: no counter, -1: no ttl).
    async fn pttl(raw: &mut MultiplexedConnection, counter: &str) -> i64 {
        raw.pttl(counter).await.unwrap()
    }

    /// The last fence the counter of `name` holds (0: no counter).
    async fn counter(locks: &Locks, name: &str) -> u64 {
        locks.inspect(name).await.unwrap().last_fence
    }

    /// A name fenced, then idle past the window: its counter is gone and the next fence is
    /// still higher. Controls: a fence within the window steps the counter and gives it
    /// the whole window again (the counter outlives the first fence's window), and a
    /// client with the default window (a day) keeps the counter through the same wait.
    async fn an_idle_counter_expires_and_the_next_fence_is_higher(
        short: Locks,
        default: Locks,
        mut raw: Option<MultiplexedConnection>,
    ) {
        let first = fence_once(&short, "order:1", TTL).await.unwrap();
        assert_eq!(counter(&short, "order:1").await, first);
        if let Some(raw) = &mut raw {
            let left = pttl(raw, "{lock:order:1}:fence").await;
            assert!((1..=500).contains(&left), "the counter's ttl: {left}");
        }
        let kept = fence_once(&default, "order:2", TTL).await.unwrap();
        // Control: fenced again within the window, the counter steps and lives on past the
        // first fence's window.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let second = fence_once(&short, "order:1", TTL).await.unwrap();
        assert!(second > first, "{second} after {first}");
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(
            counter(&short, "order:1").await,
            second,
            "renewed by the second fence"
        );
        // Idle past the window: the counter is gone.
        tokio::time::sleep(WINDOW + Duration::from_millis(200)).await;
        assert_eq!(counter(&short, "order:1").await, 0, "the counter expired");
        if let Some(raw) = &mut raw {
            let exists: bool = raw.exists("{lock:order:1}:fence").await.unwrap();
            assert!(!exists, "the counter key is gone");
        }
        // Control: the default window keeps the counter through the same wait.
        assert_eq!(counter(&default, "order:2").await, kept);
        if let Some(raw) = &mut raw {
            let left = pttl(raw, "{lock:order:2}:fence").await;
            assert!(left > 86_000_000, "a day's window: {left}");
        }
        // A counter made afresh starts from the clock, above every earlier fence.
        let third = fence_once(&short, "order:1", TTL).await.unwrap();
        assert!(
            third > second,
            "{third} after {second}: a fence went backwards"
        );
        assert_eq!(counter(&short, "order:1").await, third);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_redis_an_idle_counter_expires_and_the_next_fence_is_higher() {
        let server = RedisServer::start();
        let short = short_window(Some(&server)).await;
        let default = Locks::connect(&server.url()).await.unwrap();
        let raw = server.raw().await;
        an_idle_counter_expires_and_the_next_fence_is_higher(short, default, Some(raw)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_memory_an_idle_counter_expires_and_the_next_fence_is_higher() {
        let short = short_window(None).await;
        an_idle_counter_expires_and_the_next_fence_is_higher(short, Locks::in_memory(), None).await;
    }

    /// A window shorter than a lock's ttl is raised to that ttl for its fences: the
    /// counter of a lock held for 2 s outlives the 500 ms window. Control: a lock of
    /// 100 ms fenced at the same moment loses its counter after the window.
    async fn a_window_shorter_than_the_ttl_is_raised_to_it(
        locks: Locks,
        mut raw: Option<MultiplexedConnection>,
    ) {
        let long = fence_once(&locks, "job:long", Duration::from_secs(2))
            .await
            .unwrap();
        let short = fence_once(&locks, "job:short", TTL).await.unwrap();
        if let Some(raw) = &mut raw {
            let left = pttl(raw, "{lock:job:long}:fence").await;
            assert!((1_000..=2_000).contains(&left), "the lock's ttl: {left}");
        }
        tokio::time::sleep(WINDOW + Duration::from_millis(300)).await;
        assert_eq!(counter(&locks, "job:long").await, long);
        assert_eq!(counter(&locks, "job:short").await, 0, "control: {short}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_redis_a_window_shorter_than_the_ttl_is_raised_to_it() {
        let server = RedisServer::start();
        let locks = short_window(Some(&server)).await;
        a_window_shorter_than_the_ttl_is_raised_to_it(locks, Some(server.raw().await)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_memory_a_window_shorter_than_the_ttl_is_raised_to_it() {
        a_window_shorter_than_the_ttl_is_raised_to_it(short_window(None).await, None).await;
    }

    /// Across restarts of a Redis without persistence: a name fenced, idle past its
    /// window, Redis restarted, fenced again: higher. And a restart right after a fence,
    /// with the counter still live: the next fence is higher too. Control: a counter that
    /// did not follow the clock (a plain `INCR` on the restarted server, as a counter
    /// seeded from 0 would be) starts below every fence given before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fences_grow_across_an_expiry_and_a_restart() {
        let mut server = RedisServer::start();
        let locks = short_window(Some(&server)).await;
        let first = fence_once(&locks, "order:7", TTL).await.unwrap();
        tokio::time::sleep(WINDOW + Duration::from_millis(200)).await;
        let mut raw = server.raw().await;
        let exists: bool = raw.exists("{lock:order:7}:fence").await.unwrap();
        assert!(!exists, "the counter expired before the restart");
        server.restart();
        let second = fence_after_restart(&locks, "order:7").await;
        assert!(second > first, "{second} after {first}");
        // A restart while the counter lives: it is lost with everything else.
        let mut raw = server.raw().await;
        let left = pttl(&mut raw, "{lock:order:7}:fence").await;
        assert!((1..=500).contains(&left), "the counter's ttl: {left}");
        server.restart();
        let third = fence_after_restart(&locks, "order:7").await;
        assert!(third > second, "{third} after {second}");
        let mut raw = server.raw().await;
        let plain: u64 = raw.incr("{lock:control}:fence", 1).await.unwrap();
        assert!(plain < first, "a plain counter: {plain}");
    }

    /// A counter left with no ttl (by a version before the counters expired) gets the
    /// window at its next fence, and its fence is above both its value and the clock.
    /// Control: before that fence the counter has no ttl; and a counter ahead of the clock
    /// is stepped by one, never set back to the clock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_counter_without_a_ttl_gets_one_at_its_next_fence() {
        let server = RedisServer::start();
        let locks = short_window(Some(&server)).await;
        let mut raw = server.raw().await;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        let behind = now - 10_000_000;
        let ahead = now + 60_000_000;
        let _: () = raw.set("{lock:old:1}:fence", behind).await.unwrap();
        let _: () = raw.set("{lock:old:2}:fence", ahead).await.unwrap();
        assert_eq!(pttl(&mut raw, "{lock:old:1}:fence").await, -1);
        let fence = fence_once(&locks, "old:1", TTL).await.unwrap();
        assert!(fence >= now, "{fence} from the clock ({now})");
        let left = pttl(&mut raw, "{lock:old:1}:fence").await;
        assert!((1..=500).contains(&left), "the counter's ttl: {left}");
        assert_eq!(fence_once(&locks, "old:2", TTL).await.unwrap(), ahead + 1);
    }

    /// `set_fenced_with_ttl`: the value and its record of the highest fence expire
    /// together, after which a write under any fence is the first of a new value; a
    /// plain `set_fenced` afterwards leaves both without a ttl. Control: a value written
    /// by `set_fenced` keeps value and record through the same wait.
    async fn a_fenced_values_record_lives_as_long_as_the_value(
        locks: Locks,
        mut raw: Option<MultiplexedConnection>,
    ) {
        let g = locks.lock("quote:1").acquire().await.unwrap();
        let fence = g.fence().await.unwrap();
        g.release().await.unwrap();
        let ttl = Duration::from_millis(300);
        locks
            .set_fenced_with_ttl("price:1", "a", fence, ttl)
            .await
            .unwrap();
        locks.set_fenced("price:2", "b", fence).await.unwrap();
        if let Some(raw) = &mut raw {
            for key in ["price:1", "{price:1}:fence-seen"] {
                let left = pttl(raw, key).await;
                assert!((1..=300).contains(&left), "{key}: {left}");
            }
            for key in ["price:2", "{price:2}:fence-seen"] {
                assert_eq!(pttl(raw, key).await, -1, "{key}");
            }
        }
        // A refused write changes neither the value nor its lifetime.
        assert!(matches!(
            locks
                .set_fenced_with_ttl("price:1", "late", fence - 1, Duration::from_secs(60))
                .await,
            Err(Error::StaleFence { .. })
        ));
        tokio::time::sleep(ttl + Duration::from_millis(200)).await;
        assert_eq!(locks.fenced_value("price:1").await.unwrap(), (None, 0));
        if let Some(raw) = &mut raw {
            let left: i64 = raw
                .exists(&["price:1", "{price:1}:fence-seen"])
                .await
                .unwrap();
            assert_eq!(left, 0, "both keys expired");
        }
        assert_eq!(
            locks.fenced_value("price:2").await.unwrap(),
            (Some("b".to_owned()), fence)
        );
        // The next write is the first of a new value; a plain one keeps it for ever.
        locks
            .set_fenced_with_ttl("price:1", "c", 7, ttl)
            .await
            .unwrap();
        locks.set_fenced("price:1", "d", 8).await.unwrap();
        if let Some(raw) = &mut raw {
            for key in ["price:1", "{price:1}:fence-seen"] {
                assert_eq!(pttl(raw, key).await, -1, "{key}");
            }
        }
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        assert_eq!(
            locks.fenced_value("price:1").await.unwrap(),
            (Some("d".to_owned()), 8)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_redis_a_fenced_values_record_lives_as_long_as_the_value() {
        let server = RedisServer::start();
        let locks = Locks::connect(&server.url()).await.unwrap();
        a_fenced_values_record_lives_as_long_as_the_value(locks, Some(server.raw().await)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_memory_a_fenced_values_record_lives_as_long_as_the_value() {
        a_fenced_values_record_lives_as_long_as_the_value(Locks::in_memory(), None).await;
    }

    /// `fence.lua` before counters expired: the counter made once from the clock, then
    /// incremented, never given a ttl (the control of the measurement below).
    const FENCE_WITHOUT_TTL: &str = r"
local held = redis.pcall('GET', KEYS[1])
if held == ARGV[1] or held == ARGV[1] .. ' waiting' then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    local t = redis.call('TIME')
    redis.call('SET', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
  end
  return redis.call('INCR', KEYS[2])
end
return false";

    /// Redis's `used_memory`.
    async fn used_memory(raw: &mut MultiplexedConnection) -> i64 {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(raw)
            .await
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// redis-server's µs per `EVALSHA` since the last `CONFIG RESETSTAT` (Lua's inner
    /// calls included).
    async fn usec_per_evalsha(raw: &mut MultiplexedConnection) -> String {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(raw)
            .await
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
            .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("usec_per_call=")))
            .unwrap_or("?")
            .to_owned()
    }

    /// Fences `names` distinct names through `script` as distlock sends it (`SET` of the
    /// lock key, the script, `DEL` of the lock key: a lock taken, fenced and released),
    /// pipelined 10,000 names at a time; `window_ms` is its idle window argument.
    async fn fence_names(
        raw: &mut MultiplexedConnection,
        script: &redis::Script,
        names: usize,
        window_ms: u64,
    ) {
        let _: String = script.prepare_invoke().load_async(raw).await.unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(raw)
            .await
            .unwrap();
        for start in (0..names).step_by(10_000) {
            let mut pipe = redis::pipe();
            for i in start..(start + 10_000).min(names) {
                let key = format!("lock:order:{i}");
                pipe.cmd("SET")
                    .arg(&key)
                    .arg("tok")
                    .arg("PX")
                    .arg(30_000)
                    .ignore();
                pipe.cmd("EVALSHA")
                    .arg(script.get_hash())
                    .arg(2)
                    .arg(&key)
                    .arg(format!("{{{key}}}:fence"))
                    .arg("tok")
                    .arg(window_ms)
                    .ignore();
                pipe.cmd("DEL").arg(&key).ignore();
            }
            let _: () = pipe.query_async(raw).await.unwrap();
        }
    }

    /// The measurement of `benches/README.md` ("Fence counters"): Redis memory after a
    /// million names fenced, then once their idle window (here 60 s) has passed; the
    /// same million fenced as before counters expired, as the control. About 2 minutes.
    /// `cargo test --all-features --test suite -- --ignored --nocapture memory_of_a_million_fenced_names`
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement of about 2 minutes"]
    async fn memory_of_a_million_fenced_names() {
        const NAMES: usize = 1_000_000;
        const WINDOW_MS: u64 = 60_000;
        let server = RedisServer::start();
        let mut raw = server.raw().await;
        let empty = used_memory(&mut raw).await;
        let started = std::time::Instant::now();
        let script = redis::Script::new(distlock::__private::scripts::FENCE);
        fence_names(&mut raw, &script, NAMES, WINDOW_MS).await;
        let fenced = used_memory(&mut raw).await;
        let took = started.elapsed();
        let keys: i64 = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
        let one: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg("{lock:order:0}:fence")
            .query_async(&mut raw)
            .await
            .unwrap();
        let left = pttl(&mut raw, "{lock:order:0}:fence").await;
        println!(
            "fence.lua: {NAMES} names fenced in {took:.1?}: {keys} keys, used_memory {empty} -> {fenced} ({:.1} MB, {} bytes a name); MEMORY USAGE of one counter {one} bytes, its PTTL {left} ms; {} µs of redis-server CPU per EVALSHA",
            (fenced - empty) as f64 / 1e6,
            (fenced - empty) / NAMES as i64,
            usec_per_evalsha(&mut raw).await
        );
        assert_eq!(keys, NAMES as i64);
        // The window passes: every counter expires (Redis's active expiry, no reads).
        let idle_from = std::time::Instant::now();
        let deadline = started + Duration::from_millis(WINDOW_MS) + Duration::from_secs(120);
        loop {
            let keys: i64 = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
            if keys == 0 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{keys} keys left");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let after = used_memory(&mut raw).await;
        println!(
            "after the window: 0 keys {:.1?} after the last fence, used_memory {after} ({} bytes above empty)",
            idle_from.elapsed(),
            after - empty
        );
        assert!(after - empty < (fenced - empty) / 100, "{after}");
        // Control: the script before counters expired keeps every counter.
        let before = redis::Script::new(FENCE_WITHOUT_TTL);
        let empty = used_memory(&mut raw).await;
        fence_names(&mut raw, &before, NAMES, WINDOW_MS).await;
        let kept = used_memory(&mut raw).await;
        let one: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg("{lock:order:0}:fence")
            .query_async(&mut raw)
            .await
            .unwrap();
        println!(
            "control, no ttl: used_memory {empty} -> {kept} ({:.1} MB, {} bytes a name); MEMORY USAGE of one counter {one} bytes, its PTTL {} ms (kept for ever); {} µs of redis-server CPU per EVALSHA",
            (kept - empty) as f64 / 1e6,
            (kept - empty) / NAMES as i64,
            pttl(&mut raw, "{lock:order:0}:fence").await,
            usec_per_evalsha(&mut raw).await
        );
    }
}

/// Fences that Postgres checks (`fencing::postgres`), against a Postgres the harness
/// starts (one for these tests; stopped when the test process ends).
#[cfg(feature = "postgres")]
mod on_postgres {
    use std::sync::OnceLock;
    use std::time::Duration;

    use distlock::fencing::postgres::{advance, install};
    use distlock::{Error, Locks, current_lock, distributed_lock};
    use sqlx::PgPool;
    use testkit::PgServer;

    use crate::common::{AppError, RedisServer};

    /// One server for these tests; each uses resources and tables of its own.
    fn server() -> &'static PgServer {
        static SERVER: OnceLock<PgServer> = OnceLock::new();
        SERVER.get_or_init(PgServer::start)
    }

    /// A pool on the shared server, with the fences table and a table `name` of
    /// `(id int primary key, owner text)` holding row 1.
    async fn pool_with(name: &str) -> PgPool {
        let pool = PgPool::connect(&server().url()).await.unwrap();
        install(&pool).await.unwrap();
        sqlx::query(&format!(
            "CREATE TABLE {name} (id int PRIMARY KEY, owner text NOT NULL)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(&format!("INSERT INTO {name} VALUES (1, 'nobody')"))
            .execute(&pool)
            .await
            .unwrap();
        pool
    }

    async fn owner(pool: &PgPool, table: &str) -> String {
        sqlx::query_scalar(&format!("SELECT owner FROM {table} WHERE id = 1"))
            .fetch_one(pool)
            .await
            .unwrap()
    }

    /// `who` writes row 1 of `table` in a transaction that first advances `resource` to
    /// `fence` (`checked`), or without it (the control).
    async fn write(
        pool: &PgPool,
        table: &str,
        resource: &str,
        who: &str,
        fence: u64,
        checked: bool,
    ) -> Result<(), Error> {
        let mut tx = pool.begin().await.unwrap();
        if checked {
            advance(&mut tx, resource, fence).await?;
        }
        sqlx::query(&format!("UPDATE {table} SET owner = $1 WHERE id = 1"))
            .bind(who)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        Ok(())
    }

    /// The field's story: A takes the lock and its fence, pauses past its lease; B takes
    /// the lock with a larger fence and commits; A wakes and writes. Its transaction is
    /// refused with `StaleFence` and B's write stays. Control: the same late write in a
    /// transaction that does not advance the fence overwrites B's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paused_holders_commit_is_refused() {
        let redis = RedisServer::start();
        let locks = Locks::connect(&redis.url()).await.unwrap();
        let pool = pool_with("accounts_story").await;
        let a = locks
            .lock("account:1")
            .ttl(Duration::from_millis(100))
            .acquire()
            .await
            .unwrap();
        let fence_a = a.fence().await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await; // A pauses past its lease
        let b = locks.lock("account:1").acquire().await.unwrap();
        let fence_b = b.fence().await.unwrap();
        write(&pool, "accounts_story", "story:1", "B", fence_b, true)
            .await
            .unwrap();
        b.release().await.unwrap();
        let late = write(&pool, "accounts_story", "story:1", "A", fence_a, true).await;
        assert!(
            matches!(&late, Err(Error::StaleFence { fence, seen, .. }) if *fence == fence_a && *seen == fence_b),
            "{late:?}"
        );
        assert_eq!(owner(&pool, "accounts_story").await, "B");
        // Control: unchecked, A's late write overwrites B's.
        write(&pool, "accounts_story", "story:1", "A", fence_a, false)
            .await
            .unwrap();
        assert_eq!(owner(&pool, "accounts_story").await, "A");
        assert!(matches!(a.release().await, Err(Error::Lost { .. })));
    }

    /// Two transactions on one resource: the second `advance` waits for the first
    /// transaction's end (the row lock), then is judged against what it committed: a
    /// smaller fence is refused after a larger one commits; a larger one goes through
    /// after a smaller one commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_transactions_are_ordered() {
        let pool = pool_with("accounts_race").await;
        for (first, second, second_ok) in [(20, 10, false), (30, 40, true)] {
            let mut t1 = pool.begin().await.unwrap();
            advance(&mut t1, "race", first).await.unwrap();
            let waiting = {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let mut t2 = pool.begin().await.unwrap();
                    let r = advance(&mut t2, "race", second).await;
                    if r.is_ok() {
                        t2.commit().await.unwrap();
                    }
                    r
                })
            };
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(
                !waiting.is_finished(),
                "the second advance did not wait for the row lock"
            );
            t1.commit().await.unwrap();
            let r = waiting.await.unwrap();
            if second_ok {
                r.unwrap();
            } else {
                assert!(
                    matches!(
                        r,
                        Err(Error::StaleFence {
                            fence: 10,
                            seen: 20,
                            ..
                        })
                    ),
                    "{r:?}"
                );
            }
        }
        let seen: i64 =
            sqlx::query_scalar("SELECT fence FROM distlock_fences WHERE resource = 'race'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(seen, 40);
    }

    /// Under REPEATABLE READ and SERIALIZABLE, a transaction whose snapshot predates
    /// another's committed advance of the same resource gets `StaleFence`, not a
    /// serialization `Backend` error, for a smaller or a larger fence alike (it cannot
    /// read the other's fence). Control: under READ COMMITTED the larger fence goes
    /// through once the first commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stricter_isolation_answers_stale_fence() {
        let pool = pool_with("accounts_iso").await;
        for (level, n) in [
            ("REPEATABLE READ", 0),
            ("SERIALIZABLE", 1),
            ("READ COMMITTED", 2),
        ] {
            let resource = format!("iso:{n}");
            advance(&mut pool.acquire().await.unwrap(), &resource, 10)
                .await
                .unwrap();
            for (second, committed) in [(15, 20), (50, 40)] {
                let resource = format!("{resource}:{second}");
                let mut t2 = pool.begin().await.unwrap();
                sqlx::query(&format!("SET TRANSACTION ISOLATION LEVEL {level}"))
                    .execute(&mut *t2)
                    .await
                    .unwrap();
                // Its snapshot is taken now, before the other transaction commits.
                let _: i64 = sqlx::query_scalar("SELECT count(*) FROM distlock_fences")
                    .fetch_one(&mut *t2)
                    .await
                    .unwrap();
                let mut t1 = pool.begin().await.unwrap();
                advance(&mut t1, &resource, committed).await.unwrap();
                t1.commit().await.unwrap();
                let r = advance(&mut t2, &resource, second).await;
                match (level, second > committed) {
                    ("READ COMMITTED", true) => r.unwrap(),
                    ("READ COMMITTED", false) => assert!(
                        matches!(r, Err(Error::StaleFence { seen, .. }) if seen == committed),
                        "{level}: {r:?}"
                    ),
                    _ => assert!(
                        matches!(r, Err(Error::StaleFence { .. })),
                        "{level}, {second} after {committed}: {r:?}"
                    ),
                }
            }
        }
    }

    #[distributed_lock(key = "account:<id>", client = locks)]
    async fn withdraw(locks: &Locks, pool: &PgPool, id: u32) -> Result<u64, AppError> {
        let fence = current_lock().unwrap().fence().await?;
        let mut tx = pool.begin().await.map_err(|_| AppError::App("begin"))?;
        advance(&mut tx, &format!("account:{id}"), fence).await?;
        sqlx::query("UPDATE accounts_attr SET owner = owner || '+' WHERE id = 1")
            .execute(&mut *tx)
            .await
            .map_err(|_| AppError::App("update"))?;
        tx.commit().await.map_err(|_| AppError::App("commit"))?;
        Ok(fence)
    }

    /// The attribute's body takes its fence right before the write and advances it in
    /// its transaction: each call records a larger fence.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_attribute_body_advances_its_fence() {
        let redis = RedisServer::start();
        let locks = Locks::connect(&redis.url()).await.unwrap();
        let pool = pool_with("accounts_attr").await;
        let first = withdraw(&locks, &pool, 1).await.unwrap();
        let second = withdraw(&locks, &pool, 1).await.unwrap();
        assert!(second > first);
        assert_eq!(owner(&pool, "accounts_attr").await, "nobody++");
        let seen: i64 =
            sqlx::query_scalar("SELECT fence FROM distlock_fences WHERE resource = 'account:1'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(u64::try_from(seen).unwrap(), second);
    }
}
