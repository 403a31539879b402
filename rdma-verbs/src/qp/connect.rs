//! Connecting an RC or UC queue pair in one call: [`ConnectionRecord`], what each side tells
//! the other (its queue pair number, first PSN, LID, GID, MTU and, where wanted, the memory it
//! lets the peer reach), [`QueuePair::record`] to make this side's, [`QueuePair::connect`] to go
//! from RESET to RTS given the peer's, and [`QueuePair::connect_loopback`] for two queue pairs
//! of one device.

use std::hash::{BuildHasher, Hasher};

use super::{
    ConnectedInitAttr, QueuePair, Rc, RcRtrAttr, RcRtsAttr, Reset, Rts, SqPsnRtsAttr, Transport,
    Uc, UcRtrAttr,
};
use crate::ah::AddressVector;
use crate::device::{Gid, Mtu};
use crate::error::{Error, Result};
use crate::flags::AccessFlags;
use crate::mr::RemoteMemory;

/// A connected transport, [`Rc`] or [`Uc`]: one whose queue pairs [`QueuePair::connect`] can
/// connect to a single peer.
pub trait Connected: Transport<InitAttr = ConnectedInitAttr> {
    /// INIT → RTR towards the peer at `av`, with the rdma-core examples' defaults otherwise.
    #[doc(hidden)]
    fn rtr(av: AddressVector, mtu: Mtu, dest_qp_num: u32, rq_psn: u32) -> Self::RtrAttr;
    /// RTR → RTS from `sq_psn`, with the rdma-core examples' defaults otherwise.
    #[doc(hidden)]
    fn rts(sq_psn: u32) -> Self::RtsAttr;
}

impl Connected for Rc {
    fn rtr(av: AddressVector, mtu: Mtu, dest_qp_num: u32, rq_psn: u32) -> RcRtrAttr {
        let mut attr = RcRtrAttr::new(av, dest_qp_num, rq_psn);
        attr.path_mtu = mtu;
        attr
    }

    fn rts(sq_psn: u32) -> RcRtsAttr {
        RcRtsAttr::new(sq_psn)
    }
}

impl Connected for Uc {
    fn rtr(av: AddressVector, mtu: Mtu, dest_qp_num: u32, rq_psn: u32) -> UcRtrAttr {
        let mut attr = UcRtrAttr::new(av, dest_qp_num, rq_psn);
        attr.path_mtu = mtu;
        attr
    }

    fn rts(sq_psn: u32) -> SqPsnRtsAttr {
        SqPsnRtsAttr::new(sq_psn)
    }
}

/// What one side of an RC or UC connection tells the other: made by [`QueuePair::record`],
/// sent out of band ([`to_bytes`](Self::to_bytes) and [`from_bytes`](Self::from_bytes), a
/// fixed [`LEN`](Self::LEN)-byte form), and handed to [`QueuePair::connect`] with the peer's.
///
/// ```no_run
/// # use rdma_verbs::{*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*};
/// # fn exchange(me: [u8; ConnectionRecord::LEN]) -> Vec<u8> { me.to_vec() }
/// # fn main() -> Result<()> {
/// let context = Context::open("rxe0")?;
/// let pd = context.alloc_pd()?;
/// let cq = context.create_cq(16)?;
/// let qp = pd.qp_builder::<Rc>(&cq, &cq).build()?;
/// let me = qp.record(1, 1)?; // port 1, GID index 1
/// let peer = ConnectionRecord::from_bytes(&exchange(me.to_bytes()))?; // a TCP socket, say
/// let qp = qp.connect(&me, &peer, AccessFlags::empty())?;
/// # drop(qp);
/// # Ok(())
/// # }
/// ```
///
/// The fields come from a peer and are not trusted: [`from_bytes`](Self::from_bytes) checks
/// each, and a wrong one can only make the connection fail (its requests complete in error),
/// never touch memory the peer was not given.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[must_use = "a record does nothing until the peer connects with it"]
#[non_exhaustive]
pub struct ConnectionRecord {
    /// The queue pair's number (24 bits).
    pub qp_num: u32,
    /// The first packet sequence number it sends (24 bits, chosen at random by
    /// [`QueuePair::record`]).
    pub psn: u32,
    /// Its port's LID (0 on RoCE).
    pub lid: u16,
    /// The GID it sends from; the peer addresses it with a global route unless it is zero.
    pub gid: Gid,
    /// Its port's active MTU: the connection uses the smaller of the two sides'.
    pub mtu: Mtu,
    /// Its port (1-based). Only the side that made the record uses it.
    pub port: u8,
    /// The index of [`gid`](Self::gid) in the port's GID table. Only the side that made the
    /// record uses it.
    pub gid_index: u8,
    /// Memory this side lets the peer reach, if it advertises some.
    pub memory: Option<RemoteMemory>,
}

