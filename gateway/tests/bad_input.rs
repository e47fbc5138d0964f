//! Bad inbound input: always a 4xx or a GraphQL error, never a panic, never
//! an upstream read for a rejected request.
mod common;

use common::*;
use proptest::prelude::*;
use serde_json::{json, Value};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Posts `body`; asserts the answer is a refusal and nothing was read.
async fn assert_refused(f: &Fixture, body: Vec<u8>) {
    let before = f.reads();
    let (status, answer) = post(
        &f.gateway.router,
        String::from_utf8_lossy(&body).into_owned(),
        &[],
    )
    .await;
    assert!([200, 400, 413].contains(&status), "status {status}");
    let responses = match &answer {
        Value::Array(items) => items.clone(),
        other => vec![other.clone()],
    };
    for r in &responses {
        let errors = r["errors"].as_array();
        assert!(
            errors.is_some_and(|e| !e.is_empty()),
            "no error for a bad request: {r}"
        );
        for e in errors.unwrap() {
            assert!(e["message"].is_string());
        }
    }
    assert_eq!(f.reads(), before, "a rejected request read upstream");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..512)) {
        runtime().block_on(async {
            let f = Fixture::default().await;
            assert_refused(&f, body).await;
        });
    }

    #[test]
    fn arbitrary_json_shapes(value in arb_json()) {
        runtime().block_on(async {
            let f = Fixture::default().await;
            // A valid operation by accident would be fine, but random shapes are not one.
            assert_refused(&f, value.to_string().into_bytes()).await;
        });
    }

    #[test]
    fn arbitrary_query_text(query in "[{}a-z():\"!$@#. \\n]{0,200}") {
        runtime().block_on(async {
            let f = Fixture::default().await;
            assert_refused(&f, json!({ "query": query }).to_string().into_bytes()).await;
        });
    }
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[a-z{} ]{0,20}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("query".to_string()),
                    Just("variables".to_string()),
                    "[a-z]{1,8}"
                ],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

#[tokio::test]
async fn deep_nesting_is_refused_without_overflowing() {
    let f = Fixture::default().await;
    // Deep JSON: serde_json's recursion limit.
    let deep_json = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    assert_refused(&f, deep_json.into_bytes()).await;
    // A deeply nested selection: the parser's recursion limit / the depth limit.
    let deep_query = format!(
        "{}{}",
        "{ repository(name: \"acme/app\") ".repeat(2000),
        "}".repeat(2000)
    );
    assert_refused(&f, json!({ "query": deep_query }).to_string().into_bytes()).await;
    let nested = r#"{ repositories { nodes { tags { nodes { name } } } } }"#;
    let (status, _) = f.post(json!({ "query": nested }).to_string()).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn thousands_of_aliases_are_refused_by_the_complexity_limit() {
    let f = Fixture::default().await;
    let aliases: String = (0..3000)
        .map(|i| format!(r#"a{i}: repository(name: "r{i}") {{ name }} "#))
        .collect();
    assert_refused(
        &f,
        json!({ "query": format!("{{ {aliases} }}") })
            .to_string()
            .into_bytes(),
    )
    .await;
}

#[tokio::test]
async fn huge_variables_are_refused_by_the_body_limit() {
    let f = Fixture::default().await;
    let body = json!({ "query": "query($n: String!) { repository(name: $n) { name } }", "variables": { "n": "x".repeat(100_000) } });
    let (status, answer) = f.post(body.to_string()).await;
    assert_eq!(status, 413);
    assert_eq!(
        answer["errors"][0]["extensions"]["code"],
        "PAYLOAD_TOO_LARGE"
    );
    assert_eq!(f.reads(), 0);
}

#[tokio::test]
async fn introspection_still_works_under_the_limits() {
    let f = Fixture::default().await;
    let query = "query IntrospectionQuery { __schema { queryType { name } types { ...FullType } directives { name locations args { ...InputValue } } } } fragment FullType on __Type { kind name description fields(includeDeprecated: true) { name args { ...InputValue } type { ...TypeRef } isDeprecated } inputFields { ...InputValue } interfaces { ...TypeRef } enumValues(includeDeprecated: true) { name } possibleTypes { ...TypeRef } } fragment InputValue on __InputValue { name type { ...TypeRef } defaultValue } fragment TypeRef on __Type { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name } } } } } } } }";
    let body = f.query(query).await;
    assert!(body.get("errors").is_none(), "{body}");
    assert!(body["data"]["__schema"]["types"].as_array().unwrap().len() > 5);
}
