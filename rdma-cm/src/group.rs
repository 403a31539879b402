//! The multicast groups an identifier joined: the identifier's table of them, which its events
//! count and its destroy leaves (the joins themselves are in `multicast`).

use std::net::{IpAddr, SocketAddr};

use rdma_verbs_sys as ffi;

use crate::addr;

/// One group an identifier joined.
#[derive(Debug)]
struct Group {
    /// What librdmacm hands back as the context of the group's events.
    token: usize,
    addr: SocketAddr,
    /// Events about the group read and not acknowledged yet: `rdma_leave_multicast` waits
    /// until they are.
    held: usize,
}

/// The multicast groups of an identifier (locked after its channel, never before).
#[derive(Debug, Default)]
pub(crate) struct Groups {
    last_token: usize,
    list: Vec<Group>,
}

impl Groups {
    /// The context a new join hands librdmacm (never 0, never one in use while joins last).
    pub(crate) fn next_token(&self) -> usize {
        self.last_token.wrapping_add(1).max(1)
    }

    /// Records that the join of `addr` with `token` succeeded.
    pub(crate) fn add(&mut self, token: usize, addr: SocketAddr) {
        self.last_token = token;
        self.list.push(Group {
            token,
            addr,
            held: 0,
        });
    }

    /// How many events about group `addr` are held; `None` if it was not joined.
    pub(crate) fn held(&self, addr: SocketAddr) -> Option<usize> {
        self.list.iter().find(|g| g.addr == addr).map(|g| g.held)
    }

    /// Forgets group `addr` (it is being left).
    pub(crate) fn remove(&mut self, addr: SocketAddr) {
        self.list.retain(|g| g.addr != addr);
    }

    /// The groups' addresses, oldest join first.
    pub(crate) fn addrs(&self) -> Vec<IpAddr> {
        self.list.iter().map(|g| g.addr.ip()).collect()
    }

    /// Counts an event about the group of `token` as held; its address.
    pub(crate) fn event_read(&mut self, token: usize) -> Option<IpAddr> {
        let group = self.list.iter_mut().find(|g| g.token == token)?;
        group.held += 1;
        Some(group.addr.ip())
    }

    /// An event about the group of `token` was acknowledged.
    pub(crate) fn event_done(&mut self, token: usize) {
        if let Some(group) = self.list.iter_mut().find(|g| g.token == token) {
            group.held = group.held.saturating_sub(1);
        }
    }

    /// Leaves every group (errors ignored: the identifier is being destroyed, and librdmacm
    /// frees its record of a group whatever the kernel answers).
    ///
    /// # Safety
    ///
    /// `raw` is the live identifier these groups belong to, its channel's lock is held, and no
    /// event about a group is held (else the leave would wait for it).
    pub(crate) unsafe fn leave_all(&mut self, raw: *mut ffi::rdma_cm_id) {
        for group in self.list.drain(..) {
            let mut storage = addr::to_storage(group.addr);
            // SAFETY: the caller's contract; the address is read during the call.
            unsafe { ffi::rdma_leave_multicast(raw, (&raw mut storage).cast()) };
        }
    }
}
