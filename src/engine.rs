//! The engine: the long-lived state every request's reads share.
//!
//! One [`Engine`] lives as long as the process (it is a cheap `Arc` clone). It
//! owns what must outlive any single request: the configuration, the
//! transport (a pooled `reqwest::Client` by default), the per-host
//! [`HostLimiter`], the parsed-document cache and the internal callers'
//! token. For each inbound HTTP request it opens one
//! [`FanoutRequest`](crate::request::FanoutRequest) (`request.rs`) and hands it, once,
//! what the request's reads need (the read path's parts).
//!
//! Time is tokio's clock everywhere — deadlines, read timeouts, waits — so
//! a test that pauses it (`tokio::time::pause`) moves all of them together.

use crate::chain::Received;
use crate::config::Config;
use crate::cost::CostTable;
use crate::document::cache::Documents;
use crate::document::persisted::PersistedQueries;
use crate::inbound::identity::{Caller, ClientPrefix, InternalToken, TrustedProxies};
use crate::inbound::quota::{ClientQuota, QuotaStore, Ticket};
use crate::memory::{ClientKey, MemoryPool, SocketMemory};
use crate::metrics::RequestMetrics;
use crate::read::auth::Auth;
use crate::read::budget::RequestBudget;
use crate::read::cache::AnswerCache;
use crate::read::coalesce::Coalesce;
use crate::read::hosts::{HostLimiter, HostTable, LocalHostCaps};
use crate::read::quota::{QuotaBoard, Quotas};
use crate::read::share::Shares;
use crate::read::transport::{HttpTransport, Transport};
use crate::read::{ReadParts, RequestReads};
use crate::request::{FanoutRequest, Pricing};
use std::sync::Arc;
use tokio::time::Instant;

/// The long-lived engine state. Clone it freely.
///
/// ```
/// use fanout_budget::{Config, Engine, inbound::Caller};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let engine = Engine::new(Config::default());
/// let request = engine.begin_request(Caller::Public);
/// assert_eq!(request.budget().used(), 0);
/// # }
/// ```
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    config: Config,
    /// What every request's reads need, handed over as one `Arc`.
    reads: Arc<ReadParts>,
    token: InternalToken,
    costs: Option<CostTable>,
    /// Parsed documents kept by query text, for every integration served
    /// by this engine (`http.document_cache_bytes` in all).
    documents: Documents,
    /// Apollo persisted queries' texts by hash (`http.persisted_queries_bytes`).
    persisted: PersistedQueries,
    /// The clients' read quotas (`[quota]`), when any class has one.
    quota: Option<Arc<ClientQuota>>,
    /// What open sockets hold (`subscriptions.max_bytes`), by client.
    sockets: SocketMemory,
    /// How a socket's client is keyed: as the per-IP limiter keys it.
    socket_clients: (TrustedProxies, ClientPrefix),
    /// A place for each socket that may be open
    /// (`subscriptions.max_connections`).
    socket_places: Arc<tokio::sync::Semaphore>,
}

/// Builds an [`Engine`] with non-default parts.
///
/// ```
/// use fanout_budget::{Config, Engine, read::LocalHostCaps};
/// use std::sync::Arc;
///
/// let config = Config::default();
/// let engine = Engine::builder(config.clone())
///     .host_limiter(Arc::new(LocalHostCaps::new(config.hosts.clone())))
///     .build();
/// # drop(engine);
/// ```
pub struct EngineBuilder {
    config: Config,
    client: Option<reqwest::Client>,
    transport: Option<Arc<dyn Transport>>,
    hosts: Option<Arc<dyn HostLimiter>>,
    costs: Option<CostTable>,
    known_hosts: Vec<String>,
    quota_board: Option<Arc<dyn QuotaBoard>>,
    quota_store: Option<Arc<dyn QuotaStore>>,
}

