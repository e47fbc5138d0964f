//! Connections accepted while the table is full, waiting for a slot.
//!
//! The accept loop accepts whether or not a slot is free, so that it sees
//! who is asking: a connection that finds no slot waits here, accepted but
//! not read (its header timeout starts when it is served), counted in its
//! client's share. Two lines: **first** for a connection whose client holds
//! no other connection, or for which an idle connection was asked to close
//! ([`Clients::make_room_for`](super::refusals::Clients)), and **the rest**;
//! each freed slot goes to the head of the first line, else of the rest.
//!
//! At most [`WAITING_MAX`] wait, both lines together (file descriptors
//! beyond `http.max_connections`). Past that, a connection for the first
//! line takes the place of the newest of the rest, which is refused; any
//! other is refused itself (refused as a connection past its client's
//! share is: reset, or held and reset if its client was refused lately).

use super::refusals::ClientSlot;
use std::collections::VecDeque;
use std::net::SocketAddr;
use tokio::net::TcpStream;

/// Connections waiting at most, both lines together.
pub(super) const WAITING_MAX: usize = 128;

/// An accepted connection, counted in its client's share.
pub(super) struct Accepted {
    pub(super) stream: TcpStream,
    pub(super) peer: SocketAddr,
    pub(super) slot: ClientSlot,
}

/// The two lines.
pub(super) struct Waiting {
    first: VecDeque<Accepted>,
    rest: VecDeque<Accepted>,
}

impl Waiting {
    /// No one waiting.
    pub(super) fn new() -> Self {
        Self {
            first: VecDeque::new(),
            rest: VecDeque::new(),
        }
    }

    /// Whether no one waits.
    pub(super) fn is_empty(&self) -> bool {
        self.first.is_empty() && self.rest.is_empty()
    }

    /// Whether a connection for the first line (`first`) or the rest would
    /// be let in.
    pub(super) fn has_room(&self, first: bool) -> bool {
        self.first.len() + self.rest.len() < WAITING_MAX || (first && !self.rest.is_empty())
    }

    /// Puts `accepted` in its line; the connection it displaced from the
    /// rest, if the lines were full (see [`Waiting::has_room`]).
    pub(super) fn push(&mut self, accepted: Accepted, first: bool) -> Option<Accepted> {
        let displaced = if self.first.len() + self.rest.len() >= WAITING_MAX {
            self.rest.pop_back()
        } else {
            None
        };
        if first {
            self.first.push_back(accepted);
        } else {
            self.rest.push_back(accepted);
        }
        displaced
    }

    /// The next to serve: the first line's head, else the rest's.
    pub(super) fn pop(&mut self) -> Option<Accepted> {
        self.first.pop_front().or_else(|| self.rest.pop_front())
    }
}
