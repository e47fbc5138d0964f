//! The engine: the long-lived state every request's reads share.
//!
//! One [`Engine`] lives as long as the process (it is a cheap `Arc` clone). It
//! owns what must outlive any single request: the configuration, the pooled
//! `reqwest::Client`, the per-host [`HostLimiter`], the clock, and the internal
//! callers' token. For each inbound HTTP request it opens one
//! [`FanoutRequest`] — the request's budget and de-duplication cache — which the
//! HTTP integration attaches to every operation of the batch.

use crate::budget::RequestBudget;
use crate::clock::{Clock, TokioClock};
use crate::config::Config;
use crate::cost::CostTable;
use crate::documents::Documents;
use crate::extension::FanoutExtension;
use crate::hash::KeyedHashBuilder;
use crate::hosts::{HostLimiter, HostTable, LocalHostCaps};
use crate::identity::{Caller, InternalToken};
use crate::transport::{HttpTransport, Transport};
use crate::upstream::FanoutRequest;
use std::sync::Arc;

/// The long-lived engine state. Clone it freely.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<EngineInner>,
}

pub(crate) struct EngineInner {
    pub(crate) config: Config,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) hosts: Arc<dyn HostLimiter>,
    /// Each upstream host resolved once (its name, metrics and cap).
    pub(crate) host_table: HostTable,
    /// Seeds every request's de-duplication table.
    pub(crate) dedup_hasher: KeyedHashBuilder,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) token: InternalToken,
    pub(crate) costs: Option<CostTable>,
    /// Parsed documents kept by query text, for every integration served
    /// by this engine (`http.document_cache_bytes` in all).
    pub(crate) documents: Documents,
}

/// Builds an [`Engine`] with non-default parts.
pub struct EngineBuilder {
    config: Config,
    client: Option<reqwest::Client>,
    transport: Option<Arc<dyn Transport>>,
    hosts: Option<Arc<dyn HostLimiter>>,
    clock: Arc<dyn Clock>,
    costs: Option<CostTable>,
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

    /// Reads deadlines from this clock (tests inject a [`ManualClock`](crate::ManualClock)).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
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
                reqwest::Client::builder()
                    // The engine follows redirects itself, charging each hop.
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .expect("a default reqwest client always builds")
            });
            Arc::new(HttpTransport::new(client, max_response_bytes))
        });
        let hosts = self
            .hosts
            .unwrap_or_else(|| Arc::new(LocalHostCaps::new(self.config.hosts.clone())));
        let token = InternalToken::new(&self.config.rate_limit.internal_token);
        let dedup_hasher = KeyedHashBuilder::new();
        let documents = Documents::new(self.config.http.document_cache_bytes, dedup_hasher.clone());
        Engine {
            inner: Arc::new(EngineInner {
                config: self.config,
                transport,
                hosts,
                host_table: HostTable::default(),
                dedup_hasher,
                clock: self.clock,
                token,
                costs: self.costs,
                documents,
            }),
        }
    }
}

impl Engine {
    /// An engine with the default parts for `config`.
    pub fn new(config: Config) -> Self {
        Self::builder(config).build()
    }

    /// A builder, to inject a client, a host limiter or a clock.
    pub fn builder(config: Config) -> EngineBuilder {
        EngineBuilder {
            config,
            client: None,
            transport: None,
            hosts: None,
            clock: Arc::new(TokioClock),
            costs: None,
        }
    }

    /// The configuration the engine runs on.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The declared field costs, if any.
    pub fn costs(&self) -> Option<&CostTable> {
        self.inner.costs.as_ref()
    }

    /// The per-host limiter.
    pub fn hosts(&self) -> &dyn HostLimiter {
        &*self.inner.hosts
    }

    /// The async-graphql extension to mount with `Schema::build(..).extension(..)`.
    pub fn extension(&self) -> FanoutExtension {
        FanoutExtension::new(self.clone())
    }

    /// Who presents these request headers: an internal caller only on an
    /// exact (constant-time) match of the internal token.
    pub fn identify(&self, headers: &http::HeaderMap) -> Caller {
        self.inner.token.identify(headers)
    }

    /// Opens the budget and de-duplication scope of one inbound HTTP request.
    ///
    /// The deadline starts now; the limit depends on who calls.
    pub fn begin_request(&self, caller: Caller) -> FanoutRequest {
        let b = &self.inner.config.budget;
        let limit = match caller {
            Caller::Internal => b.internal_max_reads,
            Caller::Public => b.max_reads,
        };
        let deadline = self.inner.clock.now() + b.deadline();
        let budget = RequestBudget::new(
            limit,
            b.max_concurrent_reads,
            deadline,
            self.inner.clock.clone(),
        );
        FanoutRequest::new(self.clone(), budget, caller)
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}
