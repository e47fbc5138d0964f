//! Bound the upstream work one inbound GraphQL HTTP request can cause.
//!
//! One [`Engine`] per process; per inbound HTTP request one
//! [`FanoutRequest`] — a read budget, a deadline and a de-duplication cache —
//! shared by every operation of a batch; one acquisition point,
//! [`ctx.upstream()`](FanoutContext::upstream), through which every resolver
//! reads. See `ARCHITECTURE.md` for the walk of one read.
//!
//! ```ignore
//! let engine = Engine::new(Config::default());
//! let schema = Schema::build(Query, EmptyMutation, EmptySubscription).finish();
//! let app = axum::Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
//! // in a resolver:
//! let page = ctx.upstream()?.read(Read::get(url)).await.or_null(ctx);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backends;
pub mod budget;
pub mod clock;
pub mod config;
pub mod cost;
pub mod dedup;
pub mod documents;
pub mod engine;
pub mod error;
pub mod extension;
mod hash;
pub mod hosts;
pub mod http;
pub mod identity;
pub mod limiter;
mod metrics;
mod nulls;
pub mod row;
pub mod serve;
mod shape;
pub mod transport;
mod types;
pub mod upstream;

pub use budget::{BudgetSnapshot, InFlightSlot, RequestBudget};
pub use clock::{Clock, ManualClock, TokioClock};
pub use config::Config;
pub use cost::{CostTable, FieldCost};
pub use engine::Engine;
pub use error::FanoutError;
pub use extension::FanoutExtension;
pub use hosts::{HostLimiter, HostSlot, LocalHostCaps};
pub use http::FanoutGraphQL;
pub use identity::Caller;
pub use limiter::{Decision, InboundLimiter, LocalLimiter, RateLimitLayer};
pub use metrics::shared_state_fallback;
pub use row::OrNull;
pub use serve::serve;
pub use transport::{HttpTransport, Transport};
pub use upstream::{FanoutContext, FanoutRequest, Operation, Read, Upstream, UpstreamResponse};
