//! CONTRACT §5: what costs a read, counted at the upstream.
mod common;

use common::*;
use fanout_budget::Config;
use serde_json::json;

#[tokio::test]
async fn repository_reads_its_tag_list_once() {
    let f = Fixture::default().await;
    let body = f
        .query(r#"{ repository(name: "acme/app") { name tags(first: 3) { totalCount nodes { name } } tag(name: "t05") { name } again: tags(first: 1) { totalCount } } }"#)
        .await;
    assert_eq!(body["data"]["repository"]["tags"]["totalCount"], 60);
    assert_eq!(
        body["data"]["repository"]["tags"]["nodes"],
        json!([{"name":"t00"},{"name":"t01"},{"name":"t02"}])
    );
    assert_eq!(body["data"]["repository"]["tag"]["name"], "t05");
    assert_eq!(f.reads(), 1);
    assert_eq!(f.registry.counters().path("/v2/acme/app/tags/list"), 1);
    assert_eq!(body["extensions"]["fanout"]["used"], 1);
}

#[tokio::test]
async fn an_unknown_repository_is_null_without_error() {
    let f = Fixture::default().await;
    let body = f.query(r#"{ repository(name: "no/such") { name } }"#).await;
    assert!(body["data"]["repository"].is_null());
    assert!(body.get("errors").is_none(), "{body}");
    assert_eq!(f.reads(), 1);
}

#[tokio::test]
async fn n_artifacts_cost_one_plus_n_in_one_operation() {
    for n in [1u64, 10, 50] {
        let f = Fixture::default().await;
        let body = f
            .query(&format!(r#"{{ repository(name: "acme/app") {{ tags(first: {n}) {{ nodes {{ name manifest {{ digest }} }} }} }} }}"#))
            .await;
        assert_eq!(
            body["data"]["repository"]["tags"]["nodes"]
                .as_array()
                .unwrap()
                .len() as u64,
            n
        );
        assert_eq!(f.reads(), 1 + n, "N = {n}");
        assert_eq!(f.registry.counters().matching("/manifests/"), n);
    }
}

#[tokio::test]
async fn n_artifacts_cost_one_plus_n_across_a_batch() {
    let f = Fixture::new({
        let mut c = Config::default();
        c.http.max_batch_operations = 20;
        c
    })
    .await;
    let ops: Vec<String> = (0..20)
        .map(|i| format!(r#"{{ repository(name: "acme/app") {{ tag(name: "t{i:02}") {{ manifest {{ digest }} }} }} }}"#))
        .collect();
    let responses = f.batch(&ops).await;
    assert_eq!(f.reads(), 21);
    let issued: u64 = fanout_testkit::operation_reads(&responses);
    assert_eq!(issued, 21);
    for r in &responses {
        assert!(r["data"]["repository"]["tag"]["manifest"]["digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"));
    }
}

#[tokio::test]
async fn five_identical_operations_cost_two_reads() {
    let f = Fixture::default().await;
    let op = r#"{ repository(name: "acme/app") { tag(name: "t01") { manifest { digest } } } }"#
        .to_string();
    let responses = f.batch(&vec![op; 5]).await;
    assert_eq!(f.reads(), 2);
    let digests: Vec<_> = responses
        .iter()
        .map(|r| r["data"]["repository"]["tag"]["manifest"]["digest"].clone())
        .collect();
    assert!(digests.windows(2).all(|w| w[0] == w[1]));
}

#[tokio::test]
async fn config_of_an_image_is_one_read_and_of_an_index_none() {
    let f = Fixture::default().await;
    let body = f
        .query(r#"{ repository(name: "acme/multi") { latest: tag(name: "latest") { manifest { mediaType layers { digest } manifests { digest size platform { os architecture variant } } config { os } } } single: tag(name: "single") { manifest { mediaType config { os architecture created } } } } }"#)
        .await;
    assert!(body.get("errors").is_none(), "{body}");
    let latest = &body["data"]["repository"]["latest"]["manifest"];
    assert_eq!(
        latest["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    assert!(latest["config"].is_null());
    assert_eq!(latest["layers"], json!([]));
    assert_eq!(latest["manifests"].as_array().unwrap().len(), 2);
    assert_eq!(
        latest["manifests"][1]["platform"],
        json!({"os":"linux","architecture":"arm64","variant":"v8"})
    );
    assert!(latest["manifests"][0]["size"].as_u64().unwrap() > 0);
    let single = &body["data"]["repository"]["single"]["manifest"];
    assert_eq!(
        single["config"],
        json!({"os":"linux","architecture":"amd64","created":"2026-01-01T00:00:00Z"})
    );
    // tag list + 2 manifests + 1 config blob; the index's config read nothing.
    assert_eq!(f.reads(), 4);
    assert_eq!(f.registry.counters().matching("/blobs/"), 1);
}

#[tokio::test]
async fn identical_config_blobs_are_one_read() {
    let f = Fixture::default().await;
    let op =
        r#"{ repository(name: "acme/app") { tag(name: "t07") { manifest { config { os } } } } }"#
            .to_string();
    f.batch(&vec![op; 3]).await;
    assert_eq!(f.reads(), 3, "tag list, manifest, blob — once each");
}

#[tokio::test]
async fn a_catalog_repository_shares_its_tag_list_with_repository_name() {
    let f = Fixture::default().await;
    let ops = vec![
        r#"{ repositories(first: 2) { nodes { name tags(first: 1) { totalCount } } } }"#
            .to_string(),
        r#"{ repository(name: "acme/app") { tag(name: "t00") { name } } }"#.to_string(),
    ];
    let responses = f.batch(&ops).await;
    assert_eq!(
        responses[0]["data"]["repositories"]["nodes"][0]["name"],
        "acme/app"
    );
    assert_eq!(
        responses[0]["data"]["repositories"]["nodes"][0]["tags"]["totalCount"],
        60
    );
    // catalog + acme/app tag list (shared) + acme/multi tag list.
    assert_eq!(f.reads(), 3);
    assert_eq!(f.registry.counters().path("/v2/acme/app/tags/list"), 1);
}

#[tokio::test]
async fn a_catalog_repository_without_tag_fields_reads_no_tag_list() {
    let f = Fixture::default().await;
    let body = f
        .query("{ repositories(first: 5) { nodes { name } } }")
        .await;
    assert_eq!(
        body["data"]["repositories"]["nodes"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    assert_eq!(f.reads(), 1);
}

#[tokio::test]
async fn catalog_pages_follow_registry_order_and_each_distinct_page_is_a_read() {
    let f = Fixture::default().await;
    let mut names = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let arg = after
            .as_ref()
            .map(|a| format!(r#", after: "{a}""#))
            .unwrap_or_default();
        let body = f.query(&format!("{{ repositories(first: 7{arg}) {{ nodes {{ name }} pageInfo {{ hasNextPage endCursor }} }} }}")).await;
        let conn = &body["data"]["repositories"];
        names.extend(
            conn["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n["name"].as_str().unwrap().to_string()),
        );
        pages += 1;
        if !conn["pageInfo"]["hasNextPage"].as_bool().unwrap() {
            break;
        }
        after = conn["pageInfo"]["endCursor"].as_str().map(String::from);
        assert!(pages < 20);
    }
    let mut expected: Vec<String> = Store::fixture().repos.keys().cloned().collect();
    expected.sort();
    assert_eq!(names, expected);
    assert_eq!(f.reads(), pages);
    // The same page twice in one request is one read.
    f.registry.counters().reset();
    f.batch(&vec![
        "{ repositories(first: 3) { nodes { name } } }"
            .to_string();
        2
    ])
    .await;
    assert_eq!(f.reads(), 1);
}

#[tokio::test]
async fn first_out_of_range_is_bad_user_input_and_reads_nothing() {
    let f = Fixture::default().await;
    for q in [
        "{ repositories(first: 0) { nodes { name } } }",
        "{ repositories(first: 100000) { nodes { name } } }",
        r#"{ repository(name: "acme/app") { tags(first: 0) { totalCount } } }"#,
        r#"{ repository(name: "acme/app") { tags(first: 101) { totalCount } } }"#,
    ] {
        f.registry.counters().reset();
        let body = f.query(q).await;
        assert_eq!(
            body["errors"][0]["extensions"]["code"], "BAD_USER_INPUT",
            "{q}: {body}"
        );
        let reads_for_tags = q.contains("repository(") as u64; // the tag list itself
        assert_eq!(f.reads(), reads_for_tags, "{q}");
    }
}

#[tokio::test]
async fn tag_pages_by_cursor() {
    let f = Fixture::default().await;
    let body = f
        .query(r#"{ repository(name: "acme/app") { tags(first: 2, after: "t57") { nodes { name } pageInfo { hasNextPage endCursor } } } }"#)
        .await;
    let tags = &body["data"]["repository"]["tags"];
    assert_eq!(tags["nodes"], json!([{"name":"t58"},{"name":"t59"}]));
    assert_eq!(
        tags["pageInfo"],
        json!({"hasNextPage": false, "endCursor": "t59"})
    );
}

#[tokio::test]
async fn each_link_page_of_a_tag_list_is_a_read() {
    let f = Fixture::default().await;
    f.registry.set_tag_page_size(Some(25));
    let body = f.query(r#"{ repository(name: "acme/app") { tags(first: 100) { totalCount nodes { name } } } }"#).await;
    assert_eq!(body["data"]["repository"]["tags"]["totalCount"], 60);
    assert_eq!(
        body["data"]["repository"]["tags"]["nodes"][59]["name"],
        "t59"
    );
    assert_eq!(f.reads(), 3, "three Link pages of 25");
    assert_eq!(body["extensions"]["fanout"]["used"], 3);
}

#[tokio::test]
async fn namespaced_names_work() {
    let f = Fixture::default().await;
    let body = f.query(r#"{ repository(name: "org/team/deep") { name tag(name: "v1") { manifest { config { architecture } } } } }"#).await;
    assert_eq!(
        body["data"]["repository"]["tag"]["manifest"]["config"]["architecture"],
        "arm64"
    );
}

#[tokio::test]
async fn fanout_budget_reads_nothing_and_reports_the_request() {
    let f = Fixture::default().await;
    let ops = vec![
        r#"{ repository(name: "acme/app") { name } }"#.to_string(),
        "{ fanoutBudget { limit used remaining } }".to_string(),
    ];
    let responses = f.batch(&ops).await;
    assert_eq!(responses[1]["data"]["fanoutBudget"]["limit"], 100);
    let b = &responses[1]["data"]["fanoutBudget"];
    assert_eq!(
        b["used"].as_u64().unwrap() + b["remaining"].as_u64().unwrap(),
        100
    );
    assert_eq!(f.reads(), 1);
}
