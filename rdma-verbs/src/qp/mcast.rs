//! Multicast groups (`ibv_attach_mcast`, `ibv_detach_mcast`): a UD queue pair attached to a
//! group receives the datagrams sent to it.

use super::{QpState, QueuePair, Ud};
use crate::device::Gid;
use crate::error::{Error, Result};
use crate::ffi;

impl<S: QpState> QueuePair<Ud, S> {
    /// `ibv_attach_mcast`: from now on this queue pair also receives the datagrams sent to
    /// multicast group `gid` (multicast LID `lid`; 0 on RoCE). Senders address a group with
    /// its GID as the destination GID and queue pair number `0xFFFFFF`
    /// ([`MULTICAST_QPN`](Self::MULTICAST_QPN)); the receiver's Q_Key must match theirs.
    ///
    /// Group membership of the fabric (joining through the subnet administrator on InfiniBand,
    /// IGMP on RoCE) is not done here: the connection manager's `rdma_join_multicast` does it
    /// and reports the group's GID and LID. The queue pair remembers its groups and is
    /// detached from each before it is destroyed (the kernel refuses to destroy a queue pair
    /// that is still attached). Attaching to a group it is attached to already does nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_attach_mcast` (`EINVAL` for a GID that is not a
    /// multicast one, `ENOMEM` past the device's `max_mcast_grp` or `max_mcast_qp_attach`);
    /// [`Error::Unsupported`] if the provider has no multicast.
    ///
    /// # References
    ///
    /// [`ibv_attach_mcast(3)`](https://man7.org/linux/man-pages/man3/ibv_attach_mcast.3.html)
    #[doc(alias = "ibv_attach_mcast")]
    pub fn attach_mcast(&mut self, gid: Gid, lid: u16) -> Result<()> {
        let raw = gid.to_raw();
        // SAFETY: a live queue pair; the GID is read during the call.
        Error::check("ibv_attach_mcast", unsafe {
            ffi::ibv_attach_mcast(self.as_raw(), &raw, lid)
        })?;
        if !self.inner.mcast.contains(&(gid, lid)) {
            self.inner.mcast.push((gid, lid));
        }
        Ok(())
    }

    /// `ibv_detach_mcast`: stops delivering group `gid`'s datagrams to this queue pair.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_detach_mcast` (`EINVAL` or `ENOENT` when the
    /// queue pair is not attached to the group).
    ///
    /// # References
    ///
    /// [`ibv_detach_mcast(3)`](https://man7.org/linux/man-pages/man3/ibv_detach_mcast.3.html)
    #[doc(alias = "ibv_detach_mcast")]
    pub fn detach_mcast(&mut self, gid: Gid, lid: u16) -> Result<()> {
        let raw = gid.to_raw();
        // SAFETY: a live queue pair; the GID is read during the call.
        Error::check("ibv_detach_mcast", unsafe {
            ffi::ibv_detach_mcast(self.as_raw(), &raw, lid)
        })?;
        self.inner.mcast.retain(|&group| group != (gid, lid));
        Ok(())
    }

    /// The multicast groups (GID, LID) this queue pair is attached to.
    pub fn mcast_groups(&self) -> &[(Gid, u16)] {
        &self.inner.mcast
    }

    /// The destination queue pair number of a datagram to a multicast group.
    pub const MULTICAST_QPN: u32 = 0x00FF_FFFF;
}
