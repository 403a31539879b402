//! `cargo xtask dsm-bench`: the DSM's benchmark. In one boot of the device VM (or on the
//! host's device): the page-fetch microbenchmark over the three transports, C perftest's
//! `ib_read_lat` and `ib_send_lat` at 4 KiB for reference, and the applications on one and two
//! nodes over each transport; several rounds, medians reported. Prints the tables; with
//! `--write` records them in `examples/dsm/README.md` and plots `examples/dsm/bench.svg`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::bench::{MACHINE_FACTS, Machine, PAIR, median, today, typical_of, write_between};
use super::build::build_release_bin;
use super::vm::{self, GUEST_DEVICE, shell_quote};

/// What is measured: a label, the transport and the fault mechanism.
const RUNS: [(&str, &str, &str); 4] = [
    ("tcp", "tcp", "sigsegv"),
    ("rdma-send", "rdma-send", "sigsegv"),
    ("rdma-read", "rdma-read", "sigsegv"),
    ("rdma-read, userfaultfd", "rdma-read", "userfaultfd"),
];
const BEGIN: &str = "<!-- dsm-bench:begin -->";
const END: &str = "<!-- dsm-bench:end -->";
const README: &str = "examples/dsm/README.md";
const PLOT: &str = "examples/dsm/bench.svg";

/// The applications timed: a name and their arguments.
const APPS: [(&str, &str); 3] = [
    ("counter", "counter --increments 200"),
    ("matmul", "matmul --n 96"),
    ("sor", "sor --n 160 --iterations 10"),
];

#[derive(Debug, Clone, PartialEq, Eq)]
struct Plan {
    rounds: u32,
    pages: u32,
    write: bool,
}

fn parse_args(args: &[String]) -> Result<Plan, String> {
    let mut plan = Plan {
        rounds: 3,
        pages: 200,
        write: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value"))?
                .parse::<u32>()
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| format!("{name} needs a number above 0"))
        };
        match arg.as_str() {
            "--rounds" => plan.rounds = value("--rounds")?,
            "--pages" => plan.pages = value("--pages")?,
            "--write" => plan.write = true,
            other => {
                return Err(format!(
                    "dsm-bench: unknown argument {other} (--rounds N, --pages N, --write)"
                ));
            }
        }
    }
    Ok(plan)
}

/// One transport's fetch measurements (ns), as `dsm fetch-bench` prints them.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fetch {
    fault_p50: f64,
    fault_p99: f64,
    transfer_p50: f64,
    local_p50: f64,
}

/// Reads the `fetch-bench:` line.
fn parse_fetch(text: &str) -> Option<Fetch> {
    let line = text.lines().find(|l| l.starts_with("fetch-bench: "))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |key: &str, nth: usize| -> Option<f64> {
        let at = words.iter().position(|w| *w == key)?;
        words.get(at + nth)?.trim_end_matches(';').parse().ok()
    };
    let local_at = words.iter().position(|w| *w == "local")?;
    let local = |key: &str| -> Option<f64> {
        let at = local_at + words[local_at..].iter().position(|w| *w == key)?;
        words.get(at + 1)?.parse().ok()
    };
    Some(Fetch {
        fault_p50: after("fault", 2)?,
        fault_p99: after("fault", 4)?,
        transfer_p50: after("transfer", 2)?,
        local_p50: local("p50")?,
    })
}

/// Reads the `time: N us` line.
fn parse_time(text: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix("time: ")?.strip_suffix(" us")?.parse().ok())
}

