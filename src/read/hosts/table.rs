//! The host table: what the read path keeps per host — a label, its metric
//! handles, its table's switches — fixed when the engine is built (see the
//! module docs of `hosts.rs`), and how a URL's host is named.

use crate::config::HostConfig;
use crate::metrics::HostMetrics;
use crate::seed::random_state;
use foldhash::fast::SeedableRandomState;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

/// The label every host without an entry of its own shares on the metrics.
pub const OTHER_HOSTS: &str = "other";

/// What the read path keeps about a host with an entry of its own, or
/// about all the other hosts together.
pub(super) struct HostState {
    /// The `host` label: for a host with an entry of its own, its name.
    pub(super) label: Arc<str>,
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
    pub(super) state: Arc<HostState>,
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
    pub(super) fn own(&self) -> usize {
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
pub(super) const NAME_ON_STACK: usize = 128;

/// [`host_name`] written into `buffer`; `None` when it does not fit.
pub(super) fn host_name_in<'b>(
    url: &reqwest::Url,
    buffer: &'b mut [u8; NAME_ON_STACK],
) -> Option<&'b str> {
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
