//! The read quotas of one engine ([`ClientQuota`]): the rates per class,
//! the stores (with `failure_mode` when one is shared), how a request's
//! client is keyed, and the reservation a request's [`Ticket`] takes.

use super::local::LocalQuotas;
use super::rate::Rate;
use super::reservation::Reservation;
use super::store::{QuotaClass, QuotaStore, Verdict};
use crate::config::{Config, FailureMode};
use crate::error::Rejection;
use crate::inbound::identity::{Caller, ClientPrefix, TrustedProxies};
use crate::metrics::{self, QuotaMetrics, QuotaReads};
use axum::extract::ConnectInfo;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// The read quotas of one engine: the rates per class, the stores, and how
/// a request's client is keyed.
pub(crate) struct ClientQuota {
    rates: [Option<Rate>; 2],
    local: Arc<LocalQuotas>,
    shared: Option<(Arc<dyn QuotaStore>, FailureMode)>,
    proxies: TrustedProxies,
    prefix: ClientPrefix,
    /// `fanout_quota_reads_total`'s handles.
    metrics: Arc<QuotaMetrics>,
}

impl std::fmt::Debug for ClientQuota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientQuota")
            .field("rates", &self.rates)
            .field("shared", &self.shared.as_ref().map(|(_, mode)| mode))
            .finish_non_exhaustive()
    }
}

impl ClientQuota {
    /// The quotas `[quota]` configures, in process; `None` when no class
    /// has one.
    pub(crate) fn new(config: &Config) -> Option<Self> {
        let rates = super::rate::rates(&config.quota);
        if rates.iter().all(Option::is_none) {
            return None;
        }
        let rl = &config.rate_limit;
        Some(Self {
            rates,
            local: Arc::new(LocalQuotas::new(rates[0], rates[1])),
            shared: None,
            proxies: TrustedProxies::new(&rl.trusted_proxies),
            prefix: ClientPrefix::new(rl.ipv4_prefix, rl.ipv6_prefix),
            metrics: Arc::default(),
        })
    }

    /// Keeps the quotas in `store` (shared by the fleet); while it is down,
    /// `mode` falls back to the in-process store or refuses with 503.
    pub(crate) fn shared(mut self, store: Arc<dyn QuotaStore>, mode: FailureMode) -> Self {
        self.shared = Some((store, mode));
        self
    }

    /// The ticket of a request from `caller`, whose HTTP parts are `parts`;
    /// `None` when its class has no quota.
    pub(crate) fn ticket(
        self: &Arc<Self>,
        caller: Caller,
        parts: Option<&http::request::Parts>,
    ) -> Option<Ticket> {
        let class = QuotaClass::of(caller);
        self.rates[class.index()]?;
        let peer = parts.and_then(|p| p.extensions.get::<ConnectInfo<SocketAddr>>());
        let client = match (peer, parts) {
            (Some(peer), Some(parts)) => {
                match self.proxies.client_ip(peer.0.ip(), &parts.headers) {
                    Ok(ip) => Ok(self.prefix.key(ip)),
                    Err(unparsable) => Err(Rejection::BadRequest {
                        message: unparsable.to_string(),
                    }),
                }
            }
            _ => Err(Rejection::Misconfigured {
                message: NO_PEER.into(),
            }),
        };
        Some(Ticket {
            quota: self.clone(),
            class,
            client,
        })
    }

    fn rate(&self, class: QuotaClass) -> Rate {
        self.rates[class.index()].expect("a ticket is only made for a class with a quota")
    }

    /// Reserves on the shared store, or by `failure_mode` on the local one;
    /// the verdict and the store that gave it.
    async fn verdict(
        &self,
        class: QuotaClass,
        client: IpAddr,
        reads: u64,
    ) -> Result<(Verdict, Arc<dyn QuotaStore>), Rejection> {
        let local = |verdict| Ok((verdict, self.local.clone() as Arc<dyn QuotaStore>));
        let Some((shared, mode)) = &self.shared else {
            return local(self.local.reserve_now(class, client, reads));
        };
        match shared.reserve(class, client, reads).await {
            Ok(verdict) => Ok((verdict, shared.clone())),
            Err(err) => match mode {
                FailureMode::Open => {
                    metrics::shared_state_fallback("quota");
                    tracing::debug!(error = %err, "shared read quota down; reserving in-process");
                    // From what the fleet last said of the client, or its
                    // share of the burst; never a fresh bucket (`local.rs`).
                    let known = shared.last_known(class, client);
                    local(self.local.reserve_fallback(class, client, reads, known))
                }
                FailureMode::Closed => Err(Rejection::Unavailable {
                    message: "the shared read quota is unreachable".into(),
                }),
            },
        }
    }
}

/// Why a request with a quota but without its TCP peer is refused.
const NO_PEER: &str = "the read quota needs each request's TCP peer: serve the app with \
    fanout_budget::inbound::serve, or axum's into_make_service_with_connect_info::<SocketAddr>()";

/// What a request needs to reserve on its client's quota.
#[derive(Clone, Debug)]
pub(crate) struct Ticket {
    quota: Arc<ClientQuota>,
    class: QuotaClass,
    /// The client's key, or why the request cannot be keyed.
    client: Result<IpAddr, Rejection>,
}

impl Ticket {
    /// The most the request may reserve: its class's burst.
    pub(crate) fn burst(&self) -> u64 {
        self.quota.rate(self.class).burst()
    }

    /// Reserves `reads` (at most the burst) before the request's first read.
    pub(crate) async fn reserve(&self, reads: u64) -> Result<Reservation, Rejection> {
        let client = self.client.clone()?;
        let rate = self.quota.rate(self.class);
        let reads = reads.min(rate.burst());
        let (verdict, store) = self.quota.verdict(self.class, client, reads).await?;
        match verdict {
            Verdict::Reserved { full_in, .. } => {
                let metrics = &self.quota.metrics;
                metrics.reads(self.class.name(), QuotaReads::Reserved, reads);
                Ok(Reservation::new(
                    store,
                    metrics.clone(),
                    self.class,
                    client,
                    rate,
                    reads,
                    tokio::time::Instant::now() + full_in,
                ))
            }
            Verdict::Refused {
                remaining,
                retry_after,
            } => {
                (self.quota.metrics).reads(self.class.name(), QuotaReads::Refused, reads);
                Err(Rejection::QuotaExhausted {
                    policy: self.class.name(),
                    quota: rate.burst(),
                    period_secs: rate.refill_secs(),
                    limit: rate.burst(),
                    remaining: remaining.min(rate.burst()),
                    // Rounded up: retried after this many ms, it fits.
                    retry_after_ms: u64::try_from(retry_after.as_nanos().div_ceil(1_000_000))
                        .unwrap_or(u64::MAX)
                        .max(1),
                })
            }
        }
    }
}
