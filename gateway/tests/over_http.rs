//! GraphQL over HTTP as clients speak it: GET, media types and their status
//! codes, CSRF prevention, persisted queries and CORS — each checked
//! against the registry the gateway reads, so "nothing ran" is a count of
//! zero upstream reads, not a guess.

mod common;

use axum::body::Body;
use common::Fixture;
use fanout_budget::config::CsrfGet;
use fanout_budget::Config;
use fanout_testkit::{call, Answer, PEER};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const GRAPHQL_RESPONSE: &str = "application/graphql-response+json";
const REPO: &str = r#"{ repository(name: "acme/app") { name tags(first: 2) { nodes { name } } } }"#;

/// Sends one request to the gateway in process, from the test peer.
async fn send(
    fixture: &Fixture,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut request = http::Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut request = request.body(Body::from(body.to_string())).unwrap();
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo::<std::net::SocketAddr>(
            PEER.parse().unwrap(),
        ));
    call(&fixture.gateway.router, request).await
}

fn get_uri(params: &[(&str, &str)]) -> String {
    let query: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params)
        .finish();
    format!("/graphql?{query}")
}

fn code(body: &Value) -> &str {
    body["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or("")
}

fn content_type(answer: &Answer) -> &str {
    answer.headers[http::header::CONTENT_TYPE].to_str().unwrap()
}

#[tokio::test]
async fn a_get_runs_a_query_with_variables_and_its_operation_name() {
    let fixture = Fixture::default().await;
    let query = "query Other { fanoutBudget { used } } query Repo($name: String!) { repository(name: $name) { name } }";
    let uri = get_uri(&[
        ("query", query),
        ("operationName", "Repo"),
        ("variables", r#"{"name":"acme/app"}"#),
    ]);
    for accept in [GRAPHQL_RESPONSE, "application/json", "*/*"] {
        let answer = send(&fixture, "GET", &uri, &[("accept", accept)], "").await;
        assert_eq!(answer.status, 200, "{accept}: {:?}", answer.body);
        assert_eq!(answer.json()["data"]["repository"]["name"], "acme/app");
        let expected = if accept == GRAPHQL_RESPONSE {
            GRAPHQL_RESPONSE
        } else {
            "application/json"
        };
        assert!(content_type(&answer).starts_with(expected), "{accept}");
    }
    // Three requests, one tag list each.
    assert_eq!(fixture.reads(), 3);
}

#[tokio::test]
async fn a_get_is_bounded_like_a_body() {
    let mut config = Config::default();
    config.http.max_body_bytes = 1024;
    let fixture = Fixture::new(config).await;
    // Aliases padded past the bound, in the URL instead of a body.
    let padded = format!("{{ {} }}", "a: fanoutBudget { used } ".repeat(60));
    let answer = send(&fixture, "GET", &get_uri(&[("query", &padded)]), &[], "").await;
    assert_eq!(answer.status, 413);
    assert_eq!(code(&answer.json()), "PAYLOAD_TOO_LARGE");
    let answer = send(&fixture, "GET", &get_uri(&[("query", REPO)]), &[], "").await;
    assert_eq!(answer.status, 200);
}

#[tokio::test]
async fn a_mutation_over_get_is_405_and_reads_nothing() {
    let fixture = Fixture::default().await;
    for query in ["mutation { __typename }", "subscription { __typename }"] {
        let answer = send(&fixture, "GET", &get_uri(&[("query", query)]), &[], "").await;
        assert_eq!(answer.status, 405, "{query}");
        assert_eq!(answer.headers[http::header::ALLOW], "POST");
        assert_eq!(code(&answer.json()), "BAD_REQUEST");
    }
    // A query and a mutation in one document: the one named decides.
    let both = format!("query Q {REPO} mutation M {{ __typename }}");
    let answer = send(
        &fixture,
        "GET",
        &get_uri(&[("query", &both), ("operationName", "M")]),
        &[],
        "",
    )
    .await;
    assert_eq!(answer.status, 405);
    assert_eq!(fixture.reads(), 0);
    let answer = send(&fixture, "PUT", "/graphql", &[], "{}").await;
    assert_eq!(answer.status, 405);
    assert_eq!(answer.headers[http::header::ALLOW], "GET, POST");
}

#[tokio::test]
async fn request_errors_are_400_without_data_under_graphql_response_json() {
    let fixture = Fixture::default().await;
    let cases = [
        (json!({"query": "{"}), "GRAPHQL_PARSE_FAILED"),
        (json!({"query": "{ nope }"}), "GRAPHQL_VALIDATION_FAILED"),
        (
            json!({"query": "query($n: String!) { repository(name: $n) { name } }"}),
            "BAD_USER_INPUT",
        ),
        (
            json!({"query": "query($n: String!) { repository(name: $n) { name } }", "variables": {"n": null}}),
            "BAD_USER_INPUT",
        ),
        (
            json!({"query": "query($n: String!) { repository(name: $n) { name } }", "variables": {"n": 5}}),
            "BAD_USER_INPUT",
        ),
        (
            json!({"query": format!("query A {REPO} query B {REPO}")}),
            "OPERATION_RESOLUTION_FAILURE",
        ),
        (
            json!({"query": REPO, "operationName": "Missing"}),
            "OPERATION_RESOLUTION_FAILURE",
        ),
    ];
    for (body, expected) in &cases {
        let json = [
            ("content-type", "application/json"),
            ("accept", GRAPHQL_RESPONSE),
        ];
        let answer = send(&fixture, "POST", "/graphql", &json, &body.to_string()).await;
        let answer_body = answer.json();
        assert_eq!(answer.status, 400, "{body}: {answer_body}");
        assert!(answer_body.get("data").is_none(), "{body}: {answer_body}");
        assert_eq!(code(&answer_body), *expected, "{body}: {answer_body}");
        // The legacy media type: 200 and `data: null`.
        let legacy = [
            ("content-type", "application/json"),
            ("accept", "application/json"),
        ];
        let answer = send(&fixture, "POST", "/graphql", &legacy, &body.to_string()).await;
        let answer_body = answer.json();
        assert_eq!(answer.status, 200, "{body}");
        assert!(answer_body["data"].is_null(), "{body}: {answer_body}");
        assert_eq!(code(&answer_body), *expected, "{body}: {answer_body}");
    }
    assert_eq!(fixture.reads(), 0, "nothing of a refused operation ran");
    // An answer with data is 200 under either media type, field errors and all.
    let json = [
        ("content-type", "application/json"),
        ("accept", GRAPHQL_RESPONSE),
    ];
    let bad_first = r#"{ repository(name: "acme/app") { tags(first: 0) { totalCount } } }"#;
    let answer = send(
        &fixture,
        "POST",
        "/graphql",
        &json,
        &json!({ "query": bad_first }).to_string(),
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.json());
    assert!(answer.json().get("data").is_some());
}

#[tokio::test]
async fn nothing_acceptable_is_406_and_the_page_is_for_browsers() {
    let fixture = Fixture::default().await;
    let uri = get_uri(&[("query", REPO)]);
    let answer = send(&fixture, "GET", &uri, &[("accept", "text/html")], "").await;
    assert_eq!(answer.status, 406);
    let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
    // With a query in the URL a browser gets the answer, as JSON.
    let answer = send(&fixture, "GET", &uri, &[("accept", browser)], "").await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json()["data"]["repository"]["name"], "acme/app");
    // Without one, the page.
    let answer = send(&fixture, "GET", "/graphql", &[("accept", browser)], "").await;
    assert_eq!(answer.status, 200);
    assert!(content_type(&answer).starts_with("text/html"));
    assert!(answer
        .headers
        .contains_key(http::header::CONTENT_SECURITY_POLICY));
    // A client without a query gets a 400, not a page.
    for accept in ["application/json", GRAPHQL_RESPONSE, "*/*"] {
        let answer = send(&fixture, "GET", "/graphql", &[("accept", accept)], "").await;
        assert_eq!(answer.status, 400, "{accept}");
        assert_eq!(code(&answer.json()), "BAD_REQUEST");
    }
    assert_eq!(fixture.reads(), 1);
}

#[tokio::test]
async fn a_body_a_page_could_send_cross_site_is_refused_before_it_runs() {
    let fixture = Fixture::default().await;
    let body = json!({ "query": REPO }).to_string();
    for content_type in [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let answer = send(
            &fixture,
            "POST",
            "/graphql",
            &[("content-type", content_type)],
            &body,
        )
        .await;
        assert_eq!(answer.status, 400, "{content_type}");
        assert_eq!(code(&answer.json()), "BAD_REQUEST");
        // Refused from the headers: the body is not read.
        assert_eq!(answer.headers[http::header::CONNECTION], "close");
        // A client that announces itself is past CSRF, but still not JSON.
        let announced = [
            ("content-type", content_type),
            ("apollo-require-preflight", "true"),
        ];
        let answer = send(&fixture, "POST", "/graphql", &announced, &body).await;
        assert_eq!(answer.status, 415, "{content_type}");
    }
    let answer = send(&fixture, "POST", "/graphql", &[], &body).await;
    assert_eq!(answer.status, 400, "no content type");
    assert_eq!(fixture.reads(), 0);
    let json = [("content-type", "application/json; charset=utf-8")];
    let answer = send(&fixture, "POST", "/graphql", &json, &body).await;
    assert_eq!(answer.status, 200);
    assert_eq!(fixture.reads(), 1);
}

fn sha256(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn persisted(hash: &str) -> Value {
    json!({ "persistedQuery": { "version": 1, "sha256Hash": hash } })
}

#[tokio::test]
async fn persisted_queries_follow_apollos_protocol() {
    let fixture = Fixture::default().await;
    let hash = sha256(REPO);
    let post = |body: Value, accept: &'static str| {
        let fixture = &fixture;
        async move {
            let headers = [("content-type", "application/json"), ("accept", accept)];
            send(fixture, "POST", "/graphql", &headers, &body.to_string()).await
        }
    };
    // Unknown hash: not found, nothing read, under either media type.
    let answer = post(
        json!({ "extensions": persisted(&hash) }),
        "application/json",
    )
    .await;
    assert_eq!(answer.status, 200);
    let body = answer.json();
    assert_eq!(code(&body), "PERSISTED_QUERY_NOT_FOUND");
    assert_eq!(body["errors"][0]["message"], "PersistedQueryNotFound");
    let answer = post(json!({ "extensions": persisted(&hash) }), GRAPHQL_RESPONSE).await;
    assert_eq!(answer.status, 400);
    assert_eq!(code(&answer.json()), "PERSISTED_QUERY_NOT_FOUND");
    assert_eq!(fixture.reads(), 0);
    // A text under another text's hash is refused and not kept.
    let other = sha256("{ fanoutBudget { used } }");
    let answer = post(
        json!({ "query": REPO, "extensions": persisted(&other) }),
        "application/json",
    )
    .await;
    assert_eq!(code(&answer.json()), "PERSISTED_QUERY_HASH_MISMATCH");
    let answer = post(
        json!({ "extensions": persisted(&other) }),
        "application/json",
    )
    .await;
    assert_eq!(code(&answer.json()), "PERSISTED_QUERY_NOT_FOUND");
    assert_eq!(fixture.reads(), 0);
    // The text with its hash runs and registers it.
    let answer = post(
        json!({ "query": REPO, "extensions": persisted(&hash) }),
        "application/json",
    )
    .await;
    assert_eq!(answer.json()["data"]["repository"]["name"], "acme/app");
    assert_eq!(fixture.reads(), 1);
    // Then the hash alone, over GET (Apollo's useGETForHashedQueries).
    let uri = get_uri(&[("extensions", &persisted(&hash).to_string())]);
    let answer = send(&fixture, "GET", &uri, &[("accept", GRAPHQL_RESPONSE)], "").await;
    assert_eq!(answer.status, 200, "{:?}", answer.json());
    assert_eq!(answer.json()["data"]["repository"]["name"], "acme/app");
    // And in a batch, each operation on its own: a known hash runs, an
    // unknown one is not found; one tag list for the batch.
    let unknown = sha256("{ fanoutBudget { limit } }");
    let batch = json!([
        { "extensions": persisted(&hash) },
        { "extensions": persisted(&unknown) },
        { "query": REPO },
    ]);
    let answer = post(batch, GRAPHQL_RESPONSE).await;
    assert_eq!(answer.status, 200);
    let answers = answer.json();
    assert_eq!(answers[0]["data"]["repository"]["name"], "acme/app");
    assert_eq!(code(&answers[1]), "PERSISTED_QUERY_NOT_FOUND");
    assert!(answers[1].get("data").is_none());
    assert_eq!(answers[2]["data"], answers[0]["data"]);
    assert_eq!(fixture.reads(), 3);
    // A persisted mutation is still no GET.
    let mutation = "mutation { __typename }";
    post(
        json!({ "query": mutation, "extensions": persisted(&sha256(mutation)) }),
        "application/json",
    )
    .await;
    let uri = get_uri(&[("extensions", &persisted(&sha256(mutation)).to_string())]);
    assert_eq!(send(&fixture, "GET", &uri, &[], "").await.status, 405);
}

#[tokio::test]
async fn persisted_queries_can_be_turned_off() {
    let mut config = Config::default();
    config.http.persisted_queries_bytes = 0;
    let fixture = Fixture::new(config).await;
    let hash = sha256(REPO);
    let json = [("content-type", "application/json")];
    let hash_only = json!({ "extensions": persisted(&hash) }).to_string();
    let answer = send(&fixture, "POST", "/graphql", &json, &hash_only).await;
    assert_eq!(code(&answer.json()), "PERSISTED_QUERY_NOT_SUPPORTED");
    // With its text a request still runs.
    let full = json!({ "query": REPO, "extensions": persisted(&hash) }).to_string();
    let answer = send(&fixture, "POST", "/graphql", &json, &full).await;
    assert_eq!(answer.json()["data"]["repository"]["name"], "acme/app");
}

#[tokio::test]
async fn cors_allows_exactly_the_configured_origins_and_preflights_cost_nothing() {
    let preflight = |origin: &'static str| {
        [
            ("origin", origin),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "content-type"),
        ]
    };
    // Default: no CORS headers at all.
    let fixture = Fixture::default().await;
    let answer = send(
        &fixture,
        "OPTIONS",
        "/graphql",
        &preflight("https://app.example"),
        "",
    )
    .await;
    assert!(!answer
        .headers
        .contains_key(http::header::ACCESS_CONTROL_ALLOW_ORIGIN));

    let mut config = Config::default();
    config.http.cors_allowed_origins = vec!["https://app.example".into()];
    config.rate_limit.requests_per_minute = 1;
    let fixture = Fixture::new(config).await;
    for _ in 0..3 {
        let answer = send(
            &fixture,
            "OPTIONS",
            "/graphql",
            &preflight("https://app.example"),
            "",
        )
        .await;
        assert!(answer.status.is_success(), "{:?}", answer.status);
        assert_eq!(
            answer.headers[http::header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://app.example"
        );
        let allowed = answer.headers[http::header::ACCESS_CONTROL_ALLOW_HEADERS]
            .to_str()
            .unwrap()
            .to_ascii_lowercase();
        assert!(allowed.contains("content-type"), "{allowed}");
    }
    let answer = send(
        &fixture,
        "OPTIONS",
        "/graphql",
        &preflight("https://evil.example"),
        "",
    )
    .await;
    assert!(!answer
        .headers
        .contains_key(http::header::ACCESS_CONTROL_ALLOW_ORIGIN));
    // The preflights were not counted: the one request a minute is still there.
    let headers = [
        ("origin", "https://app.example"),
        ("content-type", "application/json"),
    ];
    let body = json!({ "query": REPO }).to_string();
    let answer = send(&fixture, "POST", "/graphql", &headers, &body).await;
    assert_eq!(answer.status, 200, "{:?}", answer.json());
    assert_eq!(
        answer.headers[http::header::ACCESS_CONTROL_ALLOW_ORIGIN],
        "https://app.example"
    );
    // The next is limited, and a page on the allowed origin can read why.
    let answer = send(&fixture, "POST", "/graphql", &headers, &body).await;
    assert_eq!(answer.status, 429);
    let exposed = answer.headers[http::header::ACCESS_CONTROL_EXPOSE_HEADERS]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(exposed.contains("retry-after"), "{exposed}");
    assert_eq!(fixture.reads(), 1);
}

