//! Checks of the documentation pages against the code they show.

use std::path::Path;

/// `docs/start-here.md` shows `examples/src/bin/start_here.rs` whole, in one `rust` block:
/// the program on the page is the one the device suite runs
/// (`start_here_sends_and_echoes_every_message`), so the two cannot drift apart.
#[test]
fn the_start_here_page_shows_the_example_it_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let page = std::fs::read_to_string(root.join("docs/start-here.md")).expect("the page");
    let program =
        std::fs::read_to_string(root.join("examples/src/bin/start_here.rs")).expect("the example");
    // The page's code blocks: fences are lines that start with three backquotes.
    let fences: Vec<(usize, &str)> = page
        .lines()
        .enumerate()
        .filter(|(_, line)| line.starts_with("```"))
        .collect();
    assert!(fences.len() % 2 == 0, "an unclosed code block: {fences:?}");
    let rust: Vec<usize> = fences
        .chunks(2)
        .filter(|pair| pair[0].1 == "```rust")
        .map(|pair| pair[0].0)
        .collect();
    assert_eq!(rust.len(), 1, "one rust block: {fences:?}");
    let shown: String = page
        .lines()
        .skip(rust[0] + 1)
        .take_while(|line| !line.starts_with("```"))
        .map(|line| format!("{line}\n"))
        .collect();
    assert!(
        shown == program,
        "docs/start-here.md must show examples/src/bin/start_here.rs verbatim in its rust block"
    );
}
