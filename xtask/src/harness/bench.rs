//! `cargo xtask bench-compare`: the Rust `lat` and `bw` tools and C perftest's `ib_*_lat`,
//! `ib_send_bw`, `ib_write_bw` and `ib_read_bw`, run alternately in one VM boot (or on the
//! host's device), several rounds per test and size; tables of both tools' typical latency,
//! 64-byte message rate by post-list length and RDMA WRITE and READ bandwidth, their ratio and
//! its spread across rounds; then, in the same boot, the instruction
//! counts of `cargo xtask instructions` (C, `unsafe`, owned, owned reused, slot ring);
//! with `--write`,
//! those tables and plots in `docs/`.
//!
//! Each round runs every (test, size) pair once with each tool, the order of the two tools
//! alternating from round to round so that a drift of the emulated machine does not favour
//! one. A ratio is taken within a round (Rust's `t_typical` over C's of the same round), so
//! the rounds' ratios show how much of a difference is noise.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::build::build_release_bin;
use super::instructions::Count;
use super::vm::{self, GUEST_DEVICE, shell_quote};

/// The tests, as `lat` names them; perftest's program is `ib_<test>_lat`.
const TESTS: [&str; 4] = ["send", "write", "read", "atomic"];
/// The sizes of the full comparison (atomics are always 8 bytes).
const SIZES: [usize; 4] = [2, 64, 1024, 4096];
/// The table in `docs/benchmarks.md` sits between these lines.
const BEGIN: &str = "<!-- bench-compare:begin -->";
const END: &str = "<!-- bench-compare:end -->";
/// The plots `--write` makes.
const PLOT: &str = "docs/bench-latency.svg";
const RATE_PLOT: &str = "docs/bench-rate.svg";
/// The message-rate runs: 64-byte SENDs, this many per post.
const RATE_SIZE: usize = 64;
const POST_LISTS: [u32; 3] = [1, 8, 32];
/// The message-rate runs' name among the tests.
const RATE: &str = "send_bw";
/// The bandwidth runs: RDMA WRITE and READ of this many bytes, `bw <test>` against
/// `ib_<test>_bw` (perftest's default size).
const BW_TESTS: [&str; 2] = ["write", "read"];
const BW_SIZE: usize = 65536;

/// What to run.
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    rounds: u32,
    iters: u32,
    /// Messages per message-rate run (a multiple of every post list).
    rate_iters: u32,
    /// Requests per bandwidth run.
    bw_iters: u32,
    sizes: Vec<usize>,
    /// Rounds of the instruction count (`instructions`' argument).
    instruction_rounds: u32,
    write: bool,
}

fn parse_args(args: &[String]) -> Result<Plan, String> {
    let mut plan = Plan {
        rounds: 5,
        iters: 1000,
        rate_iters: 8192,
        bw_iters: 1000,
        sizes: SIZES.to_vec(),
        instruction_rounds: 2000,
        write: false,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .ok_or_else(|| format!("{name} needs a value"))
                .cloned()
        };
        match arg.as_str() {
            "--rounds" => plan.rounds = number(&value("--rounds")?)?,
            "--iters" => plan.iters = number(&value("--iters")?)?,
            "--sizes" => {
                plan.sizes = value("--sizes")?
                    .split(',')
                    .map(number::<usize>)
                    .collect::<Result<_, _>>()?;
            }
            "--instruction-rounds" => {
                plan.instruction_rounds = number(&value("--instruction-rounds")?)?;
            }
            "--write" => plan.write = true,
            // CI's smoke run: one size, few iterations, one round; nothing written.
            "--smoke" => {
                plan.rounds = 1;
                plan.iters = 100;
                plan.rate_iters = 1024;
                plan.bw_iters = 100;
                plan.sizes = vec![64];
                plan.instruction_rounds = 200;
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    if plan.rounds == 0 || plan.iters < 5 || plan.sizes.is_empty() || plan.instruction_rounds == 0 {
        return Err(
            "need at least 1 round, 5 iterations, one size and 1 instruction-count round".into(),
        );
    }
    if plan.sizes.iter().any(|&s| s == 0 || s > 1 << 23) {
        return Err("sizes must be 1..=8388608".into());
    }
    Ok(plan)
}

fn number<T: std::str::FromStr>(text: &str) -> Result<T, String> {
    text.parse().map_err(|_| format!("not a number: {text}"))
}

/// What a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    /// Latency (`lat`, `ib_<test>_lat`): the typical round trip.
    Latency,
    /// Message rate with this many requests per post (`bw send -l N`, `ib_send_bw -l N`).
    Rate(u32),
    /// Bandwidth (`bw <test>`, `ib_<test>_bw`): the average MiB/s.
    Bandwidth,
}

/// One run of one tool: which, and the run's file name stem.
#[derive(Debug, Clone, PartialEq)]
struct Run {
    round: u32,
    tool: &'static str,
    test: &'static str,
    size: usize,
    mode: Mode,
}

/// The Rust tools' paths.
#[derive(Debug, Clone, Copy)]
struct Tools<'a> {
    lat: &'a str,
    bw: &'a str,
}

