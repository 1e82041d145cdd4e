//! Multi-process tests against a real Redis: the test binary re-runs itself as child
//! processes (`child_entry`) that take the same locks, and the parent checks mutual
//! exclusion across processes, recovery after a holder is SIGKILLed, and `Lost` after a
//! holder is paused (SIGSTOP) past its ttl, and a job scheduled on every process run once
//! per period with `min_hold`.
//!
//! Parent and children talk by lines: the parent writes to a child's stdin, a child
//! prints `@@<event> key=value ...` lines on stdout (other lines, such as the test
//! harness's, are ignored).
mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use common::*;
use distlock::{Locks, distributed_lock};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

/// Environment variable naming the role a child process plays.
const ROLE_VAR: &str = "DISTLOCK_CHILD";
/// Environment variable carrying the Redis URL to a child.
const URL_VAR: &str = "DISTLOCK_URL";
/// Upper bound on a child's life, in case its parent vanished without closing stdin.
const CHILD_MAX_LIFE: Duration = Duration::from_secs(120);
/// Bound on waiting for a child to start and report ready (other agents may load the box).
const START_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------
// Parent side: spawning and talking to children.
// ---------------------------------------------------------------------------------------

/// A child process running one role; SIGKILLed and reaped on drop (also on panic).
struct ChildProc {
    role: &'static str,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl ChildProc {
    fn spawn(role: &'static str, url: &str, env: &[(&str, String)]) -> ChildProc {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        cmd.args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_VAR, role)
            .env(URL_VAR, url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child test process");
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take();
        let (tx, rx) = std::sync::mpsc::channel();
        let pid = child.id();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(mut line) = line else { break };
                // The harness writes `test child_entry ... ` without a newline, so a
                // message may start mid-line.
                match line.find("@@") {
                    Some(at) => line = line.split_off(at),
                    None if line.trim().is_empty() => {}
                    None => eprintln!("[child {role} {pid}] {line}"),
                }
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ChildProc {
            role,
            child,
            stdin,
            lines: rx,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (bounded) for the next `@@` line, which must start with `@@<event>`;
    /// returns the rest of the line.
    fn expect(&mut self, event: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let want = format!("@@{event}");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with("@@") => {
                    let rest = line.strip_prefix(&want).unwrap_or_else(|| {
                        panic!(
                            "child {} ({}): expected `{want}`, got `{line}`",
                            self.role,
                            self.pid()
                        )
                    });
                    return rest.trim().to_owned();
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => panic!(
                    "child {} ({}): no `{want}` within {timeout:?}",
                    self.role,
                    self.pid()
                ),
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().ok();
                    panic!(
                        "child {} ({}) closed stdout before `{want}` (exit: {status:?})",
                        self.role,
                        self.pid()
                    )
                }
            }
        }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("child stdin open");
        writeln!(stdin, "{line}").expect("write to child stdin");
        stdin.flush().expect("flush child stdin");
    }

    /// Sends a signal by name (`STOP`, `CONT`) with the `kill` utility.
    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {} failed", self.pid());
    }

