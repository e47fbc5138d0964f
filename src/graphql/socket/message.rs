//! The two GraphQL-over-WebSocket protocols, as messages: what a client
//! may send ([`ClientMessage`], async-graphql's, which reads both), what the
//! server sends ([`Protocol`]'s frames). The close codes are with the other
//! errors' codes (`error/socket.rs`).
//!
//! - `graphql-transport-ws`, the `graphql-ws` library's (Apollo Client's
//!   `GraphQLWsLink`, urql, GraphiQL): `connection_init` → `connection_ack`;
//!   `subscribe` → `next`… `complete`, or `error` (an operation refused
//!   before it ran: it does not validate, or the engine's admission refused
//!   it); `ping` ↔ `pong` either way.
//! - `graphql-ws`, the legacy `subscriptions-transport-ws`: `connection_init`
//!   → `connection_ack` and `ka` keep-alives; `start` → `data`… `complete`,
//!   or `error`; `stop`; `connection_terminate`.

pub(crate) use async_graphql::http::ClientMessage;
use async_graphql::Response;
use serde_json::json;

/// The subprotocols served.
pub(crate) const SUBPROTOCOLS: [&str; 2] = ["graphql-transport-ws", "graphql-ws"];

/// The subprotocol a connection speaks: the first of the client's
/// `Sec-WebSocket-Protocol` list (every such header, in order, each a
/// comma-separated list) that is one of [`SUBPROTOCOLS`]. RFC 6455 orders the
/// client's list by preference, so a client that offers both gets the one it
/// named first — Python's `gql` offers `graphql-ws` first and, failing to
/// read the answer's header, speaks it whatever was chosen; `graphql-ws`
/// (the library) and Apollo offer `graphql-transport-ws` alone.
pub(crate) fn choose(headers: &http::HeaderMap) -> Option<(&'static str, Protocol)> {
    headers
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|list| list.split(','))
        .find_map(|name| {
            let name = name.trim();
            let protocol = Protocol::from_subprotocol(name)?;
            SUBPROTOCOLS
                .into_iter()
                .find(|served| *served == name)
                .map(|served| (served, protocol))
        })
}

/// Which protocol a connection speaks, from its subprotocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// `graphql-transport-ws`.
    TransportWs,
    /// `graphql-ws` (legacy subscriptions-transport-ws).
    Legacy,
}

impl Protocol {
    /// The protocol a `Sec-WebSocket-Protocol` value names.
    pub(crate) fn from_subprotocol(name: &str) -> Option<Self> {
        match name {
            "graphql-transport-ws" => Some(Self::TransportWs),
            "graphql-ws" => Some(Self::Legacy),
            _ => None,
        }
    }

    /// `connection_ack`.
    pub(crate) fn ack(self) -> String {
        json!({ "type": "connection_ack" }).to_string()
    }

    /// One event of subscription `id`.
    pub(crate) fn next(self, id: &str, payload: &Response) -> String {
        let ty = match self {
            Self::TransportWs => "next",
            Self::Legacy => "data",
        };
        json!({ "type": ty, "id": id, "payload": payload }).to_string()
    }

    /// Subscription `id` refused: one error with `code`.
    pub(crate) fn error(self, id: &str, message: &str, code: &str) -> String {
        let error = json!({ "message": message, "extensions": { "code": code } });
        let payload = match self {
            Self::TransportWs => json!([error]),
            Self::Legacy => error,
        };
        json!({ "type": "error", "id": id, "payload": payload }).to_string()
    }

    /// Subscription `id`'s answer when its operation was refused before it
    /// ran (see [`ran`]): graphql-transport-ws's `error` message, its
    /// errors as the payload, the operation's last message (no
    /// `complete`); `None` in the legacy protocol, whose clients read such
    /// an answer as `data` then `complete`, or when the operation ran.
    pub(crate) fn refused(self, id: &str, answer: &Response) -> Option<String> {
        if self == Self::Legacy || ran(answer) {
            return None;
        }
        Some(json!({ "type": "error", "id": id, "payload": answer.errors }).to_string())
    }

    /// Subscription `id` is over.
    pub(crate) fn complete(self, id: &str) -> String {
        json!({ "type": "complete", "id": id }).to_string()
    }

    /// The answer to a client's `ping` (`None`: the protocol has none).
    pub(crate) fn pong(self) -> Option<String> {
        match self {
            Self::TransportWs => Some(json!({ "type": "pong" }).to_string()),
            Self::Legacy => None,
        }
    }

    /// The server's keep-alive: `ping`, or the legacy `ka`.
    pub(crate) fn keepalive(self) -> String {
        match self {
            Self::TransportWs => json!({ "type": "ping" }).to_string(),
            Self::Legacy => json!({ "type": "ka" }).to_string(),
        }
    }

    /// Whether a client's `complete`/`stop` is answered with `complete`
    /// (the legacy protocol does; graphql-transport-ws does not).
    pub(crate) fn confirms_stop(self) -> bool {
        self == Self::Legacy
    }
}

/// Whether `answer`, an operation's first, comes from running it. One
/// refused before it ran — it does not parse or validate, or the engine's
/// admission refused it — has no data and only errors without a path, and
/// no `extensions.fanout`, which every event that ran reports (an event
/// refused its read quota included); an error of a field that ran, a
/// non-null root field's included, has a path.
fn ran(answer: &Response) -> bool {
    answer.data != async_graphql::Value::Null
        || answer.errors.is_empty()
        || answer.errors.iter().any(|e| !e.path.is_empty())
        || answer.extensions.contains_key("fanout")
}

/// The internal token in a `connection_init` payload, if any.
pub(crate) fn init_token(payload: Option<&serde_json::Value>) -> Option<&str> {
    payload?
        .get(crate::inbound::INTERNAL_TOKEN_HEADER.as_str())?
        .as_str()
}

#[cfg(test)]
mod tests {
    use super::{choose, Protocol};

    fn chosen(values: &[&str]) -> Option<&'static str> {
        let mut headers = http::HeaderMap::new();
        for value in values {
            headers.append(http::header::SEC_WEBSOCKET_PROTOCOL, value.parse().unwrap());
        }
        choose(&headers).map(|(name, protocol)| {
            assert_eq!(Protocol::from_subprotocol(name), Some(protocol));
            name
        })
    }

    #[test]
    fn the_clients_first_served_subprotocol_is_chosen() {
        assert_eq!(
            chosen(&["graphql-ws, graphql-transport-ws"]),
            Some("graphql-ws")
        );
        assert_eq!(
            chosen(&["graphql-transport-ws,graphql-ws"]),
            Some("graphql-transport-ws")
        );
        assert_eq!(
            chosen(&["soap", "wamp, graphql-ws", "graphql-transport-ws"]),
            Some("graphql-ws")
        );
        assert_eq!(
            chosen(&["graphql-transport-ws"]),
            Some("graphql-transport-ws")
        );
        // Names are case-sensitive tokens (RFC 6455).
        assert_eq!(chosen(&["GRAPHQL-WS, soap"]), None);
        assert_eq!(chosen(&[]), None);
    }
}