impl Run {
    fn id(&self) -> String {
        let stem = format!("{}-{}-{}-{}", self.round, self.tool, self.test, self.size);
        match self.mode {
            Mode::Latency => stem,
            Mode::Rate(l) => format!("{stem}-l{l}"),
            Mode::Bandwidth => format!("{stem}-bw"),
        }
    }

    /// The server's command line (the client adds the server's address).
    fn command(&self, tools: Tools<'_>, plan: &Plan, port: u16) -> String {
        let iters = match self.mode {
            Mode::Latency => plan.iters,
            Mode::Rate(_) => plan.rate_iters,
            Mode::Bandwidth => plan.bw_iters,
        };
        let mut common = format!(
            "-d {GUEST_DEVICE} -x 1 -s {} -n {iters} -p {port}",
            self.size
        );
        if let Mode::Rate(list) = self.mode {
            common.push_str(&format!(" -l {list}"));
        }
        match (self.tool, self.mode) {
            ("rust", Mode::Latency) => format!("{} {} {common}", shell_quote(tools.lat), self.test),
            ("rust", Mode::Rate(_)) => format!("{} send {common}", shell_quote(tools.bw)),
            ("slot", _) => format!("{} send {common} --path slot", shell_quote(tools.bw)),
            ("rust", Mode::Bandwidth) => {
                format!("{} {} {common}", shell_quote(tools.bw), self.test)
            }
            // -F: no CPU-frequency warning (the VM's clock is what it is).
            (_, Mode::Latency) => format!("ib_{}_lat {common} -F", self.test),
            (_, Mode::Rate(_)) => format!("ib_send_bw {common} -F"),
            (_, Mode::Bandwidth) => format!("ib_{}_bw {common} -F", self.test),
        }
    }
}

/// Shell lines recording the machine's facts in `$work` (read back by [`Machine::read`]).
pub(crate) const MACHINE_FACTS: &str = r#"uname -r > "$work/kernel"
dpkg-query -W -f='${Version}' rdma-core > "$work/rdma-core" 2>/dev/null
dpkg-query -W -f='${Version}' perftest > "$work/perftest" 2>/dev/null
grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //' > "$work/cpu"
nproc > "$work/cpus"
"#;

/// A shell function `pair ID PORT COMMAND`: runs COMMAND as a server and, once it listens on
/// PORT, COMMAND with `127.0.0.1` appended as its client; records both exit codes in
/// `$work/statuses` and the outputs in `$work/ID.server` and `$work/ID.client`.
pub(crate) const PAIR: &str = r#"# Server on CPU 0, client on CPU 1, as perftest's run_perftest_loopback runs them: two
# spinning processes that share a CPU take turns only at the scheduler's tick (4 ms).
pin0=; pin1=
if [ "$(nproc)" -ge 2 ]; then pin0="taskset -c 0"; pin1="taskset -c 1"; fi
pair() {
    id=$1; port=$2
    timeout 300 $pin0 sh -c "$3" > "$work/$id.server" 2>&1 &
    server=$!
    i=0
    until grep -q ":$(printf %04X "$port") .* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
        i=$((i+1))
        if [ $i -gt 600 ]; then echo "guest: $id: the server never listened"; kill $server; break; fi
        sleep 0.05
    done
    timeout 300 $pin1 sh -c "$3 127.0.0.1" > "$work/$id.client" 2>&1
    client=$?
    wait $server
    echo "$client $? $id" >> "$work/statuses"
    echo "guest: $id client $client"
}
"#;

/// The tools in the order round `round` runs them: alternating, so that a drift of the
/// machine's speed during the run favours neither.
fn order(round: u32) -> [&'static str; 2] {
    if round % 2 == 1 {
        ["rust", "c"]
    } else {
        ["c", "rust"]
    }
}

