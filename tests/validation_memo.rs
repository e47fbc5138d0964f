//! What async-graphql's validation concluded for a document is kept with
//! the document (`document/memo.rs`) and answers for the same text, schema,
//! operation name and variables — and never for anything else: the same
//! text with variables that change its validity or its complexity, another
//! operation name, another schema (another mode or limit) on the same
//! engine. Each case keeps a verdict first, then sends what it does not fit
//! and expects async-graphql's own answer; reusing the kept verdict makes it
//! fail.
//!
//! Whether a verdict answered is seen by an extension mounted after
//! `FanoutExtension`: its `validation` hook runs only when async-graphql
//! validates.

use async_graphql::extensions::{Extension, ExtensionContext, ExtensionFactory, NextValidation};
use async_graphql::{
    EmptyMutation, EmptySubscription, Object, Request, Schema, ServerError, SimpleObject,
    ValidationMode, ValidationResult, Variables,
};
use axum::Router;
use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

struct Query;

#[derive(SimpleObject)]
struct Item {
    a: i32,
}

#[Object]
impl Query {
    async fn echo(&self, x: Option<i32>) -> i32 {
        x.unwrap_or(0)
    }

    /// Its complexity grows with `first`, a variable's value or a literal.
    #[graphql(complexity = "first.max(0) as usize * child_complexity")]
    async fn items(&self, first: i32) -> Vec<Item> {
        (0..first.clamp(0, 3)).map(|a| Item { a }).collect()
    }
}

type S = Schema<Query, EmptyMutation, EmptySubscription>;

/// Counts the validations async-graphql runs (mounted after the engine's
/// extension, it is not reached when a kept verdict answers).
#[derive(Clone, Default)]
struct Validations(Arc<AtomicUsize>);

impl Validations {
    fn count(&self) -> usize {
        self.0.load(Relaxed)
    }
}

impl ExtensionFactory for Validations {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(self.clone())
    }
}

#[async_trait::async_trait]
impl Extension for Validations {
    async fn validation(
        &self,
        ctx: &ExtensionContext<'_>,
        next: NextValidation<'_>,
    ) -> Result<ValidationResult, Vec<ServerError>> {
        self.0.fetch_add(1, Relaxed);
        next.run(ctx).await
    }
}

fn engine() -> Engine {
    Engine::new(Config::default())
}

/// A schema on `extension`, counting its validations; `limit`: its
/// `limit_complexity`.
fn schema(
    extension: FanoutExtension,
    limit: Option<usize>,
    mode: ValidationMode,
) -> (S, Validations) {
    let count = Validations::default();
    let mut builder = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(extension)
        .extension(count.clone())
        .validation_mode(mode);
    if let Some(limit) = limit {
        builder = builder.limit_complexity(limit);
    }
    (builder.finish(), count)
}

fn request(query: &str, name: Option<&str>, variables: Value) -> Request {
    let mut request = Request::new(query).variables(Variables::from_json(variables));
    if let Some(name) = name {
        request = request.operation_name(name);
    }
    request
}

/// The errors' messages (empty: it ran).
async fn run(schema: &S, query: &str, name: Option<&str>, variables: Value) -> Vec<String> {
    let response = schema.execute(request(query, name, variables)).await;
    response.errors.into_iter().map(|e| e.message).collect()
}

const ECHO: &str = "query ($x: Int) { echo(x: $x) }";

#[tokio::test]
async fn the_same_text_name_and_variables_are_validated_once() {
    let (schema, validations) = schema(
        FanoutExtension::new(&engine()),
        None,
        ValidationMode::Strict,
    );
    for _ in 0..3 {
        assert!(run(&schema, ECHO, None, json!({ "x": 3 })).await.is_empty());
    }
    assert_eq!(validations.count(), 1, "kept after the first");
    // Another value is validated, then kept too.
    assert!(run(&schema, ECHO, None, json!({ "x": 4 })).await.is_empty());
    assert!(run(&schema, ECHO, None, json!({ "x": 4 })).await.is_empty());
    assert_eq!(validations.count(), 2);
    // Variables the document does not define change nothing.
    assert!(run(&schema, ECHO, None, json!({ "x": 3, "y": [1] }))
        .await
        .is_empty());
    assert_eq!(validations.count(), 2);
}

#[tokio::test]
async fn variables_that_make_the_text_invalid_are_validated() {
    let (schema, validations) = schema(
        FanoutExtension::new(&engine()),
        None,
        ValidationMode::Strict,
    );
    assert!(run(&schema, ECHO, None, json!({ "x": 3 })).await.is_empty());
    // `ArgumentsOfCorrectType` checks the variable's value.
    let errors = run(&schema, ECHO, None, json!({ "x": "three" })).await;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("Invalid value for argument"),
        "{errors:?}"
    );
    // A refusal is never kept: validated again, refused again.
    let again = run(&schema, ECHO, None, json!({ "x": "three" })).await;
    assert_eq!(again, errors);
    assert_eq!(validations.count(), 3);
    // Absent and null are values of their own (both valid here).
    assert!(run(&schema, ECHO, None, json!({})).await.is_empty());
    assert!(run(&schema, ECHO, None, json!({ "x": null }))
        .await
        .is_empty());
    assert_eq!(validations.count(), 5);
}

