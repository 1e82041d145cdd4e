//! Redlock: one lock over N independent Redis masters (N odd, usually 5), each a
//! [`RedisBackend`] of its own.
//!
//! - Acquire: `SET key token NX PX ttl` on every master at once, each bounded by the
//!   command timeout (the per-node timeout). Taken when a quorum (N/2+1) set it and
//!   validity is left: `ttl - elapsed - drift`, drift being `ttl / 100 + 2 ms`. Otherwise
//!   the token is deleted on every master (also where the `SET` timed out) and the try
//!   is busy, or a `Backend` error when too many masters failed to answer for a quorum to
//!   be possible. Waiters retry after a random delay (there is no Pub/Sub across
//!   independent masters).
//! - Release: compare-and-delete on every master. Released when a quorum held the token;
//!   lost when a quorum did not; otherwise a `Backend` error (it cannot be told).
//! - Renewal: compare-and-extend on every master; renewed when a quorum extended it,
//!   lost when a quorum refused, otherwise failed (retried until the lease ends).
//! - Fences: none. N counters on N masters cannot give a number that always grows (a
//!   master that restarts forgets its counter), so `fence()` is an error that says so.
//!   Idempotency records and `replicas = n` are refused likewise: they need one Redis,
//!   Sentinel or a cluster.

use std::time::{Duration, Instant};

use futures_util::future::join_all;

use super::redis::RedisBackend;
use super::{Attempt, ReleaseCall, Released, Try, millis};
use crate::error::{BackendError, BackendErrorKind};

pub(crate) struct RedlockBackend {
    nodes: Vec<RedisBackend>,
}

/// What the masters said to one call: yes, no, or no answer.
struct Votes {
    yes: usize,
    no: usize,
    error: Option<BackendError>,
}

impl Votes {
    fn count(replies: Vec<Result<bool, BackendError>>) -> Votes {
        let mut votes = Votes {
            yes: 0,
            no: 0,
            error: None,
        };
        for reply in replies {
            match reply {
                Ok(true) => votes.yes += 1,
                Ok(false) => votes.no += 1,
                Err(e) => votes.error = Some(e),
            }
        }
        votes
    }
}

impl RedlockBackend {
    pub(crate) fn new(nodes: Vec<RedisBackend>) -> RedlockBackend {
        RedlockBackend { nodes }
    }

    fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The error of a call a quorum could not answer.
    fn no_quorum(&self, votes: &Votes) -> BackendError {
        let detail = format!(
            "no quorum of {} of {} Redlock masters answered{}",
            self.quorum(),
            self.nodes.len(),
            votes
                .error
                .as_ref()
                .map_or(String::new(), |e| format!(" (last error: {e})"))
        );
        let kind = votes
            .error
            .as_ref()
            .map_or(BackendErrorKind::Connection, BackendError::kind);
        BackendError::new(kind, detail)
    }

    pub(crate) async fn try_acquire(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        _attempt: Attempt,
    ) -> Result<Try, BackendError> {
        let started = Instant::now();
        let replies = join_all(self.nodes.iter().map(|node| async move {
            let mut set = redis::cmd("SET");
            set.arg(key).arg(token).arg("NX").arg("PX").arg(millis(ttl));
            node.query::<Option<String>>(&set)
                .await
                .map(|r| r.is_some())
        }))
        .await;
        let votes = Votes::count(replies);
        let drift = ttl / 100 + Duration::from_millis(2);
        let valid = ttl
            .checked_sub(started.elapsed() + drift)
            .is_some_and(|left| !left.is_zero());
        if votes.yes >= self.quorum() && valid {
            return Ok(Try::Taken);
        }
        // Not taken: the token goes, wherever it may have landed.
        if votes.yes > 0 || votes.error.is_some() {
            self.delete_everywhere(key, token).await;
        }
        if votes.no + votes.yes < self.quorum() {
            return Err(self.no_quorum(&votes));
        }
        // Held elsewhere: try again after a random delay, so that competing clients
        // do not split the masters again and again.
        Ok(Try::Busy(Some(Duration::from_millis(fastrand::u64(
            5..=50,
        )))))
    }

    /// Compare-and-delete on every master: whether each held the token.
    async fn delete_everywhere(&self, key: &str, token: &str) -> Vec<Result<bool, BackendError>> {
        join_all(self.nodes.iter().map(|node| async move {
            node.release(&plain_release(key, token))
                .await
                .map(|r| r == Released::Now)
        }))
        .await
    }

    pub(crate) async fn release(&self, call: &ReleaseCall<'_>) -> Result<Released, BackendError> {
        let votes = Votes::count(self.delete_everywhere(call.key, call.token).await);
        if votes.yes >= self.quorum() {
            Ok(Released::Now)
        } else if votes.no >= self.quorum() || votes.error.is_none() {
            Ok(Released::NotOurs)
        } else {
            Err(self.no_quorum(&votes))
        }
    }

    pub(crate) async fn extend_many(
        &self,
        leases: &[(&str, &str, Duration)],
    ) -> Result<Vec<bool>, BackendError> {
        let per_node = join_all(self.nodes.iter().map(|node| node.extend_many(leases))).await;
        let mut out = Vec::with_capacity(leases.len());
        for i in 0..leases.len() {
            let votes = Votes::count(
                per_node
                    .iter()
                    .map(|r| match r {
                        Ok(extended) => Ok(extended.get(i).copied().unwrap_or(false)),
                        Err(e) => Err(e.clone()),
                    })
                    .collect(),
            );
            if votes.yes >= self.quorum() {
                out.push(true);
            } else if votes.no >= self.quorum() || votes.error.is_none() {
                out.push(false);
            } else {
                return Err(self.no_quorum(&votes));
            }
        }
        Ok(out)
    }

    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        let replies = join_all(
            self.nodes
                .iter()
                .map(|node| async move { node.ping().await.map(|()| true) }),
        )
        .await;
        let votes = Votes::count(replies);
        if votes.yes >= self.quorum() {
            Ok(())
        } else {
            Err(self.no_quorum(&votes))
        }
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.nodes
            .first()
            .map_or(Duration::ZERO, RedisBackend::timeout)
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.nodes.iter().map(RedisBackend::epoch).sum()
    }
}

/// What Redlock does not give, as the error of the call that asked for it.
pub(crate) fn unsupported(what: &str) -> BackendError {
    BackendError::new(
        BackendErrorKind::Config,
        format!(
            "{what} over Redlock: independent masters cannot give it safely; use one Redis, \
             Sentinel or a cluster"
        ),
    )
}

/// A release that hands to nobody and yields to nobody: a compare-and-delete.
fn plain_release<'a>(key: &'a str, token: &'a str) -> ReleaseCall<'a> {
    ReleaseCall {
        key,
        token,
        successor: None,
        contended: false,
        yield_to: None,
        self_subscribed: &|_| false,
    }
}
