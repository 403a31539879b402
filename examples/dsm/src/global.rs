//! Shared arrays: where their pages live ([`Placement`]) and how they are read and written
//! ([`GlobalSlice`]).

use std::marker::PhantomData;

use rdma_verbs::shared::{copy_from_shared, copy_to_shared};

use crate::error::{Error, Result};
use crate::node::Node;
use crate::region::PAGE;

/// Which node is the home of each page of an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Every page on one node.
    Home(u16),
    /// The pages split into `nodes` contiguous parts of near-equal size, node 0's first
    /// (rows of a matrix spread over the nodes).
    Blocked,
    /// Blocks of `pages` pages dealt to the nodes in turn (block-cyclic).
    Cyclic {
        /// Pages per block, at least 1.
        pages: usize,
    },
    /// One page per node in turn: `Cyclic { pages: 1 }`.
    Interleaved,
}

impl Placement {
    pub(crate) fn check(self, nodes: u16) -> Result<()> {
        match self {
            Placement::Home(h) if h >= nodes => Err(Error::InvalidArgument(format!(
                "home node {h} of {nodes} nodes"
            ))),
            Placement::Cyclic { pages: 0 } => Err(Error::InvalidArgument(
                "a block-cyclic placement of 0 pages per block".into(),
            )),
            _ => Ok(()),
        }
    }

    /// The home of page `i` of an allocation of `pages` pages (checked placement).
    pub(crate) fn home(self, i: usize, pages: usize, nodes: u16) -> u16 {
        let n = usize::from(nodes);
        match self {
            Placement::Home(h) => h,
            Placement::Blocked => ((i * n) / pages.max(1)) as u16,
            Placement::Cyclic { pages: b } => ((i / b.max(1)) % n) as u16,
            Placement::Interleaved => (i % n) as u16,
        }
    }
}

/// A shared array of `T` (collectively allocated by [`Node::alloc`]).
///
/// Elements are copied in and out ([`get`](Self::get), [`set`](Self::set),
/// [`read`](Self::read), [`write`](Self::write)); no Rust reference into shared memory is
/// handed out. A reference would promise that the bytes do not change while it lives, and on
/// a home page other nodes' diffs land at any time. The copies are relaxed atomic accesses, so
/// even a program with a data race (two nodes writing one element between the same
/// synchronisations) gets unspecified values, never undefined behaviour; `T: Pod` makes every
/// byte pattern a valid value. A copy touching a page that is not valid here faults, and the
/// page is fetched from its home before the copy goes on.
///
/// What a read returns is defined for programs without data races: a value written by
/// another node is visible after a [`Node::barrier`] or [`Node::lock`] that follows the
/// writer's release (its barrier or unlock).
#[derive(Debug)]
#[must_use = "a shared array is reached only through its slice"]
pub struct GlobalSlice<'n, T> {
    node: &'n Node,
    base: *mut T,
    len: usize,
    first_page: usize,
    _type: PhantomData<T>,
}

impl<'n, T: bytemuck::Pod> GlobalSlice<'n, T> {
    pub(crate) fn new(node: &'n Node, base: *mut T, len: usize, first_page: usize) -> Self {
        GlobalSlice {
            node,
            base,
            len,
            first_page,
            _type: PhantomData,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn range(&self, start: usize, count: usize) -> Result<*mut u8> {
        if self.node.poisoned() {
            return Err(Error::Config(
                "the node is unusable after an earlier failure".into(),
            ));
        }
        if start.checked_add(count).is_none_or(|end| end > self.len) {
            return Err(Error::InvalidArgument(format!(
                "elements {start}..+{count} of a shared array of {}",
                self.len
            )));
        }
        Ok(self.base.wrapping_add(start).cast())
    }

    /// Element `i`.
    pub fn get(&self, i: usize) -> Result<T> {
        let at = self.range(i, 1)?;
        let mut value = T::zeroed();
        // SAFETY: element `i` lies inside the allocation, inside the window, which lives as
        // long as the node this slice borrows; window memory is accessed only with atomic
        // copies and by the runtime (region.rs), and a fault on it is served by the node.
        unsafe { copy_from_shared(at, bytemuck::bytes_of_mut(&mut value)) };
        Ok(value)
    }

    /// Sets element `i` to `value`.
    pub fn set(&self, i: usize, value: T) -> Result<()> {
        let at = self.range(i, 1)?;
        // SAFETY: as in `get`.
        unsafe { copy_to_shared(bytemuck::bytes_of(&value), at) };
        Ok(())
    }

    /// Copies elements `start..start + out.len()` into `out`.
    pub fn read(&self, start: usize, out: &mut [T]) -> Result<()> {
        let at = self.range(start, out.len())?;
        // SAFETY: as in `get`, for the whole range.
        unsafe { copy_from_shared(at, bytemuck::cast_slice_mut(out)) };
        Ok(())
    }

    /// Copies `data` into elements `start..start + data.len()`.
    pub fn write(&self, start: usize, data: &[T]) -> Result<()> {
        let at = self.range(start, data.len())?;
        // SAFETY: as in `get`, for the whole range.
        unsafe { copy_to_shared(bytemuck::cast_slice(data), at) };
        Ok(())
    }

    /// The home node of element `i`'s first byte.
    pub fn home_of(&self, i: usize) -> Result<u16> {
        self.range(i, 1)?;
        let page = self.first_page + i * std::mem::size_of::<T>() / PAGE;
        self.node
            .home_of_page(page)
            .ok_or_else(|| Error::InvalidArgument(format!("element {i} is not allocated")))
    }

    /// The window address of element `i` (for tests that look at the fault path itself).
    pub fn addr_of(&self, i: usize) -> Result<usize> {
        Ok(self.range(i, 1)? as usize)
    }
}
