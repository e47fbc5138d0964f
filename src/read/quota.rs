//! The upstream's own quota: what a host says it has left, read from its
//! answers, so no read is sent into a quota it said is spent.
//!
//! An answer closes its host's gate until a time it gives:
//!
//! - `429` or `503` with `Retry-After` (seconds or an HTTP date);
//! - `ratelimit-remaining: 0;w=SECONDS` (the form Docker Hub sends, with
//!   `ratelimit-limit: 100;w=21600`): closed for the window;
//! - the IETF `RateLimit` header with `r=0` (`"default";r=0;t=30`), or its
//!   earlier forms (`remaining=0, reset=30`; `RateLimit-Remaining: 0` with
//!   `RateLimit-Reset: 30`): closed for `t` (`reset`) seconds.
//!
//! The `429` or `503` itself is that read's `UPSTREAM_QUOTA_EXHAUSTED`.
//! While a host's gate is closed every read to it is refused before
//! anything else (`UPSTREAM_QUOTA_EXHAUSTED`, with `retryAfterMs`); it opens
//! by itself at the time given (never more than a day ahead, whatever the
//! host says). The remaining count a host sends is the gauge
//! `fanout_upstream_quota_remaining{host}`.
//!
//! Gates exist for the hosts with an entry of their own (a `[hosts]` table,
//! a known host, a configured upstream), fixed when the engine is built; a
//! host without one (a redirect's target) is not tracked. With a
//! [`QuotaBoard`] (Redis: `backends::redis`), a gate one replica closes is
//! published, and the gates others closed are closed here as the board
//! learns them — the read path itself never waits on the board.

use crate::error::ReadError;
use http::{HeaderMap, HeaderName, StatusCode};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// The longest a host may close its gate for.
pub(crate) const MAX_CLOSED: Duration = Duration::from_secs(24 * 60 * 60);

/// Where the hosts' quota gates are shared with other replicas.
///
/// The engine calls [`publish`](Self::publish) when an answer closes a
/// gate here, and [`subscribe`](Self::subscribe) once, when it is built:
/// the board tells `learn` each closing it hears of (another replica's, or
/// this one's own) with how long the gate stays closed, from its own task.
pub trait QuotaBoard: Send + Sync + 'static {
    /// Tells the fleet `host` said its quota is spent for `closed_for`.
    fn publish(&self, host: &str, closed_for: Duration);
    /// Starts telling `learn` the fleet's closings as they are heard.
    fn subscribe(&self, learn: Learn);
}

/// What a [`QuotaBoard`] tells of a closing: `host`, closed for how long.
pub type Learn = Arc<dyn Fn(&str, Duration) + Send + Sync>;

/// The gates of the hosts with an entry of their own.
pub(crate) struct Quotas {
    gates: HashMap<Box<str>, Gate>,
    /// Where closings are published, if the fleet shares them.
    board: Option<Arc<dyn QuotaBoard>>,
    /// What `until_ms` counts from.
    epoch: Instant,
    /// Whether any gate has ever closed: until then, reads look nothing up.
    any_closed: AtomicBool,
}

struct Gate {
    /// Milliseconds after `epoch` when the gate opens; 0: open.
    until_ms: AtomicU64,
    remaining: metrics::Gauge,
}

