//! Upstreams that authenticate (`src/read/auth.rs`), against loopback
//! servers started here: a "registry" that wants a bearer token (or Basic)
//! and a token service. Every request sent is a charged read; a token is
//! fetched once however many requests need it; credentials go nowhere else.
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use fanout_budget::config::UpstreamTable;
use fanout_budget::{inbound::Caller, Config, Engine, Read};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// What the servers saw, and how the token service answers.
#[derive(Default)]
struct Seen {
    /// Requests to the registry, by `Authorization` ("" for none).
    registry: Mutex<Vec<String>>,
    /// Token fetches, by scope.
    fetches: Mutex<HashMap<String, u64>>,
    /// Every `Authorization` the token service received.
    token_auth: Mutex<Vec<String>>,
    /// The token service's realm (set once both servers listen).
    realm: Mutex<String>,
    /// Tokens issued so far (each token is `t<N>`).
    issued: AtomicU64,
    /// Tokens the registry takes (it forgets the rest: "revoked").
    valid: Mutex<Vec<String>>,
    /// `expires_in` the token service gives.
    expires_in: AtomicU64,
    /// The registry takes no token at all.
    reject_all: std::sync::atomic::AtomicBool,
    /// Where `/elsewhere` redirects.
    elsewhere: Mutex<String>,
    /// `Authorization` headers the registry's own `/token2` received.
    token2_auth: Mutex<Vec<String>>,
}

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

/// `GET /v2/{repo}`: 200 with a valid bearer token, else the challenge;
/// `GET /basic`: 200 with `ci:pw`, else a Basic challenge.
async fn registry(
    State(seen): State<Arc<Seen>>,
    axum::extract::Path(repo): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    let auth = headers
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    seen.registry.lock().unwrap().push(auth.clone());
    let token = auth.strip_prefix("Bearer ").unwrap_or("");
    let valid = seen.valid.lock().unwrap().iter().any(|t| t == token);
    if valid && !seen.reject_all.load(SeqCst) {
        return (StatusCode::OK, format!("{{\"repo\":\"{repo}\"}}")).into_response();
    }
    let realm = seen.realm.lock().unwrap().clone();
    let challenge =
        format!("Bearer realm=\"{realm}\",service=\"test\",scope=\"repository:{repo}:pull\"");
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, challenge)],
        "{}",
    )
        .into_response()
}

/// The token service on the registry's origin, behind `/elsewhere`.
async fn token2(
    State(seen): State<Arc<Seen>>,
    query: Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let auth = headers
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap().to_string());
    seen.token2_auth
        .lock()
        .unwrap()
        .push(auth.unwrap_or_default());
    token(State(seen), query, HeaderMap::new()).await
}

async fn basic(State(seen): State<Arc<Seen>>, headers: HeaderMap) -> Response {
    let auth = headers
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    seen.registry.lock().unwrap().push(auth.clone());
    // base64("ci:pw")
    if auth == "Basic Y2k6cHc=" {
        return (StatusCode::OK, "{}").into_response();
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Basic realm=\"test\"")],
        "",
    )
        .into_response()
}

async fn token(
    State(seen): State<Arc<Seen>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let scope = query.get("scope").cloned().unwrap_or_default();
    *seen.fetches.lock().unwrap().entry(scope).or_default() += 1;
    if let Some(auth) = headers.get(header::AUTHORIZATION) {
        let auth = auth.to_str().unwrap().to_string();
        seen.token_auth.lock().unwrap().push(auth.clone());
        if auth != "Basic Y2k6cHc=" {
            return StatusCode::UNAUTHORIZED.into_response();
        }
    }
    // Slow enough that concurrent reads meet the fetch in flight.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let n = seen.issued.fetch_add(1, SeqCst) + 1;
    let token = format!("t{n}");
    seen.valid.lock().unwrap().push(token.clone());
    let expires_in = seen.expires_in.load(SeqCst);
    axum::Json(serde_json::json!({ "token": token, "expires_in": expires_in })).into_response()
}

/// A token answer of 1 MiB.
async fn huge() -> Response {
    let token = "x".repeat(1 << 20);
    axum::Json(serde_json::json!({ "token": token })).into_response()
}

