//! A read error keeps its contract code under any executor: returned with
//! `?` from a resolver of a schema run with plain `schema.execute` — no
//! `FanoutGraphQL`, no extension — its code is already in `extensions`.
use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema, Value};
use fanout_budget::{OrNull, ReadError};

struct Query;

#[Object]
impl Query {
    async fn failed(&self) -> async_graphql::Result<u64> {
        Err(ReadError::HostSaturated {
            host: "registry:5000".into(),
            max_concurrent: 4,
        })?
    }

    async fn nulled(&self, ctx: &Context<'_>) -> Option<u64> {
        Err::<u64, _>(ReadError::BudgetExhausted { limit: 3 }).or_null(ctx)
    }

    async fn plain(&self) -> async_graphql::Result<u64> {
        Err("an application error of its own")?
    }
}

fn extension(error: &async_graphql::ServerError, key: &str) -> Option<Value> {
    error.extensions.as_ref()?.get(key).cloned()
}

#[tokio::test]
async fn codes_survive_a_bare_schema_execute() {
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription).finish();
    let response = schema.execute("{ failed nulled plain }").await;
    let by_path = |field: &str| {
        response
            .errors
            .iter()
            .find(|e| matches!(e.path.first(), Some(async_graphql::PathSegment::Field(f)) if f == field))
            .unwrap_or_else(|| panic!("no error at {field}: {:?}", response.errors))
    };
    let failed = by_path("failed");
    assert_eq!(
        extension(failed, "code"),
        Some(Value::from("HOST_SATURATED"))
    );
    assert_eq!(extension(failed, "maxConcurrent"), Some(Value::from(4)));
    assert!(
        failed.message.contains("registry:5000"),
        "{}",
        failed.message
    );
    let nulled = by_path("nulled");
    assert_eq!(
        extension(nulled, "code"),
        Some(Value::from("FANOUT_BUDGET_EXHAUSTED"))
    );
    assert_eq!(extension(nulled, "limit"), Some(Value::from(3)));
    // An app's own error gets no code it did not ask for.
    assert_eq!(extension(by_path("plain"), "code"), None);
}
