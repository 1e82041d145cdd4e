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
//! - Idempotency records: each step runs on every master, as on one Redis, and counts
//!   like a lock (see [`RedlockBackend::idem_claim`]): a claim is the caller's when a
//!   quorum gave it, and given back everywhere otherwise; a stored result counts once a
//!   quorum stored it, so any later quorum of claims meets it; a renewal needs a quorum.
//!   A lock try or a claim that a quorum did not give is tried again with a new token
//!   (owner), so a give-back that reaches a master late removes nothing of the next.
//! - Fences: none. N counters on N masters cannot give a number that always grows (a
//!   master that restarts forgets its counter), so `fence()` is an error that says so.
//!   `replicas = n` is refused likewise: it needs one Redis, Sentinel or a cluster.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;

use super::idem::{ClaimArgs, Claimed, Records};
use super::redis::RedisBackend;
use super::{Attempt, Locking, ReleaseCall, Released, Try, millis};
use crate::error::{BackendError, BackendErrorKind};

pub(crate) struct RedlockBackend {
    nodes: Vec<Arc<RedisBackend>>,
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
                Err(e) => keep_error(&mut votes.error, e),
            }
        }
        votes
    }
}

/// Keeps `e` as the error to report unless a transient one is kept already: a timeout or
/// a broken connection may have left a write behind, which the caller then gives back
/// (and answers with `Retry-After`); a master's refusal next to it must not hide that.
fn keep_error(kept: &mut Option<BackendError>, e: BackendError) {
    if !kept.as_ref().is_some_and(BackendError::is_transient) {
        *kept = Some(e);
    }
}

impl RedlockBackend {
    pub(crate) fn new(nodes: Vec<RedisBackend>) -> RedlockBackend {
        RedlockBackend {
            nodes: nodes.into_iter().map(Arc::new).collect(),
        }
    }

    fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// `call` on every master at once, counted.
    async fn votes<'a, F, Fut>(&'a self, call: F) -> Votes
    where
        F: Fn(&'a RedisBackend) -> Fut,
        Fut: std::future::Future<Output = Result<bool, BackendError>>,
    {
        Votes::count(join_all(self.nodes.iter().map(|node| call(node))).await)
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

    /// Compare-and-delete on every master: whether each held the token. A master that
    /// did not answer in time may have run it, or may run the `SET` that put the token
    /// there only now (its reply was late): the compare-and-delete is sent to it again in
    /// the background (see [`delete_later`]), so the token does not hold that master for
    /// the rest of its ttl.
    async fn delete_everywhere(&self, key: &str, token: &str) -> Vec<Result<bool, BackendError>> {
        let replies = join_all(self.nodes.iter().map(|node| async move {
            node.release(&plain_release(key, token))
                .await
                .map(|r| r == Released::Now)
        }))
        .await;
        for (node, reply) in self.nodes.iter().zip(&replies) {
            if reply.as_ref().is_err_and(BackendError::is_transient) {
                delete_later(node.clone(), key.to_owned(), token.to_owned());
            }
        }
        replies
    }

    /// Yes with a quorum of yes; no with a quorum of no, or every master answered;
    /// otherwise the error of a call a quorum could not answer.
    fn decide(&self, votes: &Votes) -> Result<bool, BackendError> {
        if votes.yes >= self.quorum() {
            Ok(true)
        } else if votes.no >= self.quorum() || votes.error.is_none() {
            Ok(false)
        } else {
            Err(self.no_quorum(votes))
        }
    }
}

impl Records for RedlockBackend {
    /// The claim on every master at once. What a master says counts this way:
    /// - a completed record of the same payload on any master is replayed: it was
    ///   written only after a body ran under a quorum of claims. Where masters hold
    ///   different ones (a lease that really ended, two stores), the one most masters
    ///   hold, then the earliest;
    /// - a completed record of another payload on any master is a mismatch; another
    ///   payload's claim in progress is one when a quorum holds it, and otherwise counts
    ///   as busy (a claim given back on some masters only, or two payloads racing);
    /// - claimed (new or taken over) on a quorum, with at least half the lease left
    ///   after the time the claim took and the drift: the caller's;
    /// - otherwise the claims it got are given back on every master (again later where a
    ///   master did not answer), and the caller waits for the longest lease a master
    ///   has in progress, or a random short while when calls split the masters; a
    ///   `Backend` error when too few masters answered for a quorum.
    ///
    /// The caller tries again with another owner (see `idempotency::begin`): a give-back
    /// that reaches a master late then never removes the caller's next claim.
    async fn idem_claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed, BackendError> {
        let started = Instant::now();
        let replies = join_all(self.nodes.iter().map(|node| node.idem_claim(a))).await;
        let ClaimTally {
            claimed,
            answered,
            busy,
            other_claims,
            took_over,
            other_result,
            completed,
            left,
            error,
        } = ClaimTally::of(&replies);
        let drift = a.lease / 100 + Duration::from_millis(2);
        let valid = a
            .lease
            .checked_sub(started.elapsed() + drift)
            .is_some_and(|left| left >= a.lease / 2);
        if completed.is_empty() && !other_result && claimed >= self.quorum() && valid {
            // A claim (and its record written as it was) differs from master to master:
            // the store compares nothing (see `idem_complete`).
            return Ok(
                took_over.map_or(Claimed::New(None), |previous| Claimed::TookOver {
                    previous,
                }),
            );
        }
        // Not the caller's: what it claimed goes, wherever it may have landed (no
        // channel: nothing waits by message across independent masters).
        if claimed > 0 || error.is_some() {
            let retention = a.lifetime.saturating_sub(a.lease);
            let gone = join_all(
                self.nodes
                    .iter()
                    .map(|node| node.idem_release(a.key, a.owner, "", retention)),
            )
            .await;
            for (node, reply) in self.nodes.iter().zip(&gone) {
                if reply.as_ref().is_err_and(BackendError::is_transient) {
                    release_claim_later(node.clone(), a.key, a.owner, retention);
                }
            }
        }
        if let Some(raw) = first_result(&completed) {
            return Ok(Claimed::Completed(raw.clone()));
        }
        if other_result || other_claims >= self.quorum() {
            return Ok(Claimed::Mismatch {
                completed: other_result,
            });
        }
        if answered < self.quorum() {
            return Err(self.no_quorum(&Votes {
                yes: claimed,
                no: answered - claimed,
                error,
            }));
        }
        if busy > 0 {
            return Ok(Claimed::InProgress(left.max(Duration::from_millis(1))));
        }
        Ok(Claimed::InProgress(Duration::from_millis(fastrand::u64(
            5..=50,
        ))))
    }

    /// The result stored on every master (each claim's record as written is unknown
    /// here: each master's settle script decides). Stored when a quorum stored it; not
    /// the stored result when a quorum said so, or every master answered without a
    /// quorum storing it; otherwise a `Backend` error (the store is tried again).
    async fn idem_complete(
        &self,
        key: &str,
        record: &str,
        retention: Duration,
        channel: &str,
        _written: Option<&str>,
    ) -> Result<bool, BackendError> {
        let votes = self
            .votes(|node| node.idem_complete(key, record, retention, channel, None))
            .await;
        self.decide(&votes)
    }

    /// Gives the claim back on every master: whether any held it.
    async fn idem_release(
        &self,
        key: &str,
        owner: &str,
        channel: &str,
        retention: Duration,
    ) -> Result<bool, BackendError> {
        let votes = self
            .votes(|node| node.idem_release(key, owner, channel, retention))
            .await;
        if votes.yes == 0 && votes.no == 0 {
            return Err(self.no_quorum(&votes));
        }
        Ok(votes.yes > 0)
    }

    /// Renews the claim's lease on every master: renewed when a quorum renewed it, lost
    /// when a quorum refused (or every master answered without a quorum renewing).
    async fn idem_renew(
        &self,
        key: &str,
        owner: &super::idem::Owner<'_>,
        lease: Duration,
        lifetime: Duration,
    ) -> Result<super::idem::Renewal, BackendError> {
        use super::idem::Renewal;
        let votes = self
            .votes(|node| async move {
                let renewed = node.idem_renew(key, owner, lease, lifetime).await?;
                Ok(renewed != Renewal::Lost)
            })
            .await;
        Ok(if self.decide(&votes)? {
            Renewal::Renewed
        } else {
            Renewal::Lost
        })
    }

    async fn idem_look(&self, _key: &str) -> Result<super::idem::Looked, BackendError> {
        Err(unsupported("showing an idempotency record"))
    }

    async fn idem_peek(
        &self,
        _key: &str,
        _head: usize,
    ) -> Result<super::idem::Peeked, BackendError> {
        Err(unsupported("showing an idempotency record"))
    }

    async fn idem_forget(&self, _key: &str, _channel: &str) -> Result<Option<bool>, BackendError> {
        Err(unsupported("forgetting an idempotency record"))
    }
}

impl Locking for RedlockBackend {
    async fn fence(
        &self,
        _key: &str,
        _token: &str,
        _idle: Duration,
    ) -> Result<Option<u64>, BackendError> {
        Err(unsupported("fencing tokens"))
    }

    fn independent_writes(&self) -> bool {
        true
    }

    async fn try_acquire(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        _client: &str,
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

    async fn release(&self, call: &ReleaseCall<'_>) -> Result<Released, BackendError> {
        let votes = Votes::count(self.delete_everywhere(call.key, call.token).await);
        if votes.yes >= self.quorum() {
            Ok(Released::Now)
        } else if votes.no >= self.quorum() || votes.error.is_none() {
            Ok(Released::NotOurs)
        } else {
            Err(self.no_quorum(&votes))
        }
    }

    async fn set_fenced(
        &self,
        _key: &str,
        _value: &str,
        _fence: u64,
        _ttl: Option<Duration>,
    ) -> Result<Option<u64>, BackendError> {
        Err(unsupported("fenced writes"))
    }

    async fn fenced_value(&self, _key: &str) -> Result<(Option<String>, u64), BackendError> {
        Err(unsupported("fenced writes"))
    }

    async fn try_permit(
        &self,
        _key: &str,
        _token: &str,
        _ttl: Duration,
        _permits: u32,
    ) -> Result<Try, BackendError> {
        Err(unsupported("semaphores"))
    }

    async fn release_permit(
        &self,
        _set: &str,
        _token: &str,
        _wake: (&str, bool),
    ) -> Result<Released, BackendError> {
        Err(unsupported("semaphores and read/write locks"))
    }

    async fn inspect(&self, _key: &str) -> Result<super::Seen, BackendError> {
        Err(unsupported("inspecting a lock"))
    }

    async fn force_release(&self, _key: &str) -> Result<bool, BackendError> {
        Err(unsupported("releasing a lock by force"))
    }

    async fn scan_nodes(&self) -> Result<Vec<super::ScanNode>, BackendError> {
        Err(unsupported("listing locks"))
    }

    async fn scan(
        &self,
        _node: &super::ScanNode,
        _cursor: u64,
        _pattern: &str,
    ) -> Result<(u64, Vec<String>), BackendError> {
        Err(unsupported("listing locks"))
    }

    async fn try_read(
        &self,
        _key: &str,
        _token: &str,
        _ttl: Duration,
        _mark: bool,
        _waiting: Duration,
    ) -> Result<Try, BackendError> {
        Err(unsupported("read/write locks"))
    }

    async fn try_write(
        &self,
        _key: &str,
        _token: &str,
        _ttl: Duration,
        _who: (&str, bool),
        _waiting: Duration,
    ) -> Result<Try, BackendError> {
        Err(unsupported("read/write locks"))
    }

    async fn extend_permits(&self, leases: &[(&str, &str, Duration)]) -> super::Extended {
        vec![Err(unsupported("semaphores")); leases.len()]
    }

    /// Each lease judged on its own: renewed on a quorum, lost when a quorum refused (or
    /// every master answered without a quorum renewing), else the failure.
    async fn extend_many(&self, leases: &[(&str, &str, Duration)]) -> super::Extended {
        let per_node = join_all(self.nodes.iter().map(|node| node.extend_many(leases))).await;
        (0..leases.len())
            .map(|i| {
                let votes = Votes::count(
                    per_node
                        .iter()
                        .map(|r| r.get(i).cloned().unwrap_or(Ok(false)))
                        .collect(),
                );
                if votes.yes >= self.quorum() {
                    Ok(true)
                } else if votes.no >= self.quorum() || votes.error.is_none() {
                    Ok(false)
                } else {
                    Err(self.no_quorum(&votes))
                }
            })
            .collect()
    }

    async fn ping(&self) -> Result<(), BackendError> {
        let votes = self
            .votes(|node| async move { node.ping().await.map(|()| true) })
            .await;
        if votes.yes >= self.quorum() {
            Ok(())
        } else {
            Err(self.no_quorum(&votes))
        }
    }

    fn command_timeout(&self) -> Duration {
        self.nodes
            .first()
            .map_or(Duration::ZERO, |node| node.timeout())
    }

    fn epoch(&self) -> u64 {
        self.nodes.iter().map(|node| node.epoch()).sum()
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

/// `again` (a give-back: a compare-and-delete of a token, or of a claim's owner) on
/// `node` once more after the command timeout, then after twice as long each time,
/// until the node answers (at most 5 times). A token or an owner is one try's alone, so
/// a give-back only ever removes what that try wrote.
fn retry_later<F, Fut, T>(node: Arc<RedisBackend>, again: F)
where
    F: Fn(Arc<RedisBackend>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T, BackendError>> + Send,
{
    crate::util::spawn_here(async move {
        let mut pause = node.timeout();
        for _ in 0..5 {
            tokio::time::sleep(pause).await;
            match again(node.clone()).await {
                Err(e) if e.is_transient() => pause *= 2,
                _ => return,
            }
        }
    });
}

/// The compare-and-delete of `token` at `key` on `node`, again later.
fn delete_later(node: Arc<RedisBackend>, key: String, token: String) {
    retry_later(node, move |node| {
        let (key, token) = (key.clone(), token.clone());
        async move { node.release(&plain_release(&key, &token)).await }
    });
}

/// The give-back of `owner`'s claim at `key` on `node`, again later.
fn release_claim_later(node: Arc<RedisBackend>, key: &str, owner: &str, retention: Duration) {
    let (key, owner) = (key.to_owned(), owner.to_owned());
    retry_later(node, move |node| {
        let (key, owner) = (key.clone(), owner.clone());
        async move { node.idem_release(&key, &owner, "", retention).await }
    });
}

/// Of the completed records the masters hold, the one most hold, then the earliest (by
/// `completed_at_ms`), then the least by its text: the same choice whatever the order
/// the masters answered in. One store writes one record, the same text on every master,
/// so masters hold the same result when their first completed records are equal; two
/// results stored in the same millisecond are two, not one majority.
fn first_result<'a>(completed: &[&'a String]) -> Option<&'a String> {
    let at = |raw: &str| -> u64 {
        raw.split_once(r#""completed_at_ms":"#)
            .and_then(|(_, rest)| {
                let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
                rest[..digits].parse().ok()
            })
            .unwrap_or(u64::MAX)
    };
    completed
        .iter()
        .map(|raw| {
            let result = first_completed(raw);
            let held = completed
                .iter()
                .filter(|r| first_completed(r) == result)
                .count();
            (std::cmp::Reverse(held), at(result), result, *raw)
        })
        .min()
        .map(|(_, _, _, raw)| raw)
}

/// The first completed record in a record's value (what a reader replays): from its
/// first `{"status":"completed"` to the end of that JSON object; the whole value when
/// there is none or it does not parse.
fn first_completed(raw: &str) -> &str {
    let Some(start) = raw.find(r#"{"status":"completed""#) else {
        return raw;
    };
    let rest = &raw[start..];
    let mut objects = serde_json::Deserializer::from_str(rest).into_iter::<serde::de::IgnoredAny>();
    match objects.next() {
        Some(Ok(_)) => &rest[..objects.byte_offset()],
        _ => rest,
    }
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

/// The masters' answers to one claim, counted (see `RedlockBackend::idem_claim`).
struct ClaimTally<'r> {
    /// Masters on which the claim is the caller's (new or taken over).
    claimed: usize,
    /// Masters that answered at all.
    answered: usize,
    /// Masters with a claim in progress of the same payload.
    busy: usize,
    /// Masters with another payload's claim in progress.
    other_claims: usize,
    /// The owner taken over from, when a master's claim was a takeover.
    took_over: Option<String>,
    /// Some master holds another payload's result.
    other_result: bool,
    /// The results stored, master by master.
    completed: Vec<&'r String>,
    /// The longest lease left of a claim in progress.
    left: Duration,
    /// The error kept of those that did not answer.
    error: Option<BackendError>,
}

impl<'r> ClaimTally<'r> {
    fn of(replies: &'r [Result<Claimed, BackendError>]) -> Self {
        let mut t = ClaimTally {
            claimed: 0,
            answered: 0,
            busy: 0,
            other_claims: 0,
            took_over: None,
            other_result: false,
            completed: Vec::new(),
            left: Duration::ZERO,
            error: None,
        };
        for reply in replies {
            let found = match reply {
                Ok(found) => found,
                Err(e) => {
                    keep_error(&mut t.error, e.clone());
                    continue;
                }
            };
            t.answered += 1;
            match found {
                Claimed::New(_) => t.claimed += 1,
                Claimed::TookOver { previous } => {
                    t.claimed += 1;
                    t.took_over = Some(previous.clone());
                }
                Claimed::Completed(raw) => t.completed.push(raw),
                Claimed::InProgress(l) => {
                    t.busy += 1;
                    t.left = t.left.max(*l);
                }
                Claimed::Mismatch { completed: true } => t.other_result = true,
                Claimed::Mismatch { completed: false } => t.other_claims += 1,
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::{first_completed, first_result, keep_error};
    use crate::error::{BackendError, BackendErrorKind};

    /// A timeout (a write may have landed: the caller gives it back) is reported over a
    /// master's refusal, whichever came last.
    #[test]
    fn a_transient_error_is_the_one_reported() {
        let refused = || BackendError::new(BackendErrorKind::Response, "OOM");
        let late = || BackendError::new(BackendErrorKind::Timeout, "no reply");
        let mut kept = None;
        keep_error(&mut kept, late());
        keep_error(&mut kept, refused());
        assert_eq!(kept.unwrap().kind(), BackendErrorKind::Timeout);
        let mut kept = None;
        keep_error(&mut kept, refused());
        keep_error(&mut kept, late());
        assert_eq!(kept.unwrap().kind(), BackendErrorKind::Timeout);
        let mut kept = None;
        keep_error(&mut kept, refused());
        assert_eq!(kept.unwrap().kind(), BackendErrorKind::Response);
    }

    #[test]
    fn the_result_most_masters_hold_then_the_earliest() {
        let rec = |at: u64| {
            format!(r#"{{"status":"completed","fp":"ab","completed_at_ms":{at},"value":{at}}}"#)
        };
        let (early, late) = (rec(100), rec(200));
        assert_eq!(first_result(&[&late, &early, &late]), Some(&late));
        assert_eq!(first_result(&[&late, &early]), Some(&early));
        assert_eq!(first_result(&[&early]), Some(&early));
        assert_eq!(first_result(&[]), None);
    }

    /// Two results stored in the same millisecond are two: the one more masters hold
    /// wins, and a tie goes the same way whatever the order the masters answered in.
    #[test]
    fn results_of_one_millisecond_are_told_apart() {
        let rec = |value: &str| {
            format!(
                r#"{{"claimed_at_ms":1,"owner":"o","status":"in_progress"}}{{"status":"completed","fp":"ab","completed_at_ms":100,"value":"{value}"}}"#
            )
        };
        let (a, b) = (rec("a"), rec("b"));
        assert_eq!(first_result(&[&b, &a, &b]), Some(&b), "two masters hold b");
        // Another claim's in-progress record before the same result: one result.
        let a_elsewhere = a.replace(r#""owner":"o""#, r#""owner":"p""#);
        assert_eq!(first_result(&[&b, &a, &a_elsewhere]), Some(&a));
        assert_eq!(
            first_result(&[&a_elsewhere, &b, &a]).map(|r| first_completed(r)),
            Some(first_completed(&a))
        );
        for order in [[&a, &b], [&b, &a]] {
            assert_eq!(
                first_result(&order),
                Some(&a),
                "a tie: the least by its text"
            );
        }
    }
}
