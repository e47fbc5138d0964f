//! Chains of services: one budget for the inbound request at the edge,
//! however many services on the engine its reads pass through.
//!
//! A read to an upstream marked `propagate` (`[upstreams."NAME"]` or
//! `[hosts."HOST:PORT"]`) carries, in `Fanout-Budget`, what the upstream
//! may spend for it: the reads granted it (`read/propagate.rs` reserves
//! them on the request's budget), the time until the read is cut, and the
//! hop count. The upstream — a service on the engine — opens its request
//! with `max_reads` and its deadline lowered to those (never raised: the
//! header is believed from anyone), refuses it past `budget.max_hops`
//! (`FANOUT_TOO_MANY_HOPS`), and answers with what it spent, in
//! `Fanout-Spent`; the caller charges that to its own request, up to the
//! grant, and gives the rest of the grant back.
//!
//! - `header.rs`: both headers, read and written (RFC 9651 dictionaries);
//! - `received.rs`: what an inbound request's header says, and how it
//!   lowers the request's limits.

pub(crate) mod header;
mod received;

pub(crate) use received::{hops_on, Received};
