//! `#[idempotent(key = ...)]` on plain async fns, against a real redis-server and the
//! in-memory backend: exactly once under concurrency, replay, failure policy, payload
//! fingerprint, waiting, lease renewal, and both orders with `#[distributed_lock]`.
use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use distlock::{Error, Locks, distributed_lock, idempotent};
use serde::{Deserialize, Serialize};

both!(
    fifty_concurrent_calls_run_the_body_once,
    fifty_concurrent_waiting_calls_all_get_the_result,
    replay_equals_the_first_result,
    unit_and_empty_values_are_stored,
    err_is_not_stored,
    panic_releases_the_claim,
    cancelled_borrowing_fn_keeps_its_claim_until_its_lease_ends,
    caller_that_goes_away_does_not_cause_a_second_run,
    different_payload_is_a_mismatch_and_does_not_run,
    reordered_json_fields_are_the_same_payload,
    skipped_arguments_are_left_out,
    equal_sets_are_one_payload,
    fingerprint_list_narrows_the_payload,
    wait_returns_the_stored_result,
    wait_gives_up_at_its_deadline,
    lease_is_renewed_while_the_body_runs,
    scope_and_function_separate_records,
    lock_inside_idempotency_either_order,
    methods_of_two_types_keep_their_own_records,
    two_fns_in_one_namespace_are_reported,
    an_argument_that_fails_to_serialize_refuses_the_call,
    a_result_that_cannot_be_stored_never_runs_again,
    non_finite_floats_are_three_payloads,
    a_result_that_reads_back_as_another_value_is_not_replayed,
);

fn idem_err<T: std::fmt::Debug>(r: Result<T, AppError>) -> Error {
    match r {
        Err(AppError::Lock(e)) => e,
        other => panic!("expected a distlock error, got {other:?}"),
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: String,
    charged: u64,
    at: Vec<u32>,
}

#[idempotent(key = "pay:<notify_id>", client = locks, lease = "5s", fingerprint = [notify_id, amount])]
async fn pay(
    locks: &Locks,
    notify_id: &str,
    amount: u64,
    delay_ms: u64,
    runs: &Runs,
) -> Result<Receipt, AppError> {
    let n = runs.bump();
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    Ok(Receipt {
        id: format!("r-{n}"),
        charged: amount,
        at: vec![n, 2, 3],
    })
}

async fn fifty_concurrent_calls_run_the_body_once(locks: Locks) {
    let runs = Arc::new(Runs::default());
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (locks, runs) = (locks.clone(), runs.clone());
        tasks.push(tokio::spawn(async move {
            pay(&locks, "n-50", 100, 300, &runs).await
        }));
    }
    let (mut ok, mut in_progress) = (Vec::new(), 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(r) => ok.push(r),
            Err(AppError::Lock(Error::InProgress { retry_after, .. })) => {
                assert!(retry_after <= Duration::from_secs(5));
                in_progress += 1;
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(runs.get(), 1, "the body must run exactly once");
    assert!(!ok.is_empty());
    assert_eq!(ok.len() + in_progress, 50);
    assert!(ok.iter().all(|r| *r == ok[0]));
    // After completion every repeat is a replay of the first result.
    let again = pay(&locks, "n-50", 100, 0, &runs).await.unwrap();
    assert_eq!(again, ok[0]);
    assert_eq!(runs.get(), 1);
    println!(
        "50 concurrent calls: 1 run, {} Ok, {in_progress} InProgress",
        ok.len()
    );
}

#[idempotent(key = "pay-wait:<notify_id>", client = locks, wait = "10s", skip = [runs])]
async fn pay_waiting(locks: &Locks, notify_id: &str, runs: &Runs) -> Result<u32, AppError> {
    let n = runs.bump();
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(n * 10)
}

async fn fifty_concurrent_waiting_calls_all_get_the_result(locks: Locks) {
    let runs = Arc::new(Runs::default());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (locks, runs) = (locks.clone(), runs.clone());
        tasks.push(tokio::spawn(async move {
            pay_waiting(&locks, "w-50", &runs).await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), 10);
    }
    assert_eq!(runs.get(), 1);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "waiters were slow: {took:?}");
}

async fn replay_equals_the_first_result(locks: Locks) {
    let runs = Runs::default();
    let first = pay(&locks, "r-1", 250, 0, &runs).await.unwrap();
    for _ in 0..3 {
        assert_eq!(pay(&locks, "r-1", 250, 0, &runs).await.unwrap(), first);
    }
    assert_eq!(runs.get(), 1);
    // Another key runs again.
    let other = pay(&locks, "r-2", 250, 0, &runs).await.unwrap();
    assert_ne!(other, first);
}

#[idempotent(key = "unit:<id>", client = locks, skip = [runs])]
async fn unit(locks: &Locks, id: u32, runs: &Runs) -> Result<(), AppError> {
    runs.bump();
    Ok(())
}

#[idempotent(key = "none:<id>", client = locks, skip = [runs])]
async fn nothing(locks: &Locks, id: u32, runs: &Runs) -> Result<Option<String>, AppError> {
    runs.bump();
    Ok(None)
}

async fn unit_and_empty_values_are_stored(locks: Locks) {
    let runs = Runs::default();
    unit(&locks, 1, &runs).await.unwrap();
    unit(&locks, 1, &runs).await.unwrap();
    assert_eq!(runs.get(), 1, "`()` is a result too");
    assert_eq!(nothing(&locks, 1, &runs).await.unwrap(), None);
    assert_eq!(nothing(&locks, 1, &runs).await.unwrap(), None);
    assert_eq!(runs.get(), 2, "`None` is a result too");
}

#[idempotent(key = "flaky:<id>", client = locks, skip = [runs])]
async fn flaky(locks: &Locks, id: u32, runs: &Runs) -> Result<u32, AppError> {
    let n = runs.bump();
    if n == 1 {
        return Err(AppError::App("declined"));
    }
    Ok(n)
}

async fn err_is_not_stored(locks: Locks) {
    let runs = Runs::default();
    assert!(matches!(
        flaky(&locks, 1, &runs).await,
        Err(AppError::App("declined"))
    ));
    // The retry runs the body, and its Ok is then stored.
    assert_eq!(flaky(&locks, 1, &runs).await.unwrap(), 2);
    assert_eq!(flaky(&locks, 1, &runs).await.unwrap(), 2);
    assert_eq!(runs.get(), 2);
}

#[idempotent(key = "panics:<id>", client = locks, skip = [runs])]
async fn panics(locks: &Locks, id: u32, runs: &Runs) -> Result<u32, AppError> {
    let n = runs.bump();
    if n == 1 {
        panic!("boom");
    }
    Ok(n)
}

/// Retries until the released claim is visible (the release is spawned by `Drop`).
async fn eventually<T>(mut f: impl AsyncFnMut() -> Result<T, AppError>) -> T {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(AppError::Lock(Error::InProgress { .. })) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
}

async fn panic_releases_the_claim(locks: Locks) {
    let runs = Arc::new(Runs::default());
    let (l, r) = (locks.clone(), runs.clone());
    let joined = tokio::spawn(async move { panics(&l, 1, &r).await }).await;
    assert!(joined.unwrap_err().is_panic());
    let started = Instant::now();
    let n = eventually(async || panics(&locks, 1, &runs).await).await;
    assert_eq!(n, 2);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "released at once, not after the lease"
    );
}

