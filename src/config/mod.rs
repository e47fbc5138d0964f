//! Configuration: the contract's TOML keys, their defaults, and their checks.
//!
//! Every key is optional. Unknown keys, wrong types and impossible values are
//! errors whose message names the key (`budget.max_reads must be at least 1`),
//! so a typo stops start-up instead of silently running on a default.

pub(crate) mod cidr;

use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// The whole configuration file.
///
/// ```
/// use fanout_budget::Config;
///
/// let config = Config::from_toml("[budget]\nmax_reads = 20\n").unwrap();
/// assert_eq!(config.budget.max_reads, 20);
/// let typo = Config::from_toml("[budget]\nmax_read = 20\n").unwrap_err();
/// assert!(typo.to_string().contains("max_read"), "{typo}");
/// ```
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[budget]`: the per-request read budget.
    pub budget: BudgetConfig,
    /// `[http]`: limits on the inbound HTTP request.
    pub http: HttpConfig,
    /// `[hosts."HOST:PORT"]`: process-wide caps per upstream host.
    pub hosts: BTreeMap<String, HostConfig>,
    /// `[rate_limit]`: inbound per-IP limiting and internal callers.
    pub rate_limit: RateLimitConfig,
    /// `[redis]`: shared state across replicas.
    pub redis: RedisConfig,
    /// `[upstream]`: limits on what one upstream response may cost.
    pub upstream: UpstreamConfig,
}

/// `[upstream]` (an addition to the contract's keys)
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Bytes read from one upstream response at most; a larger body is an
    /// `UPSTREAM_ERROR` (16 MiB by default).
    pub max_response_bytes: usize,
    /// Redirects one read may follow; each hop is a read of its own,
    /// charged and capped like any other (5 by default; 0: a 3xx answer is
    /// returned as it is).
    pub max_redirects: u32,
    /// Body bytes of all the upstream answers one inbound request keeps
    /// (each is kept for the request's de-duplication); past it a read's
    /// answer is an `UPSTREAM_ERROR` (64 MiB by default).
    pub max_request_bytes: usize,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            max_response_bytes: 16 << 20,
            max_redirects: 5,
            max_request_bytes: 64 << 20,
        }
    }
}

/// `[budget]`
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetConfig {
    /// Upstream reads per inbound HTTP request, shared by every operation of a batch.
    pub max_reads: u64,
    /// The same, for callers that present the internal token.
    pub internal_max_reads: u64,
    /// Timeout of one upstream read, in milliseconds.
    pub read_timeout_ms: u64,
    /// Deadline of the whole inbound HTTP request, in milliseconds.
    pub deadline_ms: u64,
    /// Upstream reads in flight at once for one inbound HTTP request.
    pub max_concurrent_reads: usize,
    /// Refuse a batch whose worst-case reads exceed the budget, before any read.
    pub refuse_over_estimate: bool,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        Self {
            max_reads: 100,
            internal_max_reads: 1000,
            read_timeout_ms: 5000,
            deadline_ms: 30_000,
            max_concurrent_reads: 8,
            refuse_over_estimate: false,
        }
    }
}

impl BudgetConfig {
    /// `read_timeout_ms` as a duration.
    pub fn read_timeout(&self) -> Duration {
        Duration::from_millis(self.read_timeout_ms)
    }

    /// `deadline_ms` as a duration.
    pub fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms)
    }
}

/// `[http]`
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// More operations in one batch: the whole batch is rejected, nothing runs.
    pub max_batch_operations: usize,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// Memory for parsed documents kept by query text, so a text seen
    /// before is not parsed again (each entry weighed as its text plus its
    /// document's estimated heap, `documents::weight`); `0`: every query is
    /// parsed.
    pub document_cache_bytes: usize,
    /// Field selections one operation may expand to, fragments expanded
    /// (counted in linear time before async-graphql validates it); more:
    /// `GRAPHQL_VALIDATION_FAILED`, nothing runs.
    pub max_selections: u64,
    /// How long a client may take to send a request's headers, in
    /// milliseconds (then the connection is closed).
    pub header_read_timeout_ms: u64,
    /// How long a client may take to send a request's body, in milliseconds
    /// (never past the request deadline); then 408 and the connection closed.
    pub body_read_timeout_ms: u64,
    /// Open inbound connections at most; more wait in the listen backlog.
    pub max_connections: usize,
    /// Open inbound connections from one client at most (keyed as
    /// `[rate_limit]` keys clients; trusted proxies have no share); more are
    /// closed as soon as they are accepted.
    pub max_connections_per_client: usize,
    /// Bytes of one answer (the whole batch's JSON) at most; more: the
    /// answer is `RESPONSE_TOO_LARGE` instead.
    pub max_response_bytes: usize,
    /// Memory one request's answer (the whole batch's) may hold while it is
    /// built, counted as resolvers produce it (`memory.rs`: each value 80
    /// bytes plus its string bytes, each object entry 112, each field error
    /// 1.5 KiB plus its message, extensions and path, each resolve still
    /// running 4 KiB). Past it the request stops at once and answers
    /// `RESPONSE_TOO_LARGE`.
    pub max_answer_bytes: usize,
    /// Memory all requests in flight may hold at once: answers being built
    /// and being written to clients, and the upstream bodies they keep. The request that would pass it
    /// stops and answers 503 `OVERLOADED` (`Retry-After: 1`).
    pub max_inflight_bytes: usize,
    /// How long writing a response to a connection may make no progress (the
    /// client reads nothing), in milliseconds; then the connection is closed
    /// and its response dropped.
    pub write_timeout_ms: u64,
    /// Memory for the query texts of Apollo automatic persisted queries,
    /// kept by their SHA-256 (each weighed as its text plus 128 bytes) in
    /// two generations of half each: a text asked for once per generation
    /// stays. `0`: persisted queries are off
    /// (a hash-only request is `PERSISTED_QUERY_NOT_SUPPORTED`).
    pub persisted_queries_bytes: usize,
    /// Origins a browser app may call the endpoint from (CORS), each
    /// `scheme://host[:port]`, or `["*"]` for any; empty: no CORS headers,
    /// so browsers keep the endpoint same-origin.
    pub cors_allowed_origins: Vec<String>,
    /// Whether a `GET` carrying a GraphQL request must show it was not sent
    /// by a page on another site ([`CsrfGet`]). Unset: the application's
    /// default — [`CsrfGet::RequirePreflight`] for the library
    /// ([`csrf_get`](Self::csrf_get)); the gateway ships `allow`.
    pub csrf_get: Option<CsrfGet>,
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

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            max_batch_operations: 20,
            max_body_bytes: 65_536,
            document_cache_bytes: 8 << 20,
            max_selections: 2_000,
            header_read_timeout_ms: 5_000,
            body_read_timeout_ms: 10_000,
            max_connections: 512,
            max_connections_per_client: 64,
            max_response_bytes: 16 << 20,
            max_answer_bytes: 160 << 20,
            max_inflight_bytes: 512 << 20,
            write_timeout_ms: 10_000,
            persisted_queries_bytes: 1 << 20,
            cors_allowed_origins: Vec::new(),
            csrf_get: None,
        }
    }
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
    pub fn csrf_get(&self) -> CsrfGet {
        self.csrf_get.unwrap_or_default()
    }
}

