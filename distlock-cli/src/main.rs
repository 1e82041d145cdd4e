//! `distlock`: see and operate distlock's locks and idempotency records from a shell.
//!
//! ```text
//! distlock ls [PATTERN]            held locks, most contended first
//! distlock inspect KEY             one lock: holder, lease, fence, waiters, permits, readers
//! distlock leaks                   locks without a ttl, stuck records, dead local holders
//! distlock release KEY --force     release a stuck lock (asks on a terminal unless --yes)
//! distlock idem ls [PATTERN]       idempotency records: state, lease and retention left
//! distlock idem show KEY           one idempotency record (its full key, or the key the
//!                                  application wrote when it names one record)
//! distlock idem forget KEY         delete a record: the next call under its key runs
//! distlock watch [PATTERN]         a live table, refreshed every second, until Ctrl-C
//!                                  (a failed refresh is shown, and tried again)
//! ```
//!
//! Every listing takes `--json` (one JSON document on stdout; the fields are in
//! `output.rs` and the README). Exit codes: 0 found or done, 1 not found (nothing
//! listed, no such lock or record), 2 usage, 3 Redis unreachable or failing; errors go
//! to stderr on one line.

mod output;

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use futures_util::TryStreamExt;
use lockcore::idempotency::IdemRecord;
use lockcore::{BackendErrorKind, Error, LockState, Locks};

/// See and operate distlock's locks and idempotency records.
#[derive(Parser, Debug)]
#[command(name = "distlock", version, about, long_about = None)]
struct Cli {
    /// Redis to connect to: `redis://`, `rediss://` (TLS: `REDIS_TLS_CA_FILE`,
    /// `REDIS_TLS_CERT_FILE`, `REDIS_TLS_KEY_FILE`), `redis+cluster://h1:7000,h2:7001`,
    /// `redis+sentinel://s1:26379,s2:26379/mymaster`.
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379/",
        global = true
    )]
    url: String,
    /// The applications' key prefix.
    #[arg(long, default_value = lockcore::DEFAULT_PREFIX, global = true)]
    prefix: String,
    /// One JSON document on stdout instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// How long one Redis command may take, in ms.
    #[arg(long, default_value_t = 2000, global = true)]
    timeout_ms: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The held locks whose name matches PATTERN (a glob: `*`, `?`, `[abc]`), most
    /// contended first.
    Ls {
        /// Lock names, as the application writes them (`order:*`).
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// One lock: its holder, lease left, last fence, waiters, permits and readers.
    Inspect {
        /// The lock's name (`order:42`) or its full key (`lock:order:42`).
        key: String,
    },
    /// Lock keys without a ttl, idempotency records stuck in progress past their lease,
    /// and holders on this host whose process no longer exists.
    Leaks,
    /// Releases whatever holds a lock and wakes its waiters (its holder gets `Lost` at
    /// release or renewal).
    Release {
        /// The lock's name or full key.
        key: String,
        /// Required: a forced release lets another instance in while the holder may
        /// still be running.
        #[arg(long)]
        force: bool,
        /// Do not ask for confirmation on a terminal.
        #[arg(long, short)]
        yes: bool,
    },
    /// Idempotency records.
    Idem {
        #[command(subcommand)]
        command: IdemCommand,
    },
    /// A live table of the held locks, contended first, refreshed until Ctrl-C (plain
    /// lines when the output is not a terminal). A refresh that fails shows its error
    /// and the next one tries again.
    Watch {
        /// Lock names to watch.
        #[arg(default_value = "*")]
        pattern: String,
        /// Time between refreshes, in ms.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Stop after this many refreshes, failed ones included (default: until Ctrl-C);
        /// the exit code is then the last refresh's.
        #[arg(long)]
        count: Option<u64>,
    },
}

#[derive(Subcommand, Debug)]
enum IdemCommand {
    /// The records whose key after `idem:` matches PATTERN (a glob): state, lease left
    /// (in progress), time until Redis drops it, owner; sorted by key.
    Ls {
        /// `app::pay:*`, or `*:pay:*` for the keys the application wrote as `pay:<id>`.
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// One record: state, owner, lease left, ttl, stored result.
    Show {
        /// The record's key (`idem:app::pay:user-7:K1`), with or without the prefix, or
        /// the key the application wrote (`user-7:K1`) when it ends one record's key.
        key: String,
    },
    /// Deletes a record and wakes the repeats waiting on it: the next call runs.
    Forget {
        /// As for `show`: a full key, or the key the application wrote when it ends one
        /// record's key (several: they are listed, and nothing is deleted). A record found
        /// by the application's key is forgotten once confirmed: asked on a terminal,
        /// `--yes` elsewhere (the key may be another function's record).
        key: String,
        /// Forget a record found by the application's key without asking.
        #[arg(long, short)]
        yes: bool,
    },
}

/// How a command ended.
enum Outcome {
    Done,
    NotFound,
}

/// A failure, with its exit code.
struct Failure {
    code: u8,
    message: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let code = match e {
            Error::Backend { .. } => 3,
            Error::InvalidKey { .. } => 2,
            _ => 1,
        };
        Failure {
            code,
            message: e.to_string(),
        }
    }
}

