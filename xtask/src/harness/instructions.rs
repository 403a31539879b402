//! `cargo xtask instructions`: the user-space instructions of one post+poll round on the
//! `unsafe` calls and on the owned-buffer path, counted by callgrind on the device (in the VM
//! where the host has none), and their ratio. See `docs/benchmarks.md` for the method.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use super::build::build_release_bin;
use super::vm::{self, guest_prelude, shell_quote};

/// The modes `instructions` measures, the reference first.
const MODES: [&str; 2] = ["unsafe", "owned"];

/// `cargo xtask instructions [ROUNDS]` (default 2000).
pub(crate) fn instructions(root: &Path, args: &[String]) -> Result<(), String> {
    let rounds: u32 = match args.first() {
        Some(n) => n.parse().map_err(|_| format!("not a round count: {n}"))?,
        None => 2000,
    };
    if rounds == 0 {
        return Err("the round count must be positive".into());
    }
    let binary = build_release_bin(root, "rdma-benches", "instructions")?;
    let work = root.join(".rdma-test").join(std::process::id().to_string());
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let out = |mode: &str| work.join(format!("callgrind.{mode}.out"));
    let mut commands = String::new();
    for mode in MODES {
        commands.push_str(&format!(
            "valgrind --tool=callgrind --toggle-collect='measured_*' --callgrind-out-file={out} \
             {binary} {mode} {rounds} > {log} 2>&1 || {{ cat {log}; fail \"callgrind {mode} failed\"; }}\n",
            out = shell_quote(&out(mode).to_string_lossy()),
            binary = shell_quote(&binary),
            log = shell_quote(&work.join(format!("{mode}.log")).to_string_lossy()),
        ));
    }
    if super::host_has_active_device() {
        let status = Command::new("sh")
            .args(["-ec", &commands.replace("fail ", "echo ")])
            .status()
            .map_err(|e| format!("running valgrind: {e}"))?;
        if !status.success() {
            return Err("callgrind failed".into());
        }
    } else {
        let script = work.join("instructions.sh");
        let mut text = guest_prelude();
        text.push_str("echo \"guest: ==> callgrind on the post and poll calls\"\n");
        text.push_str(&commands);
        text.push_str("echo \"guest: instructions ok\"\necho \"guest: done\"\n");
        std::fs::write(&script, text).map_err(|e| format!("writing {}: {e}", script.display()))?;
        let run = vm::boot_vm(root, &script, "guest: ==>", vm::timeout_from_env())?;
        let problems = run.problems();
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        if !run.log.lines().any(|l| l == "guest: instructions ok") {
            return Err("callgrind failed in the VM".into());
        }
    }
    let mut per_round = Vec::new();
    for mode in MODES {
        let functions = inclusive_costs(&out(mode))?;
        if functions.is_empty() {
            return Err(format!("callgrind counted no measured function ({mode})"));
        }
        let total: u64 = functions.values().sum();
        println!(
            "{mode}: {:.1} instructions per round ({total} in {rounds} rounds)",
            total as f64 / f64::from(rounds)
        );
        for (function, cost) in &functions {
            println!("  {function:<28} {:>8.1}", *cost as f64 / f64::from(rounds));
        }
        per_round.push(total as f64 / f64::from(rounds));
    }
    println!("owned / unsafe: {:.3}", per_round[1] / per_round[0]);
    Ok(())
}

/// The inclusive instruction count of each measured function in callgrind output `file`, as
/// `callgrind_annotate --inclusive=yes` reports it.
fn inclusive_costs(file: &Path) -> Result<BTreeMap<String, u64>, String> {
    let output = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100"])
        .arg(file)
        .output()
        .map_err(|e| format!("running callgrind_annotate: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "callgrind_annotate {}: {}",
            file.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(parse_annotate(&String::from_utf8_lossy(&output.stdout)))
}

/// The `measured_*` lines of `callgrind_annotate` output: `1,234,567 (12.3%)  ???:measured_x
/// [/path]` gives `measured_x` → 1234567.
fn parse_annotate(text: &str) -> BTreeMap<String, u64> {
    let mut costs = BTreeMap::new();
    for line in text.lines() {
        let Some(at) = line.find("measured_") else {
            continue;
        };
        let name: String = line[at..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let digits: String = line
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ',')
            .filter(char::is_ascii_digit)
            .collect();
        if let Ok(cost) = digits.parse::<u64>() {
            costs.entry(name).or_insert(cost);
        }
    }
    costs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotate_lines_give_each_measured_function_once() {
        let text = "\
--------------------------------------------------------------------------------
Ir                 file:function
--------------------------------------------------------------------------------
1,200,000 (100.0%)  PROGRAM TOTALS
  640,000 (53.33%)  ???:measured_poll_owned [/x/instructions]
  400,123 (33.34%)  ???:measured_post_send_owned [/x/instructions]
  300,000 (25.00%)  ???:rdma_verbs::owned::poll_each [/x/instructions]
      900 ( 0.08%)  ???:measured_take'2 [/x/instructions]
";
        let costs = parse_annotate(text);
        assert_eq!(
            costs.into_iter().collect::<Vec<_>>(),
            [
                ("measured_poll_owned".to_string(), 640_000),
                ("measured_post_send_owned".to_string(), 400_123),
                ("measured_take".to_string(), 900),
            ]
        );
    }
}
