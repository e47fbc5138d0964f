//! Shared limits on Redis: the per-IP limit and the per-host caps, for the
//! whole fleet of replicas.
//!
//! - **Connection.** One [`RedisBackend`] serves both forms of `[redis]`:
//!   `url` (one server) and `cluster_nodes` (a Redis Cluster's seed nodes).
//!   An internal enum of the two connection kinds — a
//!   `redis::aio::ConnectionManager` (multiplexed, reconnecting) or a
//!   `redis::cluster_async::ClusterConnection` (a multiplexed connection per
//!   node; it follows `MOVED`/`ASK`, refreshes its slot map and reconnects) —
//!   implements `redis::aio::ConnectionLike` by delegation, so the scripts,
//!   the breaker, the timeouts and `failure_mode` are one code path for both.
//!   It connects lazily: a Redis (or a whole cluster) that is down at start-up
//!   does not stop start-up. A cluster connection is seeded not with
//!   `cluster_nodes` but with the nodes the first of them to answer lists in
//!   `CLUSTER SLOTS` (the client waits for every seed, and a hung one takes
//!   all of `timeout_ms` to fail). Every call is bounded by `timeout_ms`; the
//!   cluster client's own retries (a redirect, a reconnect, `TRYAGAIN`,
//!   `CLUSTERDOWN`) happen inside that bound.
//! - **Cluster slots.** Every script and command touches exactly one key
//!   (`KEYS[1]`; the give-back's `HDEL` of one key), so each runs whole on the
//!   master owning that key's slot and no key needs a hash tag; the keys
//!   spread over the masters by their full names (`<prefix>:ip:<client>`,
//!   `<prefix>:shares:<HOST:PORT>`). A script that ever touches two keys must
//!   give them one hash tag (`{…}`). A `{…}` in `key_prefix` would become
//!   every key's tag: still correct, but all the state on one master. The
//!   cluster client may send a script again after a lost reply, so it may
//!   run twice: a claim sets its replica's share absolutely, so twice is
//!   once; a per-IP check run twice charges its client once more.
//! - **Breaker** (`src/backends/breaker.rs`). A failed or timed-out call
//!   opens it: for at least `backoff_ms`, calls skip Redis and `failure_mode`
//!   applies at once — no `timeout_ms` paid, connection refused included. One
//!   background probe per `backoff_ms` closes it again; each change is logged
//!   once. The probe is `TIME` on one server — sent twice when the first
//!   fails on a lost connection, since the connection manager answers the
//!   first call after an outage with the reconnect it made while Redis was
//!   down, so the first probe after a restart gets through and the limits
//!   resume within `backoff_ms` and one call; one still failing `lease_ms`
//!   after the breaker opened drops the connection, so a silently dead one
//!   is replaced (by then no share it carried is live). On a cluster the
//!   probe is a new connection, which replaces the current one if it asks
//!   every master serving slots for its `TIME` (`CLUSTER SLOTS` from any
//!   node, then a one-line script to each master, sent with a key of its
//!   slots so it is routed, redirects included, as the checks are) and all
//!   of them answer: through a failover — a master gone, its replica not yet
//!   promoted — the breaker stays open instead of closing on whichever node
//!   happened to answer and tripping again on the next call to the dead
//!   master's slots. A new connection, because the client corrects a route
//!   only on a redirect or a refused connection: a hung master (connections
//!   open, nothing answered) only times out, and the current connection
//!   keeps sending its slots to it after its replica took over.
//! - **Redis time, not wall clocks** (`clock`): every deadline a call
//!   carries is on the clock of the node that runs it, from offsets learned
//!   from replies (per slot on a cluster, each master having its own clock).
//! - **Per-IP limit** ([`RedisRateLimiter`], in `rate`): GCRA in one Lua
//!   script, time from `TIME`, keys that expire when indistinguishable from
//!   fresh; a replica takes a frequent client's admissions a few at a time
//!   and hands them out locally. A check Redis runs after its deadline
//!   (queued while Redis hung) is not charged. One it runs just in time but
//!   whose answer arrives too late costs that client what it took: accepted,
//!   it cannot be undone.
//! - **Per-host cap** ([`RedisHostCaps`], in `shares`): a read takes its
//!   process's own slot first (no network; it bounds a replica even with
//!   Redis down), then a slot of its replica's share of the host's cap, held
//!   in one hash per host and handed out locally; a claim per period or
//!   when a read finds no room, not a round trip per read.
//! - **Failover.** Replication is asynchronous: a master killed loses its
//!   last writes. A share grown just before is missing on the promoted
//!   replica; the failed calls void it and the next claim writes it afresh,
//!   so only reads that outlast the failover (at least
//!   `cluster-node-timeout`) can exceed that cap, once. A per-IP check's last
//!   writes may be lost too: a few requests admitted again.
//! - **Scripts** are sent by hash (`EVALSHA`); a node that does not have one
//!   yet (a fresh server, a promoted replica) gets the script's text once
//!   (`EVAL`, routed by the same key), never a `SCRIPT LOAD`, which a cluster
//!   client would send to every node, a dead one included.
//!
//! **Outage.** A failed, slow or skipped call applies `failure_mode`: `"open"`
//! answers from the in-process limiter (counting
//! `fanout_shared_state_fallback_total`), `"closed"` refuses with
//! `UNAVAILABLE`.

