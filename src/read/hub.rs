//! The hub's steps that bring several spokes together, each a file: more
//! of the hub (`read/mod.rs`), not a spoke. Each extends [`Upstream`] with
//! the methods of one step; the walk in `read/mod.rs` calls them and names
//! nothing of theirs, and no spoke names them.
//!
//! - `lookup.rs`: step 0, the engine's cache looked up, a miss kept;
//! - `admit.rs`: steps 2–4, the refusals, the slots, the charge (and a
//!   permit, the same for a call that is not HTTP);
//! - `coalesced.rs`: steps 2–6 to a host that coalesces;
//! - `propagated.rs`: step 5 to a service on the engine, its grant and
//!   what it spent;
//! - `authenticated.rs`: step 8, the hub as `auth/walk.rs` sends through it
//!   (`auth::walk::Sender`).
//!
//! [`Upstream`]: super::Upstream

mod admit;
mod authenticated;
mod coalesced;
mod lookup;
mod propagated;