/// Borrows its arguments: its body cannot leave the caller's future.
#[idempotent(key = "pay-brief:<notify_id>", client = locks, lease = "1s", fingerprint = [notify_id])]
async fn pay_brief(
    locks: &Locks,
    notify_id: &str,
    delay_ms: u64,
    runs: &Runs,
) -> Result<u32, AppError> {
    let n = runs.bump();
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    Ok(n)
}

/// Owns its parameters: its body runs in a task of its own.
#[idempotent(key = "charge:<notify_id>", client = locks, fingerprint = [notify_id, amount])]
async fn charge(
    locks: Locks,
    notify_id: String,
    amount: u64,
    delay_ms: u64,
    runs: Arc<Runs>,
) -> Result<String, AppError> {
    let n = runs.bump();
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    Ok(format!("c-{n}-{amount}"))
}

/// The caller of a borrowing fn gives up mid-body: the body may have done part of its
/// work, so the claim is not released (a retry would run it again); it stays in
/// progress until its lease ends, and then the retry takes it over.
async fn cancelled_borrowing_fn_keeps_its_claim_until_its_lease_ends(locks: Locks) {
    let runs = Runs::default();
    let cancelled = tokio::time::timeout(
        Duration::from_millis(100),
        pay_brief(&locks, "cancel", 10_000, &runs),
    )
    .await;
    assert!(cancelled.is_err());
    let gave_up = Instant::now();
    let e = idem_err(pay_brief(&locks, "cancel", 0, &runs).await);
    assert!(matches!(e, Error::InProgress { .. }), "{e:?}");
    let r = eventually(async || pay_brief(&locks, "cancel", 0, &runs).await).await;
    assert_eq!(r, 2, "taken over once the lease ended");
    assert!(
        gave_up.elapsed() >= Duration::from_millis(700),
        "in progress until the 1 s lease ended, not released: {:?}",
        gave_up.elapsed()
    );
}

/// A timeout around a call to an fn that owns its parameters: the body runs to its end
/// in its own task and its result is stored, so the retry gets it and nothing runs twice.
async fn caller_that_goes_away_does_not_cause_a_second_run(locks: Locks) {
    let runs = Arc::new(Runs::default());
    let call = |delay_ms| charge(locks.clone(), "away".into(), 5, delay_ms, runs.clone());
    let gone = tokio::time::timeout(Duration::from_millis(100), call(400)).await;
    assert!(gone.is_err());
    assert!(matches!(idem_err(call(0).await), Error::InProgress { .. }));
    let r = eventually(async || call(0).await).await;
    assert_eq!(r, "c-1-5", "the first run's result");
    assert_eq!(runs.get(), 1, "the body ran once");
}

async fn different_payload_is_a_mismatch_and_does_not_run(locks: Locks) {
    let runs = Runs::default();
    pay(&locks, "m-1", 100, 0, &runs).await.unwrap();
    let e = idem_err(pay(&locks, "m-1", 999, 0, &runs).await);
    assert!(
        matches!(&e, Error::PayloadMismatch { key } if key.ends_with(":pay:m-1")),
        "{e:?}"
    );
    assert_eq!(runs.get(), 1, "a mismatch must not run the body");
    // While the first is still running, too.
    let slow = pay(&locks, "m-2", 100, 500, &runs);
    let other = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        pay(&locks, "m-2", 5, 0, &runs).await
    };
    let (first, second) = tokio::join!(slow, other);
    first.unwrap();
    assert!(matches!(idem_err(second), Error::PayloadMismatch { .. }));
    assert_eq!(runs.get(), 2);
}