#[test]
fn a_bad_origin_stops_start_up_naming_the_key() {
    let err = Config::from_toml("[http]\ncors_allowed_origins = [\"https://app.example/path\"]")
        .unwrap_err();
    assert_eq!(err.key(), Some("http.cors_allowed_origins"), "{err}");
}

// ---- review-16: attacks ----

/// The GraphiQL assets' route is mounted outside the rate limiter, and it is
/// the GraphQL service itself: anything but a `GET` there is a GraphQL
/// request, run with no rate limit at all.
#[tokio::test]
async fn the_graphiql_assets_route_runs_no_operation_outside_the_rate_limiter() {
    let mut config = Config::default();
    config.rate_limit.requests_per_minute = 1;
    let fixture = Fixture::new(config).await;
    let json = [("content-type", "application/json")];
    let body = json!({ "query": REPO }).to_string();
    for _ in 0..3 {
        let answer = send(&fixture, "POST", "/graphql/graphiql/x", &json, &body).await;
        assert!(
            answer.json().get("data").is_none(),
            "an operation ran on the assets' route: {} {:?}",
            answer.status,
            answer.json()
        );
    }
    assert_eq!(fixture.reads(), 0, "reads made outside the rate limiter");
    // The one request a minute is still the client's.
    let answer = send(&fixture, "POST", "/graphql", &json, &body).await;
    assert_eq!(answer.status, 200, "{:?}", answer.json());
}

