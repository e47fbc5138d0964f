//! Shared limits on Redis: the per-IP limit, the per-host caps, the
//! upstreams' quota gates and the clients' read quotas, for the whole fleet
//! of replicas, on one backend per process.
//!
//! A process makes its [`SharedLimits`] once, from its [`Config`](crate::Config):
//! one [`RedisBackend`] — one connection per node, one breaker, one set of
//! clocks — and on it the per-host caps ([`RedisHostCaps`], for the engine),
//! the per-IP limit ([`RedisRateLimiter`], inside the inbound
//! [`RateLimitLayer`](crate::inbound::RateLimitLayer)), the upstreams' quota
//! gates ([`RedisQuotaBoard`]) and, with `[quota]`, the clients' read quotas
//! ([`RedisReadQuota`], for the engine).
//!
//! How it works, module by module (each one's docs tell more):
//!
//! - **`backend`**: [`RedisBackend`], every call to Redis — bounded by
//!   `timeout_ms`, counted, behind the circuit breaker (`backends/breaker.rs`):
//!   a failed or timed-out call opens it, and for at least `backoff_ms` calls
//!   skip Redis and `failure_mode` applies at once — no `timeout_ms` paid,
//!   connection refused included; one background probe per `backoff_ms`
//!   closes it again; each change is logged once.
//! - **`conn`**: one server (`url`) or a Redis Cluster (`cluster_nodes`)
//!   behind one connection type, so the scripts, the breaker, the timeouts
//!   and `failure_mode` are one code path for both; connected lazily, so a
//!   Redis that is down at start-up does not stop start-up.
//! - **`slots`**: a cluster's slots. Every script and command touches
//!   exactly one key (`KEYS[1]`; the give-back's `HDEL` of one key), so each
//!   runs whole on the master owning that key's slot and no key needs a hash
//!   tag; the keys spread over the masters by their full names
//!   (`<prefix>:ip:<client>`, `<prefix>:shares:<HOST:PORT>`,
//!   `<prefix>:quota:<class>:<client>`). A script that
//!   ever touches two keys must give them one hash tag (`{…}`). A `{…}` in
//!   `key_prefix` would become every key's tag: still correct, but all the
//!   state on one master. The cluster client may send a script again after
//!   a lost reply, so it may run twice: a claim sets its replica's share
//!   absolutely, so twice is once; a per-IP check or a read quota's take run
//!   twice charges its client once more.
//! - **`io`**: the thread every call runs on — connections, their reply
//!   readers, timeouts, the breaker's probes — apart from request work.
//! - **`clocks`**: Redis time, not wall clocks — every deadline a call
//!   carries is on the clock of the node that runs it, from offsets learned
//!   from replies (per slot on a cluster, each master having its own clock).
//! - **`lua`**: the scripts (`lua/*.lua`), sent by hash, and their replies,
//!   each parsed into a type of its own.
//! - **`rate`**: the per-IP limit — GCRA in one Lua script, time from
//!   `TIME`, keys that expire when indistinguishable from fresh; a replica
//!   takes a frequent client's admissions a few at a time and hands them out
//!   locally. A check Redis runs after its deadline (queued while Redis
//!   hung) is not charged. One it runs just in time but whose answer
//!   arrives too late costs that client what it took: accepted, it cannot
//!   be undone.
//! - **`shares`**: the per-host caps — a read takes its process's own slot
//!   first (no network; it bounds a replica even with Redis down), then a
//!   slot of its replica's share of the host's cap, held in one hash per
//!   host and handed out locally; a claim per period or when a read finds
//!   no room, not a round trip per read.
//! - **`quotas`**: the upstreams' quota gates — an upstream that says its
//!   quota is spent to one replica is refused on all, until the time it gave.
//! - **`read_quota`**: the clients' read quotas (`[quota]`) — one key per
//!   client and class holding the instant its bucket is full again, one Lua
//!   script per call with the time from `TIME`; a replica takes a
//!   reservation's reads plus some ahead for the client's next requests (at
//!   most half of what it has left), hands them out locally for up to a
//!   second, keeps what requests give back until its next call for that
//!   client, and keeps a refusal until the reads fit. A reservation dropped
//!   mid-call loses nothing Redis charged (the call runs in its own task).
//! - **`limits`**: [`SharedLimits`], the limits above made once on one
//!   backend.
//!
//! **Failover.** Replication is asynchronous: a master killed loses its
//! last writes. A share grown just before is missing on the promoted
//! replica; the failed calls void it and the next claim writes it afresh,
//! so only reads that outlast the failover (at least
//! `cluster-node-timeout`) can exceed that cap, once. A per-IP check's last
//! writes may be lost too: a few requests admitted again; a read quota's,
//! a few reads taken again (a client's bucket fuller than it was).
//!
//! **Outage.** A failed, slow or skipped call applies `failure_mode`:
//! `"open"` answers from the in-process limiter (counting
//! `fanout_shared_state_fallback_total`), `"closed"` refuses with
//! `UNAVAILABLE`. Slow means Redis was slow: every call runs on a thread
//! of its own (`io`), so a replica busy with requests does not take its
//! own slowness for an outage. A fallback never starts a client afresh:
//! the read quota's starts from the fleet's last answer for that client,
//! or half its burst. With one backend, the first limit to meet the outage opens
//! the breaker for all of them: it is logged once, and no other limit pays
//! a timeout to find out.

mod backend;
mod clocks;
mod conn;
mod io;
mod limits;
mod lua;
mod quotas;
mod rate;
mod read_quota;
mod shares;
mod slots;

#[doc(hidden)]
pub use backend::calls_total;
pub use backend::RedisBackend;
pub use limits::SharedLimits;
pub use quotas::{RedisQuotaBoard, SharedQuotaBoard};
pub use rate::RedisRateLimiter;
pub use read_quota::RedisReadQuota;
pub use shares::RedisHostCaps;
