//! Native conditional commands, where the server has them: Redis 8.4+ `SET ... IFEQ` and
//! `DELEX key IFEQ value`, Valkey 8.1+ `SET ... IFEQ` and 9.0+ `DELIFEQ key value`.
//! Detected once per connection from `INFO server` (from `HELLO` where an ACL refuses
//! `INFO`); the Lua scripts stay the fallback
//! (and the only path on older servers).
//!
//! Where they fit: the renewal (`SET key token IFEQ token PX ttl` is a compare-and-extend
//! without a script), the clean-up of a try whose reply was lost (a compare-and-delete
//! that wakes nobody), and the store of an idempotency result (one `SET ... IFEQ` of the
//! claim's record followed by the result, against the claim's exact record), and the
//! uncontended release (a compare-and-delete; the guard knows of no waiter). A value a
//! waiter marked (`<token> waiting`) does not match them: the scripts then decide (the
//! release's `release.lua` wakes the waiters, or finds the lock lost).

use std::time::Duration;

use super::millis;

/// The conditional commands one server has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Native {
    /// `SET key value IFEQ current`.
    pub(crate) set_ifeq: bool,
    /// A native compare-and-delete, if any.
    pub(crate) del_ifeq: Option<DelIfEq>,
}

/// The spelling of a native compare-and-delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DelIfEq {
    /// Redis 8.4+: `DELEX key IFEQ value`.
    Delex,
    /// Valkey 9.0+: `DELIFEQ key value`.
    DelIfEq,
}

impl Native {
    /// What the server that answered `INFO server` with `info` has.
    pub(crate) fn from_info(info: &str) -> Native {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.trim_end().strip_prefix(name)?.strip_prefix(':'))
        };
        // Valkey reports a `redis_version` of 7.2.4 for compatibility, and its own
        // version apart.
        if let Some(valkey) = field("valkey_version") {
            let v = version(valkey);
            return Native {
                set_ifeq: v >= (8, 1),
                del_ifeq: (v >= (9, 0)).then_some(DelIfEq::DelIfEq),
            };
        }
        if field("server_name") == Some("valkey") {
            return Native::default();
        }
        let v = field("redis_version").map_or((0, 0), version);
        let has = v >= (8, 4);
        Native {
            set_ifeq: has,
            del_ifeq: has.then_some(DelIfEq::Delex),
        }
    }

    /// What the server that answered `HELLO` (no arguments) with `reply` has: its
    /// `server` (`redis`, `valkey`) and `version` fields, for a user not allowed `INFO`.
    pub(crate) fn from_hello(reply: &redis::Value) -> Native {
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            redis::Value::SimpleString(s) | redis::Value::VerbatimString { text: s, .. } => {
                Some(s.clone())
            }
            _ => None,
        };
        let pairs: Vec<(String, String)> = match reply {
            redis::Value::Array(items) => items
                .chunks(2)
                .filter_map(|kv| Some((text(kv.first()?)?, text(kv.get(1)?)?)))
                .collect(),
            redis::Value::Map(items) => items
                .iter()
                .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
                .collect(),
            _ => return Native::default(),
        };
        let field = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let version = field("version").unwrap_or("0.0");
        let info = match field("server") {
            Some("valkey") => format!("valkey_version:{version}"),
            _ => format!("redis_version:{version}"),
        };
        Native::from_info(&info)
    }

    /// A native compare-and-extend of `key` holding `token`, if the server has one:
    /// replies `OK` when extended, nil when the key is gone or holds another value.
    pub(crate) fn extend(&self, key: &str, token: &str, ttl: Duration) -> Option<redis::Cmd> {
        if !self.set_ifeq {
            return None;
        }
        let mut cmd = redis::cmd("SET");
        cmd.arg(key)
            .arg(token)
            .arg("IFEQ")
            .arg(token)
            .arg("PX")
            .arg(millis(ttl));
        Some(cmd)
    }

    /// A native store of an idempotency result, if the server has `SET ... IFEQ`: `SET key
    /// <written><record> IFEQ <written> KEEPTTL`, where `written` is the exact in-progress
    /// record the claim wrote; replies `OK` when stored, nil when the key holds anything
    /// else (the plain commands and `idem_settle.lua` then decide).
    pub(crate) fn store(&self, key: &str, written: &str, record: &str) -> Option<redis::Cmd> {
        if !self.set_ifeq {
            return None;
        }
        let mut value = String::with_capacity(written.len() + record.len());
        value.push_str(written);
        value.push_str(record);
        let mut cmd = redis::cmd("SET");
        cmd.arg(key)
            .arg(value)
            .arg("IFEQ")
            .arg(written)
            .arg("KEEPTTL");
        Some(cmd)
    }

    /// A native compare-and-delete of `key` holding `token`, if the server has one:
    /// replies 1 when deleted, 0 otherwise.
    pub(crate) fn delete(&self, key: &str, token: &str) -> Option<redis::Cmd> {
        let cmd = match self.del_ifeq? {
            DelIfEq::Delex => {
                let mut cmd = redis::cmd("DELEX");
                cmd.arg(key).arg("IFEQ").arg(token);
                cmd
            }
            DelIfEq::DelIfEq => {
                let mut cmd = redis::cmd("DELIFEQ");
                cmd.arg(key).arg(token);
                cmd
            }
        };
        Some(cmd)
    }
}

