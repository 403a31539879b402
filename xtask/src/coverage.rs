//! `cargo xtask coverage`: how much of the installed rdma-core's public API the library crates
//! call, by area.
//!
//! The public functions are read from what is installed, not from a list of ours:
//! - libibverbs' and librdmacm's exported functions (`nm -D --defined-only`), without those of
//!   a private symbol version (`IBVERBS_PRIVATE_*`: the provider interface);
//! - the `static inline` functions of `infiniband/verbs.h`, `rdma/rdma_cma.h` and
//!   `rdma/rdma_verbs.h` (the data-path verbs and the endpoint helpers);
//! - kept: names starting `ibv_` or `rdma_` (and the two `*_to_ibv_rate`); left out: the kernel-command (`ibv_cmd_*`) and
//!   kernel-struct copy (`ibv_copy_*`) helpers, the sysfs readers, the fork-range helpers
//!   (`ibv_dofork_range`, `ibv_dontfork_range`), the old provider registration
//!   (`ibv_register_driver`), librdmacm's `rdma_seterrno`, rsocket (`r*`
//!   without `rdma_`) and every provider's direct-verbs library (`mlx5dv`, ...).
//!
//! A function counts as called when its name is followed by `(` in the code (not the
//! comments) of `rdma-verbs/src` or `rdma-cm/src`; the sys crate's bindings and its Rust
//! versions of the inline verbs do not count. `--check` compares the report with
//! `docs/coverage.md`'s, `--write` rewrites it there.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::process::Command;

/// Where the installed headers and libraries are.
const INCLUDE: &str = "/usr/include";
const LIBS: [&str; 2] = [
    "/usr/lib/x86_64-linux-gnu/libibverbs.so.1",
    "/usr/lib/x86_64-linux-gnu/librdmacm.so.1",
];
const HEADERS: [&str; 3] = ["infiniband/verbs.h", "rdma/rdma_cma.h", "rdma/rdma_verbs.h"];
/// The crates whose calls count.
const CALLERS: [&str; 2] = ["rdma-verbs/src", "rdma-cm/src"];
/// Where the report is recorded, between these two lines.
const DOC: &str = "docs/coverage.md";
const BEGIN: &str = "<!-- cargo xtask coverage --write: from here -->";
const END: &str = "<!-- cargo xtask coverage --write: to here -->";

/// The areas, in report order: a name and whether a function belongs to it. A function goes
/// to the first area that takes it; one no area takes is reported as a problem, so that a new
/// rdma-core cannot add functions nobody sorted.
/// An area: its name and whether a function belongs to it.
type Area = (&'static str, fn(&str) -> bool);

const AREAS: &[Area] = &[
    ("devices, ports, events", |f| {
        f.starts_with("ibv_")
            && [
                "device",
                "query_port",
                "query_gid",
                "pkey",
                "fork",
                "_str",
                "async_event",
                "resolve_eth_l2",
            ]
            .iter()
            .any(|k| f.contains(k))
            || matches!(
                f,
                "ibv_rate_to_mbps" | "ibv_rate_to_mult" | "mbps_to_ibv_rate" | "mult_to_ibv_rate"
            )
    }),
    ("protection domains, address handles", |f| {
        ["_pd", "_ah"].iter().any(|k| f.contains(k)) && f.starts_with("ibv_")
    }),
    ("memory: regions, windows, device memory", |f| {
        f.starts_with("ibv_")
            && !f.starts_with("ibv_wr_")
            && !f.starts_with("ibv_wc_read_")
            && ["_mr", "_mw", "_dm", "rkey"].iter().any(|k| f.contains(k))
    }),
    ("extended CQs, timestamps", |f| {
        [
            "ibv_create_cq_ex",
            "ibv_cq_ex_to_cq",
            "ibv_start_poll",
            "ibv_next_poll",
            "ibv_end_poll",
            "ibv_wc_read_",
            "ibv_query_rt_values_ex",
            "ibv_modify_cq",
        ]
        .iter()
        .any(|k| f.starts_with(k))
    }),
    ("completion queues, channels", |f| {
        f.starts_with("ibv_") && ["_cq", "comp_channel"].iter().any(|k| f.contains(k))
    }),
    ("SRQs, XRC", |f| {
        f.starts_with("ibv_") && ["srq", "xrcd", "ibv_open_qp"].iter().any(|k| f.contains(k))
    }),
    ("thread domains, ECE", |f| {
        f.starts_with("ibv_")
            && ["_td", "parent_domain", "_ece"]
                .iter()
                .any(|k| f.contains(k))
    }),
    ("flow steering, work queues, counters", |f| {
        f.starts_with("ibv_")
            && ["flow", "_wq", "rwq_ind", "counters"]
                .iter()
                .any(|k| f.contains(k))
    }),
    (
        "queue pairs: classic posting, extended posting (ibv_wr_*)",
        |f| {
            f.starts_with("ibv_")
                && ["_qp", "post_", "ibv_wr_", "mcast"]
                    .iter()
                    .any(|k| f.contains(k))
        },
    ),
    ("rdma_cma.h, rdma_verbs.h: the connection manager", |f| {
        f.starts_with("rdma_")
    }),
];

/// One public function: its name, where it comes from, its area and whether a library
/// crate calls it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Function {
    pub(crate) name: String,
    pub(crate) area: &'static str,
    pub(crate) called: bool,
}

