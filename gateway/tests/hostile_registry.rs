//! A hostile registry and hostile names: a tag list that links to itself or
//! out of its origin ends with `UPSTREAM_ERROR` after one read; a name that
//! would steer the URL is `BAD_USER_INPUT` with zero reads; the pages of a
//! list are bounded by the budget.
mod common;

use common::*;
use fanout_budget::Config;
use fanout_gateway::embedded::Fault;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn code(answer: &Value) -> &str {
    answer["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or("<none>")
}

const TAGS: &str = r#"{ repository(name: "acme/app") { tags(first: 100) { totalCount } } }"#;

#[tokio::test]
async fn a_tag_list_linking_to_itself_ends_after_one_read() {
    let f = Fixture::default().await;
    f.registry.set_repo_fault("acme/app", Some(Fault::SelfLink));
    let started = Instant::now();
    let answer = f.query(TAGS).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(code(&answer), "UPSTREAM_ERROR", "{answer}");
    assert!(answer["data"]["repository"].is_null(), "{answer}");
    assert_eq!(f.reads(), 1);
    assert_eq!(answer["extensions"]["fanout"]["used"], 1);
}

#[tokio::test]
async fn a_tag_list_linking_to_another_origin_is_not_followed() {
    let f = Fixture::default().await;
    f.registry
        .set_repo_fault("acme/app", Some(Fault::ForeignLink));
    let answer = f.query(TAGS).await;
    assert_eq!(code(&answer), "UPSTREAM_ERROR", "{answer}");
    assert!(
        answer["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("out of the list"),
        "{answer}"
    );
    assert_eq!(f.reads(), 1);
}

#[tokio::test]
async fn the_same_self_linking_list_twice_in_a_batch_stays_one_read() {
    // The second walk is answered by de-duplication and stops the same way.
    let f = Fixture::default().await;
    f.registry.set_repo_fault("acme/app", Some(Fault::SelfLink));
    let answers = f.batch(&[TAGS.to_string(), TAGS.to_string()]).await;
    for answer in &answers {
        assert_eq!(code(answer), "UPSTREAM_ERROR", "{answer}");
    }
    assert_eq!(f.reads(), 1);
}

#[tokio::test]
async fn the_pages_of_a_list_are_bounded_by_the_budget() {
    let mut config = Config::default();
    config.budget.max_reads = 10;
    let f = Fixture::new(config).await;
    // 60 tags, one per page: 60 reads wanted, 10 allowed.
    f.registry.set_tag_page_size(Some(1));
    let answer = f.query(TAGS).await;
    assert_eq!(code(&answer), "FANOUT_BUDGET_EXHAUSTED", "{answer}");
    assert_eq!(f.reads(), 10);
}

#[tokio::test]
async fn a_paged_list_is_still_read_whole() {
    let f = Fixture::default().await;
    f.registry.set_tag_page_size(Some(7));
    let answer = f.query(TAGS).await;
    assert_eq!(
        answer["data"]["repository"]["tags"]["totalCount"], 60,
        "{answer}"
    );
    assert_eq!(f.reads(), 9, "60 tags in pages of 7");
}

#[tokio::test]
async fn names_that_would_steer_the_url_are_bad_user_input_with_zero_reads() {
    let f = Fixture::default().await;
    for name in [
        "../../admin/secret?x=",
        "app/tags/list?n=1&last=v1#",
        "acme/app/../multi",
        "acme%2fapp",
        "ACME/app",
        "acme//app",
        "",
        "acme/app\n",
    ] {
        let query = "query($n: String!) { repository(name: $n) { name tags { totalCount } } }";
        let (status, answer) = f
            .post(json!({ "query": query, "variables": { "n": name } }).to_string())
            .await;
        assert_eq!(status, 200);
        assert_eq!(code(&answer), "BAD_USER_INPUT", "{name:?}: {answer}");
        assert!(answer["data"]["repository"].is_null(), "{name:?}: {answer}");
        assert_eq!(answer["errors"][0]["path"], json!(["repository"]));
    }
    assert_eq!(f.reads(), 0, "an invalid name was read");
    // A namespaced name is valid and answers.
    let answer = f
        .query(r#"{ repository(name: "org/team/deep") { tags { totalCount } } }"#)
        .await;
    assert_eq!(
        answer["data"]["repository"]["tags"]["totalCount"], 1,
        "{answer}"
    );
}

#[tokio::test]
async fn a_tag_outside_the_grammar_is_never_read() {
    // `tag(name:)` only answers tags the registry listed; a listed tag that
    // is not in the grammar would still never reach a URL.
    let f = Fixture::default().await;
    let answer = f
        .query(r#"{ repository(name: "acme/app") { tag(name: "../../_catalog") { manifest { digest } } } }"#)
        .await;
    assert!(answer["data"]["repository"]["tag"].is_null(), "{answer}");
    assert_eq!(f.reads(), 1, "only the tag list");
}

#[tokio::test]
async fn an_upstream_value_quoted_in_an_error_is_cut_and_shared_fields_stay_small() {
    let f = Fixture::default().await;
    // The parser's error would quote a 1 MB string; 200 fields share it.
    f.registry
        .set_repo_fault("acme/app", Some(Fault::WrongShape(1 << 20)));
    let fields: String = (0..200)
        .map(|i| format!(r#"r{i}: repository(name: "acme/app") {{ name }} "#))
        .collect();
    let (status, answer) = f
        .post(json!({ "query": format!("{{ {fields}}}") }).to_string())
        .await;
    assert_eq!(status, 200);
    let errors = answer["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 200, "{}", &answer.to_string()[..500]);
    for error in errors {
        assert_eq!(error["extensions"]["code"], "UPSTREAM_ERROR");
        let message = error["message"].as_str().unwrap();
        assert!(message.len() < 1024, "a {} byte message", message.len());
    }
    assert_eq!(f.reads(), 1);
}

#[tokio::test]
async fn a_manifest_listing_thousands_of_layers_is_refused_once_for_every_row() {
    let f = Fixture::default().await;
    f.registry
        .set_tag_fault("acme/app", "t00", Some(Fault::ManyLayers(5_000)));
    f.registry
        .set_tag_fault("acme/app", "t01", Some(Fault::ManyLayers(100)));
    let answer = f
        .query(r#"{ repository(name: "acme/app") { a: tag(name: "t00") { manifest { layers { digest } } } b: tag(name: "t01") { manifest { layers { digest } } } } }"#)
        .await;
    assert_eq!(code(&answer), "UPSTREAM_ERROR", "{answer}");
    assert!(
        answer["data"]["repository"]["a"]["manifest"].is_null(),
        "{answer}"
    );
    let layers = answer["data"]["repository"]["b"]["manifest"]["layers"]
        .as_array()
        .unwrap();
    assert_eq!(layers.len(), 100);
}
