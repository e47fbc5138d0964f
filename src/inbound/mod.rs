//! What comes in: the per-IP limiter, who calls, connection bounds, CORS.

pub(crate) mod cors;
pub(crate) mod identity;
pub(crate) mod limiter;
pub(crate) mod serve;
