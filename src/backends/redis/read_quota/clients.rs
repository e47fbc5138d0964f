//! The clients one replica knows, per class: each client's stock behind
//! its lock, what it owes back, the reservations waiting for its call; a
//! class's map of them, swept of the idle, and the owing list the flusher
//! works through ([the module](super) says how it works).

use super::stock::{Now, Stock};
use crate::inbound::limiter::SWEEP_EVERY;
use crate::inbound::quota::Rate;
use crate::seed::random_state;
use dashmap::DashMap;
use foldhash::fast::SeedableRandomState;
use std::net::IpAddr;
use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{AcqRel, Relaxed, Release},
};
use std::sync::Arc;
use tokio::time::Instant;

/// One client as this replica knows it.
#[derive(Debug)]
pub(super) struct Client {
    /// Reads requests gave back, or a dropped reservation's call took, not
    /// yet in the stock (`refund` does not wait for the stock's lock).
    pub(super) refunded: AtomicU64,
    /// Reads of the reservations waiting for the stock's lock: demand too.
    pub(super) queued: AtomicU64,
    /// In its class's [`Owing`] list (once, however many reads it owes).
    pub(super) owes: AtomicBool,
    /// When its bucket is full again as Redis last answered (ns on the
    /// store's clock; 0: no answer yet), read without the stock's lock by
    /// a fallback while a call is in flight.
    pub(super) fleet_full_at: AtomicU64,
    pub(super) stock: tokio::sync::Mutex<Stock>,
}

impl Client {
    pub(super) fn new(now: Instant) -> Self {
        Self {
            refunded: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            owes: AtomicBool::new(false),
            fleet_full_at: AtomicU64::new(0),
            stock: tokio::sync::Mutex::new(Stock::new(now)),
        }
    }
}

/// The clients of a class that may hold reads to give back — refunds, or
/// stock a call took — each listed once while its `owes` is set: what the
/// flusher looks at, so its work is what is owed, not every client kept.
#[derive(Debug, Default)]
pub(super) struct Owing(std::sync::Mutex<Vec<IpAddr>>);

impl Owing {
    /// Lists `client` (`ip`), unless it is listed already.
    pub(super) fn add(&self, ip: IpAddr, client: &Client) {
        if !client.owes.swap(true, AcqRel) {
            self.list().push(ip);
        }
    }

    pub(super) fn list(&self) -> std::sync::MutexGuard<'_, Vec<IpAddr>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A reservation's reads counted in [`Client::queued`] while it waits for
/// the stock's lock (dropped waiting, too).
pub(super) struct Queued<'a> {
    pub(super) client: &'a Client,
    pub(super) reads: u64,
}

impl<'a> Queued<'a> {
    pub(super) fn new(client: &'a Client, reads: u64) -> Self {
        client.queued.fetch_add(reads, Relaxed);
        Self { client, reads }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.client.queued.fetch_sub(self.reads, Relaxed);
    }
}

/// Reads a call took for a client, to be put in its stock: by the
/// reservation waiting for the call, or, if it was dropped meanwhile, by
/// this on drop.
pub(super) struct Held {
    pub(super) client: Arc<Client>,
    pub(super) ip: IpAddr,
    pub(super) owing: Arc<Owing>,
    pub(super) reads: u64,
}

impl Held {
    pub(super) fn claim(&mut self) -> u64 {
        std::mem::take(&mut self.reads)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.reads > 0 {
            self.client.refunded.fetch_add(self.reads, Relaxed);
            self.owing.add(self.ip, &self.client);
        }
    }
}

/// One class's quota and the clients this replica knows.
pub(super) struct Class {
    pub(super) rate: Rate,
    pub(super) clients: DashMap<IpAddr, Arc<Client>, SeedableRandomState>,
    pub(super) owing: Arc<Owing>,
    pub(super) reserves: AtomicU64,
    /// The reservation count at which the next sweep runs.
    pub(super) next_sweep: AtomicU64,
}

impl Class {
    pub(super) fn new(rate: Rate) -> Self {
        Self {
            rate,
            clients: DashMap::with_hasher(random_state()),
            owing: Arc::default(),
            reserves: AtomicU64::new(0),
            next_sweep: AtomicU64::new(SWEEP_EVERY),
        }
    }

    /// Counts a reservation; every `max(SWEEP_EVERY, 2 × clients kept)`,
    /// sweeps, and returns the swept clients' reads to give back.
    pub(super) fn count(&self, now: Instant) -> Vec<(IpAddr, u64)> {
        let n = self.reserves.fetch_add(1, Relaxed);
        let mark = self.next_sweep.load(Relaxed);
        // The one reservation that takes the mark (to the end, meanwhile) sweeps.
        if n < mark
            || (self.next_sweep)
                .compare_exchange(mark, u64::MAX, Relaxed, Relaxed)
                .is_err()
        {
            return Vec::new();
        }
        let back = self.sweep(now);
        let kept = 2 * self.clients.len() as u64;
        self.next_sweep.store(n + SWEEP_EVERY.max(kept), Relaxed);
        back
    }

    /// Takes, from the owing clients (`due`, taken from [`Owing`]) that no
    /// call has served for a [`HOLD`](stock::HOLD) (their stock is stale),
    /// the reads they hold to give back — requests' refunds, stale stock —
    /// so they go back on Redis now rather than with a next call that may
    /// never come here (the client went to another replica). The clients
    /// still fresh, or with a call in flight, are listed again.
    pub(super) fn stale(&self, now: Now, due: &[IpAddr]) -> Vec<(IpAddr, u64)> {
        let (mut back, mut again) = (Vec::new(), Vec::new());
        for ip in due {
            let Some(entry) = self.clients.get(ip).map(|e| e.clone()) else {
                continue; // swept: its reads went back then
            };
            let Ok(mut stock) = entry.stock.try_lock() else {
                again.push(*ip); // a call in flight
                continue;
            };
            if now.at < stock.until {
                again.push(*ip);
                continue;
            }
            // Unlisted before the reads are taken: a refund from now on
            // lists it again.
            entry.owes.store(false, Release);
            let reads = stock.left + stock.given + entry.refunded.swap(0, AcqRel);
            if reads > 0 {
                (stock.left, stock.given) = (0, 0);
                stock.full_at = self.rate.give_back(stock.full_at, now.ns, reads);
                back.push((*ip, reads));
            }
        }
        self.owing.list().extend(again);
        back
    }

    /// Forgets the idle clients no one holds; their reads to give back.
    pub(super) fn sweep(&self, now: Instant) -> Vec<(IpAddr, u64)> {
        let mut back = Vec::new();
        self.clients.retain(|ip, client| {
            // A reservation or a call holds it (a refund holds the map's
            // shard, which `retain` holds too).
            if Arc::strong_count(client) > 1 {
                return true;
            }
            let Ok(stock) = client.stock.try_lock() else {
                return true;
            };
            if !stock.idle(now) {
                return true;
            }
            let reads = stock.left + stock.given + client.refunded.load(Relaxed);
            if reads > 0 {
                back.push((*ip, reads));
            }
            false
        });
        self.clients.shrink_to_fit();
        back
    }
}
