//! The fault-injecting proxy of `common::proxy`, checked against a real redis-server:
//! pass-through, latency, held replies delivered late, commands held by pattern (and
//! still delivered after their client closed), dropped replies, resets, stalls, and
//! distlock clients whose release replies are held past the command timeout or lost.
use crate::common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::proxy::{Dir, FaultProxy};
use common::*;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

/// A redis-rs connection through `proxy` whose calls time out after `timeout`.
async fn conn(proxy: &FaultProxy, timeout: Duration) -> MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(timeout));
    redis::Client::open(proxy.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap()
}

/// A raw socket through `proxy`: bytes in, bytes out, nothing else.
fn raw_socket(proxy: &FaultProxy) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    s
}

/// `cmd` in RESP, as a client sends it.
fn resp(cmd: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", cmd.len()).into_bytes();
    for arg in cmd {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

/// Reads exactly `want` within `within`, or panics.
fn read_reply(s: &mut TcpStream, want: &[u8], within: Duration) {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = vec![0u8; want.len()];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(String::from_utf8_lossy(&buf), String::from_utf8_lossy(want));
}

/// Asserts nothing arrives on `s` for `for_`.
fn read_nothing(s: &mut TcpStream, for_: Duration) {
    s.set_read_timeout(Some(for_)).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("expected no bytes, got {other:?} {:?}", &buf[..8]),
    }
}

async fn get(server: &RedisServer, key: &str) -> Option<String> {
    server.raw().await.get(key).await.unwrap()
}

#[tokio::test]
async fn passes_commands_and_replies_through() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let mut c = conn(&proxy, Duration::from_secs(2)).await;
    let pong: String = redis::cmd("PING").query_async(&mut c).await.unwrap();
    assert_eq!(pong, "PONG");
    let () = c.set("k", "v").await.unwrap();
    let v: String = c.get("k").await.unwrap();
    assert_eq!(v, "v");
    assert_eq!(get(&server, "k").await.as_deref(), Some("v")); // it reached the real server
    assert_eq!(proxy.connections(), 1);
    // A value larger than one read chunk arrives whole, in order.
    let big: String = (0..200_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let () = c.set("big", &big).await.unwrap();
    let back: String = c.get("big").await.unwrap();
    assert!(back == big);
}

#[tokio::test]
async fn latency_delays_each_direction() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let mut c = conn(&proxy, Duration::from_secs(2)).await;
    let d = Duration::from_millis(200);
    for dir in [Dir::ToServer, Dir::ToClient] {
        proxy.set_latency(dir, d);
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut c).await.unwrap();
        let took = t.elapsed();
        assert!(took >= d && took < d * 3, "{dir:?}: {took:?}");
        proxy.set_latency(dir, Duration::ZERO);
    }
    // Both set: they add up.
    proxy.set_latency(Dir::ToServer, d);
    proxy.set_latency(Dir::ToClient, d);
    let t = Instant::now();
    let _: String = redis::cmd("PING").query_async(&mut c).await.unwrap();
    assert!(t.elapsed() >= d * 2, "{:?}", t.elapsed());
    proxy.set_latency(Dir::ToServer, Duration::ZERO);
    proxy.set_latency(Dir::ToClient, Duration::ZERO);
    let t = Instant::now();
    let _: String = redis::cmd("PING").query_async(&mut c).await.unwrap();
    assert!(t.elapsed() < d, "{:?}", t.elapsed());
}

/// The server runs the command, the caller times out, and the reply comes late.
#[tokio::test]
async fn held_reply_arrives_after_release() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let mut c = conn(&proxy, Duration::from_millis(200)).await;
    let mut raw = raw_socket(&proxy);
    proxy.hold_replies();

    let t = Instant::now();
    let e = c.set::<_, _, ()>("held", "1").await.unwrap_err();
    assert!(e.is_timeout(), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    // ... yet the SET ran.
    assert_eq!(get(&server, "held").await.as_deref(), Some("1"));

    raw.write_all(&resp(&["SET", "raw", "2"])).unwrap();
    read_nothing(&mut raw, Duration::from_millis(300));
    assert_eq!(get(&server, "raw").await.as_deref(), Some("2"));

    proxy.release_replies();
    read_reply(&mut raw, b"+OK\r\n", Duration::from_secs(1));
    // The late reply to the timed-out SET did not confuse the next call.
    let v: String = c.get("held").await.unwrap();
    assert_eq!(v, "1");
}

