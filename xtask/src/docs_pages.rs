//! Checks of the documentation pages against the code they show.

use std::path::Path;

/// The code of the one block of `page` whose fence line is `fence` (every fence closed).
fn shown_block(page: &str, fence: &str) -> String {
    // The page's code blocks: fences are lines that start with three backquotes.
    let fences: Vec<(usize, &str)> = page
        .lines()
        .enumerate()
        .filter(|(_, line)| line.starts_with("```"))
        .collect();
    assert!(fences.len() % 2 == 0, "an unclosed code block: {fences:?}");
    let blocks: Vec<usize> = fences
        .chunks(2)
        .filter(|pair| pair[0].1 == fence)
        .map(|pair| pair[0].0)
        .collect();
    assert_eq!(blocks.len(), 1, "one {fence} block: {fences:?}");
    page.lines()
        .skip(blocks[0] + 1)
        .take_while(|line| !line.starts_with("```"))
        .map(|line| format!("{line}\n"))
        .collect()
}

/// Asserts that `page` (relative to the workspace) shows `program` whole in its one `fence`
/// block.
fn assert_shows(page: &str, fence: &str, program: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join(page)).expect("the page");
    let code = std::fs::read_to_string(root.join(program)).expect("the example");
    assert!(
        shown_block(&text, fence) == code,
        "{page} must show {program} verbatim in its {fence} block"
    );
}

/// `docs/start-here.md` shows `examples/src/bin/start_here.rs` whole, in one `rust` block:
/// the program on the page is the one the device suite runs
/// (`start_here_sends_and_echoes_every_message`), so the two cannot drift apart.
#[test]
fn the_start_here_page_shows_the_example_it_runs() {
    assert_shows(
        "docs/start-here.md",
        "```rust",
        "examples/src/bin/start_here.rs",
    );
}

/// `rdma-cm`'s README shows `examples/src/bin/cm_start_here.rs` whole, in its one
/// `rust,no_run` block (compiled with the crate's doc tests): the device suite runs it
/// (`cm_start_here_sends_a_message`).
#[test]
fn the_rdma_cm_readme_shows_the_example_it_runs() {
    assert_shows(
        "rdma-cm/README.md",
        "```rust,no_run",
        "examples/src/bin/cm_start_here.rs",
    );
}
