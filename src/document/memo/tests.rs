use super::*;
use async_graphql::parser::parse_query;
use async_graphql::CacheControl;

fn kept(query: &str) -> Arc<Kept> {
    Arc::new(Kept::new(query.into(), parse_query(query).unwrap()))
}

fn result(complexity: usize) -> ValidationResult {
    ValidationResult {
        cache_control: CacheControl::default(),
        complexity,
        depth: 1,
    }
}

fn vars(json: serde_json::Value) -> Variables {
    Variables::from_json(json)
}

/// What is kept for `(schema, name, variables)`: `Some(complexity)` when
/// a validation answers, `None` when one would be kept, and `Err` when none
/// can be.
fn lookup(
    kept: &Arc<Kept>,
    schema: u64,
    name: Option<&str>,
    v: &Variables,
) -> Result<Option<usize>, ()> {
    match kept.validation(schema, name, v) {
        Some(Validation::Kept(result)) => Ok(Some(result.complexity)),
        Some(Validation::ToKeep(_)) => Ok(None),
        None => Err(()),
    }
}

fn keep(kept: &Arc<Kept>, schema: u64, name: Option<&str>, v: &Variables, complexity: usize) {
    match kept.validation(schema, name, v) {
        Some(Validation::ToKeep(to_keep)) => to_keep.keep(result(complexity)),
        _ => panic!("nothing to keep"),
    }
}

#[test]
fn a_validation_answers_only_for_its_schema_name_and_variables() {
    let doc = kept("query A($n: Int, $s: String) { a(n: $n) } query B { b }");
    let n3 = vars(serde_json::json!({ "n": 3, "s": "x" }));
    keep(&doc, 1, Some("A"), &n3, 7);
    assert_eq!(lookup(&doc, 1, Some("A"), &n3), Ok(Some(7)));
    // Variables the document does not define are not read.
    let extra = vars(serde_json::json!({ "n": 3, "s": "x", "other": [1, 2] }));
    assert_eq!(lookup(&doc, 1, Some("A"), &extra), Ok(Some(7)));
    // Any other value, absence, or null, is another validation.
    for other in [
        serde_json::json!({ "n": 4, "s": "x" }),
        serde_json::json!({ "n": "3", "s": "x" }),
        serde_json::json!({ "n": 3.0, "s": "x" }),
        serde_json::json!({ "s": "x" }),
        serde_json::json!({ "n": null, "s": "x" }),
        serde_json::json!({ "n": 3, "s": "y" }),
        serde_json::json!({ "n": 3 }),
    ] {
        assert_eq!(
            lookup(&doc, 1, Some("A"), &vars(other.clone())),
            Ok(None),
            "{other}"
        );
    }
    // Another operation name, or none; another schema.
    assert_eq!(lookup(&doc, 1, Some("B"), &n3), Ok(None));
    assert_eq!(lookup(&doc, 1, None, &n3), Ok(None));
    assert_eq!(lookup(&doc, 2, Some("A"), &n3), Ok(None));
    // A name the document does not define is never kept.
    assert_eq!(lookup(&doc, 1, Some("C"), &n3), Err(()));
}

#[test]
fn only_small_scalars_are_kept() {
    let doc = kept("query ($v: In) { a(v: $v) }");
    let long = "x".repeat(MAX_VALUE_BYTES + 1);
    for value in [
        serde_json::json!([1]),
        serde_json::json!({ "a": 1 }),
        serde_json::json!(long),
    ] {
        let v = vars(serde_json::json!({ "v": value }));
        assert_eq!(lookup(&doc, 1, None, &v), Err(()), "{value}");
    }
    let short = vars(serde_json::json!({ "v": "x".repeat(MAX_VALUE_BYTES) }));
    assert_eq!(lookup(&doc, 1, None, &short), Ok(None));
}

#[test]
fn a_document_keeps_at_most_its_reserved_validations() {
    let doc = kept("query ($n: Int) { a(n: $n) }");
    for n in 0..10 {
        keep(&doc, 1, None, &vars(serde_json::json!({ "n": n })), n);
        assert!(doc.validations() <= MAX_VALIDATIONS);
    }
    // The newest are kept, the oldest replaced.
    assert_eq!(
        lookup(&doc, 1, None, &vars(serde_json::json!({ "n": 9 }))),
        Ok(Some(9))
    );
    assert_eq!(
        lookup(&doc, 1, None, &vars(serde_json::json!({ "n": 0 }))),
        Ok(None)
    );
    // Their room is reserved: the variables' values at their largest.
    let value = size_of::<Option<ConstValue>>() + MAX_VALUE_BYTES + 2 * size_of::<usize>();
    let per = size_of::<Validated>() + value;
    // And the cost slot's (formula and slicing check), at its largest.
    let formula = 24 * size_of::<usize>() + MAX_FORMULA_BYTES;
    assert_eq!(reserve(&doc.doc), MAX_VALIDATIONS * per + formula);
}
