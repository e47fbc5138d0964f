//! `[hosts."HOST:PORT"]`: a process-wide cap per upstream host, and the rule
//! on its key.

use super::error::{key_segment, ConfigError};
use serde::Deserialize;
use std::time::Duration;

section! {
    /// `[hosts."HOST:PORT"]`
    #[derive(Clone, Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    pub struct HostConfig {
        /// Process-wide in-flight reads to this host; 0 rejects every read.
        pub max_concurrent: u32 = 256,
        /// How long a read may wait for a slot (never past the request deadline).
        pub acquire_wait_ms: u64 = 50,
        /// Identical `GET`/`HEAD` reads (same URL, same headers, no body) in
        /// flight at the same moment in different inbound requests share one
        /// upstream request; the requests that join it are not charged (off by
        /// default: an upstream that answers each caller differently, beyond
        /// what the read's headers say, must not be coalesced). See
        /// [`Upstream::read`](crate::read::Upstream::read).
        pub coalesce: bool = false,
        /// Answers to `GET`s of this host are kept in the engine's cache
        /// (`upstream.cache_bytes`) as their `Cache-Control`/`Expires` allow
        /// a shared cache to (RFC 9111: `max-age`, `s-maxage`, `immutable`;
        /// never `no-store`, `private` or `no-cache`), for as long as they
        /// stay fresh — kept for the same credentials only, unless marked
        /// `public` (off by default: an upstream's headers are trusted only
        /// where the operator says so). See `src/read/cache.rs`.
        pub cache_control: bool = false,
        /// Reads sent to this host carry the request's remaining budget,
        /// deadline and hop count (`Fanout-Budget`), and the reads its
        /// answer reports spent (`Fanout-Spent`) are charged to the
        /// request: for an upstream that is itself a service on the engine
        /// (off by default: never sent to a third party). See the book's
        /// "Chains of services".
        pub propagate: bool = false,
    }
}

impl HostConfig {
    /// `acquire_wait_ms` as a duration.
    pub fn acquire_wait(&self) -> Duration {
        Duration::from_millis(self.acquire_wait_ms)
    }

    /// The table's key, `host`, is `HOST:PORT` (every value is usable).
    pub(super) fn check(&self, host: &str) -> Result<(), ConfigError> {
        let host_port = match host.rsplit_once(':') {
            Some((name, port)) => !name.is_empty() && port.parse::<u16>().is_ok(),
            None => false,
        };
        if host_port {
            return Ok(());
        }
        Err(ConfigError::new(
            format!("hosts.{}", key_segment(host)),
            "a host key must be HOST:PORT (e.g. \"registry.local:5000\")",
        ))
    }
}