mod clock;
mod conn;
mod rate;
mod shares;

pub(crate) use conn::Conn;
use conn::{Cluster, Target, SLOTS};
pub use rate::RedisRateLimiter;
pub use shares::RedisHostCaps;

use super::breaker::Breaker;
use crate::config::{FailureMode, RedisConfig};
use crate::error::Unavailable;
use redis::aio::ConnectionManagerConfig;
use redis::{ErrorKind, FromRedisValue, RedisResult, Script};
use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A shared Redis connection — to one server or to a Redis Cluster — with a
/// call timeout, a key prefix and a circuit breaker.
///
/// ```
/// use fanout_budget::backends::redis::{RedisBackend, RedisHostCaps, RedisRateLimiter};
/// use fanout_budget::{Config, Engine, inbound::RateLimitLayer};
/// use std::num::NonZeroU32;
/// use std::sync::Arc;
///
/// let mut config = Config::default();
/// config.redis.url = "redis://127.0.0.1:6379".into();
/// // Or a cluster, by its seed nodes:
/// // config.redis.cluster_nodes = vec!["redis://10.0.0.1:6379".into(), "redis://10.0.0.2:6379".into()];
/// // Nothing connects until the first check.
/// let redis = RedisBackend::new(&config.redis).unwrap();
/// let caps = RedisHostCaps::new(config.hosts.clone(), redis.clone());
/// let engine = Engine::builder(config.clone()).host_limiter(Arc::new(caps)).build();
/// let rpm = NonZeroU32::new(config.rate_limit.requests_per_minute).unwrap();
/// let mode = redis.failure_mode();
/// let limiter = RateLimitLayer::new(&config.rate_limit).shared(Arc::new(RedisRateLimiter::new(redis, rpm)), mode);
/// # drop((engine, limiter));
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    target: Target,
    prefix: String,
    timeout: Duration,
    lease: Duration,
    /// `lease_block`.
    block: u32,
    refresh: Duration,
    backoff: Duration,
    mode: FailureMode,
    conn: tokio::sync::Mutex<Option<Conn>>,
    /// Connections installed in `conn` so far: the current one's number.
    installed: AtomicU64,
    breaker: Arc<Breaker>,
    /// Local instants are measured from here.
    base: Instant,
    /// Redis `TIME` (µs) minus local µs since `base`, a lower bound;
    /// `UNKNOWN` before the first reply. One for a server; one per slot for
    /// a cluster, whose masters each have their own clock.
    offsets_us: Box<[AtomicI64]>,
    /// Round trips sent to Redis by this backend.
    calls: AtomicU64,
}

/// Round trips sent to Redis by every backend of the process.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Round trips sent to Redis by every [`RedisBackend`] of this process so
/// far (also counted as `fanout_redis_calls_total`): what the load bench
/// divides by the requests served.
pub fn calls_total() -> u64 {
    CALLS.load(Relaxed)
}

