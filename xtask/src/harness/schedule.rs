//! Which device test binaries the VM runs at once, and which must run alone.
//!
//! The VM runs its device binaries on [`LANES`] lanes at once (each binary's tests one at a
//! time, `--test-threads=1`), except those in [`ALONE`], which run first, one at a time, with
//! nothing beside them. A binary belongs in [`ALONE`] when a test in it takes a port or link
//! down, reads or asserts on device-wide counters, uses a fixed port or multicast group, times
//! a fault, or exhausts a device-wide resource: each entry says which.

use super::build::TestBinary;

/// How many device binaries the single-node VM runs at once by default (`--lanes N` changes
/// it; 1 runs every binary alone, in name order).
pub(crate) const LANES: usize = 2;

/// The device binaries that run alone, in this order, with why.
pub(crate) const ALONE: &[(&str, &str)] = &[
    (
        "examples/tools",
        "asyncwatch's test takes rxe0's interface down and up: every other binary on rxe0 \
         would lose its port and GID, and see port events",
    ),
    (
        "rdma-cm/connect",
        "counts the system's connection-manager identifiers before and after each test",
    ),
    (
        "rdma-cm/tokio",
        "counts the system's connection-manager identifiers before and after each test",
    ),
    (
        "rdma-cm/multicast",
        "counts the system's connection-manager identifiers before and after each test",
    ),
    (
        "rdma-cm/ud",
        "counts the system's connection-manager identifiers before and after each test",
    ),
    (
        "rdma-verbs/failures",
        "its RNR test waits for the device-wide counter rcvd_rnr_err to grow: another \
         binary's RNR NAKs could grow it",
    ),
];

/// The pooled binaries that start first, longest first (measured: docs/test-harness.md), so
/// that no long binary starts last while the other lane has run dry. Only the order depends
/// on it; the rest follow in name order.
pub(crate) const LONG_FIRST: &[&str] = &[
    "dsm/nodes",
    "benches/lat",
    "rdma-verbs/mw",
    "benches/bw",
    "examples/faults",
];

/// Splits `binaries` into those that run alone (in [`ALONE`]'s order) and the rest, pooled
/// for the lanes ([`LONG_FIRST`] first); with one lane, every binary runs alone in the given
/// order.
pub(crate) fn split(binaries: &[TestBinary], lanes: usize) -> (Vec<TestBinary>, Vec<TestBinary>) {
    if lanes <= 1 {
        return (binaries.to_vec(), Vec::new());
    }
    let alone: Vec<TestBinary> = ALONE
        .iter()
        .filter_map(|(name, _)| binaries.iter().find(|b| b.name == *name).cloned())
        .collect();
    let mut pooled: Vec<TestBinary> = binaries
        .iter()
        .filter(|b| !is_alone(&b.name))
        .cloned()
        .collect();
    let rank = |b: &TestBinary| {
        LONG_FIRST
            .iter()
            .position(|long| *long == b.name)
            .unwrap_or(LONG_FIRST.len())
    };
    pooled.sort_by_key(rank);
    (alone, pooled)
}

/// The names in [`ALONE`] and [`LONG_FIRST`] that are none of `binaries` (a renamed binary
/// would otherwise run pooled, beside another, unnoticed).
pub(crate) fn unknown_names(binaries: &[TestBinary]) -> Vec<&'static str> {
    ALONE
        .iter()
        .map(|(name, _)| *name)
        .chain(LONG_FIRST.iter().copied())
        .filter(|name| !binaries.iter().any(|b| b.name == *name))
        .collect()
}

/// Whether binary `name` must run alone.
pub(crate) fn is_alone(name: &str) -> bool {
    ALONE.iter().any(|(alone, _)| *alone == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binary(name: &str) -> TestBinary {
        TestBinary {
            name: name.to_string(),
            path: format!("/t/{name}"),
            package_dir: "/t".to_string(),
            unit: false,
        }
    }

    #[test]
    fn binaries_run_alone_only_when_listed_and_every_binary_runs_once() {
        let mut all: Vec<TestBinary> = ALONE.iter().map(|(name, _)| binary(name)).collect();
        all.push(binary("p/a-pooled"));
        all.push(binary("p/b-pooled"));
        all.extend(LONG_FIRST.iter().map(|name| binary(name)));
        all.reverse();
        let (alone, pooled) = split(&all, 2);
        let names = |list: &[TestBinary]| list.iter().map(|b| b.name.clone()).collect::<Vec<_>>();
        let listed: Vec<String> = ALONE.iter().map(|(name, _)| name.to_string()).collect();
        assert_eq!(names(&alone), listed, "alone, in the list's order");
        let mut want: Vec<String> = LONG_FIRST.iter().map(|n| n.to_string()).collect();
        want.extend(["p/b-pooled".to_string(), "p/a-pooled".to_string()]);
        assert_eq!(
            names(&pooled),
            want,
            "the long ones first, the rest as given"
        );
        for long in LONG_FIRST {
            assert!(
                !is_alone(long),
                "{long} cannot both run alone and start a lane"
            );
        }
        let (serial, none) = split(&all, 1);
        assert_eq!(
            names(&serial),
            names(&all),
            "one lane: all alone, in the given order"
        );
        assert!(none.is_empty());
        for (name, why) in ALONE {
            assert!(!why.is_empty(), "{name} must say why it runs alone");
        }
        assert!(unknown_names(&all).is_empty());
        let pooled_only = [binary("p/a-pooled")];
        assert_eq!(
            unknown_names(&pooled_only).len(),
            ALONE.len() + LONG_FIRST.len()
        );
    }
}