/// The message-rate runs' tools in the order round `round` runs them: the `unsafe` calls, C,
/// and the safe slot path (`bw --path slot`), rotated from round to round.
fn rate_order(round: u32) -> [&'static str; 3] {
    let tools = ["rust", "c", "slot"];
    let k = (round as usize + 2) % 3;
    [tools[k], tools[(k + 1) % 3], tools[(k + 2) % 3]]
}

/// Every run of `plan`, in the order they happen.
fn runs(plan: &Plan) -> Vec<Run> {
    let mut runs = Vec::new();
    for round in 1..=plan.rounds {
        for test in TESTS {
            let sizes = if test == "atomic" {
                vec![8]
            } else {
                plan.sizes.clone()
            };
            for size in sizes {
                for tool in order(round) {
                    runs.push(Run {
                        round,
                        tool,
                        test,
                        size,
                        mode: Mode::Latency,
                    });
                }
            }
        }
        for list in POST_LISTS {
            for tool in rate_order(round) {
                runs.push(Run {
                    round,
                    tool,
                    test: RATE,
                    size: RATE_SIZE,
                    mode: Mode::Rate(list),
                });
            }
        }
        for test in BW_TESTS {
            for tool in order(round) {
                runs.push(Run {
                    round,
                    tool,
                    test,
                    size: BW_SIZE,
                    mode: Mode::Bandwidth,
                });
            }
        }
    }
    runs
}

/// `cargo xtask bench-compare [--rounds N] [--iters N] [--sizes a,b,..]
/// [--instruction-rounds N] [--write] [--smoke]`.
pub(crate) fn bench_compare(root: &Path, args: &[String]) -> Result<(), String> {
    let plan = parse_args(args)?;
    let lat = build_release_bin(root, "rdma-benches", "lat")?;
    let bw = build_release_bin(root, "rdma-benches", "bw")?;
    let tools = Tools { lat: &lat, bw: &bw };
    let work = root
        .join(".rdma-test")
        .join(format!("{}-bench", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let runs = runs(&plan);
    let count = Count::prepare(root, &work, plan.instruction_rounds)?;
    let mut script = String::new();
    script.push_str(&format!(
        "work={}\n{MACHINE_FACTS}{PAIR}",
        shell_quote(&work.to_string_lossy())
    ));
    for (n, run) in runs.iter().enumerate() {
        // A new port per run: no run waits for the previous one's socket to close.
        let port = 20000 + n as u16;
        script.push_str(&format!(
            "pair {} {port} {}\n",
            run.id(),
            shell_quote(&run.command(tools, &plan, port))
        ));
    }
    script.push_str(&count.script());
    vm::run_on_device(
        root,
        &work,
        "bench-compare",
        "lat and perftest, alternately; then the instruction counts",
        &script,
    )?;
    let results = collect(&work, &runs)?;
    let counts = count.results()?;
    let machine = Machine::read(&work);
    let mut table = table(&plan, &results, &machine);
    table.push('\n');
    table.push_str(&rate_table(&plan, &results));
    table.push('\n');
    table.push_str(&bw_table(&plan, &results));
    table.push('\n');
    table.push_str(&counts.table(plan.instruction_rounds));
    print!("{table}");
    if plan.write {
        let doc = root.join("docs/benchmarks.md");
        write_section(&doc, &table)?;
        plot(&root.join(PLOT), &results)?;
        rate_plot(&root.join(RATE_PLOT), &results)?;
        println!("wrote {}, {PLOT} and {RATE_PLOT}", doc.display());
    }
    Ok(())
}

/// Per (test, size, mode) and tool, one value per round in round order: the typical
/// latency (µs) of a latency run, the message rate (millions per second) of a message-rate
/// run, the average bandwidth (MiB/s) of a bandwidth run; `None` for a round whose report has no finite positive number (perftest prints `inf`,
/// or a rate of 0, when it fails to measure its CPU's clock rate, which happens in the
/// emulated VM).
type Results = BTreeMap<(&'static str, usize, Mode), BTreeMap<&'static str, Vec<Option<f64>>>>;

/// Reads every run's client report; fails on a run that failed or printed no result row.
fn collect(work: &Path, runs: &[Run]) -> Result<Results, String> {
    let statuses = std::fs::read_to_string(work.join("statuses")).unwrap_or_default();
    let mut results = Results::new();
    for run in runs {
        let id = run.id();
        let status = statuses
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some(&id))
            .ok_or_else(|| format!("{id}: never ran"))?;
        if !status.starts_with("0 0 ") {
            let client =
                std::fs::read_to_string(work.join(format!("{id}.client"))).unwrap_or_default();
            let server =
                std::fs::read_to_string(work.join(format!("{id}.server"))).unwrap_or_default();
            return Err(format!(
                "{id}: exit codes (client, server) {status}\nclient:\n{client}\nserver:\n{server}"
            ));
        }
        let client = std::fs::read_to_string(work.join(format!("{id}.client")))
            .map_err(|e| format!("{id}: {e}"))?;
        let value = match run.mode {
            Mode::Latency => typical_of(&client, run.size),
            Mode::Rate(_) => msg_rate_of(&client, run.size),
            Mode::Bandwidth => bw_average_of(&client, run.size),
        };
        let value = value
            .ok_or_else(|| format!("{id}: no result row for {} bytes:\n{client}", run.size))?;
        let typical = measurement(value);
        results
            .entry((run.test, run.size, run.mode))
            .or_default()
            .entry(run.tool)
            .or_default()
            .push(typical);
    }
    Ok(results)
}

/// A value read from a report, if it is a measurement: perftest prints `inf` latencies, or a
/// rate of 0, when it fails to measure its CPU's clock rate.
pub(crate) fn measurement(value: f64) -> Option<f64> {
    (value.is_finite() && value > 0.0).then_some(value)
}

/// `t_typical` of the result row for `size` in a perftest-shaped latency report: the fifth of
/// nine numbers.
pub(crate) fn typical_of(report: &str, size: usize) -> Option<f64> {
    report.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 9 || fields[0].parse::<usize>().ok()? != size {
            return None;
        }
        let numbers: Option<Vec<f64>> = fields[2..].iter().map(|f| f.parse().ok()).collect();
        numbers.map(|n| n[2])
    })
}

