//! Waking waiters when a lock is released.
//!
//! The release script publishes on the lock's channel (`{<key>}:released`) in the same round
//! trip that deletes the key. Every waiter of one [`Locks`](crate::Locks) client shares
//! one Pub/Sub connection (one per tokio runtime); channels are subscribed while at least
//! one waiter wants them and unsubscribed when the last one leaves, is served or is
//! cancelled. A waiter sees a release as a change of a per-channel sequence number, so a
//! message that arrives between two looks is never missed. When Pub/Sub is unavailable,
//! waiters still wake on their capped fallback timer.
//!
//! On a Redis Cluster the channels are sharded (`SSUBSCRIBE`, on the node that owns the
//! key's slot) over one RESP3 cluster connection per runtime, which redis-rs resubscribes
//! after a reconnect and when slots move; a channel the server drops (its slot moved
//! away) wakes its waiters, who try again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::util::MAX_RUNTIMES;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use redis::aio::PubSubSink;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind};
use tokio::sync::{mpsc, oneshot, watch};

/// The channel a lock's release is published on: `{<key>}:released`, in the key's hash
/// slot (see [`crate::key::companion`]), as sharded Pub/Sub on a cluster needs.
pub(crate) fn channel_of(key: &str) -> String {
    crate::key::companion(key, ":released")
}

/// Channels with waiters: a sequence number per channel (0 until the subscription is
/// confirmed) and how many waiters hold it.
#[derive(Default)]
pub(crate) struct Registry {
    channels: Mutex<HashMap<String, Channel>>,
}

struct Channel {
    seq: watch::Sender<u64>,
    refs: usize,
}

impl Registry {
    /// Bumps the channel's sequence, waking its waiters.
    pub(crate) fn publish(&self, channel: &str) {
        let channels = crate::util::lock(&self.channels);
        if let Some(c) = channels.get(channel) {
            c.seq.send_modify(|s| *s = s.saturating_add(1).max(2));
        }
    }

    /// Joins `channel`; `true` when this waiter is the first and must subscribe.
    fn join(&self, channel: &str) -> (watch::Receiver<u64>, bool) {
        let mut channels = crate::util::lock(&self.channels);
        match channels.get_mut(channel) {
            Some(c) => {
                c.refs += 1;
                (c.seq.subscribe(), false)
            }
            None => {
                let (tx, rx) = watch::channel(0);
                channels.insert(channel.to_owned(), Channel { seq: tx, refs: 1 });
                (rx, true)
            }
        }
    }

    /// Marks a subscription confirmed (or, for an in-process registry, usable at once).
    fn confirm(&self, channel: &str) {
        let channels = crate::util::lock(&self.channels);
        if let Some(c) = channels.get(channel) {
            c.seq.send_modify(|s| *s = (*s).max(1));
        }
    }

    /// Leaves `channel`; `true` when it was the last waiter.
    fn leave(&self, channel: &str) -> bool {
        let mut channels = crate::util::lock(&self.channels);
        let last = match channels.get_mut(channel) {
            Some(c) => {
                c.refs -= 1;
                c.refs == 0
            }
            None => false,
        };
        if last {
            channels.remove(channel);
        }
        last
    }

    /// Wakes everyone (the connection broke: retry, then rely on the fallback timer).
    fn wake_all(&self) {
        let channels = crate::util::lock(&self.channels);
        for c in channels.values() {
            c.seq.send_modify(|s| *s = s.saturating_add(1).max(2));
        }
    }

    /// How many waiters hold `channel` (in memory, what `PUBSUB NUMSUB` counts).
    pub(crate) fn waiters(&self, channel: &str) -> usize {
        crate::util::lock(&self.channels)
            .get(channel)
            .map_or(0, |c| c.refs)
    }

    /// Number of channels with waiters (for tests and metrics).
    pub(crate) fn len(&self) -> usize {
        crate::util::lock(&self.channels).len()
    }
}

/// One waiter's interest in one channel; leaving is automatic on drop.
pub(crate) struct Subscription {
    rx: watch::Receiver<u64>,
    channel: String,
    owner: Owner,
}

enum Owner {
    Local(Arc<Registry>),
    Redis(Arc<Hub>),
}

