//! Messages: a 16-byte header and an exact-length payload (docs/dsm.md, "Messages").
//!
//! Header, little-endian: operation `u8`, flags `u8`, sender `u16`, receiver `u16`, reserved
//! `u16` (zero), sequence `u32`, payload length `u32`. Payload fields are little-endian too and
//! read through [`Reader`], which refuses short or overlong payloads with
//! [`Error::Protocol`]: a value from the wire never panics or indexes out of bounds.

use crate::error::{Error, Result};

/// The header's length in bytes.
pub(crate) const HEADER_LEN: usize = 16;

/// The largest payload accepted (a gather of every node's statistics, a prefetch of many pages).
pub(crate) const MAX_PAYLOAD: usize = 16 << 20;

/// The operations (docs/dsm.md has the table of requests and replies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Op {
    /// Request pages from their home: page `u32`, count `u16`.
    GetPage = 1,
    /// Reply to `GetPage`: count `u16`, first page `u32`, then the pages' bytes (the count
    /// asked for, consecutive pages).
    Pages = 2,
    /// Changes to home pages: count `u16`, per page: number `u32`, runs `u16`, per run offset
    /// `u16`, length `u16`, bytes.
    Diff = 3,
    /// Reply to `Diff`: every run is in the home copy.
    DiffAck = 4,
    /// Request a lock from its manager: lock `u32`.
    Acquire = 5,
    /// Reply to `Acquire` once the lock is the requester's: lock `u32`.
    Granted = 6,
    /// Give a lock back: lock `u32`; no reply.
    Release = 7,
    /// A collective call arriving at node 0: kind `u8`, sequence `u32`, digest `u64`, then the
    /// node's contribution.
    Collective = 8,
    /// Node 0's reply once every node made the call: count `u16`, per node a length `u32` and
    /// its contribution.
    CollectiveDone = 9,
    /// The sender leaves: it sends nothing more on this connection.
    Exit = 10,
    /// The request cannot be served: kind `u8`, rank `u16`, then UTF-8 text.
    Fail = 11,
}

impl Op {
    fn from_u8(value: u8) -> Option<Op> {
        Some(match value {
            1 => Op::GetPage,
            2 => Op::Pages,
            3 => Op::Diff,
            4 => Op::DiffAck,
            5 => Op::Acquire,
            6 => Op::Granted,
            7 => Op::Release,
            8 => Op::Collective,
            9 => Op::CollectiveDone,
            10 => Op::Exit,
            11 => Op::Fail,
            _ => return None,
        })
    }
}

/// A decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) op: Op,
    pub(crate) flags: u8,
    pub(crate) from: u16,
    pub(crate) to: u16,
    pub(crate) seq: u32,
    pub(crate) len: u32,
}

impl Header {
    /// The header's bytes.
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0] = self.op as u8;
        out[1] = self.flags;
        out[2..4].copy_from_slice(&self.from.to_le_bytes());
        out[4..6].copy_from_slice(&self.to.to_le_bytes());
        out[8..12].copy_from_slice(&self.seq.to_le_bytes());
        out[12..16].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Decodes and checks a header: a known operation, the reserved bytes zero, a payload no
    /// longer than [`MAX_PAYLOAD`].
    pub(crate) fn decode(bytes: &[u8; HEADER_LEN]) -> Result<Header> {
        let op = Op::from_u8(bytes[0])
            .ok_or_else(|| Error::protocol(format!("unknown operation {}", bytes[0])))?;
        if bytes[6] != 0 || bytes[7] != 0 {
            return Err(Error::protocol("reserved header bytes are not zero"));
        }
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let u32_at =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let len = u32_at(12);
        if len as usize > MAX_PAYLOAD {
            return Err(Error::protocol(format!(
                "a {len}-byte payload (at most {MAX_PAYLOAD})"
            )));
        }
        Ok(Header {
            op,
            flags: bytes[1],
            from: u16_at(2),
            to: u16_at(4),
            seq: u32_at(8),
            len,
        })
    }
}

/// A whole message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Msg {
    pub(crate) op: Op,
    pub(crate) flags: u8,
    pub(crate) from: u16,
    pub(crate) to: u16,
    pub(crate) seq: u32,
    pub(crate) payload: Vec<u8>,
}

impl Msg {
    /// Decodes a whole message (header and payload, as received in one buffer); the header's
    /// length must match.
    pub(crate) fn decode(mut bytes: Vec<u8>) -> Result<Msg> {
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(
            bytes
                .get(..HEADER_LEN)
                .ok_or_else(|| Error::protocol(format!("a {}-byte message", bytes.len())))?,
        );
        let h = Header::decode(&header)?;
        if h.len as usize != bytes.len() - HEADER_LEN {
            return Err(Error::protocol(format!(
                "a message of {} bytes whose header says {}",
                bytes.len() - HEADER_LEN,
                h.len
            )));
        }
        Ok(Msg::from_header(h, bytes.split_off(HEADER_LEN)))
    }

    /// The message with header `h` and `payload` (whose length the caller checked).
    pub(crate) fn from_header(h: Header, payload: Vec<u8>) -> Msg {
        Msg {
            op: h.op,
            flags: h.flags,
            from: h.from,
            to: h.to,
            seq: h.seq,
            payload,
        }
    }

    /// A message with an empty payload.
    pub(crate) fn new(op: Op, from: u16, to: u16) -> Msg {
        Msg {
            op,
            flags: 0,
            from,
            to,
            seq: 0,
            payload: Vec::new(),
        }
    }