/// `[hosts."HOST:PORT"]`
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    /// Process-wide in-flight reads to this host; 0 rejects every read.
    pub max_concurrent: u32,
    /// How long a read may wait for a slot (never past the request deadline).
    pub acquire_wait_ms: u64,
    /// Identical `GET`/`HEAD` reads (same URL, same headers, no body) in
    /// flight at the same moment in different inbound requests share one
    /// upstream request; the requests that join it are not charged (off by
    /// default: an upstream that answers each caller differently, beyond
    /// what the read's headers say, must not be coalesced). See
    /// [`Upstream::read`](crate::read::Upstream::read).
    pub coalesce: bool,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            max_concurrent: 256,
            acquire_wait_ms: 50,
            coalesce: false,
        }
    }
}

impl HostConfig {
    /// `acquire_wait_ms` as a duration.
    pub fn acquire_wait(&self) -> Duration {
        Duration::from_millis(self.acquire_wait_ms)
    }
}

/// `[rate_limit]`
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    /// Inbound requests per minute per client IP, on `/graphql` only.
    pub requests_per_minute: u32,
    /// The internal callers' token; empty: no internal callers.
    /// The environment variable `FANOUT_INTERNAL_TOKEN` overrides it.
    pub internal_token: String,
    /// CIDRs whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<String>,
    /// IPv4 clients are keyed by this prefix length (32: each address).
    pub ipv4_prefix: u8,
    /// IPv6 clients are keyed by this prefix length (64: one subnet, what
    /// one host is usually given).
    pub ipv6_prefix: u8,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            requests_per_minute: 300,
            internal_token: String::new(),
            trusted_proxies: Vec::new(),
            ipv4_prefix: 32,
            ipv6_prefix: 64,
        }
    }
}

