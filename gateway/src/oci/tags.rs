//! A repository's tag list as the gateway keeps it for one request: every
//! name in one buffer, so a list of a million tags is three allocations,
//! not a million — parsed straight from the registry's JSON pages, without
//! a `String` per tag on the way.

use serde::de::{DeserializeSeed, Deserializer, SeqAccess, Visitor};
use std::fmt;

/// Every tag of a repository, in the registry's order, with a lookup by name.
///
/// In memory it costs its names' bytes plus 8 bytes a tag (where each name
/// ends, and the order by name), about what the JSON it came from costs.
#[derive(Debug, Default)]
pub struct Tags {
    /// The names, one after another.
    names: String,
    /// Where each name ends in `names`.
    ends: Vec<u32>,
    /// Positions ordered by (name, position): the lookup's index.
    by_name: Vec<u32>,
}

impl Tags {
    /// How many tags.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The tag at `i`, in the registry's order.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)? as usize;
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1] as usize,
        };
        Some(&self.names[start..end])
    }

    /// The tags from `start` on, in order.
    pub fn iter_from(&self, start: usize) -> impl Iterator<Item = &str> {
        (start..self.len()).filter_map(|i| self.get(i))
    }

    /// Where `tag` first is in the list.
    pub fn position(&self, tag: &str) -> Option<usize> {
        let name = |p: &u32| self.get(*p as usize).unwrap_or_default();
        let at = self.by_name.partition_point(|p| name(p) < tag);
        let p = *self.by_name.get(at)?;
        (name(&p) == tag).then_some(p as usize)
    }
}

/// Tags read page by page, then indexed once.
#[derive(Debug, Default)]
pub(crate) struct TagsBuilder {
    names: String,
    ends: Vec<u32>,
}

impl TagsBuilder {
    /// Appends the `tags` of one page's JSON body (absent or `null`: none).
    pub(crate) fn page(&mut self, body: &[u8]) -> serde_json::Result<()> {
        let mut de = serde_json::Deserializer::from_slice(body);
        de.deserialize_map(PageVisitor(self))?;
        de.end()
    }

    /// The list, indexed.
    pub(crate) fn build(self) -> Tags {
        let mut tags = Tags {
            names: self.names,
            ends: self.ends,
            by_name: Vec::new(),
        };
        let mut by_name: Vec<u32> = (0..tags.len() as u32).collect();
        by_name.sort_by(|a, b| {
            let name = |p: &u32| tags.get(*p as usize).unwrap_or_default();
            name(a).cmp(name(b)).then(a.cmp(b))
        });
        tags.by_name = by_name;
        tags
    }

    fn push(&mut self, tag: &str) -> Result<(), &'static str> {
        self.names.push_str(tag);
        let end = u32::try_from(self.names.len()).map_err(|_| "tag list past 4 GiB")?;
        self.ends.push(end);
        Ok(())
    }
}

/// `{"name": …, "tags": [ … ]}`: the tags go into the builder, the rest is skipped.
struct PageVisitor<'a>(&'a mut TagsBuilder);

impl<'de> Visitor<'de> for PageVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tag list object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == "tags" {
                map.next_value_seed(Names(self.0))?;
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// The `tags` array (or `null`), each name appended as it is read.
struct Names<'a>(&'a mut TagsBuilder);

impl<'de> DeserializeSeed<'de> for Names<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for Names<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of tag names")
    }

    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_seq(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Name(self.0))?.is_some() {}
        Ok(())
    }
}

/// One name, appended without an allocation of its own.
struct Name<'a>(&'a mut TagsBuilder);

impl<'de> DeserializeSeed<'de> for Name<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Name<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tag name")
    }

    fn visit_str<E: serde::de::Error>(self, tag: &str) -> Result<(), E> {
        self.0.push(tag).map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pages: &[&str]) -> Tags {
        let mut builder = TagsBuilder::default();
        for page in pages {
            builder.page(page.as_bytes()).unwrap();
        }
        builder.build()
    }

    #[test]
    fn pages_in_order_with_a_lookup() {
        let t = tags(&[
            r#"{"name":"a/b","tags":["v2","v1","lat\u0065st"]}"#,
            r#"{"tags":["v1","z"],"name":"a/b"}"#,
        ]);
        let all: Vec<_> = t.iter_from(0).collect();
        assert_eq!(all, ["v2", "v1", "latest", "v1", "z"]);
        assert_eq!(t.position("v1"), Some(1), "the first of two");
        assert_eq!(t.position("latest"), Some(2));
        assert_eq!(t.position("z"), Some(4));
        assert_eq!(t.position("v3"), None);
        assert_eq!(t.iter_from(3).collect::<Vec<_>>(), ["v1", "z"]);
    }

    #[test]
    fn null_or_absent_tags_are_none() {
        assert!(tags(&[r#"{"name":"a","tags":null}"#, r#"{"name":"a"}"#]).is_empty());
    }

    #[test]
    fn not_a_tag_list_is_an_error() {
        let mut builder = TagsBuilder::default();
        assert!(builder.page(br#"{"tags":[1,2]}"#).is_err());
        assert!(builder.page(br#"["v1"]"#).is_err());
        assert!(builder.page(br#"{"tags":["v1"]} trailing"#).is_err());
    }
}
