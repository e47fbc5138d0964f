//! GraphQL subscriptions over WebSocket: one connection, one scope.
//!
//! A WebSocket connection is one inbound HTTP request (the upgrade) that
//! lives for hours. [`FanoutGraphQL`](crate::FanoutGraphQL) serves it at the
//! GraphQL endpoint itself (a `GET` with `Upgrade: websocket`), and
//! [`FanoutSubscription`](crate::graphql::FanoutSubscription) serves it beside a stock
//! service under [`FanoutLayer`](crate::FanoutLayer). Both subprotocols,
//! `graphql-transport-ws` and the legacy `graphql-ws` (`message.rs`).
//!
//! How one connection is served (`upgrade.rs`, then `driver.rs`, one task
//! that does the socket's I/O and does what the protocol's state machine,
//! `machine.rs`, decides; the close codes and refusals are in
//! `error/socket.rs`):
//!
//! 1. **The upgrade.** The subprotocol is chosen (none of the two: 400),
//!    frames are bounded by `subscriptions.max_message_bytes` (a larger one
//!    closes the connection, 4400), and the connection keeps its place in
//!    [`serve`](crate::inbound::serve)'s table (`ConnectionLease`): it still
//!    counts against `http.max_connections` and its client's share, idle (no
//!    subscription) it may be closed for a newcomer, and it is closed when
//!    the server stops.
//! 2. **`connection_init`** within `subscriptions.init_timeout_ms` (else
//!    4408; a second one 4429): the caller is fixed — the upgrade request's
//!    internal-token header, or the payload's `"x-internal-token"`, exact
//!    matches only — and the connection's scope opens
//!    ([`FanoutConnection`], `connection.rs`: a read budget that refills).
//! 3. **`subscribe`** (before the ack: 4401; an id already active: 4409;
//!    past `subscriptions.max_per_connection`: an `error` for that id,
//!    `TOO_MANY_SUBSCRIPTIONS`, the others untouched; a public caller's
//!    operation counted as one request of its client by the per-IP limit the
//!    upgrade passed, `inbound/limiter.rs`'s `SocketLimit`: refused, an
//!    `error` with `RATE_LIMITED`; the check, which may ask Redis, waits
//!    beside the socket's other work — its writes, pings, other
//!    subscriptions — what the parsed subscribe holds taken from the pool
//!    meanwhile (`held.rs`), and its id taken): the operation runs on
//!    the executor with the connection in its session data. The engine's
//!    extension admits it once and runs **each event in a scope of its own**
//!    opened on the connection (`extension.rs`): its own de-duplication,
//!    deadline and answer memory, its reads paid by the connection.
//! 4. **Writing** (`outbox.rs`): one frame at a time, each within
//!    `http.write_timeout_ms` (else the connection ends); meanwhile events go
//!    on resolving, at most `subscriptions.max_pending_events` waiting per
//!    subscription (the oldest dropped), their bytes held in the sockets' pool.
//!    Each event spends from the task's cooperative budget (tokio's
//!    `coop`), so a subscription whose stream is always ready yields the
//!    thread to the runtime's other tasks and timers like any I/O does.
//! 5. **Memory** (`held.rs`, `memory/shares.rs`): everything the connection
//!    keeps — each subscription's document, variables and text, weighed
//!    before it runs; its events resolving and waiting — is taken from its
//!    client's share of the sockets' pool (`subscriptions.max_bytes`,
//!    `subscriptions.max_bytes_per_client`), never from the requests' pool:
//!    sockets cannot make an HTTP request `OVERLOADED`. What does not fit is
//!    refused (`OVERLOADED`); nothing held is dropped for it.
//! 6. **Keep-alive**: a ping every `subscriptions.keepalive_ms` (a WebSocket
//!    ping frame, which every client answers, and the legacy protocol's
//!    `ka`); a client heard from in none of three is closed (1001).

mod connection;
mod driver;
pub(crate) mod held;
mod machine;
mod message;
mod outbox;
mod poll;
mod service;
mod standing;
mod subscriptions;
mod upgrade;

pub use connection::FanoutConnection;
pub use poll::SharedPoll;
pub use service::FanoutSubscription;
pub(crate) use upgrade::{is_upgrade, upgrade};
