//! Per-host concurrency caps: a process-wide bouncer at the one outbound choke point.
//!
//! Every upstream read holds a [`HostSlot`] for its host (`host:port`) while
//! it is in flight. The slots come from a [`HostLimiter`], owned by the
//! long-lived [`Engine`](crate::Engine), never by a request, so the cap bounds
//! the whole process's demand on a host.
//!
//! The in-process limiter, [`LocalHostCaps`], gives each configured host a
//! `tokio::sync::Semaphore` of `max_concurrent` permits (its reads in flight
//! are the permits taken) and counts the reads in flight of every other host:
//!
//! - a host with no `[hosts]` table is unlimited (its slot only counts);
//! - `max_concurrent = 0` refuses every read at once;
//! - at the cap a read waits up to `acquire_wait_ms`, never past the
//!   request's deadline, then fails with `HOST_SATURATED`.
//!
//! A slot is released when it is dropped — on success, error, timeout, or when
//! the inbound request is cancelled and its futures are dropped — so a slot
//! cannot leak; a wait for one that is dropped (a read that joined another
//! request's read instead, a cancelled request) leaves the semaphore's queue,
//! and a permit granted to it meanwhile goes back. The trait is the seam a
//! shared backend (Redis) plugs into.
//!
//! **Bounded by configuration, not by traffic.** The hosts a process reads
//! from are chosen by its upstreams (a redirect may name any host) and by its
//! resolvers (`permit` names), so nothing is kept per host merely because it
//! was read. The semaphores are made at start, one per `[hosts]` table; an
//! unlimited host is counted under its name only while it has a read in
//! flight. The engine's [`HostTable`] — what the read path needs besides the
//! slot: the host's metric handles and whether its table turns coalescing on
//! (`coalesce`) — is fixed when the engine is built: one entry per `[hosts]`
//! table and per known host
//! ([`EngineBuilder::known_host`](crate::EngineBuilder::known_host); the
//! gateway names its `--upstream`), each with its own `host` label, and one
//! entry every other host shares, labelled [`OTHER_HOSTS`] (`host="other"`).
//! Only the stored state and the labels are shared: a read still carries its
//! host's real name to the limiter, the transport and its errors
//! (`UPSTREAM_TIMEOUT {host}`).

use crate::config::HostConfig;
use crate::error::HostRefusal;
use crate::metrics::HostMetrics;
use crate::seed::random_state;
use dashmap::{DashMap, Entry};
use foldhash::fast::SeedableRandomState;
use futures::future::BoxFuture;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Hands out per-host slots. Implementations must release a slot when the
/// returned [`HostSlot`] is dropped, and when the future [`acquire`]
/// returned is dropped before it is ready, give up the caller's place in
/// any queue and any slot already set aside for it: a read that stops
/// waiting (it joined an identical read another request sent, or its
/// request was cancelled) drops that future, and a slot kept for it would
/// sit idle while other reads are refused.
///
/// [`acquire`]: HostLimiter::acquire
///
/// ```
/// use fanout_budget::{error::HostRefusal, read::{HostLimiter, HostSlot, LocalHostCaps}};
/// use futures::future::BoxFuture;
/// use std::time::Duration;
///
/// /// The local caps, and a log line per slot.
/// #[derive(Debug)]
/// struct Logged(LocalHostCaps);
///
/// impl HostLimiter for Logged {
///     fn acquire<'a>(&'a self, host: &'a str, time_left: Duration) -> BoxFuture<'a, Result<HostSlot, HostRefusal>> {
///         Box::pin(async move {
///             let slot = self.0.acquire(host, time_left).await?;
///             tracing::debug!(host, "slot taken");
///             Ok(slot)
///         })
///     }
///
///     fn in_flight(&self, host: &str) -> u64 {
///         self.0.in_flight(host)
///     }
/// }
/// ```
pub trait HostLimiter: Send + Sync + 'static {
    /// A slot for one read to `host`, waiting at most `time_left` (the
    /// request's remaining time) and at most the host's own wait.
    fn acquire<'a>(
        &'a self,
        host: &'a str,
        time_left: Duration,
    ) -> BoxFuture<'a, Result<HostSlot, HostRefusal>>;

    /// Reads in flight to `host` through this limiter, right now.
    fn in_flight(&self, host: &str) -> u64;

    /// The answer to [`acquire`](Self::acquire) when it needs no wait: a
    /// slot free now, or a refusal now; `None` when the caller must wait in
    /// `acquire` (the default: always). The read path asks this first, so a
    /// read that gets its slot at once does not box a future for it.
    fn try_acquire(&self, host: &str) -> Option<Result<HostSlot, HostRefusal>> {
        let _ = host;
        None
    }
}