/// A realm that redirects to the registry's origin (another origin than
/// its own), to a token service that records the `Authorization` it got.
async fn elsewhere(State(seen): State<Arc<Seen>>, uri: axum::http::Uri) -> Response {
    let target = seen.elsewhere.lock().unwrap().clone();
    let query = uri.query().unwrap_or("");
    (
        StatusCode::FOUND,
        [(header::LOCATION, format!("{target}?{query}"))],
    )
        .into_response()
}

struct Servers {
    seen: Arc<Seen>,
    registry: String,
    realm_base: String,
}

async fn servers() -> Servers {
    let seen = Arc::new(Seen::default());
    seen.expires_in.store(300, SeqCst);
    let registry = serve(
        Router::new()
            .route("/v2/{repo}", get(registry))
            .route("/basic", get(basic))
            .route("/token2", get(token2))
            .with_state(seen.clone()),
    )
    .await;
    let realm_base = serve(
        Router::new()
            .route("/token", get(token))
            .route("/huge", get(huge))
            .route("/elsewhere", get(elsewhere))
            .with_state(seen.clone()),
    )
    .await;
    *seen.realm.lock().unwrap() = format!("{realm_base}/token");
    Servers {
        seen,
        registry,
        realm_base,
    }
}

impl Servers {
    fn fetches(&self, repo: &str) -> u64 {
        let scope = format!("repository:{repo}:pull");
        self.seen
            .fetches
            .lock()
            .unwrap()
            .get(&scope)
            .copied()
            .unwrap_or(0)
    }

    fn registry_requests(&self) -> usize {
        self.seen.registry.lock().unwrap().len()
    }

    /// The engine, with the registry's token realm allowed (`realms`) and
    /// `user`'s credentials, if any.
    fn engine(&self, user: Option<(&str, &str)>) -> Engine {
        let mut table = UpstreamTable::default()
            .url(self.registry.as_str())
            .realms([format!("{}/token", self.realm_base)]);
        if let Some((user, password)) = user {
            table = table.username(user).password(password);
        }
        Engine::new(Config::default().upstream_named("test", table))
    }

    fn url(&self, repo: &str) -> reqwest::Url {
        format!("{}/v2/{repo}", self.registry).parse().unwrap()
    }
}

/// One inbound request reading `read`: its status code (or error code), and
/// the reads it was charged.
async fn one_request(engine: &Engine, read: Read) -> (String, u64) {
    let request = engine.begin_request(Caller::Public);
    let operation = request.operation();
    let outcome = operation.upstream().read(read).await;
    let shown = match outcome {
        Ok(response) => response.status.as_u16().to_string(),
        Err(e) => e.code().to_string(),
    };
    (shown, request.budget().used())
}

#[tokio::test]
async fn a_challenge_costs_three_reads_once_then_a_named_scope_costs_one() {
    let s = servers().await;
    let engine = s.engine(None);
    let scoped = |repo: &str| Read::get(s.url(repo)).scope(format!("repository:{repo}:pull"));
    // Cold: the 401, the token fetch, the retry — each charged.
    assert_eq!(one_request(&engine, scoped("a")).await, ("200".into(), 3));
    assert_eq!(s.fetches("a"), 1);
    // Steady state: the kept token goes up front, one request per read.
    let before = s.registry_requests();
    for _ in 0..5 {
        assert_eq!(one_request(&engine, scoped("a")).await, ("200".into(), 1));
    }
    assert_eq!(s.registry_requests() - before, 5);
    assert_eq!(s.fetches("a"), 1, "the token is kept");
    // Another scope on a realm already known: the token first, no 401.
    assert_eq!(one_request(&engine, scoped("b")).await, ("200".into(), 2));
    // A read that does not name its scope: the 401 and the retry (the
    // token kept for its scope).
    assert_eq!(
        one_request(&engine, Read::get(s.url("b"))).await,
        ("200".into(), 2)
    );
    assert_eq!(s.fetches("b"), 1);
    // Anonymous: no credentials ever reached the token service.
    assert!(s.seen.token_auth.lock().unwrap().is_empty());
}

