//! Connections accepted while the table is full, waiting for a slot.
//!
//! The accept loop accepts whether or not a slot is free, so that it sees
//! who is asking: a connection that finds no slot waits here, accepted but
//! not read (its header timeout starts when it is served), counted in its
//! client's share. Three lines ([`Line`]): **fresh** connections, whose
//! client holds no other; connections for which an idle connection was
//! asked to close ([`Clients::make_room_for`](super::refusals::Clients));
//! and **the rest**. Each freed slot goes to the head of the first line
//! that has one, in that order.
//!
//! At most [`WAITING_MAX`] wait, all lines together (file descriptors
//! beyond `http.max_connections`). Past that, a fresh connection takes the
//! place of the newest of the rest, else of the newest that made room,
//! which is refused; any other is refused itself (refused as a connection
//! past its client's share is: reset, or held and reset if its client was
//! refused lately). So a fresh client is refused only when [`WAITING_MAX`]
//! fresh clients wait: connections that made room for themselves — a
//! client holding fewer than another, reconnecting as fast as it can —
//! cannot fill the lines against it.

use super::refusals::ClientSlot;
use std::collections::VecDeque;
use std::net::SocketAddr;
use tokio::net::TcpStream;

/// Connections waiting at most, all lines together.
pub(super) const WAITING_MAX: usize = 128;

/// An accepted connection, counted in its client's share.
pub(super) struct Accepted {
    pub(super) stream: TcpStream,
    pub(super) peer: SocketAddr,
    pub(super) slot: ClientSlot,
}

/// Which line a waiting connection is in, the first served first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Line {
    /// Its client holds no other connection.
    Fresh,
    /// An idle connection of a client holding more was asked to close for it.
    MadeRoom,
    /// Any other.
    Rest,
}

/// The three lines.
pub(super) struct Waiting {
    fresh: VecDeque<Accepted>,
    made_room: VecDeque<Accepted>,
    rest: VecDeque<Accepted>,
}

impl Waiting {
    /// No one waiting.
    pub(super) fn new() -> Self {
        Self {
            fresh: VecDeque::new(),
            made_room: VecDeque::new(),
            rest: VecDeque::new(),
        }
    }

    fn len(&self) -> usize {
        self.fresh.len() + self.made_room.len() + self.rest.len()
    }

    /// Whether no one waits.
    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a connection would be let in: a fresh one (`fresh`) while
    /// any other waits, any while the lines are not full.
    pub(super) fn has_room(&self, fresh: bool) -> bool {
        self.len() < WAITING_MAX || (fresh && self.len() > self.fresh.len())
    }

    /// Puts `accepted` in `line`; the connection it displaced, if the lines
    /// were full (see [`Waiting::has_room`]).
    pub(super) fn push(&mut self, accepted: Accepted, line: Line) -> Option<Accepted> {
        let displaced = if self.len() >= WAITING_MAX {
            self.rest.pop_back().or_else(|| self.made_room.pop_back())
        } else {
            None
        };
        match line {
            Line::Fresh => &mut self.fresh,
            Line::MadeRoom => &mut self.made_room,
            Line::Rest => &mut self.rest,
        }
        .push_back(accepted);
        displaced
    }

    /// The next to serve: the head of the first line that has one.
    pub(super) fn pop(&mut self) -> Option<Accepted> {
        self.fresh
            .pop_front()
            .or_else(|| self.made_room.pop_front())
            .or_else(|| self.rest.pop_front())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbound::identity::{ClientPrefix, TrustedProxies};
    use crate::inbound::serve::refusals::{Admission, Clients};
    use std::sync::Arc;
    use tokio::net::{TcpListener, TcpStream};

    /// Accepted connections over loopback, each counted in a share of
    /// its own; the client ends kept open.
    struct Loopback {
        listener: TcpListener,
        clients: Arc<Clients>,
        ends: Vec<TcpStream>,
    }

    impl Loopback {
        async fn new() -> Self {
            Self {
                listener: TcpListener::bind("127.0.0.1:0").await.unwrap(),
                clients: Arc::new(Clients::new(
                    usize::MAX,
                    ClientPrefix::new(32, 64),
                    TrustedProxies::new::<&str>(&[]),
                )),
                ends: Vec::new(),
            }
        }

        async fn accept(&mut self) -> Accepted {
            let addr = self.listener.local_addr().unwrap();
            self.ends.push(TcpStream::connect(addr).await.unwrap());
            let (stream, peer) = self.listener.accept().await.unwrap();
            let Admission::Admitted(slot) = self.clients.admit(peer.ip()) else {
                panic!("refused")
            };
            Accepted { stream, peer, slot }
        }
    }

    /// The lines full of connections that made room for themselves: a
    /// fresh one still gets in, in the place of the newest of them; only
    /// fresh ones filling the lines keep a fresh one out.
    #[tokio::test]
    async fn only_fresh_connections_keep_a_fresh_one_out() {
        let mut loopback = Loopback::new().await;
        let mut waiting = Waiting::new();
        let mut newest = None;
        for _ in 0..WAITING_MAX {
            let accepted = loopback.accept().await;
            newest = Some(accepted.peer);
            assert!(waiting.has_room(false));
            assert!(waiting.push(accepted, Line::MadeRoom).is_none());
        }
        assert!(!waiting.has_room(false), "the lines are full");
        for i in 0..WAITING_MAX {
            assert!(waiting.has_room(true), "fresh connection {i} refused");
            let displaced = waiting.push(loopback.accept().await, Line::Fresh);
            let displaced = displaced.expect("a connection that made room displaced");
            if i == 0 {
                assert_eq!(Some(displaced.peer), newest, "the newest displaced");
            }
        }
        assert!(!waiting.has_room(true), "the lines are full of fresh ones");
        assert!(!waiting.has_room(false));
    }

    /// A fresh connection displaces the rest before those that made room;
    /// freed slots go to the fresh, then to those that made room, then to
    /// the rest, each line in order.
    #[tokio::test]
    async fn fresh_first_then_those_that_made_room_then_the_rest() {
        let mut loopback = Loopback::new().await;
        let mut waiting = Waiting::new();
        let mut lines = Vec::new();
        for i in 0..WAITING_MAX {
            let line = [Line::Rest, Line::MadeRoom, Line::Fresh][i % 3];
            let accepted = loopback.accept().await;
            lines.push((accepted.peer, line));
            assert!(waiting.push(accepted, line).is_none());
        }
        let fresh = loopback.accept().await;
        lines.push((fresh.peer, Line::Fresh));
        let displaced = waiting.push(fresh, Line::Fresh).unwrap();
        let newest_rest = lines.iter().rev().find(|(_, line)| *line == Line::Rest);
        assert_eq!(Some(displaced.peer), newest_rest.map(|(peer, _)| *peer));
        lines.retain(|(peer, _)| *peer != displaced.peer);
        let mut expected = Vec::new();
        for line in [Line::Fresh, Line::MadeRoom, Line::Rest] {
            expected.extend(lines.iter().filter(|(_, l)| *l == line).map(|(p, _)| *p));
        }
        let mut served = Vec::new();
        while let Some(next) = waiting.pop() {
            served.push(next.peer);
        }
        assert_eq!(served, expected);
        assert!(waiting.is_empty());
    }
}
