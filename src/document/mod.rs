//! The operation's document: kept parsed, guarded, persisted by hash,
//! one root field per subscription.

pub(crate) mod cache;
pub(crate) mod guard;
pub(crate) mod persisted;
pub(crate) mod root_field;
