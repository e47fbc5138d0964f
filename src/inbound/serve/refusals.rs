//! Each client's share of the connection table, and what a connection past
//! it costs.
//!
//! A client is keyed as the rate limiter keys clients (the address masked to
//! `rate_limit.ipv4_prefix` / `ipv6_prefix`); a peer in
//! `rate_limit.trusted_proxies` has no share (it carries everyone).
//! [`Clients::admit`] counts a connection in its client's share (served or
//! waiting for a slot; the served ones are listed, for
//! [`Clients::make_room_for`], which asks `idle.rs` which one to close), or
//! refuses it; [`Clients::refuse`] refuses one that found the table and its
//! waiting line full (`waiting.rs`) the same way. A refused client tends to
//! reconnect at once, as fast as it is refused (a buggy retry loop, or a
//! flood), so a refusal is made cheap and then slow:
//!
//! - **Cheap.** A refused connection is reset ([`reset`]: `SO_LINGER` 0,
//!   so no FIN handshake and no `TIME_WAIT` socket for a minute on this
//!   side) by the accept loop itself: no task, no allocation, no log line
//!   (the refusals of a client are logged at most once every 10 s, at
//!   `debug`, with their count; `fanout_connections_refused_total` counts
//!   them all), and it takes no permit of the table.
//! - **Slow.** A client refused again within [`PENALTY`] of its last
//!   refusal has the connection [`Held`] for [`HOLD`] before the reset
//!   (not read, not served; no permit). A client that reconnects when it
//!   sees its connection end — eight such addresses cost a gateway 14.7 s
//!   of CPU in 40 s — is thereby slowed to one refusal per held connection
//!   per [`HOLD`] (`gateway/tests/connection_churn.rs`: 128 refusals in 4 s
//!   instead of 58,195; BENCHMARKS.md). At most [`HELD_MAX`] connections are
//!   held, all clients together (file descriptors beyond
//!   `http.max_connections` and the waiting line); past that the oldest is
//!   reset at once, so a flood that does not wait costs an accept and a
//!   reset per connection — a connection cannot be refused without being
//!   accepted.
//!
//! The first refusal after a quiet [`PENALTY`] is reset at once: a client
//! that briefly went past its share learns so without waiting. The price of
//! holding: a client past its share that retries within 10 s (a browser
//! behind a busy NAT, say) learns of each refusal a second late.

use super::idle::{self, Conn};
use crate::inbound::identity::{ClientPrefix, TrustedProxies};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// A client refused again within this long of its last refusal has its
/// connection held.
pub(super) const PENALTY: Duration = Duration::from_secs(10);
/// How long a held connection waits for its reset.
pub(super) const HOLD: Duration = Duration::from_secs(1);
/// Connections held at most, all clients together.
pub(super) const HELD_MAX: usize = 256;
/// How often, at most, one client's refusals are logged.
const LOGGED_EVERY: Duration = Duration::from_secs(10);

/// Each client's share of the connection table.
pub(super) struct Clients {
    max: usize,
    prefix: ClientPrefix,
    proxies: TrustedProxies,
    /// The clients with a connection open or waiting for a slot.
    open: Mutex<HashMap<IpAddr, Share>>,
    /// What the connections' idle times count from.
    epoch: Instant,
    /// `fanout_connections_refused_total`, registered at the first refusal
    /// (after the application's recorder).
    refused: OnceLock<metrics::Counter>,
}

/// One client's connections.
#[derive(Default)]
struct Share {
    /// Its connections, served or waiting for a slot.
    open: usize,
    /// The served ones.
    conns: Vec<Arc<Conn>>,
    /// Its last refusal.
    refused_at: Option<Instant>,
    /// Refusals since the last log line about this client.
    refused: u64,
    /// When that line was written.
    logged: Option<Instant>,
}

/// What [`Clients::admit`] makes of a connection.
pub(super) enum Admission {
    /// Served, counted in its client's share while the slot lives.
    Admitted(ClientSlot),
    /// Past its client's share: to be reset now.
    Reset,
    /// Past its client's share again within [`PENALTY`]: to be held, then reset.
    Hold,
}

/// One client's connection, counted while it is open.
pub(super) struct ClientSlot {
    clients: Arc<Clients>,
    key: Option<IpAddr>,
    /// Once served.
    conn: Option<Arc<Conn>>,
}

impl Clients {
    /// Shares of `max` connections (at least 1) per client.
    pub(super) fn new(max: usize, prefix: ClientPrefix, proxies: TrustedProxies) -> Self {
        Self {
            max: max.max(1),
            prefix,
            proxies,
            open: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            refused: OnceLock::new(),
        }
    }

    /// The clients with a connection open or waiting (a poisoned lock is
    /// taken as is: every change under it is a count or a list kept whole).
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Share>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a connection from `peer`, unless its client has its share
    /// open.
    pub(super) fn admit(self: &Arc<Self>, peer: IpAddr) -> Admission {
        if self.proxies.contains(peer) {
            return Admission::Admitted(ClientSlot {
                clients: self.clone(),
                key: None,
                conn: None,
            });
        }
        let key = self.prefix.key(peer);
        let mut open = self.lock();
        // A client refused has its share open: its entry is there already.
        let share = open.entry(key).or_default();
        if share.open < self.max {
            share.open += 1;
            return Admission::Admitted(ClientSlot {
                clients: self.clone(),
                key: Some(key),
                conn: None,
            });
        }
        self.refuse_in(key, share)
    }