#[idempotent(key = "order:<id>", client = locks, skip = [runs])]
async fn order(
    locks: &Locks,
    id: u32,
    body: serde_json::Value,
    runs: &Runs,
) -> Result<u32, AppError> {
    Ok(runs.bump())
}

async fn reordered_json_fields_are_the_same_payload(locks: Locks) {
    let runs = Runs::default();
    let a: serde_json::Value =
        serde_json::from_str(r#"{"sku":"a","qty":2,"ship":{"zip":"1","city":"x"}}"#).unwrap();
    let b: serde_json::Value = serde_json::from_str(
        r#"{ "ship" : { "city":"x", "zip":"1" },
             "qty": 2, "sku": "a" }"#,
    )
    .unwrap();
    let c: serde_json::Value =
        serde_json::from_str(r#"{"sku":"a","qty":3,"ship":{"zip":"1","city":"x"}}"#).unwrap();
    assert_eq!(order(&locks, 1, a, &runs).await.unwrap(), 1);
    assert_eq!(order(&locks, 1, b, &runs).await.unwrap(), 1, "replayed");
    assert!(matches!(
        idem_err(order(&locks, 1, c, &runs).await),
        Error::PayloadMismatch { .. }
    ));
    assert_eq!(runs.get(), 1);
}

/// Not `Serialize`: left out of the fingerprint, no compile error.
struct Pool(#[allow(dead_code)] u32);

#[idempotent(key = "job:<id>", client = locks, skip = [pool, runs])]
async fn with_pool(locks: &Locks, pool: Pool, id: u32, runs: &Runs) -> Result<u32, AppError> {
    let _ = pool;
    Ok(runs.bump())
}

async fn skipped_arguments_are_left_out(locks: Locks) {
    let runs = Runs::default();
    assert_eq!(with_pool(&locks, Pool(1), 7, &runs).await.unwrap(), 1);
    assert_eq!(with_pool(&locks, Pool(2), 7, &runs).await.unwrap(), 1);
}

#[idempotent(key = "narrow:<id>", client = locks, fingerprint = [amount])]
async fn narrow(
    locks: &Locks,
    id: u32,
    amount: u64,
    note: String,
    runs: &Runs,
) -> Result<String, AppError> {
    runs.bump();
    Ok(note)
}

async fn fingerprint_list_narrows_the_payload(locks: Locks) {
    let runs = Runs::default();
    assert_eq!(narrow(&locks, 1, 5, "a".into(), &runs).await.unwrap(), "a");
    // `note` is not part of the payload: a replay.
    assert_eq!(narrow(&locks, 1, 5, "b".into(), &runs).await.unwrap(), "a");
    assert!(matches!(
        idem_err(narrow(&locks, 1, 6, "a".into(), &runs).await),
        Error::PayloadMismatch { .. }
    ));
    assert_eq!(runs.get(), 1);
}

async fn wait_returns_the_stored_result(locks: Locks) {
    let runs = Runs::default();
    let first = pay_waiting(&locks, "w-1", &runs);
    let second = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        let r = pay_waiting(&locks, "w-1", &runs).await;
        (r, started.elapsed())
    };
    // While the second waits, it is subscribed to the record's `done` channel.
    let probe = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        locks.waiting_channels()
    };
    let (a, (b, waited), subscribed) = tokio::join!(first, second, probe);
    assert_eq!(a.unwrap(), 10);
    assert_eq!(b.unwrap(), 10);
    assert_eq!(runs.get(), 1);
    assert_eq!(
        subscribed, 1,
        "the waiter waits for a message on one channel"
    );
    assert_eq!(locks.waiting_channels(), 0, "and leaves it when served");
    // Woken by the completion (about 250 ms after it started waiting), far below 10 s.
    assert!(waited < Duration::from_millis(800), "waited {waited:?}");
}

#[idempotent(key = "wait-short:<id>", client = locks, wait = "300ms")]
async fn wait_short(locks: &Locks, id: u32, hold_ms: u64) -> Result<u32, AppError> {
    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
    Ok(1)
}

async fn wait_gives_up_at_its_deadline(locks: Locks) {
    let first = wait_short(&locks, 1, 2_000);
    let second = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        let r = wait_short(&locks, 1, 2_000).await;
        (r, started.elapsed())
    };
    let (a, (b, took)) = tokio::join!(first, second);
    assert_eq!(a.unwrap(), 1);
    assert!(matches!(idem_err(b), Error::InProgress { .. }));
    assert!(
        took >= Duration::from_millis(300),
        "gave up early: {took:?}"
    );
    assert!(took < Duration::from_millis(700), "overshot: {took:?}");
}

#[idempotent(key = "renew:<id>", client = locks, lease = "300ms", skip = [runs])]
async fn long_body(locks: &Locks, id: u32, runs: &Runs) -> Result<u32, AppError> {
    runs.bump();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    Ok(7)
}

