//! Whether a registry's manifest `HEAD` names the digest, learned once per
//! registry and process, so a digest-only manifest costs the one read the
//! cost preview priced.
//!
//! A query that wants only a tag's `digest` and `mediaType` reads its
//! manifest with a `HEAD` (a registry that meters pulls counts none). A
//! registry that answers the `HEAD` without `Docker-Content-Digest` makes
//! it a `HEAD` and a `GET`: two reads where `requested` counted one. So:
//!
//! - **Unknown** (nothing learned of that origin yet): the first
//!   digest-only manifest read there is the *probe*, a `GET` (one read, and
//!   one pull, once per registry and process): whether its answer names
//!   `Docker-Content-Digest` — a `HEAD` answers the same headers — is
//!   learned; every other digest-only manifest of that registry waits for
//!   it.
//! - **Digests**: the probe's answer named the digest: manifests are read
//!   with a `HEAD`, all at once.
//! - **Digestless**: it did not: manifests are read with a `GET` at once,
//!   one read each, from then on (a registry whose `HEAD` stops naming the
//!   digest, or never did though its `GET` does, is moved here by the first
//!   `HEAD` without one, which is followed by the `GET`: the one read past
//!   `requested` the gateway can still make, once per registry).
//!
//! A probe that fails (an error, a timeout, its request cancelled) teaches
//! nothing: the state goes back to unknown, and the manifests that waited
//! for it send their own `HEAD` (a registry that fails is not probed one
//! read at a time). Origins are those of the configured registries, so the
//! table is bounded by the configuration.

use std::sync::Mutex;
use tokio::sync::watch;

/// What each registry's manifest `HEAD` was seen to do (schema data).
#[derive(Debug, Default)]
pub struct HeadProbes(Mutex<Vec<(String, Learned)>>);

#[derive(Clone, Debug)]
enum Learned {
    Unknown,
    /// A probe is out; its end is signalled (or its sender dropped).
    Probing(watch::Receiver<()>),
    Digests,
    Digestless,
}

/// How to read one digest-only manifest.
pub(super) enum Plan<'a> {
    /// A `HEAD`.
    Head,
    /// A `GET` at once.
    Get,
    /// A `GET` whose answer settles what the registry's `HEAD` does.
    Probe(Probe<'a>),
}

/// The first digest-only manifest read of a registry: what its answer
/// shows is settled for every read after it; dropped unsettled, it taught
/// nothing.
pub(super) struct Probe<'a> {
    probes: &'a HeadProbes,
    origin: String,
    _done: watch::Sender<()>,
}

impl HeadProbes {
    fn table(&self) -> std::sync::MutexGuard<'_, Vec<(String, Learned)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, origin: &str, learned: Learned) {
        let mut table = self.table();
        match table.iter_mut().find(|(o, _)| o == origin) {
            Some((_, state)) => *state = learned,
            None => table.push((origin.to_owned(), learned)),
        }
    }

    /// How to read a digest-only manifest of `registry`: waits while
    /// another read probes it.
    pub(super) async fn plan(&self, registry: &reqwest::Url) -> Plan<'_> {
        let origin = registry.origin().ascii_serialization();
        let mut waited = false;
        loop {
            let mut probing = {
                let mut table = self.table();
                let at = match table.iter().position(|(o, _)| *o == origin) {
                    Some(at) => at,
                    None => {
                        table.push((origin.clone(), Learned::Unknown));
                        table.len() - 1
                    }
                };
                match &table[at].1 {
                    Learned::Digests => return Plan::Head,
                    Learned::Digestless => return Plan::Get,
                    // A probe that failed while this read waited: its own HEAD.
                    Learned::Unknown if waited => return Plan::Head,
                    Learned::Unknown => {
                        let (done, seen) = watch::channel(());
                        table[at].1 = Learned::Probing(seen);
                        let probe = Probe {
                            probes: self,
                            origin,
                            _done: done,
                        };
                        return Plan::Probe(probe);
                    }
                    Learned::Probing(seen) => seen.clone(),
                }
            };
            // The probe's sender is dropped when it settles or fails.
            while probing.changed().await.is_ok() {}
            waited = true;
        }
    }

    /// `registry` answered a `HEAD` without the digest: `GET` from now on.
    pub(super) fn digestless(&self, registry: &reqwest::Url) {
        self.set(
            &registry.origin().ascii_serialization(),
            Learned::Digestless,
        );
    }
}

impl Probe<'_> {
    /// What the probe's answer showed: whether it named the digest.
    pub(super) fn settle(self, named_digest: bool) {
        let learned = match named_digest {
            true => Learned::Digests,
            false => Learned::Digestless,
        };
        self.probes.set(&self.origin, learned);
        // Dropping `self` drops the sender: the waiters look again.
    }
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        // Unsettled (failed, cancelled): back to unknown, unless settled.
        let mut table = self.probes.table();
        if let Some((_, state)) = table.iter_mut().find(|(o, _)| *o == self.origin) {
            if matches!(state, Learned::Probing(_)) {
                *state = Learned::Unknown;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url() -> reqwest::Url {
        "http://registry.local:5000".parse().unwrap()
    }

    #[tokio::test]
    async fn one_probe_then_every_read_knows() {
        let probes = HeadProbes::default();
        let Plan::Probe(probe) = probes.plan(&url()).await else {
            panic!("the first read probes");
        };
        let waiting = probes.plan(&url());
        tokio::pin!(waiting);
        assert!(
            futures::poll!(waiting.as_mut()).is_pending(),
            "waits for the probe"
        );
        probe.settle(false);
        assert!(matches!(waiting.await, Plan::Get));
        assert!(matches!(probes.plan(&url()).await, Plan::Get));
    }

    #[tokio::test]
    async fn a_failed_probe_releases_its_waiters_and_teaches_nothing() {
        let probes = HeadProbes::default();
        let Plan::Probe(probe) = probes.plan(&url()).await else {
            panic!("the first read probes");
        };
        let waiting = probes.plan(&url());
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        drop(probe);
        assert!(matches!(waiting.await, Plan::Head), "its own HEAD");
        // The next read probes again, and an answer naming the digest
        // settles it.
        let Plan::Probe(probe) = probes.plan(&url()).await else {
            panic!("probed again");
        };
        probe.settle(true);
        assert!(matches!(probes.plan(&url()).await, Plan::Head));
    }
}
