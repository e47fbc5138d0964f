//! `[quota]`: the per-client read quota over time, its keys and their rules.

use super::error::ConfigError;
use super::mode::LimitMode;
use serde::Deserialize;
use std::time::Duration;

section! {
    /// `[quota]`: upstream reads a client may cause over time, reserved
    /// before its request runs and settled after (`inbound/quota.rs`). Off
    /// by default.
    #[derive(Clone, Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    pub struct QuotaConfig {
        /// Upstream reads each public client (keyed as `[rate_limit]` keys
        /// them) may cause per `period_secs`, refilled evenly; 0: no quota.
        pub reads: u64 = 0,
        /// The period `reads` (and `internal_reads`) refill over, in seconds.
        pub period_secs: u64 = 3600,
        /// The most reads a public client may hold at once, a full quota;
        /// 0: `reads`.
        pub burst: u64 = 0,
        /// The same for each internal caller (the token), apart from the
        /// public quota, its burst a whole period's reads; 0: internal
        /// callers have none.
        pub internal_reads: u64 = 0,
        /// `"enforce"` answers 429 `QUOTA_EXHAUSTED` (and refuses reads past
        /// the reservation); `"measure"` lets the request run without taking
        /// from the quota, and counts the reads enforce would have refused
        /// (`fanout_would_refuse_total{limit="quota"}`,
        /// `extensions.fanout.wouldRefuse`): the quota left is what enforce
        /// would leave.
        pub mode: LimitMode = LimitMode::Enforce,
    }
}

impl QuotaConfig {
    /// `period_secs` as a duration.
    pub fn period(&self) -> Duration {
        Duration::from_secs(self.period_secs)
    }

    /// Whether any class of caller has a quota.
    pub fn is_enabled(&self) -> bool {
        self.reads > 0 || self.internal_reads > 0
    }

    /// A period of at least a second (and at most a year), a burst no
    /// smaller than one read.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if !(1..=365 * 86_400).contains(&self.period_secs) {
            return Err(ConfigError::rule(
                "quota.period_secs",
                "must be between 1 and 31536000 (a year)",
            ));
        }
        for (key, reads) in [
            ("reads", self.reads),
            ("internal_reads", self.internal_reads),
        ] {
            // A read's share of the period is kept in nanoseconds.
            if reads > 0 && self.period().as_nanos() / u128::from(reads) == 0 {
                return Err(ConfigError::rule(
                    format!("quota.{key}"),
                    "is more than one read per nanosecond of the period",
                ));
            }
        }
        Ok(())
    }
}
