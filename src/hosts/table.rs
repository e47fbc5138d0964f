//! The engine's table of upstream hosts: each host resolved once.
//!
//! A read's host is its URL's `(host, port)`. The first read to a host builds
//! its [`HostEntry`] — the `host:port` name, the metric handles, and the
//! limiter's [`HostCap`] when it has one — and every later read finds it with
//! one lookup keyed by the URL's own `host_str()` and port: no `format!`, no
//! allocation, one hash.

use super::{HostCap, HostLimiter};
use crate::hash::KeyedHashBuilder;
use crate::metrics::HostMetrics;
use dashmap::DashMap;
use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Everything the read path needs about one host, built once per engine.
pub(crate) struct HostEntry {
    /// `host:port` (as the URL names it; just `host` without a known port).
    pub(crate) name: Box<str>,
    /// The host's metric handles.
    pub(crate) metrics: HostMetrics,
    /// The limiter's in-process cap for the host, if it decides alone.
    pub(crate) cap: Option<Arc<HostCap>>,
}

/// The hosts one engine has read from.
#[derive(Default)]
pub(crate) struct HostTable {
    entries: DashMap<HostKey, Arc<HostEntry>, KeyedHashBuilder>,
}

impl HostTable {
    /// The entry for `url`'s host, built on first use (`limiter` is asked
    /// for the host's cap then).
    pub(crate) fn resolve(&self, url: &reqwest::Url, limiter: &dyn HostLimiter) -> Arc<HostEntry> {
        let key = HostRef {
            host: url.host_str().unwrap_or(""),
            port: url.port_or_known_default(),
        };
        if let Some(entry) = self.entries.get(&key as &dyn HostParts) {
            return entry.clone();
        }
        let name: Box<str> = host_name(key.host, key.port).into();
        let entry = Arc::new(HostEntry {
            metrics: HostMetrics::new(&name),
            cap: limiter.local_cap(&name),
            name,
        });
        let owned = HostKey {
            host: key.host.into(),
            port: key.port,
        };
        self.entries.entry(owned).or_insert(entry).clone()
    }
}

/// `host:port`, or `host` without a port (what error messages and the
/// `[hosts]` tables call a host).
pub(crate) fn host_name(host: &str, port: Option<u16>) -> String {
    match port {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    }
}

/// `(host, port)`, owned (the table's key) or borrowed from a URL (a
/// lookup); both hash and compare through [`HostParts`], so a lookup needs no
/// owned key.
struct HostKey {
    host: Box<str>,
    port: Option<u16>,
}

struct HostRef<'a> {
    host: &'a str,
    port: Option<u16>,
}

trait HostParts {
    fn parts(&self) -> (&str, Option<u16>);
}

impl HostParts for HostKey {
    fn parts(&self) -> (&str, Option<u16>) {
        (&self.host, self.port)
    }
}

impl HostParts for HostRef<'_> {
    fn parts(&self) -> (&str, Option<u16>) {
        (self.host, self.port)
    }
}

/// Two writes: the host's bytes, then the port as a fixed-width word
/// (`u32::MAX` for none), so distinct keys stay distinct streams.
impl Hash for dyn HostParts + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let (host, port) = self.parts();
        state.write(host.as_bytes());
        state.write_u32(port.map_or(u32::MAX, u32::from));
    }
}

impl PartialEq for dyn HostParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn HostParts + '_ {}

impl Hash for HostKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self as &dyn HostParts).hash(state);
    }
}

impl PartialEq for HostKey {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for HostKey {}

impl<'a> Borrow<dyn HostParts + 'a> for HostKey {
    fn borrow(&self) -> &(dyn HostParts + 'a) {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts::LocalHostCaps;

    #[test]
    fn one_entry_per_host_and_port_named_as_the_hosts_tables_name_it() {
        let caps = LocalHostCaps::new(Default::default());
        let table = HostTable::default();
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        let a = table.resolve(&url("http://reg.example:5000/v2/a"), &caps);
        let b = table.resolve(&url("http://reg.example:5000/v2/b?x=1"), &caps);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*a.name, "reg.example:5000");
        // The scheme's default port is the port; an explicit default is the same host.
        let c = table.resolve(&url("https://reg.example/v2/"), &caps);
        let d = table.resolve(&url("http://reg.example:443/v2/"), &caps);
        assert_eq!(&*c.name, "reg.example:443");
        assert!(Arc::ptr_eq(&c, &d));
        assert!(!Arc::ptr_eq(&a, &c));
        // The entry holds the limiter's cap for the same name.
        let cap = a.cap.as_ref().expect("local caps always decide alone");
        assert!(Arc::ptr_eq(cap, &caps.cap("reg.example:5000")));
        assert_eq!(
            &*table.resolve(&url("http://[::1]:8080/"), &caps).name,
            "[::1]:8080"
        );
    }
}