/// Runs the task: `coverage` prints the report; `--check` fails if `docs/coverage.md` records
/// another; `--write` records it there.
pub(crate) fn run(root: &Path, args: &[String]) -> Result<(), String> {
    let report = report(&functions(root)?);
    match args {
        [] => {
            print!("{report}");
            Ok(())
        }
        [flag] if flag == "--check" => {
            let recorded =
                recorded(&fs::read_to_string(root.join(DOC)).map_err(|e| format!("{DOC}: {e}"))?)?;
            if recorded == report {
                println!("{DOC} records the coverage of the installed rdma-core");
                Ok(())
            } else {
                Err(format!(
                    "{DOC} does not record the coverage of the installed rdma-core: run \
                     `cargo xtask coverage --write`. The report now:\n{report}"
                ))
            }
        }
        [flag] if flag == "--write" => {
            let path = root.join(DOC);
            let doc = fs::read_to_string(&path).map_err(|e| format!("{DOC}: {e}"))?;
            let (before, rest) = doc
                .split_once(BEGIN)
                .ok_or(format!("{DOC} has no `{BEGIN}` line"))?;
            let (_, after) = rest
                .split_once(END)
                .ok_or(format!("{DOC} has no `{END}` line"))?;
            let text = format!("{before}{BEGIN}\n{report}{END}{after}");
            fs::write(&path, text).map_err(|e| format!("{DOC}: {e}"))?;
            println!("wrote the coverage into {DOC}");
            Ok(())
        }
        _ => Err("usage: cargo xtask coverage [--check | --write]".to_string()),
    }
}

/// The report `docs/coverage.md` holds between its markers.
fn recorded(doc: &str) -> Result<String, String> {
    let (_, rest) = doc
        .split_once(&format!("{BEGIN}\n"))
        .ok_or(format!("{DOC} has no `{BEGIN}` line"))?;
    let (report, _) = rest
        .split_once(END)
        .ok_or(format!("{DOC} has no `{END}` line"))?;
    Ok(report.to_string())
}

/// Every public function of the installed rdma-core, sorted into its area, with whether the
/// library crates call it.
pub(crate) fn functions(root: &Path) -> Result<Vec<Function>, String> {
    let mut names = BTreeSet::new();
    for lib in LIBS {
        let out = Command::new("nm")
            .args(["-D", "--defined-only", lib])
            .output()
            .map_err(|e| format!("nm {lib}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "nm {lib}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        names.extend(exported(&String::from_utf8_lossy(&out.stdout)));
    }
    for header in HEADERS {
        let path = Path::new(INCLUDE).join(header);
        let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        names.extend(static_inline(&text));
    }
    let code = CALLERS
        .iter()
        .map(|dir| rust_code(&root.join(dir)))
        .collect::<Result<Vec<_>, _>>()?
        .concat();
    let called = called_names(&code);
    let mut functions = Vec::new();
    let mut unsorted = Vec::new();
    for name in names.into_iter().filter(|n| is_public(n)) {
        match AREAS.iter().find(|(_, takes)| takes(&name)) {
            Some((area, _)) => functions.push(Function {
                called: called.contains(name.as_str()),
                name,
                area,
            }),
            None => unsorted.push(name),
        }
    }
    if unsorted.is_empty() {
        Ok(functions)
    } else {
        Err(format!(
            "no area of xtask/src/coverage.rs takes {}: add them to one",
            unsorted.join(", ")
        ))
    }
}

/// The function names `nm -D --defined-only` lists as text symbols (`T`), without those of a
/// private symbol version.
fn exported(nm: &str) -> Vec<String> {
    nm.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, kind, symbol) = (fields.next()?, fields.next()?, fields.next()?);
            (kind == "T" && !symbol.contains("PRIVATE"))
                .then(|| symbol.split('@').next().unwrap_or(symbol).to_string())
        })
        .collect()
}