impl Quotas {
    /// A gate for each of `hosts` (`host:port`).
    pub(crate) fn new<'h>(hosts: impl IntoIterator<Item = &'h str>) -> Self {
        let gates = hosts
            .into_iter()
            .map(|host| {
                let gate = Gate {
                    until_ms: AtomicU64::new(0),
                    remaining: metrics::gauge!(
                        "fanout_upstream_quota_remaining",
                        "host" => host.to_string()
                    ),
                };
                (host.into(), gate)
            })
            .collect();
        Self {
            gates,
            board: None,
            epoch: Instant::now(),
            any_closed: AtomicBool::new(false),
        }
    }

    /// These gates, shared with the fleet on `board`: closings are published
    /// there, and what it learns closes gates here.
    pub(crate) fn shared(mut self, board: Arc<dyn QuotaBoard>) -> Arc<Self> {
        self.board = Some(board.clone());
        let quotas = Arc::new(self);
        let weak: Weak<Self> = Arc::downgrade(&quotas);
        board.subscribe(Arc::new(move |host, closed_for| {
            if let Some(quotas) = weak.upgrade() {
                quotas.close(host, Instant::now(), closed_for);
            }
        }));
        quotas
    }

    /// Closes `host`'s gate from `now` for `closed_for` (at most a day);
    /// `false` for a host without a gate.
    fn close(&self, host: &str, now: Instant, closed_for: Duration) -> bool {
        let Some(gate) = self.gates.get(host) else {
            return false;
        };
        let until = self.millis(now + closed_for.min(MAX_CLOSED)).max(1);
        gate.until_ms.fetch_max(until, Relaxed);
        self.any_closed.store(true, Relaxed);
        true
    }

    /// `Err(UPSTREAM_QUOTA_EXHAUSTED)` while `host`'s gate is closed at `now`.
    pub(crate) fn check(&self, host: &str, now: Instant) -> Result<(), ReadError> {
        if !self.any_closed.load(Relaxed) {
            return Ok(());
        }
        let Some(gate) = self.gates.get(host) else {
            return Ok(());
        };
        let until = gate.until_ms.load(Relaxed);
        let now_ms = self.millis(now);
        if until > now_ms {
            return Err(ReadError::QuotaExhausted {
                host: host.to_string(),
                retry_after_ms: until - now_ms,
            });
        }
        Ok(())
    }

    /// Learns from an answer of `host`, received at `now`: the answer's
    /// error when it is a refusal (`429`, `503`) that closed the gate.
    pub(crate) fn observe(
        &self,
        host: &str,
        status: StatusCode,
        headers: &HeaderMap,
        now: Instant,
    ) -> Option<ReadError> {
        let seen = Seen::of(status, headers)?;
        let gate = self.gates.get(host)?;
        if let Some(remaining) = seen.remaining {
            gate.remaining.set(remaining as f64);
        }
        if let Some(closed_for) = seen.closed_for {
            self.close(host, now, closed_for);
            if let Some(board) = &self.board {
                board.publish(host, closed_for.min(MAX_CLOSED));
            }
            let retry_after_ms = closed_for.min(MAX_CLOSED).as_millis() as u64;
            tracing::warn!(
                host,
                retry_after_ms,
                "the upstream said its quota is spent; reads to it are refused until then"
            );
            if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE
            {
                return Some(ReadError::QuotaExhausted {
                    host: host.to_string(),
                    retry_after_ms,
                });
            }
        }
        None
    }

    fn millis(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }
}

/// What one answer says of its host's quota.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Seen {
    /// Reads left, if it says.
    pub(crate) remaining: Option<u64>,
    /// How long no read may be sent, if it says the quota is spent.
    pub(crate) closed_for: Option<Duration>,
}

impl Seen {
    /// What `headers` (of an answer with `status`) say; `None`: nothing.
    pub(crate) fn of(status: StatusCode, headers: &HeaderMap) -> Option<Self> {
        // Every form below is a header: an answer without any says nothing
        // (the common one, looked at once per read).
        if headers.is_empty() {
            return None;
        }
        // Names made once, not parsed at each lookup.
        const REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
        const RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
        const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
        let text = |name: &HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
        let mut seen = Self::default();
        // Docker Hub: `ratelimit-remaining: 0;w=21600`.
        if let Some(value) = text(&REMAINING) {
            let mut parts = value.split(';');
            seen.remaining = parts.next().and_then(|n| n.trim().parse().ok());
            let window = parts
                .filter_map(|p| p.trim().strip_prefix("w="))
                .find_map(|w| w.trim().parse().ok())
                .or_else(|| text(&RESET).and_then(|r| r.trim().parse().ok()));
            if seen.remaining == Some(0) {
                seen.closed_for = window.map(Duration::from_secs);
            }
        }
        // IETF: `RateLimit: "default";r=0;t=30`, or `limit=100, remaining=0, reset=30`.
        if let Some(value) = text(&RATELIMIT) {
            let param = |names: &[&str]| {
                value
                    .split([';', ','])
                    .filter_map(|p| p.trim().split_once('='))
                    .find(|(k, _)| names.contains(&k.trim()))
                    .and_then(|(_, v)| v.trim().trim_matches('"').parse::<u64>().ok())
            };
            if let Some(remaining) = param(&["r", "remaining"]) {
                seen.remaining = Some(remaining);
                if remaining == 0 {
                    seen.closed_for = param(&["t", "reset"]).map(Duration::from_secs);
                }
            }
        }
        // `Retry-After` on a refusal: it wins, being the most precise.
        if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
            if let Some(after) = text(&http::header::RETRY_AFTER).and_then(retry_after) {
                seen.closed_for = Some(after);
            }
        }
        (seen != Self::default()).then_some(seen)
    }
}

