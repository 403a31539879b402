//! Enhanced connection establishment (ECE): the vendor options a queue pair offers and the
//! ones its peer accepted, exchanged through the connection manager or out of band.

use super::{QpState, QueuePair, Transport};
use crate::error::{Error, Result};
use crate::ffi;

/// Enhanced connection establishment options (`struct ibv_ece`): a vendor's identifier and
/// its option bits, which two queue pairs of the same vendor agree on while connecting.
///
/// A device that has none refuses both calls with [`Error::Unsupported`] (Soft-RoCE does).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ece {
    /// The vendor's IEEE OUI; 0 is no vendor.
    pub vendor_id: u32,
    /// The vendor's option bits.
    pub options: u32,
}

impl Ece {
    /// The C structure (no extension fields set).
    pub fn to_raw(self) -> ffi::ibv_ece {
        ffi::ibv_ece {
            vendor_id: self.vendor_id,
            options: self.options,
            comp_mask: 0,
        }
    }

    /// The options of C structure `raw`.
    pub fn from_raw(raw: &ffi::ibv_ece) -> Self {
        Self {
            vendor_id: raw.vendor_id,
            options: raw.options,
        }
    }
}

impl<T: Transport, S: QpState> QueuePair<T, S> {
    /// `ibv_query_ece`: the options the queue pair offers, or, once connected, the ones both
    /// sides agreed on.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where the provider has no ECE (Soft-RoCE); else
    /// [`Error::Verb`] with the call's errno.
    ///
    /// # References
    ///
    /// [`ibv_query_ece(3)`](https://man7.org/linux/man-pages/man3/ibv_query_ece.3.html)
    #[doc(alias = "ibv_query_ece")]
    pub fn ece(&self) -> Result<Ece> {
        let mut raw = ffi::ibv_ece::default();
        // SAFETY: live queue pair; `raw` is writable.
        let ret = unsafe { ffi::ibv_query_ece(self.as_raw(), &mut raw) };
        Error::check("ibv_query_ece", ret)?;
        Ok(Ece::from_raw(&raw))
    }

    /// `ibv_set_ece`: the options to offer the peer, set before the queue pair moves to RTR
    /// (on the passive side, the ones the connection request carried, narrowed to what this
    /// side accepts).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] for vendor 0, without calling it (libibverbs would report
    ///   that as "not supported", which it is not).
    /// - [`Error::Unsupported`] where the provider has no ECE (Soft-RoCE); else
    ///   [`Error::Verb`] with the call's errno (`EINVAL` for options the device does not know).
    ///
    /// # References
    ///
    /// [`ibv_set_ece(3)`](https://man7.org/linux/man-pages/man3/ibv_set_ece.3.html)
    #[doc(alias = "ibv_set_ece")]
    pub fn set_ece(&mut self, ece: Ece) -> Result<()> {
        if ece.vendor_id == 0 {
            return Err(Error::InvalidArgument(
                "ibv_set_ece: the vendor identifier must not be 0".into(),
            ));
        }
        let mut raw = ece.to_raw();
        // SAFETY: live queue pair; `raw` is a valid structure the call reads.
        let ret = unsafe { ffi::ibv_set_ece(self.as_raw(), &mut raw) };
        Error::check("ibv_set_ece", ret)
    }
}
