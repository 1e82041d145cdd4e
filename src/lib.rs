//! Distributed locks for async Rust, one attribute away.
//!
//! ```no_run
//! use distlock::distributed_lock;
//!
//! #[derive(Debug)]
//! enum AppError {
//!     Lock(distlock::Error),
//! }
//! impl From<distlock::Error> for AppError {
//!     fn from(e: distlock::Error) -> Self {
//!         AppError::Lock(e)
//!     }
//! }
//!
//! /// Runs alone across every process that shares the Redis at `REDIS_URL`.
//! #[distributed_lock(key = "stock:<sku>", ttl = "10s", wait = "3s")]
//! async fn deduct(sku: u64, n: u32) -> Result<u32, AppError> {
//!     // read stock, write stock - no other holder of `lock:stock:<sku>` runs meanwhile
//!     Ok(n)
//! }
//! ```
//!
//! - The lock lives at Redis key `lock:stock:7` (prefix `lock:` plus the template), holding a
//!   plain UTF-8 token `uuid:host:pid`. Inside the body,
//!   `current_lock().unwrap().fence().await?` gives a fencing token that grows across
//!   holders (see [`LockInfo::fence`]).
//! - `ttl` is the lease (default 30 s), `wait` how long to keep trying when the lock is
//!   held (default zero: one try, then [`Error::Busy`]).
//! - Every exit releases: return, `?`, panic and a dropped future. A release that finds
//!   the lock expired or taken turns an `Ok` into `Err(Error::Lost)`.
//! - Without `client = ...`, the attribute uses the client given to [`install`], or one
//!   connected lazily to `REDIS_URL` (default `redis://127.0.0.1:6379/`).
//!
//! The same logic without the attribute is [`Locks::lock`].
//!
//! # How it behaves
//!
//! ## The value
//!
//! A plain UTF-8 token `uuid:host:pid` (`redis-cli GET lock:order:42`), unique per
//! acquisition; while a client of another process waits for it, ` waiting` is appended
//! (`uuid:host:pid waiting`).
//!
//! ## Acquire
//!
//! One round trip: a plain `SET key token NX PX ttl GET` when the key is free. Only a
//! contended try runs a script (to take over a yield marker, read the holder's
//! remaining lease and register as a waiter).
//!
//! ## Release
//!
//! One round trip: a Lua compare-and-delete (EVALSHA, reloaded after NOSCRIPT, e.g.
//! after a Redis restart), as cheap as a hand-written one. A waiter of another client
//! that will be woken by a message marks the holder's value (`<token> waiting`, still
//! plain UTF-8); only a release that finds that mark runs a second script to wake the
//! waiters or leave them the lock. A handoff to a local waiter is one round trip.
//!
//! ## `wait`
//!
//! Waiters sleep until the release message, the holder's remaining lease, or 100 ms,
//! whichever is first, and stop exactly at the deadline.
//!
//! ## Every exit releases
//!
//! Return, `?`, a panic, and a dropped (cancelled) future: the guard's `Drop` schedules
//! the release at once. A cancelled `release()` too: the release goes on in a task of
//! its own, and when a try may already have reached Redis it goes on as a retry, which
//! finds the lock released, handed to the next local waiter (woken holding it) or still
//! held (released now).
//!
//! ## Fencing
//!
//! On demand: `current_lock().unwrap().fence().await?` (or [`LockGuard::fence`]) is one
//! round trip, a script that steps the key's fence counter (`{lock:order:42}:fence`) to
//! max(counter + 1, the server's clock in microseconds since the epoch) while the key
//! still holds the lock's token: the number is its fence, else `Lost`;
//! later calls in the same acquisition (nested ones included) return the same number
//! without a round trip while the lease lasts, and `Lost` once it has ended; a lock that
//! never asks pays nothing. A holder that gets a fence after another got one gets a
//! larger one; a holder paused past its ttl either got a smaller fence than the next
//! holder's or gets `Lost` when it asks. So ask right before the write, and hand it to
//! storage that rejects smaller fences: the check and the guard in one.
//!
//! So fences follow the server's clock (`1796533624825279`, say), and a counter made
//! afresh starts from it: fences never go backwards when the counter is gone, whether it
//! expired or was lost (a restart of a Redis without persistence, `FLUSHDB`, eviction, or
//! a failover to a replica that had not received it), nor when it comes back behind (a
//! replica promoted before it had the last fences, a restart from an older snapshot),
//! while the servers' clocks agree to within the time such an event takes. A fence script
//! takes the server more than a microsecond, so one server cannot give more than one
//! fence a microsecond, and fences do not run ahead of a steady clock. The counter
//! expires once its name has been given no fence for the fence idle window (a day by
//! default, never less than the lock's ttl: [`LocksBuilder::fence_idle_window`]), so a
//! lock per order id leaves nothing behind once its orders are done. Every fence an
//! earlier counter gave stays below the new counter's first as long as the name was given
//! fewer than one fence a microsecond on average (its fences then never ran ahead of the
//! clock by as much as the window, or the time a restarted server was down) and the
//! server's clock did not step back by as much as the window (a restart: the time it was
//! down; a clock that ran ahead and was set right steps back too). While the counter
//! lives, fences grow whatever the clock does. The lock key itself can still be lost in
//! those events (a second holder), which the fence then tells the storage. Use
//! `noeviction` and persistence; a client reads the policy once and warns when it is
//! another.
//!
//! ## Fences that the storage checks
//!
//! A fence protects data only where the storage refuses a write under a smaller fence
//! than one it has seen. For a value kept in Redis, [`Locks::set_fenced`] is that check:
//! one script compares the writer's fence with the highest seen for the key (kept
//! beside it, `{key}:fence-seen`), and writes only when it is at least as large.
//! [`Locks::set_fenced_with_ttl`] writes a value that expires, and its record of the
//! highest fence expires with it.
//!
//! ```no_run
//! # async fn f(locks: distlock::Locks) -> Result<(), distlock::Error> {
//! let guard = locks.lock("account:7").acquire().await?;
//! let fence = guard.fence().await?; // right before the write
//! // A holder paused past its lease comes back with a smaller fence than the next
//! // holder's: its write is refused with `StaleFence`, the next holder's value stays.
//! locks.set_fenced("balance:7", "120", fence).await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! In Postgres (feature `postgres`), `fencing::postgres::advance(&mut tx, resource,
//! fence)` records the fence in the caller's own transaction or fails with `StaleFence`,
//! and the transaction's writes roll back with it; the row lock it takes orders
//! concurrent writers, so a smaller fence never commits after a larger one. For other
//! storage the rule is the same: keep the highest fence seen beside the data, and refuse
//! a smaller one in the transaction that writes.
//!
//! ## Native commands
//!
//! Where the server has them (Redis 8.4+ `SET ... IFEQ`, `DELEX ... IFEQ`; Valkey 8.1+
//! `SET ... IFEQ`, 9.0+ `DELIFEQ`), detected once per connection, renewals, clean-ups,
//! an idempotency result's store and the uncontended release use them instead of
//! scripts; Lua is the fallback everywhere. The release's native compare-and-delete
//! answers 0 alike for a lost lock and for one a waiter of another client marked: the
//! release script then tells which (a second round trip, as with `unlock.lua` for a
//! marked lock).
//!
//! ## Waiting, fairness, lease keeping, reentrancy
//!
//! - **Woken, not polling.** The release script publishes on the lock's channel
//!   (`{lock:order:42}:released`) in the same round trip that deletes the key, when the
//!   channel has subscribers. All waiters of one [`Locks`] client share one Pub/Sub
//!   connection; a channel is subscribed while at least one waiter wants it. A missed
//!   message (or a holder that died without releasing) is covered by a fallback retry at
//!   most 100 ms apart, bounded by the holder's remaining lease. Where `SUBSCRIBE` is not
//!   allowed: [`LocksBuilder::notify_waiters`]`(false)`.
//! - **Fair within a process, handed down the queue.** Tasks of one client that want the
//!   same key queue locally in FIFO order and only the head contends in Redis. When the
//!   holder releases while a local task waits, the release script gives the lock straight
//!   to that task (its token and its ttl) in the same round trip. The queue
//!   never outlives the holder's lease.
//! - **Turns rotate across processes.** A client's turn hands the lock down at most once
//!   to each task that was waiting when the turn began. If another client waits then, the
//!   release leaves a yield marker `yield: <holder>:<id> ... ` for
//!   [`LocksBuilder::yield_window`] (default 10 ms) naming this client and the clients of
//!   the latest turns; every client it does not name takes the lock as free, so the client
//!   that has waited longest goes next. Not given: FIFO between tasks of different
//!   processes, and fairness towards clients built with `notify_waiters(false)`.
//!   `yield_window(Duration::ZERO)` turns rotation off. Other-language clients see the
//!   marker as a held key.
//! - **Lease keeping.** `renew = true` renews the lease every `ttl / 3` with a
//!   compare-and-extend; one task per client renews all its locks, in one pipeline per
//!   tick. `max_hold = "5m"` stops renewing after that long. When a renewal finds the lock
//!   lost, the body is cancelled at its next await (`on_lost = "cancel"`, the default) or
//!   runs on (`"continue"`), and the call returns `Lost`.
//!   `current_lock().unwrap().is_held()` tells the body whether it still holds the lock:
//!   `false` once the lease has ended by the client's clock (whatever the renewal task is
//!   doing meanwhile) or a renewal found it lost; `lost()` resolves then, and `fence()`
//!   answers `Lost` instead of the number it cached.
//! - **Reentrancy.** A nested call on a key the current task already holds through the
//!   same client passes through without a round trip and sees the same fence; only the
//!   outermost exit releases. Another task contends normally.
//!
//! ## Jobs that run on one instance
//!
//! A job that every instance schedules (a nightly report, a cleanup) should run once per
//! period. With `wait` left out, the instance that takes the lock runs the job and the
//! others get `Busy` and skip it. `min_hold` closes the remaining gap: a job that ends
//! in a second would release the lock, and an instance whose timer fires a little
//! later would run it again. With `min_hold = "5m"` the lock is kept by its lease until
//! five minutes after it was taken, however soon the body ends (a release before then
//! sets the lease instead of deleting the key, hands the lock to no waiter and wakes
//! none). Keep `min_hold` shorter than the period and no longer than `ttl`.
//!
//! ```no_run
//! use std::time::Duration;
//! use distlock::{distributed_lock, Error};
//!
//! #[distributed_lock(key = "job:nightly-report", ttl = "10m", min_hold = "5m")]
//! async fn nightly_report() -> Result<(), Error> {
//!     Ok(()) // build and send the report
//! }
//!
//! # async fn run() {
//! let mut every_hour = tokio::time::interval(Duration::from_secs(3600));
//! loop {
//!     every_hour.tick().await;
//!     match nightly_report().await {
//!         Ok(()) => {}
//!         Err(Error::Busy { .. }) => {} // another instance ran it this period
//!         Err(e) => eprintln!("report failed: {e}"),
//!     }
//! }
//! # }
//! ```
//!
//! A scheduler such as `tokio-cron-scheduler` calls the annotated fn the same way from
//! its job. `min_hold` covers timers that drift apart by less than its length; instances
//! further apart than that can each run the job in the same period.
//!
//! ## Semaphores
//!
//! `#[distributed_lock(key = "gpu:<pool>", permits = 4)]`, or
//! [`Locks::semaphore`](crate::Locks::semaphore) with the same builder as a lock: at most
//! `permits` holders of any client at once. Each permit is a lease of its own, so what a
//! lock does per holder a semaphore does per permit: a dead holder's permit frees itself
//! when its ttl ends, `renew`, `max_hold`, `on_lost` and `replicas` apply to it, and a
//! release that finds it gone (or its lease ended) is `Lost`. A freed permit wakes the
//! waiters by message; this client's waiters queue in FIFO order and only the first
//! contends in Redis. A task holding a permit that asks for the same semaphore again
//! re-enters the permit it has.
//!
//! The count is the caller's: after it is lowered in a deployment, holders taken under
//! the larger one keep their permits, and the smaller count applies as they are given
//! back. `permits = 0` and `min_hold` with `permits` are compile errors; a permit has no
//! fence (its holders run side by side) and Redlock refuses semaphores
//! ([`Error::Unsupported`](crate::Error::Unsupported), [`Error::Backend`](crate::Error::Backend)).
//!
//! ## Read/write locks
//!
//! `#[distributed_lock(key = "catalog:<shop>", mode = "read")]` (or `"write"`), or
//! [`Locks::read_lock`](crate::Locks::read_lock) and
//! [`Locks::write_lock`](crate::Locks::write_lock): readers of any client share, a
//! writer excludes readers and writers. Turns alternate: a writer that waits for the
//! readers to leave keeps new readers out (they queue behind it), so a steady stream of
//! readers never starves it; readers that waited behind a writer go before the next
//! writer. Each reader's share is a lease of its own (renewal, `max_hold`, `Lost` per
//! share; a crashed reader's share frees itself at its ttl); the last reader to leave
//! wakes a waiting writer by message, a writer's release wakes the readers. The write
//! lock is a lock (its fence, renewal and release) that never yields to other clients.
//!
//! In one task, a holder of the write lock may take the read lock of the same name (it
//! passes through), and a reader the read lock again; a reader asking for the write
//! lock gets [`Error::Unsupported`](crate::Error::Unsupported) at once, since it would
//! wait for its own share. No `min_hold`, no fence for a read share (compile errors
//! for `mode` with `permits` or `min_hold`), not over Redlock.
//!
//! ## Several locks at once
//!
//! `#[distributed_lock(keys = ["account:<from>", "account:<to>"])]`, or
//! [`Locks::multi_lock`](crate::Locks::multi_lock): every lock or none, whatever the
//! order they are named in, without deadlock. Where the keys live on one server (or
//! one slot of a cluster: a common hash tag, `{acct}:7`), the first try is one script
//! that takes all of them if all are free; otherwise, and once a key is found held,
//! they are taken one by one in the order of their full keys (so two callers never
//! hold one each while waiting for the other's), within one `wait`, and a key that
//! cannot be had gives back those taken.
//! [`MultiLockGuard::taken_at_once`](crate::MultiLockGuard::taken_at_once) says which
//! way a call went. The guard renews every key, is lost when any key is (`lost()`, and `Lost` at release), and releases
//! them all at once. A key named twice (`from == to`) is taken once. Compile errors: an
//! empty `keys`, a key written twice, an unknown placeholder in any key, `keys` with
//! `key`, `permits` or `mode`. Over Redlock, the ordered way on a quorum per key.
//!
//! ## Looking at locks, and releasing a stuck one
//!
//! [`Locks::inspect`](crate::Locks::inspect) shows what holds a lock, a semaphore or a
//! read/write lock, in one atomic read-only look: the holder (its token's UUID, host
//! and pid), the lease left, the last fence, whether waiters listen and marked the
//! holder's value, a yield marker, the permits and readers with their leases, a
//! waiting writer. [`Locks::force_release`](crate::Locks::force_release) deletes
//! whatever holds it and wakes other clients' waiters; the holders find their lock
//! gone at their release or next renewal and get `Lost`, as for any lock lost while
//! held.
//!
//! ```no_run
//! # async fn f(locks: distlock::Locks) -> Result<(), distlock::Error> {
//! let state = locks.inspect("order:42").await?;
//! if let Some(holder) = &state.holder {
//!     println!("held by {:?} pid {:?}, {:?} left", holder.host, holder.pid, state.lease_left);
//! }
//! # Ok(()) }
//! ```
//!
//! [`Locks::list`](crate::Locks::list) walks the keys with `SCAN` (every primary of a
//! cluster) and yields each held lock as `inspect` sees it;
//! [`Locks::idem_record`](crate::Locks::idem_record),
//! [`Locks::idem_records`](crate::Locks::idem_records) and
//! [`Locks::forget_idem`](crate::Locks::forget_idem) do the same for idempotency records.
//! The `distlock` command (crate `distlock-cli`, see the README) is these calls from a
//! shell.
//!
//! ## What each primitive writes
//!
//! One module, `lockcore::key`, owns the key space: every script, the in-memory backend,
//! `inspect`, `list`, `force_release`, `forget_idem` and the `distlock` command read the
//! layout from it. Every value is plain UTF-8 that `redis-cli` reads. A key's companions
//! share its hash slot and are named so that no name can address them: `{<key>}:<suffix>`
//! when the key has no hash tag (no key starts with `{`), `<key>{:<suffix>}` when it has
//! one (a name holds at most one `{...}`, so `{acct}:7:fence` is a lock of its own, never
//! `{acct}:7`'s fence counter).
//!
//! | primitive | key | value | companions |
//! |---|---|---|---|
//! | lock, write lock, multi-lock member | `lock:order:42` (string) | the holder's token `<uuid>:<host>:<pid>` (a write lock's UUID is of version 8, a lock's of version 4: how `inspect` and `distlock` tell a held write lock); `<token> waiting` while a waiter listens; `<token> kept` after a release before `min_hold`; `yield: <client ids> ` for a yield window | `:fence` (counter: expires after the fence idle window without a fence, a day by default), `:turns` (recent turns), `:released` (the wake-up channel) |
//! | read lock | `lock:catalog:7` (string) | `readers` while any reader holds, its ttl at least the longest share | `:readers` (sorted set of the readers' tokens, scored by their leases' ends), `:writer` (a waiting writer's token, a few hundred ms), `:readers-waiting` (readers that wait behind a writer), `:released` |
//! | semaphore | `lock:gpu:eu` (sorted set) | each holder's token, scored by when its lease ends (ms since the epoch, the server's clock), and the limit, `limit:<n>` scored `+inf` (the count of the latest acquire that took a permit: clients that count differently overwrite each other's); the key expires with the last lease, and goes with the last permit's release | `:released` |
//! | idempotency record | `lock:idem:<module::fn>[:<scope>]:<key>` (string) | JSON: the claim (owner, fingerprint, lease), then the stored result appended after it | `:done` (the wake-up channel) |
//! | fenced value | the key given, outside the lock prefix | the value | `:fence-seen` (the highest fence; the value's ttl, or none when the value has none) |
//!
//! How kinds meet on one name, alike on Redis, Valkey and in memory:
//!
//! - a lock, a write lock and a multi-lock exclude each other and the readers by design:
//!   each waits for the others (`Busy` when its `wait` runs out), since readers keep
//!   `readers` at the key;
//! - a semaphore and any other kind refuse each other: the second gets
//!   [`Error::WrongKind`](crate::Error::WrongKind) naming both (`` `lock:gpu` is held
//!   as a semaphore, so it cannot be taken as a lock ``), and nothing is taken;
//! - names under `idem:` are records', not locks' ([`Error::InvalidKey`]); a record's
//!   operations (`idem_record`, `forget_idem`) take record keys only, and `forget_idem`
//!   deletes a record and nothing else; a fenced value's key may not start with the lock
//!   prefix nor be a companion.
//!
//! ## Errors
//!
//! | variant | when | the body |
//! |---|---|---|
//! | `Busy { key, waited }` | held by someone else until `wait` ran out | did not run |
//! | `Lost { key }` | at release the key was gone (ttl expired) or held another token | ran and returned `Ok`, which is replaced by this error; an `Err` of the body is kept and the loss logged |
//! | `Backend { key, source }` | Redis unreachable, failing, or silent past the command timeout (default 1 s): never a hang | did not run (acquire) or ran (release) |
//! | `InvalidKey { key, reason }` | an empty key, braces that would split the lock from its companions across hash slots or name a companion, a name under `idem:` | did not run |
//! | `WrongKind { key, held, asked }` | the name is held as a kind that refuses this one (a semaphore and a lock, say) | did not run |
//! | `NotReplicated { key, acked, wanted }` | with `replicas = n`: fewer replicas acknowledged the lock (Redis `WAIT`, up to half the command timeout); the lock was given back | did not run |
//! | `Unsupported { key, reason }` | a request that cannot be served as asked: a semaphore of 0 permits or with `min_hold` (runtime API), a permit's fence | did not run |
//!
//! A release whose reply is lost is retried once. A retry that finds the key no longer
//! holding the token while the lease cannot have ended yet (by the client's clock,
//! counted from the send of the try that took the lock or of the last renewal, less a
//! margin of 2 ms + 1 % of the ttl), with no broken connection and no restart or failover
//! seen since (the server's `run_id`, read on every new connection; where an ACL refuses
//! `INFO`, the least-privilege `+@all -@dangerous`, every new connection and every idle
//! connection found closed counts as a possible restart), knows the first try released
//! it, and reports success; otherwise it cannot tell a release from an expiry or a lost
//! key, and the result is `Backend` (never a false `Lost`, never a silent `Ok`).
//!
//! Nothing depends on `INFO`, `CONFIG` or `CLIENT` succeeding: a least-privilege user
//! gets native commands found through `HELLO`, and one warning each where `INFO` (restart
//! detection, above) or `CONFIG GET maxmemory-policy` (the eviction check) is refused.
//! The rule assumes a monotonic clock that runs while the host is suspended for no longer
//! than the ttl, and a server clock that does not jump. An acquire whose reply is lost is
//! followed by a compare-and-delete of its token.
//!
//! ## Keys
//!
//! Placeholders name any binding of the parameter patterns, with field paths; values are
//! formatted with `Display` and escaped (`%`, `:`, `{`, `}`, whitespace and control
//! characters become `%XX`), so user data can neither add key segments nor pick a hash
//! slot. Literal `{...}` in the template is a hash tag: `key = "tenant:{<tenant>}:<id>"`.
//! Mistakes are compile errors on the offending token; the function is still emitted, so
//! IDEs keep working.
//!
//! ## Where it works
//!
//! Free async fns, methods (`&self`, `&mut self`, `self: Arc<Self>`), generic fns, fns
//! taking `impl Trait`, methods in `#[async_trait]` impls, and axum / actix-web handlers
//! (the future stays `Send` when the body is).
//!
//! ## Connections
//!
//! [`Locks`] is cheap to clone: all clones share one multiplexed connection per tokio
//! runtime, reopened when it breaks. While fewer than three calls of the client are in
//! flight, a lock's call goes over one of up to four direct connections instead, whose
//! caller writes the command and reads its own reply (a round trip without the
//! multiplexed connection's task wake-ups); more calls at once share the multiplexed
//! connection, which pipelines them. Idempotency records always go over the multiplexed
//! connection: their one or two calls are a small part of an HTTP request's time, and
//! the calls of concurrent requests share its socket reads and writes, which costs Redis
//! less CPU per call. A call that times out or is cancelled closes the direct
//! connection it used, so its late reply is never read as another call's; one that Redis
//! closed while idle is noticed before use. Direct connections authenticate and select
//! the database from the URL, work over `unix://` and over TLS (feature `tls`, not with
//! `insecure`), and show as `name=distlock-direct` in `CLIENT LIST`. A client keeps the
//! connections of up to 64 runtimes (one shared by every actix-web worker makes no
//! storm), and a runtime takes another's idle direct connection only when it has gone
//! unused for 2 s. Writes that wait for replicas (`WAIT`) never share a connection with
//! other calls: a direct one (to the primary behind Sentinel, to the slot's owner on a
//! cluster), kept for the next.
//!
//! What a server's error reply means, decided in one place for the shared connection,
//! the direct ones and the connection to a Sentinel's primary:
//!
//! | reply | the connection | the client | the caller sees |
//! |---|---|---|---|
//! | `ERR unknown command`, a syntax error for an option the server lacks, `NOPERM` | kept | that capability off (native commands, `SET NX GET`) until the next connection's look at the server | the call through the scripts |
//! | `BUSY`, `LOADING`, `MASTERDOWN`, `OOM` | kept | capabilities kept | `Backend` (the command did not run; retry later) |
//! | `READONLY` (a demoted primary: a failover, an endpoint name that moved) | closed, with the idle direct connections | a possible restart counted: every renewed lock is checked at once; the next connection finds the primary | `Backend` |
//! | `WRONGTYPE` (a name taken by another kind) | kept | capabilities kept | an acquire: `WrongKind`; a release or renewal: `Lost` |
//! | a broken connection | closed | a possible restart counted, as above | `Backend` |
//! | no reply within the command timeout | a direct one closed; the shared one kept and checked (a `PING` of its own, the calls that need it waiting for the verdict), closed only if it gets no answer, or another reply, within half the command timeout; a cluster's kept | where closed, and on a cluster: a possible restart counted, as above | `Backend` (`Timeout`) |
//! | `MOVED`, `ASK`, `TRYAGAIN` (a cluster) | kept | the slot map read again | followed, or waited out, within the call |
//!
//! On a Redis Cluster, one cluster connection per client serves every runtime: it is
//! made and driven on one thread of the library's own (`distlock-cluster`), so a node
//! that hangs does not keep a new runtime (or the renewal task) from using the cluster.
//! While a slot migrates and a lock key and its companions (`{key}:fence`,
//! `{key}:turns`, a read lock's `{key}:readers`) are split between the two nodes
//! (`TRYAGAIN`), fences, releases and read shares' renewals run on one key at a time
//! instead of waiting for the migration. A renewal batch judges each lock on its own:
//! one primary that hangs costs the locks on it alone.
//!
//! ## Redis Cluster
//!
//! [`Locks::cluster`] (or the URL `redis+cluster://host1:7000,host2:7001`, also in
//! `REDIS_URL`) runs both attributes unchanged on a Redis Cluster (7.0+). A lock's keys
//! (the key, `{key}:fence`, `{key}:turns`, the wake-up channel `{key}:released`) and an
//! idempotency record's share one hash slot; waiters are woken with sharded Pub/Sub on
//! the node that owns it. Redirects (`MOVED`, `ASK`) and `TRYAGAIN` during a slot's
//! migration are followed within the command timeout; the redis-rs cluster client's own
//! retries are off, since a command it re-sent after an I/O error could run twice (a
//! release that already deleted its key would then report the lock lost). Each call goes
//! over one cluster connection per tokio runtime, and while few calls are in flight over
//! direct connections to the primary that owns the key's slot (read with `CLUSTER
//! SLOTS`, read again after a redirect); `replicas = n` waits on the connection to the
//! slot's primary that other calls share.
//!
//! ## Sentinel
//!
//! [`Locks::sentinel`] (or `redis+sentinel://host1:26379,host2:26379/mymaster`;
//! `rediss+sentinel://` or `rediss://` sentinels for TLS to the sentinels and the primary,
//! with the same certificates) asks the
//! sentinels for the primary when it connects, and asks again after a connection error,
//! a `READONLY` reply (the primary was demoted) or a `+switch-master` message, without a
//! new client. During a failover calls fail with `Backend` within their timeout. A lock
//! written to a primary that dies before replicating it is gone on the promoted replica:
//! its holder gets `Lost` at release (or renewal), and a second holder may already be in;
//! `replicas = 1` closes that hole.
//!
//! ## Redlock
//!
//! [`Locks::redlock`] takes each lock on a quorum of independent masters (see its docs
//! for the algorithm). It gives no fencing tokens (`fence()` returns an error saying
//! so), no idempotency records and no `replicas`: those need one Redis, Sentinel or a
//! cluster.
//!
//! ## Testing without Redis
//!
//! [`Locks::in_memory`] keeps locks in the process with the same ttl, token, fencing,
//! `Busy` and `Lost` rules: `distlock::install(Locks::in_memory())` in a unit test. It is
//! never chosen implicitly.
//!
//! ## Tracing and events
//!
//! Every lock and idempotency step is an [`Event`] (acquired, busy, fenced, released,
//! lost, renewed, renewal failed, claimed, replayed, in progress, mismatch, stored, not
//! stored, and the failures), emitted at one point: a `tracing` line under target
//! `distlock` with the key, the time waited or held and the outcome, then the observer
//! given to [`LocksBuilder::observer`] (a metrics exporter, an audit trail), if any.
//! Arguments and payloads are never recorded.
//!
//! ## Spans
//!
//! Each annotated call runs in a span, at INFO under target `distlock`, that a
//! `tracing-opentelemetry` layer exports as it is: `distlock.lock` (fields
//! `distlock.key.template`, `distlock.key`, `distlock.fence` once one is given,
//! `distlock.outcome`: `released`, `busy`, `lost`, `error`, `release_failed`,
//! `distlock.waited_ms`, `distlock.held_ms`) and `distlock.idempotent`
//! (`distlock.function`, `distlock.key`, `distlock.outcome`: `claimed`, `replayed`,
//! `in_progress`, `mismatch`, `claim_failed`), with `otel.kind = "internal"`. Each Redis
//! call is a child span at DEBUG named `redis`, with OpenTelemetry's database-client
//! fields: `otel.name` and `db.operation.name` (`SET`, `EVALSHA`, `PIPELINE`, ...),
//! `otel.kind = "client"`, `db.system.name = "redis"`, `server.address`, `server.port`.
//! Their fields are computed only when a subscriber wants the span; arguments are never
//! recorded.
//!
//! ## Metrics
//!
//! With the `metrics` feature, distlock records through the [`metrics`
//! facade](https://docs.rs/metrics/0.24) (nothing is recorded until the application
//! installs a recorder, such as `metrics-exporter-prometheus`; without the feature
//! nothing is compiled in). Every series is labelled by the key's template (the
//! attribute's `key` as written, or [`LockRequest::template`] on the manual API) or the
//! idempotent function, never by the key, so the number of series does not grow with
//! the data. The axum example serves them on `/metrics`.
//!
//! | name | type | labels | moves when |
//! |---|---|---|---|
//! | `distlock_lock_acquisitions_total` | counter | `template`, `outcome` (`acquired`, `busy`, `error`) | an acquisition ends |
//! | `distlock_lock_wait_seconds` | histogram (s) | `template`, `outcome` (`acquired`, `busy`) | an acquisition ends: from the call to held, or to giving up |
//! | `distlock_lock_held_seconds` | histogram (s) | `template` | a lock is released (or kept by `min_hold`): from acquired to released |
//! | `distlock_lock_handoffs_total` | counter | `template`, `via` (`local`: handed by this process's holder; `cross_process`: taken after waiting for another's) | a waiter gets the lock |
//! | `distlock_lock_lost_total` | counter | `template`, `found_at` (`release`, `renewal`, `fence`, `lease end`, `max_hold`) | a lock is found lost while held |
//! | `distlock_lock_release_failures_total` | counter | `template` | a release fails or its outcome cannot be told |
//! | `distlock_lock_renewals_total` | counter | `template`, `outcome` (`renewed`, `failed`) | the watchdog renews a lease, or a renewal fails (retried while the lease lasts) |
//! | `distlock_lock_fences_total` | counter | `template` | a fencing token is given |
//! | `distlock_lock_waiting` | gauge | `template` | a task starts or stops waiting for a lock (in this process's line or for another process) |
//! | `distlock_idem_calls_total` | counter | `function`, `outcome` (`claimed`, `replayed`, `in_progress`, `mismatch`, `error`) | an idempotent call's claim is decided |
//! | `distlock_idem_takeovers_total` | counter | `function` | a claim whose claimer stopped renewing it is taken over (the body runs again) |
//! | `distlock_idem_stored_total` | counter | `function` | a result is stored |
//! | `distlock_idem_not_stored_total` | counter | `function` | a result is not stored (the claim was lost, or Redis failed) |
//! | `db.client.operation.duration` | histogram (s) | `db.system.name` (`redis`), `db.operation.name` (`SET`, `EVALSHA`, `PIPELINE`, ...) | each Redis call a client makes, timed out ones too (OpenTelemetry's name) |
//!
//! `template` is the attribute's key template as written (`stock:<sku>`; a multi-lock's
//! joined by `, `), or what `LockRequest::template` gave (`(unnamed)` without it);
//! `function` is the idempotent function's path (`app::orders::pay`).
//!
//! # Feature flags
//!
//! None is on by default. On docs.rs every feature is on, and each item that needs one
//! says which.
//!
//! | Feature | What it adds |
//! |---|---|
//! | `axum` | `#[idempotent(header = ...)]` on axum 0.8 handlers; `IntoResponse` for [`Error`] (RFC 9457 problem responses) |
//! | `actix` | the same on actix-web 4 handlers; `ResponseError` for [`Error`] |
//! | `tls` | `rediss://` and `rediss+cluster://` URLs through rustls (no OpenSSL), a custom CA and client certificates (`LocksBuilder::tls_root_cert`, `tls_client_cert`, `tls_from_env`) |
//! | `postgres` | fences that Postgres checks in the caller's own transaction: [`fencing::postgres`] (`install`, `advance`), on sqlx 0.8 |
//! | `metrics` | metrics through the `metrics` 0.24 facade, labelled by the key's template (see [Metrics](#metrics)) |
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub use lockcore::{
    BackendError, BackendErrorKind, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FENCE_IDLE_WINDOW, DEFAULT_PREFIX, DEFAULT_TTL, Error, Event, LockGuard, LockInfo,
    LockRequest, Locks, LocksBuilder, MultiLockGuard, MultiLockRequest, Result, current_lock,
    fencing, install, key,
};
pub use lockcore::{
    Captured, IdemRequest, IdemResponse, MAX_KEY_LEN, RECORDED_METHODS, REPLAYED_HEADER,
    idempotency,
};
pub use lockcore::{Holder, LockState, Share};

