//! The out-of-band exchange of rdma-core's pingpong programs, byte for byte.
//!
//! Each side sends one record `"%04x:%06x:%06x:%s"` (LID, QPN, PSN, GID as 32 hex digits in
//! wire order) followed by a NUL: 52 bytes. The client writes its record first; the server
//! reads it, brings its queue pair to RTS, and answers with its own; the client then writes
//! `"done\0"`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use rdma_verbs::Gid;

/// Length of one record: 51 characters and the NUL.
pub const RECORD_LEN: usize = 52;

/// How long one side waits for the other's bytes once connected.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// The addressing one side sends the other.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Dest {
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number (24 bits).
    pub psn: u32,
    /// GID, or zero when no GID index was given.
    pub gid: Gid,
}

impl Dest {
    /// The 52-byte record.
    pub fn to_record(&self) -> [u8; RECORD_LEN] {
        let hex: String = self.gid.0.iter().map(|b| format!("{b:02x}")).collect();
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{hex}",
            self.lid,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff
        );
        let mut record = [0u8; RECORD_LEN];
        record[..text.len()].copy_from_slice(text.as_bytes());
        record
    }

    /// Parses a record as the C programs' `sscanf("%x:%x:%x:%s")` does, but strictly: four
    /// hex fields, the GID exactly 32 hex digits.
    pub fn parse(record: &[u8]) -> Result<Self, String> {
        let end = record.iter().position(|&b| b == 0).unwrap_or(record.len());
        let text = std::str::from_utf8(&record[..end])
            .map_err(|_| "malformed address record (not text)".to_string())?;
        let fields: Vec<&str> = text.split(':').collect();
        let [lid, qpn, psn, gid] = fields[..] else {
            return Err(format!("malformed address record {text:?}"));
        };
        let hex = |field: &str, what: &str, max: u32| {
            u32::from_str_radix(field, 16)
                .ok()
                .filter(|&v| v <= max)
                .ok_or_else(|| format!("malformed {what} {field:?} in address record"))
        };
        if gid.len() != 32 || !gid.is_ascii() {
            return Err(format!("malformed GID {gid:?} in address record"));
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&gid[2 * i..2 * i + 2], 16)
                .map_err(|_| format!("malformed GID {gid:?} in address record"))?;
        }
        Ok(Self {
            lid: hex(lid, "LID", 0xffff)? as u16,
            qpn: hex(qpn, "QPN", 0xff_ffff)?,
            psn: hex(psn, "PSN", 0xff_ffff)?,
            gid: Gid(bytes),
        })
    }
}

/// A random 24-bit packet sequence number.
pub fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    (hasher.finish() & 0xff_ffff) as u32
}

fn read_record(stream: &mut TcpStream, count: usize) -> Result<Vec<Dest>, String> {
    let mut dests = Vec::with_capacity(count);
    for i in 0..count {
        let mut record = [0u8; RECORD_LEN];
        stream.read_exact(&mut record).map_err(|e| {
            format!(
                "couldn't read remote address {}/{count}: {}",
                i + 1,
                describe(&e)
            )
        })?;
        dests.push(Dest::parse(&record)?);
    }
    Ok(dests)
}

fn write_records(stream: &mut TcpStream, dests: &[Dest]) -> Result<(), String> {
    let mut bytes = Vec::with_capacity(dests.len() * RECORD_LEN);
    for dest in dests {
        bytes.extend_from_slice(&dest.to_record());
    }
    // The C peer reads each record with a single read(): send them in one write.
    stream
        .write_all(&bytes)
        .map_err(|e| format!("couldn't send local address: {}", describe(&e)))
}

fn describe(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::UnexpectedEof => "the peer closed the connection".to_string(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("no answer within {} s", EXCHANGE_TIMEOUT.as_secs())
        }
        _ => error.to_string(),
    }
}

