use super::*;
use async_graphql::ErrorExtensionValues;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

fn accept(value: &str) -> Option<Media> {
    negotiate(&headers(&[("accept", value)]))
}

#[test]
fn accept_picks_the_media_type() {
    use Media::*;
    assert_eq!(negotiate(&HeaderMap::new()), Some(Json));
    assert_eq!(
        accept("application/graphql-response+json"),
        Some(GraphQLResponse)
    );
    assert_eq!(accept("application/json"), Some(Json));
    assert_eq!(accept("*/*"), Some(Json));
    assert_eq!(accept("application/*"), Some(Json));
    // urql's default, and Apollo Client 4's.
    assert_eq!(
        accept("application/graphql-response+json, application/graphql+json, application/json, text/event-stream, multipart/mixed"),
        Some(GraphQLResponse)
    );
    assert_eq!(
        accept("application/graphql-response+json,application/json;q=0.9"),
        Some(GraphQLResponse)
    );
    assert_eq!(
        accept("application/graphql-response+json;q=0.5, application/json"),
        Some(Json)
    );
    // Named exactly beats a wildcard of the same quality.
    assert_eq!(
        accept("*/*, application/graphql-response+json"),
        Some(GraphQLResponse)
    );
    // A browser's navigation, with a query in the URL: the wildcard.
    assert_eq!(
        accept("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"),
        Some(Json)
    );
    assert_eq!(accept("text/html"), None);
    assert_eq!(accept("application/json;q=0"), None);
    assert_eq!(accept("application/json; charset=latin1"), None);
    assert_eq!(accept("application/json; charset=utf-8"), Some(Json));
    assert_eq!(accept(""), None);
}

#[test]
fn the_page_is_for_a_browser_without_a_query() {
    let browser = headers(&[("accept", "text/html,application/xhtml+xml,*/*;q=0.8")]);
    assert!(wants_page(&browser, None));
    assert!(wants_page(&browser, Some("theme=dark")));
    assert!(!wants_page(&browser, Some("query=%7B__typename%7D")));
    assert!(!wants_page(&browser, Some("extensions=%7B%7D")));
    assert!(!wants_page(&headers(&[("accept", "*/*")]), None));
    assert!(!wants_page(&headers(&[("accept", "text/html;q=0")]), None));
    assert!(!wants_page(&HeaderMap::new(), None));
}

#[test]
fn a_body_a_browser_sends_without_preflight_is_refused() {
    for content_type in [
        None,
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("Multipart/Form-Data; boundary=x"),
    ] {
        let h = match content_type {
            Some(ct) => headers(&[("content-type", ct)]),
            None => HeaderMap::new(),
        };
        let err = check_preflighted(&h).unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST, "{content_type:?}");
        assert_eq!(err.code(), "BAD_REQUEST");
        // A client that says it is one (a header a page cannot add
        // without a preflight) passes.
        let mut announced = h.clone();
        announced.insert("apollo-require-preflight", HeaderValue::from_static("true"));
        assert!(check_preflighted(&announced).is_ok());
        let mut empty = h.clone();
        empty.insert("apollo-require-preflight", HeaderValue::from_static(""));
        assert!(
            check_preflighted(&empty).is_err(),
            "an empty header is none"
        );
    }
    assert!(check_preflighted(&headers(&[("content-type", "application/json")])).is_ok());
}

#[test]
fn a_post_body_must_be_json() {
    let ok = |ct: &str| check_json_body(&headers(&[("content-type", ct)]));
    assert!(ok("application/json").is_ok());
    assert!(ok("Application/JSON; charset=utf-8").is_ok());
    assert_eq!(
        ok("application/json; charset=latin1").unwrap_err().status(),
        415
    );
    assert_eq!(ok("application/graphql").unwrap_err().status(), 415);
    assert_eq!(ok("text/plain").unwrap_err().status(), 400);
    // Announced, a simple type is still not JSON.
    let announced = headers(&[
        ("content-type", "text/plain"),
        ("x-apollo-operation-name", "Q"),
    ]);
    assert_eq!(check_json_body(&announced).unwrap_err().status(), 415);
}

fn single(body: &str) -> Result<Request, Rejection> {
    match parse_body(body.as_bytes(), 20)? {
        BatchRequest::Single(request) => Ok(request),
        BatchRequest::Batch(_) => panic!("a batch"),
    }
}