/// A key given to `idem show` or `idem forget` that is no record's (a lock's, say): a
/// refusal (1), as when the key holds something else, not a usage error; nothing was
/// read or deleted.
fn not_a_record(e: Error) -> Failure {
    let code = match e {
        Error::InvalidKey { .. } => 1,
        ref e => Failure::from(e.clone()).code,
    };
    Failure {
        code,
        message: format!("{e}; nothing was deleted"),
    }
}

fn usage(message: impl Into<String>) -> Failure {
    Failure {
        code: 2,
        message: message.into(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            return fail(Failure {
                code: 3,
                message: format!("cannot start: {e}"),
            });
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::NotFound) => ExitCode::from(1),
        Err(failure) => fail(failure),
    }
}

fn fail(failure: Failure) -> ExitCode {
    let line = failure.message.replace('\n', " ");
    eprintln!("distlock: {line}");
    ExitCode::from(failure.code)
}

async fn connect(cli: &Cli) -> Result<Locks, Failure> {
    let builder = Locks::builder(cli.url.as_str())
        .prefix(cli.prefix.as_str())
        .command_timeout(Duration::from_millis(cli.timeout_ms))
        .connect_timeout(Duration::from_millis(cli.timeout_ms))
        .tls_from_env()
        .map_err(|e| usage(e.to_string()))?;
    builder.connect().await.map_err(|e| match e {
        Error::Backend { ref source, .. } if source.kind() == BackendErrorKind::Config => {
            usage(e.to_string())
        }
        Error::Backend { .. } => Failure {
            code: 3,
            message: format!("Redis unreachable: {e}"),
        },
        e => usage(e.to_string()),
    })
}