/// The spec's variable coercion (CoerceVariableValues): an explicit `null`
/// for a variable of a non-null type is a request error even when the
/// variable has a default (the default is for a value *not provided*).
#[tokio::test]
async fn an_explicit_null_for_a_non_null_variable_with_a_default_is_a_request_error() {
    let fixture = Fixture::default().await;
    let headers = [
        ("content-type", "application/json"),
        ("accept", GRAPHQL_RESPONSE),
    ];
    let cases = [
        json!({"query": "query($n: String! = \"acme/app\") { repository(name: $n) { name } }", "variables": {"n": null}}),
        json!({"query": "query($f: Int! = 2) { repository(name: \"acme/app\") { tags(first: $f) { totalCount } } }", "variables": {"f": null}}),
    ];
    for body in &cases {
        let answer = send(&fixture, "POST", "/graphql", &headers, &body.to_string()).await;
        let answer_body = answer.json();
        assert_eq!(answer.status, 400, "{body}: {answer_body}");
        assert!(answer_body.get("data").is_none(), "{body}: {answer_body}");
        assert_eq!(
            code(&answer_body),
            "BAD_USER_INPUT",
            "{body}: {answer_body}"
        );
    }
    assert_eq!(fixture.reads(), 0);
}

/// Held (kept as a regression): variables of the wrong type, used or not,
/// are request errors before anything runs.
#[tokio::test]
async fn variables_of_the_wrong_type_are_request_errors() {
    let fixture = Fixture::default().await;
    let headers = [
        ("content-type", "application/json"),
        ("accept", GRAPHQL_RESPONSE),
    ];
    let cases = [
        json!({"query": "query($n: Int!) { repository(name: \"acme/app\") { name } }", "variables": {"n": "x"}}),
        json!({"query": "query($n: String!) { repository(name: $n) { name } }", "variables": {"n": ["acme/app"]}}),
        json!({"query": "query($f: Int!) { repository(name: \"acme/app\") { tags(first: $f) { totalCount } } }", "variables": {"f": 1.5}}),
        json!({"query": "query($n: String) { repository(name: \"acme/app\") { tag(name: $n) { name } } }", "variables": {"n": {"a": 1}}}),
    ];
    for body in &cases {
        let answer = send(&fixture, "POST", "/graphql", &headers, &body.to_string()).await;
        let answer_body = answer.json();
        assert_eq!(answer.status, 400, "{body}: {answer_body}");
        assert!(answer_body.get("data").is_none(), "{body}: {answer_body}");
    }
    assert_eq!(fixture.reads(), 0);
}