#[tokio::test]
async fn concurrent_requests_on_a_cold_cache_fetch_one_token_per_scope() {
    let s = servers().await;
    let engine = s.engine(Some(("ci", "pw")));
    let reads = (0..100).map(|i| {
        let repo = if i % 2 == 0 { "even" } else { "odd" };
        one_request(
            &engine,
            Read::get(s.url(repo)).scope(format!("repository:{repo}:pull")),
        )
    });
    let outcomes = futures::future::join_all(reads).await;
    assert!(
        outcomes.iter().all(|(status, _)| status == "200"),
        "{outcomes:?}"
    );
    assert_eq!(s.fetches("even"), 1);
    assert_eq!(s.fetches("odd"), 1);
    // Who fetched was charged for it; who waited was not.
    let used: u64 = outcomes.iter().map(|(_, used)| used).sum();
    assert_eq!(used as usize, s.registry_requests() + 2);
    // The credentials went to the configured realm as Basic, twice.
    assert_eq!(
        *s.seen.token_auth.lock().unwrap(),
        vec!["Basic Y2k6cHc="; 2]
    );
}

#[tokio::test]
async fn a_rejected_token_is_fetched_once_more_and_an_endless_challenge_ends() {
    let s = servers().await;
    let engine = s.engine(None);
    let read = || Read::get(s.url("r")).scope("repository:r:pull");
    assert_eq!(one_request(&engine, read()).await.0, "200");
    // The registry forgets every token ("revoked"): the kept one is sent,
    // rejected, dropped, a new one fetched and sent — 3 reads.
    s.seen.valid.lock().unwrap().clear();
    assert_eq!(one_request(&engine, read()).await, ("200".into(), 3));
    assert_eq!(s.fetches("r"), 2);
    // A registry that rejects every token: two rounds, then a coded error.
    s.seen.reject_all.store(true, SeqCst);
    let (code, used) = one_request(&engine, Read::get(s.url("x"))).await;
    assert_eq!(code, "UPSTREAM_UNAUTHORIZED");
    // The 401, a token, the retry (401); the second round's token fetch is
    // answered by the request's de-duplication with the token just
    // rejected: an error, not sent again (a token issued a moment ago and
    // rejected is not worth another).
    assert_eq!(used, 3);
    assert!(s.fetches("x") <= 1);
}

#[tokio::test]
async fn an_expired_token_is_fetched_again_once() {
    let s = servers().await;
    s.seen.expires_in.store(1, SeqCst);
    let engine = s.engine(None);
    let read = || Read::get(s.url("e")).scope("repository:e:pull");
    assert_eq!(one_request(&engine, read()).await.0, "200");
    assert_eq!(one_request(&engine, read()).await, ("200".into(), 1));
    // Kept for 0.9 s (a tenth less than the second it was given).
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    let again = futures::future::join_all((0..10).map(|_| one_request(&engine, read()))).await;
    assert!(again.iter().all(|(status, _)| status == "200"), "{again:?}");
    assert_eq!(s.fetches("e"), 2, "refreshed once for all ten");
}

#[tokio::test]
async fn wrong_credentials_are_one_coded_error() {
    let s = servers().await;
    let engine = s.engine(Some(("ci", "wrong")));
    let (code, used) = one_request(&engine, Read::get(s.url("p"))).await;
    assert_eq!(code, "UPSTREAM_UNAUTHORIZED");
    assert_eq!(used, 2, "the 401 and the refused token fetch, nothing more");
}

#[tokio::test]
async fn a_realm_not_allowed_gets_no_request_and_no_credentials() {
    let s = servers().await;
    // The realm is another origin, not listed for this upstream.
    let table = UpstreamTable::default()
        .url(s.registry.as_str())
        .username("ci")
        .password("pw");
    let engine = Engine::new(Config::default().upstream_named("test", table));
    let (code, used) = one_request(&engine, Read::get(s.url("a"))).await;
    assert_eq!(code, "UPSTREAM_UNAUTHORIZED");
    assert_eq!(used, 1, "the 401 only");
    assert_eq!(s.seen.fetches.lock().unwrap().len(), 0);
    // An upstream without a table: the same.
    let engine = Engine::new(Config::default());
    assert_eq!(
        one_request(&engine, Read::get(s.url("a"))).await.0,
        "UPSTREAM_UNAUTHORIZED"
    );
    assert_eq!(s.seen.fetches.lock().unwrap().len(), 0);
}