async fn run(cli: Cli) -> Result<Outcome, Failure> {
    if let Command::Release { force: false, .. } = cli.command {
        return Err(usage(
            "refusing to release without --force: the holder may still be running, and \
             another instance would then run beside it",
        ));
    }
    let locks = connect(&cli).await?;
    let name = |key: &str| {
        key.strip_prefix(cli.prefix.as_str())
            .unwrap_or(key)
            .to_owned()
    };
    let mut out = std::io::stdout().lock();
    match &cli.command {
        Command::Ls { pattern } => {
            let states = listed(&locks, pattern).await?;
            if cli.json {
                output::json_line(&mut out, &output::locks_json(&states, &cli.prefix));
            } else {
                output::table(&mut out, &states, &cli.prefix);
            }
            Ok(found(!states.is_empty()))
        }
        Command::Inspect { key } => {
            let state = locks.inspect(&name(key)).await?;
            if cli.json {
                output::json_line(&mut out, &output::lock_json(&state, &cli.prefix));
            } else if state.is_held() || state.writer_waiting.is_some() {
                output::details(&mut out, &state);
            } else {
                let _ = writeln!(
                    out,
                    "{}: not held (last fence {})",
                    state.key, state.last_fence
                );
            }
            Ok(found(state.is_held() || state.writer_waiting.is_some()))
        }
        Command::Leaks => {
            let leaks = leaks(&locks).await?;
            if cli.json {
                output::json_line(&mut out, &leaks.json(&cli.prefix));
            } else {
                leaks.print(&mut out);
            }
            Ok(found(!leaks.is_empty()))
        }
        Command::Release { key, yes, .. } => {
            let name = name(key);
            let state = locks.inspect(&name).await?;
            if !state.is_held() && state.writer_waiting.is_none() {
                eprintln!("distlock: {} is not held", state.key);
                return Ok(Outcome::NotFound);
            }
            if !yes && std::io::stdin().is_terminal() {
                let holder = output::holder_text(&state);
                if !confirm(&format!(
                    "release {} (held by {holder}) by force?",
                    state.key
                ))? {
                    return Err(usage("not released: not confirmed"));
                }
                // The answer may come long after the question: release only what was
                // shown, not a holder that came since.
                let now = locks.inspect(&name).await?;
                if holders(&now) != holders(&state) {
                    eprintln!(
                        "distlock: {} changed holders while you answered; not released (run it again)",
                        state.key
                    );
                    return Ok(Outcome::NotFound);
                }
            }
            let released = locks.force_release(&name).await?;
            if cli.json {
                let doc = serde_json::json!({ "key": state.key, "released": released });
                output::json_line(&mut out, &doc);
            } else if released {
                let _ = writeln!(
                    out,
                    "released {}: its waiters are woken; its holder gets Lost",
                    state.key
                );
            } else {
                let _ = writeln!(out, "{} was no longer held", state.key);
            }
            Ok(found(released))
        }
        Command::Idem {
            command: IdemCommand::Ls { pattern },
        } => {
            let rows = idem_rows(&locks, pattern).await?;
            if cli.json {
                let doc = serde_json::json!({ "records": rows.iter().map(|(_, doc)| doc).collect::<Vec<_>>() });
                output::json_line(&mut out, &doc);
            } else {
                output::records_table(&mut out, &rows, &cli.prefix);
            }
            Ok(found(!rows.is_empty()))
        }
        Command::Idem {
            command: IdemCommand::Show { key },
        } => {
            let (record, why) = match record_key(&locks, &cli, key).await? {
                Resolved::Full(key) => {
                    let record = locks.idem_record(&key).await.map_err(not_a_record)?;
                    (record, format!("no record at {key}"))
                }
                Resolved::One(record) => (Some(*record), String::new()),
                Resolved::None(why) => (None, why),
            };
            if cli.json {
                let doc = record
                    .as_ref()
                    .map_or(serde_json::Value::Null, output::record_json);
                output::json_line(&mut out, &doc);
            } else {
                match &record {
                    Some(record) => output::record(&mut out, record),
                    None => eprintln!("distlock: {why}"),
                }
            }
            Ok(found(record.is_some()))
        }
        Command::Idem {
            command: IdemCommand::Forget { key, yes },
        } => {
            let key = &match record_key(&locks, &cli, key).await? {
                Resolved::Full(key) => key,
                // Found by a suffix: it may be another function's record (`42` ends
                // `refund:order:42`). Said in full and confirmed before it goes.
                Resolved::One(record) if !*yes => {
                    if !std::io::stdin().is_terminal() {
                        return Err(usage(format!(
                            "`{key}` names {}: give the full key, or --yes to forget it; nothing was deleted",
                            record.key
                        )));
                    }
                    if !confirm(&format!("forget {}?", record.key))? {
                        return Err(usage("not forgotten: not confirmed"));
                    }
                    record.key
                }
                Resolved::One(record) => record.key,
                Resolved::None(why) => {
                    if cli.json {
                        let doc = serde_json::json!({ "key": key, "forgotten": false });
                        output::json_line(&mut out, &doc);
                    } else {
                        eprintln!("distlock: {why}");
                    }
                    return Ok(Outcome::NotFound);
                }
            };
            let forgot = locks.forget_idem(key).await.map_err(not_a_record)?;
            if cli.json {
                output::json_line(
                    &mut out,
                    &serde_json::json!({ "key": key, "forgotten": forgot }),
                );
            } else if forgot {
                let _ = writeln!(
                    out,
                    "forgot {key}: the next call under its key runs the body"
                );
            } else {
                eprintln!("distlock: no record at {key}");
            }
            Ok(found(forgot))
        }
        Command::Watch {
            pattern,
            interval_ms,
            count,
        } => {
            drop(out);
            watch(
                &locks,
                &cli,
                pattern,
                Duration::from_millis(*interval_ms),
                *count,
            )
            .await
        }
    }
}

/// What `idem show` and `idem forget` act on.
enum Resolved {
    /// A record's full key, with or without the prefix (there may be no record).
    Full(String),
    /// The one record whose key ends with the key the application wrote.
    One(Box<IdemRecord>),
    /// No record's key ends with it: why, for stderr.
    None(String),
}

