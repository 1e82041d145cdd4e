//! `rediss://` (the `tls` feature) against a local `redis-server --tls-port ...` with
//! certificates the test makes: locks, waiting by message, fences and idempotency over
//! TLS; a wrong CA and a missing client certificate are `Backend` errors within the
//! timeout, not hangs.
#![cfg(feature = "tls")]
use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use distlock::{Error, Locks};
use testkit::TlsFiles;

async fn tls_locks(files: &TlsFiles) -> Locks {
    Locks::builder(files.url())
        .tls_root_cert(files.ca.clone())
        .connect()
        .await
        .unwrap()
}

#[distlock::idempotent(key = "tls:<id>", client = locks, skip = [runs])]
async fn once(locks: &Locks, id: u32, runs: &Runs) -> Result<u32, Error> {
    runs.bump();
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(id)
}

/// Locks, fences, a waiter woken by the release message, and an idempotent fn called 20
/// times at once, all over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_waiting_and_idempotency_over_tls() {
    let (_server, files) = RedisServer::start_tls(false);
    let holder = tls_locks(&files).await;
    let waiter = tls_locks(&files).await;
    let g = holder.lock("tls").acquire().await.unwrap();
    let first = g.fence().await.unwrap();
    // A waiter of another client, woken by the message (far below the 100 ms fallback).
    let mut gaps = Vec::new();
    for _ in 0..5 {
        let g = holder.lock("handoff").acquire().await.unwrap();
        let w = take_and_release(&waiter, "handoff", Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(30)).await;
        let released = Instant::now();
        g.release().await.unwrap();
        gaps.push(w.await.unwrap().duration_since(released));
    }
    gaps.sort();
    assert!(
        gaps[gaps.len() / 2] < Duration::from_millis(50),
        "handoffs {gaps:?}: no message woke the waiter"
    );
    g.release().await.unwrap();
    let g = waiter.lock("tls").acquire().await.unwrap();
    assert!(g.fence().await.unwrap() > first, "fences grow over TLS");
    g.release().await.unwrap();
    // Idempotency: one execution for 20 concurrent calls.
    let runs = Arc::new(Runs::default());
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let locks = if i % 2 == 0 {
                holder.clone()
            } else {
                waiter.clone()
            };
            let runs = runs.clone();
            tokio::spawn(async move {
                loop {
                    match once(&locks, 7, &runs).await {
                        Err(Error::InProgress { .. }) => {
                            tokio::time::sleep(Duration::from_millis(10)).await
                        }
                        other => return other,
                    }
                }
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), 7);
    }
    assert_eq!(runs.get(), 1, "the body ran once");
}

/// A server certificate the configured CA did not sign (and one the system's roots do
/// not know) is a `Backend` error within the command timeout, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_a_backend_error() {
    let (_server, files) = RedisServer::start_tls(false);
    let timeout = Duration::from_millis(500);
    for builder in [
        Locks::builder(files.url()).tls_root_cert(files.other_ca.clone()),
        Locks::builder(files.url()),
    ] {
        let started = Instant::now();
        let e = builder
            .command_timeout(timeout)
            .connect()
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Backend { .. }), "{e:?}");
        assert!(started.elapsed() < timeout * 3, "{:?}", started.elapsed());
        assert!(
            e.to_string().to_lowercase().contains("certificate"),
            "says why: {e}"
        );
    }
}

/// A server that requires client certificates: served with one its CA signed, refused
/// (a `Backend` error within the timeout) without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates() {
    let (_server, files) = RedisServer::start_tls(true);
    let with = Locks::builder(files.url())
        .tls_root_cert(files.ca.clone())
        .tls_client_cert(files.client_cert.clone(), files.client_key.clone())
        .connect()
        .await
        .unwrap();
    cycles(&with, "mtls", 1).await;
    let timeout = Duration::from_millis(500);
    let started = Instant::now();
    let without = Locks::builder(files.url())
        .tls_root_cert(files.ca.clone())
        .command_timeout(timeout)
        .connect()
        .await;
    assert!(matches!(without, Err(Error::Backend { .. })), "{without:?}");
    assert!(started.elapsed() < timeout * 3, "{:?}", started.elapsed());
}

/// A server that speaks only TLS 1.2 (managed services may stop there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_2_only() {
    let (_server, files) = RedisServer::start_tls_with(false, &["--tls-protocols", "TLSv1.2"]);
    let locks = tls_locks(&files).await;
    cycles(&locks, "v12", 1).await;
}

