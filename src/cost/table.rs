//! The declared costs: a [`FieldCost`] per `Type.field`, in a [`CostTable`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What resolving one field may cost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldCost {
    pub(crate) reads: u64,
    pub(crate) times: Multiplier,
    /// The read of its object this field's reads are, if shared.
    pub(crate) shared: Option<String>,
    /// The read of the object it returns this field's reads are.
    pub(crate) provides: Option<String>,
    /// The fields of the returned object that `times` sizes (`@listSize(sizedFields:)`,
    /// a connection's `nodes` or `edges`); empty: the whole sub-selection.
    pub(crate) sized: Vec<String>,
}

/// How many times a field's sub-selection may be resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Multiplier {
    #[default]
    One,
    Fixed(u64),
    Arg(String),
    Len(String),
    /// `@listSize(slicingArguments:, assumedSize:, requireOneSlicingArgument:)`.
    Slicing(Slicing),
}

/// A list sized by its slicing arguments (`@listSize`): the largest of those
/// given, else `assumed` (else 0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Slicing {
    /// Argument paths: `first`, or `filter.max` into an input object.
    pub(crate) paths: Vec<String>,
    /// `assumedSize`: the size when no slicing argument is given.
    pub(crate) assumed: Option<u64>,
    /// `requireOneSlicingArgument`: exactly one must be given.
    pub(crate) require_one: bool,
}

impl FieldCost {
    /// Resolving the field sends at most `reads` upstream reads.
    pub fn reads(reads: u64) -> Self {
        Self {
            reads,
            times: Multiplier::One,
            shared: None,
            provides: None,
            sized: Vec::new(),
        }
    }

    /// The field's reads are its object's read named `key` — one read
    /// however many fields of the object need it (a repository's tag list,
    /// needed by its `tags` and its `tag`): priced once per object, free when
    /// the field that returned the object [provides](Self::provides) it or an
    /// earlier field of the same object made it. (Inside a fragment, priced
    /// once for every place it is spread, it is counted again: the estimate
    /// stays an upper bound.)
    pub fn shared(mut self, key: &str) -> Self {
        self.shared = Some(key.to_string());
        self
    }

    /// The field's reads are the read named `key` of the object it returns
    /// (`repository(name)` reads the repository's tag list): that object's
    /// [`shared`](Self::shared) fields of `key` are then free.
    pub fn provides(mut self, key: &str) -> Self {
        self.provides = Some(key.to_string());
        self
    }

    /// The sub-selection is resolved once per item, and the number of items is
    /// the value of argument `arg` (its default when absent).
    pub fn times_arg(mut self, arg: &str) -> Self {
        self.times = Multiplier::Arg(arg.to_string());
        self
    }

    /// The sub-selection is resolved once per element of list argument
    /// `arg` (`items(ids: [1, 2, 3])`: 3 times, given inline or as a
    /// variable). Absent, it is the argument's numeric default, else 0: give
    /// a priced list argument no default list.
    pub fn times_len(mut self, arg: &str) -> Self {
        self.times = Multiplier::Len(arg.to_string());
        self
    }

    /// The sub-selection is resolved at most `n` times.
    pub fn times(mut self, n: u64) -> Self {
        self.times = Multiplier::Fixed(n);
        self
    }
}

/// The declared costs of a schema's fields.
///
/// ```
/// use fanout_budget::{Config, Engine, cost::{CostTable, FieldCost}};
///
/// // `Query.repositories(first)` reads one page, then each row's sub-selection.
/// let costs = CostTable::new()
///     .field("Query", "repositories", FieldCost::reads(1).times_arg("first"))
///     .field("Repository", "manifest", FieldCost::reads(1));
/// assert_eq!(costs.get("Repository", "manifest"), Some(&FieldCost::reads(1)));
/// let engine = Engine::builder(Config::default()).costs(costs).build();
/// # drop(engine);
/// ```
#[derive(Clone, Debug, Default)]
pub struct CostTable {
    /// By type, then field (looked up with borrowed names).
    fields: HashMap<String, HashMap<String, FieldCost>>,
    /// Its contents' own number (a copy shares it, a change renews it): a
    /// compiled cost formula is kept for one.
    pub(crate) id: Stamp,
}

/// A number never given twice in the process, telling a [`CostTable`]'s or
/// a schema's types' contents apart from any other's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp(u64);

impl Default for Stamp {
    fn default() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Stamp(NEXT.fetch_add(1, Relaxed))
    }
}

impl CostTable {
    /// An empty table: every field costs 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares the cost of `type_name.field`.
    pub fn field(mut self, type_name: &str, field: &str, cost: FieldCost) -> Self {
        self.fields
            .entry(type_name.to_string())
            .or_default()
            .insert(field.to_string(), cost);
        self.id = Stamp::default();
        self
    }

    /// The declared cost of `type_name.field`, if any.
    pub fn get(&self, type_name: &str, field: &str) -> Option<&FieldCost> {
        self.fields.get(type_name)?.get(field)
    }
}
