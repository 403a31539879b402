//! `cargo xtask instructions`: the user-space instructions of one post+poll round written in C
//! against libibverbs, on rdma-verbs' `unsafe` calls, its owned-buffer path and its slot rings,
//! with the receive through an SRQ (`unsafe`, SRQ slot ring), and with extended
//! completion queues, counted by callgrind on the device (in the VM where the host has none),
//! and their ratios. See
//! `docs/benchmarks.md` for the method.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::build::{build_c_program, build_release_bin};
use super::vm::{self, shell_quote};

/// The modes `instructions` measures: C (`benches/c/post_poll.c`), then rdma-verbs' paths: the
/// `unsafe` calls, the owned one twice (taking and returning a buffer per request, `owned`, and
/// re-posting the buffers its completions hand back, `reuse`, as the `unsafe` mode reuses one
/// region) and slot rings (`slot`: each slot posted again when its completion hands it back);
/// then the receives through a shared receive queue: with the `unsafe` call (`srq-unsafe`) and
/// into an SRQ slot ring (`srq-slot`); last the `unsafe` round with extended completion
/// queues polled in sessions (`cq-ex`); then both queue pairs on one completion queue, each
/// completion routed in the measured poll, with the `unsafe` calls (`shared-unsafe`) and as
/// `docs/start-here.md`'s program is written (`shared-slot`).
const MODES: [&str; 10] = [
    "c",
    "unsafe",
    "owned",
    "reuse",
    "slot",
    "srq-unsafe",
    "srq-slot",
    "cq-ex",
    "shared-unsafe",
    "shared-slot",
];

/// `cargo xtask instructions [ROUNDS]` (default 2000).
pub(crate) fn instructions(root: &Path, args: &[String]) -> Result<(), String> {
    let rounds: u32 = match args.first() {
        Some(n) => n.parse().map_err(|_| format!("not a round count: {n}"))?,
        None => 2000,
    };
    let work = root.join(".rdma-test").join(std::process::id().to_string());
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let count = Count::prepare(root, &work, rounds)?;
    vm::run_on_device(
        root,
        &work,
        "instructions",
        "callgrind on the post and poll calls",
        &count.script(),
    )?;
    let counts = count.results()?;
    for mode in &counts.modes {
        println!(
            "{}: {:.1} instructions per round, {:.1} in the program itself, {:.1} in \
             libibverbs, the provider and libc",
            mode.name,
            mode.total,
            mode.own,
            mode.total - mode.own
        );
        for (function, cost) in &mode.functions {
            println!("  {function:<28} {cost:>8.1}");
        }
        if let Some(n) = mode.polled_twice {
            println!("  rounds polled twice: {n}");
        }
    }
    let [
        c,
        unsafe_,
        owned,
        reuse,
        slot,
        srq_unsafe,
        srq_slot,
        cq_ex,
        shared_unsafe,
        shared_slot,
    ] = &counts.modes;
    println!(
        "unsafe / c: {:.3} (in the program itself: {:.2})",
        unsafe_.total / c.total,
        unsafe_.own / c.own
    );
    println!(
        "owned / unsafe: {:.3} (in the program itself: {:.2})",
        owned.total / unsafe_.total,
        owned.own / unsafe_.own
    );
    println!(
        "reuse / unsafe: {:.3} (in the program itself: {:.2})",
        reuse.total / unsafe_.total,
        reuse.own / unsafe_.own
    );
    println!(
        "slot / unsafe: {:.3} (in the program itself: {:.2})",
        slot.total / unsafe_.total,
        slot.own / unsafe_.own
    );
    println!(
        "srq-slot / srq-unsafe: {:.3} (in the program itself: {:.2})",
        srq_slot.total / srq_unsafe.total,
        srq_slot.own / srq_unsafe.own
    );
    println!(
        "cq-ex / unsafe: {:.3} (in the program itself: {:.2})",
        cq_ex.total / unsafe_.total,
        cq_ex.own / unsafe_.own
    );
    println!(
        "shared-slot / shared-unsafe: {:.3} (in the program itself: {:.2})",
        shared_slot.total / shared_unsafe.total,
        shared_slot.own / shared_unsafe.own
    );
    Ok(())
}