#[tokio::test]
async fn variables_that_raise_the_complexity_past_the_limit_are_validated() {
    let extension = FanoutExtension::new(&engine());
    let (schema, _) = schema(extension, Some(20), ValidationMode::Strict);
    let query = "query ($n: Int!) { items(first: $n) { a } }";
    assert!(run(&schema, query, None, json!({ "n": 2 }))
        .await
        .is_empty());
    let errors = run(&schema, query, None, json!({ "n": 100 })).await;
    assert_eq!(errors, ["Query is too complex."]);
    assert!(run(&schema, query, None, json!({ "n": 2 }))
        .await
        .is_empty());
}

#[tokio::test]
async fn another_operation_name_is_validated() {
    let (schema, validations) = schema(
        FanoutExtension::new(&engine()),
        None,
        ValidationMode::Strict,
    );
    // Variables are put into the selected operation's arguments only.
    let query = "query A($x: Int) { echo(x: $x) } query B { echo(x: 1) }";
    let three = json!({ "x": "three" });
    assert!(run(&schema, query, Some("B"), three.clone())
        .await
        .is_empty());
    assert!(run(&schema, query, Some("B"), three.clone())
        .await
        .is_empty());
    assert_eq!(validations.count(), 1);
    let errors = run(&schema, query, Some("A"), three.clone()).await;
    assert!(
        errors[0].contains("Invalid value for argument"),
        "{errors:?}"
    );
    // A name the document does not define: async-graphql's answer, each time.
    for _ in 0..2 {
        let errors = run(&schema, query, Some("C"), json!({})).await;
        assert_eq!(errors, [r#"Unknown operation named "C""#]);
    }
}

#[tokio::test]
async fn another_schema_on_the_same_engine_is_validated() {
    let engine = engine();
    let query = "{ echo other: echo }";
    // One extension value mounted on two schemas: the first claims it.
    let extension = FanoutExtension::new(&engine);
    let (open, _) = schema(extension.clone(), None, ValidationMode::Strict);
    let (tight, tight_count) = schema(extension, Some(1), ValidationMode::Strict);
    assert!(run(&open, query, None, json!({})).await.is_empty());
    for _ in 0..2 {
        assert_eq!(
            run(&tight, query, None, json!({})).await,
            ["Query is too complex."]
        );
    }
    assert_eq!(
        tight_count.count(),
        2,
        "never answered for the other schema"
    );
    // An extension of its own per schema, one engine (one document cache).
    let (tight, _) = schema(
        FanoutExtension::new(&engine),
        Some(1),
        ValidationMode::Strict,
    );
    assert_eq!(
        run(&tight, query, None, json!({})).await,
        ["Query is too complex."]
    );
    // Fast mode does not check arguments; strict mode on the same engine does.
    let literal = "{ echo(x: \"three\") }";
    let (fast, _) = schema(FanoutExtension::new(&engine), None, ValidationMode::Fast);
    let fast_errors = run(&fast, literal, None, json!({})).await;
    assert!(!fast_errors
        .iter()
        .any(|e| e.contains("Invalid value for argument")));
    let (strict, _) = schema(FanoutExtension::new(&engine), None, ValidationMode::Strict);
    let errors = run(&strict, literal, None, json!({})).await;
    assert!(
        errors[0].contains("Invalid value for argument"),
        "{errors:?}"
    );
}

#[tokio::test]
async fn a_variable_no_operation_defines_is_refused_whatever_its_value() {
    let (schema, _) = schema(
        FanoutExtension::new(&engine()),
        None,
        ValidationMode::Strict,
    );
    let query = "{ echo(x: $u) }";
    for value in [json!(3), json!("three"), json!(3)] {
        let errors = run(&schema, query, None, json!({ "u": value })).await;
        assert!(!errors.is_empty(), "{value}");
    }
}

/// Under `FanoutGraphQL` (the extension set aside, the service admits):
/// the same exactness, through the HTTP service.
#[tokio::test]
async fn under_the_service_the_verdict_fits_its_variables() {
    let engine = engine();
    let (schema, validations) = schema(
        FanoutExtension::new(&engine),
        Some(20),
        ValidationMode::Strict,
    );
    let app = Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    let post = |body: Value| {
        let app = app.clone();
        async move {
            fanout_testkit::post(&app, body.to_string(), &[])
                .await
                .json()
        }
    };
    let query = "query ($n: Int!, $x: Int) { items(first: $n) { a } echo(x: $x) }";
    let ok = json!({ "query": query, "variables": { "n": 2, "x": 1 } });
    // (The service's first request also runs its probe, `{ __typename }`.)
    let answer = post(ok.clone()).await;
    assert_eq!(answer["data"]["echo"], 1, "{answer}");
    let validated = validations.count();
    for _ in 0..2 {
        let answer = post(ok.clone()).await;
        assert_eq!(answer["data"]["echo"], 1, "{answer}");
    }
    assert_eq!(validations.count(), validated, "kept after the first");
    let complex = post(json!({ "query": query, "variables": { "n": 100, "x": 1 } })).await;
    assert_eq!(
        complex["errors"][0]["message"], "Query is too complex.",
        "{complex}"
    );
    let invalid = post(json!({ "query": query, "variables": { "n": 2, "x": "one" } })).await;
    let message = invalid["errors"][0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("Invalid value for argument"), "{invalid}");
    assert_eq!(validations.count(), validated + 2);
}