/// Several replies held in turn are delivered whole and in order.
#[tokio::test]
async fn held_replies_keep_their_order() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let mut raw = raw_socket(&proxy);
    proxy.hold_replies();
    let mut want = Vec::new();
    for i in 0..20 {
        raw.write_all(&resp(&["ECHO", &format!("m{i:02}")]))
            .unwrap();
        want.extend_from_slice(format!("$3\r\nm{i:02}\r\n").as_bytes());
    }
    read_nothing(&mut raw, Duration::from_millis(200));
    proxy.release_replies();
    read_reply(&mut raw, &want, Duration::from_secs(1));
}

#[tokio::test]
async fn dropped_replies_never_arrive() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let mut c = conn(&proxy, Duration::from_millis(200)).await;
    let mut raw = raw_socket(&proxy);
    proxy.drop_replies(true);

    let e = c.set::<_, _, ()>("dropped", "1").await.unwrap_err();
    assert!(e.is_timeout(), "{e:?}");
    raw.write_all(&resp(&["SET", "raw", "2"])).unwrap();
    read_nothing(&mut raw, Duration::from_millis(300));
    // The commands ran; only their replies were lost.
    assert_eq!(get(&server, "dropped").await.as_deref(), Some("1"));
    assert_eq!(get(&server, "raw").await.as_deref(), Some("2"));

    proxy.drop_replies(false);
    raw.write_all(b"PING\r\n").unwrap();
    // The next reply is the PONG: the `+OK` dropped earlier never shows up.
    read_reply(&mut raw, b"+PONG\r\n", Duration::from_secs(1));
    read_nothing(&mut raw, Duration::from_millis(100));
}

#[tokio::test]
async fn reset_breaks_current_connections_only() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let client = redis::Client::open(proxy.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let _: String = redis::cmd("PING").query_async(&mut c).await.unwrap();
    let mut raw = raw_socket(&proxy);
    raw.write_all(b"PING\r\n").unwrap();
    read_reply(&mut raw, b"+PONG\r\n", Duration::from_secs(1));
    assert_eq!(proxy.connections(), 2);

    proxy.reset_all();
    assert_eq!(proxy.connections(), 0);
    // An RST, not a clean close.
    let mut buf = [0u8; 8];
    let e = raw.read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e:?}");
    let e = redis::cmd("PING")
        .query_async::<String>(&mut c)
        .await
        .unwrap_err();
    assert!(
        e.is_connection_dropped() || e.is_io_error() || e.is_unrecoverable_error(),
        "{e:?}"
    );

    let mut fresh = client.get_multiplexed_async_connection().await.unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut fresh).await.unwrap();
    assert_eq!(pong, "PONG");
    assert_eq!(proxy.connections(), 1);
}

#[tokio::test]
async fn stall_holds_one_direction() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let mut raw = raw_socket(&proxy);

    // Toward the server: the command is not even run until the stall ends.
    proxy.stall(Dir::ToServer, true);
    raw.write_all(&resp(&["SET", "stalled", "1"])).unwrap();
    read_nothing(&mut raw, Duration::from_millis(300));
    assert_eq!(get(&server, "stalled").await, None);
    proxy.stall(Dir::ToServer, false);
    read_reply(&mut raw, b"+OK\r\n", Duration::from_secs(1));
    assert_eq!(get(&server, "stalled").await.as_deref(), Some("1"));

    // Toward the client: the command runs, its reply waits for the stall to end.
    proxy.stall(Dir::ToClient, true);
    raw.write_all(&resp(&["SET", "stalled", "2"])).unwrap();
    read_nothing(&mut raw, Duration::from_millis(300));
    assert_eq!(get(&server, "stalled").await.as_deref(), Some("2"));
    proxy.stall(Dir::ToClient, false);
    read_reply(&mut raw, b"+OK\r\n", Duration::from_secs(1));
}