#[tokio::test]
async fn basic_credentials_answer_a_basic_challenge_then_go_up_front() {
    let s = servers().await;
    let url: reqwest::Url = format!("{}/basic", s.registry).parse().unwrap();
    let engine = s.engine(Some(("ci", "pw")));
    assert_eq!(
        one_request(&engine, Read::get(url.clone())).await,
        ("200".into(), 2)
    );
    assert_eq!(
        one_request(&engine, Read::get(url.clone())).await,
        ("200".into(), 1)
    );
    let wrong = s.engine(Some(("ci", "nope")));
    assert_eq!(
        one_request(&wrong, Read::get(url.clone())).await,
        ("UPSTREAM_UNAUTHORIZED".into(), 2)
    );
    let none = s.engine(None);
    assert_eq!(
        one_request(&none, Read::get(url)).await,
        ("UPSTREAM_UNAUTHORIZED".into(), 1)
    );
}

#[tokio::test]
async fn a_read_with_its_own_authorization_is_left_alone() {
    let s = servers().await;
    let engine = s.engine(Some(("ci", "pw")));
    let read = Read::get(s.url("a")).header(
        header::AUTHORIZATION,
        header::HeaderValue::from_static("Bearer mine"),
    );
    assert_eq!(one_request(&engine, read).await, ("401".into(), 1));
    assert_eq!(s.seen.fetches.lock().unwrap().len(), 0);
}

#[tokio::test]
async fn a_huge_token_answer_is_an_error_not_a_token() {
    let s = servers().await;
    *s.seen.realm.lock().unwrap() = format!("{}/huge", s.realm_base);
    let table = UpstreamTable::default()
        .url(s.registry.as_str())
        .realms([format!("{}/huge", s.realm_base)]);
    let engine = Engine::new(Config::default().upstream_named("test", table));
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    let err = op.upstream().read(Read::get(s.url("a"))).await.unwrap_err();
    assert_eq!(err.code(), "UPSTREAM_ERROR");
    assert!(
        err.message().contains("larger than 65536 bytes"),
        "{}",
        err.message()
    );
    assert_eq!(request.budget().used(), 2, "the 401 and the token fetch");
}

#[tokio::test]
async fn a_realm_that_redirects_to_another_origin_gets_no_credentials_there() {
    let s = servers().await;
    *s.seen.realm.lock().unwrap() = format!("{}/elsewhere", s.realm_base);
    *s.seen.elsewhere.lock().unwrap() = format!("{}/token2", s.registry);
    let table = UpstreamTable::default()
        .url(s.registry.as_str())
        .username("ci")
        .password("pw")
        .realms([format!("{}/elsewhere", s.realm_base)]);
    let engine = Engine::new(Config::default().upstream_named("test", table));
    let (code, used) = one_request(&engine, Read::get(s.url("a"))).await;
    // The 401, the realm (a redirect), its hop, the retry: each a read.
    assert_eq!((code.as_str(), used), ("200", 4));
    // The credentials went to the allowed realm only, not to the hop.
    assert_eq!(*s.seen.token_auth.lock().unwrap(), Vec::<String>::new());
    assert_eq!(*s.seen.token2_auth.lock().unwrap(), vec![String::new()]);
}

/// A token service that fails (its realm moved, or it is down).
async fn gone() -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, "down").into_response()
}

#[tokio::test]
async fn a_realm_the_transport_would_rewrite_is_refused_and_not_remembered() {
    let s = servers().await;
    let authority = s.realm_base.strip_prefix("http://").unwrap().to_string();
    for hostile in [
        // The challenge's `\@` is `@`: a realm carrying a user.
        format!(r"http://x\@{authority}/token"),
        format!("{}/token#frag", s.realm_base),
    ] {
        let engine = s.engine(Some(("ci", "pw")));
        let read = || Read::get(s.url("w")).scope("repository:w:pull");
        *s.seen.realm.lock().unwrap() = hostile.clone();
        let fetched = s.fetches("w");
        // Refused as the challenge is read, as an off-origin realm is: the
        // 401 only, nothing sent to the realm.
        assert_eq!(
            one_request(&engine, read()).await,
            ("UPSTREAM_UNAUTHORIZED".into(), 1),
            "{hostile}"
        );
        assert_eq!(s.fetches("w"), fetched, "{hostile}");
        // Not remembered: the next challenge (a sound realm) is answered.
        *s.seen.realm.lock().unwrap() = format!("{}/token", s.realm_base);
        assert_eq!(
            one_request(&engine, read()).await,
            ("200".into(), 3),
            "{hostile}"
        );
    }
}