impl Subscription {
    /// In-process: usable at once.
    pub(crate) fn local(registry: &Arc<Registry>, channel: String) -> Subscription {
        let (mut rx, _first) = registry.join(&channel);
        registry.confirm(&channel);
        rx.borrow_and_update();
        Subscription {
            rx,
            channel,
            owner: Owner::Local(registry.clone()),
        }
    }

    /// Waits until a release is published after the last call (or the connection broke).
    pub(crate) async fn released(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        match &self.owner {
            Owner::Local(registry) => {
                registry.leave(&self.channel);
            }
            Owner::Redis(hub) => {
                if hub.registry.leave(&self.channel) {
                    hub.leaving(&self.channel, 1);
                    if hub
                        .commands
                        .send(Command::Unsubscribe(self.channel.clone()))
                        .is_err()
                    {
                        hub.leaving(&self.channel, -1);
                    }
                }
            }
        }
    }
}

enum Command {
    Subscribe(String, oneshot::Sender<bool>),
    Unsubscribe(String),
    /// The server dropped this channel (its slot moved): subscribe again if it is still
    /// waited on and not being left, checked when it runs (after the commands before it).
    Resubscribe(String),
}

/// One Pub/Sub connection and the task that serializes (un)subscriptions and fans
/// messages out.
pub(crate) struct Hub {
    registry: Registry,
    commands: mpsc::UnboundedSender<Command>,
    /// Channels whose `UNSUBSCRIBE` is sent but not yet confirmed: Redis still counts
    /// this connection as a subscriber.
    leaving: Mutex<HashMap<String, usize>>,
    /// Behind Sentinel: the count of new primaries announced when it was made.
    switched: u64,
}

impl Hub {
    fn leaving(&self, channel: &str, delta: isize) {
        let mut leaving = crate::util::lock(&self.leaving);
        let n = leaving.entry(channel.to_owned()).or_default();
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            leaving.remove(channel);
        }
    }
}

/// Where a notifier subscribes.
// One per client, read once per hub: its size costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Source {
    /// One server: plain Pub/Sub.
    Single(redis::Client),
    /// A cluster: sharded Pub/Sub; makes the builder of a cluster client with the
    /// client's nodes and settings.
    Cluster(Arc<dyn Fn() -> ClusterClientBuilder + Send + Sync>),
    /// The primary the sentinels name: a hub made before they announced another one is
    /// left for a new one there.
    Sentinel(Arc<dyn Primary>),
}

/// The primary behind Sentinel, as the notifier needs it (the backend implements it).
pub(crate) trait Primary: Send + Sync {
    /// How many times the sentinels announced a new primary.
    fn switched(&self) -> u64;
    /// The primary they name now, within `timeout`; `None` when it cannot be found.
    fn find(&self, timeout: Duration) -> BoxFuture<'_, Option<redis::Client>>;
}

impl Source {
    fn switched(&self) -> u64 {
        match self {
            Source::Sentinel(target) => target.switched(),
            _ => 0,
        }
    }
}

/// The Pub/Sub side of one client: a hub per tokio runtime, made on first wait, for as
/// many runtimes as the connection policy keeps (`MAX_RUNTIMES`).
pub(crate) struct Notifier {
    inner: Arc<Inner>,
}

struct Inner {
    source: Source,
    timeout: Duration,
    /// How a yield message names this client (` <client id> `): its waiters are not
    /// woken by a lock left to others.
    named: Arc<[u8]>,
    hubs: Mutex<Vec<(tokio::runtime::Id, Arc<Hub>)>>,
    /// The Pub/Sub connections being made, one per runtime at most, each in a task of
    /// its own (see [`Notifier::hub`]).
    pending: Mutex<Vec<(tokio::runtime::Id, Attempt)>>,
    /// After a Pub/Sub connection could not be made, until when waiters poll instead of
    /// trying again (each would wait on another connect).
    backoff_until: Mutex<Option<tokio::time::Instant>>,
}

/// A Pub/Sub connection being made: done when it ended in a hub or a backoff.
type Attempt = futures_util::future::Shared<BoxFuture<'static, ()>>;

impl Notifier {
    pub(crate) fn new(source: Source, timeout: Duration) -> Notifier {
        Notifier {
            inner: Arc::new(Inner {
                source,
                timeout,
                named: Arc::from(&b""[..]),
                hubs: Mutex::new(Vec::new()),
                pending: Mutex::new(Vec::new()),
                backoff_until: Mutex::new(None),
            }),
        }
    }

