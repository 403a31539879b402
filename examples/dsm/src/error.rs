//! The DSM's error type.

use std::io;

/// What a DSM call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration (flags or environment) is unusable; the text says what and why.
    #[error("configuration: {0}")]
    Config(String),
    /// A call's argument is out of range (an index past a slice, an allocation larger than the
    /// window); the text names it.
    #[error("{0}")]
    InvalidArgument(String),
    /// The nodes called a collective operation (allocation, barrier, gather) with different
    /// arguments or in a different order; detected and reported to every node.
    #[error("unequal collective calls: {0}")]
    UnequalCollective(String),
    /// A node died, closed its connections without saying it was leaving, or did not answer
    /// within the configured bound.
    #[error("node {rank}: {what}")]
    Peer {
        /// The node's rank.
        rank: u16,
        /// What happened.
        what: String,
    },
    /// A message that does not fit the protocol (a wrong length, an unknown operation, a page
    /// number outside the allocations) arrived; the node stops rather than guess.
    #[error("protocol: {0}")]
    Protocol(String),
    /// An operating-system call failed; `what` names it.
    #[error("{what}: {source}")]
    Os {
        /// The call and its object.
        what: String,
        /// The error it returned.
        source: io::Error,
    },
    /// The window would be split into more memory mappings than the kernel lets a process
    /// have (`vm.max_map_count`): with `SIGSEGV` faults each run of pages of one protection is
    /// a mapping. Allocations whose home pages alone would take more than half of what the
    /// process has left are refused up front, on every node; a node whose cached copies would
    /// pass it drops them (changes sent home) instead of failing.
    #[error(
        "{what}: the shared window would take {needed} memory mappings, more than the {allowed} \
         this process has for it under vm.max_map_count = {limit}; place allocations in larger \
         blocks (Placement::Blocked, or Cyclic with more pages per block), use -f userfaultfd, \
         or raise vm.max_map_count"
    )]
    MapLimit {
        /// What needed them.
        what: String,
        /// The mappings it needed.
        needed: usize,
        /// The mappings the window may take.
        allowed: usize,
        /// `vm.max_map_count`.
        limit: usize,
    },
    /// An application's result differs from the single-node computation; the text says where.
    #[error("check failed: {0}")]
    Check(String),
    /// A verbs call failed (the RDMA transports).
    #[error(transparent)]
    Verbs(#[from] rdma_verbs::Error),
}

impl Error {
    /// An [`Error::Os`] from the last OS error, naming `what`.
    #[cold]
    pub(crate) fn last_os(what: impl Into<String>) -> Self {
        Error::Os {
            what: what.into(),
            source: io::Error::last_os_error(),
        }
    }

    /// An [`Error::Os`] from `source`, naming `what`.
    #[cold]
    pub(crate) fn os(what: impl Into<String>, source: io::Error) -> Self {
        Error::Os {
            what: what.into(),
            source,
        }
    }

    /// An [`Error::Protocol`].
    #[cold]
    pub(crate) fn protocol(what: impl Into<String>) -> Self {
        Error::Protocol(what.into())
    }

    /// An [`Error::Peer`].
    #[cold]
    pub(crate) fn peer(rank: u16, what: impl Into<String>) -> Self {
        Error::Peer {
            rank,
            what: what.into(),
        }
    }
}

/// `Result` with the DSM's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