impl fmt::Debug for RateLimitConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a secret: never print it.
        f.debug_struct("RateLimitConfig")
            .field("requests_per_minute", &self.requests_per_minute)
            .field(
                "internal_token",
                &if self.internal_token.is_empty() {
                    ""
                } else {
                    "<set>"
                },
            )
            .field("trusted_proxies", &self.trusted_proxies)
            .field("ipv4_prefix", &self.ipv4_prefix)
            .field("ipv6_prefix", &self.ipv6_prefix)
            .finish()
    }
}

/// `[redis]`
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// `redis://host:port` of one server; empty: in-process limits only
    /// (unless `cluster_nodes` is set).
    pub url: String,
    /// A Redis Cluster instead of one server: some of its nodes
    /// (`redis://host:port` each, as `redis::cluster::ClusterClient` takes
    /// them), from which the client learns the rest; empty: no cluster.
    /// Exclusive with `url`.
    pub cluster_nodes: Vec<String>,
    /// What to do while Redis is unreachable.
    pub failure_mode: FailureMode,
    /// Prefix of every key, so several deployments can share one Redis.
    pub key_prefix: String,
    /// Timeout of one Redis call, in milliseconds (then `failure_mode` applies).
    pub timeout_ms: u64,
    /// How long Redis keeps what a replica holds of a host's cap (and its
    /// demand) after the replica last reported, in milliseconds: a crashed
    /// replica's slots free up after it.
    pub lease_ms: u64,
    /// Slots of a host's cap a replica may hold beyond its reads in flight,
    /// so the next reads start without a round trip; also the most
    /// admissions of one client a replica takes from the shared per-IP limit
    /// at once. 0: no spare slots, one admission a call.
    pub lease_block: u32,
    /// While a replica uses a host, it reports its demand to Redis this
    /// often, in milliseconds, and gives back what it no longer needs: how
    /// long another replica may wait for slots this one holds idle. Less
    /// than a third of `lease_ms`.
    pub refresh_ms: u64,
    /// After a failed Redis call, calls skip Redis (and `failure_mode`
    /// applies at once) for this long, in milliseconds, while recovery is
    /// probed in the background.
    pub backoff_ms: u64,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            cluster_nodes: Vec::new(),
            failure_mode: FailureMode::Open,
            key_prefix: "fanout".into(),
            timeout_ms: 100,
            lease_ms: 5000,
            lease_block: 8,
            refresh_ms: 50,
            backoff_ms: 1000,
        }
    }
}

impl RedisConfig {
    /// Whether shared state is on Redis: `url` or `cluster_nodes` is set.
    pub fn is_enabled(&self) -> bool {
        !self.url.is_empty() || !self.cluster_nodes.is_empty()
    }
}

/// `[redis] failure_mode`
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FailureMode {
    /// Fall back to the in-process limits.
    #[default]
    Open,
    /// Answer 503 `UNAVAILABLE`.
    Closed,
}