/// A count to run: the programs built, where callgrind writes, how many rounds.
pub(crate) struct Count {
    binary: String,
    c_binary: String,
    work: PathBuf,
    rounds: u32,
}

/// One mode's counts, per round.
pub(crate) struct Mode {
    /// One of [`MODES`].
    pub(crate) name: &'static str,
    /// Every measured function's inclusive count.
    pub(crate) functions: BTreeMap<String, f64>,
    /// The measured functions together.
    pub(crate) total: f64,
    /// The part in the program's own code (not libibverbs, the provider or libc).
    pub(crate) own: f64,
    /// For the shared-queue modes: how many rounds needed a second poll, finished outside the
    /// measured calls (the program's `N of M rounds polled twice`).
    pub(crate) polled_twice: Option<u32>,
}

/// The modes' counts, in [`MODES`] order.
pub(crate) struct Counts {
    pub(crate) modes: [Mode; 10],
}

impl Count {
    /// Builds the Rust and C programs; callgrind's files go to `work`.
    pub(crate) fn prepare(root: &Path, work: &Path, rounds: u32) -> Result<Self, String> {
        if rounds == 0 {
            return Err("the round count must be positive".into());
        }
        Ok(Self {
            binary: build_release_bin(root, "rdma-benches", "instructions")?,
            c_binary: build_c_program(root, "benches/c/post_poll.c", "post_poll")?,
            work: work.to_path_buf(),
            rounds,
        })
    }

    fn out(&self, mode: &str) -> PathBuf {
        self.work.join(format!("callgrind.{mode}.out"))
    }

    /// The shell commands that run the modes under callgrind on the device (for
    /// [`vm::run_on_device`], whose prelude defines `fail`).
    pub(crate) fn script(&self) -> String {
        // The C program takes the device the Rust one finds: `instructions device` prints it.
        let mut commands = format!(
            "device=$({binary} device) || fail \"no device for the C round\"\n",
            binary = shell_quote(&self.binary)
        );
        for mode in MODES {
            let program = match mode {
                "c" => format!("{} $device", shell_quote(&self.c_binary)),
                _ => format!("{} {mode}", shell_quote(&self.binary)),
            };
            commands.push_str(&format!(
                "valgrind --tool=callgrind --dump-instr=yes --toggle-collect='measured_*' --callgrind-out-file={out} \
                 {program} {rounds} > {log} 2>&1 || {{ cat {log}; fail \"callgrind {mode} failed\"; }}\n",
                out = shell_quote(&self.out(mode).to_string_lossy()),
                log = shell_quote(&self.work.join(format!("{mode}.log")).to_string_lossy()),
                rounds = self.rounds,
            ));
        }
        commands
    }

    /// Reads callgrind's files after [`script`](Self::script) ran.
    pub(crate) fn results(&self) -> Result<Counts, String> {
        let per = |n: u64| n as f64 / f64::from(self.rounds);
        let mode = |name: &'static str| -> Result<Mode, String> {
            let functions = inclusive_costs(&self.out(name))?;
            if functions.is_empty() {
                return Err(format!("callgrind counted no measured function ({name})"));
            }
            let total: u64 = functions.values().sum();
            let program = if name == "c" {
                &self.c_binary
            } else {
                &self.binary
            };
            let own = total.saturating_sub(library_cost(&self.out(name), program)?);
            if own == 0 || own >= total {
                return Err(format!(
                    "{name}: {own} of {total} instructions in the program itself: not a \
                     measurement"
                ));
            }
            let polled_twice = if name.starts_with("shared-") {
                Some(polled_twice(&self.work.join(format!("{name}.log")))?)
            } else {
                None
            };
            Ok(Mode {
                name,
                functions: functions.into_iter().map(|(f, n)| (f, per(n))).collect(),
                total: per(total),
                own: per(own),
                polled_twice,
            })
        };
        let [
            c,
            unsafe_,
            owned,
            reuse,
            slot,
            srq_unsafe,
            srq_slot,
            cq_ex,
            shared_unsafe,
            shared_slot,
        ] = MODES;
        Ok(Counts {
            modes: [
                mode(c)?,
                mode(unsafe_)?,
                mode(owned)?,
                mode(reuse)?,
                mode(slot)?,
                mode(srq_unsafe)?,
                mode(srq_slot)?,
                mode(cq_ex)?,
                mode(shared_unsafe)?,
                mode(shared_slot)?,
            ],
        })
    }
}