async fn lease_is_renewed_while_the_body_runs(locks: Locks) {
    let runs = Runs::default();
    let first = long_body(&locks, 1, &runs);
    let probe = async {
        // Well past the 300 ms lease: without renewal this call would take the claim over.
        tokio::time::sleep(Duration::from_millis(800)).await;
        long_body(&locks, 1, &runs).await
    };
    let (a, b) = tokio::join!(first, probe);
    assert_eq!(a.unwrap(), 7);
    assert!(matches!(idem_err(b), Error::InProgress { .. }));
    assert_eq!(runs.get(), 1);
}

#[idempotent(key = "k:<id>", scope = "tenant-<tenant>", client = locks, skip = [runs])]
async fn scoped(locks: &Locks, tenant: &str, id: u32, runs: &Runs) -> Result<u32, AppError> {
    Ok(runs.bump())
}

#[idempotent(key = "k:<id>", client = locks, skip = [runs])]
async fn same_template_other_fn(locks: &Locks, id: u32, runs: &Runs) -> Result<u32, AppError> {
    Ok(runs.bump())
}

async fn scope_and_function_separate_records(locks: Locks) {
    let runs = Runs::default();
    assert_eq!(scoped(&locks, "a", 1, &runs).await.unwrap(), 1);
    assert_eq!(scoped(&locks, "b", 1, &runs).await.unwrap(), 2);
    assert_eq!(scoped(&locks, "a", 1, &runs).await.unwrap(), 1);
    assert_eq!(same_template_other_fn(&locks, 1, &runs).await.unwrap(), 3);
}

/// Flash-sale stock in a map: read, await, write (unsafe without the lock).
type Stock = tokio::sync::Mutex<BTreeMap<u32, u32>>;

async fn take_one(stock: &Stock, sku: u32) -> Result<u32, AppError> {
    let left = *stock.lock().await.get(&sku).unwrap_or(&0);
    tokio::time::sleep(Duration::from_millis(5)).await;
    if left == 0 {
        return Err(AppError::App("sold out"));
    }
    stock.lock().await.insert(sku, left - 1);
    Ok(left - 1)
}

#[idempotent(key = "buy:<order_id>", client = locks, skip = [stock])]
#[distributed_lock(key = "stock:<sku>", client = locks, wait = "5s")]
async fn buy_idem_outer(
    locks: &Locks,
    order_id: u32,
    sku: u32,
    stock: &Stock,
) -> Result<u32, AppError> {
    take_one(stock, sku).await
}

#[distributed_lock(key = "stock:<sku>", client = locks, wait = "5s")]
#[idempotent(key = "buy:<order_id>", client = locks, skip = [stock])]
async fn buy_lock_outer(
    locks: &Locks,
    order_id: u32,
    sku: u32,
    stock: &Stock,
) -> Result<u32, AppError> {
    take_one(stock, sku).await
}

async fn lock_inside_idempotency_either_order(locks: Locks) {
    for (label, outer) in [("idempotent outer", true), ("lock outer", false)] {
        let stock = Arc::new(Stock::new(BTreeMap::from([(1, 5)])));
        let call = |order_id: u32| {
            let (locks, stock) = (locks.clone(), stock.clone());
            async move {
                if outer {
                    buy_idem_outer(&locks, order_id, 1, &stock).await
                } else {
                    buy_lock_outer(&locks, order_id, 1, &stock).await
                }
            }
        };
        // 8 buyers for 5 items, each retrying its order 3 times at once.
        let mut tasks = Vec::new();
        for order_id in 0..8 {
            for _ in 0..3 {
                tasks.push((order_id, tokio::spawn(call(order_id))));
            }
        }
        let (mut sold_out, mut bought) = (0, Vec::new());
        for (order_id, t) in tasks {
            match t.await.unwrap() {
                Ok(_) => bought.push(order_id),
                Err(AppError::Lock(Error::InProgress { .. })) => {}
                Err(AppError::App("sold out")) => sold_out += 1,
                Err(e) => panic!("{label}: {e:?}"),
            }
        }
        bought.sort_unstable();
        bought.dedup();
        assert_eq!(stock.lock().await[&1], 0, "{label}: never oversold");
        assert_eq!(
            bought.len(),
            5,
            "{label}: each item sold to one order, once"
        );
        assert!(sold_out >= 3, "{label}: {sold_out}");
        // A completed order is replayed without touching the lock: hold it, repeat.
        let guard = locks.lock("stock:1").acquire().await.unwrap();
        assert!(
            call(bought[0]).await.is_ok(),
            "{label}: a replay must not need the lock"
        );
        guard.release().await.unwrap();
    }
}

struct Email;
struct Sms;

impl Email {
    #[idempotent(key = "notify:<id>", client = locks, name = "email-notify", skip = [runs])]
    async fn notify(&self, locks: &Locks, id: u32, runs: &Runs) -> Result<String, AppError> {
        runs.bump();
        Ok(format!("email {id}"))
    }
}

impl Sms {
    #[idempotent(key = "notify:<id>", client = locks, name = "sms-notify", skip = [runs])]
    async fn notify(&self, locks: &Locks, id: u32, runs: &Runs) -> Result<String, AppError> {
        runs.bump();
        Ok(format!("sms {id}"))
    }
}

