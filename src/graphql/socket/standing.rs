//! What a connection holds for as long as it is open, whatever it does:
//! charged to its client's share of the sockets' pool like its
//! subscriptions are.
//!
//! - **Its base**: the task, its buffers when idle, its place in the
//!   connection table ([`CONNECTION_WEIGHT`]), and the upgrade request's
//!   headers, kept until `connection_init` fixes the caller (a client may
//!   send 90 headers of 4 KB with the upgrade).
//! - **Its largest frame written**: the WebSocket library writes a frame
//!   into a buffer it empties but never shrinks, so a socket that once
//!   wrote a 6 MB event keeps 6 MB for good. A frame's bytes are held while
//!   it is written (`outbox.rs`); the largest such hold is kept afterwards.
//! - **Its largest message read**: the reading side keeps what its largest
//!   message needed, as the writing side does.
//!
//! A connection whose base its client's share cannot hold is closed at once
//! (1013, try again later); one that reads a message larger than its share
//! can still hold is closed too. A frame to write was charged before it was
//! taken (an event that does not fit is replaced by a small one), so the
//! writing side never needs to close.

use crate::memory::{MemoryPool, PoolBytes};
use std::sync::Arc;

/// A connection's own memory, idle: its task and driver, the WebSocket's
/// 4 KiB read buffer, hyper's connection state (measured: an idle socket
/// with nothing subscribed holds about 16 KiB).
pub(crate) const CONNECTION_WEIGHT: usize = 16 << 10;

/// What one header of the upgrade request holds beyond its name and value.
const HEADER_WEIGHT: usize = 64;

/// A connection's standing charges (see the module docs).
pub(super) struct Standing {
    pool: Arc<MemoryPool>,
    _base: PoolBytes,
    /// The upgrade request's headers, until `connection_init`.
    headers: Option<PoolBytes>,
    /// The largest message read, in the leases it grew by.
    read: Vec<PoolBytes>,
    read_bytes: usize,
    written: Option<PoolBytes>,
}

impl Standing {
    /// The base of a connection whose upgrade request had `headers`, taken
    /// from `pool` (its client's share); `None` when it does not fit.
    pub(super) fn open(pool: Arc<MemoryPool>, headers: &http::HeaderMap) -> Option<Self> {
        let headers: usize = (headers.iter())
            .map(|(name, value)| HEADER_WEIGHT + name.as_str().len() + value.len())
            .sum();
        let base = pool.lease(CONNECTION_WEIGHT)?;
        let headers = pool.lease(headers)?;
        Some(Self {
            pool,
            _base: base,
            headers: Some(headers),
            read: Vec::new(),
            read_bytes: 0,
            written: None,
        })
    }

    /// The upgrade request's headers are dropped (`connection_init` fixed
    /// the caller): their bytes go back.
    pub(super) fn headers_dropped(&mut self) {
        self.headers = None;
    }

    /// A message of `bytes` was read: `false` when the share cannot hold
    /// the largest read so far (only what it grew by is taken).
    pub(super) fn read(&mut self, bytes: usize) -> bool {
        if bytes <= self.read_bytes {
            return true;
        }
        match self.pool.lease(bytes - self.read_bytes) {
            Some(more) => {
                self.read.push(more);
                self.read_bytes = bytes;
                true
            }
            None => false,
        }
    }

    /// A frame was written, holding `held` while it was: kept if it is the
    /// largest yet (the write buffer is as large as it), else given back.
    pub(super) fn written(&mut self, held: Option<PoolBytes>) {
        let Some(held) = held else {
            return;
        };
        if self
            .written
            .as_ref()
            .is_none_or(|kept| kept.bytes() < held.bytes())
        {
            self.written = Some(held);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_frames_stay_charged_and_the_base_holds_the_headers() {
        let pool = Arc::new(MemoryPool::new(1 << 20));
        let mut headers = http::HeaderMap::new();
        headers.insert("x-pad", "x".repeat(4000).parse().unwrap());
        let mut standing = Standing::open(pool.clone(), &headers).unwrap();
        let base = CONNECTION_WEIGHT + HEADER_WEIGHT + 5 + 4000;
        assert_eq!(pool.used(), base);
        standing.written(pool.lease(300_000));
        standing.written(pool.lease(1_000));
        assert_eq!(pool.used(), base + 300_000, "the largest written kept");
        assert!(standing.read(60_000));
        assert!(standing.read(10));
        assert!(standing.read(70_000), "only the 10,000 more taken");
        assert_eq!(pool.used(), base + 370_000);
        assert!(!standing.read(1 << 20), "past the share");
        standing.headers_dropped();
        assert_eq!(
            pool.used(),
            CONNECTION_WEIGHT + 370_000,
            "the headers given back"
        );
        drop(standing);
        assert_eq!(pool.used(), 0);
        assert!(
            Standing::open(Arc::new(MemoryPool::new(1000)), &headers).is_none(),
            "a base past the share"
        );
    }
}