/// The names of a C header's `static inline` functions (comments removed first).
fn static_inline(header: &str) -> Vec<String> {
    let code = strip_c_comments(header);
    let mut names = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("static inline") {
        rest = &rest[at + "static inline".len()..];
        // The declarator runs to the first `(`; the name is the identifier right before it.
        let Some(paren) = rest.find(['(', ';', '{']) else {
            break;
        };
        if !rest[paren..].starts_with('(') {
            continue;
        }
        let head = rest[..paren].trim_end();
        let name: String = head
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if !name.is_empty() {
            names.push(name);
        }
    }
    names
}

fn strip_c_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("/*") {
        out.push_str(&rest[..at]);
        rest = rest[at + 2..]
            .split_once("*/")
            .map_or("", |(_, after)| after);
    }
    out.push_str(rest);
    out.lines()
        .map(|line| line.split("//").next().unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `name` is part of the public API this report counts (see the module's doc).
fn is_public(name: &str) -> bool {
    (name.starts_with("ibv_") || name.starts_with("rdma_") || name.ends_with("_to_ibv_rate"))
        && !name.starts_with("ibv_cmd_")
        && !name.starts_with("ibv_copy_")
        && !name.contains("sysfs")
        && !matches!(
            name,
            "ibv_dofork_range" | "ibv_dontfork_range" | "rdma_seterrno" | "ibv_register_driver"
        )
}

/// The Rust code of every `.rs` file under `dir`, `//` comments removed (doc comments too).
fn rust_code(dir: &Path) -> Result<String, String> {
    let mut code = String::new();
    let entries = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.is_dir() {
            code.push_str(&rust_code(&path)?);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            for line in text.lines() {
                code.push_str(line.split("//").next().unwrap_or(line));
                code.push('\n');
            }
        }
    }
    Ok(code)
}

/// The identifiers `code` calls: each one directly followed by `(` (or by `::<` turbofish).
fn called_names(code: &str) -> BTreeSet<&str> {
    let mut called = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut start = None;
    for (i, &b) in bytes.iter().enumerate() {
        let ident = b.is_ascii_alphanumeric() || b == b'_';
        match (ident, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                if b == b'(' {
                    called.insert(&code[s..i]);
                }
                start = None;
            }
            _ => {}
        }
    }
    called
}

