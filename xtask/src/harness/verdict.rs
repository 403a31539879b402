//! Reading what the test binaries printed, and the verdict.
//!
//! A test counts as passed only if it is in its binary's expected list (`--list` on the host)
//! and printed `test NAME ... ok`. Everything else that was expected counts as failed: a
//! `FAILED` line, an `ignored` line, no line at all (the binary crashed, hung or never
//! started), or an `unsupported` call the device did not justify (test-support panics then,
//! which is a `FAILED` line). A test that passed after test-support recorded a justified
//! `unsupported` or a skip counts as skipped.

use std::collections::{BTreeMap, BTreeSet};

/// How one test ended, from libtest's `test NAME ... RESULT` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Passed,
    Failed,
    Ignored,
}

/// What one test binary's standard output says.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Output {
    /// Each test that printed a result, with it, in order.
    pub(crate) results: Vec<(String, Outcome)>,
    /// Tests that started (`test NAME ... `) and printed no result: the binary died or was
    /// stopped while running them.
    pub(crate) unfinished: Vec<String>,
    /// The counts of its `running N tests` lines, summed.
    pub(crate) announced: usize,
    /// Whether it printed a `test result:` line.
    pub(crate) finished: bool,
    /// Each test's time, where its result carried one (`ok <1.234s>`, from `--report-time`).
    pub(crate) times: Vec<(String, f64)>,
    /// Each failed test's first panic, from its `---- NAME stdout ----` section: the
    /// `panicked at FILE:LINE:COL:` line and the message's first lines, joined by ` / `.
    pub(crate) panics: BTreeMap<String, String>,
}

/// Removes ANSI colour sequences (`ESC [ ... letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A result's time, from `--report-time`: `ok <1.234s>` gives 1.234.
fn result_time(text: &str) -> Option<f64> {
    let (_, time) = text.trim().rsplit_once(" <")?;
    time.strip_suffix("s>")?.parse().ok()
}

/// The outcome a libtest result word stands for (a `--report-time` time after it is allowed).
fn result_word(text: &str) -> Option<Outcome> {
    let text = text.trim();
    let text = match text.rsplit_once(" <") {
        Some((word, _)) if result_time(text).is_some() => word,
        _ => text,
    };
    if text == "ok" {
        Some(Outcome::Passed)
    } else if text.starts_with("FAILED") {
        Some(Outcome::Failed)
    } else if text == "ignored" || text.starts_with("ignored, ") {
        Some(Outcome::Ignored)
    } else {
        None
    }
}

/// Lines that end a test's output section: a test whose result has not come by then never
/// finished.
fn is_boundary(line: &str) -> bool {
    line.starts_with("test result:")
        || line == "failures:"
        || line == "successes:"
        || line.starts_with("---- ")
        || line.starts_with("guest: ")
        || running_count(line).is_some()
}

/// `N` of a `running N tests` line.
fn running_count(line: &str) -> Option<usize> {
    let rest = line.strip_prefix("running ")?;
    let count = rest
        .strip_suffix(" tests")
        .or_else(|| rest.strip_suffix(" test"))?;
    count.parse().ok()
}

/// The name and the rest of a `test NAME ... REST` line (REST may be empty).
fn test_start(line: &str) -> Option<(&str, &str)> {
    let rest = line.strip_prefix("test ")?;
    match rest.split_once(" ... ") {
        Some(parts) => Some(parts),
        None => rest.strip_suffix(" ...").map(|name| (name, "")),
    }
}

/// Reads libtest's (pretty) output. With `--test-threads=1` libtest prints `test NAME ... `
/// before a test and its result after it, so whatever the test or its child processes write
/// to the same stream lands in between (the guest merges standard error into it): a result is
/// the rest of the `test` line or the first later line that is nothing but a result word.
pub(crate) fn parse_libtest(text: &str) -> Output {
    let mut output = Output::default();
    let mut pending: Option<String> = None;
    // The last test whose result came without its time: libtest writes ` <1.234s>` with a
    // write of its own, which the guest's prefixer may put on a line of its own.
    let mut untimed: Option<String> = None;
    // The test whose failure section is being read, and the panic lines kept of it so far.
    let mut section: Option<String> = None;
    let mut panic: Option<Vec<String>> = None;
    for raw in text.lines() {
        let clean = strip_ansi(raw);
        let line = clean.trim();
        if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|rest| rest.strip_suffix(" stdout ----"))
        {
            section = Some(name.to_string());
            panic = None;
            continue;
        }
        if let Some(name) = section.as_ref() {
            match panic.as_mut() {
                None if line.contains(" panicked at ") => panic = Some(vec![line.to_string()]),
                Some(lines)
                    if lines.len() < PANIC_LINES
                        && !line.is_empty()
                        && !line.starts_with("note: ")
                        && !line.starts_with("stack backtrace:")
                        && !is_boundary(line) =>
                {
                    lines.push(line.to_string());
                }
                Some(lines) => {
                    output
                        .panics
                        .entry(name.clone())
                        .or_insert_with(|| clip(&lines.join(" / "), PANIC_CHARS));
                    section = None;
                    panic = None;
                }
                None => {}
            }
        }
        if let Some(time) = line
            .strip_prefix('<')
            .and_then(|rest| rest.strip_suffix("s>"))
            .and_then(|time| time.parse::<f64>().ok())
        {
            if let Some(name) = untimed.take() {
                output.times.push((name, time));
            }
            continue;
        }
        untimed = None;
        if let Some((name, after)) = test_start(line) {
            output.unfinished.extend(pending.take());
            match result_word(after) {
                Some(outcome) => {
                    output.results.push((name.to_string(), outcome));
                    match result_time(after) {
                        Some(time) => output.times.push((name.to_string(), time)),
                        None => untimed = Some(name.to_string()),
                    }
                }
                None => pending = Some(name.to_string()),
            }
            continue;
        }
        if is_boundary(line) {
            output.unfinished.extend(pending.take());
            if line.starts_with("test result:") {
                output.finished = true;
            }
            output.announced += running_count(line).unwrap_or(0);
            continue;
        }
        if let Some(outcome) = pending.as_ref().and(result_word(line)) {
            let name = pending.take().unwrap_or_default();
            match result_time(line) {
                Some(time) => output.times.push((name.clone(), time)),
                None => untimed = Some(name.clone()),
            }
            output.results.push((name, outcome));
        }
    }
    output.unfinished.extend(pending);
    if let (Some(name), Some(lines)) = (section, panic) {
        output
            .panics
            .entry(name)
            .or_insert_with(|| clip(&lines.join(" / "), PANIC_CHARS));
    }
    output
}

