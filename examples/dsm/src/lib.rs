//! A page-based software distributed shared memory over RDMA (and TCP), the workspace's
//! flagship example: the same program runs as N processes; they allocate shared arrays
//! collectively; touching a page with no valid copy faults, and the page comes from its home
//! node. Home-based release consistency with twins and diffs, for data-race-free programs;
//! the design, the protocol and the safety argument are in `docs/dsm.md` and this package's
//! README.
//!
//! ```no_run
//! use dsm::{Node, Placement};
//!
//! fn main() -> dsm::Result<()> {
//!     let node = Node::from_env()?; // started by `dsm run -n 2 ...`, srun or mpirun
//!     let counter = node.alloc::<u64>(1, Placement::Home(0))?;
//!     for _ in 0..100 {
//!         let guard = node.lock(0)?;
//!         counter.set(0, counter.get(0)? + 1)?;
//!         guard.unlock()?;
//!     }
//!     node.barrier()?;
//!     assert_eq!(counter.get(0)?, 100 * u64::from(node.nodes()));
//!     node.finalize()?; // the slice's borrow of the node ended with its last use

//!     Ok(())
//! }
//! ```

#![deny(missing_docs)]

/// Prints one line on standard error with a single `write` (several nodes share the terminal
/// or the pipe, and `eprintln!` may split a line into several writes that interleave).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = std::io::stderr().write_all(line.as_bytes());
    }};
}

pub mod apps;
mod client;
mod error;
mod fault;
#[doc(hidden)]
pub mod fuzz;
mod global;
mod home;
pub mod launch;
mod node;
mod prefetch;
mod rdma;
mod region;
mod rendezvous;
mod shared;
mod stats;
mod tcp;
mod transport;
mod userfault;
mod wire;

pub use error::{Error, Result};
pub use global::{GlobalSlice, Placement};
pub use launch::{Config, FaultMechanism, Launch, TransportKind};
pub use node::{LockGuard, Node};
pub use region::PAGE;
pub use stats::{Report, Stats};
