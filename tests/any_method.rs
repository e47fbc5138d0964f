//! Any upstream call through the acquisition point: a `POST` is sent every
//! time unless the caller names its answer; headers that change the answer
//! tell reads apart; a redirect keeps or drops the method, body and
//! credentials as a browser would.
use fanout_budget::{inbound::Caller, Config, Engine, Read};
use fanout_testkit::MemTransport;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use std::sync::Arc;

fn url(s: &str) -> fanout_budget::reqwest::Url {
    s.parse().unwrap()
}

fn engine(transport: &Arc<MemTransport>) -> Engine {
    Engine::builder(Config::default())
        .transport(transport.clone())
        .build()
}

#[tokio::test]
async fn a_post_is_shared_only_under_a_key_and_headers_tell_reads_apart() {
    let transport = Arc::new(MemTransport::new());
    let engine = engine(&transport);
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    let upstream = op.upstream();
    let query = r#"{"query":"{ book(id: 1) { title } }"}"#;
    let post = || Read::new(Method::POST, url("http://books.test/graphql")).body(query);
    for _ in 0..3 {
        upstream.read(post()).await.unwrap();
    }
    assert_eq!(
        transport.sent().len(),
        3,
        "a POST without a key is never shared"
    );
    for _ in 0..3 {
        upstream.read(post().dedup_key(query)).await.unwrap();
    }
    assert_eq!(transport.sent().len(), 4, "keyed: one POST for the three");
    let sent = transport.sent().pop().unwrap();
    assert_eq!(
        (sent.method(), sent.body_bytes().as_ref()),
        (Method::POST, query.as_bytes())
    );

    let as_user = |token: &'static str| {
        Read::get(url("http://books.test/me"))
            .header(header::AUTHORIZATION, HeaderValue::from_static(token))
    };
    upstream.read(as_user("Bearer alice")).await.unwrap();
    upstream.read(as_user("Bearer bob")).await.unwrap();
    upstream.read(as_user("Bearer alice")).await.unwrap();
    assert_eq!(
        transport.sent().len(),
        6,
        "two users, two reads; the repeat is shared"
    );
    assert_eq!(request.budget().used(), 6);
    assert_eq!(request.budget().counts().dedup_hits, 3);
}

fn moved(status: u16, to: &str) -> (StatusCode, HeaderMap, bytes::Bytes) {
    let mut headers = HeaderMap::new();
    headers.insert(header::LOCATION, to.parse().unwrap());
    (
        StatusCode::from_u16(status).unwrap(),
        headers,
        bytes::Bytes::new(),
    )
}

#[tokio::test]
async fn a_redirect_keeps_or_drops_method_body_and_credentials() {
    let stored = |t: MemTransport,
                  path: &str,
                  (status, headers, body): (StatusCode, HeaderMap, bytes::Bytes)| {
        t.stored(path, status, headers, body)
    };
    let mut t = MemTransport::new();
    t = stored(t, "/see-other", moved(303, "/result"));
    t = stored(t, "/temporary", moved(307, "/again"));
    t = stored(t, "/elsewhere", moved(302, "http://other.test/landing"));
    for path in ["/result", "/again", "/landing"] {
        t = stored(t, path, (StatusCode::OK, HeaderMap::new(), "{}".into()));
    }
    let transport = Arc::new(t);
    let engine = engine(&transport);
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    let auth = HeaderValue::from_static("Bearer s3cret");
    let post = |path: &str| {
        Read::new(Method::POST, url(&format!("http://api.test{path}")))
            .header(header::AUTHORIZATION, auth.clone())
            .body("payload")
    };
    op.upstream().read(post("/see-other")).await.unwrap();
    op.upstream().read(post("/temporary")).await.unwrap();
    let get =
        Read::get(url("http://api.test/elsewhere")).header(header::AUTHORIZATION, auth.clone());
    op.upstream().read(get).await.unwrap();

    let sent = transport.sent();
    let hop = |path: &str| {
        sent.iter()
            .find(|r| r.url().path() == path)
            .unwrap()
            .clone()
    };
    let result = hop("/result");
    assert_eq!(
        (result.method(), result.body_bytes().len()),
        (Method::GET, 0),
        "303: GET, no body"
    );
    assert!(
        result
            .headers()
            .iter()
            .any(|(n, _)| n == header::AUTHORIZATION),
        "same origin keeps it"
    );
    let again = hop("/again");
    assert_eq!(
        (again.method(), again.body_bytes().as_ref()),
        (Method::POST, &b"payload"[..]),
        "307 keeps both"
    );
    let landing = hop("/landing");
    assert_eq!(landing.url().host_str(), Some("other.test"));
    assert!(
        landing
            .headers()
            .iter()
            .all(|(n, _)| n != header::AUTHORIZATION),
        "another origin never sees the credentials"
    );
    assert_eq!(request.budget().used(), 6, "every hop a charged read");
}