/// Permission for one read to be in flight to one host; dropping it releases it.
///
/// ```
/// use fanout_budget::read::HostSlot;
/// use std::sync::Arc;
///
/// let semaphore = Arc::new(tokio::sync::Semaphore::new(1));
/// let slot = HostSlot::new(semaphore.clone().try_acquire_owned().unwrap());
/// assert_eq!(semaphore.available_permits(), 0);
/// drop(slot);
/// assert_eq!(semaphore.available_permits(), 1);
/// ```
#[must_use = "the slot is released as soon as it is dropped"]
pub struct HostSlot {
    _held: Held,
}

/// What a slot releases when dropped. The in-process caps' own slots are
/// kept as they are; anything else is boxed.
#[allow(dead_code)] // Each is held only to be dropped.
enum Held {
    Permit(OwnedSemaphorePermit),
    Counted(Counted),
    Other(Box<dyn Send + Sync>),
}

impl HostSlot {
    /// A slot that releases `held` (a permit, a lease, a guard) when dropped.
    pub fn new(held: impl Send + Sync + 'static) -> Self {
        Self {
            _held: Held::Other(Box::new(held)),
        }
    }

    fn permit(permit: OwnedSemaphorePermit) -> Self {
        Self {
            _held: Held::Permit(permit),
        }
    }

    /// One slot holding both (e.g. a local permit and a cluster lease),
    /// released together, first this one.
    pub fn join(self, other: HostSlot) -> Self {
        Self::new((self, other))
    }
}

impl std::fmt::Debug for HostSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostSlot")
    }
}

/// One configured host's in-process cap: `max_concurrent` permits.
#[derive(Debug)]
struct HostCap {
    permits: Arc<Semaphore>,
    config: HostConfig,
}

impl HostCap {
    fn new(config: &HostConfig) -> Self {
        let permits = (config.max_concurrent as usize).min(Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(permits)),
            config: config.clone(),
        }
    }

    fn in_flight(&self) -> u64 {
        u64::from(self.config.max_concurrent)
            .saturating_sub(self.permits.available_permits() as u64)
    }

    fn saturated(&self) -> HostRefusal {
        HostRefusal::Saturated {
            max_concurrent: self.config.max_concurrent,
        }
    }

    /// A slot free now, or the refusal of a zero cap; `None`: at the cap.
    fn try_acquire(&self) -> Option<Result<HostSlot, HostRefusal>> {
        if self.config.max_concurrent == 0 {
            return Some(Err(self.saturated()));
        }
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        Some(Ok(HostSlot::permit(permit)))
    }

    /// A slot, waiting at most the host's `acquire_wait` and at most
    /// `time_left`.
    async fn acquire(&self, time_left: Duration) -> Result<HostSlot, HostRefusal> {
        if let Some(now) = self.try_acquire() {
            return now;
        }
        let wait = self.config.acquire_wait().min(time_left);
        match tokio::time::timeout(wait, self.permits.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(HostSlot::permit(permit)),
            _ => Err(self.saturated()),
        }
    }
}

/// Reads in flight to the hosts without a `[hosts]` table, by host: an entry
/// exists only while its host has a read in flight.
type Counts = DashMap<Arc<str>, u64, SeedableRandomState>;

/// A slot of a host without a table: counted while held; the host's entry
/// leaves the counts with its last slot.
struct Counted {
    counts: Arc<Counts>,
    host: Arc<str>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Entry::Occupied(mut count) = self.counts.entry(self.host.clone()) {
            *count.get_mut() -= 1;
            if *count.get() == 0 {
                count.remove();
            }
        }
    }
}

