//! `[upstreams."NAME"] max_reads` through the gateway: two embedded
//! registries, the second named by its address and given a share of 3
//! reads. Its manifests past the share are `null` with
//! `FANOUT_BUDGET_EXHAUSTED` naming it; the default registry's all answer.
mod common;

use common::*;
use fanout_budget::config::UpstreamTable;
use fanout_budget::Config;
use serde_json::{json, Value};

fn page(alias: &str, name: &str) -> String {
    format!(
        r#"{alias}: repository(name: "{name}") {{ tags(first: 5) {{ nodes {{ name manifest {{ digest }} }} }} }}"#
    )
}

fn manifests(data: &Value, alias: &str) -> (usize, usize) {
    let nodes = data[alias]["tags"]["nodes"].as_array().expect("five tags");
    let digests = nodes.iter().filter(|n| n["manifest"]["digest"].is_string());
    let ok = digests.count();
    (ok, nodes.len() - ok)
}

#[tokio::test]
async fn a_registry_past_its_share_is_refused_alone() {
    let default = EmbeddedRegistry::fixture().await.unwrap();
    let capped = EmbeddedRegistry::fixture().await.unwrap();
    let name = capped.host();
    let table = UpstreamTable::default().url(capped.url()).max_reads(3);
    let config = Config::default().upstream_named(name.clone(), table);
    let gateway = fanout_gateway::app::build(config, default.url().parse().unwrap(), None);
    let query = format!(
        "{{ {} {} }}",
        page("mine", "acme/app"),
        page("theirs", &format!("{name}/acme/app"))
    );
    let body = json!({ "query": query }).to_string();
    let (status, answer) = post(&gateway.router, body, &[]).await;
    assert_eq!(status, 200, "{answer}");
    // The default registry: its tag list and 5 manifests.
    assert_eq!(manifests(&answer["data"], "mine"), (5, 0), "{answer}");
    // The capped one: its tag list and 2 manifests, then nothing sent.
    assert_eq!(manifests(&answer["data"], "theirs"), (2, 3), "{answer}");
    assert_eq!(default.counters().requests(), 6);
    assert_eq!(capped.counters().requests(), 3);
    let errors = answer["errors"].as_array().expect("the refusals");
    assert_eq!(errors.len(), 3, "{answer}");
    for error in errors {
        assert_eq!(error["path"][0], "theirs", "{error}");
        let ext = &error["extensions"];
        assert_eq!(ext["code"], "FANOUT_BUDGET_EXHAUSTED", "{error}");
        assert_eq!((&ext["limit"], &ext["upstream"]), (&json!(3), &json!(name)));
    }
    assert_eq!(answer["extensions"]["fanout"]["used"], 9, "{answer}");
}
