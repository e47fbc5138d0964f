//! `[budget]`: the per-request read budget, its keys and their rules.

use super::error::{at_least_one, ConfigError};
use super::mode::LimitMode;
use serde::Deserialize;
use std::time::Duration;

section! {
    /// `[budget]`
    #[derive(Clone, Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    pub struct BudgetConfig {
        /// Upstream reads per inbound HTTP request, shared by every operation of a batch.
        pub max_reads: u64 = 100,
        /// The same, for callers that present the internal token.
        pub internal_max_reads: u64 = 1000,
        /// Timeout of one upstream read, in milliseconds.
        pub read_timeout_ms: u64 = 5000,
        /// Deadline of the whole inbound HTTP request, in milliseconds.
        pub deadline_ms: u64 = 30_000,
        /// Upstream reads in flight at once for one inbound HTTP request.
        pub max_concurrent_reads: usize = 8,
        /// Refuse a batch whose worst-case reads exceed the budget, before any read.
        pub refuse_over_estimate: bool = false,
        /// `"enforce"` refuses a read past `max_reads` (and, with
        /// `refuse_over_estimate`, a batch priced past it); `"measure"` sends
        /// it, and counts it (`fanout_would_refuse_total{limit="budget"}`,
        /// `{limit="estimate"}` per batch, `extensions.fanout.wouldRefuse`).
        pub mode: LimitMode = LimitMode::Enforce,
        /// Services a request may have passed through: an inbound request
        /// whose `Fanout-Budget` header says `hops` past this is refused
        /// before any read (`FANOUT_TOO_MANY_HOPS`), so a cycle of services
        /// calling each other cannot amplify (book: "Chains of services").
        pub max_hops: u32 = 8,
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

    /// Every count and duration is at least 1.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        at_least_one(
            "budget",
            [
                ("max_reads", self.max_reads),
                ("internal_max_reads", self.internal_max_reads),
                ("read_timeout_ms", self.read_timeout_ms),
                ("deadline_ms", self.deadline_ms),
                ("max_concurrent_reads", self.max_concurrent_reads as u64),
            ],
        )
    }
}