    /// The notifier of the client with this id (see `release.lua`).
    pub(crate) fn for_client(mut self, id: &str) -> Notifier {
        let named = Arc::from(format!(" {id} ").as_bytes());
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.named = named,
            None => unreachable!("a notifier is named before it is shared"),
        }
        self
    }

    /// This runtime's hub, made if need be. The connection is made in a task of its own,
    /// one at a time per runtime, which every waiter that needs it joins under its own
    /// deadline (the caller's future bounds it): a waiter that gives up leaves it to
    /// end, in a hub or in a backoff during which waiters poll, so waiters that give up
    /// one after another never start a connection each. `None`: poll.
    async fn hub(&self) -> Option<Arc<Hub>> {
        let runtime = tokio::runtime::Handle::try_current().ok()?.id();
        let inner = &self.inner;
        if let Some(hub) = inner.live_hub(runtime) {
            return Some(hub);
        }
        if inner.backing_off() {
            return None;
        }
        let (attempt, start) = {
            let mut pending = crate::util::lock(&inner.pending);
            // Again under the lock: an attempt that ended since made the hub.
            if let Some(hub) = inner.live_hub(runtime) {
                return Some(hub);
            }
            match pending.iter().find(|(rt, _)| *rt == runtime) {
                Some((_, attempt)) => (attempt.clone(), None),
                None => {
                    if !inner.room_for(runtime, &pending) {
                        return None;
                    }
                    // Done when the task ends or is dropped (even unpolled, its runtime
                    // shutting down): its guard holds the sender (see `attempt`).
                    let (ended, done) = oneshot::channel::<()>();
                    let attempt: Attempt = futures_util::FutureExt::shared(Box::pin(async move {
                        let _ = done.await;
                    })
                        as BoxFuture<'static, ()>);
                    pending.push((runtime, attempt.clone()));
                    (attempt, Some(ended))
                }
            }
        };
        // Spawned with `pending` unlocked: a runtime shutting down drops the task at once,
        // and its guard takes the lock.
        if let Some(ended) = start {
            tokio::spawn(Inner::attempt(inner.clone(), runtime, ended));
        }
        attempt.await;
        inner.live_hub(runtime)
    }

    /// Subscribes to `channel`, waiting (within the timeout) for Redis to confirm it.
    /// `None` when Pub/Sub is unavailable: the waiter then polls on its fallback timer.
    pub(crate) async fn subscribe(&self, channel: String) -> Option<Subscription> {
        let hub = self.hub().await?;
        let timeout = self.inner.timeout;
        let (mut rx, first) = hub.registry.join(&channel);
        let sub = Subscription {
            rx: rx.clone(),
            channel: channel.clone(),
            owner: Owner::Redis(hub.clone()),
        };
        if first {
            let (ack, confirmed) = oneshot::channel();
            if hub
                .commands
                .send(Command::Subscribe(channel.clone(), ack))
                .is_err()
            {
                return None;
            }
            // The hub confirms the channel itself (see `drive`): waiters that joined
            // meanwhile are served even if this one gives up.
            match tokio::time::timeout(timeout, confirmed).await {
                Ok(Ok(true)) => {}
                _ => return None,
            }
        } else if tokio::time::timeout(timeout, rx.wait_for(|s| *s >= 1))
            .await
            .map_or(true, |r| r.is_err())
        {
            return None;
        }
        let mut sub = sub;
        sub.rx.borrow_and_update();
        Some(sub)
    }

    /// Whether Redis may count this client's connection among the subscribers of
    /// `channel` (subscribed, or leaving but not yet confirmed), so a release does not
    /// take this client's own waiters for another client's.
    pub(crate) fn may_count_self(&self, channel: &str) -> bool {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let Some(hub) = self.inner.live_hub(handle.id()) else {
            return false;
        };
        crate::util::lock(&hub.registry.channels).contains_key(channel)
            || crate::util::lock(&hub.leaving).contains_key(channel)
    }

    /// Channels subscribed right now on this runtime's hub (for tests).
    pub(crate) fn active_channels(&self) -> usize {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return 0;
        };
        self.inner
            .live_hub(handle.id())
            .map_or(0, |hub| hub.registry.len())
    }
}