const UNKNOWN: i64 = i64::MIN;

/// A Lua script, sent by its hash (`EVALSHA`); a node that lacks it gets
/// its text (`EVAL`, which caches it there), routed by the same key.
#[derive(Debug)]
pub(crate) struct Lua {
    code: &'static str,
    hash: String,
}

impl Lua {
    pub(crate) fn new(code: &'static str) -> Self {
        let hash = Script::new(code).get_hash().to_string();
        Self { code, hash }
    }
}

/// How a call reaches Redis.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// A new check: skipped while the breaker is open; connects if needed.
    Call,
    /// The breaker's probe (and `PING`): always sent; connects if needed.
    Probe,
    /// The breaker's probe on a cluster: always sent, on a new connection
    /// (its clocks learned), never on the current one.
    Fresh,
    /// For something already held (a give-back): always sent, on the
    /// current connection only.
    FollowUp,
}

/// A call that gave no answer.
pub(crate) struct Failure {
    pub(crate) error: Unavailable,
}

impl From<Failure> for Unavailable {
    fn from(failure: Failure) -> Self {
        failure.error
    }
}

fn down(err: impl std::fmt::Display) -> Unavailable {
    Unavailable {
        message: format!("redis: {err}"),
    }
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("cluster", &self.is_cluster())
            .field("prefix", &self.inner.prefix)
            .field("open", &self.is_open())
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// A backend for `[redis]` (`url`, or `cluster_nodes` when set); nothing
    /// is connected yet.
    pub fn new(config: &RedisConfig) -> Result<Self, Unavailable> {
        let (target, offsets) = if config.cluster_nodes.is_empty() {
            let client = redis::Client::open(config.url.as_str()).map_err(down)?;
            (Target::Server(client), 1)
        } else {
            (Target::Cluster(Cluster::new(config).map_err(down)?), SLOTS)
        };
        Ok(Self {
            inner: Arc::new(Inner {
                target,
                prefix: config.key_prefix.clone(),
                timeout: Duration::from_millis(config.timeout_ms),
                lease: Duration::from_millis(config.lease_ms),
                block: config.lease_block,
                refresh: Duration::from_millis(config.refresh_ms),
                backoff: Duration::from_millis(config.backoff_ms),
                mode: config.failure_mode,
                conn: tokio::sync::Mutex::new(None),
                installed: AtomicU64::new(0),
                breaker: Arc::new(Breaker::new(Duration::from_millis(config.backoff_ms))),
                base: Instant::now(),
                offsets_us: (0..offsets).map(|_| AtomicI64::new(UNKNOWN)).collect(),
                calls: AtomicU64::new(0),
            }),
        })
    }

    /// The configured failure mode.
    pub fn failure_mode(&self) -> FailureMode {
        self.inner.mode
    }

    /// Whether this backend is on a Redis Cluster (`[redis] cluster_nodes`).
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.target, Target::Cluster(_))
    }

    /// `<prefix>:<kind>:<name>`
    pub(crate) fn key(&self, kind: &str, name: &str) -> String {
        format!("{}:{kind}:{name}", self.inner.prefix)
    }

    /// Whether the breaker is open: checks skip Redis (and `failure_mode`
    /// applies) until a background probe succeeds.
    pub fn is_open(&self) -> bool {
        self.inner.breaker.is_open()
    }

    /// Redis calls that failed or timed out since this backend was made (not
    /// counting those on a connection a probe had replaced meanwhile).
    pub fn failed_calls(&self) -> u64 {
        self.inner.breaker.failures()
    }

    /// Calls this backend sent to Redis (checks, claims, give-backs, probes;
    /// not those skipped while the breaker is open).
    pub fn calls(&self) -> u64 {
        self.inner.calls.load(Relaxed)
    }

    /// A local deadline `timeout_ms` from now.
    pub(crate) fn local_deadline(&self) -> Instant {
        Instant::now() + self.inner.timeout
    }

    /// The connection, made if `route` may make one, and its number (see
    /// [`install`](Self::install)). `Err(None)`: skipped.
    async fn connection(&self, route: Route) -> Result<(Conn, u64), Option<Unavailable>> {
        let mut conn = self.inner.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            return Ok((c.clone(), self.inner.installed.load(Relaxed)));
        }
        match route {
            Route::FollowUp => return Err(Some(down("not connected"))),
            // Another caller's attempt just failed while this one waited.
            Route::Call if self.is_open() => return Err(None),
            _ => {}
        }
        let made = self.connect().await.map_err(|e| Some(down(e)))?;
        Ok((made.clone(), self.install(&mut conn, made)))
    }

    /// Makes `made` the connection (`slot` is `inner.conn`, locked) and
    /// returns its number: a call that fails on a connection since replaced
    /// does not open the breaker (see [`call`](Self::call)).
    fn install(&self, slot: &mut Option<Conn>, made: Conn) -> u64 {
        *slot = Some(made);
        self.inner.installed.fetch_add(1, Relaxed) + 1
    }

    /// A new connection, with the clocks of the nodes it reaches learned.
    async fn connect(&self) -> RedisResult<Conn> {
        match &self.inner.target {
            Target::Server(client) => {
                // No retries inside: the breaker paces reconnection.
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(self.inner.timeout)
                    .set_number_of_retries(0);
                let mut manager = client.get_connection_manager_with_config(config).await?;
                let (secs, micros): (i64, i64) =
                    redis::cmd("TIME").query_async(&mut manager).await?;
                self.observe(None, secs * 1_000_000 + micros);
                Ok(Conn::Server(manager))
            }
            Target::Cluster(cluster) => {
                // A live node's slot map, then connections to its nodes.
                let mut conn = Conn::Cluster(cluster.connect().await?);
                self.learn_cluster_clocks(&mut conn).await?;
                Ok(conn)
            }
        }
    }

    /// Runs `f` on the connection by `route`, bounded by `deadline`; a
    /// failure or timeout opens the breaker.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        route: Route,
        deadline: Instant,
        f: F,
    ) -> Result<T, Failure>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let skipped = || Failure {
            error: down("skipped after a failed call (backoff)"),
        };
        if route == Route::Call && self.is_open() {
            return Err(skipped());
        }
        // The number of the connection the call went out on.
        let mut on = None;
        let attempt = async {
            let conn = match route {
                Route::Fresh => self.connect().await.map_err(|e| Some(down(e)))?,
                _ => {
                    let (conn, number) = self.connection(route).await?;
                    on = Some(number);
                    conn
                }
            };
            self.inner.calls.fetch_add(1, Relaxed);
            CALLS.fetch_add(1, Relaxed);
            crate::metrics::redis_call();
            f(conn).await.map_err(|e| Some(down(e)))
        };
        let error = match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(None)) => return Err(skipped()),
            Ok(Err(Some(error))) => error,
            Err(_) => down("call timed out"),
        };
        // A follow-up still in flight on the connection a probe just
        // replaced (sent to a hung master, say) fails after the breaker
        // closed: it says nothing of the new connection.
        if on.is_some_and(|n| n != self.inner.installed.load(Relaxed)) {
            tracing::debug!(%error, "a call failed on a connection since replaced");
        } else {
            self.trip(&error);
        }
        Err(Failure { error })
    }

    fn trip(&self, error: &Unavailable) {
        let backend = Arc::downgrade(&self.inner);
        let opened = Instant::now();
        self.inner.breaker.trip(error, move || {
            let backend = backend.upgrade().map(|inner| RedisBackend { inner });
            async move {
                match backend {
                    Some(backend) => backend.probe(opened).await,
                    None => Err(down("backend dropped")),
                }
            }
        });
    }

    /// One probe: on a cluster, a new connection, which asks every master
    /// for its `TIME` (see [`learn_cluster_clocks`](Self::learn_cluster_clocks))
    /// and replaces the current one when they all answer. On a server, `TIME`
    /// (once more on the connection's fresh reconnect if the first failed on
    /// a lost connection); still failing `lease_ms` after the breaker opened,
    /// the connection is dropped and the next probe makes a new one.
    async fn probe(&self, opened: Instant) -> Result<(), Unavailable> {
        let deadline = self.local_deadline();
        if self.is_cluster() {
            // The cluster client corrects a slot's route only on a redirect
            // or a refused connection. A hung master's calls just time out
            // (a timeout is retried on the same route), so the current
            // connection may send that master's slots to it long after its
            // replica took over: the probe never trusts it, and a new one,
            // seeded by a live node (`Cluster::connect`), replaces it.
            let fresh = self
                .call(Route::Fresh, deadline, |conn| async { Ok(conn) })
                .await?;
            let mut conn = self.inner.conn.lock().await;
            self.install(&mut conn, fresh);
            return Ok(());
        }
        let probed = self.call(Route::Probe, deadline, |mut conn| async move {
            let time = redis::cmd("TIME");
            let (secs, micros) = match time.query_async::<(i64, i64)>(&mut conn).await {
                // The connection manager answers a call with the outcome of
                // the reconnect the last failure started — made while Redis
                // was down — and only then starts another. Without a second
                // try, the first probe after Redis is back would fail on that
                // stale outcome and the shared limits would wait one more
                // `backoff_ms`. The second try waits on the fresh reconnect,
                // within the same deadline.
                Err(e) if e.is_io_error() || e.is_unrecoverable_error() => {
                    time.query_async::<(i64, i64)>(&mut conn).await?
                }
                answer => answer?,
            };
            self.observe(None, secs * 1_000_000 + micros);
            Ok(())
        });
        match probed.await {
            Ok(()) => Ok(()),
            Err(failure) => {
                // Once no share it carried can still be live.
                if opened.elapsed() >= self.inner.lease {
                    *self.inner.conn.lock().await = None;
                }
                Err(failure.error)
            }
        }
    }

    /// Runs `script` on `key` with an optional string argument first, then
    /// `ints`, by `route`, bounded by `deadline`.
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        route: Route,
        deadline: Instant,
        script: &Lua,
        key: &str,
        holder: Option<&str>,
        ints: &[i64],
    ) -> Result<T, Failure> {
        self.call(route, deadline, |mut conn| async move {
            let invocation = |eval: &str, body: &str| {
                let mut cmd = redis::cmd(eval);
                cmd.arg(body).arg(1).arg(key);
                if let Some(holder) = holder {
                    cmd.arg(holder);
                }
                for arg in ints {
                    cmd.arg(*arg);
                }
                cmd
            };
            let by_hash = invocation("EVALSHA", &script.hash);
            match by_hash.query_async(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::NoScriptError => {
                    invocation("EVAL", script.code).query_async(&mut conn).await
                }
                answer => answer,
            }
        })
        .await
    }

    /// `PING` (on a cluster, every master), bounded by the call timeout (a
    /// health check and the benchmark floor). Sent even while the breaker is
    /// open; a failure opens it.
    pub async fn ping(&self) -> Result<(), Unavailable> {
        self.call(Route::Probe, self.local_deadline(), |mut conn| async move {
            redis::cmd("PING").query_async::<String>(&mut conn).await
        })
        .await?;
        Ok(())
    }

    /// Removes `member` of `key` with `command` (`HDEL`), in the
    /// background: tried again every `backoff_ms` while it fails (a master
    /// failing over), for at most `lease_ms` (after which it lapses anyway).
    pub(crate) fn forget(&self, command: &'static str, key: String, member: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.clone();
        runtime.spawn(async move {
            let until = Instant::now() + backend.inner.lease;
            loop {
                let removed = backend.call(Route::FollowUp, until, |mut conn| {
                    let (key, member) = (&key, &member);
                    async move {
                        redis::cmd(command)
                            .arg(key)
                            .arg(member)
                            .query_async::<i64>(&mut conn)
                            .await
                    }
                });
                let Err(failure) = removed.await else {
                    return;
                };
                if Instant::now() + backend.inner.backoff >= until {
                    tracing::debug!(error = %failure.error, "could not give back a host share; it lapses");
                    return;
                }
                tokio::time::sleep(backend.inner.backoff).await;
            }
        });
    }
}
