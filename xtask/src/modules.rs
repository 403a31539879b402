//! `cargo xtask modules`: the module graph of each library crate (which top-level module names
//! which), checked against the layers `docs/modules.md` declares for that crate: every module
//! sits in exactly one layer, every edge points to the same layer or one below, and there is no
//! cycle.
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

/// The library crates whose modules `docs/modules.md` lays out.
pub(crate) const CRATES: [&str; 3] = ["rdma-verbs-sys", "rdma-verbs", "rdma-cm"];

/// Runs the task: prints each crate's graph and fails if one breaks its declared layers.
pub(crate) fn run(root: &Path) -> Result<(), String> {
    let doc = fs::read_to_string(root.join("docs/modules.md"))
        .map_err(|e| format!("docs/modules.md: {e}"))?;
    let mut problems = Vec::new();
    for krate in CRATES {
        let graph = graph_of(&root.join(krate).join("src"))?;
        println!("{krate}:");
        for (module, deps) in &graph {
            let names: Vec<&str> = deps.keys().map(String::as_str).collect();
            println!("  {module} -> {}", names.join(", "));
        }
        let found = check(krate, &graph, &doc);
        if found.is_empty() {
            println!(
                "  follows its {} layers ({} modules, no cycle)",
                layers(&doc, krate).map_or(0, |l| l.len()),
                graph.len()
            );
        }
        problems.extend(found);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the module layers of docs/modules.md do not hold:\n{}",
            problems.join("\n")
        ))
    }
}

/// The layers `doc` (the text of `docs/modules.md`) declares for `krate`, lowest first: the
/// rows of the first table after the heading that names `` `krate` ``, each the modules
/// written in backticks in its second column (a parenthesised list after a module names its
/// files, not modules). `None` when there is no such heading.
pub(crate) fn layers(doc: &str, krate: &str) -> Option<Vec<(String, Vec<String>)>> {
    let heading = format!("`{krate}`");
    let mut lines = doc
        .lines()
        .skip_while(|l| !(l.starts_with("## ") && l.contains(&heading)));
    lines.next()?;
    let rows = lines
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        // The header row and the separator row.
        .skip(2);
    let mut layers = Vec::new();
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (Some(name), Some(modules)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        layers.push((name.to_string(), backticked_outside_parentheses(modules)));
    }
    Some(layers)
}

/// The `` `names` `` of `text` that are not inside parentheses.
fn backticked_outside_parentheses(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            '`' => {
                let Some(end) = rest[1..].find('`') else {
                    break;
                };
                if depth == 0 {
                    names.push(rest[1..=end].to_string());
                }
                rest = &rest[end + 2..];
                continue;
            }
            _ => {}
        }
        rest = &rest[c.len_utf8()..];
    }
    names
}

/// What breaks `krate`'s declared layers in `graph` (empty when they hold): a module in no
/// layer or in two, a declared module that does not exist, an edge to a higher layer, a cycle.
pub(crate) fn check(krate: &str, graph: &Graph, doc: &str) -> Vec<String> {
    let Some(layers) = layers(doc, krate) else {
        return vec![format!(
            "{krate}: docs/modules.md has no `## ... `{krate}`` section"
        )];
    };
    let mut problems = Vec::new();
    let mut layer_of: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, (name, modules)) in layers.iter().enumerate() {
        for module in modules {
            if !graph.contains_key(module) {
                problems.push(format!(
                    "{krate}: layer {name} lists `{module}`, which is no module of the crate"
                ));
            }
            if layer_of.insert(module, index).is_some() {
                problems.push(format!("{krate}: `{module}` is listed in two layers"));
            }
        }
    }
    for module in graph.keys() {
        if !layer_of.contains_key(module.as_str()) {
            problems.push(format!(
                "{krate}: `{module}` is in no layer of docs/modules.md (add it to the table)"
            ));
        }
    }
    for (module, deps) in graph {
        let Some(&from) = layer_of.get(module.as_str()) else {
            continue;
        };
        for (named, file) in deps {
            let to = layer_of.get(named.as_str()).copied().unwrap_or(from);
            if to > from {
                problems.push(format!(
                    "{krate}: `{module}` ({}) names `{named}` ({}, a layer above it) in {file}",
                    layers[from].0, layers[to].0
                ));
            }
        }
    }
    if let Some(found) = cycle(graph) {
        problems.push(format!("{krate}: {}", describe(graph, &found)));
    }
    problems
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

    #[test]
    fn layers_are_read_from_the_table_after_the_crates_heading() {
        let doc = "# Modules\n\n## `other`\n\n| Layer | Modules | What |\n|---|---|---|\n\
                   | x | `zz` | z |\n\n## `demo`\n\ntext\n\n| Layer | Modules | What |\n\
                   |---|---|---|\n| values | `error`, `flags` | e |\n\
                   | queues | `qp` (`mod`, `attr`), `cq` | q |\n\nafter\n";
        let declared = layers(doc, "demo").expect("the section");
        assert_eq!(
            declared,
            [
                (
                    "values".to_string(),
                    vec!["error".to_string(), "flags".to_string()]
                ),
                (
                    "queues".to_string(),
                    vec!["qp".to_string(), "cq".to_string()]
                ),
            ]
        );
        assert_eq!(layers(doc, "missing"), None);
        let mut graph = Graph::new();
        for (from, to) in [
            ("qp", "cq"),
            ("cq", "error"),
            ("error", "qp"),
            ("flags", "extra"),
        ] {
            graph
                .entry(from.into())
                .or_default()
                .insert(to.into(), format!("{from}.rs"));
        }
        graph.entry("extra".into()).or_default();
        let problems = check("demo", &graph, doc);
        assert_eq!(
            problems[..2],
            [
                "demo: `extra` is in no layer of docs/modules.md (add it to the table)".to_string(),
                "demo: `error` (values) names `qp` (queues, a layer above it) in error.rs"
                    .to_string(),
            ]
        );
        assert!(
            problems[2].starts_with("demo: module cycle "),
            "{problems:?}"
        );
        assert_eq!(problems.len(), 3, "{problems:?}");
    }

    /// Each library crate's own graph follows the layers `docs/modules.md` declares for it.
    #[test]
    fn library_crates_follow_their_declared_layers() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let doc = fs::read_to_string(root.join("docs/modules.md")).unwrap();
        for krate in CRATES {
            let graph = graph_of(&root.join(krate).join("src")).unwrap();
            assert!(
                graph.len() >= 2,
                "{krate}: modules found: {:?}",
                graph.keys()
            );
            let problems = check(krate, &graph, &doc);
            assert!(problems.is_empty(), "{}", problems.join("\n"));
        }
        let verbs = graph_of(&root.join("rdma-verbs/src")).unwrap();
        assert!(verbs["qp"].contains_key("cq"), "edges are read: {verbs:?}");
    }
}
