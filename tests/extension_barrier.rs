//! The extension's pricing barrier never waits for an operation that was
//! refused before it could be priced: in an announced batch with
//! `refuse_over_estimate`, a text that does not parse is priced at 0, and the
//! rest of the batch runs at once (not at the deadline).
use async_graphql::{
    BatchRequest, Context, EmptyMutation, EmptySubscription, Object, Request, Schema,
};
use fanout_budget::{
    cost::{CostTable, FieldCost},
    inbound::Caller,
    Config, Engine, FanoutContext, FanoutExtension,
};

struct Query;

#[Object]
impl Query {
    async fn limit(&self, ctx: &Context<'_>) -> async_graphql::Result<u64> {
        Ok(ctx.fanout_request()?.budget().limit())
    }
}

/// An engine that refuses over its estimate (`limit` costs one read, the
/// budget is `max_reads`), and the schema with its extension.
fn priced(max_reads: u64) -> (Engine, Schema<Query, EmptyMutation, EmptySubscription>) {
    let mut config = Config::default();
    config.budget.refuse_over_estimate = true;
    config.budget.max_reads = max_reads;
    config.budget.deadline_ms = 30_000;
    let costs = CostTable::new().field("Query", "limit", FieldCost::reads(1));
    let engine = Engine::builder(config).costs(costs).build();
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .finish();
    (engine, schema)
}

#[tokio::test(start_paused = true)]
async fn a_refused_operation_does_not_hold_the_batch_until_the_deadline() {
    let (engine, schema) = priced(30);
    for broken in ["{ limit ", "fragment A on Query { ...A } { ...A }"] {
        let fanout = engine.begin_request(Caller::Public);
        fanout.expect_operations(2);
        let started = tokio::time::Instant::now();
        let batch = BatchRequest::Batch(vec![Request::new("{ limit }"), Request::new(broken)]);
        let responses = match schema.execute_batch(batch.data(fanout)).await {
            async_graphql::BatchResponse::Batch(responses) => responses,
            single => panic!("a batch answered {single:?}"),
        };
        // On paused time a wait for the deadline would jump straight to it.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "{broken}: waited"
        );
        let ok = &responses[0];
        assert!(ok.errors.is_empty(), "{broken}: {:?}", ok.errors);
        assert_eq!(ok.data.to_string(), "{limit: 30}");
        assert!(!responses[1].errors.is_empty(), "{broken} is refused");
    }
}

#[tokio::test]
async fn a_refused_batch_names_no_invalid_location() {
    let (engine, schema) = priced(1);
    let fanout = engine.begin_request(Caller::Public);
    fanout.expect_operations(2);
    let batch = BatchRequest::Batch(vec![Request::new("{ limit }"), Request::new("{ limit }")]);
    let answer = serde_json::to_value(schema.execute_batch(batch.data(fanout)).await).unwrap();
    for response in answer.as_array().unwrap() {
        let error = &response["errors"][0];
        assert_eq!(
            error["extensions"]["code"], "FANOUT_ESTIMATE_EXCEEDS_BUDGET",
            "{response}"
        );
        assert!(
            error.get("locations").is_none(),
            "no location at all: {error}"
        );
        assert!(response["data"].is_null());
    }
}

/// Refuses, in `prepare_request`, every operation whose text names `refused`
/// (as a persisted-query lookup refuses an unknown hash); one whose text
/// names `late` it passes on after a turn.
struct Refusing;

impl async_graphql::extensions::ExtensionFactory for Refusing {
    fn create(&self) -> std::sync::Arc<dyn async_graphql::extensions::Extension> {
        std::sync::Arc::new(Refusing)
    }
}

#[async_trait::async_trait]
impl async_graphql::extensions::Extension for Refusing {
    async fn prepare_request(
        &self,
        ctx: &async_graphql::extensions::ExtensionContext<'_>,
        request: Request,
        next: async_graphql::extensions::NextPrepareRequest<'_>,
    ) -> async_graphql::ServerResult<Request> {
        if request.query.contains("refused") {
            return Err(async_graphql::ServerError::new("refused here", None));
        }
        if request.query.contains("late") {
            // Priced after the batch's other operations were polled once.
            tokio::task::yield_now().await;
        }
        next.run(ctx, request).await
    }
}

#[tokio::test(start_paused = true)]
async fn an_operation_refused_by_a_later_extension_does_not_hold_the_batch() {
    let mut config = Config::default();
    config.budget.refuse_over_estimate = true;
    config.budget.deadline_ms = 30_000;
    let costs = CostTable::new().field("Query", "limit", FieldCost::reads(1));
    let engine = Engine::builder(config).costs(costs).build();
    // Registered after the engine's extension: it prepares the request
    // inside the engine's `prepare_request`, before the operation is priced.
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .extension(Refusing)
        .finish();
    let fanout = engine.begin_request(Caller::Public);
    fanout.expect_operations(2);
    let started = tokio::time::Instant::now();
    let batch = BatchRequest::Batch(vec![
        Request::new("{ limit }"),
        Request::new("query refused { limit }"),
    ]);
    let responses = match schema.execute_batch(batch.data(fanout)).await {
        async_graphql::BatchResponse::Batch(responses) => responses,
        single => panic!("a batch answered {single:?}"),
    };
    // On paused time a wait for the deadline would jump straight to it.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(1),
        "the batch waited for the refused operation"
    );
    assert!(responses[0].errors.is_empty(), "{:?}", responses[0].errors);
    assert_eq!(responses[1].errors[0].message, "refused here");
}

#[tokio::test(start_paused = true)]
async fn an_operation_refused_before_it_was_priced_counts_once_at_the_barrier() {
    // Two operations of one read each, a budget of one: the batch's worst
    // case, two, refuses both — unless the refused one counted twice and
    // the barrier opened before the late one was priced.
    let (engine, _) = priced(1);
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .extension(Refusing)
        .finish();
    let fanout = engine.begin_request(Caller::Public);
    fanout.expect_operations(3);
    let batch = BatchRequest::Batch(vec![
        Request::new("{ limit }"),
        Request::new("query refused { limit }"),
        Request::new("query late { limit }"),
    ]);
    let answer = serde_json::to_value(schema.execute_batch(batch.data(fanout)).await).unwrap();
    let codes: Vec<_> = (answer.as_array().unwrap().iter())
        .map(|response| response["errors"][0]["extensions"]["code"].clone())
        .collect();
    assert_eq!(codes[0], "FANOUT_ESTIMATE_EXCEEDS_BUDGET", "{answer}");
    assert_eq!(codes[2], "FANOUT_ESTIMATE_EXCEEDS_BUDGET", "{answer}");
    assert_eq!(
        answer[1]["errors"][0]["message"], "refused here",
        "{answer}"
    );
}