/// Held (kept as a regression): every spelling of a type a page can send
/// without a preflight is refused from the headers, and an empty
/// announcing header announces nothing.
#[tokio::test]
async fn every_spelling_of_a_simple_content_type_is_refused() {
    let fixture = Fixture::default().await;
    let body = json!({ "query": REPO }).to_string();
    for content_type in [
        "TEXT/PLAIN",
        "  text/plain  ",
        "text/plain;application/json",
        "text/plain; charset=utf-8, application/json",
        "text/plain ; boundary=application/json",
        "Application/X-WWW-Form-Urlencoded;charset=UTF-8",
        "Multipart/Form-Data; boundary=--x",
        "",
    ] {
        for extra in [
            None,
            Some(("apollo-require-preflight", "")),
            Some(("x-apollo-operation-name", "")),
        ] {
            let mut headers = vec![("content-type", content_type)];
            headers.extend(extra);
            let answer = send(&fixture, "POST", "/graphql", &headers, &body).await;
            assert_eq!(answer.status, 400, "{content_type:?} {extra:?}");
            assert_eq!(code(&answer.json()), "BAD_REQUEST");
        }
    }
    // Not UTF-8: no essence to trust, refused as simple.
    let mut request = http::Request::post("/graphql")
        .header(
            "content-type",
            http::HeaderValue::from_bytes(b"text/plain; x=\xff").unwrap(),
        )
        .body(Body::from(body.clone()))
        .unwrap();
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo::<std::net::SocketAddr>(
            PEER.parse().unwrap(),
        ));
    assert_eq!(call(&fixture.gateway.router, request).await.status, 400);
    assert_eq!(fixture.reads(), 0);
}

