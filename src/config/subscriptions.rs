//! `[subscriptions]`: GraphQL subscriptions over WebSocket, their keys and
//! their rules.

use super::error::{at_least_one, ConfigError};
use super::mode::LimitMode;
use serde::Deserialize;
use std::time::Duration;

section! {
    /// `[subscriptions]`: one WebSocket connection is one inbound request
    /// that lives for hours — one scope, a read budget that refills over
    /// time, and bounds on what it may hold (`request/connection.rs`,
    /// `graphql/socket.rs`).
    #[derive(Clone, Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    pub struct SubscriptionsConfig {
        /// Active subscriptions on one connection; one past it is refused
        /// (`TOO_MANY_SUBSCRIPTIONS`), the others untouched.
        pub max_per_connection: usize = 16,
        /// The connection's read budget refills at this many reads a minute…
        pub reads_per_minute: u64 = 60,
        /// …up to this many reads (a new connection starts with them).
        pub burst: u64 = 100,
        /// `connection_init` must arrive within this many milliseconds of the
        /// upgrade (else the connection is closed with 4408).
        pub init_timeout_ms: u64 = 5000,
        /// A larger message closes the connection (4400).
        pub max_message_bytes: usize = 65_536,
        /// How often a shared poll reads its upstream, in milliseconds (at
        /// least 1000).
        pub poll_interval_ms: u64 = 5000,
        /// `reads_per_minute` for a connection of an internal caller (the token).
        pub internal_reads_per_minute: u64 = 600,
        /// `burst` for a connection of an internal caller.
        pub internal_burst: u64 = 1000,
        /// Events queued for a client per subscription; past it the oldest
        /// is dropped.
        pub max_pending_events: usize = 4,
        /// A keep-alive ping every this many milliseconds; a connection that
        /// sends nothing for three of them is closed.
        pub keepalive_ms: u64 = 15_000,
        /// Bytes every open socket together may hold — subscriptions (their
        /// documents, variables and texts), events being resolved and
        /// waiting to be written — apart from `http.max_inflight_bytes`:
        /// sockets never take what HTTP requests need. Full: a new
        /// subscription is refused (`OVERLOADED`), an event replaced by a
        /// small `OVERLOADED` one.
        pub max_bytes: usize = 64 << 20,
        /// One client's share of `max_bytes` (all its sockets; clients keyed
        /// as the per-IP limiter keys them).
        pub max_bytes_per_client: usize = 8 << 20,
        /// Open WebSocket connections at most (capped at
        /// `http.max_connections`); `0`, the default: half of
        /// `http.max_connections`, rounded up, so that sockets held for hours
        /// never take every place HTTP requests need. One past it is closed
        /// at once (1013, try again later).
        pub max_connections: usize = 0,
        /// `"enforce"`: a read the connection's budget cannot pay for is
        /// `FANOUT_BUDGET_EXHAUSTED` at its field; `"measure"`: it is sent,
        /// and counted (`fanout_would_refuse_total{limit="subscriptions"}`),
        /// the budget's figures those enforce would show.
        pub mode: LimitMode = LimitMode::Enforce,
    }
}

impl SubscriptionsConfig {
    /// `init_timeout_ms` as a duration.
    pub fn init_timeout(&self) -> Duration {
        Duration::from_millis(self.init_timeout_ms)
    }

    /// `poll_interval_ms` as a duration.
    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms)
    }

    /// The sockets that may be open at once in a connection table of
    /// `http_max_connections`: `max_connections` (at most the table), or
    /// half the table, rounded up, when it is `0`.
    pub fn open_sockets(&self, http_max_connections: usize) -> usize {
        match self.max_connections {
            0 => http_max_connections.div_ceil(2),
            n => n.min(http_max_connections),
        }
    }

    /// `keepalive_ms` as a duration.
    pub fn keepalive(&self) -> Duration {
        Duration::from_millis(self.keepalive_ms)
    }

    /// Counts at least 1, a poll at most once a second, a burst no larger
    /// than a read per nanosecond allows.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        at_least_one(
            "subscriptions",
            [
                ("max_per_connection", self.max_per_connection as u64),
                ("reads_per_minute", self.reads_per_minute),
                ("burst", self.burst),
                ("init_timeout_ms", self.init_timeout_ms),
                ("max_message_bytes", self.max_message_bytes as u64),
                ("internal_reads_per_minute", self.internal_reads_per_minute),
                ("internal_burst", self.internal_burst),
                ("max_pending_events", self.max_pending_events as u64),
                ("keepalive_ms", self.keepalive_ms),
                ("max_bytes", self.max_bytes as u64),
                ("max_bytes_per_client", self.max_bytes_per_client as u64),
            ],
        )?;
        if self.poll_interval_ms < 1000 {
            return Err(ConfigError::rule(
                "subscriptions.poll_interval_ms",
                "must be at least 1000",
            ));
        }
        Ok(())
    }
}
