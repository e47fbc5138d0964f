//! The cost preview: `requested` before execution, `operationReads` after,
//! and the up-front refusal.
mod common;

use common::*;
use fanout_budget::Config;
use proptest::prelude::*;
use serde_json::json;

async fn requested(f: &Fixture, query: &str, variables: serde_json::Value) -> u64 {
    let (status, body) = f
        .post(json!({ "query": query, "variables": variables }).to_string())
        .await;
    assert_eq!(status, 200);
    body["extensions"]["fanout"]["requested"].as_u64().unwrap()
}

#[tokio::test]
async fn exact_requested_figures() {
    let f = Fixture::default().await;
    // The second pass prices the documents kept from the first.
    for pass in 0..2 {
        for (query, variables, expected) in cost_cases() {
            assert_eq!(
                requested(&f, query, variables.clone()).await,
                expected,
                "pass {pass}: {query}"
            );
        }
    }
}

#[tokio::test]
async fn one_kept_text_is_priced_with_each_requests_variables() {
    let f = Fixture::default().await;
    let query =
        r#"query($n: Int! = 6) { repositories(first: $n) { nodes { tag(name: "x") { name } } } }"#;
    for (variables, expected) in [
        (json!({"n": 4}), 1 + 4),
        (json!({"n": 9}), 1 + 9),
        (json!({}), 1 + 6),
        (json!({"n": 2}), 1 + 2),
    ] {
        assert_eq!(
            requested(&f, query, variables.clone()).await,
            expected,
            "{variables}"
        );
    }
}

#[tokio::test]
async fn a_batch_sums_its_operations() {
    let f = Fixture::default().await;
    let ops = vec![
        r#"{ repository(name: "acme/app") { tags(first: 2) { nodes { manifest { digest } } } } }"#.to_string(),
        r#"{ repository(name: "acme/multi") { tag(name: "latest") { manifest { config { os } } } } }"#.to_string(),
        "{ fanoutBudget { requested } }".to_string(),
    ];
    let responses = f.batch(&ops).await;
    let each: Vec<u64> = responses
        .iter()
        .map(|r| r["extensions"]["fanout"]["requested"].as_u64().unwrap())
        .collect();
    // CONTRACT §5: a tag list and 2 manifests; a tag list, a manifest, a config.
    assert_eq!(each, vec![3, 3, 0]);
}

fn refusing(max_reads: u64) -> Config {
    let mut config = Config::default();
    config.budget.max_reads = max_reads;
    config.budget.refuse_over_estimate = true;
    config
}

#[tokio::test]
async fn over_budget_batch_is_refused_before_any_read() {
    let f = Fixture::new(refusing(10)).await;
    // 2 × (1 + 5) = 12 > 10, though de-duplication would make it 6.
    let op =
        r#"{ repository(name: "acme/app") { tags(first: 5) { nodes { manifest { digest } } } } }"#
            .to_string();
    let responses = f.batch(&[op.clone(), op]).await;
    assert_eq!(f.reads(), 0);
    for r in &responses {
        assert!(r["data"].is_null());
        let e = &r["errors"][0]["extensions"];
        assert_eq!(e["code"], "FANOUT_ESTIMATE_EXCEEDS_BUDGET");
        assert_eq!(e["requested"], 12);
        assert_eq!(e["limit"], 10);
    }
    // A single over-budget operation too.
    let (status, body) = f
        .post(
            json!({ "query": r#"{ repositories(first: 50) { nodes { tags { totalCount } } } }"# })
                .to_string(),
        )
        .await;
    assert_eq!(status, 200);
    assert!(body["data"].is_null());
    assert_eq!(
        body["errors"][0]["extensions"]["code"],
        "FANOUT_ESTIMATE_EXCEEDS_BUDGET"
    );
    assert_eq!(body["errors"][0]["extensions"]["requested"], 51);
    assert_eq!(f.reads(), 0);
}

#[tokio::test]
async fn under_budget_batch_runs() {
    let f = Fixture::new(refusing(10)).await;
    let ops = vec![
        r#"{ repository(name: "acme/app") { tags(first: 3) { nodes { manifest { digest } } } } }"#
            .to_string(),
        r#"{ repository(name: "acme/app") { tag(name: "t00") { manifest { digest } } } }"#
            .to_string(),
    ];
    let responses = f.batch(&ops).await;
    assert!(responses.iter().all(|r| r.get("errors").is_none()));
    assert_eq!(f.reads(), 4);
    assert_eq!(responses[1]["extensions"]["fanout"]["requested"], 2);
}

#[tokio::test]
async fn refusal_is_off_by_default() {
    let mut config = Config::default();
    config.budget.max_reads = 3;
    let f = Fixture::new(config).await;
    let body = f.query(r#"{ repository(name: "acme/app") { tags(first: 5) { nodes { manifest { digest } } } } }"#).await;
    assert_eq!(f.reads(), 3);
    assert_eq!(body["extensions"]["fanout"]["requested"], 6);
    assert_eq!(
        body["errors"][0]["extensions"]["code"],
        "FANOUT_BUDGET_EXHAUSTED"
    );
}

// ---- actual ≤ requested, over random queries of the registry schema ----

fn manifest_sel() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("digest".to_string()),
            Just("mediaType".to_string()),
            Just("layers { size }".to_string()),
            Just("manifests { digest platform { os } }".to_string()),
            Just("config { os created }".to_string()),
        ],
        1..4,
    )
    .prop_map(|fields| aliased(&fields))
}