impl std::fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl EngineBuilder {
    /// Uses this HTTP client (its pool, TLS and proxy settings) for every read.
    ///
    /// Build it with `redirect(reqwest::redirect::Policy::none())`: the
    /// engine follows redirects itself, each hop a charged read
    /// (`upstream.max_redirects`). A response whose final URL is not the
    /// one read (the client followed a redirect uncharged) is refused as
    /// `UPSTREAM_ERROR`.
    pub fn client(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Sends reads with this transport instead of reqwest (tests, benchmarks,
    /// a custom client stack). `client` and `[upstream] max_response_bytes` then do not apply.
    pub fn transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    /// Uses this per-host limiter instead of the in-process caps from `[hosts]`.
    pub fn host_limiter(mut self, hosts: Arc<dyn HostLimiter>) -> Self {
        self.hosts = Some(hosts);
        self
    }

    /// Shares the hosts' quota gates (`read/quota.rs`) with the fleet on
    /// `board` (Redis: `backends::redis::SharedLimits::quota_board`):
    /// a host that told one replica its quota is spent is refused on every
    /// replica until the time it gave.
    pub fn quota_board(mut self, board: Arc<dyn QuotaBoard>) -> Self {
        self.quota_board = Some(board);
        self
    }

    /// Keeps the clients' read quotas (`[quota]`) in `store`, shared by the
    /// fleet (Redis: `backends::redis::SharedLimits::quota_store`), instead
    /// of in process; while it is down, `redis.failure_mode` applies.
    pub fn quota_store(mut self, store: Arc<dyn QuotaStore>) -> Self {
        self.quota_store = Some(store);
        self
    }

    /// Gives `host` (`HOST:PORT`, as [`host_name`](crate::read::host_name) names a
    /// URL's host) an entry of its own without a `[hosts]` table: its own
    /// `host` label on the metrics, no cap. The hosts with a `[hosts]` table
    /// have one already; every other host shares one entry and the label
    /// `host="other"` ([`OTHER_HOSTS`](crate::read::OTHER_HOSTS)), so the
    /// metrics stay bounded whatever hosts redirects and `permit` names
    /// reach. Meant for the few upstreams an application reads by design
    /// (the gateway names its `--upstream`).
    ///
    /// ```
    /// use fanout_budget::{Config, Engine, read::host_name};
    ///
    /// let upstream = "http://registry.internal:5000".parse().unwrap();
    /// let engine = Engine::builder(Config::default())
    ///     .known_host(host_name(&upstream))
    ///     .build();
    /// # drop(engine);
    /// ```
    pub fn known_host(mut self, host: impl Into<String>) -> Self {
        self.known_hosts.push(host.into().to_ascii_lowercase());
        self
    }

    /// Prices every operation with `costs` before it runs (the cost preview:
    /// `extensions.fanout.requested`, and `refuse_over_estimate`).
    pub fn costs(mut self, costs: CostTable) -> Self {
        self.costs = Some(costs);
        self
    }

    /// The engine.
    pub fn build(self) -> Engine {
        let max_response_bytes = self.config.upstream.max_response_bytes;
        let transport = self.transport.unwrap_or_else(|| {
            let client = self.client.unwrap_or_else(|| {
                let mut client = reqwest::Client::builder()
                    // The engine follows redirects itself, charging each hop.
                    .redirect(reqwest::redirect::Policy::none());
                // The CAs of `[upstreams] ca_file` besides the system's roots
                // (read and checked by the configuration's validation).
                for table in self.config.upstreams.values() {
                    let pem = std::fs::read(&table.ca_file).unwrap_or_default();
                    for ca in reqwest::Certificate::from_pem_bundle(&pem).unwrap_or_default() {
                        client = client.add_root_certificate(ca);
                    }
                }
                client
                    .build()
                    .expect("a default reqwest client always builds")
            });
            Arc::new(HttpTransport::new(client, max_response_bytes))
        });
        let hosts = self
            .hosts
            .unwrap_or_else(|| Arc::new(LocalHostCaps::new(self.config.hosts.clone())));
        let token = InternalToken::new(&self.config.rate_limit.internal_token);
        let documents = Documents::new(self.config.http.document_cache_bytes);
        let persisted = PersistedQueries::new(self.config.http.persisted_queries_bytes);
        let upstream = &self.config.upstream;
        // The configured upstreams are known hosts: a label and a quota gate
        // of their own.
        let mut known = self.known_hosts.clone();
        known.extend(
            (self.config.upstreams.values())
                .filter_map(|t| t.base_url())
                .map(|url| crate::read::host_name(&url)),
        );
        // The hosts of the upstreams that are services on the engine.
        let propagating: Vec<String> = (self.config.upstreams.values())
            .filter(|t| t.propagate)
            .filter_map(|t| t.base_url())
            .map(|url| crate::read::host_name(&url))
            .collect();
        let host_table = HostTable::new(
            &self.config.hosts,
            known.iter().map(String::as_str),
            &propagating,
        );
        let quotas = Quotas::new(
            (self.config.hosts.keys())
                .map(String::as_str)
                .chain(known.iter().map(String::as_str)),
        );
        let quotas = match self.quota_board {
            Some(board) => quotas.shared(board),
            None => Arc::new(quotas),
        };
        let reads = Arc::new(ReadParts {
            transport,
            hosts,
            host_table,
            coalesce: Arc::new(Coalesce::new()),
            read_timeout: self.config.budget.read_timeout(),
            max_redirects: upstream.max_redirects,
            max_request_bytes: upstream.max_request_bytes as u64,
            memory: Arc::new(MemoryPool::new(self.config.http.max_inflight_bytes)),
            max_answer_bytes: self.config.http.max_answer_bytes,
            auth: Auth::new(&self.config.upstreams),
            quotas,
            cache: AnswerCache::new(upstream.cache_bytes),
            shares: Shares::new(&self.config.upstreams),
            metrics: RequestMetrics::default(),
        });
        let mode = self.config.redis.failure_mode;
        let quota = ClientQuota::new(&self.config).map(|quota| match self.quota_store {
            Some(store) => Arc::new(quota.shared(store, mode)),
            None => Arc::new(quota),
        });
        Engine {
            inner: Arc::new(EngineInner {
                reads,
                token,
                costs: self.costs,
                documents,
                persisted,
                quota,
                sockets: SocketMemory::new(
                    self.config.subscriptions.max_bytes,
                    self.config.subscriptions.max_bytes_per_client,
                ),
                socket_clients: (
                    TrustedProxies::new(&self.config.rate_limit.trusted_proxies),
                    ClientPrefix::new(
                        self.config.rate_limit.ipv4_prefix,
                        self.config.rate_limit.ipv6_prefix,
                    ),
                ),
                socket_places: Arc::new(tokio::sync::Semaphore::new(
                    (self.config.subscriptions).open_sockets(self.config.http.max_connections),
                )),
                config: self.config,
            }),
        }
    }
}

impl Engine {
    /// An engine with the default parts for `config`.
    pub fn new(config: Config) -> Self {
        Self::builder(config).build()
    }

    /// A builder, to inject a client, a transport, a host limiter or costs.
    pub fn builder(config: Config) -> EngineBuilder {
        EngineBuilder {
            config,
            client: None,
            transport: None,
            hosts: None,
            costs: None,
            known_hosts: Vec::new(),
            quota_board: None,
            quota_store: None,
        }
    }

    /// The configuration the engine runs on.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The bytes the cache of immutable answers weighs now (at most
    /// `upstream.cache_bytes`).
    pub fn cache_weight(&self) -> u64 {
        self.inner.reads.cache.weighted_size()
    }

    /// The declared field costs, if any.
    pub fn costs(&self) -> Option<&CostTable> {
        self.inner.costs.as_ref()
    }

    /// The per-host limiter.
    pub fn hosts(&self) -> &dyn HostLimiter {
        &*self.inner.reads.hosts
    }

    /// The parsed-document cache.
    pub(crate) fn documents(&self) -> &Documents {
        &self.inner.documents
    }

    /// The handles of what each request and operation records.
    pub(crate) fn metrics(&self) -> &RequestMetrics {
        &self.inner.reads.metrics
    }

    /// The persisted queries' texts.
    pub(crate) fn persisted(&self) -> &PersistedQueries {
        &self.inner.persisted
    }

    /// Who presents these request headers: an internal caller only on an
    /// exact (constant-time) match of the internal token.
    pub fn identify(&self, headers: &http::HeaderMap) -> Caller {
        self.inner.token.identify(headers)
    }

    /// Who presents `token` (a WebSocket's `connection_init` payload): an
    /// internal caller only on an exact (constant-time) match.
    pub(crate) fn identify_token(&self, token: &str) -> Caller {
        self.inner.token.identify_value(token.as_bytes())
    }

    /// Opens the scope of the inbound HTTP request `parts` belongs to: the
    /// caller is the [`Caller`] the rate-limit layer left in its extensions,
    /// else whoever its internal-token header says.
    pub(crate) fn open_request(&self, parts: &http::request::Parts) -> FanoutRequest {
        let caller = parts
            .extensions
            .get::<Caller>()
            .copied()
            .unwrap_or_else(|| self.identify(&parts.headers));
        self.metrics().request(caller == Caller::Internal);
        let queries_only = parts.method == http::Method::GET;
        let mut extensions = parts.extensions.clone();
        // A caller's `Fanout-Budget` lowers the request's limits (`chain/`).
        let max_hops = self.config().budget.max_hops;
        if let Some(received) = Received::from_headers(&parts.headers, max_hops) {
            extensions.insert(received);
        }
        self.open(caller, extensions, queries_only, Some(parts))
    }

    /// Opens the budget and de-duplication scope of one inbound HTTP request.
    ///
    /// The deadline starts now; the limit depends on who calls
    /// (`max_reads`, or `internal_max_reads` for [`Caller::Internal`]).
    /// Without the HTTP request there is no client to key a read quota by:
    /// with `[quota]` on for the caller's class, such a scope can send no
    /// read (its budget is 0 until a reservation, which fails); the
    /// integrations open scopes from the HTTP request and key the quota by
    /// its client.
    pub fn begin_request(&self, caller: Caller) -> FanoutRequest {
        self.open(caller, http::Extensions::new(), false, None)
    }

    fn open(
        &self,
        caller: Caller,
        extensions: http::Extensions,
        queries_only: bool,
        parts: Option<&http::request::Parts>,
    ) -> FanoutRequest {
        let ticket = self.ticket(caller, parts);
        let costs = self.costs().is_some();
        let pricing = Pricing {
            costs,
            refuse_over: self.config().budget.refuse_over_estimate,
            event: false,
        };
        self.open_with(caller, extensions, queries_only, ticket, pricing, None)
    }

    /// The ticket on its client's read quota of a request from `caller`
    /// whose HTTP parts are `parts`, when its class has a quota.
    pub(crate) fn ticket(
        &self,
        caller: Caller,
        parts: Option<&http::request::Parts>,
    ) -> Option<Ticket> {
        (self.inner.quota.as_ref()).and_then(|quota| quota.ticket(caller, parts))
    }

    /// Opens a scope for `caller` with this `ticket` on its client's read
    /// quota, its operations priced as `pricing` says, what it holds taken
    /// from `memory` (else the requests' pool, `http.max_inflight_bytes`).
    /// A WebSocket connection opens one per event, in its client's share of
    /// the sockets' pool (`graphql/socket/connection.rs`).
    pub(crate) fn open_with(
        &self,
        caller: Caller,
        extensions: http::Extensions,
        queries_only: bool,
        ticket: Option<Ticket>,
        pricing: Pricing,
        memory: Option<Arc<MemoryPool>>,
    ) -> FanoutRequest {
        let b = &self.config().budget;
        let limit = match caller {
            Caller::Internal => b.internal_max_reads,
            Caller::Public => b.max_reads,
        };
        // What a caller's `Fanout-Budget` said, if it said anything: the
        // limits lowered, and the hop count its reads send on (`chain/`).
        let received = extensions.get::<Received>();
        let limit = received.map_or(limit, |r| r.limit(limit));
        let deadline = Instant::now() + received.map_or(b.deadline(), |r| r.deadline(b.deadline()));
        let hops = crate::chain::hops_on(received);
        let past_max_hops = received.and_then(Received::past_max_hops);
        let (measure, quota_measure) = (b.mode.measures(), self.config().quota.mode.measures());
        // The client is named only in measure mode's log.
        let client = (measure || quota_measure)
            .then(|| extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>())
            .flatten()
            .map(|peer| peer.0.ip());
        let budget = RequestBudget::new(limit, b.max_concurrent_reads, deadline)
            .measuring(measure, quota_measure)
            .of_client(client);
        // With a read quota no read is sent before the reservation: the
        // budget opens at 0 and becomes what was reserved.
        if ticket.is_some() {
            budget.close_until_reserved();
        }
        FanoutRequest::new(
            RequestReads::new(self.inner.reads.clone(), budget, memory, hops)
                .past_max_hops(past_max_hops),
            caller,
            extensions,
            pricing,
            ticket,
            queries_only,
            self.config().http.max_body_bytes,
        )
    }

    /// The share of the sockets' pool (`subscriptions.max_bytes`) of the
    /// client that sent the upgrade request `parts`
    /// (`subscriptions.max_bytes_per_client`, its other sockets' too).
    pub(crate) fn socket_share(&self, parts: &http::request::Parts) -> Arc<MemoryPool> {
        self.inner.sockets.share(self.socket_client(parts))
    }

    /// The client that sent the upgrade request `parts`, keyed as the
    /// per-IP limiter keys it (`None`: served without its peer address).
    pub(crate) fn socket_client(&self, parts: &http::request::Parts) -> ClientKey {
        let (proxies, prefix) = &self.inner.socket_clients;
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|peer| peer.0.ip())?;
        Some(prefix.key(proxies.client_ip(peer, &parts.headers).unwrap_or(peer)))
    }

    /// A place for one more open socket, held while it is open; `None`
    /// when `subscriptions.max_connections` are open.
    pub(crate) fn socket_place(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.inner.socket_places.clone().try_acquire_owned().ok()
    }

    /// Bytes the open WebSocket connections hold now, of
    /// `subscriptions.max_bytes`: their subscriptions, and their events
    /// being resolved and waiting to be written
    /// (`fanout_socket_memory_held_bytes`).
    pub fn socket_bytes(&self) -> usize {
        self.inner.sockets.used()
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}