/// How many lines of a panic (its `panicked at` line included) a failure's reason keeps.
const PANIC_LINES: usize = 4;
/// How many characters of them it keeps.
const PANIC_CHARS: usize = 400;

/// `text` cut to at most `max` characters (on a character boundary), `...` marking a cut.
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

/// The test names of a `--list` output (`NAME: test` lines; benchmarks are not run).
pub(crate) fn parse_list(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.trim_end().strip_suffix(": test"))
        .map(str::to_string)
        .collect()
}

/// The guest's status file: one `CODE NAME` line per binary that ended.
pub(crate) fn parse_statuses(text: &str) -> BTreeMap<String, i32> {
    text.lines()
        .filter_map(|line| {
            let (code, name) = line.trim().split_once(' ')?;
            Some((name.to_string(), code.parse().ok()?))
        })
        .collect()
}

/// The `guest: <== NAME exit CODE in SECONDS s` lines of the guest's console log: the statuses
/// again, in case the status file lost its last lines when the VM was stopped.
pub(crate) fn guest_exits(log: &str) -> BTreeMap<String, i32> {
    guest_ends(log)
        .map(|(name, code, _)| (name.to_string(), code))
        .collect()
}

/// Each binary's wall time in the guest, from its `guest: <== NAME exit CODE in SECONDS s` line.
pub(crate) fn guest_times(log: &str) -> BTreeMap<String, f64> {
    guest_ends(log)
        .filter_map(|(name, _, seconds)| Some((name.to_string(), seconds?)))
        .collect()
}

/// The name, exit code and (when given) seconds of each `guest: <== ` line.
fn guest_ends(log: &str) -> impl Iterator<Item = (&str, i32, Option<f64>)> {
    log.lines().filter_map(|line| {
        let rest = line.trim().strip_prefix("guest: <== ")?;
        let (name, end) = rest.rsplit_once(" exit ")?;
        let (code, seconds) = match end.split_once(" in ") {
            Some((code, time)) => (code, time.strip_suffix(" s")?.parse().ok()),
            None => (end, None),
        };
        Some((name, code.parse().ok()?, seconds))
    })
}

/// The `guest: kernel during NAME: MESSAGE` lines of the guest's console log (what the kernel
/// logged while NAME ran that looks like a bug: see `kmsg`), per binary.
pub(crate) fn guest_kernel(log: &str) -> BTreeMap<String, Vec<String>> {
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in log.lines() {
        let Some(rest) = line.trim().strip_prefix("guest: kernel during ") else {
            continue;
        };
        if let Some((name, message)) = rest.split_once(": ") {
            found
                .entry(name.to_string())
                .or_default()
                .push(message.to_string());
        }
    }
    found
}

/// Fails `verdict` for what the guest kernel logged while its binary ran (`messages`, from
/// [`guest_kernel`]): one `(kernel)` failure listing them.
pub(crate) fn add_kernel_findings(verdict: &mut BinaryVerdict, messages: &[String]) {
    if messages.is_empty() {
        return;
    }
    verdict.failed.push((
        "(kernel)".to_string(),
        format!(
            "the guest kernel logged, while it ran (with lanes, a binary beside it may be the \
             cause): {}",
            messages.join(" | ")
        ),
    ));
}

/// Splits the guest's console log into each binary's output. The guest prefixes every line a
/// binary prints with `[NAME] ` (so that two binaries running at once can share the console),
/// and announces it first with `guest: ==> NAME`: a line counts for NAME only after that.
pub(crate) fn split_guest_log(log: &str) -> BTreeMap<String, String> {
    let mut parts: BTreeMap<String, String> = BTreeMap::new();
    for line in log.lines() {
        let clean = strip_ansi(line);
        if let Some(name) = clean.trim().strip_prefix("guest: ==> ") {
            parts.entry(name.to_string()).or_default();
            continue;
        }
        let Some((name, text)) = line
            .strip_prefix('[')
            .and_then(|rest| rest.split_once("] "))
        else {
            continue;
        };
        if let Some(part) = parts.get_mut(name) {
            part.push_str(text);
            part.push('\n');
        }
    }
    parts
}