/// A `Retry-After` value: delta-seconds, or an HTTP date.
fn retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        map
    }

    #[test]
    fn the_forms_upstreams_send() {
        let ok = StatusCode::OK;
        let hub = headers(&[
            ("ratelimit-limit", "100;w=21600"),
            ("ratelimit-remaining", "0;w=21600"),
        ]);
        assert_eq!(
            Seen::of(ok, &hub).unwrap().closed_for,
            Some(Duration::from_secs(21600))
        );
        let left = headers(&[("ratelimit-remaining", "76;w=21600")]);
        assert_eq!(
            Seen::of(ok, &left),
            Some(Seen {
                remaining: Some(76),
                closed_for: None
            })
        );
        let ietf = headers(&[("ratelimit", "\"default\";r=0;t=30")]);
        assert_eq!(
            Seen::of(ok, &ietf).unwrap().closed_for,
            Some(Duration::from_secs(30))
        );
        let draft = headers(&[("ratelimit", "limit=100, remaining=0, reset=7")]);
        assert_eq!(
            Seen::of(ok, &draft).unwrap().closed_for,
            Some(Duration::from_secs(7))
        );
        let split = headers(&[("ratelimit-remaining", "0"), ("ratelimit-reset", "9")]);
        assert_eq!(
            Seen::of(ok, &split).unwrap().closed_for,
            Some(Duration::from_secs(9))
        );
        let refused = headers(&[("retry-after", "12")]);
        let seen = Seen::of(StatusCode::TOO_MANY_REQUESTS, &refused).unwrap();
        assert_eq!(seen.closed_for, Some(Duration::from_secs(12)));
        // A Retry-After on a success says nothing of a quota.
        assert_eq!(Seen::of(ok, &refused), None);
        let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        let dated = headers(&[("retry-after", date.as_str())]);
        let after = Seen::of(StatusCode::SERVICE_UNAVAILABLE, &dated)
            .unwrap()
            .closed_for
            .unwrap();
        assert!((118..=120).contains(&after.as_secs()), "{after:?}");
        assert_eq!(Seen::of(ok, &HeaderMap::new()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_gate_opens_at_the_time_given() {
        let quotas = Quotas::new(["api:443"]);
        let now = Instant::now();
        assert!(quotas.check("api:443", now).is_ok());
        let spent = headers(&[("ratelimit", "r=0;t=5")]);
        quotas.observe("api:443", StatusCode::OK, &spent, now);
        let err = quotas
            .check("api:443", now + Duration::from_secs(1))
            .unwrap_err();
        assert_eq!(
            err,
            ReadError::QuotaExhausted {
                host: "api:443".into(),
                retry_after_ms: 4000
            }
        );
        assert!(quotas.check("other:80", now).is_ok(), "untracked host");
        assert!(quotas
            .check("api:443", now + Duration::from_secs(5))
            .is_ok());
        // A host cannot close itself for longer than a day.
        let forever = headers(&[("retry-after", "99999999")]);
        quotas.observe("api:443", StatusCode::TOO_MANY_REQUESTS, &forever, now);
        let err = quotas.check("api:443", now).unwrap_err();
        let ReadError::QuotaExhausted { retry_after_ms, .. } = err else {
            panic!()
        };
        assert_eq!(retry_after_ms, MAX_CLOSED.as_millis() as u64);
    }
}
