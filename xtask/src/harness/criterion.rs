//! `cargo xtask bench [-- <criterion arguments>]`: the criterion benches of `rdma-benches`
//! (`cargo bench`) on the RDMA device: the host's, or the Soft-RoCE VM's when it has none.
//!
//! Each bench binary first lists its benchmarks (`--list`, with the same arguments, so a
//! filter applies), then runs them; every listed benchmark must have printed its result, so a
//! benchmark that vanished or a binary that stopped early fails the task. Criterion's reports
//! go to `target/criterion` in the workspace, as with `cargo bench`.

use std::path::Path;

use super::build::build_bench_binaries;
use super::vm::{self, shell_quote};

/// The package whose benches run.
const PACKAGE: &str = "rdma-benches";

/// `cargo xtask bench [-- <criterion arguments>]`.
pub(crate) fn bench(root: &Path, args: &[String]) -> Result<(), String> {
    let passed: &[String] = match args.split_first() {
        Some((first, rest)) if first == "--" => rest,
        Some((first, _)) => return Err(format!("unknown option {first}; criterion's go after --")),
        None => &[],
    };
    let binaries = build_bench_binaries(root, PACKAGE)?;
    let work = root
        .join(".rdma-test")
        .join(format!("{}-criterion", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let quoted: Vec<String> = passed.iter().map(|a| shell_quote(a)).collect();
    let quoted = quoted.join(" ");
    let mut script = format!(
        "cd {package_dir} || fail \"no {package_dir}\"\nexport CARGO_TARGET_DIR={target} \
         RDMA_TEST_REQUIRE_DEVICE=1\n",
        package_dir = shell_quote(&root.join("benches").to_string_lossy()),
        target = shell_quote(&root.join("target").to_string_lossy()),
    );
    for (n, binary) in binaries.iter().enumerate() {
        let list = shell_quote(&work.join(format!("{n}.list")).to_string_lossy());
        let out = shell_quote(&work.join(format!("{n}.out")).to_string_lossy());
        let exe = shell_quote(binary);
        script.push_str(&format!(
            "{exe} --bench --list {quoted} > {list} 2>&1 || {{ cat {list}; fail \"listing {n} failed\"; }}\n\
             {exe} --bench {quoted} > {out} 2>&1; rc=$?; cat {out}\n\
             [ $rc = 0 ] || fail \"bench binary {n} failed (exit $rc)\"\n"
        ));
    }
    vm::run_on_device(root, &work, "bench", "criterion benches", &script)?;
    let mut total = 0;
    let mut rows = Vec::new();
    for (n, binary) in binaries.iter().enumerate() {
        let read = |ext: &str| {
            let path = work.join(format!("{n}.{ext}"));
            std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))
        };
        let names = listed(&read("list")?);
        if names.is_empty() {
            return Err(format!(
                "{binary} listed no benchmark (a filter that matches none?)"
            ));
        }
        let out = read("out")?;
        let mut missing = Vec::new();
        for name in &names {
            match estimate(&out, name) {
                Some(time) => rows.push(format!("{name:<40} {time}")),
                None => missing.push(name.as_str()),
            }
        }
        if !missing.is_empty() {
            return Err(format!(
                "{binary}: no result for {} of {} benchmarks: {}",
                missing.len(),
                names.len(),
                missing.join(", ")
            ));
        }
        total += names.len();
    }
    println!("bench: criterion's estimates [lower, estimate, upper] per iteration:");
    for row in &rows {
        println!("  {row}");
    }
    println!(
        "bench: {total} benchmarks of {} binaries ran on the device, each with its result; \
         reports in {}",
        binaries.len(),
        root.join("target/criterion/report/index.html").display()
    );
    Ok(())
}

/// The benchmark names of criterion's `--list` output (`name: benchmark` lines).
fn listed(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_suffix(": benchmark"))
        .map(str::to_string)
        .collect()
}

/// `name`'s result in criterion's output, the bracket of its `time:` line (`[21.1 µs 21.5 µs
/// 22.0 µs]`): on the line that is the name, or starts with it and then spaces, or on the next.
fn estimate(out: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = out.lines().collect();
    lines.iter().enumerate().find_map(|(i, line)| {
        let rest = line.strip_prefix(name)?;
        if !(rest.is_empty() || rest.starts_with(' ')) {
            return None;
        }
        let time = if rest.contains("time:") {
            rest
        } else {
            lines.get(i + 1).filter(|next| next.contains("time:"))?
        };
        let (_, bracket) = time.split_once("time:")?;
        Some(bracket.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_lines_give_names() {
        let text = "latency/send/unsafe/2: benchmark\nWarning: something\npost_poll/send_64/owned: benchmark\n";
        assert_eq!(
            listed(text),
            ["latency/send/unsafe/2", "post_poll/send_64/owned"]
        );
    }

    #[test]
    fn a_result_needs_its_time_line() {
        let out = "\
latency/send/unsafe/2   time:   [21.1 µs 21.5 µs 22.0 µs]
latency/send/unsafe/2048
                        time:   [30.1 µs 30.5 µs 31.0 µs]
latency/send/unsafe/64
Benchmarking latency/send/unsafe/64: Warming up
";
        assert_eq!(
            estimate(out, "latency/send/unsafe/2").as_deref(),
            Some("[21.1 µs 21.5 µs 22.0 µs]")
        );
        assert_eq!(
            estimate(out, "latency/send/unsafe/2048").as_deref(),
            Some("[30.1 µs 30.5 µs 31.0 µs]")
        );
        assert_eq!(estimate(out, "latency/send/unsafe/64"), None);
        assert_eq!(estimate(out, "latency/send/unsafe/20"), None);
    }
}