/// The first bytes of every record's byte form, then its version.
const MAGIC: [u8; 4] = *b"RVCR";
const VERSION: u8 = 1;

impl ConnectionRecord {
    /// The length of the byte form.
    pub const LEN: usize = 52;

    /// The same record, advertising `memory` to the peer.
    pub fn with_memory(mut self, memory: RemoteMemory) -> Self {
        self.memory = Some(memory);
        self
    }

    /// The byte form: `RVCR`, version 1, a flags byte (bit 0: memory present), then in network
    /// byte order the LID, QP number, PSN, MTU code (`enum ibv_mtu`), port, GID index, one
    /// zero byte, the GID, and the memory's address, length and rkey (zeroes without memory).
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[5] = u8::from(self.memory.is_some());
        out[6..8].copy_from_slice(&self.lid.to_be_bytes());
        out[8..12].copy_from_slice(&self.qp_num.to_be_bytes());
        out[12..16].copy_from_slice(&self.psn.to_be_bytes());
        // An MTU `from_bytes` would refuse (`Unknown`, set by hand) goes out as code 0, which
        // the peer refuses too, rather than as another MTU.
        out[16] = match self.mtu.bytes() {
            Some(_) => u8::try_from(self.mtu.as_raw()).unwrap_or(0),
            None => 0,
        };
        out[17] = self.port;
        out[18] = self.gid_index;
        out[20..36].copy_from_slice(&self.gid.0);
        if let Some(memory) = self.memory {
            out[36..44].copy_from_slice(&memory.addr.to_be_bytes());
            out[44..48].copy_from_slice(&memory.len.to_be_bytes());
            out[48..52].copy_from_slice(&memory.rkey.to_be_bytes());
        }
        out
    }

    /// Reads the byte form [`to_bytes`](Self::to_bytes) writes.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`], naming the field, if `bytes` is not [`LEN`](Self::LEN)
    /// long, does not start with `RVCR` and version 1, has unknown flags, a QP number or PSN
    /// past 24 bits, or an MTU code that is not one of `ibv_mtu`'s.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bad = |what: String| Err(Error::InvalidArgument(format!("connection record: {what}")));
        let Ok(bytes) = <&[u8; Self::LEN]>::try_from(bytes) else {
            return bad(format!("{} bytes, not {}", bytes.len(), Self::LEN));
        };
        if bytes[..4] != MAGIC || bytes[4] != VERSION {
            return bad(format!(
                "it starts {:02x?}, not \"RVCR\" and version {VERSION}",
                &bytes[..5]
            ));
        }
        if bytes[5] > 1 {
            return bad(format!("unknown flags {:#04x}", bytes[5]));
        }
        let u32_at = |at: usize| {
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let qp_num = u32_at(8);
        let psn = u32_at(12);
        if qp_num > PSN_MASK || psn > PSN_MASK {
            return bad(format!(
                "QP number {qp_num:#x} or PSN {psn:#x} past 24 bits"
            ));
        }
        let mtu = Mtu::from_raw(u32::from(bytes[16]));
        if mtu.bytes().is_none() {
            return bad(format!("MTU code {}", bytes[16]));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&bytes[20..36]);
        let memory = (bytes[5] == 1).then(|| RemoteMemory {
            addr: (u64::from(u32_at(36)) << 32) | u64::from(u32_at(40)),
            len: u32_at(44),
            rkey: u32_at(48),
        });
        Ok(Self {
            qp_num,
            psn,
            lid: u16::from_be_bytes([bytes[6], bytes[7]]),
            gid: Gid(gid),
            mtu,
            port: bytes[17],
            gid_index: bytes[18],
            memory,
        })
    }
}

