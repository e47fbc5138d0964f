//! The configured upstreams as the auth sees them (one per origin): the
//! user and password, the realms besides the own origin, and the challenge
//! each last answered with — remembered so later reads carry credentials up
//! front, forgotten when it fails.

use crate::config::{Secret, UpstreamTable};
use http::HeaderValue;
use std::sync::{Arc, RwLock};

/// One configured upstream.
pub(super) struct Site {
    pub(super) user: String,
    /// `origin user` (anonymous: `origin`).
    pub(super) identity: Arc<str>,
    pub(super) password: Option<Secret>,
    /// Realms besides the own origin that may receive the credentials.
    pub(super) realms: Vec<reqwest::Url>,
    /// The last challenge it answered with (so later reads go up front).
    pub(super) learned: RwLock<Option<Learned>>,
}

/// A challenge an upstream answered with.
#[derive(Clone)]
pub(super) enum Learned {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

/// Scheme, host and port of an upstream.
pub(super) struct Origin {
    scheme: String,
    host: String,
    port: Option<u16>,
}

impl Origin {
    /// The origin of `url`.
    pub(super) fn of(url: &reqwest::Url) -> Self {
        Self {
            scheme: url.scheme().to_string(),
            host: url.host_str().unwrap_or_default().to_ascii_lowercase(),
            port: url.port_or_known_default(),
        }
    }

    /// Whether `url` is on this origin (no allocation).
    pub(super) fn is(&self, url: &reqwest::Url) -> bool {
        url.port_or_known_default() == self.port
            && url.scheme() == self.scheme
            && url
                .host_str()
                .is_some_and(|h| h.eq_ignore_ascii_case(&self.host))
    }
}

impl Site {
    /// The upstream of the table `name` on its origin (`None` without a
    /// valid URL; a password that fails to resolve here is none: the
    /// configuration's validation reports it).
    pub(super) fn of(name: &str, table: &UpstreamTable) -> Option<(Origin, Site)> {
        let url = table.base_url()?;
        let realms = table
            .realms
            .iter()
            .filter_map(|r| reqwest::Url::parse(r).ok())
            .collect();
        let site = Site {
            identity: format!("{} {}", url.origin().ascii_serialization(), table.username).into(),
            user: table.username.clone(),
            password: table.resolve_password(name).ok().flatten(),
            realms,
            learned: RwLock::new(None),
        };
        Some((Origin::of(&url), site))
    }

    /// An upstream without a table: anonymous, no realm but its own.
    pub(super) fn anonymous() -> Self {
        Self {
            user: String::new(),
            identity: "".into(),
            password: None,
            realms: Vec::new(),
            learned: RwLock::new(None),
        }
    }

    /// `Basic base64(user:password)`, if a password is configured.
    pub(super) fn basic(&self) -> Option<HeaderValue> {
        let password = self.password.as_ref()?;
        let pair = format!("{}:{}", self.user, password.expose());
        use base64::Engine as _;
        let coded = base64::engine::general_purpose::STANDARD.encode(pair);
        let mut value = HeaderValue::from_str(&format!("Basic {coded}")).ok()?;
        value.set_sensitive(true);
        Some(value)
    }

    /// Remembers the challenge it answered with.
    pub(super) fn learn(&self, learned: Learned) {
        *self.learned.write().expect("not poisoned") = Some(learned);
    }

    /// Forgets the bearer challenge naming `realm` (not one that replaced
    /// it meanwhile).
    pub(super) fn forget(&self, realm: &str) {
        let mut learned = self.learned.write().expect("not poisoned");
        if matches!(&*learned, Some(Learned::Bearer { realm: r, .. }) if r == realm) {
            *learned = None;
        }
    }
}