/// The `run_id` in an `INFO server` reply: a new one means the server restarted (or
/// another server answers, after a failover).
pub(crate) fn run_id(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|line| line.trim_end().strip_prefix("run_id:"))
        .filter(|id| !id.is_empty())
}

/// `major.minor` of a version string (`8.4.0` → (8, 4)); unreadable parts count as 0.
fn version(text: &str) -> (u32, u32) {
    let mut parts = text.trim().split('.').map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(lines: &[&str]) -> String {
        let mut text = String::from("# Server\r\n");
        for line in lines {
            text.push_str(line);
            text.push_str("\r\n");
        }
        text
    }

    fn words(cmd: Option<redis::Cmd>) -> Vec<String> {
        cmd.map(|c| {
            c.args_iter()
                .map(|a| match a {
                    redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => "<other>".into(),
                })
                .collect()
        })
        .unwrap_or_default()
    }

    #[test]
    fn detects_each_server() {
        let redis7 = Native::from_info(&info(&["redis_version:7.0.15", "redis_mode:standalone"]));
        assert_eq!(redis7, Native::default(), "Redis 7.0: scripts only");
        let redis82 = Native::from_info(&info(&["redis_version:8.2.1"]));
        assert_eq!(redis82, Native::default(), "Redis 8.2: scripts only");
        let redis84 = Native::from_info(&info(&["redis_version:8.4.0"]));
        assert!(redis84.set_ifeq);
        assert_eq!(redis84.del_ifeq, Some(DelIfEq::Delex));
        let redis10 = Native::from_info(&info(&["redis_version:10.0.0"]));
        assert_eq!(redis10, redis84);
        let valkey80 = Native::from_info(&info(&[
            "redis_version:7.2.4",
            "server_name:valkey",
            "valkey_version:8.0.2",
        ]));
        assert_eq!(valkey80, Native::default(), "Valkey 8.0: scripts only");
        let valkey81 = Native::from_info(&info(&[
            "redis_version:7.2.4",
            "server_name:valkey",
            "valkey_version:8.1.1",
        ]));
        assert!(valkey81.set_ifeq);
        assert_eq!(valkey81.del_ifeq, None, "DELIFEQ came in Valkey 9.0");
        let valkey9 = Native::from_info(&info(&[
            "redis_version:7.2.4",
            "server_name:valkey",
            "valkey_version:9.0.0",
        ]));
        assert!(valkey9.set_ifeq);
        assert_eq!(valkey9.del_ifeq, Some(DelIfEq::DelIfEq));
        // A Valkey without its version line is not mistaken for a Redis 7.2.
        let valkey_unknown =
            Native::from_info(&info(&["redis_version:9.9.9", "server_name:valkey"]));
        assert_eq!(valkey_unknown, Native::default());
        assert_eq!(Native::from_info(""), Native::default());
    }

    #[test]
    fn reads_hello_when_info_is_refused() {
        let hello = |server: &str, version: &str| {
            let bulk = |s: &str| redis::Value::BulkString(s.as_bytes().to_vec());
            redis::Value::Array(vec![
                bulk("server"),
                bulk(server),
                bulk("version"),
                bulk(version),
                bulk("proto"),
                redis::Value::Int(2),
            ])
        };
        let valkey = Native::from_hello(&hello("valkey", "9.1.2"));
        assert!(valkey.set_ifeq && valkey.del_ifeq == Some(DelIfEq::DelIfEq));
        let redis = Native::from_hello(&hello("redis", "8.4.0"));
        assert!(redis.set_ifeq && redis.del_ifeq == Some(DelIfEq::Delex));
        assert_eq!(
            Native::from_hello(&hello("redis", "7.0.15")),
            Native::default()
        );
        assert_eq!(Native::from_hello(&redis::Value::Nil), Native::default());
    }

    #[test]
    fn reads_the_run_id() {
        let text = info(&["redis_version:7.0.15", "run_id:4f1c2d", "tcp_port:6379"]);
        assert_eq!(run_id(&text), Some("4f1c2d"));
        assert_eq!(run_id("redis_version:7.0.15\r\n"), None);
    }

    #[test]
    fn chooses_the_native_command_or_the_script() {
        let ttl = Duration::from_millis(1500);
        assert!(Native::default().extend("k", "t", ttl).is_none());
        assert!(Native::default().delete("k", "t").is_none());
        assert!(Native::default().store("k", "w", "r").is_none());
        let redis84 = Native::from_info("redis_version:8.4.0\r\n");
        assert_eq!(
            words(redis84.extend("k", "t", ttl)),
            ["SET", "k", "t", "IFEQ", "t", "PX", "1500"]
        );
        assert_eq!(words(redis84.delete("k", "t")), ["DELEX", "k", "IFEQ", "t"]);
        assert_eq!(
            words(redis84.store("k", "claimed", "done")),
            ["SET", "k", "claimeddone", "IFEQ", "claimed", "KEEPTTL"]
        );
        let valkey9 = Native::from_info("server_name:valkey\r\nvalkey_version:9.0.0\r\n");
        assert_eq!(words(valkey9.delete("k", "t")), ["DELIFEQ", "k", "t"]);
        let valkey81 = Native::from_info("server_name:valkey\r\nvalkey_version:8.1.0\r\n");
        assert!(valkey81.delete("k", "t").is_none());
        assert_eq!(words(valkey81.extend("k", "t", ttl))[3], "IFEQ");
    }
}