/// Settings that cannot work are configuration errors when the client is built, not at
/// every connection: certificates with a URL that is not `rediss://`, a CA file with no
/// certificate in it, a client certificate without a key, `#insecure`.
#[test]
fn bad_tls_settings_are_configuration_errors() {
    let (_server, files) = RedisServer::start_tls(false);
    let url = files.url();
    let cases: Vec<(&str, distlock::LocksBuilder)> = vec![
        (
            "rediss://",
            Locks::builder("redis://127.0.0.1:1/").tls_root_cert(files.ca.clone()),
        ),
        (
            "no PEM `CERTIFICATE`",
            Locks::builder(url.clone()).tls_root_cert(b"not a certificate".to_vec()),
        ),
        (
            "no PEM private key",
            Locks::builder(url.clone())
                .tls_root_cert(files.ca.clone())
                .tls_client_cert(files.client_cert.clone(), files.client_cert.clone()),
        ),
        ("`#insecure`", Locks::builder(format!("{url}#insecure"))),
    ];
    for (says, builder) in cases {
        let e = builder.build().unwrap_err();
        assert!(
            matches!(&e, Error::Backend { source, .. } if source.kind() == distlock::BackendErrorKind::Config),
            "{e:?}"
        );
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
    // Upper case and surrounding space are the same URL to redis-rs: TLS too.
    Locks::builder(format!("  REDISS://127.0.0.1:{}/", files.port))
        .tls_root_cert(files.ca.clone())
        .build()
        .unwrap();
}

#[distlock::distributed_lock(key = "default:<n>")]
async fn on_the_default_client(n: u32) -> Result<u32, Error> {
    let fence = distlock::current_lock().unwrap().fence().await?;
    Ok(u32::try_from(fence).unwrap_or(u32::MAX).max(n))
}

/// The default client (attributes without `client = ...`) from `REDIS_URL=rediss://...`
/// and `REDIS_TLS_CA_FILE`. Runs in a child process, whose environment it sets.
#[test]
fn the_default_client_reads_tls_from_the_environment() {
    if std::env::var_os("DISTLOCK_TLS_CHILD").is_some() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let fence = rt.block_on(on_the_default_client(1)).unwrap();
        assert!(fence >= 1);
        println!("@@tls-default-ok");
        return;
    }
    let (server, files) = RedisServer::start_tls(false);
    let ca = server.dir().join("ca.crt");
    let child = |with_ca: bool| {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "tls::the_default_client_reads_tls_from_the_environment",
            "--exact",
            "--nocapture",
        ])
        .env("DISTLOCK_TLS_CHILD", "1")
        .env("REDIS_URL", files.url());
        if with_ca {
            cmd.env("REDIS_TLS_CA_FILE", &ca);
        } else {
            cmd.env_remove("REDIS_TLS_CA_FILE");
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, stdout) = child(true);
    assert!(ok && stdout.contains("@@tls-default-ok"), "{stdout}");
    // Control: without the CA file the server's certificate is not trusted.
    let (ok, stdout) = child(false);
    assert!(!ok && !stdout.contains("@@tls-default-ok"), "{stdout}");
    assert!(
        stdout.to_lowercase().contains("certificate"),
        "says why: {stdout}"
    );
}

/// Direct connections (a socket per call for latency-bound callers) speak TLS too, and
/// one Redis closed for idleness is not used: the next call opens another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_connections_over_tls() {
    let (server, files) = RedisServer::start_tls(false);
    let locks = tls_locks(&files).await;
    cycles(&locks, "direct", 3).await;
    let mut raw = server.raw().await;
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        clients.contains("name=distlock-direct"),
        "a direct connection served the calls: {clients}"
    );
    // A healthy idle one is used again, not reopened.
    let connections = |stats: String| {
        stats
            .lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .map(|n| n.trim().to_owned())
    };
    let info = |mut raw: redis::aio::MultiplexedConnection| async move {
        let stats: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut raw)
            .await
            .unwrap();
        stats
    };
    let before = connections(info(raw.clone()).await);
    cycles(&locks, "direct", 5).await;
    assert_eq!(
        connections(info(raw.clone()).await),
        before,
        "no new connection"
    );
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "timeout", "1"])
        .query_async(&mut raw)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    cycles(&locks, "direct", 3).await;
}

/// A Redis Cluster over TLS (`tls-cluster yes`: the cluster announces its TLS ports),
/// given as `rediss://` nodes with the test's CA: locks and fences on every primary, a
/// waiter woken by sharded Pub/Sub over TLS, and an idempotent call. Control: without the
/// CA the client cannot connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls() {
    let (cluster, tls_ports, files) = testkit::RedisCluster::start_tls(3, 0);
    let urls: Vec<String> = tls_ports
        .iter()
        .map(|p| format!("rediss://127.0.0.1:{p}/"))
        .collect();
    let locks = Locks::cluster(&urls)
        .tls_root_cert(files.ca.clone())
        .connect()
        .await
        .unwrap();
    let other = Locks::cluster(&urls)
        .tls_root_cert(files.ca.clone())
        .connect()
        .await
        .unwrap();
    let mut primaries = std::collections::HashSet::new();
    for i in 0.. {
        let key = format!("tls-{i}");
        if !primaries.insert(cluster.primary_of(cluster.slot(&format!("lock:{key}")))) {
            continue;
        }
        let g = locks.lock(key.as_str()).acquire().await.unwrap();
        g.fence().await.unwrap();
        let w = take_and_release(&other, &key, Duration::from_secs(10));
        // Subscribed (the first wait opens a TLS connection to every node) before the release.
        let deadline = Instant::now() + Duration::from_secs(5);
        while other.waiting_channels() == 0 {
            assert!(Instant::now() < deadline, "the waiter subscribed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let gap = handoff_gap(g, w).await;
        assert!(
            gap < Duration::from_millis(60),
            "handoff after {gap:?}: no message"
        );
        if primaries.len() == 3 {
            break;
        }
    }
    // The control: without the CA, no connection.
    let untrusted = Locks::cluster(&urls)
        .command_timeout(Duration::from_millis(500))
        .connect()
        .await;
    assert!(matches!(untrusted, Err(Error::Backend { .. })));
}