/// The registry names a realm served by `realm` at `/token`, which fails
/// every fetch: the first read is `code` after two requests (the 401, the
/// failed fetch). Then the registry moves its token service to its own
/// origin: the next read sends no credentials, gets the new challenge and
/// follows it (the 401, the fetch, the retry).
async fn a_failing_realm_is_forgotten(realm: Router, code: &str) -> Servers {
    let s = servers().await;
    let realm_at = serve(realm).await;
    let table = UpstreamTable::default()
        .url(s.registry.as_str())
        .realms([format!("{realm_at}/token")]);
    let engine = Engine::new(Config::default().upstream_named("test", table));
    let read = || Read::get(s.url("m")).scope("repository:m:pull");
    *s.seen.realm.lock().unwrap() = format!("{realm_at}/token");
    let (first, used) = one_request(&engine, read()).await;
    assert_eq!((first.as_str(), used), (code, 2));
    *s.seen.realm.lock().unwrap() = format!("{}/token2", s.registry);
    assert_eq!(one_request(&engine, read()).await, ("200".into(), 3));
    s
}

#[tokio::test]
async fn a_remembered_realm_that_fails_is_forgotten_and_the_next_read_starts_clean() {
    let gone = Router::new().route("/token", get(gone));
    let s = a_failing_realm_is_forgotten(gone, "UPSTREAM_ERROR").await;
    assert_eq!(s.seen.token2_auth.lock().unwrap().len(), 1);
}

/// A realm the registry moved away from may refuse everyone (`401`): kept,
/// it would fail every read with a scope before the registry could name
/// its new one. Forgotten like a realm that fails.
#[tokio::test]
async fn a_remembered_realm_that_refuses_everyone_is_forgotten() {
    let refusing = Router::new().route("/token", get(|| async { StatusCode::UNAUTHORIZED }));
    a_failing_realm_is_forgotten(refusing, "UPSTREAM_UNAUTHORIZED").await;
}

#[tokio::test]
async fn a_rejected_token_is_never_kept_again() {
    let s = servers().await;
    let engine = s.engine(None);
    let read = || Read::get(s.url("k")).scope("repository:k:pull");
    // Every token rejected: two rounds, then a coded error.
    s.seen.reject_all.store(true, SeqCst);
    let (code, used) = one_request(&engine, read()).await;
    assert_eq!((code.as_str(), used), ("UPSTREAM_UNAUTHORIZED", 3));
    let rejected: Vec<String> = s.seen.registry.lock().unwrap().clone();
    let rejected: Vec<String> = rejected.into_iter().filter(|a| !a.is_empty()).collect();
    assert!(!rejected.is_empty(), "a token was sent and rejected");
    // The registry takes tokens again: the next request never sends one
    // it rejected (it was not kept from the request's shared answer).
    s.seen.reject_all.store(false, SeqCst);
    let before = s.registry_requests();
    // Its realm was forgotten too: the read starts clean (no credentials,
    // the 401), then a fresh token and the retry.
    assert_eq!(one_request(&engine, read()).await, ("200".into(), 3));
    let after: Vec<String> = s.seen.registry.lock().unwrap()[before..].to_vec();
    for sent in &after {
        assert!(!rejected.contains(sent), "{sent} was rejected: {after:?}");
    }
    assert_eq!(after[0], "", "{after:?}");
    assert_eq!(s.fetches("k"), 2, "a fresh token");
}

/// The servers, a loopback host answering `/big` with 80 bytes, and an
/// engine whose requests keep at most 96 answer bytes: room for `/big`, not
/// for it and a token answer too.
async fn near_the_byte_bound() -> (Servers, String, Engine) {
    let s = servers().await;
    let other = serve(Router::new().route("/big", get(|| async { "x".repeat(80) }))).await;
    let table = UpstreamTable::default()
        .url(s.registry.as_str())
        .realms([format!("{}/token", s.realm_base)]);
    let mut config = Config::default().upstream_named("test", table);
    config.upstream.max_request_bytes = 96;
    (s, other, Engine::new(config))
}