/// A command that matches the pattern waits in the proxy, with what follows it on its
/// connection, while other connections go on; released, it runs, even when its client
/// closed the connection meanwhile.
#[tokio::test]
async fn commands_held_by_pattern_arrive_after_other_connections() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let mut held = raw_socket(&proxy);
    let mut other = raw_socket(&proxy);
    proxy.hold_commands_containing(Some(b"held-key"));
    held.write_all(&resp(&["SET", "held-key", "late"])).unwrap();
    held.write_all(&resp(&["SET", "after-it", "late"])).unwrap();
    read_nothing(&mut held, Duration::from_millis(200));
    other
        .write_all(&resp(&["SET", "other-key", "now"]))
        .unwrap();
    read_reply(&mut other, b"+OK\r\n", Duration::from_secs(1));
    assert_eq!(get(&server, "held-key").await, None);
    assert_eq!(
        get(&server, "after-it").await,
        None,
        "kept in order behind it"
    );
    drop(held);
    std::thread::sleep(Duration::from_millis(50));
    proxy.hold_commands_containing(None);
    let deadline = Instant::now() + Duration::from_secs(2);
    while get(&server, "after-it").await.is_none() {
        assert!(Instant::now() < deadline, "the held commands never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(get(&server, "held-key").await.as_deref(), Some("late"));
}

/// A distlock client through the proxy: a release whose reply is held past the command
/// timeout is an error to the caller, though Redis released the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_release_with_held_reply_is_a_backend_error() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let locks = proxy.locks(Duration::from_millis(200));
    // One round first: the scripts get loaded. (On a fresh server the first EVALSHA gets
    // NOSCRIPT, and with that reply held the script body is never sent.)
    let g = locks.lock("proxied").acquire().await.unwrap();
    g.release().await.unwrap();

    let g = locks
        .lock("proxied")
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    assert_eq!(
        get(&server, "lock:proxied").await.as_deref(),
        Some(g.token())
    );

    proxy.hold_replies();
    let t = Instant::now();
    let e = g.release().await.unwrap_err();
    let took = t.elapsed();
    match &e {
        distlock::Error::Backend { source, .. } => {
            assert_eq!(source.kind(), distlock::BackendErrorKind::Timeout, "{e:?}")
        }
        other => panic!("{other:?}"),
    }
    assert!(took < Duration::from_secs(1), "{took:?}");
    eprintln!("release failed after {took:?}: {e}");
    // The caller thinks it failed; Redis ran it.
    assert_eq!(get(&server, "lock:proxied").await, None);
    proxy.release_replies();

    // The client works again once replies flow.
    let g = locks
        .lock("proxied")
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    g.release().await.unwrap();
}

/// A release whose first reply is lost and whose retry is answered: the retry finds the
/// key no longer holding the token. Within the lease only the first try can have removed
/// it, so the release succeeds (never `Lost`); answered after the lease could have ended,
/// a release cannot be told from an expiry, so it is a `Backend` error (never `Lost`,
/// never a silent `Ok`). Either way the first try released the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_is_lost_is_judged_by_the_lease() {
    let timeout = Duration::from_millis(200);
    for (ttl, within) in [
        (Duration::from_secs(10), true),
        (Duration::from_millis(150), false),
    ] {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.port);
        let locks = proxy.locks(timeout);
        // Scripts loaded first (a dropped NOSCRIPT reply would keep the release from running).
        let warm = locks.lock("judged").acquire().await.unwrap();
        warm.release().await.unwrap();
        let g = locks.lock("judged").ttl(ttl).acquire().await.unwrap();
        proxy.drop_replies(true);
        let (released, ()) = tokio::join!(g.release(), async {
            tokio::time::sleep(timeout / 2).await; // after the first try, before the retry
            proxy.drop_replies(false);
        });
        assert_eq!(get(&server, "lock:judged").await, None, "the first try ran");
        if within {
            assert!(released.is_ok(), "ttl {ttl:?}: {released:?}");
        } else {
            match &released {
                Err(distlock::Error::Backend { source, .. }) => {
                    assert!(source.to_string().contains("cannot be told"), "{source}")
                }
                other => panic!("ttl {ttl:?}: expected a Backend error, got {other:?}"),
            }
        }
        // The next holder gets the lock at once.
        let next = locks.lock("judged").acquire().await.unwrap();
        next.release().await.unwrap();
    }
}