#[tokio::test]
async fn a_get_with_a_body_answers_by_its_body() {
    let transport = Arc::new(MemTransport::new());
    let engine = engine(&transport);
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    let search = |query: &'static str| Read::get(url("http://search.test/_search")).body(query);
    op.upstream()
        .read(search(r#"{"q":"alice"}"#))
        .await
        .unwrap();
    op.upstream().read(search(r#"{"q":"bob"}"#)).await.unwrap();
    op.upstream()
        .read(search(r#"{"q":"alice"}"#))
        .await
        .unwrap();
    assert_eq!(
        transport.sent().len(),
        2,
        "two searches, two reads; the repeat shared"
    );
}

#[tokio::test]
async fn redirects_follow_browser_rules_and_carry_nothing_across_origins() {
    let mut t = MemTransport::new();
    for (path, status, to) in [
        ("/submit-303", 303, "/submit-303"), // post/redirect/get to its own URL
        ("/moved-301", 301, "/landing"),     // a POST becomes a GET
        ("/permanent-308", 308, "/landing-308"), // method and body kept
        ("/away-307", 307, "http://evil.test/take"), // a body never leaves its origin
        ("/away-302", 302, "http://other.test/page"),
    ] {
        let (status, headers, body) = moved(status, to);
        t = t.stored(path, status, headers, body);
    }
    for path in ["/landing", "/landing-308", "/page"] {
        t = t.stored(path, StatusCode::OK, HeaderMap::new(), "{}".into());
    }
    // `/submit-303` answered again, now to the GET: 200.
    let transport = Arc::new(t);
    let engine = engine(&transport);
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    let key = header::HeaderName::from_static("x-api-key");
    let post = |path: &str| {
        Read::new(Method::POST, url(&format!("http://api.test{path}")))
            .header(key.clone(), HeaderValue::from_static("k3y"))
            .body("payload")
    };
    // PRG to the same URL is no loop: the GET finds the same stored 303
    // and its own URL in the chain, which is.
    let err = op.upstream().read(post("/submit-303")).await.unwrap_err();
    assert!(err.message().contains("redirect loop"), "{}", err.message());
    assert_eq!(
        transport.sent().len(),
        2,
        "the POST and its GET were both sent"
    );
    assert_eq!(transport.sent()[1].method(), Method::GET);

    op.upstream().read(post("/moved-301")).await.unwrap();
    let landing = transport.sent().pop().unwrap();
    assert_eq!(
        (landing.method(), landing.body_bytes().len()),
        (Method::GET, 0)
    );

    op.upstream().read(post("/permanent-308")).await.unwrap();
    let kept = transport.sent().pop().unwrap();
    assert_eq!(
        (kept.method(), kept.body_bytes().as_ref()),
        (Method::POST, &b"payload"[..])
    );

    let err = op.upstream().read(post("/away-307")).await.unwrap_err();
    assert_eq!(err.code(), "UPSTREAM_ERROR");
    assert!(transport
        .sent()
        .iter()
        .all(|r| r.url().host_str() != Some("evil.test")));

    let get = Read::get(url("http://api.test/away-302"))
        .header(key.clone(), HeaderValue::from_static("k3y"))
        .header(header::COOKIE, HeaderValue::from_static("s=1"))
        .accept(HeaderValue::from_static("application/json"));
    op.upstream().read(get).await.unwrap();
    let other = transport.sent().pop().unwrap();
    assert_eq!(other.url().host_str(), Some("other.test"));
    let names: Vec<_> = other
        .headers()
        .iter()
        .map(|(n, _)| n.as_str().to_string())
        .collect();
    assert_eq!(
        names,
        ["accept"],
        "only what describes the content crosses origins"
    );
}