/// Runs an `async fn` alone across every process that shares one Redis.
///
/// ```no_run
/// # #[derive(Debug)] struct AppError;
/// # impl From<distlock::Error> for AppError { fn from(_: distlock::Error) -> Self { AppError } }
/// #[distlock::distributed_lock(key = "order:<id>", ttl = "30s", wait = "3s")]
/// async fn ship(id: u64) -> Result<(), AppError> {
///     Ok(())
/// }
/// ```
///
/// expands to about what you would write by hand:
///
/// ```no_run
/// # #[derive(Debug)] struct AppError;
/// # impl From<distlock::Error> for AppError { fn from(_: distlock::Error) -> Self { AppError } }
/// # use std::time::Duration;
/// async fn ship(id: u64) -> Result<(), AppError> {
///     let key = format!("order:{id}"); // placeholders are escaped, see below
///     let locks = distlock::__private::default_locks()?;
///     let guard = locks
///         .lock(key)
///         .ttl(Duration::from_secs(30))
///         .wait(Duration::from_secs(3))
///         .acquire()
///         .await?; // Err(Busy) without running the body
///     let out: Result<(), AppError> = guard.scope(async move { Ok(()) }).await;
///     match guard.release().await {
///         Ok(()) => out,
///         Err(lost) if out.is_ok() => Err(lost.into()),
///         Err(_) => out, // the body's own error wins; the loss is logged
///     }
/// }
/// ```
///
/// # Arguments
///
/// | argument | default | meaning |
/// |---|---|---|
/// | `key = "order:<id>"` | required | the lock name; `<binding>` or `<binding.field>` interpolates a parameter |
/// | `ttl = "30s"` | `30s` | lease: how long the lock stays if never released |
/// | `wait = "3s"` | none | how long to keep trying while someone else holds it |
/// | `renew = true` | `false` | keep the lease while the body runs (renewed every `ttl / 3`) |
/// | `max_hold = "5m"` | none | with `renew`: stop renewing after this long |
/// | `min_hold = "5m"` | none | keep the lock this long after it was taken even when the body ends sooner (by its lease: at most `ttl`); see "Jobs that run on one instance" |
/// | `on_lost = "continue"` | `"cancel"` | with `renew`: when a renewal finds the lock lost, cancel the body at its next await (`"cancel"`) or let it finish (`"continue"`); either way the call returns `Lost` |
/// | `replicas = 1` | the client's ([`LocksBuilder::replicas`], 0) | replicas that must acknowledge the lock once taken, and its fence once given (Redis `WAIT`); fewer: the lock is given back and the call returns `NotReplicated`, the body does not run. Closes the failover hole of asynchronous replication as far as `WAIT` can (it is not consensus; fencing stays the final guard) |
/// | `client = expr` | installed / `REDIS_URL` | a `Locks`, `&Locks` or `Arc<Locks>` to use instead |
/// | `crate = "path"` | `::distlock` | where the `distlock` crate is, if renamed |
///
/// Durations are whole numbers with units `ms`, `s`, `m`, `h`, `d`, combinable (`1m30s`).
///
/// # Keys
///
/// A placeholder names any binding the parameter patterns introduce, including
/// destructured ones (`Path(id): Path<u64>`, `Json(order): Json<Order>`) and `self`; field
/// paths (`<order.customer.id>`, `<path.0>` for actix's `path: web::Path<(u32, u32)>`,
/// whose field is private and cannot be destructured) work. The value is formatted with `Display` and escaped so it
/// cannot change the key's shape: `%`, `:`, `{`, `}`, whitespace and control characters
/// become `%XX` (see [`key`]). Literal `{...}` in the template is a Redis Cluster hash tag.
///
/// # Errors
///
/// The function must return `Result<T, E>` (or an alias) with `E: From<distlock::Error>`.
/// `Busy`: not acquired within `wait`, the body did not run. `Lost`: the body returned
/// `Ok` but the lock had expired or been taken before release. `Backend`: Redis failed
/// within the command timeout.
///
/// # Waiting, fairness, reentrancy
///
/// Waiters are woken by a message published in the release script (one Pub/Sub
/// connection per client), with a fallback retry at most 100 ms apart. Tasks of one
/// process queue for a key in FIFO order; only the head contends in Redis, and a release
/// hands the lock to the next local task in the same round trip. Across processes, turns
/// rotate (see [`LocksBuilder::yield_window`]). A nested call
/// on a key the task already holds through the same client runs without a round trip,
/// and only the outermost exit releases. See [`Locks::lock`].
///
/// Mistakes are compile errors: an unknown placeholder (with the available bindings),
/// a malformed template, a bad or zero duration, a missing `key`, an unknown or repeated
/// argument, a non-async fn, a return type that is not a suitable `Result`, and a
/// placeholder whose type is not `Display`.
pub use lockmacro::distributed_lock;

