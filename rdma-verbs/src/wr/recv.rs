//! [`RecvRequest`]: receive work requests (`struct ibv_recv_wr`).

use super::{Payload, check_wr_id};
use crate::error::{Error, Result};
use crate::ffi;

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Copy, Clone, Debug)]
#[must_use = "a request does nothing until it is posted"]
pub struct RecvRequest<'a> {
    wr_id: u64,
    pub(super) payload: Payload<'a>,
    owned: bool,
}

impl<'a> RecvRequest<'a> {
    /// Receives into `payload` (memory with `LOCAL_WRITE`). [`Payload::Inline`] is not
    /// allowed for receives.
    pub fn new(wr_id: u64, payload: impl Into<Payload<'a>>) -> Self {
        Self {
            wr_id,
            payload: payload.into(),
            owned: false,
        }
    }

    /// The same receive, as an owned request with id `id` (see [`OWNED_ID_BIT`](crate::inflight::OWNED_ID_BIT)).
    pub(crate) fn owned(mut self, id: u64) -> Self {
        self.wr_id = id;
        self.owned = true;
        self
    }

    /// A receive with no buffer: for RDMA writes with immediate and zero-length sends.
    pub fn empty(wr_id: u64) -> Self {
        Self {
            wr_id,
            payload: Payload::None,
            owned: false,
        }
    }

    /// The request's `wr_id`.
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    #[inline]
    pub(crate) fn fill(&self, raw: &mut ffi::ibv_recv_wr, one: &mut ffi::ibv_sge) -> Result<()> {
        check_wr_id(self.wr_id, self.owned)?;
        if let Payload::Inline(_) = self.payload {
            return Err(Error::invalid("a receive cannot use inline data"));
        }
        self.payload.check()?;
        let (sg_list, num_sge, _) = self.payload.fill(one);
        *raw = ffi::ibv_recv_wr {
            wr_id: self.wr_id,
            next: std::ptr::null_mut(),
            sg_list,
            num_sge,
        };
        Ok(())
    }
}