/// The in-process, per-host caps.
///
/// A host with a `[hosts]` table has its semaphore, made once at start.
/// Every other host is unlimited: its reads in flight are counted under its
/// name while it has any, and nothing of it is kept after its last one ends,
/// so a stream of distinct hosts (redirect targets, permit names) keeps no
/// state beyond the reads in flight.
///
/// ```
/// use fanout_budget::config::HostConfig;
/// use fanout_budget::read::{HostLimiter, LocalHostCaps};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let one = HostConfig::default().max_concurrent(1).acquire_wait_ms(10);
/// let caps = LocalHostCaps::new([("registry:5000".to_string(), one)].into());
/// let slot = caps.acquire("registry:5000", Duration::from_secs(1)).await.unwrap();
/// assert!(caps.acquire("registry:5000", Duration::from_secs(1)).await.is_err(), "at the cap");
/// drop(slot);
/// assert_eq!(caps.in_flight("registry:5000"), 0);
/// # }
/// ```
#[derive(Debug)]
pub struct LocalHostCaps {
    /// One per `[hosts]` table, fixed at start.
    capped: HashMap<String, HostCap, SeedableRandomState>,
    /// The other hosts' reads in flight.
    counts: Arc<Counts>,
}

impl LocalHostCaps {
    /// Caps for the `[hosts]` tables; every other host is unlimited.
    pub fn new(hosts: BTreeMap<String, HostConfig>) -> Self {
        let mut capped = HashMap::with_capacity_and_hasher(hosts.len(), random_state());
        capped.extend(
            hosts
                .iter()
                .map(|(host, config)| (host.clone(), HostCap::new(config))),
        );
        Self {
            capped,
            counts: Arc::new(DashMap::with_hasher(random_state())),
        }
    }

    /// A counted slot of `host`, which has no table.
    fn count(&self, host: &str) -> HostSlot {
        let host = match self.counts.get_mut(host) {
            Some(mut count) => {
                *count += 1;
                count.key().clone()
            }
            None => {
                let mut count = self.counts.entry(host.into()).or_insert(0);
                *count += 1;
                count.key().clone()
            }
        };
        HostSlot {
            _held: Held::Counted(Counted {
                counts: self.counts.clone(),
                host,
            }),
        }
    }
}

impl HostLimiter for LocalHostCaps {
    fn acquire<'a>(
        &'a self,
        host: &'a str,
        time_left: Duration,
    ) -> BoxFuture<'a, Result<HostSlot, HostRefusal>> {
        Box::pin(async move {
            match self.capped.get(host) {
                Some(cap) => cap.acquire(time_left).await,
                None => Ok(self.count(host)),
            }
        })
    }

    fn in_flight(&self, host: &str) -> u64 {
        match self.capped.get(host) {
            Some(cap) => cap.in_flight(),
            None => self.counts.get(host).map_or(0, |count| *count),
        }
    }

    /// Every answer but a wait at a host's cap comes at once.
    fn try_acquire(&self, host: &str) -> Option<Result<HostSlot, HostRefusal>> {
        match self.capped.get(host) {
            Some(cap) => cap.try_acquire(),
            None => Some(Ok(self.count(host))),
        }
    }
}

/// The label every host without an entry of its own shares on the metrics.
pub const OTHER_HOSTS: &str = "other";

/// What the read path keeps about a host with an entry of its own, or
/// about all the other hosts together.
struct HostState {
    /// The `host` label: for a host with an entry of its own, its name.
    label: Arc<str>,
    /// The metric handles, registered on the first read (so after the
    /// application installed its recorder).
    metrics: OnceLock<HostMetrics>,
    /// Its `[hosts]` table says `coalesce = true`.
    coalesce: bool,
    /// Its `[hosts]` table says `cache_control = true`.
    cache_control: bool,
    /// Its `[hosts]` table, or an `[upstreams]` table of it, says
    /// `propagate = true` (`propagate.rs`).
    propagate: bool,
}

