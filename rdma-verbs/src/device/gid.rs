//! Global identifiers and GID table entries.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use super::{GidType, fixed_c_str};
use crate::ffi;

/// A 128-bit global identifier, in network byte order.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// Whether the GID is all zeroes.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`, RoCE).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }

    /// The GID's interface identifier: its lower 64 bits, in host order. pingpong-style
    /// programs use a GRH only when it is non-zero.
    pub fn interface_id(&self) -> u64 {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(&self.0[8..]);
        u64::from_be_bytes(bytes)
    }

    pub(crate) fn from_raw(raw: &ffi::ibv_gid) -> Self {
        // SAFETY: `raw` is the byte view of the union; every bit pattern is valid.
        Self(unsafe { raw.raw })
    }

    pub(crate) fn to_raw(self) -> ffi::ibv_gid {
        ffi::ibv_gid { raw: self.0 }
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(addr: Ipv6Addr) -> Self {
        Self(addr.octets())
    }
}

impl From<Gid> for Ipv6Addr {
    fn from(gid: Gid) -> Self {
        Ipv6Addr::from(gid.0)
    }
}

impl fmt::Display for Gid {
    /// Formats as an IPv6 address, as `ibv_devinfo` does.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Ipv6Addr::from(self.0), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// One entry of a port's GID table (`struct ibv_gid_entry`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its index in the port's table.
    pub index: u32,
    /// The port.
    pub port: u32,
    /// Its type.
    pub gid_type: GidType,
    /// The interface index of the network device behind it (RoCE), or 0.
    pub netdev_index: u32,
}

impl GidEntry {
    pub(super) fn from_raw(raw: &ffi::ibv_gid_entry) -> Self {
        Self {
            gid: Gid::from_raw(&raw.gid),
            index: raw.gid_index,
            port: raw.port_num,
            gid_type: GidType::from_raw(raw.gid_type),
            netdev_index: raw.ndev_ifindex,
        }
    }

    /// The name of the network device behind the GID (RoCE), for example `eth0`.
    pub fn netdev(&self) -> Option<String> {
        if self.netdev_index == 0 {
            return None;
        }
        let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
        // SAFETY: `name` has the IF_NAMESIZE bytes if_indextoname writes at most.
        let ret = unsafe { libc::if_indextoname(self.netdev_index, name.as_mut_ptr()) };
        if ret.is_null() {
            return None;
        }
        Some(fixed_c_str(&name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_format_like_ibv_devinfo() {
        let gid = Gid::from("::ffff:169.254.7.1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(gid.to_string(), "::ffff:169.254.7.1");
        assert_eq!(gid.ipv4(), Some(Ipv4Addr::new(169, 254, 7, 1)));
        assert_ne!(gid.interface_id(), 0);
        assert!(Gid::default().is_zero());
    }
}
