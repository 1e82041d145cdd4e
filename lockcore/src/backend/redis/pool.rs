//! The pool of direct connections the lock scripts run on (see [`super::super::direct`]):
//! at most [`MAX_DIRECT`] per client, taken by the calls that would queue behind others
//! on the multiplexed connection, given back when their reply came whole.

use super::*;

/// How many direct connections one client keeps open at most (over all runtimes).
pub(super) const MAX_DIRECT: usize = 4;

/// Direct connections serve a call only while fewer calls than this are in flight on
/// the client: under heavy concurrency the multiplexed connection pipelines many
/// commands per socket read and write, which costs redis-server less CPU per command.
pub(super) const DIRECT_BELOW: usize = 3;

impl RedisBackend {
    /// An idle direct connection of this runtime, or a new one while fewer than
    /// [`MAX_DIRECT`] are open and it opens within a quarter of the command timeout (see
    /// [`Self::open_direct`]); `None` sends the call over the multiplexed connection.
    pub(super) async fn take_direct(
        &self,
        runtime: tokio::runtime::Id,
    ) -> Result<Option<Direct>, BackendError> {
        let Target::Single(client) = &self.target else {
            return Ok(None);
        };
        if !self.direct {
            return Ok(None);
        }
        let info = client.get_connection_info();
        self.take_direct_to(runtime, info).await
    }

    /// [`take_direct`](Self::take_direct) to the server `info` names.
    pub(super) async fn take_direct_to(
        &self,
        runtime: tokio::runtime::Id,
        info: &redis::ConnectionInfo,
    ) -> Result<Option<Direct>, BackendError> {
        let addr = info.addr().to_string();
        while let Some(mut found) = self.idle_of(runtime, &addr) {
            if found.is_broken() {
                // Closed by the server: its idle `timeout`, `CLIENT KILL`, or a restart
                // that may have lost keys (see `epoch`).
                tracing::debug!(target: "distlock", "an idle direct connection was closed by redis; replacing it");
                self.broke();
                continue;
            }
            self.first_use(&mut found);
            return Ok(Some(found));
        }
        let place = match Place::take(&self.live, MAX_DIRECT) {
            Some(place) => place,
            None => {
                // Make room by closing one left by another runtime (most likely one
                // that has shut down: unused for a while); otherwise every direct
                // connection is busy, or used by live runtimes, and the call goes over
                // the multiplexed one (closing theirs would only move the churn there).
                let mut idle = crate::util::lock(&self.idle);
                let Some(other) = idle.iter().position(|d| {
                    (d.runtime() != runtime || d.addr() != addr) && d.idle_for() >= RECLAIM_IDLE
                }) else {
                    return Ok(None);
                };
                drop(idle.remove(other));
                drop(idle);
                match Place::take(&self.live, MAX_DIRECT) {
                    Some(place) => place,
                    None => return Ok(None),
                }
            }
        };
        let mut opening = self.open_direct(runtime, info.clone(), place);
        let waited = match tokio::time::timeout(self.timeout / 4, &mut opening).await {
            Ok(waited) => waited.map_err(drop),
            Err(_) => {
                // Closed first: from here the task keeps what it makes (the idle pool),
                // unless it had sent it already.
                opening.close();
                opening.try_recv().map_err(|_| ())
            }
        };
        match waited {
            Ok(Ok(mut opened)) => {
                self.first_use(&mut opened);
                Ok(Some(opened))
            }
            Ok(Err(e)) => {
                if !self.sharded {
                    self.broke();
                }
                Err(e.into())
            }
            // Still opening (it goes on, into the idle pool), or its runtime is shutting
            // down: the multiplexed (or cluster) connection takes the call.
            Err(()) => Ok(None),
        }
    }

