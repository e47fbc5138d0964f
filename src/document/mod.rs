//! The operation's document: kept parsed, guarded, persisted by hash, and
//! the schema's types it is read with.

pub(crate) mod cache;
pub(crate) mod guard;
pub(crate) mod persisted;
pub(crate) mod root_field;
pub(crate) mod schema_types;