/// Runs an async fn, or an axum / actix-web handler, once per key across every process
/// that shares one Redis; every repeat gets the first result back.
///
/// ```no_run
/// # #[derive(Debug)] struct AppError;
/// # impl From<distlock::Error> for AppError { fn from(_: distlock::Error) -> Self { AppError } }
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Receipt { charged: u64 }
///
/// /// A payment provider retries this callback; the card is charged once.
/// #[distlock::idempotent(key = "pay-callback:<notify_id>", ttl = "24h")]
/// async fn on_paid(notify_id: String, amount: u64) -> Result<Receipt, AppError> {
///     Ok(Receipt { charged: amount })
/// }
/// ```
///
/// On a handler (features `axum` or `actix`), the key comes from a request header; the
/// attribute adds the extractor itself and the handler's return type becomes
/// [`IdemResponse`]:
///
/// ```no_run
/// use axum::{Json, extract::Path};
/// # #[derive(serde::Serialize, serde::Deserialize)] pub struct Order { qty: u32 }
/// // `scope`: the key is the caller's own, not shared with every caller who knows it.
/// #[distlock::idempotent(header = "Idempotency-Key", scope = "<user>")]
/// async fn create(Path(user): Path<u64>, Json(order): Json<Order>) -> (axum::http::StatusCode, String) {
///     (axum::http::StatusCode::CREATED, format!("order for {user}"))
/// }
/// ```
///
/// **Scope every public endpoint by its caller.** A record is shared by every caller who
/// sends its key: without `scope`, another user who learns (or guesses) a key and sends
/// the same payload gets the first caller's stored response, and a key claimed first by
/// someone else answers for it. Write `scope = "<user_id>"` (or the account, the tenant:
/// whatever identifies the caller, taken from an authenticated binding), as payment APIs
/// scope idempotency keys per account. Handlers (`header = ...`) must have a `scope`; where
/// callers are meant to share records, such as one provider's webhook, say so with a
/// literal: `scope = "provider-webhooks"`.
///
/// # Arguments
///
/// | argument | default | meaning |
/// |---|---|---|
/// | `key = "pay:<id>"` | | async fns: the key, a template like `#[distributed_lock]`'s (same escaping and checks) |
/// | `header = "Idempotency-Key"` | | handlers: the key is this request header's value |
/// | `scope = "<user_id>"` | none; required with `header` | a template added to the key: who the record belongs to (the caller, account or tenant); belongs on every public endpoint, see above |
/// | `ttl = "24h"` | `24h` | how long a completed record is kept and replayed, counted from the end of the claim's lease (the claim or its last renewal, plus the lease): a result stored while its lease lasts is kept at least this long, and at most the lease longer |
/// | `lease = "30s"` | `30s` | how long a claim survives without renewal (a crashed caller blocks the key this long); renewed every `lease / 3` while the body runs |
/// | `wait = "5s"` | none | a repeat that arrives while the first call runs waits this long for its result instead of getting `InProgress` |
/// | `required = false` | `true` | handlers: run without idempotency when the header is missing, instead of `MissingKey` |
/// | `fingerprint = [a, b]` | every binding | fns: the bindings whose values make up the payload fingerprint |
/// | `skip = [pool]` | none | fns: bindings left out of the fingerprint (not part of the payload) |
/// | `max_body = "1MiB"` | `1MiB` | handlers: larger responses, and streams, pass through unbuffered and are not stored; fns: an `Ok` value whose JSON is larger is not stored (the first call gets it, repeats get `Unrepresentable`, the body never runs again under the key) |
/// | `name = "email-notify"` | `module::path::fn` | the records' namespace: required on methods (the methods named alike of two types in one module would share one), and how any fn keeps its records across a rename or a move; two fns found sharing a namespace at run time get a `Backend` error naming both |
/// | `detach = false` | `true` | run the body in the caller's future even where it could run in a task of its own; see "When the caller goes away" |
/// | `on_lost = "continue"` | `"cancel"` | when a renewal finds the claim lost (its lease ended and another call took it over, or no renewal succeeded for a whole lease), cancel the body at its next await (`"cancel"`) or let it finish (`"continue"`); either way nothing is stored and the call returns `Lost` (HTTP 500) |
/// | `replicas = 1` | the client's ([`LocksBuilder::replicas`], 0) | replicas that must acknowledge the claim and the stored result (Redis `WAIT`). A claim acknowledged by fewer is given back and the body does not run; a result acknowledged by fewer stays stored on the primary and the call returns `NotReplicated` (HTTP 503 with `Retry-After: 1`), so a retry replays it unless a failover lost it |
/// | `client = expr` | installed / `REDIS_URL` | a `Locks`, `&Locks` or `Arc<Locks>` |
/// | `crate = "path"` | `::distlock` | where the `distlock` crate is, if renamed |
///
/// Exactly one of `key` and `header` is required.
///
/// # The record
///
/// One plain UTF-8 value per key at `<prefix>idem:<module::path::fn>[:<scope>]:<key>`
/// (e.g. `lock:idem:shop::pay::on_paid:pay-callback:N-1`; a fn's rendered key or scope
/// longer than 255 bytes is written `sha256:<hex>` of it), readable with `redis-cli GET`:
/// while the body runs `{"status":"in_progress","owner":..,"fp":..,"lease_until_ms":..,
/// "retention_ms":..}` (its lease is the key's ttl minus the retention); the store then
/// appends `{"status":"completed","fp":..,"value":..}` (fns) or `..,"response":{"status":..,
/// "headers":[..],"body":..}` (handlers). The first completed record in the value is the
/// result: a store never writes over another's. A claim is one plain `SET ... NX GET` (a
/// replay is that one command) and a store is one `MULTI` of plain commands (`SET ... NX
/// PX` for a key gone meanwhile, `APPEND`, and a `GETRANGE` that shows the claim's own
/// record was in front); a claim in progress, release and renew are each one Lua script
/// that checks the owner token. A result is not stored in front of another payload's
/// claim (one made after the key was lost): that call gets `Lost`. See [`idempotency`]
/// for the state machine.
///
/// Instances that share records must read the same format. This version reads records
/// written by earlier ones (a completed record alone), but earlier versions cannot read
/// an appended record (they answer an error, HTTP 500, until it expires) and may write
/// over it: deploy to every instance at once, and do not roll back while appended
/// records are kept.
///
/// # What happens
///
/// | the record | the call |
/// |---|---|
/// | none, or in progress past its lease (the claimer crashed), same payload | claims it and runs the body |
/// | completed, same payload | replays the stored result; the body does not run |
/// | completed or in progress (past its lease too), different payload | `Err(PayloadMismatch)` (HTTP 422): a claimer that crashed may already have acted on its payload |
/// | in progress | `Err(InProgress)` (HTTP 409 with `Retry-After`: about how long a body of that fn took lately in this process, 1 s before one completed, never more than the running call's lease left); with `wait`, waits (woken by a Pub/Sub message on `<record>:done`) and replays |
/// | unknown: Redis down, or no reply to the claim within the command timeout | `Err(Backend)` (HTTP 503 with `Retry-After: 1`) within the command timeout (on Redlock, up to about two); the body does not run. A claim that may have landed meanwhile is given back, best effort (a give-back that fails is not tried again: the claim then ends with its lease, and retries meanwhile get `InProgress`) |
///
/// - Async fns return `Result<T, E>` with `T: Serialize + DeserializeOwned` and
///   `E: From<distlock::Error>`. `Ok` is stored (including `()`); `Err` and a panic
///   release the claim so a retry runs the body. A value is stored only if it reads
///   back from its JSON as itself (the same serde calls, and equal by `T`'s `PartialEq`
///   when it has one): `Some(None)` (JSON `null`, read back as `None`), an
///   `#[serde(untagged)]` enum's variant that reads back as another, or a value whose
///   `#[serde(skip)]` field is not its default, is kept as unstorable, and repeats get
///   `Unrepresentable` instead of another value. Derive `PartialEq` for an untagged
///   enum: without it the two variants cannot be told apart.
/// - Handlers: the status, headers and body are stored when the status is below 500 and
///   not 408, 409, 425 or 429, and the body is known to be at most `max_body` bytes long;
///   otherwise the claim is released. A body of unknown length (a stream, server-sent
///   events) or a longer one streams through to the client as it comes, unbuffered, and
///   is not stored.
///   Replays carry `Idempotent-Replayed: true` and never `Set-Cookie`, `Date` or
///   hop-by-hop headers.
/// - Bad keys never reach Redis: no header is `MissingKey` (400); an empty one, one over
///   255 bytes or one with characters outside visible ASCII is `InvalidKey` (400) saying
///   what is wrong. Header values are escaped like placeholders.
///
/// # The payload fingerprint
///
/// A key reused with another payload is `PayloadMismatch` (422), never a replay of
/// someone else's result. What the payload is:
///
/// - **Fns** (`key = ...`): every parameter binding. Each must be `Serialize`, or its
///   parameter a known non-payload type (`State`, `Extension`, `web::Data`, a `Locks`),
///   or be listed in `skip = [...]`; any other binding is a compile error naming it. A
///   `HashSet` argument is hashed sorted.
/// - **Handlers** (`header = ...`): the request as sent, whatever the handler's types
///   for it: the method, matched route, path (its parameters), query (decoded pairs, in
///   any order) and body (canonical JSON when it is JSON, else its bytes). The body is
///   read whole before the handler's extractors get it, whichever reads it (a `Json`, a
///   `Bytes`, a stream such as `web::Payload` or axum's `Body`): with axum by the
///   handler's last parameter, which the attribute wraps, within `DefaultBodyLimit`
///   (413 beyond); with actix-web by the attribute's request extractor, up to 16 MiB
///   (413 beyond).
///
/// Numbers are compared as JSON numbers (`1`, `1.0` and `1e0` are one). Only `POST`,
/// `PUT`, `PATCH` and `DELETE` ([`RECORDED_METHODS`]) are recorded: `GET`, `HEAD` and
/// the other safe methods run the handler without a record. See
/// [`idempotency::fingerprint`] for exactly what is hashed.
///
/// # When the caller goes away
///
/// A client that disconnects, or a timeout around the call, drops the caller's future.
/// That must not make the retry run the body a second time, so:
///
/// - **The call runs in a task of its own** where it can: an `async fn` (handler or not)
///   whose parameters are owned (no `&`, no lifetime, no `impl Trait`, no generics, no
///   `self`, no `Self`, no `#[cfg]` on a parameter). The body and the store of its
///   result run to their end; the retry gets the result (or `InProgress` while it still
///   runs). A plain fn's claim runs in that task too. A handler claims in the caller's
///   task and spawns the rest once it holds the claim, so a replay or a rejection takes
///   no task; a handler dropped before its body started (while its claim was in flight,
///   or while replicas acknowledged it; waiting for a `#[distributed_lock]` under the
///   claim counts as the body) gives the claim back in a task of its own: a
///   retry that comes before the give-back lands gets `InProgress`, one after runs the
///   body. The task has the caller's `tracing` span but not its task-locals. A
///   `Send` call is spawned with `tokio::spawn`; an actix-web handler runs on its worker
///   thread (spawned on the worker's `LocalSet`, or in the caller's future when there is
///   none, as under `actix_web::test` on a plain tokio runtime). A panic in it is resumed
///   in the caller. An fn whose body is not `Send`, or that is called inside a held
///   `#[distributed_lock]` (or `LockGuard::scope`), stays in the caller's task.
/// - **Otherwise** (the body borrows from its arguments, or `detach = false`) the body
///   can only stop with its caller. It may have done part of its work, so the claim is not
///   released: it stays in progress until its lease ends (repeats get `InProgress`), and
///   a later call then takes it over and runs the body.
/// - Once the body has run, capturing its response and storing the record go on in a task
///   of their own too, whichever the case: a drop there never leaves the key in progress.
/// - **At a deploy** those tasks die with their runtime. Before it shuts down, after the
///   server stopped taking requests, [`idempotency::drain`]`(within)` waits for every
///   detached call, store and give-back of the process and says how many were still
///   running: with axum after `axum::serve(..).with_graceful_shutdown(..)` returns; with
///   actix-web between `ServerHandle::pause()` and `ServerHandle::stop(true)` (the
///   handlers run on the workers' runtimes). Both examples do so.
///
/// `detach = false` keeps the body in the caller's future. It is needed by an associated
/// fn that uses its impl's type parameters (the body moves into a nested fn, which cannot
/// name them), by a parameter type with a lifetime it does not write out (`Cow<str>`:
/// write `Cow<'_, str>`, or `detach = false`), and by a call made while holding a lock
/// acquired by hand without `scope` (a detached body would outlive the guard).
///
/// # With `#[distributed_lock]`
///
/// Both orders expand the same way: the claim is taken first, then the lock, then the
/// body runs. We recommend writing `#[idempotent]` on top, which reads in that order:
/// repeats are answered from the record without touching the lock, and a body that
/// failed to get the lock (`Busy`) releases its claim so a retry can run.
///
/// # Errors
///
/// `InProgress`, `PayloadMismatch`, `MissingKey`, `InvalidKey` and `Backend`; through
/// `E` for fns, as RFC 9457 `application/problem+json` responses for handlers.
/// Mistakes in the arguments are compile errors on the offending token.
pub use lockmacro::idempotent;

#[doc(hidden)]
pub mod __private {
    pub use lockcore::__private::*;
}

/// The README's code blocks, compiled as doctests (they need the `axum` and `postgres`
/// features).
#[cfg(all(doctest, feature = "axum", feature = "postgres"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