#[tokio::test]
async fn a_request_at_its_own_byte_bound_does_not_make_the_engine_forget_a_good_realm() {
    let (s, other, engine) = near_the_byte_bound().await;
    let scoped = |repo: &str| Read::get(s.url(repo)).scope(format!("repository:{repo}:pull"));
    // Warm: the realm learned, the token for `a` kept: one read each.
    assert_eq!(one_request(&engine, scoped("a")).await, ("200".into(), 3));
    assert_eq!(one_request(&engine, scoped("a")).await, ("200".into(), 1));
    // A client's request spends its own answer bytes (a legal read of
    // another host), then needs a token for a new scope: the token answer
    // passes the request's byte bound — the request's own limit, nothing
    // the realm did.
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    let big = format!("{other}/big").parse().unwrap();
    op.upstream().read(Read::get(big)).await.unwrap();
    let err = op.upstream().read(scoped("b")).await.unwrap_err();
    assert_eq!(err.code(), "UPSTREAM_ERROR", "{err:?}");
    drop(op);
    drop(request);
    // Every other client still reads `a` with its kept token up front: one
    // request. (Forgotten, the realm costs each of them the 401 again.)
    assert_eq!(
        one_request(&engine, scoped("a")).await,
        ("200".into(), 1),
        "a client's own byte bound made the engine forget the registry's realm"
    );
}

/// A token service that refuses one scope the user is not granted (403),
/// as some do, and issues every other.
async fn picky(
    State(seen): State<Arc<Seen>>,
    query: Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if query.get("scope").is_some_and(|s| s.contains("secret")) {
        return StatusCode::FORBIDDEN.into_response();
    }
    token(State(seen), query, headers).await
}

#[tokio::test]
async fn a_scope_the_realm_refuses_does_not_make_the_engine_forget_the_realm() {
    let s = servers().await;
    let picky_at = serve(
        Router::new()
            .route("/token", get(picky))
            .with_state(s.seen.clone()),
    )
    .await;
    let table = UpstreamTable::default()
        .url(s.registry.as_str())
        .realms([format!("{picky_at}/token")]);
    let engine = Engine::new(Config::default().upstream_named("test", table));
    *s.seen.realm.lock().unwrap() = format!("{picky_at}/token");
    let scoped = |repo: &str| Read::get(s.url(repo)).scope(format!("repository:{repo}:pull"));
    assert_eq!(one_request(&engine, scoped("a")).await, ("200".into(), 3));
    assert_eq!(one_request(&engine, scoped("a")).await, ("200".into(), 1));
    // A client asks for a repository the configured user is not granted:
    // its own coded error — the realm answered as it should.
    let (code, _) = one_request(&engine, scoped("secret")).await;
    assert_eq!(code, "UPSTREAM_UNAUTHORIZED");
    // Every other client still sends its kept token up front.
    assert_eq!(
        one_request(&engine, scoped("a")).await,
        ("200".into(), 1),
        "one client's ungranted scope made the engine forget the registry's realm"
    );
}

#[tokio::test]
async fn a_request_at_its_own_byte_bound_does_not_fail_another_requests_token_fetch() {
    let (s, other, engine) = near_the_byte_bound().await;
    let scoped = |repo: &str| Read::get(s.url(repo)).scope(format!("repository:{repo}:pull"));
    assert_eq!(one_request(&engine, scoped("a")).await, ("200".into(), 3));
    // A client's request near its byte bound starts the token fetch for `b`...
    let attacker = async {
        let request = engine.begin_request(Caller::Public);
        let op = request.operation();
        let big = format!("{other}/big").parse().unwrap();
        op.upstream().read(Read::get(big)).await.unwrap();
        op.upstream().read(scoped("b")).await.map(|_| ())
    };
    // ...and another client's read of `b` meets that fetch in flight.
    let victim = async {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while s.fetches("b") == 0 {
            assert!(std::time::Instant::now() < deadline, "no fetch for b");
            tokio::task::yield_now().await;
        }
        one_request(&engine, scoped("b")).await
    };
    let (attacked, victim) = tokio::join!(attacker, victim);
    assert_eq!(attacked.unwrap_err().code(), "UPSTREAM_ERROR");
    assert_eq!(
        victim.0, "200",
        "another request's byte bound failed this request's token fetch"
    );
}
