//! The GraphQL integrations and the GraphQL-over-HTTP protocol.

pub(crate) mod context;
pub(crate) mod extension;
pub(crate) mod finish;
pub(crate) mod graphiql;
pub(crate) mod layer;
pub(crate) mod nulls;
mod operation_span;
pub(crate) mod pipeline;
pub(crate) mod protocol;
pub(crate) mod server_span;
pub(crate) mod service;
pub(crate) mod socket;

pub use context::FanoutContext;
pub use extension::FanoutExtension;
pub use finish::OrNull;
pub use layer::{FanoutLayer, FanoutService};
pub use service::FanoutGraphQL;
pub use socket::{FanoutConnection, FanoutSubscription, SharedPoll};