/// The message rate (the last of five numbers) of the result row for `size` in a
/// perftest-shaped bandwidth report.
fn msg_rate_of(report: &str, size: usize) -> Option<f64> {
    bw_row_of(report, size).map(|[_, _, rate]| rate)
}

/// The average bandwidth (the fourth of five numbers, MiB/s unless the report is in Gb/s) of
/// the result row for `size` in a perftest-shaped bandwidth report.
fn bw_average_of(report: &str, size: usize) -> Option<f64> {
    bw_row_of(report, size).map(|[_, average, _]| average)
}

/// Peak bandwidth, average bandwidth and message rate of the result row for `size` (five
/// numbers: bytes, iterations and those) in a perftest-shaped bandwidth report.
fn bw_row_of(report: &str, size: usize) -> Option<[f64; 3]> {
    report.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 5 || fields[0].parse::<usize>().ok()? != size {
            return None;
        }
        let numbers: Option<Vec<f64>> = fields[2..].iter().map(|f| f.parse().ok()).collect();
        numbers.map(|n| [n[0], n[1], n[2]])
    })
}

/// Facts of the machine the run was on, as the guest recorded them.
#[derive(Debug, Default)]
pub(crate) struct Machine {
    pub(crate) kernel: String,
    pub(crate) rdma_core: String,
    pub(crate) perftest: String,
    pub(crate) cpu: String,
    pub(crate) cpus: String,
}

impl Machine {
    pub(crate) fn read(work: &Path) -> Self {
        let read = |name: &str| {
            std::fs::read_to_string(work.join(name))
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "?".into())
        };
        Self {
            kernel: read("kernel"),
            rdma_core: read("rdma-core"),
            perftest: read("perftest"),
            cpu: read("cpu"),
            cpus: read("cpus"),
        }
    }
}

/// The finite values of `values`.
pub(crate) fn measured(values: &[Option<f64>]) -> Vec<f64> {
    values.iter().flatten().copied().collect()
}

pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Each round's ratio of Rust's typical latency to C's, for the rounds where both measured.
fn ratios(tools: &BTreeMap<&'static str, Vec<Option<f64>>>) -> Vec<f64> {
    ratios_of(tools, "rust")
}

