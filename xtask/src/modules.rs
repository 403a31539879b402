//! `cargo xtask modules`: the module graph of a crate (which top-level module names which), and
//! the check that it has no cycle: every edge points down the layers `docs/modules.md` lists.
//!
//! An edge is a `crate::<module>` path outside comments, in `use` lists too
//! (`use crate::{a::X, b}`); a module's submodules count as the module. Impl blocks for another
//! module's type count where they are written, which is the point: an `impl QueuePair` in
//! `mw.rs` makes `mw` depend on `qp`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Top-level module → the modules it names, with one file that names each.
pub(crate) type Graph = BTreeMap<String, BTreeMap<String, String>>;

/// Runs the task: prints the graph of `rdma-verbs` and fails on a cycle.
pub(crate) fn run(root: &Path) -> Result<(), String> {
    let src = root.join("rdma-verbs/src");
    let graph = graph_of(&src)?;
    for (module, deps) in &graph {
        let names: Vec<&str> = deps.keys().map(String::as_str).collect();
        println!("{module} -> {}", names.join(", "));
    }
    match cycle(&graph) {
        None => {
            println!("no cycles ({} modules)", graph.len());
            Ok(())
        }
        Some(cycle) => Err(describe(&graph, &cycle)),
    }
}

/// The graph of the crate whose sources are in `src` (`lib.rs` and the modules beside it).
pub(crate) fn graph_of(src: &Path) -> Result<Graph, String> {
    let mut files = Vec::new();
    collect(src, src, &mut files)?;
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|(module, _, _)| module.clone())
        .collect();
    let mut graph = Graph::new();
    for module in &modules {
        graph.entry(module.clone()).or_default();
    }
    for (module, path, text) in &files {
        let Some(module) = module else { continue };
        for named in named_modules(text) {
            if &named != module && modules.contains(&named) {
                graph
                    .entry(module.clone())
                    .or_default()
                    .entry(named)
                    .or_insert_with(|| path.clone());
            }
        }
    }
    Ok(graph)
}

/// Every `.rs` file under `dir`, with its top-level module (`None` for `lib.rs`), its path
/// relative to `src`, and its text.
fn collect(
    src: &Path,
    dir: &Path,
    out: &mut Vec<(Option<String>, String, String)>,
) -> Result<(), String> {
    let entries = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.is_dir() {
            collect(src, &path, out)?;
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let relative = path.strip_prefix(src).unwrap_or(&path);
        let first = relative
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .unwrap_or_default();
        let module = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
        let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let module = (module != "lib").then_some(module);
        out.push((module, relative.display().to_string(), text));
    }
    Ok(())
}

/// The modules `text` names through `crate::`, outside `//` comments.
fn named_modules(text: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut named = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            // `crate::{a::X, b, c::{Y, Z}}`: the first segment of each top-level item.
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in list.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        rest = &list[i..];
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphanumeric() || c == '_') => {
                        named.insert(identifier(&list[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            named.insert(identifier(rest));
        }
    }
    named
}

fn identifier(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// A cycle of the graph, if it has one: the modules in order, the first repeated at the end.
pub(crate) fn cycle(graph: &Graph) -> Option<Vec<String>> {
    // Depth-first search; a back edge to a module on the current path closes a cycle.
    fn visit(
        graph: &Graph,
        module: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut cycle = path[at..].to_vec();
            cycle.push(module.to_owned());
            return Some(cycle);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_owned());
        for next in graph.get(module).into_iter().flat_map(BTreeMap::keys) {
            if let Some(cycle) = visit(graph, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(module.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|module| visit(graph, module, &mut Vec::new(), &mut done))
}

/// One line per edge of `cycle`, naming a file that makes it.
fn describe(graph: &Graph, cycle: &[String]) -> String {
    let edges: Vec<String> = cycle
        .windows(2)
        .map(|pair| {
            let file = &graph[&pair[0]][&pair[1]];
            format!("  {} -> {} (in {file})", pair[0], pair[1])
        })
        .collect();
    format!(
        "module cycle {} (see docs/modules.md):\n{}",
        cycle.join(" -> "),
        edges.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_lists_and_paths_are_read_and_comments_are_not() {
        let text = "use crate::error::{Error, Result};\n\
                    use crate::{ah::AddressHandle, buf, qp::{Rc, Rts}};\n\
                    // crate::scope is only mentioned\n\
                    fn f() { crate::wr::post_result(); }\n";
        let named: Vec<String> = named_modules(text).into_iter().collect();
        assert_eq!(named, ["ah", "buf", "error", "qp", "wr"]);
    }

    #[test]
    fn a_cycle_is_found_and_named() {
        let mut graph = Graph::new();
        for (from, to) in [("qp", "wr"), ("wr", "ah"), ("ah", "qp"), ("ah", "pd")] {
            graph
                .entry(from.into())
                .or_default()
                .insert(to.into(), format!("{from}.rs"));
        }
        graph.entry("pd".into()).or_default();
        let found = cycle(&graph).expect("the cycle");
        assert_eq!(found, ["ah", "qp", "wr", "ah"]);
        let text = describe(&graph, &found);
        assert!(text.contains("ah -> qp (in ah.rs)"), "{text}");
        graph.get_mut("ah").unwrap().remove("qp");
        assert_eq!(cycle(&graph), None);
    }

    /// The crate's own graph: no cycles (the rule of `docs/modules.md`).
    #[test]
    fn rdma_verbs_has_no_module_cycles() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rdma-verbs/src");
        let graph = graph_of(&src).unwrap();
        assert!(graph.len() >= 15, "modules found: {:?}", graph.keys());
        assert!(graph["qp"].contains_key("cq"), "edges are read: {graph:?}");
        if let Some(found) = cycle(&graph) {
            panic!("{}", describe(&graph, &found));
        }
    }
}
