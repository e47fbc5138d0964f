//! Bound the upstream work one inbound GraphQL HTTP request can cause.
//!
//! One [`Engine`] per process; per inbound HTTP request one
//! [`FanoutRequest`](request::FanoutRequest) — a read budget, a deadline and a de-duplication cache —
//! shared by every operation of a batch; one acquisition point,
//! [`ctx.upstream()`](FanoutContext::upstream), through which every resolver
//! reads:
//!
//! ```
//! use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
//! use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, OrNull, Read};
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
#[cfg(doctest)]
mod book;
mod chain;
pub mod config;
pub mod cost;
mod document;
mod engine;
pub mod error;
pub mod graphql;
pub mod inbound;
mod memory;
mod metrics;
pub mod read;
pub mod request;
mod seed;
#[cfg(feature = "otel")]
pub mod telemetry;

pub use config::Config;
pub use engine::{Engine, EngineBuilder};
pub use error::ReadError;
pub use graphql::{FanoutContext, FanoutExtension, FanoutGraphQL, FanoutLayer, OrNull};
pub use read::{Read, UpstreamResponse};

/// The HTTP client the default transport uses (its `Url` names every read).
pub use reqwest;