    /// Opens a direct connection in a task of its own. The call waits for it a while
    /// (see `take_direct_to`); when the call has stopped waiting, the connection goes
    /// into the idle pool for the next call, so that opening it (a TLS handshake,
    /// `AUTH`, naming the connection, reading the `run_id`, each a round trip) never
    /// makes a call miss its timeout again and again on a slow link. Within the connect
    /// timeout.
    pub(super) fn open_direct(
        &self,
        runtime: tokio::runtime::Id,
        info: redis::ConnectionInfo,
        place: Place,
    ) -> tokio::sync::oneshot::Receiver<redis::RedisResult<Direct>> {
        let (tls, idle, within) = (self.tls.clone(), self.idle.clone(), self.connect_timeout);
        // Where it fails with nobody waiting: on one server, a sign that it may have
        // restarted (see `epoch`); on a cluster, a node that cannot be reached: the slot
        // owners are read again.
        let failed: Box<dyn FnOnce() + Send> = if self.sharded {
            let owners = self.owners.clone();
            Box::new(move || *crate::util::lock(&owners) = None)
        } else {
            let epoch = self.epoch.clone();
            Box::new(move || {
                epoch.fetch_add(1, Ordering::AcqRel);
            })
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        crate::util::spawn_here(async move {
            let open = Direct::open(&info, &tls, runtime, place);
            let opened = match tokio::time::timeout(within, open).await {
                Ok(opened) => opened,
                Err(_) => Err(io::Error::from(io::ErrorKind::TimedOut).into()),
            };
            match tx.send(opened) {
                Ok(()) => {}
                Err(Ok(opened)) => {
                    tracing::debug!(target: "distlock", addr = opened.addr(), "opened a direct connection to redis after its call went on without it");
                    crate::util::lock(&idle).push(opened);
                }
                Err(Err(e)) => {
                    tracing::debug!(target: "distlock", error = %e, "a direct connection could not be opened");
                    failed();
                }
            }
        });
        rx
    }

    /// Before each use of a direct connection: on its first, the server's `run_id` it
    /// read when opened is compared with the one known (another one means a restart, see
    /// `epoch`).
    pub(super) fn first_use(&self, direct: &mut Direct) {
        let Some(id) = direct.take_run_id() else {
            return;
        };
        let Some(id) = id.as_deref() else {
            self.unknown_server();
            return;
        };
        if self.sharded {
            // A cluster's nodes each have their own `run_id`.
            let mut known = crate::util::lock(&self.node_run_ids);
            if known
                .insert(direct.addr().to_owned(), id.to_owned())
                .is_some_and(|was| was != id)
            {
                self.broke();
            }
        } else {
            self.observe(Some(id));
        }
    }

    /// The newest idle direct connection of `runtime`, taken out of the pool.
    pub(super) fn idle_of(&self, runtime: tokio::runtime::Id, addr: &str) -> Option<Direct> {
        let mut idle = crate::util::lock(&self.idle);
        let at = idle
            .iter()
            .rposition(|d| d.runtime() == runtime && d.addr() == addr)?;
        Some(idle.swap_remove(at))
    }

    pub(super) fn give_back(&self, mut conn: Direct) {
        conn.went_idle();
        crate::util::lock(&self.idle).push(conn);
    }

    /// A direct connection after a call that got `reply` on it, as
    /// [`policy::after_error`] says: back to the pool while it is in step and its server a primary; else closed,
    /// with the idle ones (they likely share its fate: a broken link, or a demoted
    /// primary behind a name that moved), and the break counted.
    pub(super) fn done_with<T>(&self, conn: Direct, reply: &redis::RedisResult<T>) {
        if let Err(e) = reply
            && policy::after_error(e) != policy::AfterError::Keep
        {
            drop(conn);
            self.drop_idle();
            self.broke();
        } else {
            self.give_back(conn);
        }
    }

    /// Closes every idle direct connection (one broke: the others likely share its fate).
    pub(super) fn drop_idle(&self) {
        let stale = std::mem::take(&mut *crate::util::lock(&self.idle));
        drop(stale);
    }
}