#[test]
fn each_parameter_has_its_type() {
    assert!(
        single(r#"{"query":"{a}","variables":null,"operationName":null,"extensions":null}"#)
            .is_ok()
    );
    let request = single(r#"{"query":"query Q($x: Int) {a}","variables":{"x":1},"operationName":"Q","extensions":{"k":"v"}}"#).unwrap();
    assert_eq!(request.operation_name.as_deref(), Some("Q"));
    assert_eq!(request.variables.len(), 1);
    assert!(request.extensions.contains_key("k"));
    for bad in [
        r#"{"query":{"obj":"ect"}}"#,
        r#"{"query":0}"#,
        r#"{"query":false}"#,
        r#"{"query":["array"]}"#,
        r#"{"query":"{a}","variables":"string"}"#,
        r#"{"query":"{a}","variables":0}"#,
        r#"{"query":"{a}","variables":["array"]}"#,
        r#"{"query":"{a}","extensions":"string"}"#,
        r#"{"query":"{a}","extensions":false}"#,
        r#"{"query":"{a}","operationName":0}"#,
        r#"{"qeury":"{a}"}"#,
        r#"{"query":"  "}"#,
        r#"{ "not a JSON"#,
        r#""#,
        r#"[]"#,
    ] {
        let err = parse_body(bad.as_bytes(), 20).unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    // A persisted query may come without its text.
    let hash_only = r#"{"extensions":{"persistedQuery":{"version":1,"sha256Hash":"00"}}}"#;
    assert_eq!(single(hash_only).unwrap().query, "");
    assert_eq!(
        parse_body(br#"[{"query":"{a}"},{"query":"{b}"},{"query":"{c}"}]"#, 2).unwrap_err(),
        Rejection::BatchTooLarge { max: 2 }
    );
}

#[test]
fn a_get_carries_its_parameters_in_the_query_string() {
    let request = parse_query_string(
        "query=query%20Q(%24n%3A%20String!)%20%7B%20a(n%3A%20%24n)%20%7D&operationName=Q&variables=%7B%22n%22%3A%22x%22%7D&extensions=%7B%7D&other=1",
    )
    .unwrap();
    assert_eq!(request.query, "query Q($n: String!) { a(n: $n) }");
    assert_eq!(request.operation_name.as_deref(), Some("Q"));
    assert_eq!(request.variables.len(), 1);
    for bad in [
        "",
        "operationName=Q",
        "query=%7Ba%7D&query=%7Bb%7D",
        "query=%7Ba%7D&variables=not-json",
        "query=%7Ba%7D&variables=%5B1%5D",
        "query=%7Ba%7D&extensions=1",
    ] {
        let err = parse_query_string(bad).unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    let hash_only = "extensions=%7B%22persistedQuery%22%3A%7B%22version%22%3A1%2C%22sha256Hash%22%3A%2200%22%7D%7D";
    assert_eq!(parse_query_string(hash_only).unwrap().query, "");
}

fn coded(code: &str, path: bool) -> Response {
    let mut error = ServerError::new("no", None);
    let mut ext = ErrorExtensionValues::default();
    ext.set("code", code);
    error.extensions = Some(ext);
    if path {
        error.path = vec![async_graphql::PathSegment::Field("a".into())];
    }
    let mut response = Response::from_errors(vec![error]);
    response.data = Value::Null;
    response
}

async fn written(responses: &[Response], single: bool, media: Media) -> (u16, serde_json::Value) {
    let answer = respond(responses, single, media, 1 << 20);
    let status = answer.status().as_u16();
    let body = axum::body::to_bytes(answer.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap())
}

#[tokio::test]
async fn a_request_error_is_400_without_data_only_under_the_new_media_type() {
    for code in REQUEST_ERRORS {
        let (status, body) = written(&[coded(code, false)], true, Media::GraphQLResponse).await;
        assert_eq!(status, 400, "{code}");
        assert!(body.get("data").is_none(), "{code}: {body}");
        assert_eq!(body["errors"][0]["extensions"]["code"], code);
        let (status, body) = written(&[coded(code, false)], true, Media::Json).await;
        assert_eq!(status, 200, "{code}");
        assert!(
            body["data"].is_null() && body.get("data").is_some(),
            "{code}: {body}"
        );
    }
    // Execution errors keep data (null at the root) and 200.
    for (code, path) in [
        ("FANOUT_ESTIMATE_EXCEEDS_BUDGET", false),
        ("DEADLINE_EXCEEDED", false),
        ("BAD_USER_INPUT", true),
    ] {
        let (status, body) = written(&[coded(code, path)], true, Media::GraphQLResponse).await;
        assert_eq!(status, 200, "{code}");
        assert!(body.get("data").is_some(), "{code}: {body}");
    }
    // In a batch each answer is written by its kind; the status is 200.
    let batch = [
        coded("GRAPHQL_PARSE_FAILED", false),
        Response::new(Value::from_json(serde_json::json!({"a": 1})).unwrap()),
    ];
    let (status, body) = written(&batch, false, Media::GraphQLResponse).await;
    assert_eq!(status, 200);
    assert!(body[0].get("data").is_none());
    assert_eq!(body[1]["data"]["a"], 1);
}

#[tokio::test]
async fn the_answer_names_its_media_type() {
    let ok = [Response::new(Value::Null)];
    let answer = respond(&ok, true, Media::GraphQLResponse, 1 << 20);
    assert_eq!(
        answer.headers()[header::CONTENT_TYPE],
        "application/graphql-response+json; charset=utf-8"
    );
    let answer = respond(&ok, true, Media::Json, 1 << 20);
    assert_eq!(answer.headers()[header::CONTENT_TYPE], "application/json");
    let answer = respond(&ok, true, Media::Json, 4);
    let body = axum::body::to_bytes(answer.into_body(), usize::MAX)
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&body).contains("RESPONSE_TOO_LARGE"));
}