impl Inner {
    fn live_hub(&self, runtime: tokio::runtime::Id) -> Option<Arc<Hub>> {
        let hubs = crate::util::lock(&self.hubs);
        let switched = self.source.switched();
        hubs.iter()
            .find(|(rt, hub)| {
                *rt == runtime && !hub.commands.is_closed() && hub.switched == switched
            })
            .map(|(_, hub)| hub.clone())
    }

    fn backing_off(&self) -> bool {
        crate::util::lock(&self.backoff_until)
            .is_some_and(|until| tokio::time::Instant::now() < until)
    }

    /// As many hubs as the connection policy keeps runtimes: past it, this runtime's
    /// waiters poll rather than push out a live runtime's hub (which would make a
    /// connection for every subscription in turn). Counted: other runtimes' hubs that
    /// still serve (a hub made before a Sentinel switch, or this runtime's own, is
    /// replaced, not counted) and their connections being made.
    fn room_for(
        &self,
        runtime: tokio::runtime::Id,
        pending: &[(tokio::runtime::Id, Attempt)],
    ) -> bool {
        let mut hubs = crate::util::lock(&self.hubs);
        hubs.retain(|(_, h)| !h.commands.is_closed());
        let switched = self.source.switched();
        let serving = hubs
            .iter()
            .filter(|(rt, h)| *rt != runtime && h.switched == switched)
            .count();
        serving + pending.len() < MAX_RUNTIMES
    }

    /// One Pub/Sub connection for `runtime`, made into its hub, or a backoff; then no
    /// longer pending, also when the task is dropped (its runtime shutting down), even
    /// before it first ran: the guard is made here, outside the future.
    fn attempt(
        self: Arc<Inner>,
        runtime: tokio::runtime::Id,
        ended: oneshot::Sender<()>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        /// Leaves `pending`, then ends the attempt for those who wait on it.
        struct Done(Arc<Inner>, tokio::runtime::Id, Option<oneshot::Sender<()>>);
        impl Drop for Done {
            fn drop(&mut self) {
                crate::util::lock(&self.0.pending).retain(|(rt, _)| *rt != self.1);
                drop(self.2.take());
            }
        }
        let done = Done(self, runtime, Some(ended));
        async move {
            let done = done;
            done.0.make_hub(done.1).await;
        }
    }

    /// The hub of `runtime`, or a backoff when no connection could be made.
    async fn make_hub(&self, runtime: tokio::runtime::Id) {
        let switched = self.source.switched();
        // Boxed: the connecting futures are deep types (see `RedisBackend::connection`).
        let Some((sink, stream)) = crate::util::erased(self.connect()).await else {
            // Waiters poll for a while rather than wait on connects that fail.
            *crate::util::lock(&self.backoff_until) =
                Some(tokio::time::Instant::now() + self.timeout);
            return;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let hub = Arc::new(Hub {
            registry: Registry::default(),
            commands: tx,
            leaving: Mutex::default(),
            switched,
        });
        tokio::spawn(drive(
            Arc::downgrade(&hub),
            sink,
            stream,
            rx,
            self.timeout,
            self.named.clone(),
        ));
        let mut hubs = crate::util::lock(&self.hubs);
        hubs.retain(|(rt, h)| *rt != runtime && !h.commands.is_closed());
        hubs.push((runtime, hub));
    }

    /// A Pub/Sub connection and what it delivers, within the timeout.
    async fn connect(&self) -> Option<(Sink, BoxStream<'static, Delivery>)> {
        let found;
        let single = match &self.source {
            Source::Single(client) => Some(client),
            Source::Sentinel(target) => {
                found = target.find(self.timeout).await?;
                Some(&found)
            }
            Source::Cluster(_) => None,
        };
        match (single, &self.source) {
            (Some(client), _) => {
                let pubsub = tokio::time::timeout(self.timeout, client.get_async_pubsub())
                    .await
                    .ok()?
                    .ok()?;
                let (sink, stream) = pubsub.split();
                Some((Sink::Single(sink), stream.map(Delivery::Message).boxed()))
            }
            (None, Source::Cluster(builder)) => {
                let (tx, mut rx) = mpsc::unbounded_channel();
                let client = builder()
                    .use_protocol(redis::ProtocolVersion::RESP3)
                    .push_sender(tx)
                    .build()
                    .ok()?;
                let conn = tokio::time::timeout(self.timeout, client.get_async_connection())
                    .await
                    .ok()?
                    .ok()?;
                let pushes = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
                Some((Sink::Cluster(conn), pushes.map(Delivery::Push).boxed()))
            }
            (None, _) => None,
        }
    }
}

/// How one client's waiters hear of releases: by message from Redis (Pub/Sub), from
/// the in-memory backend's registry, or not at all (Pub/Sub off, or independent
/// masters): then they poll on their capped fallback timer.
// One per client: a box would cost a dereference on every subscription.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Wakeups {
    Messages(Notifier),
    Local(Arc<Registry>),
    Polling,
}

