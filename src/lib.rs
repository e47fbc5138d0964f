//! Bound the upstream work one inbound GraphQL HTTP request can cause.
//!
//! One [`Engine`] per process; per inbound HTTP request one
//! [`FanoutRequest`] — a read budget, a deadline and a de-duplication cache —
//! shared by every operation of a batch; one acquisition point,
//! [`ctx.upstream()`](FanoutContext::upstream), through which every resolver
//! reads:
//!
//! ```
//! use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
//! use fanout_budget::{Config, Engine, FanoutContext, FanoutGraphQL, OrNull, Read};
//!
//! struct Query;
//!
//! #[Object]
//! impl Query {
//!     async fn catalog(&self, ctx: &Context<'_>) -> Option<String> {
//!         let url = "http://registry.local:5000/v2/_catalog".parse().unwrap();
//!         let read = async { Ok::<_, async_graphql::Error>(ctx.upstream()?.read(Read::get(url)).await?) };
//!         read.await.map(|page| String::from_utf8_lossy(&page.body).into_owned()).or_null(ctx)
//!     }
//! }
//!
//! let engine = Engine::new(Config::default());
//! let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
//!     .extension(FanoutExtension::new(&engine)) // counts each answer as it is built
//!     .finish();
//! let app: axum::Router = axum::Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
//! # drop(app);
//! ```
//!
//! The rest of this page is `ARCHITECTURE.md`: the walk of one read.
//!
#![doc = include_str!("../ARCHITECTURE.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

#[cfg(feature = "redis")]
pub mod backends;
pub mod config;
mod cost;
mod document;
mod engine;
mod error;
mod graphql;
mod inbound;
mod memory;
mod metrics;
mod read;
mod request;
mod seed;

pub use config::Config;
pub use cost::{CostTable, FieldCost};
pub use document::cache::weight as document_weight;
pub use engine::{Engine, EngineBuilder};
pub use error::{HostRefusal, ReadError, Rejection, Unavailable};
pub use graphql::extension::FanoutExtension;
pub use graphql::finish::OrNull;
pub use graphql::layer::{FanoutLayer, FanoutService};
pub use graphql::service::FanoutGraphQL;
pub use inbound::cors::cors_layer;
pub use inbound::identity::{Caller, INTERNAL_TOKEN_HEADER};
pub use inbound::limiter::{Decision, InboundLimiter, RateLimitLayer, RateLimitService};
pub use inbound::serve::{serve, Serve};
pub use read::budget::{BudgetSnapshot, ReadCounts, RequestBudget};
pub use read::hosts::{host_name, HostLimiter, HostSlot, LocalHostCaps, OTHER_HOSTS};
pub use read::transport::{HttpTransport, Read, Transport, UpstreamResponse};
pub use read::{Permit, Upstream};
pub use request::{FanoutContext, FanoutRequest, Operation};

/// The HTTP client the default transport uses (its `Url` names every read).
pub use reqwest;