    /// SIGKILL (what `Child::kill` sends on Unix) and reap.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (bounded) for the child to exit on its own.
    fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        self.stdin = None;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "child {} ({}) did not exit within {timeout:?}",
                self.role,
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        self.stdin = None;
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The number after `name=` in a line like `fence=3 violations=0`.
fn field(rest: &str, name: &str) -> u64 {
    let prefix = format!("{name}=");
    rest.split_whitespace()
        .find_map(|w| w.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no `{name}=` in `{rest}`"))
        .parse()
        .unwrap_or_else(|e| panic!("bad `{name}` in `{rest}`: {e}"))
}

/// Whether `/proc` reports the process as stopped; `None` where there is no `/proc`.
fn is_stopped(pid: u32) -> Option<bool> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) S ...`: the state follows the last `)`.
    let state = stat.rsplit_once(')')?.1.split_whitespace().next()?;
    Some(state == "T" || state == "t")
}

// ---------------------------------------------------------------------------------------
// Child side: roles.
// ---------------------------------------------------------------------------------------

/// Entry point of child processes; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    // Never outlive a vanished parent for long.
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_MAX_LIFE);
        eprintln!("child: exceeded {CHILD_MAX_LIFE:?}, exiting");
        std::process::exit(3);
    });
    let url = std::env::var(URL_VAR).expect("DISTLOCK_URL");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("child runtime");
    match role.as_str() {
        "counter" => counter_role(&rt, &url),
        "holder" => holder_role(&rt, &url),
        "paused" => paused_role(&rt, &url),
        "scheduler" => scheduler_role(&rt, &url),
        "permits" => permits_role(&rt, &url),
        "rw" => rw_role(&rt, &url),
        "transfer" => transfer_role(&rt, &url),
        other => panic!("unknown child role `{other}`"),
    }
}

/// A client and a plain connection for the workload's own data.
async fn connect_both(url: &str) -> (Locks, MultiplexedConnection) {
    let locks = Locks::connect(url).await.expect("Locks::connect");
    let conn = redis::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis connect");
    (locks, conn)
}

fn env_u64(name: &str) -> u64 {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} not set"))
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Blocks until the parent writes a line (or closes stdin).
fn wait_for_parent() -> String {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("read stdin");
    line.trim().to_owned()
}

/// The workload: a non-atomic read-modify-write with an await in the middle. Also counts
/// how many others were inside at the same time (`inside` > 1 is an overlap).
async fn read_modify_write(mut conn: MultiplexedConnection, name: &str) -> bool {
    let counter = format!("data:counter:{name}");
    let inside_key = format!("data:inside:{name}");
    let inside: i64 = conn.incr(&inside_key, 1).await.expect("INCR inside");
    let value: Option<u64> = conn.get(&counter).await.expect("GET counter");
    tokio::time::sleep(Duration::from_millis(1)).await;
    let () = conn
        .set(&counter, value.unwrap_or(0) + 1)
        .await
        .expect("SET counter");
    let _: i64 = conn.decr(&inside_key, 1).await.expect("DECR inside");
    inside != 1
}

#[distributed_lock(key = "counter:<name>", ttl = "10s", wait = "30s", client = locks)]
async fn locked_step(
    locks: &Locks,
    conn: MultiplexedConnection,
    name: &str,
) -> Result<bool, AppError> {
    Ok(read_modify_write(conn, name).await)
}

async fn unlocked_step(conn: MultiplexedConnection, name: &str) -> Result<bool, AppError> {
    Ok(read_modify_write(conn, name).await)
}

/// Env: `DISTLOCK_COUNTER` (name), `DISTLOCK_LOCKED` (0/1), `DISTLOCK_TASKS`,
/// `DISTLOCK_ITERS`. Prints `@@ready`, waits for `go`, runs, prints
/// `@@done violations=V ms=T`.
fn counter_role(rt: &tokio::runtime::Runtime, url: &str) {
    let name = std::env::var("DISTLOCK_COUNTER").expect("DISTLOCK_COUNTER");
    let locked = env_u64("DISTLOCK_LOCKED") == 1;
    let tasks = env_u64("DISTLOCK_TASKS");
    let iters = env_u64("DISTLOCK_ITERS");
    let (locks, conn) = rt.block_on(connect_both(url));
    println!("@@ready");
    assert_eq!(wait_for_parent(), "go", "parent did not say go");
    let started = Instant::now();
    let violations = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        let mut handles = Vec::new();
        for _ in 0..tasks {
            let (locks, conn, name) = (locks.clone(), conn.clone(), name.clone());
            let violations = violations.clone();
            handles.push(tokio::spawn(async move {
                for _ in 0..iters {
                    let overlapped = if locked {
                        locked_step(&locks, conn.clone(), &name).await
                    } else {
                        unlocked_step(conn.clone(), &name).await
                    }
                    .expect("step failed");
                    if overlapped {
                        violations.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        for h in handles {
            h.await.expect("task panicked");
        }
    });
    println!(
        "@@done violations={} ms={}",
        violations.load(Ordering::Relaxed),
        started.elapsed().as_millis()
    );
}

/// Env: `DISTLOCK_TTL_MS`. Takes `victim`, prints `@@ready fence=N`, then holds it until
/// stdin closes (in practice: until SIGKILL).
fn holder_role(rt: &tokio::runtime::Runtime, url: &str) {
    let ttl = Duration::from_millis(env_u64("DISTLOCK_TTL_MS"));
    let guard = rt.block_on(async {
        let locks = Locks::connect(url).await.expect("Locks::connect");
        locks
            .lock("victim")
            .ttl(ttl)
            .acquire()
            .await
            .expect("acquire victim")
    });
    let fence = rt.block_on(guard.fence()).expect("fence");
    println!("@@ready fence={fence}");
    let _ = wait_for_parent();
    let _ = rt.block_on(guard.release());
}

/// Asks for the fence before the pause (`late` false), or only after it, right before
/// it would write (`late` true).
#[distributed_lock(key = "paused", ttl = "1s", client = locks)]
async fn paused_section(locks: &Locks, body: Duration, late: bool) -> Result<u64, AppError> {
    let held = distlock::current_lock().expect("inside the lock");
    let early = if late { 0 } else { held.fence().await? };
    println!("@@in-body fence={early}");
    tokio::time::sleep(body).await;
    Ok(held.fence().await?)
}

/// Env: `DISTLOCK_BODY_MS`, `DISTLOCK_ASK_LATE` (0 or 1). Runs `paused_section` and
/// prints `@@result lost` or `@@result <something else>`.
fn paused_role(rt: &tokio::runtime::Runtime, url: &str) {
    let body = Duration::from_millis(env_u64("DISTLOCK_BODY_MS"));
    let late = env_u64("DISTLOCK_ASK_LATE") == 1;
    let result = rt.block_on(async {
        let locks = Locks::connect(url).await.expect("Locks::connect");
        paused_section(&locks, body, late).await
    });
    match result {
        Err(AppError::Lock(distlock::Error::Lost { .. })) => println!("@@result lost"),
        Ok(fence) => println!("@@result ok fence={fence}"),
        Err(e) => println!("@@result error {e:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Parent tests.
// ---------------------------------------------------------------------------------------

const PROCS: u64 = 2;
const TASKS: u64 = 8;
const ITERS: u64 = 25;

/// Runs the counter workload in `PROCS` children at once; returns the final counter and
/// the overlaps the children saw.
async fn run_counter(server: &RedisServer, name: &str, locked: bool) -> (u64, u64, Duration) {
    let env = [
        ("DISTLOCK_COUNTER", name.to_owned()),
        ("DISTLOCK_LOCKED", u64::from(locked).to_string()),
        ("DISTLOCK_TASKS", TASKS.to_string()),
        ("DISTLOCK_ITERS", ITERS.to_string()),
    ];
    let mut children: Vec<ChildProc> = (0..PROCS)
        .map(|_| ChildProc::spawn("counter", &server.url(), &env))
        .collect();
    for c in &mut children {
        c.expect("ready", START_TIMEOUT);
    }
    let started = Instant::now();
    for c in &mut children {
        c.send("go");
    }
    let mut violations = 0;
    for c in &mut children {
        let done = c.expect("done", Duration::from_secs(90));
        violations += field(&done, "violations");
        assert!(c.wait_exit(Duration::from_secs(10)).success());
    }
    let elapsed = started.elapsed();
    let mut raw = server.raw().await;
    let value: Option<u64> = raw.get(format!("data:counter:{name}")).await.unwrap();
    (value.unwrap_or(0), violations, elapsed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_across_processes() {
    let server = RedisServer::start();
    let expected = PROCS * TASKS * ITERS;

    let (locked, overlaps, took) = run_counter(&server, "locked", true).await;
    eprintln!("locked: counter {locked}/{expected}, overlaps {overlaps}, took {took:?}");
    assert_eq!(overlaps, 0, "critical sections overlapped under the lock");
    assert_eq!(locked, expected, "updates lost under the lock");

    // Control: the same workload without the lock must lose updates, or this test
    // could not fail.
    let (unlocked, overlaps, took) = run_counter(&server, "unlocked", false).await;
    eprintln!("unlocked: counter {unlocked}/{expected}, overlaps {overlaps}, took {took:?}");
    assert!(
        unlocked < expected,
        "the unlocked control lost no updates ({unlocked}/{expected}): the workload does not race"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_holder_expires_after_ttl() {
    const TTL: Duration = Duration::from_secs(2);
    const MARGIN: Duration = Duration::from_millis(1500);
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;

    let mut child = ChildProc::spawn(
        "holder",
        &server.url(),
        &[("DISTLOCK_TTL_MS", TTL.as_millis().to_string())],
    );
    let child_fence = field(&child.expect("ready", START_TIMEOUT), "fence");
    let child_pid = child.pid();

    let killed_at = Instant::now();
    child.kill();
    let reaped = killed_at.elapsed();

    // The dead child's lock is still there, with its token, until the ttl runs out.
    let token: Option<String> = raw.get("lock:victim").await.unwrap();
    let pttl: i64 = raw.pttl("lock:victim").await.unwrap();
    let token = token.expect("the killed child's lock is gone before its ttl");
    assert!(
        token.ends_with(&format!(":{child_pid}")),
        "lock held by `{token}`, not child {child_pid}"
    );
    assert!(pttl > 0, "lock has no ttl left: {pttl}");
    let busy = locks.lock("victim").acquire().await;
    assert!(
        matches!(busy, Err(distlock::Error::Busy { .. })),
        "zero-wait acquire right after the kill: {busy:?}"
    );

    let guard = locks
        .lock("victim")
        .ttl(Duration::from_secs(10))
        .wait(TTL + Duration::from_secs(3))
        .acquire()
        .await
        .expect("the lock of a SIGKILLed holder never came free");
    let after_kill = killed_at.elapsed();
    let fence = guard.fence().await.unwrap();
    eprintln!(
        "sigkill: reaped in {reaped:?}, pttl after kill {pttl} ms, reacquired {after_kill:?} after kill, fences {child_fence} -> {fence}",
    );
    assert!(
        after_kill <= TTL + MARGIN,
        "reacquired {after_kill:?} after the kill; ttl is {TTL:?}"
    );
    // Not before the lease really ran out (Redis expires with ms precision).
    assert!(
        after_kill + Duration::from_millis(20) >= Duration::from_millis(pttl as u64),
        "reacquired {after_kill:?} after the kill, but {pttl} ms of lease were left"
    );
    assert!(
        fence > child_fence,
        "fence {fence} not above the dead holder's {child_fence}",
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstopped_holder_loses_its_lock() {
    const TTL: Duration = Duration::from_secs(1); // as in `paused_section`
    const BODY: Duration = Duration::from_millis(1500);
    let server = RedisServer::start();
    let locks = Locks::connect(&server.url()).await.unwrap();

    // The paused holder asked for its fence before the pause (it must be the smaller),
    // or asks only after it (it must be told `Lost`).
    for late in [false, true] {
        let mut child = ChildProc::spawn(
            "paused",
            &server.url(),
            &[
                ("DISTLOCK_BODY_MS", BODY.as_millis().to_string()),
                ("DISTLOCK_ASK_LATE", u8::from(late).to_string()),
            ],
        );
        let child_fence = field(&child.expect("in-body", START_TIMEOUT), "fence");
        let in_body_at = Instant::now();
        child.signal("STOP");
        let stop_deadline = Instant::now() + Duration::from_secs(2);
        while is_stopped(child.pid()) == Some(false) {
            assert!(Instant::now() < stop_deadline, "child did not stop");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        // Past the child's ttl, while it cannot run: take the lock over.
        tokio::time::sleep_until((in_body_at + TTL + Duration::from_millis(100)).into()).await;
        let guard = locks
            .lock("paused")
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(3))
            .acquire()
            .await
            .expect("the paused child's lock did not expire");
        let taken_after = in_body_at.elapsed();
        let parent_fence = guard.fence().await.unwrap();

        child.signal("CONT");
        let result = child.expect("result", Duration::from_secs(10));
        let result_after = in_body_at.elapsed();
        eprintln!(
            "sigstop (fence asked {}): took over {taken_after:?} after in-body, child result `{result}` {result_after:?} after in-body, fences {child_fence} -> {parent_fence}",
            if late {
                "after the pause"
            } else {
                "before the pause"
            }
        );
        assert_eq!(
            result, "lost",
            "the resumed child did not report its lock lost"
        );
        if !late {
            assert!(
                child_fence < parent_fence,
                "fence {parent_fence} not above the paused holder's {child_fence}"
            );
        }
        assert!(child.wait_exit(Duration::from_secs(10)).success());
        guard
            .release()
            .await
            .expect("the parent's lock was disturbed by the resumed child");
    }
}

/// Milliseconds since the Unix epoch: the clock the scheduler children share.
fn unix_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    u64::try_from(since.as_millis()).expect("ms fit")
}

/// One instance of a scheduled job. Env: `DISTLOCK_JOB` (its name), `DISTLOCK_MIN_HOLD_MS`
/// (0: none), `DISTLOCK_START_MS` (Unix ms of the first period), `DISTLOCK_PERIOD_MS`,
/// `DISTLOCK_PERIODS`, `DISTLOCK_SKEW_MS` (how late this instance's timer fires). Each
/// period it tries the lock once (no wait) and, when it gets it, counts a run in
/// `data:runs:<job>` and releases. Prints `@@done runs=R` (its own runs).
fn scheduler_role(rt: &tokio::runtime::Runtime, url: &str) {
    let job = std::env::var("DISTLOCK_JOB").expect("DISTLOCK_JOB");
    let min_hold = env_u64("DISTLOCK_MIN_HOLD_MS");
    let (start, period) = (env_u64("DISTLOCK_START_MS"), env_u64("DISTLOCK_PERIOD_MS"));
    let (periods, skew) = (env_u64("DISTLOCK_PERIODS"), env_u64("DISTLOCK_SKEW_MS"));
    let runs = rt.block_on(async {
        let locks = Locks::connect(url).await.expect("Locks::connect");
        let mut conn = redis::Client::open(url)
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("redis connect");
        let mut runs = 0;
        for i in 0..periods {
            let at = start + i * period + skew;
            tokio::time::sleep(Duration::from_millis(at.saturating_sub(unix_ms()))).await;
            let mut request = locks.lock(format!("job:{job}"));
            if min_hold > 0 {
                request = request.min_hold(Duration::from_millis(min_hold));
            }
            match request.acquire().await {
                Ok(guard) => {
                    let _: i64 = conn
                        .incr(format!("data:runs:{job}"), 1)
                        .await
                        .expect("INCR");
                    guard.release().await.expect("release");
                    runs += 1;
                }
                Err(distlock::Error::Busy { .. }) => {}
                Err(e) => panic!("acquire: {e}"),
            }
        }
        runs
    });
    println!("@@done runs={runs}");
}

/// A job every process schedules at the same period, one process's timer 100 ms late:
/// with `min_hold` it runs once per period across both; without it (the control, run at
/// the same time) the late process runs it again in most periods, since the first run
/// ended long before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_job_runs_once_per_period_with_min_hold() {
    const PERIODS: u64 = 5;
    let server = RedisServer::start();
    let start = unix_ms() + 3000; // every child started and connected by then
    let spawn = |job: &str, min_hold: u64, skew: u64| {
        ChildProc::spawn(
            "scheduler",
            &server.url(),
            &[
                ("DISTLOCK_JOB", job.to_owned()),
                ("DISTLOCK_MIN_HOLD_MS", min_hold.to_string()),
                ("DISTLOCK_START_MS", start.to_string()),
                ("DISTLOCK_PERIOD_MS", "1000".to_owned()),
                ("DISTLOCK_PERIODS", PERIODS.to_string()),
                ("DISTLOCK_SKEW_MS", skew.to_string()),
            ],
        )
    };
    let mut children = [
        spawn("kept", 800, 0),
        spawn("kept", 800, 100),
        spawn("released", 0, 0),
        spawn("released", 0, 100),
    ];
    let mut runs = [0; 4];
    for (child, runs) in children.iter_mut().zip(&mut runs) {
        *runs = field(&child.expect("done", Duration::from_secs(60)), "runs");
    }
    let mut raw = server.raw().await;
    let counted: u64 = raw.get("data:runs:kept").await.unwrap();
    assert_eq!(runs[0] + runs[1], PERIODS, "with min_hold: {runs:?}");
    assert_eq!(counted, PERIODS);
    let control = runs[2] + runs[3];
    assert!(
        control > PERIODS,
        "without min_hold the late process should run the job again: {runs:?}"
    );
}

/// Env: `DISTLOCK_PERMITS` (0: no semaphore), `DISTLOCK_TASKS`, `DISTLOCK_ITERS`,
/// `DISTLOCK_HOLD` (0 or 1: take one permit of `render` with a 1 s ttl, print `@@held`
/// and keep it until killed). Otherwise prints `@@ready`, waits for `go`, then each task
/// takes a permit of `render` (10 s wait) and counts itself in `data:inside:render`
/// for 3 ms; prints `@@done most=M`, the most holders it saw at once (all processes).
fn permits_role(rt: &tokio::runtime::Runtime, url: &str) {
    let permits = u32::try_from(env_u64("DISTLOCK_PERMITS")).expect("permits fit");
    let (tasks, iters) = (env_u64("DISTLOCK_TASKS"), env_u64("DISTLOCK_ITERS"));
    let (locks, conn) = rt.block_on(connect_both(url));
    if env_u64("DISTLOCK_HOLD") == 1 {
        let request = locks
            .semaphore("render", permits)
            .ttl(Duration::from_secs(1));
        let held = rt.block_on(request.acquire()).expect("permit");
        println!("@@held");
        let _ = wait_for_parent();
        drop(held);
        return;
    }
    println!("@@ready");
    assert_eq!(wait_for_parent(), "go", "parent did not say go");
    let most = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        let runs = (0..tasks).map(|_| {
            let (locks, mut conn, most) = (locks.clone(), conn.clone(), most.clone());
            tokio::spawn(async move {
                for _ in 0..iters {
                    let guard = match permits {
                        0 => None,
                        n => Some(
                            locks
                                .semaphore("render", n)
                                .wait(Duration::from_secs(10))
                                .acquire()
                                .await
                                .expect("permit"),
                        ),
                    };
                    let inside: u64 = conn.incr("data:inside:render", 1).await.expect("INCR");
                    most.fetch_max(inside, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    let _: i64 = conn.decr("data:inside:render", 1).await.expect("DECR");
                    if let Some(guard) = guard {
                        guard.release().await.expect("release");
                    }
                }
            })
        });
        for run in futures_util::future::join_all(runs).await {
            run.expect("task panicked");
        }
    });
    println!("@@done most={}", most.load(Ordering::Relaxed));
}

/// Most holders at once across 3 processes of 4 tasks each on one semaphore of
/// `permits` (0: none), with a fourth process holding one permit when `killed` until it
/// is SIGKILLed as the others start: its permit frees itself at its 1 s ttl.
async fn most_across_processes(server: &RedisServer, permits: u32, killed: bool) -> u64 {
    let env = |hold: bool| {
        [
            ("DISTLOCK_PERMITS", permits.to_string()),
            ("DISTLOCK_TASKS", "4".to_owned()),
            ("DISTLOCK_ITERS", "15".to_owned()),
            ("DISTLOCK_HOLD", u8::from(hold).to_string()),
        ]
    };
    let mut holder = killed.then(|| {
        let mut holder = ChildProc::spawn("permits", &server.url(), &env(true));
        holder.expect("held", START_TIMEOUT);
        holder
    });
    let mut children: Vec<ChildProc> = (0..3)
        .map(|_| ChildProc::spawn("permits", &server.url(), &env(false)))
        .collect();
    for c in &mut children {
        c.expect("ready", START_TIMEOUT);
    }
    if let Some(holder) = &mut holder {
        holder.kill();
    }
    for c in &mut children {
        c.send("go");
    }
    let mut most = 0;
    for c in &mut children {
        most = most.max(field(&c.expect("done", Duration::from_secs(90)), "most"));
        assert!(c.wait_exit(Duration::from_secs(10)).success());
    }
    most
}

/// A semaphore of 3 across processes, a fourth SIGKILLed while it holds a permit:
/// never more than 3 inside at once (2 until the dead holder's lease ends), and every
/// task gets its permits within its 10 s wait. Control: the same processes without the
/// semaphore overlap past 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_bounds_holders_across_processes() {
    let server = RedisServer::start();
    let most = most_across_processes(&server, 3, true).await;
    assert!(
        (2..=3).contains(&most),
        "{most} inside at once with 3 permits"
    );
    let most = most_across_processes(&server, 0, false).await;
    assert!(most > 3, "without the semaphore: at most {most} at once");
}

/// Env: `DISTLOCK_LOCKED` (0 or 1), `DISTLOCK_TASKS`, `DISTLOCK_ITERS`. Prints `@@ready`,
/// waits for `go`; then every fourth task writes and the others read `catalog`, each
/// counting itself in `data:rw:writers` or `data:rw:readers` for 3 ms; prints
/// `@@done bad=B most=M`: how often a writer was seen beside anyone (all processes), and
/// the most readers seen at once.
fn rw_role(rt: &tokio::runtime::Runtime, url: &str) {
    let locked = env_u64("DISTLOCK_LOCKED") == 1;
    let (tasks, iters) = (env_u64("DISTLOCK_TASKS"), env_u64("DISTLOCK_ITERS"));
    let (locks, conn) = rt.block_on(connect_both(url));
    println!("@@ready");
    assert_eq!(wait_for_parent(), "go", "parent did not say go");
    let (bad, most) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    rt.block_on(async {
        let runs = (0..tasks).map(|t| {
            let (locks, mut conn) = (locks.clone(), conn.clone());
            let (bad, most) = (bad.clone(), most.clone());
            tokio::spawn(async move {
                let writer = t % 4 == 0;
                let (mine, other) = if writer {
                    ("data:rw:writers", "data:rw:readers")
                } else {
                    ("data:rw:readers", "data:rw:writers")
                };
                for _ in 0..iters {
                    let request = match writer {
                        true => locks.write_lock("catalog"),
                        false => locks.read_lock("catalog"),
                    };
                    let guard = match locked {
                        true => Some(
                            request
                                .wait(Duration::from_secs(10))
                                .acquire()
                                .await
                                .expect("acquire"),
                        ),
                        false => None,
                    };
                    let inside: u64 = conn.incr(mine, 1).await.expect("INCR");
                    let others: Option<u64> = conn.get(other).await.expect("GET");
                    if others.unwrap_or(0) > 0 || (writer && inside > 1) {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                    if !writer {
                        most.fetch_max(inside, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    let _: i64 = conn.decr(mine, 1).await.expect("DECR");
                    if let Some(guard) = guard {
                        guard.release().await.expect("release");
                    }
                }
            })
        });
        for run in futures_util::future::join_all(runs).await {
            run.expect("task panicked");
        }
    });
    println!(
        "@@done bad={} most={}",
        bad.load(Ordering::Relaxed),
        most.load(Ordering::Relaxed)
    );
}

/// Runs `n` children of `role` with `env` at once: each says it is ready, is told to
/// go, and its `@@done` line is returned once it has exited cleanly.
fn run_children(
    server: &RedisServer,
    role: &'static str,
    env: &[(&str, String)],
    n: usize,
) -> Vec<String> {
    let mut children: Vec<ChildProc> = (0..n)
        .map(|_| ChildProc::spawn(role, &server.url(), env))
        .collect();
    for c in &mut children {
        c.expect("ready", START_TIMEOUT);
    }
    for c in &mut children {
        c.send("go");
    }
    children
        .iter_mut()
        .map(|c| {
            let done = c.expect("done", Duration::from_secs(90));
            assert!(c.wait_exit(Duration::from_secs(10)).success());
            done
        })
        .collect()
}

/// (writers seen beside anyone, most readers at once) across 3 processes of 8 tasks.
async fn rw_across_processes(server: &RedisServer, locked: bool) -> (u64, u64) {
    let env = [
        ("DISTLOCK_LOCKED", u8::from(locked).to_string()),
        ("DISTLOCK_TASKS", "8".to_owned()),
        ("DISTLOCK_ITERS", "10".to_owned()),
    ];
    let (mut bad, mut most) = (0, 0);
    for done in run_children(server, "rw", &env, 3) {
        bad += field(&done, "bad");
        most = most.max(field(&done, "most"));
    }
    (bad, most)
}

/// Readers and writers of one read/write lock in 3 processes: never a writer beside a
/// reader or another writer, readers sharing. Control: the same without the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_lock_keeps_writers_alone_across_processes() {
    let server = RedisServer::start();
    let (bad, most) = rw_across_processes(&server, true).await;
    assert_eq!(bad, 0, "a writer was seen beside someone");
    assert!(most > 1, "readers never shared ({most} at most)");
    let (bad, _) = rw_across_processes(&server, false).await;
    assert!(
        bad > 0,
        "the control never overlapped: the workload does not race"
    );
}

/// Env: `DISTLOCK_LOCKED` (1: both accounts with a multi-lock; 0: the control, which
/// locks only the account it takes from), `DISTLOCK_TASKS`, `DISTLOCK_ITERS`. Prints
/// `@@ready`, waits for `go`; then each task moves 1 between `data:acct:<i>` (3 accounts)
/// in both directions, a read of both balances and a write of both with a pause
/// between; prints `@@done`.
fn transfer_role(rt: &tokio::runtime::Runtime, url: &str) {
    let locked = env_u64("DISTLOCK_LOCKED") == 1;
    let (tasks, iters) = (env_u64("DISTLOCK_TASKS"), env_u64("DISTLOCK_ITERS"));
    let (locks, conn) = rt.block_on(connect_both(url));
    println!("@@ready");
    assert_eq!(wait_for_parent(), "go", "parent did not say go");
    rt.block_on(async {
        let runs = (0..tasks).map(|t| {
            let (locks, mut conn) = (locks.clone(), conn.clone());
            tokio::spawn(async move {
                for i in 0..iters {
                    let from = (t + i) % 3;
                    let to = (from + 1 + (t % 2)) % 3;
                    let names = [format!("acct:{from}"), format!("acct:{to}")];
                    let wait = Duration::from_secs(10);
                    let guard = if locked {
                        let g = locks.multi_lock(names).wait(wait).acquire().await;
                        (Some(g.expect("multi-lock")), None)
                    } else {
                        let g = locks.lock(&names[0]).wait(wait).acquire().await;
                        (None, Some(g.expect("lock")))
                    };
                    let (a, b) = (format!("data:acct:{from}"), format!("data:acct:{to}"));
                    let x: i64 = conn.get(&a).await.expect("GET");
                    let y: i64 = conn.get(&b).await.expect("GET");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let () = conn.set(&a, x - 1).await.expect("SET");
                    let () = conn.set(&b, y + 1).await.expect("SET");
                    match guard {
                        (Some(g), _) => g.release().await.expect("release"),
                        (_, Some(g)) => g.release().await.expect("release"),
                        _ => {}
                    }
                }
            })
        });
        for run in futures_util::future::join_all(runs).await {
            run.expect("task panicked");
        }
    });
    println!("@@done");
}

/// The total of the three accounts after 3 processes of 6 tasks moved money between
/// them (each account starts at 1000).
async fn total_after_transfers(server: &RedisServer, locked: bool) -> i64 {
    let mut raw = server.raw().await;
    for i in 0..3 {
        let () = raw.set(format!("data:acct:{i}"), 1000).await.unwrap();
    }
    let env = [
        ("DISTLOCK_LOCKED", u8::from(locked).to_string()),
        ("DISTLOCK_TASKS", "6".to_owned()),
        ("DISTLOCK_ITERS", "10".to_owned()),
    ];
    run_children(server, "transfer", &env, 3);
    let mut total = 0;
    for i in 0..3 {
        let v: i64 = raw.get(format!("data:acct:{i}")).await.unwrap();
        total += v;
    }
    total
}

/// Transfers between three accounts in 3 processes, each taking both accounts with a
/// multi-lock, in both directions (no deadlock): no money made or lost. Control: the
/// same transfers locking only the account they take from lose updates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_locks_keep_transfers_whole_across_processes() {
    let server = RedisServer::start();
    assert_eq!(total_after_transfers(&server, true).await, 3000);
    let control = total_after_transfers(&server, false).await;
    assert_ne!(
        control, 3000,
        "the control lost nothing: the workload does not race"
    );
}