/// `cargo xtask dsm-bench [--rounds N] [--pages N] [--write]`.
pub(crate) fn dsm_bench(root: &Path, args: &[String]) -> Result<(), String> {
    let plan = parse_args(args)?;
    let dsm = build_release_bin(root, "rdma-dsm", "dsm")?;
    let work = root
        .join(".rdma-test")
        .join(format!("{}-dsm-bench", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let mut script = format!(
        "work={}\ndsm={}\n{MACHINE_FACTS}{PAIR}",
        shell_quote(&work.to_string_lossy()),
        shell_quote(&dsm)
    );
    script.push_str(
        r#"node_run() {
    id=$1; shift
    timeout 600 "$dsm" run "$@" > "$work/$id.out" 2> "$work/$id.err"
    code=$?
    echo "$code $id" >> "$work/dsm-statuses"
    echo "guest: $id $code"
}
"#,
    );
    let device = format!("-d {GUEST_DEVICE} -g 1 --window-mib 16");
    let mut port = 21000;
    for round in 0..plan.rounds {
        for (i, (_, t, faults)) in RUNS.iter().enumerate() {
            let _ = writeln!(
                script,
                "node_run fetch-{i}-{round} -n 2 -t {t} -f {faults} {device} fetch-bench --pages {}",
                plan.pages
            );
        }
        for test in ["read", "send"] {
            port += 1;
            let _ = writeln!(
                script,
                "pair c-{test}-{round} {port} {}",
                shell_quote(&format!(
                    "ib_{test}_lat -d {GUEST_DEVICE} -x 1 -s 4096 -n 1000 -p {port} -F"
                ))
            );
        }
        for (i, (_, t, faults)) in RUNS.iter().enumerate() {
            for nodes in [1, 2] {
                for (name, app) in APPS {
                    let _ = writeln!(
                        script,
                        "node_run app-{name}-{i}-{nodes}-{round} -n {nodes} -t {t} -f {faults} {device} {app} --time"
                    );
                }
            }
        }
    }
    vm::run_on_device(
        root,
        &work,
        "dsm-bench",
        "the DSM's fetch benchmark, perftest and the applications",
        &script,
    )?;
    let results = collect(&work, &plan)?;
    let machine = Machine::read(&work);
    let table = tables(&plan, &results, &machine);
    print!("{table}");
    if plan.write {
        write_between(&root.join(README), BEGIN, END, &table)?;
        plot(&root.join(PLOT), &results)?;
        println!("wrote {README} and {PLOT}");
    }
    Ok(())
}

/// Every round's measurements.
#[derive(Debug, Default)]
struct Results {
    fetch: BTreeMap<&'static str, Vec<Fetch>>,
    /// perftest's 4 KiB `t_typical` (µs) per test ("read", "send").
    c: BTreeMap<&'static str, Vec<f64>>,
    /// Application time (µs) per (app, transport, nodes).
    apps: BTreeMap<(&'static str, &'static str, u32), Vec<f64>>,
}

fn read(work: &Path, name: &str) -> String {
    std::fs::read_to_string(work.join(name)).unwrap_or_default()
}

fn collect(work: &Path, plan: &Plan) -> Result<Results, String> {
    let statuses = read(work, "dsm-statuses");
    let ran = |id: &str| -> Result<String, String> {
        let status = statuses
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(id))
            .ok_or_else(|| format!("{id}: never ran"))?;
        if !status.starts_with("0 ") {
            return Err(format!(
                "{id}: exit {status}\n{}\n{}",
                read(work, &format!("{id}.out")),
                read(work, &format!("{id}.err"))
            ));
        }
        Ok(read(work, &format!("{id}.out")))
    };
    let pairs = read(work, "statuses");
    let mut results = Results::default();
    for round in 0..plan.rounds {
        for (i, (label, _, _)) in RUNS.iter().enumerate() {
            let id = format!("fetch-{i}-{round}");
            let out = ran(&id)?;
            let fetch = parse_fetch(&out).ok_or_else(|| format!("{id}: no result line:\n{out}"))?;
            results.fetch.entry(label).or_default().push(fetch);
            for nodes in [1, 2] {
                for (name, _) in APPS {
                    let id = format!("app-{name}-{i}-{nodes}-{round}");
                    let out = ran(&id)?;
                    let time = parse_time(&out).ok_or_else(|| format!("{id}: no time:\n{out}"))?;
                    results
                        .apps
                        .entry((name, label, nodes))
                        .or_default()
                        .push(time);
                }
            }
        }
        for test in ["read", "send"] {
            let id = format!("c-{test}-{round}");
            let status = pairs
                .lines()
                .find(|l| l.split_whitespace().nth(2) == Some(id.as_str()))
                .ok_or_else(|| format!("{id}: never ran"))?;
            let client = read(work, &format!("{id}.client"));
            if !status.starts_with("0 0 ") {
                return Err(format!("{id}: exit codes {status}\n{client}"));
            }
            // perftest prints `inf` when it cannot measure the VM's clock: such rounds are
            // left out (and counted in the table's note).
            if let Some(v) = typical_of(&client, 4096).filter(|v| v.is_finite() && *v > 0.0) {
                results.c.entry(test).or_default().push(v);
            }
        }
    }
    Ok(results)
}

