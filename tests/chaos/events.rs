//! The shared event log: one line per event, appended by every process with `O_APPEND`
//! in a single `write`, so the order of lines is the real order of the writes.
//!
//! A line is `<unix micros> <kind> key=value ...` (values never contain spaces).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock microseconds (the one clock all processes on this machine share).
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Wall-clock milliseconds.
pub(crate) fn now_ms() -> u64 {
    now_us() / 1000
}

/// The writing side, shared by all tasks and threads of a process.
pub(crate) struct EventLog {
    file: File,
}

impl EventLog {
    pub(crate) fn open(path: &Path) -> EventLog {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("cannot open the event log {}: {e}", path.display()));
        EventLog { file }
    }

    /// Appends `<now> <kind> <fields>` as one write.
    pub(crate) fn emit(&self, kind: &str, fields: std::fmt::Arguments<'_>) {
        let line = format!("{} {kind} {fields}\n", now_us());
        // One write(2) of a short line on a file opened with O_APPEND: atomic.
        if let Err(e) = (&self.file).write_all(line.as_bytes()) {
            eprintln!("chaos: cannot write the event log: {e}");
        }
    }
}

/// One parsed line.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    /// Position in the file.
    pub(crate) idx: usize,
    pub(crate) ts: u64,
    pub(crate) kind: String,
    fields: HashMap<String, String>,
    pub(crate) line: String,
}

impl Event {
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    /// A field that must be there.
    pub(crate) fn str(&self, name: &str) -> &str {
        self.get(name)
            .unwrap_or_else(|| panic!("event without `{name}`: {}", self.line))
    }

    /// A numeric field; `None` when absent or `-`.
    pub(crate) fn num(&self, name: &str) -> Option<u64> {
        self.get(name).and_then(|v| v.parse().ok())
    }
}

/// Reads the whole log.
pub(crate) fn read(path: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read the event log {}: {e}", path.display()));
    text.lines()
        .enumerate()
        .filter_map(|(idx, line)| {
            let mut words = line.split(' ');
            let ts = words.next()?.parse().ok()?;
            let kind = words.next()?.to_owned();
            let fields = words
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            Some(Event {
                idx,
                ts,
                kind,
                fields,
                line: line.to_owned(),
            })
        })
        .collect()
}
