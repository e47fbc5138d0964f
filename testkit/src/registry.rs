//! Debian's `docker-registry` (CNCF distribution 2.8) on a free loopback
//! port, open or authenticating, over HTTP or TLS:
//!
//! - [`RegistryAuth::Token`]: `auth: token`, with a token server started
//!   here that signs ES256 JWTs with an `x5c` self-signed certificate, which
//!   is also the registry's `rootcertbundle` (2.8 wants `aud` as a string);
//! - [`RegistryAuth::Htpasswd`]: `auth: htpasswd`, one bcrypt user;
//! - `tls`: a server certificate for `127.0.0.1` signed by a CA made here
//!   ([`RegistryServer::ca_file`]).
//!
//! A test pushes into an open registry, then [`restart_with`](RegistryServer::restart_with)
//! serves the same storage with auth.

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SERVICE: &str = "fanout-test-registry";
const ISSUER: &str = "fanout-test-issuer";

/// How the registry authenticates.
#[derive(Clone, Debug)]
pub enum RegistryAuth {
    /// Open, no auth.
    None,
    /// Docker token auth, with a token server started by the fixture.
    Token(TokenPolicy),
    /// `auth: htpasswd` with one user.
    Htpasswd {
        /// The user.
        user: String,
        /// Their password.
        password: String,
    },
}

/// What the token server grants.
#[derive(Clone, Debug)]
pub struct TokenPolicy {
    /// The one user the token server knows.
    pub user: String,
    /// Their password.
    pub password: String,
    /// Repositories anyone may pull; the user may pull (and push) every one
    /// but those `denied`.
    pub public: Vec<String>,
    /// Repositories no one may pull.
    pub denied: Vec<String>,
    /// `expires_in` the token server answers (seconds); the JWT's `exp` matches.
    pub expires_in: u64,
}

/// What the token server saw, and how it answers.
#[derive(Debug, Default)]
struct TokenLog {
    /// Fetches by scope (all scopes of a fetch, space-joined).
    by_scope: Mutex<HashMap<String, u64>>,
    total: AtomicU64,
    refusals: AtomicU64,
    requests: Mutex<Vec<String>>,
    expires_in: AtomicU64,
}

struct TokenServer {
    policy: TokenPolicy,
    log: Arc<TokenLog>,
    /// PKCS#8 DER of the signing key, and the base64 DER of its certificate.
    key_der: Vec<u8>,
    cert_b64: String,
}