/// Each round's ratio of `tool`'s value to C's, for the rounds where both measured.
fn ratios_of(tools: &BTreeMap<&'static str, Vec<Option<f64>>>, tool: &str) -> Vec<f64> {
    match (tools.get(tool), tools.get("c")) {
        (Some(rust), Some(c)) => rust
            .iter()
            .zip(c)
            .filter_map(|(r, c)| Some((*r)? / (*c)?))
            .collect(),
        _ => Vec::new(),
    }
}

/// The result table in Markdown, with how it was made.
fn table(plan: &Plan, results: &Results, machine: &Machine) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Run of {} ({} rounds × {} iterations; {} on {} vCPUs, kernel {}, rdma-core {}, \
         perftest {}; Soft-RoCE in QEMU unless the host has a device). Latency is perftest's \
         `t_typical` (median) in µs: half the round trip for send and write, the whole one for \
         read and atomic. Reproduce: `cargo xtask bench-compare --rounds {} --iters {} \
         --sizes {} --instruction-rounds {}`.\n",
        today(),
        plan.rounds,
        plan.iters,
        machine.cpu,
        machine.cpus,
        machine.kernel,
        machine.rdma_core,
        machine.perftest,
        plan.rounds,
        plan.iters,
        plan.sizes
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(","),
        plan.instruction_rounds
    );
    let _ = writeln!(
        out,
        "| test | bytes | Rust `lat` (µs) | C perftest (µs) | Rust / C (median) | Rust / C (range over rounds) | rounds |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---|---:|");
    let mut all = Vec::new();
    let latency = || {
        results
            .iter()
            .filter(|((_, _, mode), _)| *mode == Mode::Latency)
    };
    let runs: usize = latency().flat_map(|(_, t)| t.values()).map(Vec::len).sum();
    let unmeasured: usize = latency()
        .flat_map(|(_, t)| t.values())
        .flatten()
        .filter(|v| v.is_none())
        .count();
    for ((test, size, _), tools) in latency() {
        let r = ratios(tools);
        all.extend_from_slice(&r);
        let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let _ = writeln!(
            out,
            "| {test} | {size} | {:.2} | {:.2} | {:.3} | {lo:.3} – {hi:.3} | {} |",
            median(&measured(tools.get("rust").map_or(&[][..], Vec::as_slice))),
            median(&measured(tools.get("c").map_or(&[][..], Vec::as_slice))),
            median(&r),
            r.len(),
        );
    }
    let _ = writeln!(
        out,
        "\nMedian of all {} per-round ratios: {:.3}. A round counts where both tools measured \
         (perftest prints `inf`, or a rate of 0, when it fails to measure its CPU's clock rate; {} of {} runs \
         here).",
        all.len(),
        median(&all),
        unmeasured,
        runs
    );
    out
}

/// The message-rate table in Markdown: 64-byte SENDs by post-list length, and what batching
/// gains each tool.
fn rate_table(plan: &Plan, results: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Message rate: {} SENDs of {RATE_SIZE} bytes per run, `bw send -l N` against \
         `ib_send_bw -l N` (millions of messages per second; perftest's defaults otherwise: \
         send queue 128, a completion per post list); `bw send -l N --path slot` is the safe \
         slot path (each post list a `SlotSendList` of a slot ring's slots).\n",
        plan.rate_iters
    );
    let _ = writeln!(
        out,
        "| post list | Rust `bw` (Mpps) | Rust `bw --path slot` (Mpps) | C perftest (Mpps) | Rust / C (median) | Rust / C (range over rounds) | slot / C (median) | slot / C (range over rounds) | rounds |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---|---:|---|---:|");
    let rate = |list: u32, tool: &str| {
        results
            .get(&(RATE, RATE_SIZE, Mode::Rate(list)))
            .and_then(|t| t.get(tool))
            .map_or(f64::NAN, |v| median(&measured(v)))
    };
    for list in POST_LISTS {
        let Some(tools) = results.get(&(RATE, RATE_SIZE, Mode::Rate(list))) else {
            continue;
        };
        let r = ratios(tools);
        let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s = ratios_of(tools, "slot");
        let s_lo = s.iter().copied().fold(f64::INFINITY, f64::min);
        let s_hi = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let _ = writeln!(
            out,
            "| {list} | {:.4} | {:.4} | {:.4} | {:.3} | {lo:.3} – {hi:.3} | {:.3} | \
             {s_lo:.3} – {s_hi:.3} | {} |",
            rate(list, "rust"),
            rate(list, "slot"),
            rate(list, "c"),
            median(&r),
            median(&s),
            r.len()
        );
    }
    let (first, last) = (POST_LISTS[0], POST_LISTS[POST_LISTS.len() - 1]);
    let _ = writeln!(
        out,
        "\nBatching {last} requests per doorbell against one: Rust {:.2}×, its slot path {:.2}×, \
         C {:.2}× the message rate.",
        rate(last, "rust") / rate(first, "rust"),
        rate(last, "slot") / rate(first, "slot"),
        rate(last, "c") / rate(first, "c")
    );
    out
}