fn tag_sel() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("name".to_string()),
            manifest_sel().prop_map(|m| format!("manifest {{ {m} }}"))
        ],
        1..3,
    )
    .prop_map(|fields| aliased(&fields))
}

fn repo_sel() -> impl Strategy<Value = String> {
    let tag_name = prop::sample::select(vec!["t00", "t01", "latest", "single", "v1", "zz"]);
    prop::collection::vec(
        prop_oneof![
            Just("name".to_string()),
            (1..4i32, tag_sel())
                .prop_map(|(n, t)| format!("tags(first: {n}) {{ totalCount nodes {{ {t} }} }}")),
            (tag_name, tag_sel()).prop_map(|(name, t)| format!(r#"tag(name: "{name}") {{ {t} }}"#)),
        ],
        1..3,
    )
    .prop_map(|fields| aliased(&fields))
}

fn query() -> impl Strategy<Value = String> {
    let repo = prop::sample::select(vec!["acme/app", "acme/multi", "org/team/deep", "no/such"]);
    prop::collection::vec(
        prop_oneof![
            (repo, repo_sel())
                .prop_map(|(name, r)| format!(r#"repository(name: "{name}") {{ {r} }}"#)),
            (1..4i32, repo_sel())
                .prop_map(|(n, r)| format!("repositories(first: {n}) {{ nodes {{ {r} }} }}")),
            Just("fanoutBudget { used }".to_string()),
        ],
        1..3,
    )
    .prop_map(|fields| format!("{{ {} }}", aliased(&fields)))
}

fn aliased(fields: &[String]) -> String {
    fields
        .iter()
        .enumerate()
        .map(|(i, f)| format!("a{i}: {f}"))
        .collect::<Vec<_>>()
        .join(" ")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Twice on one gateway: cold, then with the engine's cache warm (the
    /// second run's hits are free, never counted in `operationReads`).
    #[test]
    fn actual_reads_never_exceed_requested(ops in prop::collection::vec(query(), 1..4)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let mut config = Config::default();
            config.budget.max_reads = 10_000;
            let f = Fixture::new(config).await;
            let mut sent_before = 0;
            for run in ["cold", "warm"] {
                let responses = f.batch(&ops).await;
                let mut requested_total = 0;
                for (r, q) in responses.iter().zip(&ops) {
                    let fanout = &r["extensions"]["fanout"];
                    let (reads, requested) = (fanout["operationReads"].as_u64().unwrap(), fanout["requested"].as_u64().unwrap());
                    assert!(reads <= requested, "{run}: {q}: {reads} reads > {requested} requested");
                    requested_total += requested;
                }
                let sent = f.reads() - sent_before;
                assert!(sent <= requested_total, "{run}: {sent} reads > {requested_total} requested for {ops:?}");
                if run == "warm" {
                    assert!(sent <= sent_before, "warm: {sent} reads, cold: {sent_before}");
                }
                sent_before = f.reads();
            }
        });
    }
}

/// A registry that answers a manifest `HEAD` without `Docker-Content-Digest`
/// makes a digest-only manifest a `HEAD` and a `GET`: two reads where the
/// preview priced one. The gateway remembers such a registry and reads its
/// manifests with a `GET` at once from then on, so every later request
/// reads no more than its `requested`.
#[tokio::test]
async fn a_registry_whose_head_names_no_digest_is_read_within_requested() {
    let f = Fixture::default().await;
    for i in 0..60 {
        let tag = format!("t{i:02}");
        f.registry.set_tag_fault(
            "acme/app",
            &tag,
            Some(fanout_gateway::embedded::Fault::NoDigestHeader),
        );
    }
    let query = r#"{ repository(name: "acme/app") { tags(first: 20) { nodes { manifest { digest mediaType } } } } }"#;
    let fanout = |answer: &serde_json::Value| {
        let f = &answer["extensions"]["fanout"];
        (
            f["operationReads"].as_u64().unwrap(),
            f["requested"].as_u64().unwrap(),
        )
    };
    // The first request learns it (each of its rows may send its HEAD).
    let first = f.query(query).await;
    assert!(first.get("errors").is_none(), "{first}");
    for _ in 0..2 {
        f.registry.counters().reset();
        let answer = f.query(query).await;
        assert!(answer.get("errors").is_none(), "{answer}");
        assert_eq!(answer["data"], first["data"]);
        let (reads, requested) = fanout(&answer);
        assert_eq!(requested, 21);
        assert!(
            reads <= requested,
            "{reads} reads for {requested} requested"
        );
        assert_eq!(f.registry.counters().heads(), 0, "no HEAD sent again");
    }
}
