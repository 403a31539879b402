//! Socket addresses between Rust ([`SocketAddr`]) and the C `struct sockaddr` family.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use rdma_verbs_sys as ffi;

/// A `sockaddr_in` or `sockaddr_in6` for `addr`, as storage large enough for either.
pub(crate) fn to_storage(addr: SocketAddr) -> ffi::sockaddr_storage {
    // SAFETY: an all-zero sockaddr_storage is valid (family AF_UNSPEC).
    let mut storage: ffi::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&raw mut storage).cast::<libc::sockaddr_in>(), sin) };
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&raw mut storage).cast::<libc::sockaddr_in6>(), sin6) };
        }
    }
    storage
}

/// The address `sa` points at, if it is IPv4 or IPv6.
///
/// # Safety
///
/// `sa` must be null or point at a readable socket address whose family field tells its size
/// (at least a `sockaddr_in6` must be readable when the family is `AF_INET6`).
pub(crate) unsafe fn from_raw(sa: *const ffi::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees a readable address; the family is its first field.
    let family = i32::from(unsafe { (*sa.cast::<libc::sockaddr>()).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: the family says this is a sockaddr_in.
            let sin = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in>()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this is a sockaddr_in6.
            let sin6 = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_survive_the_round_trip() {
        for text in ["169.254.7.1:7174", "[fe80::1%3]:18515", "0.0.0.0:0"] {
            let addr: SocketAddr = text.parse().unwrap();
            let storage = to_storage(addr);
            // SAFETY: storage holds the address just written.
            let back = unsafe { from_raw((&raw const storage).cast()) };
            assert_eq!(back, Some(addr), "{text}");
        }
        // SAFETY: null is allowed.
        assert_eq!(unsafe { from_raw(std::ptr::null()) }, None);
    }
}