impl Counts {
    /// The Markdown table of the counts: per round, each mode's total, its part in the
    /// program's own code, and the ratios.
    pub(crate) fn table(&self, rounds: u32) -> String {
        let [
            c,
            unsafe_,
            owned,
            reuse,
            slot,
            srq_unsafe,
            srq_slot,
            cq_ex,
            shared_unsafe,
            shared_slot,
        ] = &self.modes;
        let mut out = format!(
            "Instructions per post+poll round (callgrind, {rounds} rounds; post one receive, \
             post one 64-byte signaled SEND, poll both; owned: a buffer taken from the pool for \
             each request and returned by its completion; owned, reused: the buffers the \
             completions hand back posted again; slot ring: a queue pair's own slots, each \
             handed back by its completion and posted again):\n\n\
             | | C | `unsafe` | owned | owned, reused | slot ring |\n\
             |---|---:|---:|---:|---:|---:|\n"
        );
        out.push_str(&format!(
            "| round | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
            c.total, unsafe_.total, owned.total, reuse.total, slot.total
        ));
        out.push_str(&format!(
            "| in the program's own code | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
            c.own, unsafe_.own, owned.own, reuse.own, slot.own
        ));
        out.push_str(&format!(
            "| ratio | 1 | {:.3} × C | {:.3} × `unsafe` | {:.3} × `unsafe` | {:.3} × \
             `unsafe` |\n",
            unsafe_.total / c.total,
            owned.total / unsafe_.total,
            reuse.total / unsafe_.total,
            slot.total / unsafe_.total
        ));
        out.push_str(&format!(
            "\nThe same round with the receive posted to a shared receive queue that the \
             receiving queue pair takes it from (the send as in the `unsafe` and slot ring \
             columns):\n\n\
             | | `unsafe` | SRQ slot ring |\n\
             |---|---:|---:|\n\
             | round | {:.0} | {:.0} |\n\
             | in the program's own code | {:.0} | {:.0} |\n\
             | ratio | 1 | {:.3} × `unsafe` |\n",
            srq_unsafe.total,
            srq_slot.total,
            srq_unsafe.own,
            srq_slot.own,
            srq_slot.total / srq_unsafe.total
        ));
        out.push_str(&format!(
            "\nThe `unsafe` round with extended completion queues (`CqBuilder::extended` with \
             the byte count), each polled in a session (`poll_extended`) that reads the status, \
             opcode and byte count of its completion inside the measured call, as that API \
             requires (on Soft-RoCE one `ibv_start_poll` and one `ibv_end_poll` per \
             completion):\n\n\
             | | `unsafe`, classic queues | `unsafe`, extended queues |\n\
             |---|---:|---:|\n\
             | round | {:.0} | {:.0} |\n\
             | in the program's own code | {:.0} | {:.0} |\n\
             | ratio | 1 | {:.3} × classic |\n",
            unsafe_.total,
            cq_ex.total,
            unsafe_.own,
            cq_ex.own,
            cq_ex.total / unsafe_.total
        ));
        out.push_str(&format!(
            "\nThe round of `docs/start-here.md`'s program as it is written there: both queue \
             pairs on one completion queue, one poll finding both completions, each routed \
             (slot rings: offered to the receive ring, then to the send ring, the send's slot \
             taken for the send and put back; `unsafe`: told apart by request id):\n\n\
             | | `unsafe`, one queue | slot rings, one queue |\n\
             |---|---:|---:|\n\
             | round | {:.0} | {:.0} |\n\
             | in the program's own code | {:.0} | {:.0} |\n\
             | ratio | 1 | {:.3} × `unsafe` |\n\n\
             Rounds whose second completion one poll did not find (finished outside the \
             measured calls): {} and {}.\n",
            shared_unsafe.total,
            shared_slot.total,
            shared_unsafe.own,
            shared_slot.own,
            shared_slot.total / shared_unsafe.total,
            shared_unsafe.polled_twice.unwrap_or_default(),
            shared_slot.polled_twice.unwrap_or_default(),
        ));
        out
    }
}

