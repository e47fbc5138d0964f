//! Hostile query shapes: each is answered quickly, with bounded memory and
//! at most its budget of reads — through `FanoutGraphQL` and through the
//! extension on a plain `schema.execute`, so neither our walks nor
//! async-graphql's (its recursion-depth check, its complexity visitors and
//! its executor expand fragments without a memo) see an unbounded document.
mod common;

use async_graphql::Request;
use common::*;
use fanout_budget::{Config, FanoutExtension};
use fanout_gateway::oci::RegistryUrl;
use fanout_gateway::{app, schema};
use fanout_testkit::doubling_chain;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Generous: each of these is refused in well under a millisecond of work.
const ANSWERED_WITHIN: Duration = Duration::from_secs(5);

/// The hostile corpus: name, query, and the code the operation must carry.
fn corpus() -> Vec<(&'static str, String, &'static str)> {
    let wide: String = (0..3000).map(|i| format!("a{i}: __typename ")).collect();
    let deep = format!(
        "{}__typename{}",
        "{ fanoutBudget { ".repeat(70),
        " }".repeat(71)
    );
    vec![
        (
            "self-cycle spread twice",
            "{...A} fragment A on Query{...A ...A}".to_string(),
            "GRAPHQL_VALIDATION_FAILED",
        ),
        (
            "cycle through three fragments and an inline fragment",
            "{ ...A } fragment A on Query { fanoutBudget { used } ...B } \
             fragment B on Query { ... on Query { ...C } } fragment C on Query { ...A }"
                .to_string(),
            "GRAPHQL_VALIDATION_FAILED",
        ),
        (
            "unused cycle",
            "{ fanoutBudget { used } } fragment X on Query { ...Y } fragment Y on Query { ...X }"
                .to_string(),
            "GRAPHQL_VALIDATION_FAILED",
        ),
        (
            "doubling chain of 24 links",
            doubling_chain(24, "__typename"),
            "GRAPHQL_VALIDATION_FAILED",
        ),
        (
            "doubling chain of 64 links",
            doubling_chain(64, "__typename"),
            "GRAPHQL_VALIDATION_FAILED",
        ),
        (
            "doubling chain over a reading field",
            doubling_chain(
                30,
                r#"repository(name: "acme/app") { tags(first: 100) { nodes { manifest { digest } } } }"#,
            ),
            "GRAPHQL_VALIDATION_FAILED",
        ),
        (
            "3,000 aliases",
            format!("{{ {wide} }}"),
            "GRAPHQL_VALIDATION_FAILED",
        ),
        (
            // Few selections, a huge answer: 100 × 450 × 100 rows (the
            // gateway's complexity limit multiplies lists by `first`).
            "aliased lists inside a list",
            format!(
                "{{ repositories(first: 100) {{ nodes {{ {} }} }} }}",
                (0..450)
                    .map(|i| format!("t{i}: tags(first: 100) {{ nodes {{ name }} }} "))
                    .collect::<String>()
            ),
            "GRAPHQL_VALIDATION_FAILED",
        ),
        ("70 levels of nesting", deep, "GRAPHQL_PARSE_FAILED"),
        (
            "not GraphQL",
            "{ repository(".to_string(),
            "GRAPHQL_PARSE_FAILED",
        ),
    ]
}

