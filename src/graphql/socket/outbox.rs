//! What a connection has to write, and how much of it may wait.
//!
//! The socket writes one frame at a time; while a write waits for the
//! client to read, the connection keeps reading messages and resolving
//! events, so what they produce waits here:
//!
//! - **replies** (acks, pongs, refusals, completions): at most
//!   [`MAX_REPLIES`], counting the subscriptions that ended with frames
//!   still to write (a query sent over the socket ends at once, its event
//!   and its `complete` left here); while that many wait, no client message
//!   is read (the client's own sending is slowed to its reading, and what
//!   waits for it stays bounded however many operations it sends);
//! - **events**, per subscription: at most `subscriptions.max_pending_events`;
//!   past it the oldest is dropped (a subscription's newest state is what a
//!   client wants; the count is in `fanout_subscription_events_dropped_total`),
//!   and each waiting event holds its bytes in its client's share of the
//!   sockets' pool (`subscriptions.max_bytes`): an event it cannot take is replaced
//!   by a small `next` saying so (`OVERLOADED`), so the client knows it
//!   missed one.
//!
//! Replies are written first, then the events in the order they were
//! resolved, whatever their subscription: each carries the connection's
//! `used` at its resolution, which the client so never sees go back.
//!
//! A client that does not read at all is closed by the write timeout
//! (`http.write_timeout_ms`), and everything waiting is dropped with it.

use crate::memory::{MemoryPool, PoolBytes};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Replies waiting to be written, at most.
pub(crate) const MAX_REPLIES: usize = 32;

/// A reply or last frame this small waits even when the pool cannot hold
/// it (an ack, a pong, a `complete`, a short refusal): [`MAX_REPLIES`] of
/// them are 32 KiB at most.
pub(crate) const SMALL_FRAME: usize = 1024;

/// A frame waiting, with the pool's bytes it holds.
struct Pending {
    /// When it was made, among the connection's frames.
    seq: u64,
    text: String,
    held: Option<PoolBytes>,
    /// The subscription's `complete`, its last frame (never dropped).
    last: bool,
}

/// What a connection has to write (see the module docs).
pub(crate) struct Outbox {
    replies: VecDeque<(String, Option<PoolBytes>)>,
    events: HashMap<String, VecDeque<Pending>>,
    /// The next frame's `seq`.
    made: u64,
    /// `complete` frames waiting (subscriptions over, frames to write).
    finished: usize,
    max_events: usize,
    pool: Arc<MemoryPool>,
}

impl Outbox {
    pub(crate) fn new(max_events: usize, pool: Arc<MemoryPool>) -> Self {
        Self {
            replies: VecDeque::new(),
            events: HashMap::new(),
            made: 0,
            finished: 0,
            max_events,
            pool,
        }
    }

    /// Whether another reply may wait (else no client message is read):
    /// fewer than [`MAX_REPLIES`] replies and ended subscriptions wait.
    pub(crate) fn takes_replies(&self) -> bool {
        self.replies.len() + self.finished < MAX_REPLIES
    }

    /// A reply to write after those waiting, its bytes held in the pool;
    /// `false` (and nothing waits) when the pool cannot hold it and it is
    /// larger than [`SMALL_FRAME`]: the caller sends a small one instead.
    pub(crate) fn reply(&mut self, text: String) -> bool {
        let Some(held) = self.hold(&text) else {
            return false;
        };
        self.replies.push_back((text, held));
        true
    }

    /// A small reply the client waits for (an ack, a pong, a refusal saying
    /// `OVERLOADED`): it waits whether or not the pool holds it — bounded
    /// by [`MAX_REPLIES`] and by what such frames are (ids are at most 128
    /// bytes).
    pub(crate) fn reply_small(&mut self, text: String) {
        let held = self.pool.lease(text.len());
        self.replies.push_back((text, held));
    }

    /// `text`'s bytes held in the pool (`Some(None)`: small enough to wait
    /// outside it), or `None` when it cannot wait.
    fn hold(&self, text: &str) -> Option<Option<PoolBytes>> {
        match self.pool.lease(text.len()) {
            Some(held) => Some(Some(held)),
            None => (text.len() <= SMALL_FRAME).then_some(None),
        }
    }