/// The report: per area, `N of M` and the functions not called; then the total.
pub(crate) fn report(functions: &[Function]) -> String {
    let mut by_area: BTreeMap<usize, Vec<&Function>> = BTreeMap::new();
    for f in functions {
        let index = AREAS.iter().position(|(a, _)| *a == f.area).unwrap_or(0);
        by_area.entry(index).or_default().push(f);
    }
    let mut out = String::from("| area | called | not called yet |\n|---|---|---|\n");
    for (index, list) in &by_area {
        let called = list.iter().filter(|f| f.called).count();
        let missing: Vec<String> = list
            .iter()
            .filter(|f| !f.called)
            .map(|f| format!("`{}`", f.name))
            .collect();
        out.push_str(&format!(
            "| {} | {called} of {} | {} |\n",
            AREAS[*index].0,
            list.len(),
            missing.join(", ")
        ));
    }
    let called = functions.iter().filter(|f| f.called).count();
    out.push_str(&format!(
        "\nIn all: **{called} of {}** public functions called.\n",
        functions.len()
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_static_inlines_and_calls_are_read() {
        let nm = "0000000000012340 T ibv_get_device_list@@IBVERBS_1.1\n\
                  0000000000012350 T ibv_cmd_post_send@@IBVERBS_PRIVATE_34\n\
                  0000000000012360 T _ibv_query_gid_ex@@IBVERBS_1.11\n\
                  0000000000000000 A IBVERBS_1.1\n\
                  0000000000012370 W weak_one\n";
        assert_eq!(exported(nm), ["ibv_get_device_list", "_ibv_query_gid_ex"]);
        let header = "/* static inline int ibv_commented(void) */\n\
                      static inline int ibv_post_send(struct ibv_qp *qp,\n\
                          struct ibv_send_wr *wr) { return 0; }\n\
                      static inline struct ibv_cq *\n\
                      ibv_cq_ex_to_cq(struct ibv_cq_ex *cq) { return 0; }\n\
                      static inline void ibv_wr_send(struct ibv_qp_ex *qp)\n{}\n";
        assert_eq!(
            static_inline(header),
            ["ibv_post_send", "ibv_cq_ex_to_cq", "ibv_wr_send"]
        );
        let code = "let r = unsafe { ffi::ibv_post_send(qp, wr, bad) };\n\
                    let x = ffi::ibv_poll_cq;\nfn ibv_reg_mr_like() {}\n";
        let called = called_names(code);
        assert!(called.contains("ibv_post_send"));
        assert!(!called.contains("ibv_poll_cq"), "named, not called");
        assert!(
            called.contains("ibv_reg_mr_like"),
            "a definition is followed by ( too"
        );
        assert!(!is_public("ibv_cmd_post_send") && !is_public("_ibv_query_gid_ex"));
        assert!(!is_public("rsocket") && is_public("rdma_connect"));
    }

    #[test]
    fn every_area_gets_its_functions() {
        let area = |name: &str| AREAS.iter().find(|(_, takes)| takes(name)).map(|(a, _)| *a);
        for (name, want) in [
            ("ibv_query_port", "devices, ports, events"),
            ("ibv_wc_status_str", "devices, ports, events"),
            ("mult_to_ibv_rate", "devices, ports, events"),
            ("ibv_alloc_pd", "protection domains, address handles"),
            (
                "ibv_create_ah_from_wc",
                "protection domains, address handles",
            ),
            (
                "ibv_reg_dmabuf_mr",
                "memory: regions, windows, device memory",
            ),
            ("ibv_bind_mw", "memory: regions, windows, device memory"),
            ("ibv_wc_read_opcode", "extended CQs, timestamps"),
            ("ibv_create_cq_ex", "extended CQs, timestamps"),
            ("ibv_wc_read_invalidated_rkey", "extended CQs, timestamps"),
            ("ibv_poll_cq", "completion queues, channels"),
            ("ibv_create_comp_channel", "completion queues, channels"),
            ("ibv_open_xrcd", "SRQs, XRC"),
            ("ibv_post_srq_recv", "SRQs, XRC"),
            ("ibv_alloc_parent_domain", "thread domains, ECE"),
            ("ibv_set_ece", "thread domains, ECE"),
            ("ibv_create_flow", "flow steering, work queues, counters"),
            ("ibv_post_wq_recv", "flow steering, work queues, counters"),
            (
                "ibv_wr_rdma_write",
                "queue pairs: classic posting, extended posting (ibv_wr_*)",
            ),
            (
                "ibv_modify_qp",
                "queue pairs: classic posting, extended posting (ibv_wr_*)",
            ),
            (
                "rdma_create_ep",
                "rdma_cma.h, rdma_verbs.h: the connection manager",
            ),
        ] {
            assert_eq!(area(name), Some(want), "{name}");
        }
        assert_eq!(
            area("ibv_modify_qp_rate_limit"),
            Some("queue pairs: classic posting, extended posting (ibv_wr_*)")
        );
        assert_eq!(area("ibv_something_new"), None);
    }

    /// `docs/coverage.md` records what the installed rdma-core and the crates give now.
    #[test]
    fn the_recorded_coverage_is_the_installed_rdma_cores() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        run(&root, &["--check".to_string()]).unwrap();
    }
}
