//! Every decoder of bytes that come from another node, behind one entry point, [`decode`]: the
//! coverage-guided fuzzer's target (`examples/dsm/fuzz`, run by `cargo xtask fuzz` in the full
//! tier) and the unit tests that replay every input it ever crashed on. Bytes from the wire
//! must give a typed error, never a panic, an out-of-bounds index or an allocation the size of
//! a forged length: each decoder here is the one a node runs on that input.

use std::time::Instant;

use crate::client::parse_collective_done;
use crate::global::Placement;
use crate::home::{Kind, parse_diff};
use crate::node::refusal;
use crate::rdma::parse_blob;
use crate::rendezvous::{parse_join, parse_join_reply};
use crate::stats::Stats;
use crate::tcp::Partial;
use crate::wire::{HEADER_LEN, Header, Msg, Op, Reader};

/// How many decoders [`decode`] chooses from.
pub const DECODERS: u8 = 8;

/// Runs one decoder on `data[1..]`, chosen by `data[0] % DECODERS`: a message header; a whole
/// message and its payload as its operation reads it; the TCP server's reassembly of messages
/// from chunks; a node's statistics; node 0's reply to a collective call; a rendezvous join
/// record and the RDMA address in it; node 0's reply to the joins; the contributions to an
/// allocation's collective call. Errors are the expected outcome and are dropped; a panic is
/// the bug the fuzzer looks for.
pub fn decode(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % DECODERS {
        0 => {
            if let Some(raw) = rest.first_chunk::<HEADER_LEN>() {
                let _ = Header::decode(raw);
            }
        }
        1 => {
            if let Ok(msg) = Msg::decode(rest.to_vec()) {
                payload(msg);
            }
        }
        2 => reassemble(rest),
        3 => {
            let _ = Stats::decode(rest);
        }
        4 => {
            if let Some((&size, rest)) = rest.split_first() {
                let _ = parse_collective_done(rest, u16::from(size));
            }
        }
        5 => {
            if let Ok((_, size, _, blob)) = parse_join(rest) {
                let _ = parse_blob(blob, size);
            }
        }
        6 => {
            if let Some((&size, rest)) = rest.split_first() {
                let size = u16::from(size % 16);
                for blob in parse_join_reply(rest, size).unwrap_or_default() {
                    let _ = parse_blob(&blob, size);
                }
            }
        }
        _ => {
            // Contributions: each a length byte and that many bytes.
            let mut all = Vec::new();
            let mut at = rest;
            while let Some((&len, tail)) = at.split_first() {
                let len = usize::from(len).min(tail.len());
                all.push(tail[..len].to_vec());
                at = &tail[len..];
            }
            let _ = refusal(&all, 4096, Placement::Interleaved);
        }
    }
}

/// Reads `msg`'s payload as the node that receives it does.
fn payload(msg: Msg) {
    let mut r = Reader::new(&msg.payload);
    let _ = match msg.op {
        Op::GetPage => r.u32().and(r.u16()).and(r.finish()),
        Op::Pages => r.u16().and(r.u32()).map(drop),
        Op::Diff => parse_diff(&msg.payload, |page| {
            // A window of 2^16 pages, all this node's.
            if page < 1 << 16 {
                Ok(page as usize)
            } else {
                Err(crate::Error::protocol("not a home page"))
            }
        })
        .map(drop),
        Op::Acquire | Op::Granted | Op::Release => r.u32().and(r.finish()),
        Op::Collective => r.u8().map(|kind| {
            let _ = Kind::from_u8(kind);
            let _ = (r.u32(), r.u64(), r.rest());
        }),
        Op::CollectiveDone => parse_collective_done(&msg.payload, msg.to).map(drop),
        Op::Fail => {
            let _ = msg.into_error(Op::DiffAck).to_string();
            Ok(())
        }
        Op::DiffAck | Op::Exit => Ok(()),
    };
}

