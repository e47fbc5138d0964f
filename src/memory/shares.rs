//! What open sockets hold: a pool of their own, and a share of it per client.
//!
//! A WebSocket connection lives for hours, and what it keeps — its
//! subscriptions (their documents, variables and texts), the events being
//! resolved for them, the events waiting to be written — is taken from the
//! sockets' pool (`subscriptions.max_bytes`), never from the requests' pool
//! (`http.max_inflight_bytes`): no number of sockets can make an HTTP
//! request `OVERLOADED`.
//!
//! Within it each client (keyed as the per-IP limiter keys it: the address
//! behind trusted proxies, masked to its prefix) has a share
//! (`subscriptions.max_bytes_per_client`), as it has a share of the
//! connection table: one client's sockets cannot fill the pool for the
//! others. What is refused when a share or the pool is full is the newcomer
//! — a subscribe answered `OVERLOADED` for its id, an event replaced by a
//! small `OVERLOADED` one — never what is already held: a socket's
//! subscriptions stay, and the client frees room by stopping one.
//!
//! How it works: one [`MemoryPool`] for the sockets, and one share pool per
//! client, inside it (`pool.rs`), found in a map of weak handles: the share
//! lives as long as a connection of its client holds it, and dead entries
//! are swept when the map has doubled since the last sweep, so the map is
//! bounded by the clients with a socket open.

use super::pool::{Gauge, MemoryPool};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};

/// A client, as the per-IP limiter keys it; `None`: a connection with no
/// peer address (served without `ConnectInfo`), all such sharing one key.
pub(crate) type ClientKey = Option<IpAddr>;

/// The sockets' pool and its clients' shares (see the module docs).
#[derive(Debug)]
pub(crate) struct SocketMemory {
    pool: Arc<MemoryPool>,
    per_client: usize,
    shares: Mutex<Shares>,
}

#[derive(Debug, Default)]
struct Shares {
    map: HashMap<ClientKey, Weak<MemoryPool>>,
    /// The map's size after the last sweep.
    swept: usize,
}

impl SocketMemory {
    /// `max` bytes for every socket, `per_client` for one client's.
    pub(crate) fn new(max: usize, per_client: usize) -> Self {
        Self {
            pool: Arc::new(MemoryPool::root(max, Gauge::Sockets)),
            per_client,
            shares: Mutex::default(),
        }
    }

    /// `client`'s share, the one its other connections hold if any.
    pub(crate) fn share(&self, client: ClientKey) -> Arc<MemoryPool> {
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(share) = shares.map.get(&client).and_then(Weak::upgrade) {
            return share;
        }
        let share = Arc::new(MemoryPool::share(self.pool.clone(), self.per_client));
        shares.map.insert(client, Arc::downgrade(&share));
        if shares.map.len() > 2 * shares.swept.max(16) {
            shares.map.retain(|_, share| share.strong_count() > 0);
            shares.swept = shares.map.len();
        }
        share
    }

    /// Bytes the sockets hold now.
    pub(crate) fn used(&self) -> usize {
        self.pool.used()
    }

    /// Clients with a share in the map (live or not yet swept).
    #[cfg(test)]
    fn clients(&self) -> usize {
        self.shares.lock().unwrap().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(n: u32) -> ClientKey {
        Some(IpAddr::from(std::net::Ipv4Addr::from(n)))
    }

    #[test]
    fn a_client_is_bounded_by_its_share_and_the_others_by_what_is_left() {
        let memory = SocketMemory::new(100, 40);
        let a = memory.share(client(1));
        let a_again = memory.share(client(1));
        assert!(Arc::ptr_eq(&a, &a_again), "one share per client");
        let _held = a.lease(40).unwrap();
        assert!(a_again.lease(1).is_none(), "its connections share it");
        let b = memory.share(client(2));
        let _b = b.lease(40).unwrap();
        let c = memory.share(client(3));
        assert!(c.lease(21).is_none(), "the pool has 20 left");
        assert!(c.lease(20).is_some());
        assert_eq!(memory.used(), 80, "a lease dropped at once gives back");
    }

    #[test]
    fn shares_no_connection_holds_are_swept() {
        let memory = SocketMemory::new(1 << 20, 1 << 10);
        let kept: Vec<_> = (0..10).map(|n| memory.share(client(n))).collect();
        for n in 10..10_000 {
            drop(memory.share(client(n)));
        }
        assert!(memory.clients() <= 64, "{} kept", memory.clients());
        for (n, share) in kept.iter().enumerate() {
            assert!(
                Arc::ptr_eq(share, &memory.share(client(n as u32))),
                "a live share survives the sweep"
            );
        }
    }
}