/// A configuration that could not be used; the message names the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Parses TOML, then [`validate`](Self::validate)s it.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: Config =
            toml::from_str(text).map_err(|e| ConfigError(describe_toml_error(text, &e)))?;
        config.validate()?;
        Ok(config)
    }

    /// Applies the environment's overrides (`FANOUT_INTERNAL_TOKEN`).
    pub fn with_env(mut self) -> Self {
        if let Ok(token) = std::env::var("FANOUT_INTERNAL_TOKEN") {
            self.rate_limit.internal_token = token;
        }
        self
    }

    /// Rejects impossible values, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let b = &self.budget;
        let positive = [
            ("budget.max_reads", b.max_reads),
            ("budget.internal_max_reads", b.internal_max_reads),
            ("budget.read_timeout_ms", b.read_timeout_ms),
            ("budget.deadline_ms", b.deadline_ms),
            ("budget.max_concurrent_reads", b.max_concurrent_reads as u64),
            (
                "http.max_batch_operations",
                self.http.max_batch_operations as u64,
            ),
            ("http.max_body_bytes", self.http.max_body_bytes as u64),
            ("http.max_selections", self.http.max_selections),
            (
                "http.header_read_timeout_ms",
                self.http.header_read_timeout_ms,
            ),
            ("http.body_read_timeout_ms", self.http.body_read_timeout_ms),
            ("http.max_connections", self.http.max_connections as u64),
            (
                "http.max_connections_per_client",
                self.http.max_connections_per_client as u64,
            ),
            ("http.write_timeout_ms", self.http.write_timeout_ms),
            (
                "http.max_response_bytes",
                self.http.max_response_bytes as u64,
            ),
            ("http.max_answer_bytes", self.http.max_answer_bytes as u64),
            (
                "http.max_inflight_bytes",
                self.http.max_inflight_bytes as u64,
            ),
            (
                "rate_limit.requests_per_minute",
                self.rate_limit.requests_per_minute as u64,
            ),
            // 0 would time out every call, renew and probe in a busy loop.
            ("redis.timeout_ms", self.redis.timeout_ms),
            ("redis.lease_ms", self.redis.lease_ms),
            ("redis.refresh_ms", self.redis.refresh_ms),
            ("redis.backoff_ms", self.redis.backoff_ms),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(ConfigError(format!("{key} must be at least 1")));
            }
        }
        for host in self.hosts.keys() {
            if !is_host_port(host) {
                return Err(ConfigError(format!(
                    "hosts.\"{host}\": a host key must be HOST:PORT (e.g. \"registry.local:5000\")"
                )));
            }
        }
        for cidr in &self.rate_limit.trusted_proxies {
            if cidr::Cidr::parse(cidr).is_none() {
                return Err(ConfigError(format!(
                    "rate_limit.trusted_proxies: \"{cidr}\" is not a CIDR (e.g. \"10.0.0.0/8\")"
                )));
            }
        }
        check_origins(&self.http.cors_allowed_origins).map_err(ConfigError)?;
        let r = &self.rate_limit;
        if r.ipv4_prefix > 32 {
            return Err(ConfigError(
                "rate_limit.ipv4_prefix must be at most 32".into(),
            ));
        }
        if r.ipv6_prefix > 128 {
            return Err(ConfigError(
                "rate_limit.ipv6_prefix must be at most 128".into(),
            ));
        }
        check_redis(&self.redis).map_err(ConfigError)?;
        Ok(())
    }
}

/// How long a share of a host's cap on Redis may be used after the claim
/// that granted it was sent: two thirds of `lease_ms`, so Redis still holds
/// it then. `timeout_ms` is less ([`check_redis`]): a claim answered later
/// would arrive void.
pub(crate) fn share_use(redis: &RedisConfig) -> Duration {
    Duration::from_millis(redis.lease_ms) / 3 * 2
}

/// Checks `[redis]`: its durations' rules, `url` and `cluster_nodes` (the
/// message names the key).
fn check_redis(redis: &RedisConfig) -> Result<(), String> {
    let scheme = |key: &str, url: &str| {
        if url.starts_with("redis://") || url.starts_with("rediss://") {
            Ok(())
        } else {
            Err(format!(
                "{key}: \"{url}\" must start with redis:// or rediss://"
            ))
        }
    };
    let url = &redis.url;
    let nodes = &redis.cluster_nodes;
    // A claim's answer slower than its share's use would arrive void.
    if Duration::from_millis(redis.timeout_ms) >= share_use(redis) {
        return Err(format!(
            "redis.timeout_ms must be less than two thirds of redis.lease_ms ({} ms)",
            redis.lease_ms
        ));
    }
    if redis.refresh_ms.saturating_mul(3) >= redis.lease_ms {
        return Err(format!(
            "redis.refresh_ms must be less than a third of redis.lease_ms ({} ms)",
            redis.lease_ms
        ));
    }
    if !url.is_empty() && !nodes.is_empty() {
        return Err(
            "redis.cluster_nodes: set redis.url (one server) or redis.cluster_nodes \
                    (a cluster's nodes), not both"
                .into(),
        );
    }
    if !url.is_empty() {
        scheme("redis.url", url)?;
        #[cfg(feature = "redis")]
        if let Err(e) = redis::Client::open(url.as_str()) {
            return Err(format!("redis.url: \"{url}\": {e}"));
        }
    }
    for node in nodes {
        scheme("redis.cluster_nodes", node)?;
        #[cfg(feature = "redis")]
        match redis::IntoConnectionInfo::into_connection_info(node.as_str()) {
            Err(e) => return Err(format!("redis.cluster_nodes: \"{node}\": {e}")),
            Ok(info) if info.redis.db != 0 => {
                return Err(format!(
                    "redis.cluster_nodes: \"{node}\": a cluster has database 0 only"
                ))
            }
            Ok(_) => {}
        }
    }
    #[cfg(feature = "redis")]
    if !nodes.is_empty() {
        // Same credentials, protocol and TLS on every node (nothing connects).
        if let Err(e) = redis::cluster::ClusterClient::new(nodes.iter().map(String::as_str)) {
            return Err(format!("redis.cluster_nodes: {e}"));
        }
    }
    Ok(())
}

