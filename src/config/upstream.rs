//! `[upstream]` (an addition to the contract's keys): what one upstream
//! response may cost. No rule: every value is usable (0 redirects returns a
//! 3xx as it is).

use serde::Deserialize;

section! {
    /// `[upstream]` (an addition to the contract's keys)
    #[derive(Clone, Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    pub struct UpstreamConfig {
        /// Bytes read from one upstream response at most; a larger body is an
        /// `UPSTREAM_ERROR` (16 MiB by default).
        pub max_response_bytes: usize = 16 << 20,
        /// Redirects one read may follow; each hop is a read of its own,
        /// charged and capped like any other (5 by default; 0: a 3xx answer is
        /// returned as it is).
        pub max_redirects: u32 = 5,
        /// Body bytes of all the upstream answers one inbound request keeps
        /// (each is kept for the request's de-duplication); past it a read's
        /// answer is an `UPSTREAM_ERROR` (64 MiB by default).
        pub max_request_bytes: usize = 64 << 20,
        /// Memory for the engine's cache of answers to reads declared
        /// immutable (`Read::immutable`), weighed by body, URL and headers;
        /// a hit costs no read (32 MiB by default; 0: off).
        pub cache_bytes: u64 = 32 << 20,
    }
}