    /// An event of subscription `id`; `false`: an older one was dropped,
    /// or the pool could not hold this one and `overloaded` (a small frame
    /// saying so, held outside the pool) waits in its place.
    pub(crate) fn event(
        &mut self,
        id: &str,
        text: String,
        overloaded: impl FnOnce() -> String,
    ) -> bool {
        let seq = self.seq();
        let (pending, mut kept) = match self.pool.lease(text.len()) {
            Some(held) => (
                Pending {
                    seq,
                    text,
                    held: Some(held),
                    last: false,
                },
                true,
            ),
            None => (
                Pending {
                    seq,
                    text: overloaded(),
                    held: None,
                    last: false,
                },
                false,
            ),
        };
        let queue = self.events.entry(id.to_owned()).or_default();
        // The oldest event goes; a `complete` (the id's earlier
        // subscription's) stays.
        if queue.iter().filter(|p| !p.last).count() >= self.max_events {
            if let Some(oldest) = queue.iter().position(|p| !p.last) {
                queue.remove(oldest);
            }
            kept = false;
        }
        queue.push_back(pending);
        kept
    }

    /// Subscription `id`'s last frame (`complete`, or the `error` of an
    /// operation refused before it ran), written after its waiting events
    /// and never dropped.
    ///
    /// Its bytes are held in the pool as a reply's are (`false`: it does
    /// not wait, and the caller sends a small one instead).
    pub(crate) fn finish(&mut self, id: &str, text: String) -> bool {
        let Some(held) = self.hold(&text) else {
            return false;
        };
        self.push_last(id, text, held);
        true
    }

    /// [`finish`](Self::finish) with a small last frame (a `complete`, a
    /// refusal saying `OVERLOADED`), which waits whether or not the pool
    /// holds it.
    pub(crate) fn finish_small(&mut self, id: &str, text: String) {
        let held = self.pool.lease(text.len());
        self.push_last(id, text, held);
    }

    fn push_last(&mut self, id: &str, text: String, held: Option<PoolBytes>) {
        let seq = self.seq();
        let queue = self.events.entry(id.to_owned()).or_default();
        queue.push_back(Pending {
            seq,
            text,
            held,
            last: true,
        });
        self.finished += 1;
    }

    /// Drops subscription `id`'s waiting events (the client stopped it).
    pub(crate) fn forget(&mut self, id: &str) {
        if let Some(queue) = self.events.remove(id) {
            self.finished -= queue.iter().filter(|p| p.last).count();
        }
    }

    fn seq(&mut self) -> u64 {
        self.made += 1;
        self.made
    }

    /// The next frame to write: replies first, then the events (and
    /// last frames) in the order they were made, whichever subscription
    /// made them — each event's `extensions.fanout.used` is the
    /// connection's when it was resolved, so the client never sees it go
    /// back. (A subscription cannot crowd the others out: each keeps at
    /// most `max_pending_events` waiting.)
    ///
    /// An event's bytes stay held in the pool until the returned frame is
    /// dropped: written, or its write timed out.
    pub(crate) fn next(&mut self) -> Option<Outgoing> {
        if let Some((text, held)) = self.replies.pop_front() {
            return Some(Outgoing { text, held });
        }
        // The oldest among the subscriptions' oldest (a few dozen at most).
        let id = (self.events.iter())
            .filter_map(|(id, queue)| Some((queue.front()?.seq, id)))
            .min()?
            .1
            .clone();
        let queue = self.events.get_mut(&id)?;
        let pending = queue.pop_front()?;
        if pending.last {
            self.finished -= 1;
        }
        if queue.is_empty() {
            self.events.remove(&id);
        }
        Some(Outgoing {
            text: pending.text,
            held: pending.held,
        })
    }
}