impl Wakeups {
    /// Tied to the client `id` (see [`Notifier::for_client`]).
    pub(crate) fn for_client(self, id: &str) -> Wakeups {
        match self {
            Wakeups::Messages(n) => Wakeups::Messages(n.for_client(id)),
            other => other,
        }
    }

    /// Wake-ups on `channel`; `None` when they cannot be had (the waiter polls).
    pub(crate) async fn subscribe(&self, channel: String) -> Option<Subscription> {
        match self {
            Wakeups::Messages(n) => n.subscribe(channel).await,
            Wakeups::Local(registry) => Some(Subscription::local(registry, channel)),
            Wakeups::Polling => None,
        }
    }

    /// Whether waiters are meant to be woken by message: a subscription that cannot be
    /// had is then made up for by polling with short backoff.
    pub(crate) fn by_message(&self) -> bool {
        !matches!(self, Wakeups::Polling)
    }

    /// See [`Notifier::may_count_self`]: never in memory, where nothing is counted.
    pub(crate) fn may_count_self(&self, channel: &str) -> bool {
        match self {
            Wakeups::Messages(n) => n.may_count_self(channel),
            _ => false,
        }
    }

    /// Channels with waiters right now, on this runtime (for tests).
    pub(crate) fn active_channels(&self) -> usize {
        match self {
            Wakeups::Messages(n) => n.active_channels(),
            Wakeups::Local(registry) => registry.len(),
            Wakeups::Polling => 0,
        }
    }
}

/// Where (un)subscriptions are sent.
enum Sink {
    Single(PubSubSink),
    Cluster(ClusterConnection),
}

impl Sink {
    async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Sink::Single(sink) => sink.subscribe(channel).await,
            Sink::Cluster(conn) => conn.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Sink::Single(sink) => sink.unsubscribe(channel).await,
            Sink::Cluster(conn) => conn.sunsubscribe(channel).await,
        }
    }
}

/// What a Pub/Sub connection delivered.
enum Delivery {
    /// A message (one server).
    Message(redis::Msg),
    /// A push (a cluster): a message, a subscription's change, or a disconnection.
    Push(PushInfo),
}

/// Hands one delivery to the hub's waiters; `named`: see [`passes_over`].
fn deliver(hub: &Hub, delivery: Delivery, named: &[u8]) {
    match delivery {
        Delivery::Message(msg) => {
            if !passes_over(msg.get_payload_bytes(), named) {
                hub.registry.publish(msg.get_channel_name());
            }
        }
        Delivery::Push(push) => {
            let bytes = |i: usize| match push.data.get(i) {
                Some(redis::Value::BulkString(b)) => Some(b.as_slice()),
                _ => None,
            };
            match push.kind {
                PushKind::SMessage | PushKind::Message => {
                    if let (Some(channel), Some(payload)) = (bytes(0), bytes(1))
                        && !passes_over(payload, named)
                    {
                        hub.registry.publish(&String::from_utf8_lossy(channel));
                    }
                }
                // The server dropped the channel (its slot moved) or confirmed a drop:
                // its waiters try again (a needless try when this client left it). A drop
                // this client did not ask for, of a channel still waited on, is followed
                // by a new subscription (on the slot's new node): redis-rs does not
                // resubscribe a channel the server dropped.
                PushKind::SUnsubscribe => {
                    if let Some(channel) = bytes(0) {
                        let channel = String::from_utf8_lossy(channel);
                        hub.registry.publish(&channel);
                        let waited =
                            crate::util::lock(&hub.registry.channels).contains_key(&*channel);
                        if waited {
                            let _ = hub
                                .commands
                                .send(Command::Resubscribe(channel.into_owned()));
                        }
                    }
                }
                // Reconnecting: redis-rs resubscribes; a release meanwhile is missed.
                PushKind::Disconnection => hub.registry.wake_all(),
                _ => {}
            }
        }
    }
}