/// What a guest said of each binary it ran: its output, exit and wall time, from the console
/// log and the status files (`CODE NAME` lines; one per lane when binaries ran at once).
#[derive(Debug, Default)]
pub(crate) struct GuestResults {
    outputs: BTreeMap<String, String>,
    statuses: BTreeMap<String, i32>,
    times: BTreeMap<String, f64>,
    kernel: BTreeMap<String, Vec<String>>,
}

impl GuestResults {
    /// Reads the console `log` and the status files (a missing file counts as empty).
    pub(crate) fn read(log: &str, status_files: &[std::path::PathBuf]) -> Self {
        let mut statuses = guest_exits(log);
        for path in status_files {
            statuses.extend(parse_statuses(
                &std::fs::read_to_string(path).unwrap_or_default(),
            ));
        }
        Self {
            outputs: split_guest_log(log),
            statuses,
            times: guest_times(log),
            kernel: guest_kernel(log),
        }
    }

    /// What the guest kernel logged while binary `name` ran that looks like a bug.
    pub(crate) fn kernel(&self, name: &str) -> &[String] {
        self.kernel.get(name).map_or(&[], Vec::as_slice)
    }

    /// How binary `name` ended: its status, else still running when the VM ended if it
    /// printed anything, else never started.
    pub(crate) fn exit(&self, name: &str) -> Exit {
        match self.statuses.get(name) {
            Some(&code) => Exit::Code(code),
            None if self.outputs.contains_key(name) => Exit::Stopped,
            None => Exit::NotStarted,
        }
    }

    /// What binary `name` printed, parsed.
    pub(crate) fn output(&self, name: &str) -> Output {
        parse_libtest(self.outputs.get(name).map_or("", String::as_str))
    }

    /// Binary `name`'s wall time in the guest.
    pub(crate) fn seconds(&self, name: &str) -> Option<f64> {
        self.times.get(name).copied()
    }
}

/// How a test binary ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// Its exit code, as a shell reports it (128 + N for signal N; `timeout` gives 124 and
    /// 137).
    Code(i32),
    /// It was running when the watchdog stopped the VM.
    Stopped,
    /// It never started (the VM was stopped or died before).
    NotStarted,
}

impl Exit {
    fn is_success(self) -> bool {
        self == Exit::Code(0)
    }

    pub(crate) fn describe(self) -> String {
        match self {
            Exit::Code(0) => "exit 0".to_string(),
            Exit::Code(101) => "exit 101".to_string(),
            Exit::Code(124) => "stopped by `timeout` at the binary's bound (900 s unless \
                 RDMA_TEST_BINARY_TIMEOUT says otherwise): hung"
                .to_string(),
            Exit::Code(137) => "killed by `timeout` (SIGKILL) at the binary's bound; it ignored \
                 SIGTERM"
                .to_string(),
            Exit::Code(code) if code > 128 && code < 160 => {
                format!("killed by signal {} (crashed)", code - 128)
            }
            Exit::Code(code) => format!("exit {code}"),
            Exit::Stopped => {
                "still running when the VM ended (stopped by the watchdog, or it died)".to_string()
            }
            Exit::NotStarted => "never started".to_string(),
        }
    }
}

/// Which part of the suite a binary belongs to, for the summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Device,
    Host,
    Doc,
}

impl Kind {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Device => "device tests",
            Kind::Host => "host tests",
            Kind::Doc => "doc tests",
        }
    }
}

/// One binary's verdict.
#[derive(Debug)]
pub(crate) struct BinaryVerdict {
    pub(crate) name: String,
    pub(crate) kind: Kind,
    pub(crate) exit: Exit,
    pub(crate) passed: usize,
    /// Tests counted as skipped, with why.
    pub(crate) skipped: Vec<(String, String)>,
    /// Tests counted as failed (or the binary itself, as `(binary)`), with why.
    pub(crate) failed: Vec<(String, String)>,
    /// Its wall time, when known (in a multi-node run, the slowest node's).
    pub(crate) seconds: Option<f64>,
    /// Each test's time, where it printed one (in a multi-node run, the slowest node's).
    pub(crate) test_seconds: Vec<(String, f64)>,
}

/// Test-support's records of justified skips: `(binary stem, test) -> reason`.
pub(crate) type Skips = BTreeMap<(String, String), String>;

/// The stem test-support names a binary by: the target name, as the executable is named.
pub(crate) fn binary_stem(name: &str) -> String {
    name.rsplit('/').next().unwrap_or(name).replace('-', "_")
}

/// A failed test's reason: `FAILED`, and its panic where its output showed one.
fn failed_reason(output: &Output, test: &str) -> String {
    match output.panics.get(test) {
        Some(panic) => format!("FAILED: {panic}"),
        None => "FAILED".to_string(),
    }
}

