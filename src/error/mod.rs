//! Errors, and the one place they are mapped to the contract's codes.
//!
//! Each kind as narrow as what can go wrong where it is made:
//!
//! | type | made by | becomes |
//! |---|---|---|
//! | [`ReadError`] | a read (or a resolver refusing its input) | a GraphQL error with `extensions.code`, at the field's path |
//! | [`HostRefusal`] | a [`HostLimiter`](crate::read::HostLimiter) | a [`ReadError`] naming the host |
//! | [`Rejection`] | the HTTP integration, the limiter | a whole HTTP answer: status, `errors[0].extensions.code` |
//! | `SocketClose`, `SocketRefusal` | a GraphQL WebSocket | a close code and reason; an `error` message for one subscription |
//!
//! A [`ReadError`] converts into `async_graphql::Error` with its code
//! already in `extensions`, so `?` in a resolver keeps the code under any
//! executor — `FanoutGraphQL`, the extension, or a bare `schema.execute`.
//! It has no `Display` on purpose: async-graphql converts every `Display`
//! type into an error *without* extensions, and that blanket conversion
//! would win over ours. Its text is [`ReadError::message`].
//!
//! Errors of a whole operation (parse, validation, a refused estimate, the
//! deadline cutting it) are made here too (`operation_error`); async-graphql's
//! own errors get their codes where a response is finished (`finish.rs`).

//!
//! The folder is that one place, a file per kind: `read.rs` ([`ReadError`],
//! [`HostRefusal`]), `rejection.rs` ([`Rejection`]), `operation.rs` (a whole
//! operation's), `unavailable.rs` ([`Unavailable`]), `socket.rs` (a
//! WebSocket's close codes and its refusals of one subscription).

mod operation;
mod read;
mod rejection;
mod socket;
mod unavailable;

pub(crate) use operation::{operation_error, refused, stopped, OperationError};
pub use read::{HostRefusal, ReadError};
pub use rejection::Rejection;
pub(crate) use socket::{SocketClose, SocketRefusal};
pub use unavailable::Unavailable;
