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