fn med(values: impl Iterator<Item = f64>) -> f64 {
    median(&values.collect::<Vec<f64>>())
}

fn tables(plan: &Plan, r: &Results, machine: &Machine) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Run of {} ({} rounds, {} pages fetched per round; {} on {} vCPUs, kernel {}, rdma-core \
         {}, perftest {}; Soft-RoCE in QEMU unless the host has a device). Medians over the \
         rounds. Reproduce: `cargo xtask dsm-bench --rounds {} --pages {}`.\n",
        today(),
        plan.rounds,
        plan.pages,
        machine.cpu,
        machine.cpus,
        machine.kernel,
        machine.rdma_core,
        machine.perftest,
        plan.rounds,
        plan.pages
    );
    let us = |ns: f64| ns / 1000.0;
    let c_read = med(r.c.get("read").into_iter().flatten().copied());
    let c_send = med(r.c.get("send").into_iter().flatten().copied());
    let _ = writeln!(
        out,
        "| transport, faults | fault service p50 (µs) | p99 (µs) | page transfer p50 (µs) | write after read p50 (µs) | fault p50 / tcp's |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    let tcp = med(r
        .fetch
        .get("tcp")
        .into_iter()
        .flatten()
        .map(|f| f.fault_p50));
    for (t, _, _) in RUNS {
        let f: Vec<Fetch> = r.fetch.get(t).cloned().unwrap_or_default();
        let p50 = med(f.iter().map(|x| x.fault_p50));
        let _ = writeln!(
            out,
            "| `{t}` | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |",
            us(p50),
            us(med(f.iter().map(|x| x.fault_p99))),
            us(med(f.iter().map(|x| x.transfer_p50))),
            us(med(f.iter().map(|x| x.local_p50))),
            p50 / tcp
        );
    }
    let read = r.fetch.get("rdma-read").cloned().unwrap_or_default();
    let read_p50 = us(med(read.iter().map(|x| x.fault_p50)));
    let local = us(med(read.iter().map(|x| x.local_p50)));
    let bound = 1.5 * (c_read + local);
    let c_rounds = |t: &str| r.c.get(t).map_or(0, Vec::len);
    let _ = writeln!(
        out,
        "\nC perftest at 4 KiB (`t_typical`): `ib_read_lat` {c_read:.1} µs, `ib_send_lat` \
         {c_send:.1} µs (one way) ({} and {} of {} rounds measured). Target: `rdma-read` fault \
         service ≤ 1.5 × (`ib_read_lat` + local fault) = 1.5 × ({c_read:.1} + {local:.1}) = \
         {bound:.1} µs; measured {read_p50:.1} µs = {:.2} × (`ib_read_lat` + local fault): {}.\n",
        c_rounds("read"),
        c_rounds("send"),
        plan.rounds,
        read_p50 / (c_read + local),
        if read_p50 <= bound { "met" } else { "not met" }
    );
    let _ = writeln!(
        out,
        "| application | transport, faults | 1 node (ms) | 2 nodes (ms) | speed-up |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|");
    for (name, args) in APPS {
        for (t, _, _) in RUNS {
            let one = med(r.apps.get(&(name, t, 1)).into_iter().flatten().copied());
            let two = med(r.apps.get(&(name, t, 2)).into_iter().flatten().copied());
            let _ = writeln!(
                out,
                "| `{args}` | `{t}` | {:.1} | {:.1} | {:.2} |",
                one / 1000.0,
                two / 1000.0,
                one / two
            );
        }
    }
    out
}

