//! A WebSocket's own refusals: why a connection is closed ([`SocketClose`],
//! its close code and reason) and why one subscription is refused at once
//! ([`SocketRefusal`], its `extensions.code`). The codes are
//! graphql-transport-ws's, which the legacy protocol's clients read too.

/// Why a GraphQL WebSocket is closed: its close code and its reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SocketClose {
    /// A frame too large for `subscriptions.max_message_bytes`, or not a
    /// WebSocket frame at all (4400).
    Malformed,
    /// A message that is not one of the protocol's (4400).
    NotAMessage,
    /// A subscription id past 128 bytes (4400).
    IdTooLong,
    /// A subscribe before `connection_ack` (4401).
    Unauthorized,
    /// No `connection_init` within `subscriptions.init_timeout_ms` (4408).
    InitTimeout,
    /// A subscribe whose id is already taken (4409).
    DuplicateId,
    /// A second `connection_init` (4429).
    TooManyInits,
    /// The server is stopping (1001).
    ServerStopping,
    /// Idle (no subscription), and its slot in the connection table is
    /// wanted by a newcomer (1001).
    SlotWanted,
    /// No word from the client in three keep-alive intervals (1001).
    Silent,
    /// `subscriptions.max_connections` sockets are open (1013, try again
    /// later).
    SocketsFull,
    /// Its client's share of the sockets' memory cannot hold the
    /// connection, or a message it sent (1013, try again later).
    ShareFull,
}

impl SocketClose {
    /// The close code and the reason sent with it.
    pub(crate) fn frame(self) -> (u16, &'static str) {
        match self {
            Self::Malformed => (4400, "message too large or malformed"),
            Self::NotAMessage => (4400, "not a message of the protocol"),
            Self::IdTooLong => (4400, "a subscription id past 128 bytes"),
            Self::Unauthorized => (4401, "Unauthorized"),
            Self::InitTimeout => (4408, "Connection initialisation timeout"),
            Self::DuplicateId => (4409, "Subscriber for this id already exists"),
            Self::TooManyInits => (4429, "Too many initialisation requests"),
            Self::ServerStopping => (1001, "the server is stopping"),
            Self::SlotWanted => (1001, "idle, and its slot is wanted"),
            Self::Silent => (1001, "no word from the client"),
            Self::SocketsFull => (1013, "the server holds all the sockets it may"),
            Self::ShareFull => (1013, "this client's sockets hold their share of memory"),
        }
    }
}

/// One subscribe refused at once, the connection untouched: an `error`
/// message for its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SocketRefusal {
    /// Past `subscriptions.max_per_connection` active on the connection.
    TooManySubscriptions {
        /// The configured maximum.
        max: usize,
    },
}

impl SocketRefusal {
    /// Its `extensions.code`.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Self::TooManySubscriptions { .. } => "TOO_MANY_SUBSCRIPTIONS",
        }
    }

    /// Its message.
    pub(crate) fn message(&self) -> String {
        match self {
            Self::TooManySubscriptions { max } => {
                format!("at most {max} active subscriptions on one connection")
            }
        }
    }
}