    /// Asks the longest-idle connection of the client holding the most to
    /// close, for `newcomer`'s connection (counted in its client's share),
    /// if that client holds more than the newcomer's; whether one was asked
    /// (`idle.rs`). A trusted proxy (`None`) carries everyone: it waits.
    pub(super) fn make_room_for(&self, newcomer: Option<IpAddr>) -> bool {
        let Some(newcomer) = newcomer else {
            return false;
        };
        let open = self.lock();
        let Some(mine) = open.get(&newcomer).map(|share| share.open) else {
            return false;
        };
        let shares = open
            .values()
            .map(|share| (share.open, share.conns.as_slice()));
        match idle::longest_idle_of_the_most(mine, shares) {
            Some(conn) => {
                conn.evict();
                true
            }
            None => false,
        }
    }

    /// Refuses `slot`'s connection, admitted but finding the table and its
    /// waiting line full: as a connection past its client's share, held if
    /// the client was refused within [`PENALTY`] and still has a connection
    /// open (a client holding nothing is not kept in the table).
    pub(super) fn refuse(&self, slot: ClientSlot) -> Admission {
        let key = slot.key;
        drop(slot);
        let Some(key) = key else {
            self.count_refusal();
            return Admission::Reset;
        };
        let mut open = self.lock();
        match open.get_mut(&key) {
            Some(share) => self.refuse_in(key, share),
            None => {
                drop(open);
                self.count_refusal();
                Admission::Reset
            }
        }
    }

    /// Refuses a connection of `key`, whose entry is `share` (the table's
    /// lock held): reset now, or held if refused within [`PENALTY`].
    fn refuse_in(&self, key: IpAddr, share: &mut Share) -> Admission {
        let now = Instant::now();
        let again = share
            .refused_at
            .is_some_and(|at| now.duration_since(at) < PENALTY);
        share.refused_at = Some(now);
        share.refused += 1;
        if share
            .logged
            .is_none_or(|at| now.duration_since(at) >= LOGGED_EVERY)
        {
            tracing::debug!(client = %key, refused = share.refused, "connections refused: the client has its share open");
            (share.refused, share.logged) = (0, Some(now));
        }
        self.count_refusal();
        if again {
            Admission::Hold
        } else {
            Admission::Reset
        }
    }

    fn count_refusal(&self) {
        self.refused
            .get_or_init(crate::metrics::connections_refused)
            .increment(1);
    }
}

impl ClientSlot {
    /// Its client's key; `None` for a trusted proxy.
    pub(super) fn key(&self) -> Option<IpAddr> {
        self.key
    }

    /// Whether its client holds no other connection (a trusted proxy
    /// always does).
    pub(super) fn alone(&self) -> bool {
        let Some(key) = self.key else { return false };
        self.clients
            .lock()
            .get(&key)
            .is_some_and(|share| share.open == 1)
    }

    /// The connection is served from now: listed in its client's entry
    /// (idle), where [`Clients::make_room_for`] may find it.
    pub(super) fn serve(&mut self) -> Arc<Conn> {
        let conn = Conn::new(self.clients.epoch);
        if let Some(key) = self.key {
            if let Some(share) = self.clients.lock().get_mut(&key) {
                share.conns.push(conn.clone());
            }
        }
        self.conn = Some(conn.clone());
        conn
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let Some(key) = self.key else { return };
        let mut open = self.clients.lock();
        if let Some(share) = open.get_mut(&key) {
            if let Some(conn) = &self.conn {
                share.conns.retain(|c| !Arc::ptr_eq(c, conn));
            }
            share.open -= 1;
            if share.open == 0 {
                open.remove(&key);
            }
        }
    }
}

/// Refused connections waiting for their reset, oldest first: at most
/// [`HELD_MAX`], each for [`HOLD`]. Dropped, it resets them all.
pub(super) struct Held {
    queue: VecDeque<(Instant, TcpStream)>,
    /// Armed for the oldest one's reset while any is held.
    timer: Pin<Box<Sleep>>,
}

impl Held {
    /// Nothing held (allocated once, here; needs tokio's timer).
    pub(super) fn new() -> Self {
        Self {
            queue: VecDeque::with_capacity(HELD_MAX),
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }
    }

    /// Holds `stream` for [`HOLD`]; when [`HELD_MAX`] are held, the oldest
    /// is reset now.
    pub(super) fn hold(&mut self, stream: TcpStream) {
        if self.queue.len() >= HELD_MAX {
            if let Some((_, oldest)) = self.queue.pop_front() {
                reset(oldest);
            }
        }
        let until = Instant::now() + HOLD;
        if self.queue.is_empty() {
            self.timer.as_mut().reset(until);
        }
        self.queue.push_back((until, stream));
    }

    /// Completes after resetting the connections whose time is up; pending
    /// while none is held. Cancel-safe.
    pub(super) async fn release(&mut self) {
        if self.queue.is_empty() {
            return std::future::pending().await;
        }
        self.timer.as_mut().await;
        let now = Instant::now();
        while let Some(&(until, _)) = self.queue.front() {
            if until > now {
                self.timer.as_mut().reset(until);
                break;
            }
            if let Some((_, stream)) = self.queue.pop_front() {
                reset(stream);
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        for (_, stream) in self.queue.drain(..) {
            reset(stream);
        }
    }
}

/// Closes `stream` with a reset (`SO_LINGER` 0): no FIN handshake, and no
/// `TIME_WAIT` socket left on this side.
pub(super) fn reset(stream: TcpStream) {
    // Failing, it is an ordinary close.
    let _ = stream.set_zero_linger();
}
