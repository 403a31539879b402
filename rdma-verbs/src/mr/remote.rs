//! [`RemoteMemory`]: a peer's memory as it advertises it (address, length, rkey).

use crate::error::{Error, Result};

/// Remote memory: an address, a length and the rkey that grants access, as a peer advertises it
/// for RDMA reads, writes and atomics.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[must_use = "remote memory does nothing until a request names it"]
pub struct RemoteMemory {
    /// Start address in the peer's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// The peer's remote key.
    pub rkey: u32,
}

impl RemoteMemory {
    /// The part of this memory starting `offset` bytes in, `len` bytes long.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if it does not fit, or if its address would pass the end of
    /// the 64-bit address space (the fields come from a peer and are not trusted).
    pub fn slice(&self, offset: u32, len: u32) -> Result<Self> {
        let addr = self.addr.checked_add(u64::from(offset));
        match (offset.checked_add(len), addr) {
            (Some(end), Some(addr)) if end <= self.len => Ok(Self {
                addr,
                len,
                rkey: self.rkey,
            }),
            _ => Err(Error::InvalidArgument(format!(
                "bytes {offset}..+{len} are outside the {}-byte remote memory at {:#x}",
                self.len, self.addr
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_memory_slice_never_overflows() {
        let remote = RemoteMemory {
            addr: u64::MAX - 4,
            len: u32::MAX,
            rkey: 7,
        };
        // addr + offset passes the end of the address space: an error, not a panic or a wrap.
        assert!(matches!(remote.slice(5, 1), Err(Error::InvalidArgument(_))));
        assert!(matches!(
            remote.slice(u32::MAX, 1),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(
            remote.slice(4, 0).unwrap(),
            RemoteMemory {
                addr: u64::MAX,
                len: 0,
                rkey: 7
            }
        );
        let ok = RemoteMemory {
            addr: 0x1000,
            len: 64,
            rkey: 1,
        };
        assert_eq!(ok.slice(8, 56).unwrap().addr, 0x1008);
        assert!(matches!(ok.slice(8, 57), Err(Error::InvalidArgument(_))));
    }
}
