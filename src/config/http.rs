//! `[http]`: limits on the inbound HTTP request and its answer, CORS and
//! CSRF, their keys and their rules.

use super::error::{at_least_one, ConfigError};
use serde::Deserialize;
use std::time::Duration;

section! {
    /// `[http]`
    #[derive(Clone, Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    pub struct HttpConfig {
        /// More operations in one batch: the whole batch is rejected, nothing runs.
        pub max_batch_operations: usize = 20,
        /// Largest accepted request body, in bytes.
        pub max_body_bytes: usize = 65_536,
        /// Memory for parsed documents kept by query text, so a text seen
        /// before is not parsed again (each entry weighed as its text plus its
        /// document's estimated heap, `documents::weight`); `0`: every query is
        /// parsed.
        pub document_cache_bytes: usize = 8 << 20,
        /// Field selections one operation may expand to, fragments expanded
        /// (counted in linear time before async-graphql validates it); more:
        /// `GRAPHQL_VALIDATION_FAILED`, nothing runs.
        pub max_selections: u64 = 2_000,
        /// How long a client may take to send a request's headers, in
        /// milliseconds (then the connection is closed).
        pub header_read_timeout_ms: u64 = 5_000,
        /// How long a client may take to send a request's body, in milliseconds
        /// (never past the request deadline); then 408 and the connection closed.
        pub body_read_timeout_ms: u64 = 10_000,
        /// Inbound connections served at most; more are accepted and wait for
        /// a slot (fresh clients first; an idle connection of the client
        /// holding the most may be closed for one: see `inbound::serve`).
        pub max_connections: usize = 512,
        /// Inbound connections from one client at most, served or waiting
        /// (keyed as `[rate_limit]` keys clients; trusted proxies have no
        /// share); more are closed as soon as they are accepted.
        pub max_connections_per_client: usize = 64,
        /// Bytes of one answer (the whole batch's JSON) at most; more: the
        /// answer is `RESPONSE_TOO_LARGE` instead.
        pub max_response_bytes: usize = 16 << 20,
        /// Memory one request's answer (the whole batch's) may hold while it is
        /// built, counted as resolvers produce it (`memory.rs`: each value 80
        /// bytes plus its string bytes, each object entry 112, each field error
        /// 1.5 KiB plus its message, extensions and path, each resolve still
        /// running 3 KiB). Past it the request stops at once and answers
        /// `RESPONSE_TOO_LARGE`.
        pub max_answer_bytes: usize = 160 << 20,
        /// Memory all requests in flight may hold at once: answers being built
        /// and being written to clients, and the upstream bodies they keep. The request that would pass it
        /// stops and answers 503 `OVERLOADED` (`Retry-After: 1`).
        pub max_inflight_bytes: usize = 512 << 20,
        /// How long writing a response to a connection may make no progress (the
        /// client reads nothing), in milliseconds; then the connection is closed
        /// and its response dropped.
        pub write_timeout_ms: u64 = 10_000,
        /// Memory for the query texts of Apollo automatic persisted queries,
        /// kept by their SHA-256 (each weighed as its text plus 128 bytes) in
        /// two generations of half each: a text asked for once per generation
        /// stays. `0`: persisted queries are off
        /// (a hash-only request is `PERSISTED_QUERY_NOT_SUPPORTED`).
        pub persisted_queries_bytes: usize = 1 << 20,
        /// Origins a browser app may call the endpoint from (CORS), each
        /// `scheme://host[:port]`, or `["*"]` for any; empty: no CORS headers,
        /// so browsers keep the endpoint same-origin.
        pub cors_allowed_origins: Vec<String> = Vec::new() => list,
        /// Whether a `GET` carrying a GraphQL request must show it was not sent
        /// by a page on another site ([`CsrfGet`]). Unset: the application's
        /// default — [`CsrfGet::RequirePreflight`] for the library
        /// ([`csrf_get_or_default`](Self::csrf_get_or_default)); the gateway
        /// ships `allow`.
        pub csrf_get: Option<CsrfGet> = None => into,
        /// Host names a request may name in its `Host` header (its
        /// `:authority` over HTTP/2), each `name` (any port) or `name:port`
        /// (IPv6 in brackets, `[::1]`), or `["*"]` for any; empty: any, or the
        /// application's default (the gateway listening on a loopback
        /// address: `localhost`, `127.0.0.1` and `[::1]`). A page whose own
        /// name an attacker points at this server's address (DNS rebinding)
        /// is same-origin to it in the browser's eyes and sends its own name
        /// as `Host`: such a request is refused with 400 `BAD_REQUEST` — a
        /// WebSocket upgrade by the library ([`FanoutGraphQL`]), every request
        /// by the gateway ([`allows_host`](Self::allows_host)).
        ///
        /// [`FanoutGraphQL`]: crate::FanoutGraphQL
        pub allowed_hosts: Vec<String> = Vec::new() => list,
        /// Whether every answer to a GraphQL request carries
        /// `X-Cost-Estimated` (the request's worst case in reads: its
        /// operations' `requested` summed, or its budget when no cost table
        /// prices them), `X-Cost-Actual` (the reads it sent) and
        /// `X-Cost-Max` (its budget, `max_reads` or `internal_max_reads`),
        /// under both integrations; a batch reports its one budget.
        pub cost_headers: bool = false,
        /// Whether each operation's `extensions` carries `cost` beside
        /// `fanout`, Shopify's envelope: `requestedQueryCost` (its
        /// `requested`, or the budget when unpriced), `actualQueryCost` (its
        /// reads sent) and, with a read quota, `throttleStatus`
        /// (`maximumAvailable` the burst, `currentlyAvailable` the reads
        /// left, `restoreRate` reads per second).
        pub cost_extension: bool = false,
    }
}

