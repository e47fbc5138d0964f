//! The parsed-document cache bounds its memory by `documents::weight`. Here
//! the estimate is held against the heap a parsed document really keeps,
//! counted by this binary's global allocator (on the parsing thread only).
use async_graphql::parser::parse_query;
use fanout_budget::cost::document_weight as weight;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    /// Bytes allocated minus bytes freed, on this thread.
    static NET: Cell<isize> = const { Cell::new(0) };
}

fn add(bytes: isize) {
    NET.with(|net| net.set(net.get() + bytes));
}

// SAFETY: every call is passed on to `System` unchanged; the count is a
// thread-local `Cell` with a constant initialiser (no allocation, no
// destructor), so counting never re-enters the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// (heap the parsed document keeps, its estimated weight)
fn held_and_weighed(text: &str) -> (isize, usize) {
    let before = NET.with(Cell::get);
    let doc = parse_query(text).expect("parses");
    let held = NET.with(Cell::get) - before;
    let weighed = weight(&doc).expect("not too deep");
    (held, weighed)
}

fn texts() -> Vec<(&'static str, String)> {
    let fields: String = (0..300).map(|i| format!("f{i} ")).collect();
    let aliased: String = (0..200)
        .map(|i| format!("a{i}: item(id: {i}) {{ detail {{ value }} }} "))
        .collect();
    let nested = format!("{{ {}x{} }}", "a { ".repeat(30), " }".repeat(30));
    vec![
        ("one field", "{ a }".to_string()),
        (
            "the load query",
            r#"{ repository(name: "bench/app") { tags(first: 4) { nodes { name manifest { digest } } } } }"#.to_string(),
        ),
        ("300 fields", format!("{{ {fields} }}")),
        ("200 aliased fields with arguments", format!("{{ {aliased} }}")),
        ("30 levels", nested),
        (
            "variables, defaults, directives",
            r#"query Q($a: Int = 3, $b: [String!]! = ["x", "y"], $c: In = {k: [1, 2, {z: "w"}]}) @dir(x: 1) {
                 f(a: $a, b: $b, c: $c, d: [1, 2, 3], e: {p: "q", r: [ENUM, null, true]}) @include(if: true) { g }
               }"#
            .to_string(),
        ),
        (
            "fragments and several operations",
            r#"query A { ...F x { ... on T { y ...G } } } query B { ...G }
               fragment F on Query { a b c { d } } fragment G on T { e(f: "long string argument value") }"#
            .to_string(),
        ),
    ]
}

#[test]
fn the_weight_is_within_a_quarter_of_the_real_heap() {
    // Warm up whatever the parser keeps for its thread.
    let _ = parse_query("{ warm { up } }");
    for (name, text) in texts() {
        let (held, weighed) = held_and_weighed(&text);
        assert!(held > 0, "{name}: nothing counted");
        let ratio = weighed as f64 / held as f64;
        eprintln!(
            "{name}: text {} B, holds {held} B, weighed {weighed} B ({ratio:.2}×)",
            text.len()
        );
        assert!(
            (0.8..=1.25).contains(&ratio),
            "{name}: weighed {weighed} bytes, holds {held} ({ratio:.2}×; text {} bytes)",
            text.len()
        );
    }
}

#[test]
fn nesting_past_the_walks_bound_is_not_weighed() {
    use async_graphql::parser::types::{DocumentOperations, Selection};
    use async_graphql::parser::Positioned;
    // The parser stops at 64 levels; a document built by hand can go on.
    assert!(parse_query(format!("{{ {}x{} }}", "a { ".repeat(70), " }".repeat(70))).is_err());
    let mut doc = parse_query("{ a { x } }").expect("parses");
    let DocumentOperations::Single(op) = &mut doc.operations else {
        panic!("one operation")
    };
    let set = &mut op.node.selection_set.node;
    let Selection::Field(a) = set.items[0].node.clone() else {
        panic!("a field")
    };
    let pos = set.items[0].pos;
    let mut nested = a.clone();
    for _ in 0..300 {
        let mut outer = a.clone();
        outer.node.selection_set.node.items = vec![Positioned::new(Selection::Field(nested), pos)];
        nested = outer;
    }
    set.items = vec![Positioned::new(Selection::Field(nested), pos)];
    assert_eq!(weight(&doc), None);
    // 64 levels, as deep as the parser goes, are weighed.
    let deepest = format!("{{ {}x{} }}", "a { ".repeat(62), " }".repeat(62));
    assert!(weight(&parse_query(deepest).expect("parses")).is_some());
}
