//! Building the test binaries, listing their tests, running the doc tests.

use std::path::Path;
use std::process::{Command, Stdio};

use super::verdict::{self, Output};

/// One test executable cargo built, and the package directory it runs in.
#[derive(Clone, Debug)]
pub(crate) struct TestBinary {
    /// `package-directory/target`, for example `rdma-verbs/scope`.
    pub(crate) name: String,
    pub(crate) path: String,
    pub(crate) package_dir: String,
    /// Whether it holds a library's or a program's unit tests (the tests inside `src/`), as
    /// opposed to an integration test target or an example.
    pub(crate) unit: bool,
}

/// Runs `cargo test --no-run <args>` in `root` and returns the test executables it built.
pub(crate) fn build_test_binaries(
    root: &Path,
    args: &[&str],
    envs: &[(&str, &str)],
) -> Result<Vec<TestBinary>, String> {
    let output = Command::new(env!("CARGO"))
        .current_dir(root)
        .args([
            "test",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(args)
        .envs(envs.iter().copied())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !output.status.success() {
        return Err("building the tests failed".to_string());
    }
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        if !line.contains("\"reason\":\"compiler-artifact\"") || !profile_is_test(line) {
            continue;
        }
        let (Some(path), Some(manifest), Some(name)) = (
            json_string(line, "executable"),
            json_string(line, "manifest_path"),
            json_string(line, "name"),
        ) else {
            continue;
        };
        let package_dir = Path::new(&manifest)
            .parent()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let package = Path::new(&package_dir)
            .file_name()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        binaries.push(TestBinary {
            name: binary_name(&package, &name, line),
            path,
            package_dir,
            unit: is_unit(line),
        });
    }
    binaries.sort_by(|a, b| a.name.cmp(&b.name));
    binaries.dedup_by(|a, b| a.path == b.path);
    if binaries.is_empty() {
        return Err("cargo built no test binaries".to_string());
    }
    Ok(binaries)
}

/// The workspace's test binaries (all but xtask's own, which `cargo test -p xtask` runs): the
/// libraries', binaries', test targets' and examples' tests. Not the bench targets: the
/// criterion benches take criterion's arguments, not libtest's, and `cargo xtask bench` runs
/// them on the device.
pub(crate) fn build_tests(root: &Path) -> Result<Vec<TestBinary>, String> {
    build_test_binaries(
        root,
        &[
            "--workspace",
            "--exclude",
            "xtask",
            "--lib",
            "--bins",
            "--tests",
            "--examples",
            "--all-features",
        ],
        &[],
    )
}

/// Builds binary `bin` of `package` with the release profile; returns its path.
pub(crate) fn build_release_bin(root: &Path, package: &str, bin: &str) -> Result<String, String> {
    let output = Command::new(env!("CARGO"))
        .current_dir(root)
        .args(["build", "--release", "--package", package, "--bin", bin])
        .arg("--message-format=json-render-diagnostics")
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("building {bin} failed"));
    }
    let suffix = format!("/{bin}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\""))
        .filter_map(|l| json_string(l, "executable"))
        .find(|p| p.ends_with(&suffix))
        .ok_or_else(|| format!("cargo did not report the {bin} binary"))
}

/// Runs `cargo bench --no-run --package <package>` in `root` and returns the paths of the
/// bench executables it built (targets of kind `bench`).
pub(crate) fn build_bench_binaries(root: &Path, package: &str) -> Result<Vec<String>, String> {
    let output = Command::new(env!("CARGO"))
        .current_dir(root)
        .args(["bench", "--no-run", "--package", package])
        .arg("--message-format=json-render-diagnostics")
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !output.status.success() {
        return Err("building the benches failed".to_string());
    }
    let mut binaries: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\""))
        .filter(|l| l.contains("\"kind\":[\"bench\"]"))
        .filter_map(|l| json_string(l, "executable"))
        .collect();
    binaries.sort();
    binaries.dedup();
    if binaries.is_empty() {
        return Err(format!("cargo built no bench of {package}"));
    }
    Ok(binaries)
}

/// The release tools the benchmark tasks run: `(package, binary)`.
const RELEASE_TOOLS: &[(&str, &str)] = &[
    ("rdma-benches", "lat"),
    ("rdma-benches", "bw"),
    ("rdma-benches", "instructions"),
    ("rdma-dsm", "dsm"),
];

