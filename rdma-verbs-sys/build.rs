//! Links the system's libibverbs and librdmacm, found through pkg-config.
//!
//! The bindings themselves are checked in (`src/bindings/`), so a build needs neither libclang
//! nor cmake: only the rdma-core development packages.

const DEBIAN_PACKAGES: &str = "libibverbs-dev librdmacm-dev pkg-config";

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");
    if std::env::var_os("DOCS_RS").is_some() {
        // docs.rs has no rdma-core; documentation needs no linking.
        return;
    }
    let mut missing = Vec::new();
    for library in ["libibverbs", "librdmacm"] {
        if let Err(error) = pkg_config::Config::new().probe(library) {
            missing.push(format!("{library} ({})", first_line(&error.to_string())));
        }
    }
    if !missing.is_empty() {
        println!(
            "cargo::error=rdma-verbs-sys: cannot find {} through pkg-config; \
             install the rdma-core development packages (Debian/Ubuntu: \
             `apt-get install {DEBIAN_PACKAGES}`; Fedora/RHEL: `dnf install rdma-core-devel`), \
             or run `cargo xtask setup`",
            missing.join(" and ")
        );
    }
}

fn first_line(text: &str) -> &str {
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(text)
        .trim()
}