    /// This message with `payload`.
    pub(crate) fn with(mut self, payload: Vec<u8>) -> Msg {
        self.payload = payload;
        self
    }

    /// This message's header.
    pub(crate) fn header(&self) -> Header {
        Header {
            op: self.op,
            flags: self.flags,
            from: self.from,
            to: self.to,
            seq: self.seq,
            // A payload over MAX_PAYLOAD is refused by every receiver; the senders build none.
            len: u32::try_from(self.payload.len()).unwrap_or(u32::MAX),
        }
    }

    /// A `Fail` reply to this request.
    pub(crate) fn fail(&self, me: u16, kind: FailKind, rank: u16, text: &str) -> Msg {
        let mut w = Writer::new();
        w.u8(kind as u8).u16(rank).bytes(text.as_bytes());
        let mut reply = Msg::new(Op::Fail, me, self.from).with(w.done());
        reply.seq = self.seq;
        reply
    }

    /// The error a `Fail` message carries (for any other message, a protocol error naming the
    /// operation `expected`).
    pub(crate) fn into_error(self, expected: Op) -> Error {
        if self.op != Op::Fail {
            return Error::protocol(format!("{:?} where {expected:?} was due", self.op));
        }
        let mut r = Reader::new(&self.payload);
        let (Ok(kind), Ok(rank)) = (r.u8(), r.u16()) else {
            return Error::protocol("a short Fail message");
        };
        let text = String::from_utf8_lossy(r.rest()).into_owned();
        match kind {
            k if k == FailKind::Unequal as u8 => Error::UnequalCollective(text),
            k if k == FailKind::Peer as u8 => Error::peer(rank, text),
            _ => Error::protocol(format!("node {} reports: {text}", self.from)),
        }
    }
}

/// What a `Fail` message reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum FailKind {
    /// A node (the rank field) died or stopped answering.
    Peer = 0,
    /// Unequal collective calls.
    Unequal = 1,
    /// The request broke the protocol.
    Protocol = 2,
}

/// Builds a payload.
#[derive(Debug, Default)]
pub(crate) struct Writer(Vec<u8>);

impl Writer {
    pub(crate) fn new() -> Writer {
        Writer(Vec::new())
    }
    pub(crate) fn with_capacity(n: usize) -> Writer {
        Writer(Vec::with_capacity(n))
    }
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub(crate) fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
    pub(crate) fn done(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

/// Reads a payload; every read past its end is [`Error::Protocol`].
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(payload: &'a [u8]) -> Reader<'a> {
        Reader { rest: payload }
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.rest.len() < n {
            return Err(Error::protocol(format!(
                "a payload ends {} bytes short",
                n - self.rest.len()
            )));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        let mut w = [0u8; 8];
        w.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(w))
    }
    /// What is left, consumed.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.rest)
    }
    /// Fails unless the whole payload was read.
    pub(crate) fn finish(&self) -> Result<()> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(Error::protocol(format!(
                "{} unexpected bytes after a payload",
                self.rest.len()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_bad_ones_are_refused() {
        let h = Header {
            op: Op::Diff,
            flags: 1,
            from: 3,
            to: 65535,
            seq: 0xdead_beef,
            len: 4096,
        };
        let bytes = h.encode();
        assert_eq!(bytes[0], 3);
        assert_eq!(&bytes[12..16], &4096u32.to_le_bytes());
        assert_eq!(Header::decode(&bytes).unwrap(), h);

        let mut unknown = bytes;
        unknown[0] = 0;
        assert!(
            matches!(Header::decode(&unknown), Err(Error::Protocol(m)) if m == "unknown operation 0")
        );
        let mut reserved = bytes;
        reserved[7] = 1;
        assert!(matches!(Header::decode(&reserved), Err(Error::Protocol(_))));
        let mut long = bytes;
        long[12..16].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_le_bytes());
        assert!(matches!(Header::decode(&long), Err(Error::Protocol(_))));
    }

    #[test]
    fn readers_refuse_short_and_overlong_payloads() {
        let mut w = Writer::new();
        w.u8(7).u16(0x1234).u32(5).u64(u64::MAX).bytes(b"ab");
        let p = w.done();
        let mut r = Reader::new(&p);
        assert_eq!(r.u8().unwrap(), 7);
        assert_eq!(r.u16().unwrap(), 0x1234);
        assert!(r.finish().is_err());
        assert_eq!(r.u32().unwrap(), 5);
        assert_eq!(r.u64().unwrap(), u64::MAX);
        assert!(matches!(r.u32(), Err(Error::Protocol(m)) if m == "a payload ends 2 bytes short"));
        assert_eq!(r.take(2).unwrap(), b"ab");
        r.finish().unwrap();
    }

    #[test]
    fn fail_messages_carry_their_error() {
        let req = Msg::new(Op::Collective, 2, 0);
        let fail = req.fail(0, FailKind::Peer, 1, "died");
        assert_eq!(fail.to, 2);
        assert!(
            matches!(fail.into_error(Op::CollectiveDone), Error::Peer { rank: 1, what } if what == "died")
        );
        let fail = req.fail(0, FailKind::Unequal, 0, "barrier vs alloc");
        assert!(matches!(
            fail.into_error(Op::CollectiveDone),
            Error::UnequalCollective(_)
        ));
        let other = Msg::new(Op::Pages, 1, 2);
        assert!(
            matches!(other.into_error(Op::DiffAck), Error::Protocol(m) if m == "Pages where DiffAck was due")
        );
        let short = Msg::new(Op::Fail, 1, 2).with(vec![0]);
        assert!(matches!(short.into_error(Op::DiffAck), Error::Protocol(_)));
    }
}
