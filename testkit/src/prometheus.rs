//! Reading a Prometheus text page (what `/metrics` serves) in tests.

use std::collections::BTreeSet;

/// Every `host` label value on `page`, and the number of series that carry one.
pub fn host_labels(page: &str) -> (BTreeSet<&str>, usize) {
    let mut hosts = BTreeSet::new();
    let mut series = 0;
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        if let Some((_, rest)) = line.split_once("host=\"") {
            hosts.insert(rest.split_once('"').map_or(rest, |(host, _)| host));
            series += 1;
        }
    }
    (hosts, series)
}

/// The value of the series `name{…}` whose labels include every one of `labels`.
pub fn value(page: &str, name: &str, labels: &[&str]) -> Option<f64> {
    page.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|label| l.contains(label)))
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
}