/// Fault-service p50 per transport, next to C's 4 KiB latencies, as bars (SVG).
fn plot(path: &Path, r: &Results) -> Result<(), String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    let mut bars: Vec<(String, f64)> = RUNS
        .iter()
        .map(|(t, _, _)| {
            let f = r.fetch.get(t).cloned().unwrap_or_default();
            (t.to_string(), med(f.iter().map(|x| x.fault_p50)) / 1000.0)
        })
        .collect();
    for test in ["read", "send"] {
        bars.push((
            format!("ib_{test}_lat 4K"),
            med(r.c.get(test).into_iter().flatten().copied()),
        ));
    }
    let top = bars
        .iter()
        .map(|b| b.1)
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (1100, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "DSM page fault service (p50) and C perftest 4 KiB latency",
            ("sans-serif", 20),
        )
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((0..bars.len()).into_segmented(), 0.0..top)
        .map_err(|e| err(&e))?;
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("µs")
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            let colour = if i < RUNS.len() { BLUE } else { RED };
            let v = if v.is_finite() { *v } else { 0.0 };
            let mut bar = Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), v),
                ],
                colour.mix(0.6).filled(),
            );
            bar.set_margin(0, 0, 12, 12);
            bar
        }))
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetch_and_time_lines_parse() {
        let line = "fetch-bench: 200 pages: fault p50 106496 p99 262144 p99.9 278528 ns; \
                    transfer p50 86016 p99 245760 ns; local fault p50 36864 p99 344064 ns";
        assert_eq!(
            parse_fetch(line),
            Some(Fetch {
                fault_p50: 106496.0,
                fault_p99: 262144.0,
                transfer_p50: 86016.0,
                local_p50: 36864.0,
            })
        );
        assert_eq!(parse_fetch("no such line"), None);
        assert_eq!(parse_time("sor: ...\ntime: 16677 us\n"), Some(16677.0));
        assert_eq!(parse_time("time: x us"), None);
    }

    /// Each bar is drawn once, under its own label: six filled bars whose heights follow the
    /// values, and every label in the picture.
    #[test]
    fn the_plot_has_one_labelled_bar_per_value() {
        let fetch = |p50_us: f64| Fetch {
            fault_p50: p50_us * 1000.0,
            fault_p99: 0.0,
            transfer_p50: 0.0,
            local_p50: 0.0,
        };
        let r = Results {
            fetch: RUNS
                .iter()
                .zip([300.0, 200.0, 100.0, 90.0])
                .map(|((t, _, _), v)| (*t, vec![fetch(v)]))
                .collect(),
            c: [("read", vec![50.0]), ("send", vec![40.0])]
                .into_iter()
                .collect(),
            apps: BTreeMap::new(),
        };
        let dir = std::env::temp_dir().join(format!("dsm-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bench.svg");
        plot(&path, &r).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let labels: Vec<String> = RUNS
            .iter()
            .map(|(t, _, _)| t.to_string())
            .chain(["ib_read_lat 4K".into(), "ib_send_lat 4K".into()])
            .collect();
        for label in &labels {
            let count = svg.lines().filter(|l| l.trim() == label).count();
            assert_eq!(count, 1, "{label}: {svg}");
        }
        let bars: Vec<f64> = svg
            .lines()
            .filter(|l| l.contains("<rect") && l.contains("opacity=\"0.6\""))
            .map(|l| {
                let h = l.split("height=\"").nth(1).unwrap();
                h[..h.find('"').unwrap()].parse().unwrap()
            })
            .collect();
        assert_eq!(bars.len(), 6, "{svg}");
        // Heights in the order drawn: 300, 200, 100, 90, 50, 40 µs.
        assert!(bars.windows(2).all(|w| w[0] > w[1]), "{bars:?}");
        let ratio = bars[0] / bars[2];
        assert!((2.9..3.1).contains(&ratio), "{bars:?}");
    }

    #[test]
    fn options() {
        let plan = parse_args(&["--rounds".into(), "5".into(), "--write".into()]).unwrap();
        assert_eq!((plan.rounds, plan.pages, plan.write), (5, 200, true));
        assert!(parse_args(&["--rounds".into(), "0".into()]).is_err());
        assert!(parse_args(&["--bogus".into()]).is_err());
    }
}
