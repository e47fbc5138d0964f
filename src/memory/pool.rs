//! A pool of bytes: what a set of holders may keep at once.
//!
//! One counter and its bound; taking is one compare-and-swap loop that never
//! passes the bound, giving back one subtraction. A pool may sit inside
//! another ([`MemoryPool::share`]): every byte taken from it is taken from
//! its parent too, and refused when either is full — a client's share of
//! the sockets' pool (`shares.rs`).
//!
//! The engine has two roots: the requests' pool (`http.max_inflight_bytes`:
//! answers being built and written, upstream bodies kept) and the sockets'
//! pool (`subscriptions.max_bytes`: what open WebSocket connections hold),
//! so that no number of sockets can take what an HTTP request needs.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

/// Which gauge a pool's level is reported on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gauge {
    /// `fanout_memory_held_bytes`: the requests in flight.
    Requests,
    /// `fanout_socket_memory_held_bytes`: the open sockets.
    Sockets,
    /// None (a client's share: its parent reports).
    Silent,
}

/// Bytes a set of holders may keep at once (see the module docs).
#[derive(Debug)]
pub(crate) struct MemoryPool {
    max: usize,
    used: AtomicUsize,
    /// Taken from too, for every byte taken here.
    parent: Option<Arc<MemoryPool>>,
    gauge: Gauge,
    /// The gauge's handle, registered on the first report.
    held: OnceLock<metrics::Gauge>,
}

impl MemoryPool {
    /// The requests' pool, `max` bytes.
    pub(crate) fn new(max: usize) -> Self {
        Self::root(max, Gauge::Requests)
    }

    /// A pool of `max` bytes with no parent, its level on `gauge`.
    pub(crate) fn root(max: usize, gauge: Gauge) -> Self {
        Self {
            max,
            used: AtomicUsize::new(0),
            parent: None,
            gauge,
            held: OnceLock::new(),
        }
    }

    /// A share of `max` bytes of `parent`: every byte taken from it is
    /// taken from `parent` too.
    pub(crate) fn share(parent: Arc<MemoryPool>, max: usize) -> Self {
        Self {
            max,
            used: AtomicUsize::new(0),
            parent: Some(parent),
            gauge: Gauge::Silent,
            held: OnceLock::new(),
        }
    }

    /// The bound, in bytes.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Bytes taken now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Relaxed)
    }

    /// Takes `bytes`, or nothing when that would pass this pool's bound or
    /// its parent's.
    pub(crate) fn take(&self, bytes: usize) -> bool {
        let taken = self.used.fetch_update(Relaxed, Relaxed, |used| {
            let after = used.checked_add(bytes)?;
            (after <= self.max).then_some(after)
        });
        let Ok(before) = taken else {
            return false;
        };
        if let Some(parent) = &self.parent {
            if !parent.take(bytes) {
                self.used.fetch_sub(bytes, Relaxed);
                return false;
            }
        }
        self.report(before + bytes);
        true
    }

    /// Gives back `bytes` taken before.
    pub(crate) fn give_back(&self, bytes: usize) {
        let before = self.used.fetch_sub(bytes, Relaxed);
        if let Some(parent) = &self.parent {
            parent.give_back(bytes);
        }
        self.report(before - bytes);
    }

    fn report(&self, level: usize) {
        let register = match self.gauge {
            Gauge::Requests => crate::metrics::memory_held,
            Gauge::Sockets => crate::metrics::socket_memory_held,
            Gauge::Silent => return,
        };
        self.held.get_or_init(register).set(level as f64);
    }

    /// Takes `bytes` for as long as the returned lease lives, or `None`
    /// when that would pass the bound.
    pub(crate) fn lease(self: &Arc<Self>, bytes: usize) -> Option<PoolBytes> {
        self.take(bytes).then(|| PoolBytes {
            pool: self.clone(),
            bytes,
        })
    }
}

/// Bytes taken from a [`MemoryPool`], given back when dropped.
#[derive(Debug)]
pub(crate) struct PoolBytes {
    pool: Arc<MemoryPool>,
    bytes: usize,
}

impl PoolBytes {
    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for PoolBytes {
    fn drop(&mut self) {
        self.pool.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_takes_from_its_parent_and_is_refused_by_either_bound() {
        let root = Arc::new(MemoryPool::root(100, Gauge::Silent));
        let a = Arc::new(MemoryPool::share(root.clone(), 60));
        let b = Arc::new(MemoryPool::share(root.clone(), 60));
        let held = a.lease(60).expect("within both");
        assert!(a.lease(1).is_none(), "the share is full");
        assert_eq!(root.used(), 60);
        assert!(b.lease(50).is_none(), "the parent is full past 40 more");
        assert_eq!(b.used(), 0, "a refusal takes nothing from the share");
        let other = b.lease(40).expect("what the parent has left");
        assert_eq!(root.used(), 100);
        drop(held);
        assert_eq!((a.used(), root.used()), (0, 40));
        drop(other);
        assert_eq!(root.used(), 0);
    }
}
