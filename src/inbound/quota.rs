//! The read quota: upstream reads each client may cause over time
//! (`[quota]`), reserved before its request runs and settled after it.
//!
//! The per-IP limit counts a client's *requests*; the budget bounds the
//! reads of *one* request. Neither bounds what a client spends of the
//! upstream over an hour: 300 requests a minute of 100 reads each is 30,000
//! reads. The quota does, in the unit the upstream meters — reads actually
//! sent — the way Shopify meters query cost: reserve what the request may
//! spend, run it, give back what it did not spend.
//!
//! How it works, per inbound request of a client with a quota:
//!
//! 1. **The ticket** ([`Ticket`]), when the request's scope opens: the
//!    class (`reads` for public callers, `internal_reads` for the internal
//!    token's — identity, never address) and the client key, the per-IP
//!    limiter's (the TCP peer, or behind `trusted_proxies` the rightmost
//!    untrusted `X-Forwarded-For` address, masked to `ipv4_prefix` /
//!    `ipv6_prefix`).
//! 2. **The reservation**, once every operation of the batch is priced and
//!    before any read (the pipeline's step 3, `graphql/pipeline.rs`): the
//!    batch's `requested` when a cost table prices it, else its budget —
//!    never more than the budget, nor than the burst (a request whose
//!    estimate exceeds the burst runs on the burst). The request's budget
//!    then *becomes* the reservation, so no read is sent that was not
//!    reserved. One reservation for the whole batch; a refusal refuses the
//!    whole batch: 429 `QUOTA_EXHAUSTED`, `Retry-After`, and the IETF
//!    `RateLimit-Policy` / `RateLimit` fields of the quota.
//! 3. **The settlement** ([`Reservation`]), when the request's scope is
//!    dropped — answered, or cancelled by its client: what was reserved and
//!    not charged goes back. A read charged is spent whether or not its
//!    answer arrived, so a client that aborts its requests gains nothing.
//!
//! The arithmetic is one number per client (`rate.rs`); the in-process
//! store keeps it in a map swept of full buckets (`local.rs`); a store
//! shared by the fleet plugs in through [`QuotaStore`] (Redis:
//! `backends::redis::SharedLimits::quota_store`), and while it is down
//! `failure_mode` decides between the in-process store ("open") and 503
//! `UNAVAILABLE` ("closed").

use crate::config::{Config, FailureMode};
use crate::error::{Rejection, Unavailable};
use crate::inbound::identity::{Caller, ClientPrefix, TrustedProxies};
use crate::metrics;
use axum::extract::ConnectInfo;
use futures::future::BoxFuture;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

mod local;
mod rate;
mod reservation;

pub use local::LocalQuotas;
pub use rate::Rate;
pub use reservation::{QuotaStatus, Reservation};

/// Which quota a caller draws on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuotaClass {
    /// Callers without the internal token (`quota.reads`).
    Public,
    /// Callers with the internal token (`quota.internal_reads`).
    Internal,
}

impl QuotaClass {
    /// The class's name: its metrics label and its `RateLimit` policy name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Public => "reads",
            Self::Internal => "internal-reads",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Self::Public => 0,
            Self::Internal => 1,
        }
    }

    fn of(caller: Caller) -> Self {
        match caller {
            Caller::Public => Self::Public,
            Caller::Internal => Self::Internal,
        }
    }
}

/// A store's answer to a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Reserved; `remaining` reads would still fit now, and the quota is
    /// full again in `full_in` (if nothing is given back).
    Reserved {
        /// Reads that would still fit now.
        remaining: u64,
        /// Time until the quota is full again.
        full_in: Duration,
    },
    /// Refused, nothing taken; the reservation fits in `retry_after`.
    Refused {
        /// Reads that fit now (fewer than asked).
        remaining: u64,
        /// Time until the reservation would fit.
        retry_after: Duration,
    },
}

impl Verdict {
    /// Granted by a class without a quota.
    pub(crate) fn unlimited() -> Self {
        Self::Reserved {
            remaining: u64::MAX,
            full_in: Duration::ZERO,
        }
    }
}

