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
//! 1. **The ticket** (`client.rs`), when the request's scope opens: the
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
//!    reserved; a read that finds it spent (a redirect hop or a token fetch
//!    the estimate did not count) takes one more from the quota at once if
//!    it has one, never waiting, up to the request's own budget. One reservation for the whole batch; a refusal refuses the
//!    whole batch: 429 `QUOTA_EXHAUSTED`, `Retry-After`, and the IETF
//!    `RateLimit-Policy` / `RateLimit` fields of the quota.
//! 3. **The settlement** (`reservation.rs`), when the request's scope is
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

mod client;
mod local;
mod rate;
mod reservation;
mod store;

pub(crate) use client::{ClientQuota, Ticket};
pub use local::LocalQuotas;
pub(crate) use local::SWEEP_EVERY;
#[cfg(feature = "redis")]
pub(crate) use rate::rates;
pub use rate::Rate;
pub use reservation::QuotaStatus;
pub(crate) use reservation::Reservation;
pub use store::{QuotaClass, QuotaStore, Verdict};
