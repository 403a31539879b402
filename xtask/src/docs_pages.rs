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
    let block = format!("```rust\n{program}```\n");
    assert_eq!(
        page.matches(&block).count(),
        1,
        "docs/start-here.md must hold examples/src/bin/start_here.rs verbatim in one block"
    );
}