async fn drive(
    hub: Weak<Hub>,
    mut sink: Sink,
    mut stream: BoxStream<'static, Delivery>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    timeout: Duration,
    named: Arc<[u8]>,
) {
    // Subscribe and unsubscribe run in their own task, in order, so a slow reply never
    // holds up the fan-out of messages.
    let (fail_tx, mut failed) = oneshot::channel::<()>();
    let control_hub = hub.clone();
    let control = tokio::spawn(async move {
        let mut fail_tx = Some(fail_tx);
        while let Some(cmd) = commands.recv().await {
            let ok = match cmd {
                Command::Subscribe(channel, ack) => {
                    let ok = matches!(
                        tokio::time::timeout(timeout, sink.subscribe(&channel)).await,
                        Ok(Ok(()))
                    );
                    // Confirmed here, not by the waiter that asked: it may have given up
                    // meanwhile, and the waiters that joined after it wait for this.
                    // Not while the channel is being left: its waiters then are those of
                    // a later join, whose own `SUBSCRIBE` follows the `UNSUBSCRIBE`.
                    if ok
                        && let Some(hub) = control_hub.upgrade()
                        && !crate::util::lock(&hub.leaving).contains_key(&channel)
                    {
                        hub.registry.confirm(&channel);
                    }
                    let _ = ack.send(ok);
                    ok
                }
                Command::Resubscribe(channel) => {
                    let wanted = control_hub.upgrade().is_some_and(|hub| {
                        crate::util::lock(&hub.registry.channels).contains_key(&channel)
                            && !crate::util::lock(&hub.leaving).contains_key(&channel)
                    });
                    if wanted {
                        let done = tokio::time::timeout(timeout, sink.subscribe(&channel)).await;
                        if !matches!(done, Ok(Ok(()))) {
                            // Not there yet (the slot still moving): its waiters poll on
                            // their fallback timer; the other channels keep the hub.
                            tracing::debug!(target: "distlock", %channel, "a shard channel the server dropped could not be subscribed again");
                        }
                    }
                    true
                }
                Command::Unsubscribe(channel) => {
                    let ok = matches!(
                        tokio::time::timeout(timeout, sink.unsubscribe(&channel)).await,
                        Ok(Ok(()))
                    );
                    if let Some(hub) = control_hub.upgrade() {
                        hub.leaving(&channel, -1);
                    }
                    ok
                }
            };
            if !ok {
                if let Some(tx) = fail_tx.take() {
                    let _ = tx.send(());
                }
                break;
            }
        }
    });
    loop {
        tokio::select! {
            delivery = stream.next() => match delivery {
                Some(delivery) => match hub.upgrade() {
                    Some(hub) => deliver(&hub, delivery, &named),
                    None => break,
                },
                None => break,
            },
            _ = &mut failed => break,
        }
    }
    control.abort();
    if let Some(hub) = hub.upgrade() {
        hub.registry.wake_all();
    }
}

/// Whether a release message leaves the lock to other clients than the one `named`
/// (` <client id> `): a yield message (`yield: <id> <id> ... `) that names it.
fn passes_over(payload: &[u8], named: &[u8]) -> bool {
    !named.is_empty()
        && payload
            .strip_prefix(b"yield:")
            .is_some_and(|names| names.windows(named.len()).any(|w| w == named))
}

#[cfg(test)]
mod tests {
    use super::passes_over;

    #[test]
    fn a_yield_passes_over_the_clients_it_names_only() {
        let me = b" host-1:abc ";
        assert!(passes_over(b"yield: host-1:abc ", me));
        assert!(passes_over(b"yield: host-2:def host-1:abc ", me));
        assert!(!passes_over(b"yield: host-2:def ", me));
        assert!(!passes_over(b"yield: host-1:abcd ", me));
        assert!(!passes_over(b"1", me));
        assert!(
            !passes_over(b"yield: host-1:abc ", b""),
            "no id: never passed over"
        );
    }
}