/// Feeds `data[1..]` to a connection's reassembly in chunks of `1 + data[0] % 64` bytes.
fn reassemble(data: &[u8]) {
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let mut partial = Partial::default();
    let mut out = Vec::new();
    for piece in rest.chunks(1 + usize::from(chunk % 64)) {
        if partial.push(piece, Instant::now(), &mut out).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Writer;

    /// Inputs the decoders must take without a panic: every decoder on short, long, zero,
    /// all-ones and pseudo-random bytes, and valid encodings with each byte changed.
    #[test]
    fn every_decoder_takes_any_bytes_without_panicking() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        for which in 0..DECODERS {
            for len in 0..64 {
                for fill in [0u8, 0xff] {
                    let mut input = vec![fill; len + 1];
                    input[0] = which;
                    decode(&input);
                }
            }
            for _ in 0..20_000 {
                let len = (next() % 160) as usize;
                let mut input: Vec<u8> = (0..=len).map(|_| next() as u8).collect();
                input[0] = which;
                decode(&input);
            }
        }
        for seed in seeds() {
            for at in 1..seed.len() {
                for flip in [0x01u8, 0x80, 0xff] {
                    let mut input = seed.clone();
                    input[at] ^= flip;
                    decode(&input);
                }
            }
        }
    }

    /// Valid inputs of each decoder, which it reads without an error (so the fuzzer's
    /// decoders do reach past their first check).
    fn seeds() -> Vec<Vec<u8>> {
        let message = |op: Op, payload: Vec<u8>| {
            let mut m = Msg::new(op, 1, 0).with(payload);
            m.seq = 7;
            let mut bytes = m.header().encode().to_vec();
            bytes.extend_from_slice(&m.payload);
            bytes
        };
        let mut diff = Writer::new();
        diff.u16(1).u32(3).u16(1).u16(10).u16(2).bytes(&[5, 6]);
        let mut done = Writer::new();
        done.u16(2).u32(1).bytes(&[1]).u32(0);
        let seeds = vec![
            [&[1u8][..], &message(Op::Diff, diff.done())].concat(),
            [&[1u8][..], &message(Op::GetPage, vec![1, 0, 0, 0, 2, 0])].concat(),
            [&[2u8, 5][..], &message(Op::Acquire, vec![3, 0, 0, 0])].concat(),
            [&[4u8, 2][..], &done.done()].concat(),
            [&[3u8][..], &Stats::default().encode()].concat(),
        ];
        seeds
    }

    #[test]
    fn the_seeds_decode_without_an_error() {
        let seeds = seeds();
        let msg = Msg::decode(seeds[0][1..].to_vec()).expect("a Diff message");
        let (count, runs) = parse_diff(&msg.payload, |p| Ok(p as usize)).expect("its runs");
        assert_eq!((count, runs), (1, vec![(3, 10, &[5u8, 6][..])]));
        let mut out = Vec::new();
        Partial::default()
            .push(&seeds[2][2..], Instant::now(), &mut out)
            .expect("a whole message");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].op, Op::Acquire);
        assert_eq!(
            parse_collective_done(&seeds[3][2..], u16::from(seeds[3][1])).expect("two"),
            [vec![1u8], vec![]]
        );
        assert_eq!(
            Stats::decode(&seeds[4][1..]).expect("stats"),
            Stats::default()
        );
    }

    /// Every input the fuzzer crashed on (`examples/dsm/fuzz/regressions/`, one file each,
    /// added when it was fixed) decodes without a panic.
    #[test]
    fn inputs_the_fuzzer_crashed_on_stay_fixed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
        let entries = std::fs::read_dir(&dir).expect("the regressions folder");
        let mut replayed = 0;
        for entry in entries {
            let path = entry.expect("an entry").path();
            if path.extension().is_some_and(|e| e == "md") {
                continue;
            }
            decode(&std::fs::read(&path).expect("an input"));
            replayed += 1;
        }
        // The folder's README lists them; the count here is checked against it.
        let readme = std::fs::read_to_string(dir.join("README.md")).expect("its README");
        let listed = readme.lines().filter(|l| l.starts_with("- `")).count();
        assert_eq!(
            replayed, listed,
            "every input in the folder is listed in its README"
        );
    }
}
