//! What comes in: the per-IP limiter, the read quota, who calls, connection
//! bounds, CORS.

pub(crate) mod cors;
pub(crate) mod identity;
pub(crate) mod limiter;
pub mod quota;
pub(crate) mod serve;

pub use cors::cors_layer;
pub use identity::{Caller, INTERNAL_TOKEN_HEADER};
pub use limiter::{Decision, InboundLimiter, RateLimitLayer, RateLimitService};
pub use serve::{serve, Serve};