/// A `docker-registry` child process, killed on drop, its directory removed.
pub struct RegistryServer {
    binary: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    tls: bool,
    realm: Option<String>,
    log: Arc<TokenLog>,
    token_task: Option<tokio::task::JoinHandle<()>>,
    /// The CA of the TLS certificate, and the token signing identity, made once.
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl RegistryServer {
    /// Starts `binary` in `auth` mode, over HTTPS when `tls`, and waits
    /// until it answers.
    pub async fn start(binary: &Path, auth: RegistryAuth, tls: bool) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "fanout-registry-{}-{}",
            std::process::id(),
            crate::free_port()
        ));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "fanout test CA");
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        let mut server = Self {
            binary: binary.to_path_buf(),
            dir,
            port: crate::free_port(),
            child: None,
            tls,
            realm: None,
            log: Arc::default(),
            token_task: None,
            ca,
            ca_key,
        };
        server.restart_with(auth, tls).await;
        server
    }

    /// Stops it and starts it again on the same storage and port in
    /// another mode.
    pub async fn restart_with(&mut self, auth: RegistryAuth, tls: bool) {
        self.stop();
        self.tls = tls;
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{}\n",
            self.dir.join("data").display(),
            self.port
        );
        if tls {
            let key = rcgen::KeyPair::generate().unwrap();
            let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
            let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
            std::fs::write(self.dir.join("tls.pem"), cert.pem()).unwrap();
            std::fs::write(self.dir.join("tls.key"), key.serialize_pem()).unwrap();
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                self.dir.join("tls.pem").display(),
                self.dir.join("tls.key").display()
            ));
        }
        match auth {
            RegistryAuth::None => {}
            RegistryAuth::Htpasswd { user, password } => {
                let hash = bcrypt::hash(password, 4).unwrap();
                std::fs::write(self.dir.join("htpasswd"), format!("{user}:{hash}\n")).unwrap();
                config.push_str(&format!(
                    "auth:\n  htpasswd:\n    realm: fanout-test\n    path: {}\n",
                    self.dir.join("htpasswd").display()
                ));
            }
            RegistryAuth::Token(policy) => {
                let realm = self.start_token_server(policy).await;
                config.push_str(&format!(
                    "auth:\n  token:\n    realm: {realm}\n    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
                    self.dir.join("token-root.pem").display()
                ));
                self.realm = Some(realm);
            }
        }
        std::fs::write(self.dir.join("config.yml"), config).unwrap();
        let child = Command::new(&self.binary)
            .arg("serve")
            .arg(self.dir.join("config.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry starts");
        self.child = Some(child);
        let client = self.client();
        for _ in 0..200 {
            // Any answer (a 401 included) means it serves.
            if client
                .get(format!("{}/v2/", self.url()))
                .send()
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("docker-registry did not become ready on {}", self.url());
    }

    /// A client that trusts the fixture's CA.
    pub fn client(&self) -> reqwest::Client {
        let ca = reqwest::Certificate::from_pem(self.ca.pem().as_bytes()).unwrap();
        reqwest::Client::builder()
            .add_root_certificate(ca)
            .build()
            .unwrap()
    }

    /// `http://127.0.0.1:PORT` or `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The token realm URL (Token mode only).
    pub fn realm(&self) -> Option<String> {
        self.realm.clone()
    }

    /// The CA certificate (PEM file) that signed the TLS certificate (TLS only).
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.tls.then(|| self.dir.join("ca.pem"))
    }

    /// Token requests answered (any outcome) naming `scope`.
    pub fn token_fetches(&self, scope: &str) -> u64 {
        let by_scope = self.log.by_scope.lock().unwrap();
        by_scope
            .iter()
            .filter(|(scopes, _)| scopes.split(' ').any(|s| s == scope))
            .map(|(_, n)| n)
            .sum()
    }

    /// Token requests answered, in all.
    pub fn token_fetches_total(&self) -> u64 {
        self.log.total.load(SeqCst)
    }

    /// Token requests whose Basic credentials were wrong (answered 401).
    pub fn token_refusals(&self) -> u64 {
        self.log.refusals.load(SeqCst)
    }

    /// Every request the token server received: `GET path?query`, then the
    /// raw `Authorization` header if any.
    pub fn token_requests(&self) -> Vec<String> {
        self.log.requests.lock().unwrap().clone()
    }

    /// The `expires_in` the token server gives from now on.
    pub fn set_expires_in(&self, seconds: u64) {
        self.log.expires_in.store(seconds, SeqCst);
    }

    /// Starts the token server (once; a restart keeps it) and writes its
    /// signing certificate as the registry's root bundle; its realm.
    async fn start_token_server(&mut self, policy: TokenPolicy) -> String {
        self.log.expires_in.store(policy.expires_in, SeqCst);
        if let (Some(realm), Some(_)) = (&self.realm, &self.token_task) {
            return realm.clone();
        }
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["fanout-token".to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "fanout token signer");
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(self.dir.join("token-root.pem"), cert.pem()).unwrap();
        let server = Arc::new(TokenServer {
            policy,
            log: self.log.clone(),
            key_der: key.serialize_der(),
            cert_b64: base64::engine::general_purpose::STANDARD.encode(cert.der()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = axum::Router::new()
            .route("/token", axum::routing::get(token))
            .with_state(server);
        self.token_task = Some(tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        }));
        format!("http://{addr}/token")
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RegistryServer {
    fn drop(&mut self) {
        self.stop();
        if let Some(task) = self.token_task.take() {
            task.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `GET /token?service=…&scope=…`, anonymous or with Basic credentials.
async fn token(
    State(server): State<Arc<TokenServer>>,
    Query(query): Query<Vec<(String, String)>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let log = &server.log;
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut line = format!("GET {uri}");
    if let Some(auth) = &auth {
        line.push(' ');
        line.push_str(auth);
    }
    log.requests.lock().unwrap().push(line);
    let scopes: Vec<&str> = query
        .iter()
        .filter(|(k, _)| k == "scope")
        .map(|(_, v)| v.as_str())
        .collect();
    log.total.fetch_add(1, SeqCst);
    *log.by_scope
        .lock()
        .unwrap()
        .entry(scopes.join(" "))
        .or_default() += 1;
    let user = match auth.as_deref().and_then(|a| a.strip_prefix("Basic ")) {
        None => None,
        Some(coded) => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(coded)
                .ok()
                .and_then(|d| String::from_utf8(d).ok());
            let expected = format!("{}:{}", server.policy.user, server.policy.password);
            if decoded.as_deref() != Some(expected.as_str()) {
                log.refusals.fetch_add(1, SeqCst);
                let body = r#"{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}"#;
                return (StatusCode::UNAUTHORIZED, body).into_response();
            }
            Some(server.policy.user.clone())
        }
    };
    let access: Vec<serde_json::Value> = scopes
        .iter()
        .filter_map(|scope| {
            let mut parts = scope.splitn(3, ':');
            let (kind, name, actions) = (parts.next()?, parts.next()?, parts.next()?);
            let granted: Vec<&str> = actions
                .split(',')
                .filter(|action| match (&user, *action) {
                    _ if server.policy.denied.iter().any(|d| d == name) => false,
                    (Some(_), _) => true,
                    (None, "pull") => server.policy.public.iter().any(|p| p == name),
                    (None, _) => false,
                })
                .collect();
            Some(serde_json::json!({ "type": kind, "name": name, "actions": granted }))
        })
        .collect();
    let expires_in = log.expires_in.load(SeqCst);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({
        "iss": ISSUER,
        "sub": user.clone().unwrap_or_default(),
        "aud": SERVICE,
        "exp": now + expires_in,
        "nbf": now.saturating_sub(5),
        "iat": now,
        "jti": format!("{}-{now}", log.total.load(SeqCst)),
        "access": access,
    });
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.x5c = Some(vec![server.cert_b64.clone()]);
    let key = jsonwebtoken::EncodingKey::from_ec_der(&server.key_der);
    let jwt = jsonwebtoken::encode(&header, &claims, &key).unwrap();
    let issued_at = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    axum::Json(serde_json::json!({
        "token": jwt,
        "access_token": jwt,
        "expires_in": expires_in,
        "issued_at": issued_at,
    }))
    .into_response()
}