/// `impl Email { fn notify }` and `impl Sms { fn notify }` in one module: each names its
/// namespace, and each body runs (before `name`, the second replayed the first's result).
async fn methods_of_two_types_keep_their_own_records(locks: Locks) {
    let (email_runs, sms_runs) = (Runs::default(), Runs::default());
    assert_eq!(
        Email.notify(&locks, 1, &email_runs).await.unwrap(),
        "email 1"
    );
    assert_eq!(Sms.notify(&locks, 1, &sms_runs).await.unwrap(), "sms 1");
    assert_eq!(
        Email.notify(&locks, 1, &email_runs).await.unwrap(),
        "email 1"
    );
    assert_eq!((email_runs.get(), sms_runs.get()), (1, 1));
}

#[idempotent(key = "k:<id>", client = locks, name = "shared-namespace")]
async fn first_in_namespace(locks: &Locks, id: u32) -> Result<u32, AppError> {
    Ok(id)
}

#[idempotent(key = "k:<id>", client = locks, name = "shared-namespace")]
async fn second_in_namespace(locks: &Locks, id: u32) -> Result<u32, AppError> {
    Ok(id + 1000)
}

/// Two fns that end up in one namespace are reported on first use, naming both; the
/// second never runs its body or replays the first's record.
async fn two_fns_in_one_namespace_are_reported(locks: Locks) {
    assert_eq!(first_in_namespace(&locks, 1).await.unwrap(), 1);
    let second = second_in_namespace(&locks, 2).await;
    let message = match second {
        Err(AppError::Lock(e @ Error::Backend { .. })) => e.to_string(),
        other => panic!("expected the namespace to be reported: {other:?}"),
    };
    assert!(
        message.contains("shared-namespace") && message.matches("idempotent_fns.rs:").count() == 2,
        "{message}"
    );
}

#[idempotent(key = "tagged:<id>", client = locks, skip = [runs])]
async fn tagged(
    locks: &Locks,
    id: u32,
    tags: std::collections::HashSet<String>,
    runs: &Runs,
) -> Result<u32, AppError> {
    let _ = tags;
    Ok(runs.bump())
}

/// A `HashSet` argument iterates in an order of its own; equal sets are one payload.
async fn equal_sets_are_one_payload(locks: Locks) {
    let runs = Runs::default();
    let a: std::collections::HashSet<String> = (0..50).map(|i| format!("t{i}")).collect();
    let b: std::collections::HashSet<String> = (0..50).rev().map(|i| format!("t{i}")).collect();
    assert_ne!(
        a.iter().collect::<Vec<_>>(),
        b.iter().collect::<Vec<_>>(),
        "the control: equal sets that iterate in different orders"
    );
    assert_eq!(tagged(&locks, 1, a, &runs).await.unwrap(), 1);
    assert_eq!(tagged(&locks, 1, b, &runs).await.unwrap(), 1, "replayed");
    let c: std::collections::HashSet<String> = (0..49).map(|i| format!("t{i}")).collect();
    assert!(matches!(
        idem_err(tagged(&locks, 1, c, &runs).await),
        Error::PayloadMismatch { .. }
    ));
    assert_eq!(runs.get(), 1);
}

/// `PUBLISH` calls so far (`INFO commandstats`, Lua's inner calls included).
async fn publishes(server: &RedisServer) -> u64 {
    let mut raw = server.raw().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut raw)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_publish:calls="))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A completion publishes on the record's channel only when a repeat waits for it: none
/// for a call nobody waited for (the usual case), one when a repeat with `wait` came while
/// it ran (the control), and that repeat gets the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_publish_only_when_a_repeat_waits() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let runs = Runs::default();
    assert_eq!(pay_waiting(&locks, "alone", &runs).await.unwrap(), 10);
    assert_eq!(
        publishes(&server).await,
        0,
        "nobody waited: nothing published"
    );
    let (first, repeat) = tokio::join!(pay_waiting(&locks, "waited", &runs), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        pay_waiting(&locks, "waited", &runs).await
    });
    assert_eq!(first.unwrap(), 20);
    assert_eq!(
        repeat.unwrap(),
        20,
        "the waiting repeat gets the first result"
    );
    assert_eq!(publishes(&server).await, 1, "a repeat waited: one message");
}

#[idempotent(key = "big:<id>", client = locks, fingerprint = [id, amount])]
async fn big_amount(locks: &Locks, id: u32, amount: u128, runs: &Runs) -> Result<u32, AppError> {
    let _ = amount;
    Ok(runs.bump())
}

/// An argument that fails to serialize (a `u128` above `u64::MAX`) is never left out of
/// the payload: the call is refused before anything is claimed, so another amount under
/// the same key is never replayed the first result. Control: an amount within `u64`.
async fn an_argument_that_fails_to_serialize_refuses_the_call(locks: Locks) {
    let runs = Runs::default();
    assert_eq!(big_amount(&locks, 1, 5, &runs).await.unwrap(), 1, "control");
    let huge = u128::from(u64::MAX) + 1;
    for amount in [huge, huge + 1] {
        let e = idem_err(big_amount(&locks, 2, amount, &runs).await);
        assert!(
            matches!(&e, Error::Unrepresentable { reason, .. } if reason.contains("`amount`")),
            "{e:?}"
        );
    }
    assert_eq!(runs.get(), 1, "the refused calls did not run");
}