/// Client side: connects to `host:port`, sends `mine`, receives as many records, and finishes
/// with `"done"`.
pub fn client_exchange(host: &str, port: u16, mine: &[Dest]) -> Result<Vec<Dest>, String> {
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("couldn't resolve {host}: {e}"))?
        .collect();
    let mut last = None;
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, EXCHANGE_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut stream = stream.ok_or_else(|| {
        format!(
            "couldn't connect to {host}:{port}: {}",
            last.map_or("no address".to_string(), |e| e.to_string())
        )
    })?;
    set_timeouts(&stream)?;
    write_records(&mut stream, mine)?;
    let remote = read_record(&mut stream, mine.len())?;
    stream
        .write_all(b"done\0")
        .map_err(|e| format!("couldn't send \"done\": {}", describe(&e)))?;
    Ok(remote)
}

/// Server side, first half: waits for one client on `port` and reads its `count` records. The
/// caller connects its queue pairs, then calls [`ServerExchange::reply`].
pub fn server_accept(port: u16, count: usize) -> Result<ServerExchange, String> {
    let listener = TcpListener::bind(("0.0.0.0", port))
        .map_err(|e| format!("couldn't listen on port {port}: {e}"))?;
    let (mut stream, _) = listener
        .accept()
        .map_err(|e| format!("accept() failed: {e}"))?;
    drop(listener);
    set_timeouts(&stream)?;
    let remote = read_record(&mut stream, count)?;
    Ok(ServerExchange { stream, remote })
}

/// A server exchange between reading the client's records and replying.
#[derive(Debug)]
pub struct ServerExchange {
    stream: TcpStream,
    /// The client's records.
    pub remote: Vec<Dest>,
}

impl ServerExchange {
    /// Sends the server's records and waits for the client's `"done"`.
    pub fn reply(mut self, mine: &[Dest]) -> Result<(), String> {
        write_records(&mut self.stream, mine)?;
        let mut done = [0u8; 5];
        let mut got = 0;
        while got < 4 {
            match self.stream.read(&mut done[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => return Err(format!("couldn't read \"done\": {}", describe(&e))),
            }
        }
        if &done[..4] != b"done" {
            return Err(format!(
                "expected \"done\" from the client, got {:?}",
                String::from_utf8_lossy(&done[..got])
            ));
        }
        Ok(())
    }
}

fn set_timeouts(stream: &TcpStream) -> Result<(), String> {
    stream
        .set_read_timeout(Some(EXCHANGE_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(EXCHANGE_TIMEOUT)))
        .map_err(|e| format!("socket timeout: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_match_the_c_format() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[192, 168, 1, 5]);
        let dest = Dest {
            lid: 1,
            qpn: 0x11a,
            psn: 0x3c2e7f,
            gid: Gid(gid),
        };
        let record = dest.to_record();
        assert_eq!(record.len(), 52);
        assert_eq!(
            &record[..51],
            b"0001:00011a:3c2e7f:00000000000000000000ffffc0a80105"
        );
        assert_eq!(record[51], 0);
        assert_eq!(Dest::parse(&record).unwrap(), dest);
    }

    #[test]
    fn malformed_records_are_errors() {
        assert!(Dest::parse(b"").is_err());
        assert!(Dest::parse(b"0001:00011a:3c2e7f").is_err());
        assert!(Dest::parse(b"0001:00011a:3c2e7f:00").is_err());
        assert!(Dest::parse(b"zzzz:00011a:3c2e7f:00000000000000000000ffffc0a80105\0").is_err());
        assert!(Dest::parse(b"0001:1000000:3c2e7f:00000000000000000000ffffc0a80105\0").is_err());
        assert!(Dest::parse(&[0xff; 52]).is_err());
        // Multi-byte characters in the GID field are an error, not a slicing panic.
        assert!(Dest::parse("0001:00011a:3c2e7f:€€€€€€€€€€00\0".as_bytes()).is_err());
    }
}
