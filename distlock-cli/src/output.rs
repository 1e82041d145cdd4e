//! Tables for people and JSON for scripts.
//!
//! The JSON documents (stable field names; times in ms; absent values `null`):
//!
//! - a lock (`inspect`, and each of `ls`'s `"locks"`): `key`, `name` (the key without
//!   the prefix), `kind` (`"lock"`, `"write"`, `"read"`, `"semaphore"`), `held` (how
//!   many hold it: 1, the readers, the permits), `limit` (a semaphore's permit count, as
//!   the latest acquire that took a permit wrote it; else `null`), `holder` (`token`,
//!   `uuid`, `id`, `host`, `pid`), `lease_left_ms` (a read lock's: its longest
//!   reader's), `fence` (the last given, 0 before any),
//!   `waiters` (listening clients; at least 1 for a waiter's mark or a waiting writer),
//!   `marked_waiting`, `listening`, `permits` and `readers` (each `holder` and
//!   `lease_left_ms`), `writer_waiting` (a holder), `yielded_to` (client ids);
//! - `ls`: `{"locks": [..]}`, most contended first; `watch --json`: one such line per
//!   refresh, with `"at"`, or `{"at", "error"}` for a refresh that failed;
//! - `leaks`: `{"no_ttl": [lock], "stuck_records": [record], "dead_holders": [{"lock":
//!   lock, "holder": holder}], "lasting_fence_counters": {"keys": [the first 20 keys],
//!   "count": n}}`;
//! - a record (`idem show`): `key`, `state` (`"in_progress"`, `"completed"`,
//!   `"unreadable"`), `owner` (a holder), `lease_left_ms`, `expires_in_ms`,
//!   `claimed_at_ms`, `completed_at_ms`, `fingerprint`, `status` (a stored response's),
//!   `stored` (the stored result, as JSON), `stuck`;
//! - `idem ls`: `{"records": [record]}` sorted by key, each record without `stored`;
//! - `release --force`: `{"key", "released"}`; `idem forget`: `{"key", "forgotten"}`.

use std::io::Write;
use std::time::Duration;

use lockcore::idempotency::{IdemRecord, RecordState};
use lockcore::key::Kind;
use lockcore::{Holder, LockState, Share};
use serde_json::{Value, json};

/// How contended a lock is: its listening clients, or at least one for a waiter's mark
/// or a waiting writer (a writer that waits listens too: it is not counted twice).
pub(crate) fn waiters(state: &LockState) -> u64 {
    let marked = state.marked_waiting || state.writer_waiting.is_some();
    state.listening.max(u64::from(marked))
}

fn kind(state: &LockState) -> &'static str {
    match state.kind {
        Kind::Semaphore => "semaphore",
        Kind::ReadLock => "read",
        Kind::WriteLock => "write",
        _ => "lock",
    }
}

/// How many hold a lock: `1`, the readers, or a semaphore's permits over its limit
/// (`2/4`; `2/?` where no limit is stored, as a semaphore taken by an older version).
fn held_text(state: &LockState) -> String {
    match state.kind {
        Kind::Semaphore => match state.permit_limit {
            Some(limit) => format!("{}/{limit}", state.permits.len()),
            None => format!("{}/?", state.permits.len()),
        },
        Kind::ReadLock => state.readers.len().to_string(),
        _ => u8::from(state.holder.is_some()).to_string(),
    }
}

fn held_count(state: &LockState) -> usize {
    match state.kind {
        Kind::Semaphore => state.permits.len(),
        Kind::ReadLock => state.readers.len(),
        _ => usize::from(state.holder.is_some()),
    }
}

fn ms(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| {
        json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    })
}

fn holder_json(h: &Holder) -> Value {
    json!({ "token": h.token, "uuid": h.uuid, "id": h.id, "host": h.host, "pid": h.pid })
}

fn shares_json(shares: &[Share]) -> Value {
    shares
        .iter()
        .map(|s| json!({ "holder": holder_json(&s.holder), "lease_left_ms": ms(Some(s.lease_left)) }))
        .collect()
}

pub(crate) fn lock_json(state: &LockState, prefix: &str) -> Value {
    json!({
        "key": state.key,
        "name": state.key.strip_prefix(prefix).unwrap_or(&state.key),
        "kind": kind(state),
        "held": held_count(state),
        "limit": state.permit_limit,
        "holder": state.holder.as_ref().map(holder_json),
        "lease_left_ms": ms(state.lease_left),
        "fence": state.last_fence,
        "waiters": waiters(state),
        "marked_waiting": state.marked_waiting,
        "listening": state.listening,
        "permits": shares_json(&state.permits),
        "readers": shares_json(&state.readers),
        "writer_waiting": state.writer_waiting.as_ref().map(holder_json),
        "yielded_to": state.yielded_to,
    })
}

pub(crate) fn locks_json(states: &[LockState], prefix: &str) -> Value {
    json!({ "locks": states.iter().map(|s| lock_json(s, prefix)).collect::<Vec<_>>() })
}