/// Where the clients' quotas are kept: in process ([`LocalQuotas`]) or
/// shared by the fleet (Redis).
///
/// `reserve` must be cancel-safe: a reservation whose future is dropped
/// takes nothing from the client (or gives what it took back).
pub trait QuotaStore: Send + Sync + 'static {
    /// Reserves `reads` (at most the class's burst) for `client` of `class`.
    /// `Err`: the store is unreachable (the caller applies `failure_mode`).
    fn reserve(
        &self,
        class: QuotaClass,
        client: IpAddr,
        reads: u64,
    ) -> BoxFuture<'_, Result<Verdict, Unavailable>>;

    /// Gives back `reads` that `client` reserved and did not spend.
    fn refund(&self, class: QuotaClass, client: IpAddr, reads: u64);
}

/// The read quotas of one engine: the rates per class, the stores, and how
/// a request's client is keyed.
pub(crate) struct ClientQuota {
    rates: [Option<Rate>; 2],
    local: Arc<LocalQuotas>,
    shared: Option<(Arc<dyn QuotaStore>, FailureMode)>,
    proxies: TrustedProxies,
    prefix: ClientPrefix,
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
        let q = &config.quota;
        let rate = |reads, burst| (reads > 0).then(|| Rate::new(reads, q.period(), burst));
        let rates = [rate(q.reads, q.burst), rate(q.internal_reads, 0)];
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

    /// Reserves on the shared store, or by `failure_mode` on the local one.
    async fn verdict(
        &self,
        class: QuotaClass,
        client: IpAddr,
        reads: u64,
    ) -> Result<(Verdict, bool), Rejection> {
        let Some((shared, mode)) = &self.shared else {
            return Ok((self.local.reserve_now(class, client, reads), false));
        };
        match shared.reserve(class, client, reads).await {
            Ok(verdict) => Ok((verdict, true)),
            Err(err) => match mode {
                FailureMode::Open => {
                    metrics::shared_state_fallback("quota");
                    tracing::debug!(error = %err, "shared read quota down; reserving in-process");
                    Ok((self.local.reserve_now(class, client, reads), false))
                }
                FailureMode::Closed => Err(Rejection::Unavailable {
                    message: "the shared read quota is unreachable".into(),
                }),
            },
        }
    }

    /// Gives `reads` back to the store the reservation came from.
    fn refund(&self, class: QuotaClass, client: IpAddr, reads: u64, shared: bool) {
        match (&self.shared, shared) {
            (Some((store, _)), true) => store.refund(class, client, reads),
            _ => self.local.refund_now(class, client, reads),
        }
    }
}

/// Why a request with a quota but without its TCP peer is refused.
const NO_PEER: &str = "the read quota needs each request's TCP peer: serve the app with \
    fanout_budget::inbound::serve, or axum's into_make_service_with_connect_info::<SocketAddr>()";

/// What a request needs to reserve on its client's quota.
#[derive(Debug)]
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
        let (verdict, shared) = self.quota.verdict(self.class, client, reads).await?;
        match verdict {
            Verdict::Reserved { remaining, full_in } => {
                metrics::quota_reads(self.class.name(), "reserved", reads);
                Ok(Reservation::new(
                    self.quota.clone(),
                    self.class,
                    client,
                    rate,
                    reads,
                    shared,
                    remaining.min(rate.burst()),
                    SystemTime::now() + full_in,
                ))
            }
            Verdict::Refused {
                remaining,
                retry_after,
            } => {
                metrics::quota_reads(self.class.name(), "refused", reads);
                Err(Rejection::QuotaExhausted {
                    policy: self.class.name(),
                    quota: rate.reads(),
                    period_secs: rate.period_secs(),
                    limit: rate.burst(),
                    remaining: remaining.min(rate.burst()),
                    retry_after_ms: u64::try_from(retry_after.as_millis())
                        .unwrap_or(u64::MAX)
                        .max(1),
                })
            }
        }
    }
}