/// The record `key` names: a full key (`idem:app::pay:pay:42`, with or without the
/// prefix) as it is; else the key the application wrote (`pay:42`), when exactly one
/// record's key ends with it. None: not found (1, as for a full key without a record);
/// several: they are listed, and the caller is asked for the full key (2). Nothing is
/// deleted here.
async fn record_key(locks: &Locks, cli: &Cli, key: &str) -> Result<Resolved, Failure> {
    let records = format!("{}{}", cli.prefix, lockcore::key::RECORDS);
    if key.starts_with(&records) || key.starts_with(lockcore::key::RECORDS) {
        return Ok(Resolved::Full(key.to_owned()));
    }
    let mut found = std::pin::pin!(locks.idem_records_for(key));
    let mut first = None;
    let mut others = Vec::new();
    while let Some(record) = found.try_next().await? {
        if first.is_none() {
            first = Some(record);
        } else {
            others.push(record.key);
        }
    }
    let Some(first) = first else {
        return Ok(Resolved::None(format!(
            "no idempotency record at {key}, and no record's key ends with `:{key}` (a \
             record's key begins with `{records}`; a lock's does not: look at a lock with \
             `distlock inspect`); nothing was deleted"
        )));
    };
    if others.is_empty() {
        return Ok(Resolved::One(Box::new(first)));
    }
    let mut keys = vec![first.key];
    keys.append(&mut others);
    keys.sort();
    Err(Failure {
        code: 2,
        message: format!(
            "{key} ends {} records' keys: {}; give the full key (nothing was shown or deleted)",
            keys.len(),
            keys.join(", ")
        ),
    })
}

/// `idem ls`: each record matching `pattern` as a row and its JSON, sorted by key. The
/// records come one at a time and only their summary is kept (not a stored result), so
/// memory follows the number of records, not their size.
async fn idem_rows(
    locks: &Locks,
    pattern: &str,
) -> Result<Vec<(output::RecordRow, serde_json::Value)>, Failure> {
    let mut rows = Vec::new();
    let mut records = std::pin::pin!(locks.idem_records(pattern));
    while let Some(record) = records.try_next().await? {
        rows.push((
            output::RecordRow::of(&record),
            output::record_summary_json(&record),
        ));
    }
    rows.sort_by(|a, b| a.0.key.cmp(&b.0.key));
    Ok(rows)
}

fn found(yes: bool) -> Outcome {
    if yes {
        Outcome::Done
    } else {
        Outcome::NotFound
    }
}

/// The held locks matching `pattern`, most contended first, then by key.
async fn listed(locks: &Locks, pattern: &str) -> Result<Vec<LockState>, Failure> {
    let mut states: Vec<LockState> = locks.list(pattern).try_collect().await?;
    states.sort_by(contended_first);
    Ok(states)
}

/// Most contended first, then by key.
fn contended_first(a: &LockState, b: &LockState) -> std::cmp::Ordering {
    output::waiters(b)
        .cmp(&output::waiters(a))
        .then_with(|| a.key.cmp(&b.key))
}

/// Every token that holds `state`'s lock (its holder, permits, readers).
fn holders(state: &LockState) -> Vec<&str> {
    let mut tokens: Vec<&str> = state
        .holder
        .iter()
        .chain(state.permits.iter().map(|s| &s.holder))
        .chain(state.readers.iter().map(|s| &s.holder))
        .map(|h| h.token.as_str())
        .collect();
    tokens.sort_unstable();
    tokens
}

/// Asks `question` on the terminal; `true` for a yes.
fn confirm(question: &str) -> Result<bool, Failure> {
    eprint!("{question} [y/N] ");
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| usage(format!("no answer: {e}")))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// What `distlock leaks` finds.
struct Leaks {
    /// Locks whose key has no ttl: nothing will ever free them.
    no_ttl: Vec<LockState>,
    /// Records in progress whose lease ended.
    stuck: Vec<IdemRecord>,
    /// Locks with a holder on this host whose process is gone (the holder and its pid).
    dead: Vec<(LockState, lockcore::Holder)>,
    /// Fence counters without a ttl (left by an earlier version): the first
    /// [`LASTING_SHOWN`] keys, and how many in all.
    lasting: (Vec<String>, usize),
}

/// How many counters without a ttl `leaks` names (it counts them all): there may be one
/// per name ever fenced.
const LASTING_SHOWN: usize = 20;

impl Leaks {
    fn is_empty(&self) -> bool {
        self.no_ttl.is_empty()
            && self.stuck.is_empty()
            && self.dead.is_empty()
            && self.lasting.1 == 0
    }
}

