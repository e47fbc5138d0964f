//! What the extension is to one operation ([`Mode`]), decided once in
//! `prepare_request`: each hook asks it, and only it, what to do.

use crate::error::{operation_error, OperationError};
use crate::graphql::finish::code_errors;
use crate::graphql::pipeline::Op;
use crate::graphql::socket::{self, FanoutConnection};
use crate::memory::PoolBytes;
use crate::request::FanoutRequest;
use async_graphql::{Request, ServerError, ServerResult};
use std::sync::{Arc, Mutex, OnceLock};

/// What the extension is to one operation: each hook asks it, and only it,
/// what to do.
pub(super) enum Mode {
    /// Under `FanoutGraphQL`, which attached the operation's handle: the
    /// service prices, bounds and finishes it; only its answer is counted
    /// here, in the request's memory.
    Aside {
        /// The request whose memory the answer is counted in.
        meter: FanoutRequest,
    },
    /// Refused before it ran (by this extension's admission, or by an
    /// extension registered after it), counted at the pricing barrier.
    Refused {
        /// The text as far as it is known, for the codes of the errors.
        text: Arc<str>,
    },
    /// Over HTTP or in a bare `schema.execute`: the extension is the
    /// operation's scope, and runs it in `execute`.
    Scoped {
        /// The text that runs, for the codes of errors async-graphql raises.
        text: Arc<str>,
        /// The request whose memory the answer is counted in.
        meter: FanoutRequest,
        /// The operation as admitted, taken when it runs.
        op: Mutex<Option<Op>>,
    },
    /// On a WebSocket: admitted once, each event run in a scope of its own.
    Socket {
        /// The text that runs (a subscription keeps it for hours).
        text: Arc<str>,
        /// The connection whose budget each event spends.
        connection: FanoutConnection,
        /// The operation as admitted, run once per event.
        op: Op,
        /// What it holds in the sockets' pool while active
        /// (`socket/held.rs`), given back when the operation ends.
        _held: PoolBytes,
        /// The event being resolved, whose memory counts its answer (a
        /// subscription's events resolve one at a time).
        event: Mutex<Option<FanoutRequest>>,
    },
}

impl Mode {
    /// The mode of `op`, admitted without a refusal: on `connection`, what
    /// it will hold while active is weighed and taken from its client's
    /// share of the sockets' pool, or it is refused.
    pub(super) fn admitted(
        op: Op,
        text: Arc<str>,
        scope: FanoutRequest,
        connection: Option<FanoutConnection>,
        request: &mut Request,
    ) -> ServerResult<Mode> {
        let Some(connection) = connection else {
            let op = Mutex::new(Some(op));
            return Ok(Mode::Scoped {
                text,
                meter: scope,
                op,
            });
        };
        // Each event may read what one request may: priced past it,
        // refused now (`refuse_over_estimate`), as over HTTP.
        if let Some(refusal) = connection.over_estimate(op.requested()) {
            return Err(operation_error(&refusal));
        }
        // What it holds while active — its document, variables and text —
        // in its client's share of the sockets' pool: weighed before it
        // runs, refused when it does not fit.
        let length = request.query.len();
        let variables = std::mem::take(&mut request.variables);
        let weight =
            (request.parsed_query()).map(|doc| socket::held::weight(doc, length, &variables));
        request.variables = variables;
        let Some(held) = connection.hold(weight?) else {
            let max = connection.max_bytes();
            return Err(operation_error(&OperationError::Overloaded { max }));
        };
        Ok(Mode::Socket {
            text,
            connection,
            op,
            _held: held,
            event: Mutex::new(None),
        })
    }

    /// Gives async-graphql's `errors` their codes against the text that
    /// runs (`finish.rs`), unless `FanoutGraphQL` does.
    pub(super) fn code(mode: Option<&Mode>, errors: &mut [ServerError]) {
        let text = match mode {
            Some(Mode::Aside { .. }) => return,
            Some(
                Mode::Refused { text } | Mode::Scoped { text, .. } | Mode::Socket { text, .. },
            ) => text,
            None => "",
        };
        code_errors(errors, text);
    }
}

/// The operation's scope while the extensions registered after this one
/// prepare the request: if the operation ends before it is admitted (one of
/// them refused it, or the operation was dropped), it counts at the pricing
/// barrier at 0, once, and is [`Mode::Refused`].
pub(super) struct Unadmitted<'a> {
    pub(super) mode: &'a OnceLock<Mode>,
    pub(super) scope: &'a FanoutRequest,
}

impl Drop for Unadmitted<'_> {
    fn drop(&mut self) {
        let refused = Mode::Refused {
            text: Arc::from(""),
        };
        if self.mode.set(refused).is_ok() {
            self.scope.priced(0);
        }
    }
}