/// `cargo xtask build-benches`: builds, without running anything, what the benchmark tasks
/// run: the criterion benches (bench profile), the release tools ([`RELEASE_TOOLS`]) and the C
/// reference program of the instruction counts, so that none of them can stop building
/// between runs of the tier that runs them.
pub(crate) fn build_benches(root: &Path, args: &[String]) -> Result<(), String> {
    if let Some(arg) = args.first() {
        return Err(format!("build-benches takes no arguments (got `{arg}`)"));
    }
    let benches = build_bench_binaries(root, "rdma-benches")?;
    println!("build-benches: {} criterion bench binaries", benches.len());
    for (package, bin) in RELEASE_TOOLS {
        let path = build_release_bin(root, package, bin)?;
        println!("build-benches: {path}");
    }
    let c = build_c_program(root, "benches/c/post_poll.c", "post_poll")?;
    println!("build-benches: {c}");
    Ok(())
}

/// Compiles the C program `source` (relative to `root`) with `cc -O2` against libibverbs into
/// `target/c/<name>` and returns its path. `-O2` is how distributions build rdma-core and
/// perftest; warnings are errors so that the reference cannot rot quietly.
pub(crate) fn build_c_program(root: &Path, source: &str, name: &str) -> Result<String, String> {
    let dir = root.join("target").join("c");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let out = dir.join(name);
    let status = Command::new("cc")
        .current_dir(root)
        .args(["-O2", "-g", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg(source)
        .arg("-libverbs")
        .status()
        .map_err(|e| format!("running cc: {e}"))?;
    if !status.success() {
        return Err(format!("compiling {source} failed ({status})"));
    }
    Ok(out.to_string_lossy().into_owned())
}

/// A test binary's name in the harness: `package/target`, and for the unit tests of a
/// program, `package/target-bin`, so that they differ from an integration test of the same
/// name (`examples/src/bin/rdma_rw.rs` and `examples/tests/rdma_rw.rs`). Names carry no
/// spaces: the guest's status file is `CODE NAME` per line.
fn binary_name(package: &str, target: &str, line: &str) -> String {
    if line.contains("\"kind\":[\"bin\"]") {
        format!("{package}/{target}-bin")
    } else {
        format!("{package}/{target}")
    }
}

/// Whether an artifact line is a library's or a program's own unit tests: its target's kind
/// is `lib` (or another library kind) or `bin`.
fn is_unit(line: &str) -> bool {
    [
        "\"kind\":[\"lib\"]",
        "\"kind\":[\"rlib\"]",
        "\"kind\":[\"bin\"]",
    ]
    .iter()
    .any(|kind| line.contains(kind))
}

/// Whether an artifact line was built by the test profile (a test harness), as opposed to, say,
/// a binary built for integration tests: its `"profile"` object says `"test":true`. (The
/// `"target"` object has a `"test"` field of its own, meaning something else.)
pub(crate) fn profile_is_test(line: &str) -> bool {
    let Some(start) = line.find("\"profile\":{") else {
        return false;
    };
    let profile = &line[start..];
    let end = profile.find('}').unwrap_or(profile.len());
    profile[..end].contains("\"test\":true")
}

/// The value of the first `"key":"value"` string field of a line of cargo's JSON output.
pub(crate) fn json_string(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let mut value = String::new();
    let mut chars = line[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(value),
            '\\' => match chars.next()? {
                'n' => value.push('\n'),
                't' => value.push('\t'),
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
    None
}

/// The tests `binary` will run with `test_args` (the user's filter): its `--list`, run on the
/// host.
pub(crate) fn list_tests(binary: &TestBinary, test_args: &[String]) -> Result<Vec<String>, String> {
    let mut command = Command::new(&binary.path);
    command
        .current_dir(&binary.package_dir)
        .env("CARGO_MANIFEST_DIR", &binary.package_dir)
        .arg("--list");
    if !test_args.iter().any(|a| a.starts_with("--format")) {
        command.args(["--format", "terse"]);
    }
    let output = command
        .args(test_args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {} --list: {e}", binary.path))?;
    if !output.status.success() {
        return Err(format!(
            "`{} --list` failed ({}): {}",
            binary.name,
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(verdict::parse_list(&String::from_utf8_lossy(
        &output.stdout,
    )))
}

/// Runs the workspace's doc tests on the host (they compile examples; none touches a device)
/// and returns their output and whether cargo succeeded. With `skip_compile_fail`, leaves out
/// the compile-fail cases, which [`run_compile_fail`] runs with their error codes checked.
pub(crate) fn run_doc_tests(
    root: &Path,
    test_args: &[String],
    skip_compile_fail: bool,
) -> Result<(Output, bool), String> {
    println!("harness: doc tests (host)");
    let mut command = Command::new(env!("CARGO"));
    command.args([
        "test",
        "--workspace",
        "--exclude",
        "xtask",
        "--all-features",
        "--doc",
        "--",
    ]);
    command.args(test_args);
    if skip_compile_fail {
        command.args(["--skip", COMPILE_FAIL_FILTER]);
    }
    run_libtest(root, command)
}

/// The doc tests of `rdma-verbs`'s `compile_fail` module: its compile-fail cases.
const COMPILE_FAIL_FILTER: &str = "compile_fail::";

/// Runs the compile-fail cases of `rdma-verbs` (doc tests of its `compile_fail` module) with
/// their error codes checked, and returns their output and whether cargo succeeded.
///
/// Stable rustdoc accepts `compile_fail,E0599` but compares the error code only when it runs as
/// a nightly compiler, so a case that fails for another reason (a typo, a moved item) would
/// pass. `RUSTC_BOOTSTRAP=1` makes it compare; no nightly feature is enabled by it. The build
/// goes to a target directory of its own so that the variable does not invalidate the main one.
pub(crate) fn run_compile_fail(root: &Path) -> Result<(Output, bool), String> {
    println!("harness: compile-fail cases, error codes checked (host)");
    let mut command = Command::new(env!("CARGO"));
    command
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_TARGET_DIR", root.join("target").join("compile-fail"))
        .args([
            "test",
            "-p",
            "rdma-verbs",
            "--doc",
            "--",
            COMPILE_FAIL_FILTER,
        ]);
    run_libtest(root, command)
}

/// Runs a cargo command that prints libtest output, echoes it, and parses it.
fn run_libtest(root: &Path, mut command: Command) -> Result<(Output, bool), String> {
    let output = command
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    print!("{text}");
    Ok((verdict::parse_libtest(&text), output.status.success()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_fields_are_read() {
        let line = r#"{"reason":"compiler-artifact","manifest_path":"/w/a b/Cargo.toml","target":{"name":"device"},"executable":"/w/t/x\"y"}"#;
        assert_eq!(
            json_string(line, "manifest_path").as_deref(),
            Some("/w/a b/Cargo.toml")
        );
        assert_eq!(json_string(line, "name").as_deref(), Some("device"));
        assert_eq!(
            json_string(line, "executable").as_deref(),
            Some("/w/t/x\"y")
        );
        assert_eq!(json_string(line, "missing"), None);
    }

    #[test]
    fn a_programs_unit_tests_and_a_test_target_of_the_same_name_differ() {
        let bin = r#"{"reason":"compiler-artifact","target":{"kind":["bin"],"crate_types":["bin"],"name":"rdma_rw","test":true},"profile":{"test":true}}"#;
        let test = r#"{"reason":"compiler-artifact","target":{"kind":["test"],"crate_types":["bin"],"name":"rdma_rw","test":true},"profile":{"test":true}}"#;
        assert_eq!(
            binary_name("examples", "rdma_rw", bin),
            "examples/rdma_rw-bin"
        );
        assert_eq!(binary_name("examples", "rdma_rw", test), "examples/rdma_rw");
    }

    #[test]
    fn only_test_profile_artifacts_are_test_binaries() {
        let harness = r#"{"reason":"compiler-artifact","target":{"name":"x","test":true},"profile":{"opt_level":"0","test":true},"executable":"/t/x-1"}"#;
        let plain_bin = r#"{"reason":"compiler-artifact","target":{"name":"x","test":true},"profile":{"opt_level":"0","test":false},"executable":"/t/x"}"#;
        assert!(profile_is_test(harness));
        assert!(!profile_is_test(plain_bin));
    }
}
