//! Shared pieces of the connection-manager tools (`udaddy`, `ucmatose`): the command-line
//! checks and address lookup that the C programs do alike.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use rdma_cm::{CmId, EventChannel, PortSpace};

/// The C tools' address and route resolution timeout (2000 ms).
pub const RESOLVE: Duration = Duration::from_millis(2000);

/// `RDMA_PS_UDP`: the port space number of the UD tools' `-p`.
pub const PS_UDP: u32 = 0x0111;

/// Checks a UD tool's `-p` port space number: only [`PS_UDP`] is supported.
pub fn check_udp_port_space(port_space: Option<u32>) -> Result<(), String> {
    match port_space {
        Some(ps) if ps != PS_UDP => Err(format!(
            "port space {ps:#x}: only {PS_UDP:#x} (UDP) is supported"
        )),
        _ => Ok(()),
    }
}

/// `host` (a name or an address) and `port` as a socket address, through the resolver, as
/// the C tools' `getaddrinfo` call; the error reads like theirs.
pub fn lookup(host: &str, port: u16) -> Result<SocketAddr, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("getaddrinfo error: {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("getaddrinfo error: {host}: no address"))
}

/// Checks the `-f` address format (`ip` or `name`; the C tools also take `sid`, `gid` and
/// `ib` addresses, which need InfiniBand addressing that RoCE does not have) and the `-c`
/// connection count.
pub fn check_format_and_count(format: Option<&str>, connections: usize) -> Result<(), String> {
    if let Some(format) = format {
        let format = format.to_ascii_lowercase();
        if !(format.starts_with("ip") || format.starts_with("name")) {
            return Err(format!(
                "address format {format:?}: only ip and name are supported"
            ));
        }
    }
    if connections == 0 {
        return Err("-c: at least one connection".to_string());
    }
    Ok(())
}

/// A number as the C tools read one (`strtol` with base 0 for the usual cases): decimal, or
/// hexadecimal after `0x`.
pub fn parse_number(text: &str) -> Result<u64, String> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|e| format!("{text:?}: {e}"))
}

/// [`parse_number`] for 8-bit options (type of service, retry counts).
pub fn parse_u8(text: &str) -> Result<u8, String> {
    u8::try_from(parse_number(text)?).map_err(|e| e.to_string())
}

/// [`parse_number`] for 32-bit options.
pub fn parse_u32(text: &str) -> Result<u32, String> {
    u32::try_from(parse_number(text)?).map_err(|e| e.to_string())
}

/// Runs the client (when `server` names one) or the server and ends as the C tools do: the
/// closing `test complete` / `return status 0` lines, or a one-line error and a non-zero exit.
pub fn finish(program: &str, result: Result<(), String>) {
    match result {
        Ok(()) => {
            println!("test complete");
            println!("return status 0");
        }
        Err(message) => crate::pingpong::fail(program, message),
    }
}

/// One event channel and `count` identifiers of `ps` on it, as the C tools make their
/// "connections".
pub fn ids_on_one_channel(
    count: usize,
    ps: PortSpace,
) -> Result<(EventChannel, Vec<CmId>), String> {
    let channel =
        EventChannel::new().map_err(|e| format!("failed to create event channel: {e}"))?;
    let ids = (0..count)
        .map(|_| CmId::new(&channel, ps).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((channel, ids))
}