fn is_host_port(key: &str) -> bool {
    match key.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok(),
        None => false,
    }
}

/// `<dotted.key>: <what is wrong> (line N)`, the key found from the error's
/// position: the key on that line, under the nearest `[table]` above it.
fn describe_toml_error(text: &str, err: &toml::de::Error) -> String {
    let message = err.message().trim_end();
    let Some(span) = err.span() else {
        return format!("invalid configuration: {message}");
    };
    let before = &text[..span.start.min(text.len())];
    let line_no = before.matches('\n').count() + 1;
    let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
    if line.starts_with('[') {
        let table = line.trim_matches(|c| c == '[' || c == ']').trim();
        return format!("{table}: {message} (line {line_no})");
    }
    let above = &before[..before.rfind('\n').unwrap_or(0)];
    let table = above
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    let key = line
        .split('=')
        .next()
        .map(str::trim)
        .filter(|k| !k.is_empty() && !k.starts_with('['));
    let path = match (table, key) {
        (Some(t), Some(k)) => format!("{t}.{k}"),
        (None, Some(k)) => k.to_string(),
        (Some(t), None) => t,
        (None, None) => "configuration".to_string(),
    };
    format!("{path}: {message} (line {line_no})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_timeout_defaults_to_ten_seconds_and_must_be_positive() {
        let config = Config::from_toml("").unwrap();
        assert_eq!(config.http.write_timeout(), Duration::from_secs(10));
        let set = Config::from_toml("[http]\nwrite_timeout_ms = 300\n").unwrap();
        assert_eq!(set.http.write_timeout_ms, 300);
        let err = Config::from_toml("[http]\nwrite_timeout_ms = 0\n").unwrap_err();
        assert_eq!(err.0, "http.write_timeout_ms must be at least 1");
    }

    #[test]
    fn redis_cluster_nodes_are_checked() {
        let two = "cluster_nodes = [\"redis://10.0.0.1:6379\", \"redis://10.0.0.2:6379\"]";
        let config = Config::from_toml(&format!("[redis]\n{two}\n")).unwrap();
        assert_eq!(config.redis.cluster_nodes.len(), 2);
        assert!(config.redis.url.is_empty() && config.redis.is_enabled());
        assert!(!Config::default().redis.is_enabled());
        let mut bad = vec![
            (
                format!("url = \"redis://10.0.0.9:6379\"\n{two}"),
                "redis.cluster_nodes: set redis.url (one server) or redis.cluster_nodes",
            ),
            (
                "cluster_nodes = [\"10.0.0.1:6379\"]".into(),
                "redis.cluster_nodes: \"10.0.0.1:6379\" must start with redis:// or rediss://",
            ),
            (
                "cluster_nodes = \"redis://10.0.0.1:6379\"".into(),
                "redis.cluster_nodes: invalid type",
            ),
        ];
        if cfg!(feature = "redis") {
            bad.push((
                "cluster_nodes = [\"redis://10.0.0.1:6379/2\"]".into(),
                "redis.cluster_nodes: \"redis://10.0.0.1:6379/2\": a cluster has database 0 only",
            ));
            bad.push((
                "cluster_nodes = [\"redis://:one@10.0.0.1:6379\", \"redis://:two@10.0.0.2:6379\"]"
                    .into(),
                "redis.cluster_nodes: Cannot use different password",
            ));
        }
        for (table, want) in bad {
            let err = Config::from_toml(&format!("[redis]\n{table}\n")).unwrap_err();
            assert!(err.0.starts_with(want), "{table}: {err}");
        }
    }
}

/// Checks `[http] cors_allowed_origins` (the message names the key).
fn check_origins(origins: &[String]) -> Result<(), String> {
    let key = "http.cors_allowed_origins";
    if origins.iter().any(|o| o == "*") && origins.len() > 1 {
        return Err(format!("{key}: \"*\" allows every origin; list it alone"));
    }
    for origin in origins.iter().filter(|o| *o != "*") {
        let ok = origin.split_once("://").is_some_and(|(scheme, rest)| {
            matches!(scheme, "http" | "https")
                && !rest.is_empty()
                && !rest.contains(['/', '?', '#', ' ', '*'])
        }) && http::HeaderValue::from_str(origin).is_ok();
        if !ok {
            return Err(format!(
                "{key}: \"{origin}\" is not an origin (scheme://host[:port], e.g. \"https://app.example\", no path)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod origin_tests {
    use super::check_origins;

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
            assert!(err.starts_with("http.cors_allowed_origins"), "{err}");
        }
    }
}