/// `[http] csrf_get`: what a `GET` that carries a GraphQL request (a
/// `query` or `extensions` parameter) must show before it runs.
///
/// A `GET` runs queries only (a mutation over `GET` is 405), and CORS keeps
/// its answer from other origins. But a page on any site can make a
/// visitor's browser send one — an image tag, a link — with the visitor's
/// cookies and no CORS preflight: for an app that authenticates by cookie,
/// such a query runs as the visitor (it spends their reads and their rate
/// limit, and whatever a query does on the side, it does).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CsrfGet {
    /// Refused with 400 `BAD_REQUEST` before anything runs unless it carries
    /// what a page cannot send cross-site without a preflight: a non-empty
    /// `Apollo-Require-Preflight` or `X-Apollo-Operation-Name` header, or a
    /// `Content-Type` other than none, `text/plain`, a form or multipart —
    /// as Apollo Router's CSRF prevention refuses it. The library's default:
    /// safe for an app with ambient credentials (cookies), at the price of
    /// stock clients' plain `GET`s (urql's default for queries, a link to a
    /// query), which must add the header.
    #[default]
    RequirePreflight,
    /// Runs it as any other query. For an endpoint with no ambient
    /// credentials — no cookie, no session, nothing a browser adds by itself
    /// that the answer depends on — where a cross-site `GET` gets what the
    /// page could have fetched itself: the gateway's setting. What another
    /// site can still do is spend its visitors' reads and per-IP rate limit,
    /// at most a budget per request.
    Allow,
}

impl HttpConfig {
    /// `header_read_timeout_ms` as a duration.
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    /// `body_read_timeout_ms` as a duration.
    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }

    /// `write_timeout_ms` as a duration.
    pub fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.write_timeout_ms)
    }

    /// `csrf_get`, unset meaning [`CsrfGet::RequirePreflight`].
    pub fn csrf_get_or_default(&self) -> CsrfGet {
        self.csrf_get.unwrap_or_default()
    }

    /// Whether `allowed_hosts` admits a request naming `host` (its `Host`
    /// header, or the URI's authority; `None`: it names none, admitted only
    /// when any host is). Names compare without regard to case; an entry
    /// without a port admits its name on any port.
    pub fn allows_host(&self, host: Option<&str>) -> bool {
        if self.allowed_hosts.is_empty() || self.allowed_hosts.iter().any(|h| h == "*") {
            return true;
        }
        let Some(host) = host else {
            return false;
        };
        let name = host_name(host);
        self.allowed_hosts.iter().any(|allowed| {
            allowed.eq_ignore_ascii_case(host)
                || (host_name(allowed).len() == allowed.len() && allowed.eq_ignore_ascii_case(name))
        })
    }

    /// Counts, sizes and timeouts are at least 1 (the caches may be 0: off);
    /// `cors_allowed_origins` are origins.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        at_least_one(
            "http",
            [
                ("max_batch_operations", self.max_batch_operations as u64),
                ("max_body_bytes", self.max_body_bytes as u64),
                ("max_selections", self.max_selections),
                ("header_read_timeout_ms", self.header_read_timeout_ms),
                ("body_read_timeout_ms", self.body_read_timeout_ms),
                ("max_connections", self.max_connections as u64),
                (
                    "max_connections_per_client",
                    self.max_connections_per_client as u64,
                ),
                ("write_timeout_ms", self.write_timeout_ms),
                ("max_response_bytes", self.max_response_bytes as u64),
                ("max_answer_bytes", self.max_answer_bytes as u64),
                ("max_inflight_bytes", self.max_inflight_bytes as u64),
            ],
        )?;
        check_origins(&self.cors_allowed_origins)?;
        check_hosts(&self.allowed_hosts)
    }
}