/// Packet sequence numbers (and QP numbers) are 24 bits.
const PSN_MASK: u32 = 0x00ff_ffff;

/// A PSN no earlier connection of a reused QP number is likely to have used: 24 random bits
/// (from the standard library's per-process random hash keys, mixed with the QP number and
/// the time).
fn random_psn(qp_num: u32) -> u32 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(qp_num);
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(now.as_nanos());
    }
    // Truncation intended: 24 of the hash's bits.
    (hasher.finish() as u32) & PSN_MASK
}

impl<T: Connected> QueuePair<T, Reset> {
    /// This queue pair's record for its peer, sending from port `port` and the GID at
    /// `gid_index` of that port's table (`ibv_query_port`, `ibv_query_gid`): its QP number,
    /// a random first PSN, the port's LID and active MTU, the GID. Add the memory the peer may
    /// reach with [`ConnectionRecord::with_memory`].
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] from `ibv_query_port` or `ibv_query_gid_ex` (a port or GID index the
    /// device lacks); [`Error::InvalidArgument`] if the port reports an MTU this crate does not
    /// know.
    ///
    /// # References
    ///
    /// [`ibv_query_port(3)`](https://man7.org/linux/man-pages/man3/ibv_query_port.3.html),
    /// [`ibv_query_gid(3)`](https://man7.org/linux/man-pages/man3/ibv_query_gid.3.html)
    #[doc(alias = "ibv_query_port")]
    #[doc(alias = "ibv_query_gid")]
    pub fn record(&self, port: u8, gid_index: u8) -> Result<ConnectionRecord> {
        let context = self.pd().context();
        let attr = context.query_port(port)?;
        if attr.active_mtu.bytes().is_none() {
            return Err(Error::InvalidArgument(format!(
                "port {port} reports MTU code {}, which no record can carry",
                attr.active_mtu.as_raw()
            )));
        }
        let gid = context.query_gid(port, u32::from(gid_index))?.gid;
        Ok(ConnectionRecord {
            qp_num: self.qp_num(),
            psn: random_psn(self.qp_num()),
            lid: attr.lid,
            gid,
            mtu: attr.active_mtu,
            port,
            gid_index,
            memory: None,
        })
    }

    /// RESET → INIT → RTR → RTS in one call: connects this queue pair, which `me` describes
    /// (made by [`record`](Self::record)), to the peer that `peer` describes, granting the
    /// peer `access` to this side's memory (remote write, read, atomic; each memory region
    /// must allow it too). The path MTU is the smaller of the two records'; the peer is
    /// addressed by its LID, and by its GID (sent from `me`'s GID index) unless that is zero;
    /// the other attributes are rdma-core's examples' defaults ([`RcRtrAttr::new`],
    /// [`RcRtsAttr::new`]). Use the transitions one by one (`into_init`, `into_rtr`,
    /// `into_rts`) to choose them.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `me` is not this queue pair's record; [`Error::ModifyQp`]
    /// from the transition that failed. On any error the queue pair is destroyed: make a new
    /// one (and a new record) to try again.
    ///
    /// # References
    ///
    /// [`ibv_modify_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_modify_qp.3.html)
    #[doc(alias = "ibv_modify_qp")]
    pub fn connect(
        self,
        me: &ConnectionRecord,
        peer: &ConnectionRecord,
        access: AccessFlags,
    ) -> Result<QueuePair<T, Rts>> {
        if me.qp_num != self.qp_num() {
            return Err(Error::InvalidArgument(format!(
                "the record is of queue pair {:#x}, not of this one ({:#x})",
                me.qp_num,
                self.qp_num()
            )));
        }
        let mtu = if peer.mtu.as_raw() < me.mtu.as_raw() {
            peer.mtu
        } else {
            me.mtu
        };
        let mut av = AddressVector::new(me.port).dlid(peer.lid);
        if !peer.gid.is_zero() {
            av = av.grh(peer.gid, me.gid_index);
        }
        let init = ConnectedInitAttr::new(me.port).access(access);
        Ok(self
            .into_init(&init)?
            .into_rtr(&T::rtr(av, mtu, peer.qp_num, peer.psn))?
            .into_rts(&T::rts(me.psn))?)
    }

    /// Connects `a` and `b`, two queue pairs of one device, to each other through port `port`
    /// and GID index `gid_index` (loopback through the device), each granting the other
    /// `access`: [`record`](Self::record) and [`connect`](Self::connect) for both.
    ///
    /// # Errors
    ///
    /// As [`record`](Self::record) and [`connect`](Self::connect); both queue pairs are
    /// destroyed on any error.
    pub fn connect_loopback(
        a: Self,
        b: Self,
        port: u8,
        gid_index: u8,
        access: AccessFlags,
    ) -> Result<(QueuePair<T, Rts>, QueuePair<T, Rts>)> {
        let (a_record, b_record) = (a.record(port, gid_index)?, b.record(port, gid_index)?);
        let a = a.connect(&a_record, &b_record, access)?;
        let b = b.connect(&b_record, &a_record, access)?;
        Ok((a, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ConnectionRecord {
        ConnectionRecord {
            qp_num: 0x12_3456,
            psn: 0xab_cdef,
            lid: 0x0102,
            gid: Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 169, 254, 7, 1]),
            mtu: Mtu::Mtu1024,
            port: 1,
            gid_index: 3,
            memory: None,
        }
    }

    #[test]
    fn records_round_trip_through_their_bytes() {
        let plain = sample();
        let bytes = plain.to_bytes();
        assert_eq!(&bytes[..6], b"RVCR\x01\x00");
        assert_eq!(&bytes[8..12], &[0, 0x12, 0x34, 0x56]);
        assert_eq!(ConnectionRecord::from_bytes(&bytes).unwrap(), plain);
        let with = plain.with_memory(RemoteMemory {
            addr: 0x7f00_1234_5678,
            len: 4096,
            rkey: 0xdead_beef,
        });
        let bytes = with.to_bytes();
        assert_eq!(bytes[5], 1);
        assert_eq!(ConnectionRecord::from_bytes(&bytes).unwrap(), with);
        // An MTU set by hand that no peer could read goes out as code 0, which is refused.
        let mut odd = plain;
        odd.mtu = Mtu::Unknown(0x105);
        assert_eq!(odd.to_bytes()[16], 0);
        assert!(ConnectionRecord::from_bytes(&odd.to_bytes()).is_err());
    }

    #[test]
    fn records_from_a_peer_are_checked_field_by_field() {
        let good = sample().to_bytes();
        let refused = |bytes: &[u8], says: &str| match ConnectionRecord::from_bytes(bytes) {
            Err(Error::InvalidArgument(message)) => {
                assert!(message.contains(says), "{message:?} does not say {says:?}")
            }
            other => panic!("{other:?} for {bytes:02x?}"),
        };
        refused(&good[..51], "51 bytes, not 52");
        refused(&[], "0 bytes");
        let mut bytes = good;
        bytes[0] = b'X';
        refused(&bytes, "not \"RVCR\"");
        let mut bytes = good;
        bytes[4] = 2;
        refused(&bytes, "version 1");
        let mut bytes = good;
        bytes[5] = 2;
        refused(&bytes, "unknown flags 0x02");
        let mut bytes = good;
        bytes[8] = 1;
        refused(&bytes, "past 24 bits");
        let mut bytes = good;
        bytes[12] = 0x80;
        refused(&bytes, "past 24 bits");
        for code in [0, 6, 255] {
            let mut bytes = good;
            bytes[16] = code;
            refused(&bytes, &format!("MTU code {code}"));
        }
    }

    #[test]
    fn random_psns_fit_24_bits_and_differ() {
        let psns: Vec<u32> = (0..64).map(|_| random_psn(7)).collect();
        assert!(psns.iter().all(|p| *p <= PSN_MASK));
        let distinct: std::collections::BTreeSet<u32> = psns.iter().copied().collect();
        assert!(distinct.len() > 60, "{psns:?}");
    }
}