/// The process's peak resident memory so far, in KiB (Linux).
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn codes(answer: &Value) -> Vec<String> {
    answer["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            e["extensions"]["code"]
                .as_str()
                .unwrap_or("<none>")
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn the_hostile_corpus_is_refused_fast_with_zero_reads_by_the_service() {
    let f = Fixture::default().await;
    for (name, query, code) in corpus() {
        let started = Instant::now();
        let (status, answer) = f.post(json!({ "query": query }).to_string()).await;
        let took = started.elapsed();
        assert_eq!(status, 200, "{name}: {answer}");
        assert!(took < ANSWERED_WITHIN, "{name}: took {took:?}");
        assert_eq!(codes(&answer), vec![code], "{name}: {answer}");
        assert!(answer["data"].is_null(), "{name}: {answer}");
        assert_eq!(answer["extensions"]["fanout"]["used"], 0, "{name}");
        assert_eq!(f.reads(), 0, "{name}: read upstream");
    }
    // Generous: the shapes above cost gigabytes when expanded.
    assert!(peak_rss_kib() < 1 << 20, "peak RSS {} KiB", peak_rss_kib());
}

#[tokio::test]
async fn the_hostile_corpus_is_refused_fast_by_the_extension() {
    let f = Fixture::default().await;
    // The gateway's own async-graphql limits, as an app would set them.
    let schema = schema::builder()
        .limit_depth(app::MAX_DEPTH)
        .limit_complexity(app::MAX_COMPLEXITY)
        .limit_recursive_depth(app::MAX_RECURSIVE_DEPTH)
        .extension(FanoutExtension::new(&f.gateway.engine))
        .data(RegistryUrl(f.registry.url().parse().unwrap()))
        .finish();
    for (name, query, code) in corpus() {
        let started = Instant::now();
        let response = schema.execute(Request::new(query)).await;
        let took = started.elapsed();
        let answer = serde_json::to_value(&response).unwrap();
        assert!(took < ANSWERED_WITHIN, "{name}: took {took:?}");
        assert_eq!(codes(&answer), vec![code], "{name}: {answer}");
        assert_eq!(f.reads(), 0, "{name}: read upstream");
    }
}

#[tokio::test]
async fn a_batch_with_one_hostile_operation_answers_the_others() {
    let f = Fixture::default().await;
    let answers = f
        .batch(&[
            r#"{ repository(name: "acme/app") { tags(first: 2) { totalCount } } }"#.to_string(),
            "{...A} fragment A on Query{...A ...A}".to_string(),
        ])
        .await;
    assert_eq!(answers[0]["data"]["repository"]["tags"]["totalCount"], 60);
    assert_eq!(codes(&answers[1]), vec!["GRAPHQL_VALIDATION_FAILED"]);
    assert_eq!(f.reads(), 1);
}

#[tokio::test]
async fn a_shared_fragment_spread_many_times_is_allowed_and_read_once() {
    // 2^7 expansions of one read: under the selection bound, and
    // de-duplication makes it one read.
    let f = Fixture::default().await;
    let answer = f
        .query(&doubling_chain(
            7,
            r#"repository(name: "acme/app") { name }"#,
        ))
        .await;
    assert_eq!(answer["data"]["repository"]["name"], "acme/app", "{answer}");
    assert_eq!(f.reads(), 1);
}

#[tokio::test]
async fn the_selection_bound_is_the_configured_one() {
    let mut config = Config::default();
    config.http.max_selections = 10;
    let f = Fixture::new(config).await;
    let eleven: String = (0..11).map(|i| format!("a{i}: __typename ")).collect();
    let ten: String = (0..10).map(|i| format!("a{i}: __typename ")).collect();
    let refused = f.query(&format!("{{ {eleven} }}")).await;
    assert_eq!(
        codes(&refused),
        vec!["GRAPHQL_VALIDATION_FAILED"],
        "{refused}"
    );
    let answered = f.query(&format!("{{ {ten} }}")).await;
    assert_eq!(answered["data"]["a9"], "Query", "{answered}");
}

#[tokio::test]
async fn async_graphql_validation_and_variable_errors_carry_a_code() {
    let f = Fixture::default().await;
    let unknown = f.query("{ noSuchField }").await;
    assert_eq!(
        codes(&unknown),
        vec!["GRAPHQL_VALIDATION_FAILED"],
        "{unknown}"
    );
    let literal = f
        .query("{ repositories(first: \"x\") { nodes { name } } }")
        .await;
    let literal_codes = codes(&literal);
    assert!(!literal_codes.is_empty(), "{literal}");
    assert!(
        literal_codes
            .iter()
            .all(|c| c == "GRAPHQL_VALIDATION_FAILED"),
        "{literal}"
    );
    let query = "query($n: Int!) { repositories(first: $n) { nodes { name } } }";
    for variables in [json!({}), json!({ "n": "x" }), json!({ "n": null })] {
        let body = json!({ "query": query, "variables": variables }).to_string();
        let (_, answer) = f.post(body).await;
        // The coercion failure first (the complexity limit's own parse of
        // the argument may add a validation error after it).
        let codes = codes(&answer);
        assert_eq!(
            codes.first().map(String::as_str),
            Some("BAD_USER_INPUT"),
            "{variables}: {answer}"
        );
        assert!(
            codes
                .iter()
                .all(|c| c == "BAD_USER_INPUT" || c == "GRAPHQL_VALIDATION_FAILED"),
            "{variables}: {answer}"
        );
    }
    assert_eq!(f.reads(), 0);
}

/// A random fragment graph: `n` fragments on `Query`, each with a few
/// spreads (to any fragment: self-loops, cycles, diamonds and chains all
/// arise) and one leaf field, spread from the operation.
#[derive(Debug, Clone)]
struct Graph {
    spreads: Vec<Vec<usize>>,
    leaves: Vec<bool>,
}

fn graphs() -> impl Strategy<Value = Graph> {
    (1usize..14).prop_flat_map(|n| {
        (
            prop::collection::vec(prop::collection::vec(0..n, 0..4), n),
            prop::collection::vec(any::<bool>(), n),
        )
            .prop_map(|(spreads, leaves)| Graph { spreads, leaves })
    })
}

impl Graph {
    fn query(&self) -> String {
        let mut query = String::from("{ ...F0 }");
        for (i, spreads) in self.spreads.iter().enumerate() {
            let leaf = if self.leaves[i] {
                r#"repository(name: "acme/app") { name }"#
            } else {
                "__typename"
            };
            let body: String = spreads.iter().map(|s| format!(" ...F{s}")).collect();
            query.push_str(&format!(" fragment F{i} on Query {{ {leaf}{body} }}"));
        }
        query
    }

    /// An independent count: `None` on a cycle, else the selections the
    /// operation expands to (saturating), by memoised recursion.
    fn expanded(&self) -> Option<u64> {
        fn size(
            g: &Graph,
            i: usize,
            memo: &mut HashMap<usize, Option<u64>>,
            path: &mut Vec<usize>,
        ) -> Option<u64> {
            if path.contains(&i) {
                return None;
            }
            if let Some(known) = memo.get(&i) {
                return *known;
            }
            path.push(i);
            let mut total = Some(1 + g.spreads[i].len() as u64 + if g.leaves[i] { 1 } else { 0 });
            for &s in &g.spreads[i] {
                total = match (total, size(g, s, memo, path)) {
                    (Some(t), Some(n)) => Some(t.saturating_add(n)),
                    _ => None,
                };
            }
            path.pop();
            memo.insert(i, total);
            total
        }
        // Every fragment counts, used or not (a cycle anywhere refuses the
        // document; async-graphql validates every definition).
        let mut memo = HashMap::new();
        let mut total = 0u64;
        for i in 0..self.spreads.len() {
            total = total.saturating_add(size(self, i, &mut memo, &mut Vec::new())?);
        }
        let operation = size(self, 0, &mut memo, &mut Vec::new())?.saturating_add(1);
        Some(total.saturating_add(operation))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_fragment_graphs_are_answered_fast_within_the_budget(graph in graphs()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let mut config = Config::default();
            config.http.max_selections = 500;
            let f = Fixture::new(config).await;
            let started = Instant::now();
            let (status, answer) = f.post(json!({ "query": graph.query() }).to_string()).await;
            assert!(started.elapsed() < ANSWERED_WITHIN, "{graph:?}");
            assert_eq!(status, 200);
            assert!(f.reads() <= 100);
            let codes = codes(&answer);
            match graph.expanded() {
                None => assert_eq!(codes, vec!["GRAPHQL_VALIDATION_FAILED"], "cycle: {graph:?} {answer}"),
                Some(n) if n > 500 => assert_eq!(codes, vec!["GRAPHQL_VALIDATION_FAILED"], "{n}: {graph:?} {answer}"),
                Some(_) => {
                    // Unused fragments are async-graphql's validation error;
                    // otherwise the query runs, with at most one read.
                    assert!(codes.iter().all(|c| c == "GRAPHQL_VALIDATION_FAILED"), "{graph:?} {answer}");
                    if codes.is_empty() {
                        assert!(answer["data"].is_object(), "{answer}");
                        assert!(f.reads() <= 1);
                    }
                }
            }
        });
    }
}

#[tokio::test]
async fn an_answer_past_the_response_bound_is_replaced_by_a_coded_error() {
    let mut config = Config::default();
    config.http.max_response_bytes = 100_000;
    let f = Fixture::new(config).await;
    // A 10 KB alias on each of 60 tags: a 10 KB query asking for 600 KB.
    let alias = "a".repeat(10_000);
    let query = format!(
        r#"{{ repository(name: "acme/app") {{ tags(first: 60) {{ nodes {{ {alias}: name }} }} }} }}"#
    );
    let (status, answer) = f.post(json!({ "query": query }).to_string()).await;
    assert_eq!(status, 200);
    assert_eq!(codes(&answer), vec!["RESPONSE_TOO_LARGE"], "{answer}");
    assert_eq!(answer["errors"][0]["extensions"]["max"], 100_000);
    // The same query with a short alias fits.
    let small = f
        .query(r#"{ repository(name: "acme/app") { tags(first: 60) { nodes { a: name } } } }"#)
        .await;
    assert_eq!(
        small["data"]["repository"]["tags"]["nodes"][59]["a"], "t59",
        "{small}"
    );
}
