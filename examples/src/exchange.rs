//! The out-of-band exchange of rdma-core's pingpong programs, byte for byte.
//!
//! Each side sends one record `"%04x:%06x:%06x:%s"` (LID, QPN, PSN, GID as 32 hex digits in
//! wire order) followed by a NUL: 52 bytes. The client writes its record first; the server
//! reads it, brings its queue pair to RTS, and answers with its own; the client then writes
//! `"done\0"`.
//!
//! The C programs close the connection there. The Rust ones keep it open for a final
//! handshake after the ping-pong loop ([`Link::finish`]): each side writes [`END_MARKER`] and
//! waits for the other's, so neither leaves RTS (which makes rxe drop the ACK of the last
//! message) while the other still waits for a completion. A C peer has closed its end long
//! before: end of stream then ends the handshake, without error.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use rdma_verbs::{device::Gid, mr::RemoteMemory};

/// Length of one record: 51 characters and the NUL.
pub const RECORD_LEN: usize = 52;

/// How long one side waits for the other's bytes once connected.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// What each side writes after its ping-pong loop (see [`Link::finish`]).
pub const END_MARKER: &[u8; 4] = b"end\0";

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
/// with `"done"`. The connection stays open for the final handshake.
pub fn client_exchange(host: &str, port: u16, mine: &[Dest]) -> Result<(Vec<Dest>, Link), String> {
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
    Ok((remote, Link { stream }))
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
    /// Sends the server's records and waits for the client's `"done"`. The connection stays
    /// open for the final handshake.
    pub fn reply(mut self, mine: &[Dest]) -> Result<Link, String> {
        write_records(&mut self.stream, mine)?;
        // All five bytes (with the NUL), so that none is left to be taken for the end marker.
        let mut done = [0u8; 5];
        let mut got = 0;
        while got < done.len() {
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
        Ok(Link {
            stream: self.stream,
        })
    }
}

/// How the peer ended the final handshake.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PeerEnd {
    /// It wrote [`END_MARKER`]: it is a Rust pingpong that has finished its loop.
    Finished,
    /// It had closed the connection: a C pingpong (which closes it right after the exchange),
    /// or a Rust one that failed and reports its own error. Nothing tells when it is done.
    Closed,
}

/// The exchange's TCP connection, kept open after it for the final handshake.
#[derive(Debug)]
pub struct Link {
    stream: TcpStream,
}

impl Link {
    /// The final handshake, after the ping-pong loop and before the queue pair leaves RTS:
    /// writes [`END_MARKER`], then waits up to `timeout` for the peer's marker or for the end of
    /// the stream. A peer that finished its loop has had every completion it waits for, so
    /// moving the queue pair to the error state can no longer drop an ACK it needs.
    ///
    /// # Errors
    ///
    /// Other bytes than the marker, no answer within `timeout`, or a socket error other than the
    /// peer's closing (end of stream, reset, broken pipe).
    pub fn finish(mut self, timeout: Duration) -> Result<PeerEnd, String> {
        let closed = |e: &std::io::Error| {
            matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::UnexpectedEof
            )
        };
        self.stream
            .set_read_timeout(Some(timeout.max(Duration::from_secs(1))))
            .map_err(|e| format!("socket timeout: {e}"))?;
        match self.stream.write_all(END_MARKER) {
            Ok(()) => {}
            Err(e) if closed(&e) => return Ok(PeerEnd::Closed),
            Err(e) => return Err(format!("couldn't send the end marker: {e}")),
        }
        let mut marker = [0u8; END_MARKER.len()];
        let mut got = 0;
        while got < marker.len() {
            match self.stream.read(&mut marker[got..]) {
                Ok(0) if got == 0 => return Ok(PeerEnd::Closed),
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if closed(&e) && got == 0 => return Ok(PeerEnd::Closed),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(format!(
                        "the peer did not finish within {} s",
                        timeout.as_secs()
                    ));
                }
                Err(e) => return Err(format!("couldn't read the end marker: {e}")),
            }
        }
        if &marker[..got] != END_MARKER {
            return Err(format!(
                "expected the end marker from the peer, got {:?}",
                String::from_utf8_lossy(&marker[..got])
            ));
        }
        Ok(PeerEnd::Finished)
    }
}

/// The length of a remote-memory record: `addr:len:rkey` in hex, NUL-padded.
pub const REMOTE_RECORD_LEN: usize = 40;

/// Remote memory as a record: `"{addr:016x}:{len:08x}:{rkey:08x}"`, NUL-padded.
pub fn remote_to_record(memory: &RemoteMemory) -> [u8; REMOTE_RECORD_LEN] {
    let text = format!(
        "{:016x}:{:08x}:{:08x}",
        memory.addr, memory.len, memory.rkey
    );
    let mut record = [0u8; REMOTE_RECORD_LEN];
    record[..text.len()].copy_from_slice(text.as_bytes());
    record
}

