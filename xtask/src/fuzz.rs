//! `cargo xtask fuzz [--seconds N]`: the DSM's wire decoders (`dsm::fuzz::decode`) under
//! libFuzzer for N seconds (default 60), with `cargo fuzz` on the pinned nightly (the one Miri
//! uses, [`crate::setup::MIRI_NIGHTLY`]); `cargo-fuzz` is installed first where missing. The
//! corpus grows in `examples/dsm/fuzz/corpus/` between runs. An input that crashed a decoder
//! fails the task with its path: fix the decoder, then copy the input into
//! `examples/dsm/fuzz/regressions/` and list it in that folder's README (a unit test replays
//! every file there).

use std::path::Path;
use std::process::Command;

use crate::setup::MIRI_NIGHTLY;

/// The cargo-fuzz release installed where none is.
const CARGO_FUZZ: &str = "0.13.2";

/// The fuzz target.
const TARGET: &str = "wire";

/// Runs the task.
pub(crate) fn run(root: &Path, args: &[String]) -> Result<(), String> {
    let seconds = match args {
        [] => 60,
        [flag, n] if flag == "--seconds" => n
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("--seconds {n}: a positive number of seconds"))?,
        _ => return Err("usage: cargo xtask fuzz [--seconds N]".to_string()),
    };
    let have = Command::new("cargo")
        .args([&format!("+{MIRI_NIGHTLY}"), "fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        println!("fuzz: installing cargo-fuzz {CARGO_FUZZ}");
        let status = Command::new("cargo")
            .args(["install", "--locked", "cargo-fuzz", "--version", CARGO_FUZZ])
            .status()
            .map_err(|e| format!("cargo install cargo-fuzz: {e}"))?;
        if !status.success() {
            return Err(format!("cargo install cargo-fuzz: {status}"));
        }
    }
    let dir = root.join("examples").join("dsm");
    std::fs::create_dir_all(dir.join("fuzz").join("corpus").join(TARGET))
        .map_err(|e| format!("the corpus folder: {e}"))?;
    println!("fuzz: {TARGET} for {seconds} s (examples/dsm/fuzz)");
    let status = Command::new("cargo")
        .current_dir(&dir)
        .args([&format!("+{MIRI_NIGHTLY}"), "fuzz", "run", TARGET, "--"])
        .arg(format!("-max_total_time={seconds}"))
        .arg("-rss_limit_mb=4096")
        .status()
        .map_err(|e| format!("cargo fuzz run: {e}"))?;
    if !status.success() {
        return Err(format!(
            "cargo fuzz run {TARGET}: {status}; the input that crashed it is in \
             examples/dsm/fuzz/artifacts/{TARGET}/ (see examples/dsm/fuzz/regressions/README.md)"
        ));
    }
    Ok(())
}
