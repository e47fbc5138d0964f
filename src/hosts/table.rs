//! The engine's table of upstream hosts: each host resolved once.
//!
//! A read's host is its URL's `(host, port)`. The first read to a host builds
//! its [`HostEntry`] — the `host:port` name, the metric handles, and the
//! limiter's [`HostCap`] when it has one — and every later read finds it with
//! one lookup keyed by the URL's own `host_str()` and port: no `format!`, no
//! allocation, one hash.
//!
//! A request's reads mostly go to one host, so each request also keeps the
//! entry of the first host it read from ([`RequestHost`]): a later read to
//! the same host finds it there — one atomic load and a string compare —
//! without touching the shared table or the entry's reference count.

use super::{HostCap, HostLimiter};
use crate::hash::KeyedHashBuilder;
use crate::metrics::HostMetrics;
use dashmap::DashMap;
use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

/// Everything the read path needs about one host, built once per engine.
pub(crate) struct HostEntry {
    /// `host:port` (as the URL names it; just `host` without a known port).
    pub(crate) name: Box<str>,
    /// The host's metric handles.
    pub(crate) metrics: HostMetrics,
    /// The limiter's in-process cap for the host, if it decides alone.
    pub(crate) cap: Option<Arc<HostCap>>,
    /// `name[..host_len]` is the URL's `host_str()`.
    host_len: usize,
    /// The URL's port (or its scheme's default).
    port: Option<u16>,
}

impl HostEntry {
    /// Whether this is the entry for `(host, port)`.
    fn is(&self, host: &str, port: Option<u16>) -> bool {
        self.port == port && &self.name[..self.host_len] == host
    }
}

/// One request's first host (see the module docs).
#[derive(Default)]
pub(crate) struct RequestHost(OnceLock<Arc<HostEntry>>);

/// A host entry for one read: borrowed from the request, or shared from
/// the engine's table.
pub(crate) enum HostHandle<'a> {
    Request(&'a HostEntry),
    Table(Arc<HostEntry>),
}

impl Deref for HostHandle<'_> {
    type Target = HostEntry;

    fn deref(&self) -> &HostEntry {
        match self {
            HostHandle::Request(entry) => entry,
            HostHandle::Table(entry) => entry,
        }
    }
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
            host_len: key.host.len(),
            port: key.port,
        });
        let owned = HostKey {
            host: key.host.into(),
            port: key.port,
        };
        self.entries.entry(owned).or_insert(entry).clone()
    }

    /// The entry for `url`'s host: the request's own when it is that host,
    /// else the table's (and the first one a request resolves becomes its own).
    pub(crate) fn resolve_for<'a>(
        &self,
        request: &'a RequestHost,
        url: &reqwest::Url,
        limiter: &dyn HostLimiter,
    ) -> HostHandle<'a> {
        let (host, port) = (url.host_str().unwrap_or(""), url.port_or_known_default());
        if let Some(entry) = request.0.get() {
            return if entry.is(host, port) {
                HostHandle::Request(entry)
            } else {
                HostHandle::Table(self.resolve(url, limiter))
            };
        }
        let entry = self.resolve(url, limiter);
        // Two first reads racing: one sets it, the other's is the same
        // entry or another host's (then it stays a table entry).
        let _ = request.0.set(entry.clone());
        match request.0.get() {
            Some(own) if Arc::ptr_eq(own, &entry) => HostHandle::Request(own),
            _ => HostHandle::Table(entry),
        }
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

    #[test]
    fn a_request_keeps_its_first_host_and_asks_the_table_for_others() {
        let caps = LocalHostCaps::new(Default::default());
        let table = HostTable::default();
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        let request = RequestHost::default();
        let first = table.resolve_for(&request, &url("http://reg.example:5000/a"), &caps);
        assert!(matches!(first, HostHandle::Request(_)));
        let again = table.resolve_for(&request, &url("http://reg.example:5000/b"), &caps);
        assert!(matches!(again, HostHandle::Request(_)));
        assert!(std::ptr::eq(&*first, &*again));
        // Another port, another host name with the first as its prefix, the
        // same host by another spelling of its port: the right entries.
        for (other, name) in [
            ("http://reg.example:5001/a", "reg.example:5001"),
            ("http://reg.example.org:5000/a", "reg.example.org:5000"),
            ("http://reg.exampl:5000/a", "reg.exampl:5000"),
        ] {
            let handle = table.resolve_for(&request, &url(other), &caps);
            assert!(matches!(handle, HostHandle::Table(_)), "{other}");
            assert_eq!(&*handle.name, name);
        }
        let https = RequestHost::default();
        let a = table.resolve_for(&https, &url("https://reg.example/v2/"), &caps);
        let b = table.resolve_for(&https, &url("https://reg.example:443/v2/"), &caps);
        assert!(matches!(b, HostHandle::Request(_)));
        assert_eq!(&*a.name, "reg.example:443");
        assert!(std::ptr::eq(&*a, &*b));
        // Both handles are the table's entries.
        assert!(Arc::ptr_eq(
            &table.resolve(&url("http://reg.example:5000/"), &caps),
            request.0.get().unwrap()
        ));
    }
}