/// `host` (`name[:port]`, `[v6][:port]`) without its port.
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Checks `[http] allowed_hosts`: `["*"]` alone, or host names with an
/// optional port.
fn check_hosts(hosts: &[String]) -> Result<(), ConfigError> {
    let key = "http.allowed_hosts";
    if hosts.iter().any(|h| h == "*") && hosts.len() > 1 {
        return Err(ConfigError::new(
            key,
            "\"*\" allows every host; list it alone",
        ));
    }
    for host in hosts.iter().filter(|h| *h != "*") {
        let ok = !host_name(host).is_empty()
            && !host.contains("://")
            && !host.contains(['/', '?', '#', ' ', '*', '@'])
            && ::http::uri::Authority::try_from(host.as_str()).is_ok();
        if !ok {
            return Err(ConfigError::new(
                key,
                format!(
                    "\"{host}\" is not a host name (name or name:port, e.g. \"gateway.example\" or \"localhost:8080\", no scheme)"
                ),
            ));
        }
    }
    Ok(())
}

/// Checks `[http] cors_allowed_origins`: `["*"]` alone, or origins.
fn check_origins(origins: &[String]) -> Result<(), ConfigError> {
    let key = "http.cors_allowed_origins";
    if origins.iter().any(|o| o == "*") && origins.len() > 1 {
        return Err(ConfigError::new(
            key,
            "\"*\" allows every origin; list it alone",
        ));
    }
    for origin in origins.iter().filter(|o| *o != "*") {
        let ok = origin.split_once("://").is_some_and(|(scheme, rest)| {
            matches!(scheme, "http" | "https")
                && !rest.is_empty()
                && !rest.contains(['/', '?', '#', ' ', '*'])
        }) && ::http::HeaderValue::from_str(origin).is_ok();
        if !ok {
            return Err(ConfigError::new(
                key,
                format!(
                    "\"{origin}\" is not an origin (scheme://host[:port], e.g. \"https://app.example\", no path)"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_hosts, check_origins, HttpConfig};

    #[test]
    fn allowed_hosts_admit_their_names() {
        let http = HttpConfig::default();
        assert!(http.allows_host(Some("evil.example")) && http.allows_host(None));
        let http = HttpConfig::default().allowed_hosts(["localhost", "[::1]", "gw.example:8443"]);
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "[::1]:8080",
            "[::1]",
            "gw.example:8443",
        ] {
            assert!(http.allows_host(Some(host)), "{host}");
        }
        for host in [
            "evil.example:8080",
            "gw.example",
            "gw.example:8080",
            "localhost.evil.example",
            "[::2]:8080",
        ] {
            assert!(!http.allows_host(Some(host)), "{host}");
        }
        assert!(!http.allows_host(None));
        assert!(HttpConfig::default()
            .allowed_hosts(["*"])
            .allows_host(Some("any.example")));
        let ok =
            |list: &[&str]| check_hosts(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(ok(&["localhost", "127.0.0.1:8080", "[::1]", "*.example"]).is_err());
        assert!(ok(&["localhost", "127.0.0.1:8080", "[::1]"]).is_ok());
        for bad in [
            &["*", "a.example"][..],
            &["http://a.example"],
            &["a.example/"],
            &[""],
            &["u@a.example"],
        ] {
            let err = ok(bad).unwrap_err();
            assert_eq!(err.key(), Some("http.allowed_hosts"), "{err}");
        }
    }

    #[test]
    fn origins_are_checked() {
        let ok =
            |list: &[&str]| check_origins(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(ok(&[]).is_ok());
        assert!(ok(&["*"]).is_ok());
        assert!(ok(&["https://app.example", "http://localhost:3000"]).is_ok());
        for bad in [
            &["*", "https://a.example"][..],
            &["https://app.example/"],
            &["app.example"],
            &["ftp://app.example"],
            &["https://"],
        ] {
            let err = ok(bad).unwrap_err();
            assert_eq!(err.key(), Some("http.cors_allowed_origins"), "{err}");
            assert!(
                err.to_string().starts_with("http.cors_allowed_origins: "),
                "{err}"
            );
        }
    }
}