pub(crate) fn record_json(r: &IdemRecord) -> Value {
    let state = match r.state {
        RecordState::InProgress => "in_progress",
        RecordState::Completed => "completed",
        _ => "unreadable",
    };
    let stored = r
        .stored
        .as_deref()
        .and_then(|s| serde_json::from_str::<Value>(s).ok());
    json!({
        "key": r.key,
        "state": state,
        "owner": r.owner.as_ref().map(holder_json),
        "lease_left_ms": ms(r.lease_left),
        "expires_in_ms": ms(r.expires_in),
        "claimed_at_ms": r.claimed_at_ms,
        "completed_at_ms": r.completed_at_ms,
        "fingerprint": r.fingerprint,
        "status": r.status,
        "stored": stored,
        "stuck": r.is_stuck(),
    })
}

/// A record in `idem ls --json`: [`record_json`] without the stored result.
pub(crate) fn record_summary_json(r: &IdemRecord) -> Value {
    let mut doc = record_json(r);
    if let Some(fields) = doc.as_object_mut() {
        fields.remove("stored");
    }
    doc
}

/// One line of `idem ls`: what it shows of a record (no stored result).
pub(crate) struct RecordRow {
    pub(crate) key: String,
    state: &'static str,
    lease: String,
    expires: String,
    owner: String,
}

impl RecordRow {
    pub(crate) fn of(r: &IdemRecord) -> RecordRow {
        let state = match r.state {
            RecordState::InProgress if r.is_stuck() => "stuck",
            RecordState::InProgress => "in-progress",
            RecordState::Completed => "completed",
            _ => "unreadable",
        };
        RecordRow {
            key: r.key.clone(),
            state,
            lease: match r.state {
                RecordState::InProgress => lease_text(r.lease_left),
                _ => "-".to_owned(),
            },
            expires: lease_text(r.expires_in),
            owner: r.owner.as_ref().map_or_else(|| "-".to_owned(), who),
        }
    }
}

/// `idem ls`: one line per record.
pub(crate) fn records_table<T>(out: &mut impl Write, rows: &[(RecordRow, T)], prefix: &str) {
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|(r, _)| {
            [
                r.key.strip_prefix(prefix).unwrap_or(&r.key).to_owned(),
                r.state.to_owned(),
                r.lease.clone(),
                r.expires.clone(),
                r.owner.clone(),
            ]
        })
        .collect();
    aligned(
        out,
        ["KEY", "STATE", "LEASE", "EXPIRES IN", "OWNER"],
        &cells,
        &[false, false, true, true, false],
    );
}

/// A table: the head, then each row, columns as wide as their widest cell, each
/// right-aligned where `right` says.
fn aligned<const N: usize>(
    out: &mut impl Write,
    head: [&str; N],
    rows: &[[String; N]],
    right: &[bool; N],
) {
    let mut widths = head.map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: [&str; N]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            let pad = " ".repeat(widths[i] - cell.chars().count());
            if right[i] {
                text.push_str(&pad);
                text.push_str(cell);
            } else {
                text.push_str(cell);
                if i + 1 < N {
                    text.push_str(&pad);
                }
            }
        }
        let _ = writeln!(out, "{text}");
    };
    line(head);
    for row in rows {
        line(row.each_ref().map(String::as_str));
    }
}

pub(crate) fn json_line(out: &mut impl Write, doc: &Value) {
    let _ = writeln!(out, "{doc}");
}

fn who(h: &Holder) -> String {
    match (&h.host, h.pid) {
        (Some(host), Some(pid)) => format!("{host}:{pid}"),
        _ => h.id.clone(),
    }
}

/// Who holds a lock, in a table's cell.
pub(crate) fn holder_text(state: &LockState) -> String {
    if let Some(h) = &state.holder {
        return who(h);
    }
    let shares = if state.permits.is_empty() {
        &state.readers
    } else {
        &state.permits
    };
    match shares.as_slice() {
        [] if !state.yielded_to.is_empty() => format!("(left to {})", state.yielded_to.join(" ")),
        [] => "-".to_owned(),
        [one] => who(&one.holder),
        [one, rest @ ..] => format!("{} +{}", who(&one.holder), rest.len()),
    }
}

fn lease_text(d: Option<Duration>) -> String {
    match d {
        None => "no ttl".to_owned(),
        Some(d) if d >= Duration::from_secs(100) => format!("{}s", d.as_secs()),
        Some(d) => format!("{:.1}s", d.as_secs_f64()),
    }
}

/// `ls` and `watch`: one line per lock.
pub(crate) fn table(out: &mut impl Write, states: &[LockState], prefix: &str) {
    let rows: Vec<[String; 7]> = states
        .iter()
        .map(|s| {
            [
                s.key.strip_prefix(prefix).unwrap_or(&s.key).to_owned(),
                kind(s).to_owned(),
                held_text(s),
                holder_text(s),
                lease_text(s.lease_left),
                s.last_fence.to_string(),
                waiters(s).to_string(),
            ]
        })
        .collect();
    aligned(
        out,
        ["KEY", "KIND", "HELD", "HOLDER", "LEASE", "FENCE", "WAITERS"],
        &rows,
        &[false, false, true, false, true, true, true],
    );
}