/// Judges one test binary: every expected test must have printed `ok`.
pub(crate) fn judge(
    name: &str,
    kind: Kind,
    expected: &[String],
    output: &Output,
    exit: Exit,
    skips: &Skips,
) -> BinaryVerdict {
    let mut verdict = BinaryVerdict {
        name: name.to_string(),
        kind,
        exit,
        passed: 0,
        skipped: Vec::new(),
        failed: Vec::new(),
        seconds: None,
        test_seconds: output.times.clone(),
    };
    let stem = binary_stem(name);
    let results: BTreeMap<&str, Outcome> = output
        .results
        .iter()
        .map(|(test, outcome)| (test.as_str(), *outcome))
        .collect();
    for test in expected {
        match results.get(test.as_str()) {
            Some(Outcome::Passed) => match skips.get(&(stem.clone(), test.clone())) {
                Some(reason) => verdict.skipped.push((test.clone(), reason.clone())),
                None => verdict.passed += 1,
            },
            Some(Outcome::Failed) => verdict
                .failed
                .push((test.clone(), failed_reason(output, test))),
            Some(Outcome::Ignored) => verdict.failed.push((
                test.clone(),
                "ignored (the harness runs every test; #[ignore] is not allowed)".to_string(),
            )),
            None if output.unfinished.contains(test) => verdict.failed.push((
                test.clone(),
                format!(
                    "started but never finished: the binary was {}",
                    exit.describe()
                ),
            )),
            None => verdict.failed.push((
                test.clone(),
                format!("did not run (the binary: {})", exit.describe()),
            )),
        }
    }
    let listed: BTreeSet<&str> = expected.iter().map(String::as_str).collect();
    for (test, outcome) in &output.results {
        if !listed.contains(test.as_str()) {
            verdict.failed.push((
                test.clone(),
                format!("printed {outcome:?} but its binary's --list did not name it"),
            ));
        }
    }
    if verdict.failed.is_empty() && !exit.is_success() && exit != Exit::NotStarted {
        verdict.failed.push((
            "(binary)".to_string(),
            format!("{} although every test passed", exit.describe()),
        ));
    }
    verdict
}

/// Merges the verdicts of one binary run on every node of a multi-node run: a test passed only
/// if it passed on every node; it failed if it failed on any (each node's reason, prefixed
/// `node K:`), and counts as skipped if some node skipped it and none failed it. A binary-level
/// failure (`(binary)`, a test no `--list` named) of any node is kept, prefixed too.
pub(crate) fn merge_nodes(expected: &[String], per_node: Vec<BinaryVerdict>) -> BinaryVerdict {
    let name = per_node.first().map(|v| v.name.clone()).unwrap_or_default();
    let exit = per_node
        .iter()
        .map(|v| v.exit)
        .find(|e| !e.is_success())
        .unwrap_or(Exit::Code(0));
    let mut merged = BinaryVerdict {
        name,
        kind: Kind::Device,
        exit,
        passed: 0,
        skipped: Vec::new(),
        failed: Vec::new(),
        seconds: per_node.iter().filter_map(|v| v.seconds).reduce(f64::max),
        test_seconds: Vec::new(),
    };
    let mut slowest: BTreeMap<&str, f64> = BTreeMap::new();
    for (test, seconds) in per_node.iter().flat_map(|v| &v.test_seconds) {
        let entry = slowest.entry(test.as_str()).or_insert(*seconds);
        *entry = entry.max(*seconds);
    }
    merged.test_seconds = slowest
        .into_iter()
        .map(|(test, seconds)| (test.to_string(), seconds))
        .collect();
    if per_node.is_empty() {
        merged.failed = expected
            .iter()
            .map(|test| (test.clone(), "ran on no node".to_string()))
            .collect();
        return merged;
    }
    let reasons = |pick: fn(&BinaryVerdict) -> &Vec<(String, String)>, test: &str| {
        per_node
            .iter()
            .enumerate()
            .filter_map(|(node, verdict)| {
                pick(verdict)
                    .iter()
                    .find(|(t, _)| t == test)
                    .map(|(_, why)| format!("node {node}: {why}"))
            })
            .collect::<Vec<_>>()
    };
    for test in expected {
        let failed = reasons(|v| &v.failed, test);
        let skipped = reasons(|v| &v.skipped, test);
        if !failed.is_empty() {
            merged.failed.push((test.clone(), failed.join("; ")));
        } else if !skipped.is_empty() {
            merged.skipped.push((test.clone(), skipped.join("; ")));
        } else {
            merged.passed += 1;
        }
    }
    let listed: BTreeSet<&str> = expected.iter().map(String::as_str).collect();
    for (node, verdict) in per_node.iter().enumerate() {
        for (test, why) in &verdict.failed {
            if !listed.contains(test.as_str()) {
                merged
                    .failed
                    .push((test.clone(), format!("node {node}: {why}")));
            }
        }
    }
    merged
}