/// The bandwidth table in Markdown: RDMA WRITE and READ of [`BW_SIZE`] bytes.
fn bw_table(plan: &Plan, results: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Bandwidth: {} requests of {BW_SIZE} bytes, `bw <test>` against `ib_<test>_bw` \
         (average MiB/s; perftest's defaults otherwise: send queue 128, 16 reads outstanding, \
         rxe's maximum).\n",
        plan.bw_iters
    );
    let _ = writeln!(
        out,
        "| test | Rust `bw` (MiB/s) | C perftest (MiB/s) | Rust / C (median) | Rust / C (range over rounds) | rounds |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---|---:|");
    for test in BW_TESTS {
        let Some(tools) = results.get(&(test, BW_SIZE, Mode::Bandwidth)) else {
            continue;
        };
        let value = |tool: &str| tools.get(tool).map_or(f64::NAN, |v| median(&measured(v)));
        let r = ratios(tools);
        let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let _ = writeln!(
            out,
            "| {test} | {:.1} | {:.1} | {:.3} | {lo:.3} – {hi:.3} | {} |",
            value("rust"),
            value("c"),
            median(&r),
            r.len()
        );
    }
    out
}

/// Today's date (UTC), from `date`, for the record.
pub(crate) fn today() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".into())
}

/// Replaces the text between [`BEGIN`] and [`END`] in `doc` with `table`.
fn write_section(doc: &Path, table: &str) -> Result<(), String> {
    write_between(doc, BEGIN, END, table)
}

/// Replaces the text between the lines `begin` and `end` in `doc` with `table`.
pub(crate) fn write_between(doc: &Path, begin: &str, end: &str, table: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(doc).map_err(|e| format!("{}: {e}", doc.display()))?;
    let (Some(b), Some(e)) = (text.find(begin), text.find(end)) else {
        return Err(format!("{} lacks the {begin} … {end} lines", doc.display()));
    };
    let new = format!("{}{begin}\n{table}{}", &text[..b], &text[e..]);
    std::fs::write(doc, new).map_err(|e| format!("{}: {e}", doc.display()))
}

