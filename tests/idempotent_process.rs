//! A claimer process killed with SIGKILL mid-body: its in-progress record blocks the key
//! (`InProgress`) until its lease ends, then the next call takes the claim over and runs
//! the body ("expired-claim recovery").
//!
//! The test binary re-runs itself as the child (`child_entry`), as `tests/processes.rs`
//! does; the child prints `@@running` once inside the body.
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::*;
use distlock::{Error, Locks, idempotent};
use redis::AsyncCommands;

const ROLE_VAR: &str = "DISTLOCK_IDEM_CHILD";
const URL_VAR: &str = "DISTLOCK_URL";

/// Not `Serialize`: not part of the payload.
struct Runs(AtomicU32);

#[idempotent(key = "charge:<order>", client = locks, lease = "1s", fingerprint = [order, amount])]
async fn charge(
    locks: &Locks,
    order: &str,
    amount: u64,
    runs: &Runs,
    in_child: bool,
) -> Result<String, AppError> {
    runs.0.fetch_add(1, Ordering::SeqCst);
    if in_child {
        println!("@@running pid={}", std::process::id());
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    Ok(format!(
        "charged {amount} for {order} by {}",
        std::process::id()
    ))
}

/// The child: claims `crash-1`, announces it, and hangs in the body until killed.
#[test]
fn child_entry() {
    if std::env::var(ROLE_VAR).is_err() {
        return;
    }
    let url = std::env::var(URL_VAR).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let locks = Locks::connect(&url).await.unwrap();
        let runs = Runs(AtomicU32::new(0));
        let _ = charge(&locks, "crash-1", 250, &runs, true).await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_claimer_is_recovered_after_its_lease() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE_VAR, "claimer")
        .env(URL_VAR, server.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(at) = line.find("@@running") {
                let _ = tx.send(line[at..].to_owned());
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the child never entered the body");
    assert!(line.contains(&format!("pid={}", child.id())), "{line}");

    // The record is in progress under the child's owner token.
    let key = "lock:idem:idempotent_process::charge:charge:crash-1";
    let mut raw = server.raw().await;
    let record: String = raw.get(key).await.unwrap();
    let rec: serde_json::Value = serde_json::from_str(&record).unwrap();
    assert_eq!(rec["status"], "in_progress", "{record}");
    assert!(
        rec["owner"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":{}", child.id())),
        "{record}"
    );

    child.kill().unwrap(); // SIGKILL: no release, no more renewals
    child.wait().unwrap();
    let killed = Instant::now();

    let runs = Runs(AtomicU32::new(0));
    let mut in_progress = 0;
    let out = loop {
        match charge(&locks, "crash-1", 250, &runs, false).await {
            Ok(out) => break out,
            Err(AppError::Lock(Error::InProgress { retry_after, .. })) => {
                assert!(retry_after <= Duration::from_secs(1));
                in_progress += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "never recovered"
        );
    };
    let recovered = killed.elapsed();
    assert!(
        in_progress > 0,
        "the dead claim blocked the key until its lease ended"
    );
    assert!(
        recovered < Duration::from_millis(1_800),
        "recovered {recovered:?} after the kill; the lease is 1 s"
    );
    assert_eq!(runs.0.load(Ordering::SeqCst), 1, "the retry ran the body");
    assert!(out.ends_with(&std::process::id().to_string()), "{out}");
    // Stored: the next repeat is a replay.
    assert_eq!(
        charge(&locks, "crash-1", 250, &runs, false).await.unwrap(),
        out
    );
    assert_eq!(runs.0.load(Ordering::SeqCst), 1);
    println!(
        "killed claimer recovered {recovered:?} after SIGKILL ({in_progress} InProgress answers first)"
    );
}