/// Walks the locks and the records as streams, keeping only what leaks: memory follows
/// the leaks found, not the keyspace (a completed record's stored result is not read).
async fn leaks(locks: &Locks) -> Result<Leaks, Failure> {
    let here = locks
        .holder_id()
        .rsplit_once(':')
        .map_or("", |(host, _)| host)
        .to_owned();
    let procfs = std::path::Path::new(&format!("/proc/{}", std::process::id())).exists();
    let mut leaks = Leaks {
        no_ttl: Vec::new(),
        stuck: Vec::new(),
        dead: Vec::new(),
        lasting: (Vec::new(), 0),
    };
    let mut states = std::pin::pin!(locks.list("*"));
    while let Some(state) = states.try_next().await? {
        // Processes are looked up in /proc: where there is none (not Linux), or it is not
        // this host's (another pid namespace, as in a container), nothing is reported.
        let gone = state
            .holder
            .iter()
            .chain(state.permits.iter().map(|s| &s.holder))
            .chain(state.readers.iter().map(|s| &s.holder))
            .find(|h| {
                procfs
                    && h.host.as_deref() == Some(here.as_str())
                    && h.pid
                        .is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
            })
            .cloned();
        if state.holder.is_some() && state.lease_left.is_none() {
            leaks.no_ttl.push(state.clone());
        }
        if let Some(holder) = gone {
            leaks.dead.push((state, holder));
        }
    }
    leaks.no_ttl.sort_by(contended_first);
    leaks.dead.sort_by(|a, b| contended_first(&a.0, &b.0));
    leaks.stuck = locks.stuck_idem_records("*").try_collect().await?;
    leaks.stuck.sort_by(|a, b| a.key.cmp(&b.key));
    let mut counters = std::pin::pin!(locks.lasting_fence_counters("*"));
    while let Some(counter) = counters.try_next().await? {
        let (shown, all) = &mut leaks.lasting;
        if shown.len() < LASTING_SHOWN {
            shown.push(counter);
        }
        *all += 1;
    }
    leaks.lasting.0.sort();
    Ok(leaks)
}

/// Refreshes the table every `interval` until Ctrl-C (or `count` refreshes). A refresh
/// that fails (Redis restarting, a failover) is shown in place of the table, and the next
/// one is tried after `interval` as ever: a watch outlives an outage.
async fn watch(
    locks: &Locks,
    cli: &Cli,
    pattern: &str,
    interval: Duration,
    count: Option<u64>,
) -> Result<Outcome, Failure> {
    let mut screen = Screen {
        terminal: std::io::stdout().is_terminal(),
        json: cli.json,
        prefix: &cli.prefix,
        pattern,
        interval,
        last: None,
    };
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut refreshes = 0;
    loop {
        let refreshed = tokio::select! {
            states = listed(locks, pattern) => states,
            _ = &mut ctrl_c => return Ok(Outcome::Done),
        };
        let now = output::clock();
        let mut out = std::io::stdout().lock();
        match &refreshed {
            Ok(states) => screen.refresh(&mut out, &now, states),
            Err(failure) => screen.failure(&mut out, &now, failure),
        }
        let _ = out.flush();
        drop(out);
        refreshes += 1;
        if count.is_some_and(|n| refreshes >= n) {
            // The last refresh decides the exit code.
            return refreshed.map(|_| Outcome::Done);
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = &mut ctrl_c => return Ok(Outcome::Done),
        }
    }
}

/// What `watch` shows, and the last table it could read (kept on a terminal while
/// refreshes fail).
struct Screen<'a> {
    terminal: bool,
    json: bool,
    prefix: &'a str,
    pattern: &'a str,
    interval: Duration,
    last: Option<(String, Vec<LockState>)>,
}

impl Screen<'_> {
    fn refresh(&mut self, out: &mut impl Write, now: &str, states: &[LockState]) {
        if self.json {
            let doc = serde_json::json!({ "at": now, "locks": output::locks_json(states, self.prefix)["locks"] });
            output::json_line(out, &doc);
        } else if self.terminal {
            // Home and clear, then the table: the screen shows one refresh at a time.
            let _ = write!(out, "\x1b[H\x1b[2J");
            let _ = writeln!(
                out,
                "distlock watch {}  {now}  {} held  (Ctrl-C to stop)",
                self.pattern,
                states.len()
            );
            output::table(out, states, self.prefix);
            self.last = Some((now.to_owned(), states.to_vec()));
        } else {
            let _ = writeln!(out, "-- {now} {} held", states.len());
            output::table(out, states, self.prefix);
        }
    }

    fn failure(&mut self, out: &mut impl Write, now: &str, failure: &Failure) {
        let error = failure.message.replace('\n', " ");
        let every = self.interval.as_secs_f64();
        if self.json {
            output::json_line(out, &serde_json::json!({ "at": now, "error": error }));
        } else if self.terminal {
            let _ = write!(out, "\x1b[H\x1b[2J");
            let _ = writeln!(
                out,
                "distlock watch {}  {now}  error: {error}\nretrying every {every}s  (Ctrl-C to stop)",
                self.pattern,
            );
            if let Some((at, states)) = &self.last {
                let _ = writeln!(out, "\nas of {at}, the last refresh that could read:");
                output::table(out, states, self.prefix);
            }
        } else {
            let _ = writeln!(out, "-- {now} error: {error} (retrying every {every}s)");
        }
    }
}
