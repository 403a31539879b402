//! `rdma_getaddrinfo`: names and services to the addresses an identifier binds or resolves.

use std::ffi::CString;
use std::net::SocketAddr;

use rdma_verbs_sys as ffi;

use crate::addr;
use crate::error::{Error, Result};
use crate::id::PortSpace;

/// What [`getaddrinfo`] asks for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[must_use = "hints do nothing until getaddrinfo uses them"]
pub struct AddrHints {
    /// The port space (TCP: RC, UDP: UD).
    pub port_space: PortSpace,
    /// For a listener: the node is a local address to bind (`RAI_PASSIVE`); without a node,
    /// the wildcard address.
    pub passive: bool,
    /// The node is a numeric address, not a name (`RAI_NUMERICHOST`).
    pub numeric_host: bool,
}

impl Default for AddrHints {
    fn default() -> Self {
        Self {
            port_space: PortSpace::Tcp,
            passive: false,
            numeric_host: false,
        }
    }
}

/// One answer of [`getaddrinfo`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AddrInfo {
    /// The local address to bind (for a listener) or to resolve from, when the answer has one.
    pub src: Option<SocketAddr>,
    /// The address to resolve (for a client), when the answer has one.
    pub dst: Option<SocketAddr>,
    /// The port space the answer is for (from the hints).
    pub port_space: PortSpace,
    /// Whether the answer is for a listener (`RAI_PASSIVE`).
    pub passive: bool,
}

/// `rdma_getaddrinfo`: the addresses of `node` and `service` (a port number or a service
/// name) for `hints`.
///
/// # Errors
///
/// [`Error::AddrInfo`] when the name or service does not resolve (with the resolver's
/// message); [`Error::InvalidArgument`] for a name with a NUL byte.
///
/// # References
///
/// [`rdma_getaddrinfo(3)`](https://man7.org/linux/man-pages/man3/rdma_getaddrinfo.3.html)
#[doc(alias = "rdma_getaddrinfo")]
pub fn getaddrinfo(
    node: Option<&str>,
    service: Option<&str>,
    hints: &AddrHints,
) -> Result<Vec<AddrInfo>> {
    let what = format!("{}:{}", node.unwrap_or("*"), service.unwrap_or("*"));
    let c = |text: Option<&str>| {
        text.map(CString::new)
            .transpose()
            .map_err(|_| Error::InvalidArgument("a name or service with a NUL byte"))
    };
    let (node, service) = (c(node)?, c(service)?);
    let mut flags = 0;
    if hints.passive {
        flags |= ffi::RAI_PASSIVE;
    }
    if hints.numeric_host {
        flags |= ffi::RAI_NUMERICHOST;
    }
    let raw_hints = ffi::rdma_addrinfo {
        ai_flags: flags as i32,
        ai_port_space: hints.port_space.raw() as i32,
        ai_qp_type: hints.port_space.qp_type() as i32,
        ..Default::default()
    };
    let mut list = std::ptr::null_mut();
    // SAFETY: the strings and hints live through the call; `list` is written on success.
    let ret = unsafe {
        ffi::rdma_getaddrinfo(
            node.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            service.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            &raw_hints,
            &mut list,
        )
    };
    if ret != 0 {
        let errno = std::io::Error::last_os_error();
        return Err(Error::AddrInfo {
            what,
            reason: format!("returned {ret} ({errno})"),
        });
    }
    let mut answers = Vec::new();
    let mut next = list;
    while !next.is_null() {
        // SAFETY: an element of the list rdma_getaddrinfo returned, not freed yet; its
        // addresses (when not null) are socket addresses of their family.
        unsafe {
            let entry = &*next;
            answers.push(AddrInfo {
                src: addr::from_raw(entry.ai_src_addr.cast_const()),
                dst: addr::from_raw(entry.ai_dst_addr.cast_const()),
                port_space: hints.port_space,
                passive: entry.ai_flags & ffi::RAI_PASSIVE as i32 != 0,
            });
            next = entry.ai_next;
        }
    }
    // SAFETY: the list rdma_getaddrinfo returned, freed once.
    unsafe { ffi::rdma_freeaddrinfo(list) };
    Ok(answers)
}
