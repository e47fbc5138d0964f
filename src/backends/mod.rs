//! Shared-state backends behind the engine's two seams.
//!
//! The in-process backends live with their concept: [`LocalHostCaps`](crate::read::LocalHostCaps)
//! behind [`HostLimiter`](crate::read::HostLimiter), and governor's in-process
//! GCRA inside the [`RateLimitLayer`](crate::inbound::RateLimitLayer) (the
//! [`InboundLimiter`](crate::inbound::InboundLimiter) seam). When one replica is not
//! enough, the same seams take the Redis backends here — both made once per
//! process on one backend by [`SharedLimits`](redis::SharedLimits); resolvers
//! and the HTTP integration do not change. The per-request fan-out budget always stays
//! in-process: one HTTP request lands on one replica.
//!
//! Which to use:
//!
//! | situation | backend |
//! |---|---|
//! | one replica, or limits per replica are acceptable | in-process (default; `[redis] url = ""`) |
//! | several replicas behind a load balancer, limits must hold for the fleet | Redis (`[redis] url = "redis://…"`) |
//! | the same, and one Redis server must not be a single point of failure | Redis Cluster (`[redis] cluster_nodes = ["redis://…", …]`) |
//! | Redis may be unavailable and serving matters more than exact limits | Redis with `failure_mode = "open"` |
//! | exceeding a limit is worse than refusing traffic | Redis with `failure_mode = "closed"` |

mod breaker;
pub mod redis;
