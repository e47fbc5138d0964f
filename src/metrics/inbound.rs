//! The handles of the inbound limits' metrics, kept by the limits: the
//! per-IP limiter's decisions and the clients' read quotas, recorded per
//! inbound request. Each registered the first time it is recorded, as the
//! engine's per-request handles are (`request.rs`).

use metrics::{counter, Counter};
use std::sync::OnceLock;

/// The per-IP limiter's handles (one for each of its layer's clones).
#[derive(Default)]
pub(crate) struct LimiterMetrics {
    /// `fanout_rate_limit_exempt_total`.
    exempt: OnceLock<Counter>,
    /// `fanout_wrong_internal_token_total`.
    wrong_token: OnceLock<Counter>,
    /// `fanout_rate_limited_total`.
    limited: OnceLock<Counter>,
}

impl LimiterMetrics {
    /// An inbound request exempted as internal.
    pub(crate) fn exempt(&self) {
        super::kept::count(&self.exempt, "fanout_rate_limit_exempt_total");
    }

    /// An inbound request with a wrong internal token.
    pub(crate) fn wrong_internal_token(&self) {
        super::kept::count(&self.wrong_token, "fanout_wrong_internal_token_total");
    }

    /// An inbound request (or a socket's operation) answered 429.
    pub(crate) fn rate_limited(&self) {
        super::kept::count(&self.limited, "fanout_rate_limited_total");
    }
}

/// What `fanout_quota_reads_total` counts: reads `reserved` before requests
/// ran, `refunded` after, `refused` (asked by requests answered 429).
#[derive(Clone, Copy, Debug)]
pub(crate) enum QuotaReads {
    Reserved,
    Refunded,
    Refused,
}

/// The read quotas' handles, by class (`reads`, `internal-reads`) and
/// [`QuotaReads`].
#[derive(Default)]
pub(crate) struct QuotaMetrics([[OnceLock<Counter>; 3]; 2]);

impl QuotaMetrics {
    /// `n` reads of the quota of `class` (its name: `reads`,
    /// `internal-reads`) reserved, refunded or refused.
    pub(crate) fn reads(&self, class: &'static str, outcome: QuotaReads, n: u64) {
        let (row, class) = match class {
            "internal-reads" => (1, "internal-reads"),
            _ => {
                debug_assert_eq!(class, "reads", "a quota class");
                (0, "reads")
            }
        };
        let label = match outcome {
            QuotaReads::Reserved => "reserved",
            QuotaReads::Refunded => "refunded",
            QuotaReads::Refused => "refused",
        };
        (self.0[row][outcome as usize])
            .get_or_init(
                || counter!("fanout_quota_reads_total", "class" => class, "outcome" => label),
            )
            .increment(n);
    }
}
