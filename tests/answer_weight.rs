//! What the resolve hook counts for a list of scalars: each item once. Its
//! items pass through the hook one by one (async-graphql resolves a list's
//! items as fields of their own), so the list must not count them again as
//! if it were a custom scalar's value built whole.

use async_graphql::{EmptyMutation, EmptySubscription, Json, Object, Schema};
use fanout_budget::{Config, Engine, FanoutExtension};

struct Query;

#[Object]
impl Query {
    /// 1,000 strings of 1,000 bytes: about 1.1 MB counted once.
    async fn names(&self) -> Vec<String> {
        (0..1000).map(|i| format!("{i:0>1000}")).collect()
    }

    /// The same bytes as one custom scalar's value, built whole.
    async fn blob(&self) -> Json<Vec<String>> {
        Json((0..1000).map(|i| format!("{i:0>1000}")).collect())
    }
}

async fn code(query: &str, max_answer_bytes: usize) -> Option<String> {
    let mut config = Config::default();
    config.http.max_answer_bytes = max_answer_bytes;
    let engine = Engine::new(config);
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .finish();
    let response = schema.execute(query).await;
    response.errors.first().and_then(|e| {
        e.extensions
            .as_ref()
            .and_then(|ext| ext.get("code"))
            .map(|code| code.to_string())
    })
}

#[tokio::test]
async fn a_list_of_scalars_counts_each_item_once() {
    // Counted once, the list is about 1.1 MB; twice, 2.2 MB.
    assert_eq!(code("{ names }", 1_600_000).await, None);
    assert!(code("{ names }", 800_000)
        .await
        .is_some_and(|c| c.contains("RESPONSE_TOO_LARGE")));
}

#[tokio::test]
async fn a_custom_scalar_built_whole_counts_its_items() {
    assert_eq!(code("{ blob }", 1_600_000).await, None);
    assert!(code("{ blob }", 800_000)
        .await
        .is_some_and(|c| c.contains("RESPONSE_TOO_LARGE")));
}
