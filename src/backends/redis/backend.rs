//! [`RedisBackend`]: one process's connection to its shared state; every
//! call to Redis goes through [`call`](RedisBackend::call).
//!
//! - **A call** is bounded by `timeout_ms` (connecting included), counted
//!   (`fanout_redis_calls_total`), and goes out by a [`Route`]: a new check
//!   is skipped while the breaker is open, a probe is always sent, a
//!   give-back goes on the current connection only.
//! - **The breaker** (`backends/breaker.rs`): a failed or timed-out call
//!   opens it — unless it failed on a connection a probe has since
//!   replaced (a follow-up still in flight to a hung master says nothing of
//!   the new one). One background [`probe`](RedisBackend::probe) per
//!   `backoff_ms` closes it again: on a server `TIME`, on a cluster a new
//!   connection that every master answered.
//! - **Timed scripts** carry their deadline on the clock of the node that
//!   runs them ([`Clocks`]), which learn from every reply.

use super::clocks::Clocks;
use super::conn::{Conn, Target};
use super::io;
use super::lua::{Lua, RedisTime, Timed};
use crate::backends::breaker::Breaker;
use crate::config::{FailureMode, RedisConfig};
use crate::error::Unavailable;
use redis::{FromRedisValue, RedisResult};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A shared Redis connection — to one server or to a Redis Cluster — with a
/// call timeout, a key prefix and a circuit breaker. One per process, and
/// every limit on it: [`SharedLimits`](crate::backends::redis::SharedLimits)
/// makes them.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    target: Target,
    prefix: String,
    timeout: Duration,
    lease: Duration,
    /// How long a share of a host's cap may be used after its claim was sent.
    share_use: Duration,
    /// `lease_block`.
    block: u32,
    refresh: Duration,
    backoff: Duration,
    mode: FailureMode,
    conn: tokio::sync::Mutex<Option<Conn>>,
    /// Connections installed in `conn` so far: the current one's number.
    installed: AtomicU64,
    breaker: Arc<Breaker>,
    clocks: Clocks,
    /// Round trips sent to Redis by this backend.
    calls: AtomicU64,
}

/// Round trips sent to Redis by every backend of the process.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Round trips sent to Redis by every [`RedisBackend`] of this process so
/// far (also counted as `fanout_redis_calls_total`): what the load bench
/// divides by the requests served.
#[doc(hidden)]
pub fn calls_total() -> u64 {
    CALLS.load(Relaxed)
}

/// How a call reaches Redis.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
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