/// `fence()` whose reply is held past the command timeout: a `Backend` error (the script
/// ran and its number is skipped, or it found the script not loaded yet and never ran),
/// then a fence once replies flow. A `fence()` future
/// dropped mid-call leaves nothing behind, and the fence can be asked from another
/// runtime than the one that took the lock; every clone sees the one number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_whose_reply_comes_late_is_an_error_then_asked_again() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let timeout = Duration::from_millis(200);
    let locks = proxy.locks(timeout);
    let g = locks.lock("fenced").acquire().await.unwrap();
    proxy.hold_replies();
    let started = Instant::now();
    let e = g.fence().await.unwrap_err();
    assert!(matches!(e, distlock::Error::Backend { .. }), "{e:?}");
    assert!(started.elapsed() < timeout * 5, "{:?}", started.elapsed());
    // Cancelled at its await: no fence kept.
    assert!(tokio::time::timeout(timeout / 4, g.fence()).await.is_err());
    assert_eq!(g.info().cached_fence(), None);
    proxy.release_replies();
    let counter_before: Option<u64> =
        redis::AsyncCommands::get(&mut server.raw().await, "{lock:fenced}:fence")
            .await
            .unwrap();
    // From a runtime of its own.
    let info = g.info().clone();
    let fence = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(info.fence())
    })
    .join()
    .unwrap()
    .unwrap();
    assert!(
        fence > counter_before.unwrap_or(0),
        "the numbers the late calls took are skipped: {fence}"
    );
    assert_eq!(
        g.fence().await.unwrap(),
        fence,
        "one number per acquisition"
    );
    g.release().await.unwrap();
}

#[distlock::idempotent(key = "stored:<id>", client = locks, skip = [runs, proxy])]
async fn stored_once(
    locks: &distlock::Locks,
    id: u32,
    runs: &Runs,
    proxy: &FaultProxy,
) -> Result<u32, distlock::Error> {
    runs.bump();
    // The store's reply (the first command after the body) is lost.
    proxy.drop_replies(true);
    Ok(id * 10)
}

/// The store of an idempotent result whose reply is lost (the `APPEND` ran): the retry
/// appends again, finds its own result first, and the call returns `Ok`; a repeat
/// replays that result without running the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_store_whose_reply_is_lost_is_retried_and_kept() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let timeout = Duration::from_millis(200);
    let locks = proxy.locks(timeout);
    let runs = Runs::default();
    let (out, ()) = tokio::join!(stored_once(&locks, 7, &runs, &proxy), async {
        while runs.get() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(timeout / 2).await; // after the first try, before the retry
        proxy.drop_replies(false);
    });
    assert_eq!(out.unwrap(), 70);
    let keys: Vec<String> = server.raw().await.keys("*stored:7").await.unwrap();
    let value = get(&server, &keys[0]).await.unwrap();
    assert_eq!(
        value.matches(r#"{"status":"completed""#).count(),
        2,
        "both tries appended: {value}"
    );
    assert_eq!(stored_once(&locks, 7, &runs, &proxy).await.unwrap(), 70);
    proxy.drop_replies(false);
    assert_eq!(runs.get(), 1, "the repeat replayed");
}

/// `fence()` right after every connection was cut: a `Backend` error or a fence, never a
/// wrong one; the number is kept once given, and the next holder's is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_over_a_cut_connection_is_an_error_or_a_fence() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let locks = proxy.locks(Duration::from_millis(300));
    let g = locks.lock("cut").acquire().await.unwrap();
    proxy.reset_all();
    let first = g.fence().await;
    assert!(
        matches!(first, Ok(_) | Err(distlock::Error::Backend { .. })),
        "{first:?}"
    );
    let fence = g.fence().await.unwrap();
    if let Ok(f) = first {
        assert_eq!(f, fence, "one number per acquisition");
    }
    g.release().await.unwrap();
    let next = locks.lock("cut").acquire().await.unwrap();
    assert!(next.fence().await.unwrap() > fence);
    next.release().await.unwrap();
}
