//! W3 and W4: tasks (and processes) sharing one key, with fairness and handoff gaps.
#![allow(clippy::wildcard_imports)]
use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::*;

// ---------------------------------------------------------------------------------------
// W3 and W4: contended
// ---------------------------------------------------------------------------------------

/// One acquisition, on the shared wall clock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rec {
    pub(crate) task: u32,
    pub(crate) acq_start: u64,
    pub(crate) acq_done: u64,
    pub(crate) rel_start: u64,
    pub(crate) rel_done: u64,
}

#[derive(Default)]
pub(crate) struct RunOut {
    pub(crate) recs: Vec<Rec>,
    pub(crate) timeouts: u64,
    pub(crate) errors: u64,
    /// Calls per command name on the server during the run (`INFO commandstats`, so the
    /// commands Lua ran are included).
    pub(crate) commands: BTreeMap<String, u64>,
}

/// Zeroes the server's command statistics (`CONFIG RESETSTAT`) just before a run.
pub(crate) async fn reset_commandstats(conn: &mut MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .expect("CONFIG RESETSTAT");
}

/// Calls per command since the reset (`INFO commandstats`: the commands Lua ran count too).
pub(crate) async fn read_commandstats(conn: &mut MultiplexedConnection) -> BTreeMap<String, u64> {
    let info = info_section(conn, "commandstats").await;
    let mut calls_by_name = BTreeMap::new();
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let calls = rest
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if !matches!(name, "config|resetstat" | "info") {
            calls_by_name.insert(name.to_owned(), calls);
        }
    }
    calls_by_name
}

pub(crate) enum Tickets {
    Local {
        taken: AtomicU64,
        total: u64,
    },
    Redis {
        conn: MultiplexedConnection,
        key: String,
        total: u64,
    },
}

impl Tickets {
    /// Takes the next ticket; `false` when all are gone.
    pub(crate) async fn take(&self) -> bool {
        match self {
            Tickets::Local { taken, total } => taken.fetch_add(1, Ordering::Relaxed) < *total,
            Tickets::Redis { conn, key, total } => {
                let n: Result<u64, _> = redis::cmd("INCR")
                    .arg(key)
                    .query_async(&mut conn.clone())
                    .await;
                n.is_ok_and(|n| n <= *total)
            }
        }
    }
}