/// Held (kept as a regression): JSON nested past serde_json's recursion
/// limit, in a GET's parameters or a POST's body, is a 400, not a stack
/// overflow.
#[tokio::test]
async fn deeply_nested_variables_and_extensions_are_a_400() {
    let fixture = Fixture::default().await;
    let deep = format!("{{\"a\":{}{}}}", "[".repeat(5_000), "]".repeat(5_000));
    for key in ["variables", "extensions"] {
        let uri = get_uri(&[("query", REPO), (key, &deep)]);
        let answer = send(&fixture, "GET", &uri, &[], "").await;
        assert_eq!(answer.status, 400, "GET {key}");
        let body = format!("{{\"query\":{},\"{key}\":{deep}}}", json!(REPO));
        let json = [("content-type", "application/json")];
        let answer = send(&fixture, "POST", "/graphql", &json, &body).await;
        assert_eq!(answer.status, 400, "POST {key}");
    }
    assert_eq!(fixture.reads(), 0);
}

/// Held (kept as a regression): with CORS on, tower-http answers *every*
/// `OPTIONS` itself (preflight or not, any origin, any path), before the
/// rate limiter: an empty 200 that runs nothing. With CORS off an `OPTIONS`
/// reaches the endpoint: rate limited, 405.
#[tokio::test]
async fn an_options_runs_nothing_with_or_without_cors() {
    let body = json!({ "query": REPO }).to_string();
    let headers = [
        ("origin", "https://evil.example"),
        ("content-type", "application/json"),
    ];
    let mut config = Config::default();
    config.http.cors_allowed_origins = vec!["https://app.example".into()];
    config.rate_limit.requests_per_minute = 1;
    let fixture = Fixture::new(config.clone()).await;
    for _ in 0..3 {
        let answer = send(&fixture, "OPTIONS", "/graphql", &headers, &body).await;
        assert_eq!(answer.status, 200);
        assert!(answer.body.is_empty());
        assert!(!answer
            .headers
            .contains_key(http::header::ACCESS_CONTROL_ALLOW_ORIGIN));
    }
    assert_eq!(fixture.reads(), 0);
    config.http.cors_allowed_origins = Vec::new();
    let fixture = Fixture::new(config).await;
    let answer = send(&fixture, "OPTIONS", "/graphql", &headers, &body).await;
    assert_eq!(answer.status, 405);
    let answer = send(&fixture, "OPTIONS", "/graphql", &headers, &body).await;
    assert_eq!(answer.status, 429);
    assert_eq!(fixture.reads(), 0);
}