/// A frame taken to be written, with the pool's bytes it holds until the
/// write is over (a client that does not read holds it until the write
/// timeout).
pub(crate) struct Outgoing {
    pub(crate) text: String,
    pub(crate) held: Option<PoolBytes>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscription_keeps_its_newest_events_and_replies_go_first() {
        let pool = Arc::new(MemoryPool::new(1 << 20));
        let mut outbox = Outbox::new(2, pool.clone());
        let full = || unreachable!("the pool has room");
        assert!(outbox.event("a", "a1".into(), full));
        assert!(outbox.event("a", "a2".into(), full));
        assert!(
            !outbox.event("a", "a3".into(), full),
            "the oldest is dropped"
        );
        assert!(outbox.event("b", "b1".into(), full));
        outbox.reply("ack".into());
        let order: Vec<_> = std::iter::from_fn(|| outbox.next().map(|frame| frame.text)).collect();
        assert_eq!(order, ["ack", "a2", "a3", "b1"]);
        assert_eq!(pool.used(), 0, "written events give their bytes back");
    }

    #[test]
    fn frames_are_written_in_the_order_their_events_were_resolved() {
        // Each event reports the connection's `used` when it was resolved:
        // written out of that order, a client would see it go back.
        let pool = Arc::new(MemoryPool::new(1 << 20));
        let mut outbox = Outbox::new(4, pool);
        let full = || unreachable!("the pool has room");
        assert!(outbox.event("a", "a used=1".into(), full));
        assert!(outbox.event("a", "a used=2".into(), full));
        assert!(outbox.event("b", "b used=3".into(), full));
        outbox.finish("b", "b complete".into());
        assert!(outbox.event("a", "a used=4".into(), full));
        let order: Vec<_> = std::iter::from_fn(|| outbox.next().map(|frame| frame.text)).collect();
        assert_eq!(
            order,
            ["a used=1", "a used=2", "b used=3", "b complete", "a used=4"]
        );
    }

    #[test]
    fn ended_subscriptions_waiting_to_be_written_count_as_replies() {
        let pool = Arc::new(MemoryPool::new(1 << 20));
        let mut outbox = Outbox::new(4, pool);
        let full = || unreachable!("the pool has room");
        for n in 0..MAX_REPLIES {
            assert!(outbox.takes_replies());
            let id = n.to_string();
            assert!(outbox.event(&id, format!("next {id}"), full));
            outbox.finish(&id, format!("complete {id}"));
        }
        assert!(!outbox.takes_replies(), "no message read past the bound");
        let written = std::iter::from_fn(|| outbox.next().map(|frame| frame.text)).count();
        assert_eq!(written, 2 * MAX_REPLIES);
        assert!(outbox.takes_replies(), "every complete written");
        outbox.finish("again", "complete again".into());
        outbox.forget("again");
        assert!(outbox.takes_replies());
    }

    #[test]
    fn a_complete_is_never_dropped_for_a_later_event_of_its_id() {
        let pool = Arc::new(MemoryPool::new(1 << 20));
        let mut outbox = Outbox::new(1, pool);
        let full = || unreachable!("the pool has room");
        assert!(outbox.event("a", "a1".into(), full));
        outbox.finish("a", "complete".into());
        // The id subscribed again before the client read anything: its
        // events push out the oldest event, never the `complete`.
        assert!(!outbox.event("a", "b1".into(), full));
        assert!(!outbox.event("a", "b2".into(), full));
        let order: Vec<_> = std::iter::from_fn(|| outbox.next().map(|frame| frame.text)).collect();
        assert_eq!(order, ["complete", "b2"]);
        assert!(outbox.takes_replies());
    }

    #[test]
    fn waiting_events_hold_their_bytes_in_the_pool() {
        let pool = Arc::new(MemoryPool::new(10));
        let mut outbox = Outbox::new(4, pool.clone());
        assert!(outbox.event("a", "123456".into(), || unreachable!()));
        assert_eq!(pool.used(), 6);
        assert!(
            !outbox.event("a", "123456".into(), || "full".into()),
            "past the pool"
        );
        assert_eq!(
            pool.used(),
            6,
            "the frame in its place is held outside the pool"
        );
        let writing = outbox.next().unwrap();
        assert_eq!(writing.text, "123456");
        assert_eq!(pool.used(), 6, "held while it is being written");
        drop(writing);
        assert_eq!(outbox.next().unwrap().text, "full");
        assert_eq!(pool.used(), 0);
        assert!(outbox.event("a", "123456".into(), || unreachable!()));
        outbox.forget("a");
        assert_eq!(pool.used(), 0);
        assert!(outbox.next().is_none());
    }
}