impl HostState {
    fn new(label: &str, config: &HostConfig, propagate: bool) -> Arc<Self> {
        Arc::new(Self {
            label: label.into(),
            metrics: OnceLock::new(),
            coalesce: config.coalesce,
            cache_control: config.cache_control,
            propagate: propagate || config.propagate,
        })
    }
}

/// A host's label and its metric handles ([`HostEntry::label`]).
#[derive(Clone)]
pub(crate) struct HostLabel(Arc<HostState>);

impl HostLabel {
    /// The metric handles of the label.
    pub(crate) fn metrics(&self) -> &HostMetrics {
        metrics_of(&self.0)
    }
}

/// The metric handles of `state`'s label, registered on first use.
fn metrics_of(state: &HostState) -> &HostMetrics {
    state.metrics.get_or_init(|| HostMetrics::new(&state.label))
}

/// One read's host: its real name, and the state it shares — its own when
/// the host has an entry of its own, else that of every other host.
#[derive(Clone)]
pub(crate) struct HostEntry {
    /// `host:port` (as the URL names it; just `host` without a known port):
    /// what the host limiter, the transport and error messages see. A host
    /// with an entry of its own shares the entry's (nothing is allocated
    /// per read).
    pub(crate) name: Arc<str>,
    state: Arc<HostState>,
}

impl HostEntry {
    /// The metric handles of the host's label.
    pub(crate) fn metrics(&self) -> &HostMetrics {
        metrics_of(&self.state)
    }

    /// The host's label alone, without its name: what a cache entry keeps
    /// to count its hits (one pointer, shared with the table's entry).
    pub(crate) fn label(&self) -> HostLabel {
        HostLabel(self.state.clone())
    }

    /// Its `[hosts]` table says `coalesce = true`.
    pub(crate) fn coalesce(&self) -> bool {
        self.state.coalesce
    }

    /// Its reads carry the request's budget (`propagate.rs`): its
    /// `[hosts]` table, or an `[upstreams]` table of it, says
    /// `propagate = true`. Never a host without a table of its own.
    pub(crate) fn propagates(&self) -> bool {
        self.state.propagate
    }
}

/// The hosts with an entry of their own — one per `[hosts]` table and per
/// known host ([`EngineBuilder::known_host`](crate::EngineBuilder::known_host)),
/// fixed when the engine is built — and one entry every other host shares
/// (label [`OTHER_HOSTS`]). Looking a host up never adds anything.
pub(crate) struct HostTable {
    own: HashMap<Box<str>, Arc<HostState>, SeedableRandomState>,
    other: Arc<HostState>,
    /// Some host's table says `cache_control = true`.
    any_cache_control: bool,
}

impl HostTable {
    /// The table for the `[hosts]` tables `hosts` and the `known` hosts,
    /// of which those `propagating` carry the request's budget.
    pub(crate) fn new<'k>(
        hosts: &BTreeMap<String, HostConfig>,
        known: impl IntoIterator<Item = &'k str>,
        propagating: &[String],
    ) -> Self {
        let mut own = HashMap::with_hasher(random_state());
        let unlisted = HostConfig::default();
        let propagates = |name: &str| propagating.iter().any(|p| p == name);
        for name in known {
            own.insert(
                name.into(),
                HostState::new(name, &unlisted, propagates(name)),
            );
        }
        for (name, config) in hosts {
            let state = HostState::new(name, config, propagates(name));
            own.insert(name.as_str().into(), state);
        }
        Self {
            own,
            other: HostState::new(OTHER_HOSTS, &unlisted, false),
            any_cache_control: hosts.values().any(|h| h.cache_control),
        }
    }

    /// Whether answers from `url`'s host are kept as their `Cache-Control`
    /// says (its table's `cache_control`); free when no table says so.
    pub(crate) fn cache_control(&self, url: &reqwest::Url) -> bool {
        self.any_cache_control && self.resolve(url).state.cache_control
    }

    /// The entry for `url`'s host. Its name is written on the stack to be
    /// looked up; only a host without an entry of its own allocates it.
    pub(crate) fn resolve(&self, url: &reqwest::Url) -> HostEntry {
        let mut buffer = [0; NAME_ON_STACK];
        match host_name_in(url, &mut buffer) {
            Some(name) => self.find(name),
            None => self.find(&host_name(url)),
        }
    }

    /// The entry for host `name` (`host:port`).
    pub(crate) fn entry(&self, name: String) -> HostEntry {
        self.find(&name)
    }

    fn find(&self, name: &str) -> HostEntry {
        match self.own.get(name) {
            Some(state) => HostEntry {
                name: state.label.clone(),
                state: state.clone(),
            },
            None => HostEntry {
                name: name.into(),
                state: self.other.clone(),
            },
        }
    }

    /// The hosts with an entry of their own.
    #[cfg(test)]
    fn own(&self) -> usize {
        self.own.len()
    }
}

