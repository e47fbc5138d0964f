//! The subscriptions a connection started, each while its admission is
//! checked or while it runs, and what the next of them made ready: polled
//! from a turn that moves on, so that none starves the others.

use crate::error::Rejection;
use crate::memory::PoolBytes;
use async_graphql::{Request, Response};
use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt};
use futures::FutureExt;
use std::task::Poll;

/// What the driver keeps of an active subscription besides its id: its
/// entry here, and the boxed stream async-graphql hands it.
pub(super) const SUBSCRIPTION_WEIGHT: usize = 512;

/// The subscriptions of one connection.
#[derive(Default)]
pub(super) struct Subscriptions {
    list: Vec<Subscription>,
    /// Which subscription is polled first next time (fairness).
    turn: usize,
}

/// One subscription started.
struct Subscription {
    id: String,
    stage: Stage,
}

/// Where a subscription is.
enum Stage {
    /// Its admission check (the client's per-IP limit) waits; then
    /// `payload` runs. Meanwhile `held` holds what `payload` holds
    /// (`held::waiting`) in its client's share of the sockets' pool.
    Checking {
        check: BoxFuture<'static, Result<(), Rejection>>,
        payload: Box<Request>,
        _held: PoolBytes,
    },
    /// Running: its events.
    Running {
        events: BoxStream<'static, Response>,
        /// Whether an event of it has been answered yet.
        answered: bool,
        /// What the driver keeps of it while active — its id, its
        /// stream's box and its place here — in its client's share of the
        /// sockets' pool (its operation's document, variables and text
        /// are held by the extension, `held.rs`).
        _held: PoolBytes,
    },
}

/// What a subscription made ready.
pub(super) enum Ready {
    /// Its admission check answered `checked`: it is no longer here.
    Checked {
        id: String,
        payload: Box<Request>,
        checked: Result<(), Rejection>,
    },
    /// An event of the running subscription at `at` (`None`: its stream
    /// ended); `first`: the first it made.
    Event {
        at: usize,
        first: bool,
        event: Option<Response>,
    },
}

/// What a poll found ready, before it is taken out.
enum Polled {
    Checked(Result<(), Rejection>),
    Event(bool, Option<Response>),
}

impl Subscriptions {
    /// Whether none is started.
    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Subscription `id`, whose admission `check` waits before `payload`
    /// runs, `held` meanwhile.
    pub(super) fn checking(
        &mut self,
        id: String,
        check: BoxFuture<'static, Result<(), Rejection>>,
        payload: Box<Request>,
        held: PoolBytes,
    ) {
        let stage = Stage::Checking {
            check,
            payload,
            _held: held,
        };
        self.list.push(Subscription { id, stage });
    }

    /// Subscription `id` running: its `events`, `held` while it runs.
    pub(super) fn running(
        &mut self,
        id: String,
        events: BoxStream<'static, Response>,
        held: PoolBytes,
    ) {
        let stage = Stage::Running {
            events,
            answered: false,
            _held: held,
        };
        self.list.push(Subscription { id, stage });
    }

    /// The id of the subscription at `at`.
    pub(super) fn id(&self, at: usize) -> &str {
        &self.list[at].id
    }

    /// Drops the subscription at `at` (its stream ended, or its operation
    /// was refused): its id.
    pub(super) fn remove(&mut self, at: usize) -> String {
        self.list.swap_remove(at).id
    }

    /// Drops subscription `id` — its stream, or its admission check still
    /// waiting (the client stopped it).
    pub(super) fn stop(&mut self, id: &str) {
        self.list.retain(|s| s.id != id);
    }

    /// What the next subscription, from the turn on, made ready.
    pub(super) async fn next(&mut self) -> Ready {
        let (at, polled) = std::future::poll_fn(|cx| {
            let n = self.list.len();
            for k in 0..n {
                let at = (self.turn + k) % n;
                let ready = match &mut self.list[at].stage {
                    Stage::Checking { check, .. } => check.poll_unpin(cx).map(Polled::Checked),
                    Stage::Running {
                        events, answered, ..
                    } => events.poll_next_unpin(cx).map(|event| {
                        let first = !std::mem::replace(answered, true);
                        Polled::Event(first, event)
                    }),
                };
                if let Poll::Ready(ready) = ready {
                    self.turn = at + 1;
                    return Poll::Ready((at, ready));
                }
            }
            Poll::Pending
        })
        .await;
        match polled {
            Polled::Checked(checked) => {
                let Subscription { id, stage } = self.list.swap_remove(at);
                let Stage::Checking { payload, .. } = stage else {
                    unreachable!("only a subscription being checked is checked");
                };
                Ready::Checked {
                    id,
                    payload,
                    checked,
                }
            }
            Polled::Event(first, event) => Ready::Event { at, first, event },
        }
    }
}
