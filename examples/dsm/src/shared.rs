//! What a node's threads share: its configuration, its window and the allocations' layout.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64};

use crate::launch::Config;
use crate::region::Region;

/// Which node is the home of each allocated page (its length is the allocated page count).
#[derive(Debug, Default)]
pub(crate) struct Layout {
    pub(crate) home: Vec<u16>,
}

/// What the node's threads share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) rank: u16,
    pub(crate) size: u16,
    pub(crate) config: Config,
    pub(crate) region: Region,
    pub(crate) layout: RwLock<Layout>,
    pub(crate) pages_served: AtomicU64,
    pub(crate) diffs_applied: AtomicU64,
    pub(crate) stopping: AtomicBool,
    /// An operation failed part-way and the page table may no longer match the window's
    /// protections: every access through the API is refused from then on.
    pub(crate) poisoned: AtomicBool,
    /// Every other node said it leaves, or died: set by the server, read by a node that stays
    /// to serve the others' failure replies before it leaves.
    pub(crate) others_gone: AtomicBool,
}

impl Shared {
    /// The home of window page `page`, if it is allocated.
    pub(crate) fn home_of(&self, page: usize) -> Option<u16> {
        let layout = self.layout.read().unwrap_or_else(|p| p.into_inner());
        layout.home.get(page).copied()
    }
}