/// `host:port`, or `host` without a known port: what the `[hosts]` tables,
/// [`EngineBuilder::known_host`](crate::EngineBuilder::known_host), error
/// messages (`extensions.host`) and the metrics' `host` label call a URL's
/// host.
///
/// ```
/// let url = "https://Registry.Example/v2/".parse().unwrap();
/// assert_eq!(fanout_budget::read::host_name(&url), "registry.example:443");
/// let url = "http://[::1]:5000/v2/".parse().unwrap();
/// assert_eq!(fanout_budget::read::host_name(&url), "[::1]:5000");
/// ```
pub fn host_name(url: &reqwest::Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port_or_known_default() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    }
}

/// The longest [`host_name`] the read path writes on the stack.
const NAME_ON_STACK: usize = 128;

/// [`host_name`] written into `buffer`; `None` when it does not fit.
fn host_name_in<'b>(url: &reqwest::Url, buffer: &'b mut [u8; NAME_ON_STACK]) -> Option<&'b str> {
    let host = url.host_str().unwrap_or("").as_bytes();
    let mut len = host.len();
    buffer.get_mut(..len)?.copy_from_slice(host);
    if let Some(mut port) = url.port_or_known_default() {
        // `:` and the port's digits, written from the last one.
        let mut digits = [0; 6];
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (port % 10) as u8;
            port /= 10;
            if port == 0 {
                break;
            }
        }
        start -= 1;
        digits[start] = b':';
        let suffix = &digits[start..];
        buffer
            .get_mut(len..len + suffix.len())?
            .copy_from_slice(suffix);
        len += suffix.len();
    }
    std::str::from_utf8(&buffer[..len]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> reqwest::Url {
        reqwest::Url::parse(s).unwrap()
    }

    #[test]
    fn hosts_are_named_as_the_hosts_tables_name_them() {
        let table = HostTable::new(&BTreeMap::new(), [], &[]);
        let name = |s: &str| table.resolve(&url(s)).name.to_string();
        assert_eq!(name("http://reg.example:5000/v2/a"), "reg.example:5000");
        // The scheme's default port is the port; an explicit default is the same host.
        assert_eq!(name("https://reg.example/v2/"), "reg.example:443");
        assert_eq!(name("http://reg.example:443/v2/"), "reg.example:443");
        assert_eq!(name("http://[::1]:8080/"), "[::1]:8080");
        // Written on the stack as `host_name` formats it, whatever the port
        // or the length; a host past the buffer is formatted on the heap.
        let long = format!("http://{}.example:9/", "a".repeat(NAME_ON_STACK));
        for s in [
            "http://h:0/",
            "http://h:1/",
            "http://h:10/",
            "http://h:65535/",
            "ftp://files.example/",
            "foo://no-known-port.example/",
            "http://127.0.0.1/",
            &long,
        ] {
            assert_eq!(name(s), host_name(&url(s)), "{s}");
        }
        assert!(host_name_in(&url(&long), &mut [0; NAME_ON_STACK]).is_none());
    }

    /// A host with a `[hosts]` table or known has its own entry; 50,000
    /// other hosts add nothing and share one, each read keeping its name.
    #[test]
    fn only_configured_and_known_hosts_have_an_entry_of_their_own() {
        let coalescing = HostConfig {
            coalesce: true,
            ..Default::default()
        };
        let hosts = [("reg.example:5000".to_string(), coalescing)].into();
        let table = HostTable::new(&hosts, ["cdn.example:443"], &[]);
        let reg = table.resolve(&url("http://reg.example:5000/v2/a"));
        let reg_again = table.resolve(&url("http://reg.example:5000/v2/b?x=1"));
        assert!(Arc::ptr_eq(&reg.state, &reg_again.state));
        assert!(
            Arc::ptr_eq(&reg.name, &reg_again.name),
            "the entry's name, shared"
        );
        assert_eq!(&*reg.state.label, "reg.example:5000");
        assert!(reg.coalesce());
        let cdn = table.resolve(&url("https://cdn.example/blob"));
        assert_eq!(&*cdn.state.label, "cdn.example:443");
        assert!(!cdn.coalesce());
        let first = table.resolve(&url("http://h0.example/"));
        for i in 0..50_000 {
            let other = table.resolve(&url(&format!("http://h{i}.example:{}/", i % 65_536)));
            assert_eq!(*other.name, format!("h{i}.example:{}", i % 65_536));
            assert!(Arc::ptr_eq(&other.state, &first.state));
            let permit = table.entry(format!("db-{i}:5432"));
            assert!(Arc::ptr_eq(&permit.state, &first.state));
        }
        assert_eq!(&*first.state.label, OTHER_HOSTS);
        assert!(!first.coalesce());
        assert_eq!(table.own(), 2);
    }

    /// Hosts without a table are counted by name while they have reads in
    /// flight, and forgotten with their last one.
    #[tokio::test]
    async fn an_unlimited_host_is_kept_only_while_it_has_reads_in_flight() {
        let caps = LocalHostCaps::new(BTreeMap::new());
        let left = Duration::from_secs(5);
        for i in 0..50_000 {
            let host = format!("h{i}.example:80");
            let slot = caps.acquire(&host, left).await.unwrap();
            assert_eq!(caps.in_flight(&host), 1);
            drop(slot);
        }
        assert_eq!(caps.counts.len(), 0, "hosts kept after their reads");
        let a = caps.acquire("a:1", left).await.unwrap();
        let b = caps.acquire("a:1", left).await.unwrap();
        let c = caps.acquire("b:1", left).await.unwrap();
        assert_eq!((caps.in_flight("a:1"), caps.in_flight("b:1")), (2, 1));
        assert_eq!(caps.counts.len(), 2);
        drop(a);
        assert_eq!(caps.in_flight("a:1"), 1);
        drop((b, c));
        assert_eq!(caps.counts.len(), 0);
    }

    #[tokio::test]
    async fn a_slot_comes_back_on_drop_and_a_zero_cap_refuses_at_once() {
        let one = HostConfig {
            max_concurrent: 1,
            acquire_wait_ms: 10,
            ..Default::default()
        };
        let zero = HostConfig {
            max_concurrent: 0,
            acquire_wait_ms: 10_000,
            ..Default::default()
        };
        let caps = LocalHostCaps::new([("a:1".to_string(), one), ("z:1".to_string(), zero)].into());
        let left = Duration::from_secs(5);
        let slot = caps.acquire("a:1", left).await.unwrap();
        assert_eq!(caps.in_flight("a:1"), 1);
        let refused = caps.acquire("a:1", left).await.unwrap_err();
        assert_eq!(refused, HostRefusal::Saturated { max_concurrent: 1 });
        assert_eq!(caps.in_flight("a:1"), 1, "a refusal gives nothing back");
        drop(slot);
        assert_eq!(caps.in_flight("a:1"), 0);
        let started = tokio::time::Instant::now();
        assert!(caps.acquire("z:1", left).await.is_err());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no wait at cap 0"
        );
        let unlimited: Vec<_> =
            futures::future::join_all((0..3).map(|_| caps.acquire("u:1", left))).await;
        assert_eq!(caps.in_flight("u:1"), 3);
        drop(unlimited);
        assert_eq!(caps.in_flight("u:1"), 0);
    }
}
