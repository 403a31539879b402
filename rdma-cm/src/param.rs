//! Connection parameters: what a connect, an accept or a reject sends.

use rdma_verbs_sys as ffi;

use crate::error::{Error, Result};

/// The parameters of [`CmId::connect`](crate::CmId::connect) and
/// [`CmId::accept`](crate::CmId::accept) (`struct rdma_conn_param`): private data, RDMA
/// read/atomic depths, retry counts, and the queue pair number.
///
/// The defaults: no private data, responder resources and initiator depth 1, retry count 7,
/// RNR retry count 7 (infinite), no SRQ.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "parameters do nothing until a connect or accept uses them"]
pub struct ConnParam {
    private_data: Vec<u8>,
    /// RDMA reads and atomics the peer may have outstanding at this side.
    pub responder_resources: u8,
    /// RDMA reads and atomics this side may have outstanding at the peer.
    pub initiator_depth: u8,
    /// Transport retries (0 to 7; connect only).
    pub retry_count: u8,
    /// Receiver-not-ready retries (0 to 7, 7 infinite).
    pub rnr_retry_count: u8,
    /// Whether the queue pair receives through a shared receive queue.
    pub srq: bool,
    pub(crate) qp_num: u32,
}

impl Default for ConnParam {
    fn default() -> Self {
        Self {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
        }
    }
}

impl ConnParam {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Private data to send (the peer sees it in its event). The wire carries at most 56
    /// bytes in a connect request and 196 in an accept on InfiniBand and RoCE; the kernel
    /// refuses more.
    ///
    /// # Errors
    ///
    /// [`Error::PrivateDataTooLong`] beyond 255 bytes (what the C structure can say).
    pub fn private_data(mut self, data: &[u8]) -> Result<Self> {
        if data.len() > usize::from(u8::MAX) {
            return Err(Error::PrivateDataTooLong { len: data.len() });
        }
        self.private_data = data.to_vec();
        Ok(self)
    }

    /// The queue pair this connection uses (set by the `*_qp` helpers; for a plain
    /// [`connect`](crate::CmId::connect) or [`accept`](crate::CmId::accept) of a queue pair
    /// the caller manages).
    pub fn qp_num(mut self, qp_num: u32) -> Self {
        self.qp_num = qp_num;
        self
    }

    /// The C structure; its private data points into `self`, which must outlive the call it
    /// is passed to.
    pub(crate) fn to_raw(&self) -> ffi::rdma_conn_param {
        ffi::rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                std::ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            // At most 255: checked by `private_data`.
            private_data_len: self.private_data.len() as u8,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: 0,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: u8::from(self.srq),
            qp_num: self.qp_num,
        }
    }
}

/// The connection parameters an event carried from the peer (a connect request, a connect
/// response, an established connection).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerParam {
    /// The peer's responder resources.
    pub responder_resources: u8,
    /// The peer's initiator depth.
    pub initiator_depth: u8,
    /// The peer's retry count.
    pub retry_count: u8,
    /// The peer's RNR retry count.
    pub rnr_retry_count: u8,
    /// Whether the peer's queue pair uses an SRQ.
    pub srq: bool,
    /// The peer's queue pair number.
    pub qp_num: u32,
}

impl PeerParam {
    pub(crate) fn from_raw(raw: &ffi::rdma_conn_param) -> Self {
        Self {
            responder_resources: raw.responder_resources,
            initiator_depth: raw.initiator_depth,
            retry_count: raw.retry_count,
            rnr_retry_count: raw.rnr_retry_count,
            srq: raw.srq != 0,
            qp_num: raw.qp_num,
        }
    }
}
