//! How fast and in what order a queue pair's data goes: its rate limit
//! (`ibv_modify_qp_rate_limit`) and whether the device places a message's data in order
//! (`ibv_query_qp_data_in_order`).

use super::{QpState, QueuePair, Transport};
use crate::c_enum::SendOpcode;
use crate::error::{Error, Result};
use crate::ffi;

/// A send queue's rate limit (`struct ibv_qp_rate_limit_attr`), for
/// [`set_rate_limit`](QueuePair::set_rate_limit).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimit {
    /// The rate, kilobits per second; 0 removes the limit.
    pub kbps: u32,
    /// The largest burst, bytes; 0 for the device's default.
    pub max_burst: u32,
    /// The typical packet size, bytes; 0 for the device's default.
    pub typical_packet: u16,
}

impl RateLimit {
    /// A limit of `kbps` kilobits per second, with the device's burst and packet defaults.
    pub fn kbps(kbps: u32) -> Self {
        Self {
            kbps,
            max_burst: 0,
            typical_packet: 0,
        }
    }
}

impl<T: Transport, S: QpState> QueuePair<T, S> {
    /// `ibv_modify_qp_rate_limit`: limits the rate the send queue injects at (packet pacing;
    /// for raw packet and UD queue pairs on devices that pace, in INIT or later).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where the provider cannot pace (Soft-RoCE); else
    /// [`Error::Verb`] with the call's errno (`EINVAL` for a rate outside the device's range).
    ///
    /// # References
    ///
    /// [`ibv_modify_qp_rate_limit(3)`](https://man7.org/linux/man-pages/man3/ibv_modify_qp_rate_limit.3.html)
    #[doc(alias = "ibv_modify_qp_rate_limit")]
    pub fn set_rate_limit(&mut self, limit: RateLimit) -> Result<()> {
        let mut raw = ffi::ibv_qp_rate_limit_attr {
            rate_limit: limit.kbps,
            max_burst_sz: limit.max_burst,
            typical_pkt_sz: limit.typical_packet,
            comp_mask: 0,
        };
        // SAFETY: live queue pair; `raw` is a valid structure the call reads.
        let ret = unsafe { ffi::ibv_modify_qp_rate_limit(self.as_raw(), &mut raw) };
        Error::check("ibv_modify_qp_rate_limit", ret)
    }

    /// `ibv_query_qp_data_in_order`: whether the device writes the data of an `op` request
    /// into the receiver's memory in order, so that a receiver polling the last byte of a
    /// message has the bytes before it. `false` where the device does not promise it (the
    /// portable assumption; Soft-RoCE's provider does not say, so `false`; mlx5 answers only
    /// for a queue pair in RTS).
    ///
    /// # References
    ///
    /// [`ibv_query_qp_data_in_order(3)`](https://man7.org/linux/man-pages/man3/ibv_query_qp_data_in_order.3.html)
    #[doc(alias = "ibv_query_qp_data_in_order")]
    pub fn data_in_order(&self, op: SendOpcode) -> bool {
        // SAFETY: live queue pair; flags 0 is the only value rdma-core 44 defines.
        unsafe { ffi::ibv_query_qp_data_in_order(self.as_raw(), op.as_raw(), 0) > 0 }
    }
}