/// `tasks` tasks on `key` until the tickets run out: per ticket, acquire (wait up to
/// 10 s, retried with the same ticket if it runs out), hold 1 ms, release. The next
/// ticket is taken during the hold, so taking it adds nothing between release and acquire.
pub(crate) async fn contend(
    client: Arc<Client>,
    key: &str,
    tasks: usize,
    task_base: u32,
    tickets: Arc<Tickets>,
) -> RunOut {
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let (client, tickets, key) = (client.clone(), tickets.clone(), key.to_owned());
        let task = task_base + t as u32;
        handles.push(tokio::spawn(async move {
            let mut out = RunOut::default();
            let mut have = tickets.take().await;
            while have {
                let acq_start = now_ns();
                let held = match client.acquire(&key, WAIT).await {
                    Ok(h) => h,
                    Err(AcqError::Busy) => {
                        out.timeouts += 1;
                        continue;
                    }
                    Err(AcqError::Failed(e)) => {
                        out.errors += 1;
                        eprintln!("task {task}: acquire failed: {e}");
                        if out.errors > 20 {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let acq_done = now_ns();
                let ((), next) = tokio::join!(tokio::time::sleep(HOLD), tickets.take());
                let rel_start = now_ns();
                if let Err(e) = client.release(held).await {
                    out.errors += 1;
                    eprintln!("task {task}: release failed: {e}");
                }
                let rel_done = now_ns();
                out.recs.push(Rec {
                    task,
                    acq_start,
                    acq_done,
                    rel_start,
                    rel_done,
                });
                have = next;
            }
            out
        }));
    }
    let mut all = RunOut::default();
    for h in handles {
        let out = h.await.expect("contending task");
        all.recs.extend(out.recs);
        all.timeouts += out.timeouts;
        all.errors += out.errors;
    }
    all
}

pub(crate) async fn run_w3(cfg: &Config, url: &str, kind: Kind) -> RunOut {
    let client = Arc::new(Client::connect(kind, url).await);
    client
        .warm_up(kind, url, &format!("w3:warm:{}", kind.name()))
        .await;
    let tickets = Arc::new(Tickets::Local {
        taken: AtomicU64::new(0),
        total: cfg.w3_acquisitions,
    });
    let mut stats = raw_connection(url).await;
    reset_commandstats(&mut stats).await;
    let mut out = contend(client, "w3", cfg.w3_tasks, 0, tickets).await;
    out.commands = read_commandstats(&mut stats).await;
    out
}

pub(crate) async fn run_w4(cfg: &Config, url: &str, kind: Kind) -> RunOut {
    let tickets_key = format!("bench:w4:tickets:{}", kind.name());
    let mut conn = raw_connection(url).await;
    let _: () = redis::cmd("DEL")
        .arg(&tickets_key)
        .query_async(&mut conn)
        .await
        .expect("DEL");
    let exe = std::env::current_exe().expect("current exe");
    let mut children = Vec::new();
    for p in 0..cfg.w4_procs {
        let mut child = tokio::process::Command::new(&exe)
            .env(CHILD_ENV, "1")
            .env("DISTLOCK_BENCH_KIND", kind.name())
            .env("DISTLOCK_BENCH_URL", url)
            .env("DISTLOCK_BENCH_KEY", "w4")
            .env("DISTLOCK_BENCH_TICKETS", &tickets_key)
            .env("DISTLOCK_BENCH_TOTAL", cfg.w4_acquisitions.to_string())
            .env("DISTLOCK_BENCH_TASKS", cfg.w4_tasks.to_string())
            .env("DISTLOCK_BENCH_TASK_BASE", (p * cfg.w4_tasks).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn a W4 child");
        let stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        loop {
            match lines.next_line().await.expect("child output") {
                Some(l) if l == "ready" => break,
                Some(_) => {}
                None => panic!("W4 child {p} exited before it was ready"),
            }
        }
        children.push((child, stdin, lines));
    }
    reset_commandstats(&mut conn).await;
    for (_, stdin, _) in &mut children {
        stdin.write_all(b"go\n").await.expect("go");
        stdin.flush().await.expect("go");
    }
    let mut all = RunOut::default();
    for (mut child, _stdin, mut lines) in children {
        while let Some(line) = lines.next_line().await.expect("child output") {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["rec", task, a, b, c, d] => all.recs.push(Rec {
                    task: task.parse().expect("task"),
                    acq_start: a.parse().expect("ts"),
                    acq_done: b.parse().expect("ts"),
                    rel_start: c.parse().expect("ts"),
                    rel_done: d.parse().expect("ts"),
                }),
                ["done", timeouts, errors] => {
                    all.timeouts += timeouts.parse::<u64>().expect("timeouts");
                    all.errors += errors.parse::<u64>().expect("errors");
                }
                _ => eprintln!("W4 child: {line}"),
            }
        }
        let status = child.wait().await.expect("child exit");
        assert!(status.success(), "a W4 child failed: {status}");
    }
    all.commands = read_commandstats(&mut conn).await;
    all
}

/// A W4 child: connect, warm up, say `ready`, wait for `go`, contend, print the records.
pub(crate) fn child_main() {
    let env = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"));
    let kind = Kind::parse(&env("DISTLOCK_BENCH_KIND"));
    let url = env("DISTLOCK_BENCH_URL");
    let key = env("DISTLOCK_BENCH_KEY");
    let tickets_key = env("DISTLOCK_BENCH_TICKETS");
    let total: u64 = env("DISTLOCK_BENCH_TOTAL").parse().expect("total");
    let tasks: usize = env("DISTLOCK_BENCH_TASKS").parse().expect("tasks");
    let base: u32 = env("DISTLOCK_BENCH_TASK_BASE").parse().expect("task base");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let out = rt.block_on(async {
        let client = Arc::new(Client::connect(kind, &url).await);
        client
            .warm_up(
                kind,
                &url,
                &format!("w4:warm:{}:{}", kind.name(), std::process::id()),
            )
            .await;
        let tickets = Arc::new(Tickets::Redis {
            conn: raw_connection(&url).await,
            key: tickets_key,
            total,
        });
        println!("ready");
        std::io::stdout().flush().expect("stdout");
        let mut go = String::new();
        tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut go))
            .await
            .expect("stdin")
            .expect("stdin");
        contend(client, &key, tasks, base, tickets).await
    });
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    for r in &out.recs {
        writeln!(
            w,
            "rec {} {} {} {} {}",
            r.task, r.acq_start, r.acq_done, r.rel_start, r.rel_done
        )
        .expect("stdout");
    }
    writeln!(w, "done {} {}", out.timeouts, out.errors).expect("stdout");
    w.flush().expect("stdout");
}