#[idempotent(key = "huge:<id>", client = locks, fingerprint = [id])]
async fn huge_result(locks: &Locks, id: u32, runs: &Runs) -> Result<u128, AppError> {
    runs.bump();
    Ok(u128::MAX)
}

#[idempotent(key = "nan:<id>", client = locks, fingerprint = [id])]
async fn nan_result(locks: &Locks, id: u32, runs: &Runs) -> Result<f64, AppError> {
    runs.bump();
    Ok(f64::NAN)
}

/// An `Ok` value that cannot be stored (a `u128` above `u64::MAX` fails to serialize;
/// `f64::NAN` is written `null` and does not read back): the first caller gets it, the
/// body never runs again under the key, and every repeat gets `Unrepresentable` saying
/// so (the claim used to be released, so every repeat ran the body again; a `NaN` was
/// stored and every repeat failed to decode it).
async fn a_result_that_cannot_be_stored_never_runs_again(locks: Locks) {
    let runs = Runs::default();
    assert_eq!(huge_result(&locks, 1, &runs).await.unwrap(), u128::MAX);
    assert!(nan_result(&locks, 1, &runs).await.unwrap().is_nan());
    for _ in 0..2 {
        for e in [
            idem_err(huge_result(&locks, 1, &runs).await),
            idem_err(nan_result(&locks, 1, &runs).await),
        ] {
            assert!(
                matches!(&e, Error::Unrepresentable { reason, .. } if reason.contains("could not be stored")),
                "{e:?}"
            );
        }
    }
    assert_eq!(runs.get(), 2, "each body ran once");
}

/// Two variants no JSON tells apart: both are written as the bare number, and the
/// number reads back as the first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum Amount {
    Cents(u64),
    Units(u64),
}

#[idempotent(key = "amount:<id>", client = locks, fingerprint = [id])]
async fn amount(locks: &Locks, id: u32, units: bool, runs: &Runs) -> Result<Amount, AppError> {
    runs.bump();
    Ok(if units {
        Amount::Units(5)
    } else {
        Amount::Cents(5)
    })
}

#[idempotent(key = "maybe:<id>", client = locks, fingerprint = [id])]
async fn maybe(
    locks: &Locks,
    id: u32,
    value: Option<Option<u32>>,
    runs: &Runs,
) -> Result<Option<Option<u32>>, AppError> {
    runs.bump();
    Ok(value)
}

/// A result that reads back from its JSON as another value is stored unstorable, never
/// replayed as that other value: an `#[serde(untagged)]` enum's `Units(5)` (it read back
/// as `Cents(5)`: told by the type's `PartialEq`) and `Some(None)` (it read back as
/// `None`). Control: `Cents(5)` and `Some(Some(3))` read back as themselves and are
/// replayed.
async fn a_result_that_reads_back_as_another_value_is_not_replayed(locks: Locks) {
    let runs = Runs::default();
    assert_eq!(
        amount(&locks, 1, true, &runs).await.unwrap(),
        Amount::Units(5)
    );
    assert_eq!(
        maybe(&locks, 1, Some(None), &runs).await.unwrap(),
        Some(None)
    );
    for _ in 0..2 {
        for e in [
            idem_err(amount(&locks, 1, true, &runs).await),
            idem_err(maybe(&locks, 1, Some(None), &runs).await),
        ] {
            assert!(
                matches!(&e, Error::Unrepresentable { reason, .. } if reason.contains("another value")),
                "{e:?}"
            );
        }
    }
    assert_eq!(runs.get(), 2, "each body ran once");
    // The control: the same fns, values that read back as themselves.
    assert_eq!(
        amount(&locks, 2, false, &runs).await.unwrap(),
        Amount::Cents(5)
    );
    assert_eq!(
        maybe(&locks, 2, Some(Some(3)), &runs).await.unwrap(),
        Some(Some(3))
    );
    assert_eq!(
        amount(&locks, 2, false, &runs).await.unwrap(),
        Amount::Cents(5)
    );
    assert_eq!(
        maybe(&locks, 2, Some(Some(3)), &runs).await.unwrap(),
        Some(Some(3))
    );
    assert_eq!(runs.get(), 4, "the control's repeats were replayed");
}

#[idempotent(key = "ratio:<id>", client = locks, fingerprint = [id, ratio])]
async fn scaled(locks: &Locks, id: u32, ratio: f64, runs: &Runs) -> Result<u32, AppError> {
    let _ = ratio;
    Ok(runs.bump())
}

/// `+inf`, `-inf` and `NaN` are three payloads (`serde_json` writes each as `null`, so
/// they used to share a fingerprint: the second was replayed the first's result).
/// Control: the same `+inf` again is replayed.
async fn non_finite_floats_are_three_payloads(locks: Locks) {
    let runs = Runs::default();
    assert_eq!(scaled(&locks, 1, f64::INFINITY, &runs).await.unwrap(), 1);
    assert_eq!(
        scaled(&locks, 1, f64::INFINITY, &runs).await.unwrap(),
        1,
        "control"
    );
    for other in [f64::NEG_INFINITY, f64::NAN] {
        let e = idem_err(scaled(&locks, 1, other, &runs).await);
        assert!(matches!(e, Error::PayloadMismatch { .. }), "{other}: {e:?}");
    }
    assert_eq!(runs.get(), 1);
}

/// What an observer saw: each event's name and key, in order.
type Seen = Arc<std::sync::Mutex<Vec<(String, String)>>>;