/// The gateway ships `http.csrf_get = "allow"` (`app::defaults`: it has no
/// ambient credentials): a plain `GET` — as urql sends its queries, as a
/// link would — runs. Configured `require_preflight` (the library's
/// default), the same `GET` is refused before any read, and a GraphQL
/// client's `GET` runs.
#[tokio::test]
async fn the_gateway_runs_a_plain_get_unless_configured_to_require_a_preflight() {
    let uri = get_uri(&[("query", REPO)]);
    let fixture = Fixture::default().await;
    assert_eq!(
        fixture.gateway.engine.config().http.csrf_get,
        Some(CsrfGet::Allow)
    );
    let answer = send(&fixture, "GET", &uri, &[], "").await;
    assert_eq!(answer.status, 200, "{:?}", answer.json());
    assert_eq!(answer.json()["data"]["repository"]["name"], "acme/app");

    let mut config = Config::default();
    config.http.csrf_get = Some(CsrfGet::RequirePreflight);
    let strict = Fixture::new(config).await;
    let reads = strict.reads();
    for headers in [&[][..], &[("accept", GRAPHQL_RESPONSE)]] {
        let answer = send(&strict, "GET", &uri, headers, "").await;
        assert_eq!(answer.status, 400, "{headers:?}: {:?}", answer.json());
        assert_eq!(code(&answer.json()), "BAD_REQUEST");
    }
    assert_eq!(strict.reads(), reads, "a refused GET read");
    let answer = send(
        &strict,
        "GET",
        &uri,
        &[("apollo-require-preflight", "true")],
        "",
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.json());
    assert_eq!(answer.json()["data"]["repository"]["name"], "acme/app");
}