/// The figures of one contended run.
pub(crate) struct Contended {
    pub(crate) n: usize,
    pub(crate) rate: f64,
    pub(crate) ideal: f64,
    pub(crate) hold_mean_us: f64,
    pub(crate) release_mean_us: f64,
    pub(crate) same_share: f64,
    pub(crate) handoffs: usize,
    pub(crate) gap_p50_us: Option<f64>,
    pub(crate) gap_p99_us: Option<f64>,
    pub(crate) gap_max_us: Option<f64>,
    pub(crate) min_task: u64,
    pub(crate) max_task: u64,
    pub(crate) fair: f64,
    pub(crate) timeouts: u64,
    pub(crate) errors: u64,
    pub(crate) overlaps: usize,
    /// Acquisitions per process (W4), and the share of consecutive ones by one process.
    pub(crate) per_proc: Vec<u64>,
    pub(crate) same_proc_share: f64,
    /// Handoffs to a task of another process (W4): how many, gap p50/p99.
    pub(crate) xproc_handoffs: usize,
    pub(crate) xproc_gap_p50_us: Option<f64>,
    pub(crate) xproc_gap_p99_us: Option<f64>,
    /// Server commands per acquisition, by name.
    pub(crate) commands: Vec<(String, f64)>,
}

/// `tasks` in all, `tasks_per_proc` of them in each process.
pub(crate) fn analyze(
    mut run: RunOut,
    tasks: usize,
    tasks_per_proc: usize,
    rtt_ns: f64,
) -> Contended {
    let recs = &mut run.recs;
    recs.sort_by_key(|r| r.acq_done);
    let n = recs.len();
    let mut per_task = vec![0u64; tasks];
    for r in recs.iter() {
        per_task[r.task as usize] += 1;
    }
    let hold_mean_ns = recs
        .iter()
        .map(|r| (r.rel_start - r.acq_done) as f64)
        .sum::<f64>()
        / n.max(1) as f64;
    let release_mean_ns = recs
        .iter()
        .map(|r| (r.rel_done - r.rel_start) as f64)
        .sum::<f64>()
        / n.max(1) as f64;
    let span_ns =
        recs.iter().map(|r| r.rel_done).max().unwrap_or(0) - recs.first().map_or(0, |r| r.acq_done);
    let mut per_proc = vec![0u64; tasks.div_ceil(tasks_per_proc)];
    for r in recs.iter() {
        per_proc[r.task as usize / tasks_per_proc] += 1;
    }
    let mut same = 0;
    let mut same_proc = 0;
    let mut overlaps = 0;
    let mut gaps: Vec<i64> = Vec::new();
    let mut xproc_gaps: Vec<i64> = Vec::new();
    for w in recs.windows(2) {
        let (prev, next) = (w[0], w[1]);
        if next.acq_done < prev.rel_start {
            overlaps += 1; // two holders at once: must never happen
        }
        if next.task as usize / tasks_per_proc == prev.task as usize / tasks_per_proc {
            same_proc += 1;
        } else {
            xproc_gaps.push(next.acq_done as i64 - prev.rel_done as i64);
        }
        if next.task == prev.task {
            same += 1;
        } else {
            gaps.push(next.acq_done as i64 - prev.rel_done as i64);
        }
    }
    gaps.sort_unstable();
    xproc_gaps.sort_unstable();
    let us = |ns: i64| ns as f64 / 1e3;
    Contended {
        n,
        rate: n as f64 / (span_ns as f64 / 1e9),
        ideal: 1e9 / (hold_mean_ns + rtt_ns),
        hold_mean_us: hold_mean_ns / 1e3,
        release_mean_us: release_mean_ns / 1e3,
        same_share: same as f64 / n.saturating_sub(1).max(1) as f64,
        handoffs: gaps.len(),
        gap_p50_us: pct(&gaps, 0.5).map(us),
        gap_p99_us: pct(&gaps, 0.99).map(us),
        gap_max_us: gaps.last().copied().map(us),
        min_task: per_task.iter().copied().min().unwrap_or(0),
        max_task: per_task.iter().copied().max().unwrap_or(0),
        fair: n as f64 / tasks as f64,
        timeouts: run.timeouts,
        errors: run.errors,
        overlaps,
        per_proc,
        same_proc_share: same_proc as f64 / n.saturating_sub(1).max(1) as f64,
        xproc_handoffs: xproc_gaps.len(),
        xproc_gap_p50_us: pct(&xproc_gaps, 0.5).map(us),
        xproc_gap_p99_us: pct(&xproc_gaps, 0.99).map(us),
        commands: run
            .commands
            .iter()
            .map(|(name, calls)| (name.clone(), *calls as f64 / n.max(1) as f64))
            .collect(),
    }
}

impl Contended {
    pub(crate) fn handoff_ok(&self) -> bool {
        self.gap_p99_us.is_some_and(|p99| p99 < 1_000.0)
    }

    pub(crate) fn rate_ok(&self) -> bool {
        self.rate >= 0.9 * self.ideal
    }

    pub(crate) fn fair_ok(&self) -> bool {
        self.min_task as f64 >= 0.5 * self.fair && self.max_task as f64 <= 2.0 * self.fair
    }
}