/// Latency against message size, Rust and C, one panel per test, as SVG.
fn plot(path: &PathBuf, results: &Results) -> Result<(), String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    let root = SVGBackend::new(path, (1000, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let panels = root.split_evenly((2, 2));
    for (panel, test) in panels.iter().zip(TESTS) {
        let series: Vec<(&str, Vec<(f64, f64)>)> = ["rust", "c"]
            .into_iter()
            .map(|tool| {
                let points = results
                    .iter()
                    .filter(|((t, _, mode), _)| *t == test && *mode == Mode::Latency)
                    .filter_map(|((_, size, _), tools)| {
                        let values = measured(tools.get(tool)?);
                        (!values.is_empty()).then(|| (*size as f64, median(&values)))
                    })
                    .collect();
                (tool, points)
            })
            .collect();
        let ys = series.iter().flat_map(|(_, p)| p.iter().map(|(_, y)| *y));
        let top = ys.fold(1.0f64, f64::max) * 1.15;
        let xs: Vec<f64> = series[0].1.iter().map(|(x, _)| *x).collect();
        let (lo, hi) = (
            xs.iter().copied().fold(f64::INFINITY, f64::min).min(2.0) / 1.5,
            xs.iter().copied().fold(1.0f64, f64::max).max(8.0) * 1.5,
        );
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{test}: t_typical (µs)"), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d((lo..hi).log_scale(), 0.0..top)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("message size (bytes)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .map_err(|e| err(&e))?;
        draw_tools(&mut chart, series, ["Rust lat", "C perftest"]).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

/// The x-logarithmic charts of the plots.
type LogChart<'a, 'b> = plotters::chart::ChartContext<
    'a,
    plotters::backend::SVGBackend<'b>,
    plotters::coord::cartesian::Cartesian2d<
        plotters::coord::combinators::LogCoord<f64>,
        plotters::coord::types::RangedCoordf64,
    >,
>;

/// Draws the Rust series (red) and the C series (blue) of `series`, as lines with points,
/// labelled `labels`, and the legend.
fn draw_tools<'a, 'b: 'a>(
    chart: &mut LogChart<'a, 'b>,
    series: Vec<(&str, Vec<(f64, f64)>)>,
    labels: [&str; 2],
) -> Result<(), String> {
    use plotters::prelude::*;
    for ((_, points), (color, label)) in series
        .into_iter()
        .zip([(RED, labels[0]), (BLUE, labels[1])])
    {
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

/// Message rate against post-list length, Rust and C, as SVG.
fn rate_plot(path: &PathBuf, results: &Results) -> Result<(), String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    let series: Vec<(&str, Vec<(f64, f64)>)> = ["rust", "c"]
        .into_iter()
        .map(|tool| {
            let points = POST_LISTS
                .iter()
                .filter_map(|&list| {
                    let values = measured(
                        results
                            .get(&(RATE, RATE_SIZE, Mode::Rate(list)))?
                            .get(tool)?,
                    );
                    (!values.is_empty()).then(|| (f64::from(list), median(&values)))
                })
                .collect();
            (tool, points)
        })
        .collect();
    let top = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
        .fold(0.0f64, f64::max)
        .max(1e-6)
        * 1.2;
    let root = SVGBackend::new(path, (640, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{RATE_SIZE}-byte SEND message rate (Mpps)"),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d((0.7f64..48.0).log_scale(), 0.0..top)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("requests per post (post list)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()
        .map_err(|e| err(&e))?;
    draw_tools(&mut chart, series, ["Rust bw", "C ib_send_bw"]).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_the_smoke_plan() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let plan = parse_args(&args(&[
            "--rounds",
            "3",
            "--sizes",
            "2,4096",
            "--instruction-rounds",
            "500",
            "--write",
        ]))
        .unwrap();
        assert_eq!(
            plan,
            Plan {
                rounds: 3,
                iters: 1000,
                rate_iters: 8192,
                bw_iters: 1000,
                sizes: vec![2, 4096],
                instruction_rounds: 500,
                write: true
            }
        );
        let smoke = parse_args(&args(&["--smoke"])).unwrap();
        assert_eq!(
            (
                smoke.rounds,
                smoke.iters,
                smoke.rate_iters,
                smoke.bw_iters,
                smoke.sizes,
                smoke.instruction_rounds
            ),
            (1, 100, 1024, 100, vec![64], 200)
        );
        assert!(parse_args(&args(&["--instruction-rounds", "0"])).is_err());
        assert!(parse_args(&args(&["--iters", "4"])).is_err());
        assert!(parse_args(&args(&["--sizes", "0"])).is_err());
        assert!(parse_args(&args(&["--rounds"])).is_err());
        assert!(parse_args(&args(&["--bogus"])).is_err());
    }

    #[test]
    fn runs_alternate_the_tools_and_atomics_are_8_bytes() {
        let plan = parse_args(&[
            "--rounds".into(),
            "2".into(),
            "--sizes".into(),
            "2,64".into(),
        ])
        .unwrap();
        let runs = runs(&plan);
        // 2 rounds × ((3 tests × 2 sizes + atomic + 2 bandwidths) × 2 tools + 3 post lists ×
        // 3 tools: the slot path's message rate too).
        assert_eq!(runs.len(), 54);
        assert_eq!((runs[0].tool, runs[1].tool), ("rust", "c"));
        assert_eq!((runs[27].tool, runs[28].tool), ("c", "rust"));
        assert!(
            runs.iter()
                .filter(|r| r.test == "atomic")
                .all(|r| r.size == 8)
        );
        let tools = Tools {
            lat: "/x/lat",
            bw: "/x/bw",
        };
        assert_eq!(
            runs[1].command(tools, &plan, 20001),
            "ib_send_lat -d rxe0 -x 1 -s 2 -n 1000 -p 20001 -F"
        );
        assert_eq!(
            runs[0].command(tools, &plan, 20000),
            "'/x/lat' send -d rxe0 -x 1 -s 2 -n 1000 -p 20000"
        );
        let rates: Vec<&Run> = runs[..27]
            .iter()
            .filter(|r| matches!(r.mode, Mode::Rate(_)))
            .collect();
        assert_eq!(
            rates
                .iter()
                .map(|r| match r.mode {
                    Mode::Rate(list) => (r.tool, list),
                    _ => unreachable!(),
                })
                .collect::<Vec<_>>(),
            [
                ("rust", 1),
                ("c", 1),
                ("slot", 1),
                ("rust", 8),
                ("c", 8),
                ("slot", 8),
                ("rust", 32),
                ("c", 32),
                ("slot", 32)
            ]
        );
        assert_eq!(
            rates[6].command(tools, &plan, 20030),
            "'/x/bw' send -d rxe0 -x 1 -s 64 -n 8192 -p 20030 -l 32"
        );
        assert_eq!(
            rates[7].command(tools, &plan, 20031),
            "ib_send_bw -d rxe0 -x 1 -s 64 -n 8192 -p 20031 -l 32 -F"
        );
        assert_eq!(
            rates[8].command(tools, &plan, 20032),
            "'/x/bw' send -d rxe0 -x 1 -s 64 -n 8192 -p 20032 -l 32 --path slot"
        );
        assert_eq!(rates[7].id(), "1-c-send_bw-64-l32");
        assert_eq!(rates[8].id(), "1-slot-send_bw-64-l32");
        // The rate runs' order rotates over three rounds.
        assert_eq!(rate_order(2), ["c", "slot", "rust"]);
        assert_eq!(rate_order(3), ["slot", "rust", "c"]);
        let bws: Vec<&Run> = runs[..27]
            .iter()
            .filter(|r| r.mode == Mode::Bandwidth)
            .collect();
        assert_eq!(
            bws.iter().map(|r| (r.tool, r.test)).collect::<Vec<_>>(),
            [
                ("rust", "write"),
                ("c", "write"),
                ("rust", "read"),
                ("c", "read")
            ]
        );
        assert_eq!(
            bws[2].command(tools, &plan, 20040),
            "'/x/bw' read -d rxe0 -x 1 -s 65536 -n 1000 -p 20040"
        );
        assert_eq!(
            bws[3].command(tools, &plan, 20041),
            "ib_read_bw -d rxe0 -x 1 -s 65536 -n 1000 -p 20041 -F"
        );
        assert_eq!(bws[3].id(), "1-c-read-65536-bw");
    }

    #[test]
    fn typical_is_read_from_either_tool_s_row() {
        let c = " #bytes #iterations    t_min[usec] ...\n 64      1000          0.76           0.95         0.78     \t       0.79        \t0.01   \t\t0.83    \t\t0.95   \n";
        assert_eq!(typical_of(c, 64), Some(0.78));
        let bw = " 64         8192             3.15               2.89  \t\t     0.047312\n";
        assert_eq!(msg_rate_of(bw, 64), Some(0.047312));
        assert_eq!(bw_average_of(bw, 64), Some(2.89));
        assert_eq!(msg_rate_of(bw, 2), None);
        assert_eq!(typical_of(bw, 64), None);
        assert_eq!(msg_rate_of(c, 64), None);
        let failed = " 2       1000          inf            inf          inf      \t       inf         \t-nan   \t\tinf     \t\tinf    ";
        assert_eq!(typical_of(failed, 2).map(f64::is_finite), Some(false));
        assert_eq!(typical_of(failed, 2).and_then(measurement), None);
        let no_rate = " 64         8192             0.00               0.00   \t\t   0.000000\n";
        assert_eq!(msg_rate_of(no_rate, 64), Some(0.0));
        assert_eq!(msg_rate_of(no_rate, 64).and_then(measurement), None);
        assert_eq!(msg_rate_of(bw, 64).and_then(measurement), Some(0.047312));
        assert_eq!(typical_of(c, 2), None);
        assert_eq!(typical_of(" local address: LID 0x00", 64), None);
    }

    #[test]
    fn ratios_are_taken_within_rounds() {
        let mut tools = BTreeMap::new();
        tools.insert("rust", vec![Some(10.0), Some(12.0), Some(9.0), Some(5.0)]);
        tools.insert("c", vec![Some(10.0), Some(10.0), Some(10.0), None]);
        // The last round has no C value: it does not count.
        assert_eq!(ratios(&tools), vec![1.0, 1.2, 0.9]);
        assert_eq!(median(&ratios(&tools)), 1.0);
        assert_eq!(median(&[1.0, 2.0]), 1.5);
    }
}