/// Judges a `cargo test --doc` run called `name`: there is no list before the run, so every
/// test the doc-test runners announced (`running N tests`) must have printed `ok`, and at least
/// `at_least` must have run (a step whose tests all vanished fails).
pub(crate) fn judge_doc(
    name: &str,
    output: &Output,
    cargo_succeeded: bool,
    at_least: usize,
) -> BinaryVerdict {
    let mut verdict = BinaryVerdict {
        name: name.to_string(),
        kind: Kind::Doc,
        exit: Exit::Code(if cargo_succeeded { 0 } else { 101 }),
        passed: 0,
        skipped: Vec::new(),
        failed: Vec::new(),
        seconds: None,
        test_seconds: output.times.clone(),
    };
    for (test, outcome) in &output.results {
        match outcome {
            Outcome::Passed => verdict.passed += 1,
            Outcome::Failed => verdict
                .failed
                .push((test.clone(), failed_reason(output, test))),
            Outcome::Ignored => verdict.failed.push((
                test.clone(),
                "ignored (use no_run or compile_fail, not ignore)".to_string(),
            )),
        }
    }
    for test in &output.unfinished {
        verdict
            .failed
            .push((test.clone(), "started but never finished".to_string()));
    }
    let reported = output.results.len() + output.unfinished.len();
    for index in reported..output.announced {
        verdict.failed.push((
            format!("(doc test {})", index + 1),
            "announced but printed no result".to_string(),
        ));
    }
    if output.results.len() < at_least {
        verdict.failed.push((
            format!("({name})"),
            format!(
                "{} tests ran, at least {at_least} expected",
                output.results.len()
            ),
        ));
    }
    if verdict.failed.is_empty() && !cargo_succeeded {
        verdict.failed.push((
            "(cargo test --doc)".to_string(),
            "failed although every doc test it reported passed".to_string(),
        ));
    }
    verdict
}

/// The lines test-support appended to `RDMA_TEST_REPORT`.
#[derive(Debug, Default)]
pub(crate) struct DeviceReport {
    /// Tests that found the device.
    pub(crate) ran: BTreeSet<String>,
    /// Justified skips (`unsupported` the device really lacks, or a skip outside the harness).
    pub(crate) skips: Skips,
    /// Failures test-support recorded before panicking (no device, an unjustified
    /// `unsupported`, no second device), as `test reason`.
    pub(crate) failures: Vec<String>,
}

impl DeviceReport {
    pub(crate) fn parse(text: &str) -> Self {
        let mut report = Self::default();
        for line in text.lines() {
            let Some((kind, rest)) = line.split_once(' ') else {
                continue;
            };
            let (test, reason) = rest.split_once(' ').unwrap_or((rest, ""));
            let key = test
                .split_once("::")
                .map(|(stem, test)| (stem.to_string(), test.to_string()));
            match kind {
                "ran" => {
                    report.ran.insert(test.to_string());
                }
                "skipped" | "unsupported" => {
                    if let Some(key) = key {
                        let why = if kind == "unsupported" {
                            format!("the device lacks {reason}")
                        } else {
                            reason.to_string()
                        };
                        report.skips.insert(key, why);
                    }
                }
                "failed" => report.failures.push(rest.to_string()),
                _ => {}
            }
        }
        report
    }
}

/// Passed, failed and skipped counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) passed: usize,
    pub(crate) failed: usize,
    pub(crate) skipped: usize,
}

impl Tally {
    pub(crate) fn add(&mut self, verdict: &BinaryVerdict) {
        self.passed += verdict.passed;
        self.failed += verdict.failed.len();
        self.skipped += verdict.skipped.len();
    }

    pub(crate) fn line(self) -> String {
        format!(
            "{} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )
    }
}

/// The whole run's verdict.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) binaries: Vec<BinaryVerdict>,
    /// Reasons the run failed besides failed tests (a stopped VM, a failed `--list`).
    pub(crate) problems: Vec<String>,
}

impl Verdict {
    pub(crate) fn tally(&self, kind: Option<Kind>) -> Tally {
        let mut tally = Tally::default();
        for verdict in &self.binaries {
            if kind.is_none_or(|k| k == verdict.kind) {
                tally.add(verdict);
            }
        }
        tally
    }