fn recorder() -> (Seen, impl Fn(&distlock::Event<'_>) + Send + Sync + 'static) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let observe = move |e: &distlock::Event<'_>| {
        log.lock()
            .unwrap()
            .push((e.name().to_owned(), e.key().to_owned()))
    };
    (seen, observe)
}

fn names_for(seen: &Seen, key_part: &str) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(_, k)| k.contains(key_part))
        .map(|(n, _)| n.clone())
        .collect()
}

/// Every lock and idempotency step reaches the observer through the events seam, with
/// the key it is about: taken, fenced, busy, released, renewed, lost, claimed, stored,
/// replayed, mismatched.
async fn observed_steps(locks: Locks, seen: Seen) {
    let g = locks.lock("ev-a").acquire().await.unwrap();
    g.fence().await.unwrap();
    assert!(matches!(
        locks.lock("ev-a").acquire().await,
        Err(Error::Busy { .. })
    ));
    g.release().await.unwrap();
    assert_eq!(
        names_for(&seen, "ev-a"),
        ["acquired", "fenced", "busy", "released"]
    );

    let g = locks
        .lock("ev-renew")
        .ttl(Duration::from_millis(300))
        .renew(true)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    g.release().await.unwrap();
    let renewed = names_for(&seen, "ev-renew");
    assert!(
        renewed.iter().any(|n| n == "renewed") && renewed.last().unwrap() == "released",
        "{renewed:?}"
    );

    let g = locks
        .lock("ev-lost")
        .ttl(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(matches!(g.release().await, Err(Error::Lost { .. })));
    assert_eq!(names_for(&seen, "ev-lost"), ["acquired", "lost"]);

    let runs = Runs::default();
    pay(&locks, "ev-n1", 5, 0, &runs).await.unwrap();
    pay(&locks, "ev-n1", 5, 0, &runs).await.unwrap();
    assert!(matches!(
        idem_err(pay(&locks, "ev-n1", 6, 0, &runs).await),
        Error::PayloadMismatch { .. }
    ));
    assert_eq!(
        names_for(&seen, "ev-n1"),
        ["claimed", "stored", "replayed", "mismatch"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_the_observer_on_redis() {
    let server = RedisServer::start();
    let (seen, observe) = recorder();
    let locks = Locks::builder(server.url())
        .observer(observe)
        .build()
        .unwrap();
    observed_steps(locks, seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_the_observer_in_memory() {
    let (seen, observe) = recorder();
    observed_steps(Locks::in_memory_observed(observe), seen).await;
}

/// An observer that panics changes nothing for the caller: the lock is still taken and
/// released, and the next caller gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_observer_changes_nothing() {
    let locks = Locks::in_memory_observed(|_| panic!("observer bug"));
    locks
        .lock("p")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    locks
        .lock("p")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// An observer records each event with the name of the thread it was emitted on.
type SeenOn = Arc<std::sync::Mutex<Vec<(String, String, String)>>>;

/// One client with one observer, shared by six runtimes (more than the machine's cores;
/// actix-web runs one per worker), each on a thread of its own: every event reaches the
/// one observer, emitted on the thread of the task the step ran in. Each task's own key
/// shows exactly its cycles, in order; the key all runtimes contend for shows every
/// acquisition and release, from every runtime.
#[test]
fn one_observer_hears_every_runtime_of_a_shared_client() {
    const RUNTIMES: usize = 6;
    let server = RedisServer::start();
    let seen: SeenOn = Arc::default();
    let log = seen.clone();
    let locks = Locks::builder(server.url())
        .observer(move |e: &distlock::Event<'_>| {
            let thread = std::thread::current().name().unwrap_or("").to_owned();
            log.lock()
                .unwrap()
                .push((e.name().to_owned(), e.key().to_owned(), thread));
        })
        .build()
        .unwrap();
    std::thread::scope(|s| {
        for r in 0..RUNTIMES {
            let locks = locks.clone();
            std::thread::Builder::new()
                .name(format!("rt-{r}"))
                .spawn_scoped(s, move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        let own = (0..3).map(|t| {
                            let locks = locks.clone();
                            tokio::spawn(async move {
                                common::cycles(&locks, &format!("ev-rt-{r}-{t}"), 20).await
                            })
                        });
                        let shared = (0..2).map(|_| {
                            let locks = locks.clone();
                            tokio::spawn(async move {
                                for _ in 0..5 {
                                    let g = locks
                                        .lock("ev-shared")
                                        .wait(Duration::from_secs(20))
                                        .acquire()
                                        .await
                                        .unwrap();
                                    tokio::task::yield_now().await;
                                    g.release().await.unwrap();
                                }
                            })
                        });
                        for task in own.chain(shared).collect::<Vec<_>>() {
                            task.await.unwrap();
                        }
                    })
                })
                .unwrap();
        }
    });
    let seen = seen.lock().unwrap();
    for r in 0..RUNTIMES {
        for t in 0..3 {
            let key = format!("ev-rt-{r}-{t}");
            let on_key: Vec<_> = seen.iter().filter(|(_, k, _)| k.ends_with(&key)).collect();
            let names: Vec<_> = on_key.iter().map(|(n, _, _)| n.as_str()).collect();
            assert_eq!(names, ["acquired", "released"].repeat(20), "{key}");
            let here = format!("rt-{r}");
            assert!(on_key.iter().all(|(_, _, th)| *th == here), "{on_key:?}");
        }
    }
    let shared: Vec<_> = seen
        .iter()
        .filter(|(_, k, _)| k.ends_with("ev-shared"))
        .collect();
    let count = |name: &str| shared.iter().filter(|(n, _, _)| n == name).count();
    assert_eq!(count("acquired"), RUNTIMES * 10, "{shared:?}");
    assert_eq!(count("released"), RUNTIMES * 10, "{shared:?}");
    assert_eq!(count("lost") + count("release_failed"), 0, "{shared:?}");
    let threads: std::collections::BTreeSet<_> =
        shared.iter().map(|(_, _, th)| th.as_str()).collect();
    assert_eq!(threads.len(), RUNTIMES, "{threads:?}");
}

/// Waits up to 5 s for an event about a key containing `key`, named one of `names`.
async fn heard(seen: &Seen, key: &str, names: &[&str]) -> Option<String> {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let found = names_for(seen, key);
        if let Some(name) = found.iter().find(|n| names.contains(&n.as_str())) {
            return Some(name.clone());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// A `release()` its caller cancels finishes in a task of its own, and the observer
/// hears how it ended though the caller never will: `released` (the key is free), or a
/// failure when another client held the key by then (its token stays): `lost`, or
/// `release_failed` when the retry of a try that may have run cannot tell (see
/// `release_raw`), never `released`. A guard dropped without `release()` is heard the
/// same way. Replies come through the fault proxy 30 ms late, so each cancellation
/// comes while the release is in flight (checked: its first poll was pending; from a
/// fast server a reply could otherwise be read within that poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cancelled_by_its_caller_is_still_heard() {
    let server = RedisServer::start();
    let proxy = common::proxy::FaultProxy::start(server.port);
    proxy.set_latency(common::proxy::Dir::ToClient, Duration::from_millis(30));
    let (seen, observe) = recorder();
    let locks = Locks::builder(proxy.url())
        .observer(observe)
        .build()
        .unwrap();
    let mut raw = server.raw().await;

    let g = locks.lock("ev-cancel").acquire().await.unwrap();
    assert!(cancelled_in_flight(g.release()).await);
    assert_eq!(
        heard(&seen, "ev-cancel", &["released"]).await.as_deref(),
        Some("released"),
        "{seen:?}"
    );
    let left: Option<String> = redis::AsyncCommands::get(&mut raw, "lock:ev-cancel")
        .await
        .unwrap();
    assert_eq!(left, None);

    let g = locks
        .lock("ev-cancel-lost")
        .ttl(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _: () = redis::AsyncCommands::set(&mut raw, "lock:ev-cancel-lost", "another")
        .await
        .unwrap();
    assert!(cancelled_in_flight(g.release()).await);
    let ended = heard(
        &seen,
        "ev-cancel-lost",
        &["lost", "release_failed", "released"],
    )
    .await;
    assert!(
        matches!(ended.as_deref(), Some("lost" | "release_failed")),
        "{ended:?} {seen:?}"
    );
    let left: Option<String> = redis::AsyncCommands::get(&mut raw, "lock:ev-cancel-lost")
        .await
        .unwrap();
    assert_eq!(left.as_deref(), Some("another"));

    drop(locks.lock("ev-dropped").acquire().await.unwrap());
    assert_eq!(
        heard(&seen, "ev-dropped", &["released"]).await.as_deref(),
        Some("released"),
        "{seen:?}"
    );
    assert_eq!(
        names_for(&seen, "ev-dropped"),
        ["acquired", "released"],
        "{seen:?}"
    );
}

/// The direct connections of a fresh client, by `CLIENT LIST` (they name themselves).
async fn direct_connections(raw: &mut redis::aio::MultiplexedConnection) -> usize {
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(raw)
        .await
        .unwrap();
    clients
        .lines()
        .filter(|l| l.contains("name=distlock-direct "))
        .count()
}

/// Idempotency records go over the multiplexed connection only (`routing::Route::Shared`):
/// claims, replays, stores, a mismatch and a wait make no direct connection, where a
/// lock's calls, few at a time, do (the control, with the same client afterwards).
#[tokio::test]
async fn idempotency_records_go_over_the_multiplexed_connection() {
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let runs = Runs::default();
    let first = pay(&locks, "via-1", 250, 0, &runs).await.unwrap();
    assert_eq!(pay(&locks, "via-1", 250, 0, &runs).await.unwrap(), first);
    assert!(matches!(
        idem_err(pay(&locks, "via-1", 999, 0, &runs).await),
        Error::PayloadMismatch { .. }
    ));
    let (a, b) = tokio::join!(
        pay_waiting(&locks, "via-2", &runs),
        pay_waiting(&locks, "via-2", &runs)
    );
    assert_eq!(a.unwrap(), b.unwrap());
    assert_eq!(runs.get(), 2);
    assert_eq!(direct_connections(&mut raw).await, 0);
    // The control: a lock's calls alone in flight take a direct connection (one slow to
    // open goes on in the background and names itself a moment later).
    let g = locks.lock("via-lock").acquire().await.unwrap();
    g.release().await.unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while direct_connections(&mut raw).await == 0 {
        assert!(
            Instant::now() < until,
            "control: a lock's call made a direct connection"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