/// Redis gave no answer, because of `err`.
pub(super) fn down(err: impl std::fmt::Display) -> Unavailable {
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
        let target = Target::new(config).map_err(down)?;
        let clocks = match target {
            Target::Server { .. } => Clocks::server(),
            Target::Cluster(_) => Clocks::cluster(),
        };
        let backoff = Duration::from_millis(config.backoff_ms);
        Ok(Self {
            inner: Arc::new(Inner {
                target,
                prefix: config.key_prefix.clone(),
                timeout: Duration::from_millis(config.timeout_ms),
                lease: Duration::from_millis(config.lease_ms),
                share_use: crate::config::share_use(config),
                block: config.lease_block,
                refresh: Duration::from_millis(config.refresh_ms),
                backoff,
                mode: config.failure_mode,
                conn: tokio::sync::Mutex::new(None),
                installed: AtomicU64::new(0),
                breaker: Arc::new(Breaker::new(backoff)),
                clocks,
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

    /// `<prefix>:<kind>:<name>`
    pub(super) fn key(&self, kind: &str, name: &str) -> String {
        format!("{}:{kind}:{name}", self.inner.prefix)
    }

    /// `timeout_ms`.
    pub(super) fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// `lease_ms`.
    pub(super) fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// How long a share of a host's cap may be used after the claim that
    /// granted it was sent (the `[redis]` rule, `config::share_use`).
    pub(super) fn share_use(&self) -> Duration {
        self.inner.share_use
    }

    /// `lease_block`.
    pub(super) fn lease_block(&self) -> u32 {
        self.inner.block
    }

    /// `refresh_ms`.
    pub(super) fn refresh(&self) -> Duration {
        self.inner.refresh
    }

    /// `backoff_ms`.
    pub(super) fn backoff(&self) -> Duration {
        self.inner.backoff
    }

    /// The offsets to Redis's clocks.
    #[cfg(test)]
    pub(super) fn clocks(&self) -> &Clocks {
        &self.inner.clocks
    }

    /// A local deadline `timeout_ms` from now.
    pub(super) fn local_deadline(&self) -> Instant {
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
        let probe_key = |n: u32| self.key("probe", &n.to_string());
        self.inner
            .target
            .connect(&self.inner.clocks, probe_key)
            .await
    }

    /// Runs `f` on the connection by `route`, bounded by `deadline`; a
    /// failure or timeout opens the breaker. The call runs on the Redis I/O
    /// thread (`io.rs`): however busy the caller's runtime, its timeout is
    /// what Redis took to answer.
    pub(super) async fn call<T, F, Fut>(
        &self,
        route: Route,
        deadline: Instant,
        f: F,
    ) -> Result<T, Unavailable>
    where
        F: FnOnce(Conn) -> Fut + Send + 'static,
        Fut: Future<Output = RedisResult<T>> + Send + 'static,
        T: Send + 'static,
    {
        if route == Route::Call && self.is_open() {
            return Err(down("skipped after a failed call (backoff)"));
        }
        let backend = self.clone();
        io::spawn(async move { backend.call_on_io(route, deadline, f).await })
            .await
            .map_err(down)?
    }

    /// [`call`](Self::call), on the I/O thread. A caller late to send it
    /// (its runtime busy) has spent part of `deadline` itself: Redis gets
    /// at least `timeout_ms` from now to answer before the call counts as
    /// failed.
    async fn call_on_io<T, F, Fut>(
        &self,
        route: Route,
        deadline: Instant,
        f: F,
    ) -> Result<T, Unavailable>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let skipped = || down("skipped after a failed call (backoff)");
        if route == Route::Call && self.is_open() {
            return Err(skipped());
        }
        let deadline = deadline.max(self.local_deadline());
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
        Err(error)
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
    /// for its `TIME` (`conn`) and replaces the current one when they all
    /// answer. On a server, `TIME` (once more on the connection's fresh
    /// reconnect if the first failed on a lost connection); still failing
    /// `lease_ms` after the breaker opened, the connection is dropped (by
    /// then no share it carried is live) and the next probe makes a new one.
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
        let backend = self.clone();
        let probed = self.call(Route::Probe, deadline, |mut conn| async move {
            let time = redis::cmd("TIME");
            let RedisTime(now_us) = match time.query_async(&mut conn).await {
                // The connection manager answers a call with the outcome of
                // the reconnect the last failure started — made while Redis
                // was down — and only then starts another. Without a second
                // try, the first probe after Redis is back would fail on that
                // stale outcome and the shared limits would wait one more
                // `backoff_ms`. The second try waits on the fresh reconnect,
                // within the same deadline.
                Err(e) if e.is_io_error() || e.is_unrecoverable_error() => {
                    time.query_async(&mut conn).await?
                }
                answer => answer?,
            };
            backend.inner.clocks.observe(None, now_us);
            Ok(())
        });
        match probed.await {
            Ok(()) => Ok(()),
            Err(error) => {
                // Once no share it carried can still be live.
                if opened.elapsed() >= self.inner.lease {
                    *self.inner.conn.lock().await = None;
                }
                Err(error)
            }
        }
    }

    /// Runs `script` on `key` (see [`Lua::run`]) by `route`, bounded by
    /// `deadline`.
    pub(super) async fn script<T: FromRedisValue + Send + 'static>(
        &self,
        route: Route,
        deadline: Instant,
        script: &'static Lua,
        key: &str,
        holder: Option<&str>,
        ints: &[i64],
    ) -> Result<T, Unavailable> {
        let (key, holder, ints) = (key.to_string(), holder.map(str::to_string), ints.to_vec());
        self.call(route, deadline, move |mut conn| async move {
            script.run(&mut conn, &key, holder.as_deref(), &ints).await
        })
        .await
    }

    /// Runs a script that checks its deadline — its last argument, the
    /// deadline on Redis's clock, appended to `ints` — on `key` by
    /// [`Route::Call`], bounded by `timeout_ms`, and learns the clock offset
    /// from its reply (on the I/O thread, when it arrives). A "late" reply that arrives before the local deadline
    /// ran in time, did nothing and shows the offset was wrong (the slot moved
    /// to a master with another clock, or Redis's clock stepped): it is sent
    /// once more with the corrected deadline.
    pub(super) async fn timed_script<T: Timed + Send + 'static>(
        &self,
        script: &'static Lua,
        key: &str,
        holder: Option<&str>,
        ints: &[i64],
    ) -> Result<T, Unavailable> {
        let local = self.local_deadline();
        let mut args = ints.to_vec();
        args.push(0);
        let mut tries = 0;
        loop {
            tries += 1;
            *args.last_mut().expect("the deadline") = self.inner.clocks.deadline(key, local);
            // The offset is learned on the I/O thread, as the reply
            // arrives: learned when a busy caller gets to it, it would put
            // the next deadlines too early.
            let (backend, key, holder) =
                (self.clone(), key.to_string(), holder.map(str::to_string));
            let ints = args.clone();
            let reply: T = self
                .call(Route::Call, local, move |mut conn| async move {
                    let reply: T = script
                        .run(&mut conn, &key, holder.as_deref(), &ints)
                        .await?;
                    backend
                        .inner
                        .clocks
                        .observe(Some(&key), reply.redis_now_us());
                    Ok(reply)
                })
                .await?;
            if !reply.late() || tries == 2 || Instant::now() >= local {
                return Ok(reply);
            }
        }
    }
}
