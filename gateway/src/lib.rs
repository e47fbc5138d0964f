//! The registry gateway: a GraphQL API over an OCI Distribution registry,
//! built on `fanout-budget` exactly as any user would build on it.
//!
//! - [`names`]: repository names, tags and digests, checked against the OCI
//!   grammars before they reach a URL;
//! - [`oci`]: the registry client — every read through `ctx.upstream()`;
//! - [`registries`]: registries by name, as Docker names them;
//! - [`schema`]: the reference schema (CONTRACT §4) and its costs (§5);
//! - [`embedded`]: an in-process registry with demo data, fault injection and
//!   request counters;
//! - [`app`]: engine + schema + routes.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod app;
pub mod embedded;
mod host_check;
pub mod names;
pub mod oci;
pub mod registries;
pub mod schema;
pub mod subscription;