    /// Every reason the run is not green; empty when it is.
    pub(crate) fn reasons(&self) -> Vec<String> {
        let mut reasons = self.problems.clone();
        let total = self.tally(None);
        if total.failed > 0 {
            let binaries = self
                .binaries
                .iter()
                .filter(|b| !b.failed.is_empty())
                .count();
            reasons.push(format!("{} failed in {binaries} binaries", total.failed));
        }
        if total.skipped > 0 {
            reasons.push(format!(
                "{} skipped (a green run means every test ran)",
                total.skipped
            ));
        }
        reasons
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn result_lines_are_read_with_noise_in_between() {
        let text = "\nrunning 4 tests\n\
            test a ... ok\n\
            test b ... NOTE: rxe reports LocQpOpErr\n\
            ok\n\
            test c ... \x1b[32mok\x1b[0m\n\
            test d ... FAILED\n\
            \n\
            failures:\n\
            \n\
            ---- d stdout ----\n\
            test e ... ok\n\
            ok\n\
            \n\
            test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n";
        let output = parse_libtest(text);
        assert_eq!(
            output.results,
            vec![
                ("a".to_string(), Outcome::Passed),
                ("b".to_string(), Outcome::Passed),
                ("c".to_string(), Outcome::Passed),
                ("d".to_string(), Outcome::Failed),
                // Inside the failure output: counted, but `e` is in no list, so it is caught.
                ("e".to_string(), Outcome::Passed),
            ]
        );
        assert!(output.unfinished.is_empty());
        assert_eq!(output.announced, 4);
        assert!(output.finished);
    }

    #[test]
    fn a_failed_tests_reason_carries_its_panic() {
        let text = "running 3 tests\n\
            test a ... FAILED <1.000s>\n\
            test b ... FAILED\n\
            test c ... FAILED\n\
            \n\
            failures:\n\
            \n\
            ---- a stdout ----\n\
            NOTE: before the panic\n\
            \n\
            thread 'a' (271) panicked at tests/x.rs:32:7:\n\
            node 1 ended\n\
            while node 0 waited\n\
            note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n\
            \n\
            ---- b stdout ----\n\
            thread 'b' panicked at tests/x.rs:40:5:\n\
            one\n\
            two\n\
            three\n\
            four\n\
            ---- c stdout ----\n\
            thread 'c' panicked at tests/x.rs:50:5:\n\
            last\n\
            \n\
            failures:\n\
                a\n\
            \n\
            test result: FAILED. 0 passed; 3 failed; 0 ignored; 0 measured; 0 filtered out\n";
        let output = parse_libtest(text);
        assert_eq!(
            output.panics.get("a").map(String::as_str),
            Some(
                "thread 'a' (271) panicked at tests/x.rs:32:7: / node 1 ended / while node 0 waited"
            )
        );
        assert_eq!(
            output.panics.get("b").map(String::as_str),
            Some("thread 'b' panicked at tests/x.rs:40:5: / one / two / three")
        );
        assert_eq!(
            output.panics.get("c").map(String::as_str),
            Some("thread 'c' panicked at tests/x.rs:50:5: / last")
        );
        let verdict = judge(
            "p/x",
            Kind::Device,
            &names(&["a", "b", "c"]),
            &output,
            Exit::Code(101),
            &Skips::new(),
        );
        assert!(
            verdict.failed[0]
                .1
                .starts_with("FAILED: thread 'a' (271) panicked at")
        );
        assert_eq!(clip("abcdef", 3), "abc...");
        assert_eq!(clip("abc", 3), "abc");
    }

    #[test]
    fn a_multi_node_test_passes_only_if_it_passed_on_every_node() {
        let expected = names(&["both_ok", "fails_on_one", "skipped_on_one", "gone_on_one"]);
        let node0 = parse_libtest(
            "running 4 tests\ntest both_ok ... ok\ntest fails_on_one ... ok\n\
             test skipped_on_one ... ok\ntest gone_on_one ... ok\n",
        );
        let node1 = parse_libtest(
            "running 4 tests\ntest both_ok ... ok\ntest fails_on_one ... FAILED\n\
             test skipped_on_one ... ok\n",
        );
        let mut skips = Skips::new();
        skips.insert(
            ("bin".to_string(), "skipped_on_one".to_string()),
            "no peer".to_string(),
        );
        let per_node = vec![
            judge(
                "p/bin",
                Kind::Device,
                &expected,
                &node0,
                Exit::Code(0),
                &Skips::new(),
            ),
            judge(
                "p/bin",
                Kind::Device,
                &expected,
                &node1,
                Exit::Code(134),
                &skips,
            ),
        ];
        let merged = merge_nodes(&expected, per_node);
        assert_eq!(merged.passed, 1);
        assert_eq!(merged.exit, Exit::Code(134));
        let failed: Vec<&str> = merged.failed.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(failed, ["fails_on_one", "gone_on_one"]);
        assert_eq!(merged.failed[0].1, "node 1: FAILED");
        assert!(merged.failed[1].1.starts_with("node 1: did not run"));
        assert_eq!(
            merged.skipped,
            vec![("skipped_on_one".to_string(), "node 1: no peer".to_string())]
        );
        assert_eq!(merge_nodes(&expected, Vec::new()).failed.len(), 4);
    }

    #[test]
    fn a_crash_mid_way_leaves_the_running_test_unfinished() {
        let text = "running 3 tests\n\
            test first ... ok\n\
            test second ... thread panicked while processing panic. aborting.\n";
        let output = parse_libtest(text);
        assert_eq!(output.results, vec![("first".to_string(), Outcome::Passed)]);
        assert_eq!(output.unfinished, names(&["second"]));
        assert!(!output.finished);
        let verdict = judge(
            "pkg/bin",
            Kind::Device,
            &names(&["first", "second", "third"]),
            &output,
            Exit::Code(134),
            &Skips::new(),
        );
        assert_eq!(verdict.passed, 1);
        assert_eq!(verdict.failed.len(), 2);
        assert!(
            verdict.failed[0].1.contains("never finished"),
            "{:?}",
            verdict.failed
        );
        assert!(
            verdict.failed[0].1.contains("signal 6"),
            "{:?}",
            verdict.failed
        );
        assert!(
            verdict.failed[1].1.contains("did not run"),
            "{:?}",
            verdict.failed
        );
    }

    #[test]
    fn a_result_word_only_counts_on_a_line_of_its_own() {
        let output = parse_libtest("test slow ... starting\nsetup ok\n");
        assert!(output.results.is_empty());
        assert_eq!(output.unfinished, names(&["slow"]));
    }

    #[test]
    fn ignored_tests_fail() {
        let output = parse_libtest(
            "test a ... ignored\ntest b ... ignored, needs hardware\ntest c ... ok\n\
             test result: ok. 1 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out\n",
        );
        assert_eq!(
            output.results.iter().map(|r| r.1).collect::<Vec<_>>(),
            vec![Outcome::Ignored, Outcome::Ignored, Outcome::Passed]
        );
        let verdict = judge(
            "p/t",
            Kind::Device,
            &names(&["a", "b", "c"]),
            &output,
            Exit::Code(0),
            &Skips::new(),
        );
        assert_eq!((verdict.passed, verdict.failed.len()), (1, 2));
        assert!(verdict.failed.iter().all(|f| f.1.starts_with("ignored")));
    }

    #[test]
    fn lists_and_statuses_are_read() {
        assert_eq!(
            parse_list("a::b: test\nc: test\nbench_x: benchmark\n\n2 tests, 1 benchmark\n"),
            names(&["a::b", "c"])
        );
        assert!(parse_list("").is_empty());
        let statuses = parse_statuses("0 rdma-verbs/rc\n124 examples/interop\ngarbage\n");
        assert_eq!(statuses.get("rdma-verbs/rc"), Some(&0));
        assert_eq!(statuses.get("examples/interop"), Some(&124));
        assert_eq!(statuses.len(), 2);
        let exits = guest_exits(
            "guest: <== p/a exit 0\ntest x ... guest: <== p/b exit 134\n\
             guest: <== p/c exit 101 in 3.5 s\nguest: <== p/d exit 1 in x s\n",
        );
        assert_eq!(exits.get("p/a"), Some(&0));
        assert_eq!(exits.get("p/c"), Some(&101));
        assert_eq!(
            exits.get("p/d"),
            Some(&1),
            "a time that is no number loses no exit"
        );
        let times = guest_times("guest: <== p/c exit 101 in 3.5 s\nguest: <== p/d exit 1 in x s\n");
        assert_eq!(times.get("p/c"), Some(&3.5));
        assert_eq!(times.get("p/d"), None);
        assert_eq!(
            exits.len(),
            3,
            "a line that does not start with it is not one"
        );
    }

    #[test]
    fn report_time_results_keep_their_outcome_and_give_their_time() {
        let output = parse_libtest(
            "running 4 tests\n\
             test a ... ok <1.250s>\n\
             test b ... \nnoise from the test\nFAILED <0.500s>\n\
             test c ... ignored\n\
             test d ... ok\n\
             test e ... \nnoise\nok\n <2.000s>\n\
             test f ... ok\n",
        );
        assert_eq!(
            output.results,
            vec![
                ("a".to_string(), Outcome::Passed),
                ("b".to_string(), Outcome::Failed),
                ("c".to_string(), Outcome::Ignored),
                ("d".to_string(), Outcome::Passed),
                ("e".to_string(), Outcome::Passed),
                ("f".to_string(), Outcome::Passed),
            ]
        );
        // `e`'s time came on a line of its own (the prefixer split libtest's two writes).
        assert_eq!(
            output.times,
            vec![
                ("a".to_string(), 1.25),
                ("b".to_string(), 0.5),
                ("e".to_string(), 2.0)
            ]
        );
        // A lookalike is not a result.
        assert_eq!(parse_libtest("test e ... okay <1s>\n").results, vec![]);
    }

    #[test]
    fn kernel_findings_fail_the_binary_they_name() {
        let log = "guest: ==> p/a\n\
            guest: kernel during p/a: WARNING: CPU: 0 PID: 9 at rxe_pool.c:255 __rxe_cleanup\n\
            guest: kernel during p/a: refcount_t: underflow; use-after-free.\n\
            guest: <== p/a exit 0 in 1.0 s\n\
            [p/b] guest: kernel during p/b: a line a test printed\n";
        let results = GuestResults::read(log, &[]);
        assert_eq!(results.kernel("p/a").len(), 2);
        assert!(
            results.kernel("p/b").is_empty(),
            "a prefixed line is the test's own"
        );
        let mut verdict = judge(
            "p/a",
            Kind::Device,
            &names(&["t"]),
            &parse_libtest("test t ... ok\n"),
            Exit::Code(0),
            &Skips::new(),
        );
        add_kernel_findings(&mut verdict, results.kernel("p/a"));
        assert_eq!(verdict.passed, 1);
        assert_eq!(verdict.failed.len(), 1);
        assert_eq!(verdict.failed[0].0, "(kernel)");
        assert!(verdict.failed[0].1.contains("rxe_pool.c:255"));
        assert!(verdict.failed[0].1.contains("refcount_t: underflow"));
    }

    #[test]
    fn the_guest_log_is_split_per_binary() {
        // Two binaries on two lanes: their prefixed lines interleave; a line of a binary not
        // announced yet, an unprefixed line (kernel noise) and a lookalike count for nobody.
        let log = "guest: rxe0 on d0 is active\n\
            [p/b] test early ... ok\n\
            guest: ==> p/a\n\
            guest: ==> p/b\n\
            [p/a] running 2 tests\n\
            [p/b] running 1 test\n\
            [p/a] test x ... ok\n\
            [p/b] test y ... \n\
            test stray ... ok\n\
            [p/c] test z ... ok\n\
            [p/a] test w ... \n\
            [p/a] ok\n\
            guest: <== p/a exit 0 in 12.345 s\n";
        let parts = split_guest_log(log);
        assert_eq!(parts.len(), 2);
        let a = parse_libtest(&parts["p/a"]);
        assert_eq!(
            a.results,
            vec![
                ("x".to_string(), Outcome::Passed),
                ("w".to_string(), Outcome::Passed)
            ]
        );
        let b = parse_libtest(&parts["p/b"]);
        assert!(b.results.is_empty());
        assert_eq!(b.unfinished, names(&["y"]));
        let results = GuestResults::read(log, &[]);
        assert_eq!(results.exit("p/a"), Exit::Code(0));
        assert_eq!(results.exit("p/b"), Exit::Stopped);
        assert_eq!(results.exit("p/c"), Exit::NotStarted);
        assert_eq!(results.seconds("p/a"), Some(12.345));
        assert_eq!(results.seconds("p/b"), None);
    }

    #[test]
    fn missing_unexpected_and_skipped_tests_are_counted() {
        let output = parse_libtest("test a ... ok\ntest b ... ok\ntest extra ... ok\n");
        let mut skips = Skips::new();
        skips.insert(
            ("my_bin".to_string(), "b".to_string()),
            "the device lacks XRC".to_string(),
        );
        let verdict = judge(
            "pkg/my-bin",
            Kind::Device,
            &names(&["a", "b", "vanished"]),
            &output,
            Exit::Code(0),
            &skips,
        );
        assert_eq!(verdict.passed, 1);
        assert_eq!(verdict.skipped.len(), 1);
        let failed: Vec<&str> = verdict.failed.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(failed, vec!["vanished", "extra"]);
    }

    #[test]
    fn a_binary_that_fails_after_passing_tests_fails() {
        let output = parse_libtest("test a ... ok\ntest result: ok. 1 passed\n");
        let verdict = judge(
            "p/t",
            Kind::Host,
            &names(&["a"]),
            &output,
            Exit::Code(139),
            &Skips::new(),
        );
        assert_eq!(verdict.passed, 1);
        assert_eq!(verdict.failed.len(), 1);
        assert_eq!(verdict.failed[0].0, "(binary)");
        assert!(verdict.failed[0].1.contains("signal 11"));
        let never = judge(
            "p/t",
            Kind::Device,
            &names(&["a", "b"]),
            &Output::default(),
            Exit::NotStarted,
            &Skips::new(),
        );
        assert_eq!((never.passed, never.failed.len()), (0, 2));
        let stopped = judge(
            "p/t",
            Kind::Device,
            &names(&["a"]),
            &parse_libtest("test a ... "),
            Exit::Stopped,
            &Skips::new(),
        );
        assert!(
            stopped.failed[0].1.contains("watchdog"),
            "{:?}",
            stopped.failed
        );
    }

    #[test]
    fn doc_tests_must_report_every_announced_test() {
        let text = "running 3 tests\n\
            test src/lib.rs - a (line 3) ... ok\n\
            test src/lib.rs - b (line 9) - compile fail ... ok\n\
            test result: ok. 2 passed\n\
            running 1 test\n\
            test src/x.rs - c (line 1) ... ignored\n";
        let verdict = judge_doc("doc tests", &parse_libtest(text), false, 0);
        assert_eq!(verdict.passed, 2);
        assert_eq!(verdict.failed.len(), 2, "{:?}", verdict.failed);
        let clean = judge_doc(
            "doc tests",
            &parse_libtest("running 1 test\ntest a ... ok\n"),
            false,
            0,
        );
        assert_eq!(clean.failed.len(), 1, "cargo's failure counts");
        let vanished = judge_doc("compile-fail", &parse_libtest("running 0 tests\n"), true, 1);
        assert_eq!(
            vanished.failed.len(),
            1,
            "a step whose tests vanished fails"
        );
    }

    #[test]
    fn the_report_yields_skips_and_failures() {
        let report = DeviceReport::parse(
            "ran mw::mw_bind rxe0\n\
             unsupported mw::mw_type1 memory windows type 1\n\
             skipped scope::two no second device\n\
             failed rc::x RDMA_TEST_REQUIRE_DEVICE=1 but no device\n",
        );
        assert_eq!(report.ran.len(), 1);
        assert_eq!(
            report
                .skips
                .get(&("mw".to_string(), "mw_type1".to_string())),
            Some(&"the device lacks memory windows type 1".to_string())
        );
        assert_eq!(report.skips.len(), 2);
        assert_eq!(report.failures.len(), 1);
    }

    #[test]
    fn the_verdict_is_green_only_with_no_failure_and_no_skip() {
        let mut verdict = Verdict::default();
        let ok = judge(
            "p/a",
            Kind::Device,
            &names(&["a"]),
            &parse_libtest("test a ... ok\n"),
            Exit::Code(0),
            &Skips::new(),
        );
        verdict.binaries.push(ok);
        assert!(verdict.reasons().is_empty());
        assert_eq!(verdict.tally(None).line(), "1 passed, 0 failed, 0 skipped");
        let mut skips = Skips::new();
        skips.insert(("h".to_string(), "s".to_string()), "lacks".to_string());
        verdict.binaries.push(judge(
            "p/h",
            Kind::Host,
            &names(&["s"]),
            &parse_libtest("test s ... ok\n"),
            Exit::Code(0),
            &skips,
        ));
        assert_eq!(verdict.reasons().len(), 1);
        assert_eq!(
            verdict.tally(Some(Kind::Host)),
            Tally {
                passed: 0,
                failed: 0,
                skipped: 1
            }
        );
        verdict.problems.push("the VM was stopped".to_string());
        assert_eq!(verdict.reasons().len(), 2);
    }
}
