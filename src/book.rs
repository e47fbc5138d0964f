//! The guide's Rust samples, compiled (and run, unless marked `no_run`) as
//! doctests: one module per chapter of `book/` that has a Rust sample. A
//! chapter with a new Rust sample gets its line here.

#[doc = include_str!("../book/src/configuration.md")]
mod configuration {}

#[doc = include_str!("../book/src/cost-preview.md")]
mod cost_preview {}

#[doc = include_str!("../book/src/integrations.md")]
mod integrations {}

#[doc = include_str!("../book/src/reads.md")]
mod reads {}

#[doc = include_str!("../book/src/telemetry.md")]
mod telemetry {}