/// The `N` of the `N of M rounds polled twice` line a shared-queue mode's log has.
fn polled_twice(log: &Path) -> Result<u32, String> {
    let text = std::fs::read_to_string(log).map_err(|e| format!("{}: {e}", log.display()))?;
    text.lines()
        .find_map(|line| {
            let (n, rest) = line.split_once(" of ")?;
            rest.ends_with(" rounds polled twice")
                .then(|| n.parse().ok())
                .flatten()
        })
        .ok_or_else(|| format!("{}: no `rounds polled twice` line", log.display()))
}

/// The inclusive instruction count of each measured function in callgrind output `file`, as
/// `callgrind_annotate --inclusive=yes` reports it.
fn inclusive_costs(file: &Path) -> Result<BTreeMap<String, u64>, String> {
    Ok(parse_annotate(&annotate(file, "--inclusive=yes")?))
}

/// `callgrind_annotate --threshold=100 <option> <file>`'s output.
fn annotate(file: &Path, option: &str) -> Result<String, String> {
    let output = Command::new("callgrind_annotate")
        .args([option, "--threshold=100"])
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
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The instructions executed outside `program` (the exclusive costs of the functions of every
/// other object: libibverbs, the provider, libc), the same code in every mode. The rest is the
/// program's own code: for the Rust modes, rdma-verbs' code inlined into the measured functions
/// and any of it left out of line; for C, the measured functions with the `static inline`
/// verbs of `verbs.h` (which `callgrind_annotate` lists without their object, hence counting
/// the other objects rather than the program's).
fn library_cost(file: &Path, program: &str) -> Result<u64, String> {
    Ok(parse_libraries(&annotate(file, "--auto=no")?, program))
}

/// The sum of the costs of `callgrind_annotate` lines that name an object (`[...]` at the end)
/// other than `program`.
fn parse_libraries(text: &str, program: &str) -> u64 {
    text.lines()
        .filter(|line| {
            line.trim_end()
                .strip_suffix(']')
                .and_then(|l| l.rsplit_once(" ["))
                .is_some_and(|(_, o)| o != program)
        })
        .filter_map(leading_count)
        .sum()
}

/// The count a `callgrind_annotate` line starts with: `  1,234 (1.2%) ...` gives 1234.
fn leading_count(line: &str) -> Option<u64> {
    let first = line.split_whitespace().next()?;
    if !first.chars().all(|c| c.is_ascii_digit() || c == ',') {
        return None;
    }
    first.replace(',', "").parse().ok()
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
        if let Some(cost) = leading_count(line) {
            costs.entry(name).or_insert(cost);
        }
    }
    costs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rounds_polled_twice_come_from_the_log() {
        let dir = std::env::temp_dir().join(format!("polled-twice-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("shared-slot.log");
        std::fs::write(
            &log,
            "3 of 2000 rounds polled twice\nshared-slot: 2000 rounds\n",
        )
        .unwrap();
        assert_eq!(polled_twice(&log), Ok(3));
        std::fs::write(&log, "shared-slot: 2000 rounds\n").unwrap();
        assert!(
            polled_twice(&log)
                .unwrap_err()
                .contains("no `rounds polled twice` line")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn library_cost_sums_the_lines_of_other_objects() {
        let text = "\
1,032,000 (100.0%)  PROGRAM TOTALS
  700,000 (67.83%)  ???:0x0000000000003cc0 [/usr/lib/librxe-rdmav34.so]
   68,000 ( 6.59%)  benches/c/post_poll.c:measured_post_send_c [/w/target/c/post_poll]
   40,000 ( 3.88%)  ./string/memmove.S:__memcpy_avx_unaligned_erms [/usr/lib/libc.so.6]
   10,000 ( 0.97%)  /usr/include/infiniband/verbs.h:measured_post_send_c
        .           benches/c/post_poll.c:main [/w/target/c/post_poll]
";
        assert_eq!(parse_libraries(text, "/w/target/c/post_poll"), 740_000);
        assert_eq!(parse_libraries(text, "/usr/lib/libc.so.6"), 768_000);
    }

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