/// Parses a remote-memory record strictly: three hex fields of at most 16, 8 and 8 digits.
pub fn parse_remote(record: &[u8]) -> Result<RemoteMemory, String> {
    let end = record.iter().position(|&b| b == 0).unwrap_or(record.len());
    let text = std::str::from_utf8(&record[..end])
        .map_err(|_| "malformed remote memory record (not text)".to_string())?;
    let fields: Vec<&str> = text.split(':').collect();
    let [addr, len, rkey] = fields[..] else {
        return Err(format!("malformed remote memory record {text:?}"));
    };
    let malformed = |what: &str, field: &str| format!("malformed {what} {field:?} in {text:?}");
    Ok(RemoteMemory {
        addr: u64::from_str_radix(addr, 16).map_err(|_| malformed("address", addr))?,
        len: u32::from_str_radix(len, 16).map_err(|_| malformed("length", len))?,
        rkey: u32::from_str_radix(rkey, 16).map_err(|_| malformed("rkey", rkey))?,
    })
}

impl Link {
    /// Sends the description of memory the peer may access.
    pub fn send_remote(&mut self, memory: &RemoteMemory) -> Result<(), String> {
        self.stream
            .write_all(&remote_to_record(memory))
            .map_err(|e| format!("couldn't send the remote memory: {}", describe(&e)))
    }

    /// Receives the description of memory the peer lets this side access.
    pub fn recv_remote(&mut self) -> Result<RemoteMemory, String> {
        let mut record = [0u8; REMOTE_RECORD_LEN];
        self.stream
            .read_exact(&mut record)
            .map_err(|e| format!("couldn't read the remote memory: {}", describe(&e)))?;
        parse_remote(&record)
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

    #[test]
    fn remote_records_round_trip_and_bad_ones_are_errors() {
        let memory = RemoteMemory {
            addr: 0xffff_8000_1234_5678,
            len: 0x1_0000,
            rkey: 0xdead_beef,
        };
        let record = remote_to_record(&memory);
        assert_eq!(parse_remote(&record), Ok(memory));
        for bad in [
            &b"1234:10"[..],
            b"1234:10:zz",
            b"10000000000000000:10:1",
            b"1:100000000:1",
            b"1:1:1:1",
            b"\xff:1:1",
            b"",
        ] {
            assert!(
                parse_remote(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
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

    /// A connected pair of links over loopback TCP.
    fn links() -> (Link, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let client = TcpStream::connect(addr).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        (Link { stream: server }, client)
    }

    #[test]
    fn the_end_handshake_waits_for_the_peers_marker() {
        let (link, client) = links();
        let peer = std::thread::spawn(move || Link { stream: client }.finish(EXCHANGE_TIMEOUT));
        assert_eq!(link.finish(EXCHANGE_TIMEOUT), Ok(PeerEnd::Finished));
        assert_eq!(peer.join().expect("peer"), Ok(PeerEnd::Finished));
    }

    #[test]
    fn a_closed_connection_ends_the_handshake_without_error() {
        // As a C peer does: it closes the connection right after the exchange.
        let (link, client) = links();
        drop(client);
        assert_eq!(link.finish(EXCHANGE_TIMEOUT), Ok(PeerEnd::Closed));
    }

    #[test]
    fn other_bytes_or_silence_fail_the_handshake() {
        let (link, mut client) = links();
        client.write_all(b"nope").expect("write");
        let error = link.finish(EXCHANGE_TIMEOUT).expect_err("wrong marker");
        assert!(error.contains("expected the end marker"), "{error}");

        // A peer that keeps the connection open and says nothing: the handshake gives up after
        // its timeout (1 s at least) with an error, however long the wait really was.
        let (link, _client) = links();
        let error = link
            .finish(Duration::from_secs(1))
            .expect_err("silent peer");
        assert!(error.contains("did not finish within 1 s"), "{error}");
    }

    #[test]
    fn the_server_reads_all_of_done_and_keeps_the_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        drop(listener);
        let mine = Dest {
            lid: 0,
            qpn: 0x12,
            psn: 0x345,
            gid: Gid::default(),
        };
        let server = std::thread::spawn(move || {
            let exchange = server_accept(port, 1)?;
            assert_eq!(exchange.remote, vec![mine]);
            exchange.reply(&[mine])?.finish(EXCHANGE_TIMEOUT)
        });
        let deadline = std::time::Instant::now() + EXCHANGE_TIMEOUT;
        let (remote, link) = loop {
            match client_exchange("127.0.0.1", port, &[mine]) {
                Ok(done) => break done,
                Err(e) if std::time::Instant::now() < deadline && e.contains("connect") => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(remote, vec![mine]);
        // The NUL after "done" was consumed by the server: the markers match exactly.
        assert_eq!(link.finish(EXCHANGE_TIMEOUT), Ok(PeerEnd::Finished));
        assert_eq!(server.join().expect("server"), Ok(PeerEnd::Finished));
    }
}