/// `inspect`: every field of one lock.
pub(crate) fn details(out: &mut impl Write, s: &LockState) {
    let _ = writeln!(out, "key:        {}", s.key);
    let _ = writeln!(out, "kind:       {}", kind(s));
    match s.kind {
        Kind::Semaphore => {
            let limit = s
                .permit_limit
                .map_or_else(|| "?".to_owned(), |l| l.to_string());
            let _ = writeln!(out, "held:       {}/{limit} permits", s.permits.len());
        }
        Kind::ReadLock => {
            let _ = writeln!(out, "held:       {} readers", s.readers.len());
        }
        _ => {}
    }
    if let Some(h) = &s.holder {
        let _ = writeln!(out, "holder:     {} (token {})", who(h), h.token);
    }
    let _ = writeln!(out, "lease left: {}", lease_text(s.lease_left));
    let _ = writeln!(out, "last fence: {}", s.last_fence);
    let _ = writeln!(
        out,
        "waiters:    {} listening{}",
        s.listening,
        if s.marked_waiting {
            ", marked waiting"
        } else {
            ""
        }
    );
    for (what, shares) in [("permit", &s.permits), ("reader", &s.readers)] {
        for share in shares {
            let _ = writeln!(
                out,
                "{what}:     {} lease left {} (token {})",
                who(&share.holder),
                lease_text(Some(share.lease_left)),
                share.holder.token
            );
        }
    }
    if let Some(w) = &s.writer_waiting {
        let _ = writeln!(out, "writer waiting: {}", who(w));
    }
    if !s.yielded_to.is_empty() {
        let _ = writeln!(out, "left to:    {}", s.yielded_to.join(" "));
    }
}

/// `idem show`: one record.
pub(crate) fn record(out: &mut impl Write, r: &IdemRecord) {
    let state = match r.state {
        RecordState::InProgress if r.is_stuck() => "in progress, lease ended (stuck)",
        RecordState::InProgress => "in progress",
        RecordState::Completed => "completed",
        _ => "unreadable",
    };
    let _ = writeln!(out, "key:        {}", r.key);
    let _ = writeln!(out, "state:      {state}");
    if let Some(owner) = &r.owner {
        let _ = writeln!(out, "owner:      {} (token {})", who(owner), owner.token);
    }
    if r.state == RecordState::InProgress {
        let _ = writeln!(out, "lease left: {}", lease_text(r.lease_left));
    }
    let _ = writeln!(out, "expires in: {}", lease_text(r.expires_in));
    if let Some(fp) = &r.fingerprint {
        let _ = writeln!(out, "fingerprint: {fp}");
    }
    if let Some(status) = r.status {
        let _ = writeln!(out, "status:     {status}");
    }
    if let Some(stored) = &r.stored {
        let _ = writeln!(out, "stored:     {stored}");
    }
    if r.state == RecordState::Unreadable {
        let _ = writeln!(out, "raw:        {}", r.raw);
    }
}

/// The wall clock, `HH:MM:SS` UTC, for `watch`'s header.
pub(crate) fn clock() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "{:02}:{:02}:{:02}Z",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    )
}

impl super::Leaks {
    pub(crate) fn json(&self, prefix: &str) -> Value {
        json!({
            "no_ttl": self.no_ttl.iter().map(|s| lock_json(s, prefix)).collect::<Vec<_>>(),
            "stuck_records": self.stuck.iter().map(record_json).collect::<Vec<_>>(),
            "dead_holders": self
                .dead
                .iter()
                .map(|(s, h)| json!({ "lock": lock_json(s, prefix), "holder": holder_json(h) }))
                .collect::<Vec<_>>(),
            "lasting_fence_counters": {
                "keys": self.lasting.0,
                "count": self.lasting.1,
            },
        })
    }

    pub(crate) fn print(&self, out: &mut impl Write) {
        if self.is_empty() {
            let _ = writeln!(out, "no leaks");
            return;
        }
        for s in &self.no_ttl {
            let _ = writeln!(
                out,
                "no ttl       {}  held by {}: nothing will free it",
                s.key,
                holder_text(s)
            );
        }
        for r in &self.stuck {
            let owner = r.owner.as_ref().map_or_else(|| "nobody".to_owned(), who);
            let _ = writeln!(
                out,
                "stuck record {}  claimed by {owner}, lease ended: the next call takes it over",
                r.key
            );
        }
        for (s, h) in &self.dead {
            let _ = writeln!(
                out,
                "dead holder  {}  held by {}: no such process here; lease left {}",
                s.key,
                who(h),
                lease_text(s.lease_left)
            );
        }
        let (shown, all) = &self.lasting;
        for key in shown {
            let _ = writeln!(
                out,
                "no ttl fence {key}: a counter an earlier version left; give it a ttl (PEXPIRE <key> 86400000 NX), or its name's next fence will"
            );
        }
        if *all > shown.len() {
            let _ = writeln!(
                out,
                "no ttl fence ... and {} more such counters ({all} in all)",
                all - shown.len()
            );
        }
    }
}
