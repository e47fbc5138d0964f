//! The operation's document: kept parsed (with its guard verdict and
//! validations), guarded, persisted by hash, one root field per
//! subscription.

pub(crate) mod cache;
pub(crate) mod guard;
pub(crate) mod memo;
pub(crate) mod persisted;
pub(crate) mod root_field;
