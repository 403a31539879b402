//! Every decoder of bytes that come from another node, behind one entry point, [`decode`]: the
//! coverage-guided fuzzer's target (`examples/dsm/fuzz`, run by `cargo xtask fuzz` in the full
//! tier) and the unit tests that replay every input it ever crashed on. Bytes from the wire
//! must give a typed error, never a panic, an out-of-bounds index or an allocation the size of
//! a forged length: each decoder here is the function a node runs on that input.

use std::time::Instant;

use crate::client::parse_collective_done;
use crate::global::Placement;
use crate::home::{parse_collective, parse_diff, parse_get_page, parse_lock};
use crate::node::refusal;
use crate::rdma::parse_blob;
use crate::rendezvous::{parse_join, parse_join_reply};
use crate::stats::{Report, Stats};
use crate::tcp::Partial;
use crate::transport::parse_pages_head;
use crate::wire::{HEADER_LEN, Header, Msg, Op, Reader};

/// How many decoders [`decode`] chooses from.
pub const DECODERS: u8 = 8;

/// Runs one decoder on `data[1..]`, chosen by `data[0] % DECODERS`: 0, a message header; 1, a
/// whole message and its payload as its receiver reads it; 2, the TCP server's reassembly of
/// messages from chunks; 3, a node's statistics (and the report table made of them); 4, node
/// 0's reply to a collective call; 5, a rendezvous join record and the RDMA address in it; 6,
/// node 0's reply to the joins; 7, the contributions to an allocation's collective call.
/// Returns the decoder's number and whether it took the bytes (an error is the expected
/// answer to most inputs; a panic is the bug the fuzzer looks for), or `None` for no bytes.
pub fn decode(data: &[u8]) -> Option<(u8, bool)> {
    let (&which, rest) = data.split_first()?;
    let which = which % DECODERS;
    let took = match which {
        0 => rest
            .first_chunk::<HEADER_LEN>()
            .is_some_and(|raw| Header::decode(raw).is_ok()),
        1 => Msg::decode(rest.to_vec()).is_ok_and(payload),
        2 => reassemble(rest),
        3 => Stats::decode(rest).is_ok_and(|stats| {
            let report = Report {
                nodes: vec![stats.clone(), stats],
            };
            !report.table().is_empty()
        }),
        4 => rest
            .split_first()
            .is_some_and(|(&size, rest)| parse_collective_done(rest, u16::from(size)).is_ok()),
        5 => parse_join(rest).is_ok_and(|(_, size, _, blob)| parse_blob(blob, size).is_ok()),
        6 => rest.split_first().is_some_and(|(&size, rest)| {
            let size = u16::from(size % 16);
            parse_join_reply(rest, size)
                .is_ok_and(|blobs| blobs.iter().all(|blob| parse_blob(blob, size).is_ok()))
        }),
        _ => {
            // Contributions: each a length byte and that many bytes.
            let mut all = Vec::new();
            let mut at = rest;
            while let Some((&len, tail)) = at.split_first() {
                let len = usize::from(len).min(tail.len());
                all.push(tail[..len].to_vec());
                at = &tail[len..];
            }
            refusal(&all, 4096, Placement::Interleaved).is_ok()
        }
    };
    Some((which, took))
}

/// Reads `msg`'s payload with the function its receiver reads it with; whether it was taken.
fn payload(msg: Msg) -> bool {
    match msg.op {
        Op::GetPage => parse_get_page(&msg.payload).is_ok(),
        Op::Pages => parse_pages_head(&mut Reader::new(&msg.payload)).is_ok(),
        Op::Diff => parse_diff(&msg.payload, |page| {
            // A window of 2^16 pages, all this node's.
            if page < 1 << 16 {
                Ok(page as usize)
            } else {
                Err(crate::Error::protocol("not a home page"))
            }
        })
        .is_ok(),
        Op::Acquire | Op::Granted | Op::Release => parse_lock(&msg.payload).is_ok(),
        Op::Collective => parse_collective(&msg.payload).is_ok(),
        Op::CollectiveDone => parse_collective_done(&msg.payload, msg.to).is_ok(),
        Op::Fail => !msg.into_error(Op::DiffAck).to_string().is_empty(),
        Op::DiffAck | Op::Exit => true,
    }
}

/// Feeds `data[1..]` to a connection's reassembly in chunks of `1 + data[0] % 64` bytes;
/// whether every chunk was taken.
fn reassemble(data: &[u8]) -> bool {
    let Some((&chunk, rest)) = data.split_first() else {
        return false;
    };
    let mut partial = Partial::default();
    let mut out = Vec::new();
    rest.chunks(1 + usize::from(chunk % 64))
        .all(|piece| partial.push(piece, Instant::now(), &mut out).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Writer;

    fn message(op: Op, to: u16, payload: Vec<u8>) -> Vec<u8> {
        let mut m = Msg::new(op, 1, to).with(payload);
        m.seq = 7;
        let mut bytes = m.header().encode().to_vec();
        bytes.extend_from_slice(&m.payload);
        bytes
    }

    /// A valid input of every decoder and of every operation's payload, as `decode` takes it.
    fn seeds() -> Vec<Vec<u8>> {
        let w = |f: &dyn Fn(&mut Writer)| {
            let mut w = Writer::new();
            f(&mut w);
            w.done()
        };
        let diff = w(&|w| {
            w.u16(1).u32(3).u16(1).u16(10).u16(2).bytes(&[5, 6]);
        });
        let done = w(&|w| {
            w.u16(2).u32(1).bytes(&[1]).u32(0);
        });
        let collective = w(&|w| {
            w.u8(1).u32(4).u64(9).bytes(&[1, 2]);
        });
        let fail = w(&|w| {
            w.u8(1).u16(2).bytes(b"died");
        });
        // An RDMA blob for 2 nodes: the TCP address, then lid, gid, psn, frames, queue pairs.
        let blob = w(&|w| {
            w.u16(3).bytes(b"tcp").u16(1).bytes(&[0; 16]).u32(5);
            w.u64(0x1000).u32(4096).u32(77).u16(2);
            w.u32(10).u32(11).u32(12).u32(13);
        });
        let join = w(&|w| {
            w.u16(1).u16(2).u64(99).bytes(&blob);
        });
        let reply = w(&|w| {
            w.u8(0)
                .u32(blob.len() as u32)
                .bytes(&blob)
                .u32(blob.len() as u32)
                .bytes(&blob);
        });
        let mut seeds = vec![
            [
                &[0u8][..],
                &message(Op::DiffAck, 0, Vec::new())[..HEADER_LEN],
            ]
            .concat(),
            [&[2u8, 5][..], &message(Op::Acquire, 0, vec![3, 0, 0, 0])].concat(),
            [&[3u8][..], &Stats::default().encode()].concat(),
            [&[4u8, 2][..], &done].concat(),
            [&[5u8][..], &join].concat(),
            [&[6u8, 2][..], &reply].concat(),
            // Node 1 of two refuses: needed 9, allowed 4, limit 65530.
            [
                &[7u8, 1, 1, 25, 0][..],
                &w(&|w| {
                    w.u64(9).u64(4).u64(65_530);
                }),
            ]
            .concat(),
        ];
        for (op, payload) in [
            (Op::GetPage, vec![1, 0, 0, 0, 2, 0]),
            (Op::Pages, vec![2, 0, 1, 0, 0, 0]),
            (Op::Diff, diff),
            (Op::DiffAck, Vec::new()),
            (Op::Acquire, vec![3, 0, 0, 0]),
            (Op::Granted, vec![3, 0, 0, 0]),
            (Op::Release, vec![3, 0, 0, 0]),
            (Op::Collective, collective),
            (Op::CollectiveDone, done.clone()),
            (Op::Exit, Vec::new()),
            (Op::Fail, fail),
        ] {
            seeds.push([&[1u8][..], &message(op, 2, payload)].concat());
        }
        seeds
    }

    /// Every decoder, and every operation's payload, takes its valid input through
    /// [`decode`]: the fuzzer's target reaches each of them past its first check.
    #[test]
    fn every_decoder_takes_its_valid_input() {
        let seeds = seeds();
        let mut reached = [false; DECODERS as usize];
        for seed in &seeds {
            let (which, took) = decode(seed).expect("bytes");
            assert!(took, "decoder {which} refused its seed {seed:?}");
            reached[usize::from(which)] = true;
        }
        assert_eq!(reached, [true; DECODERS as usize]);
        assert_eq!(seeds.len(), 7 + 11, "a seed per decoder and per operation");
        // The Diff seed's runs, as the home reads them.
        let msg = Msg::decode(seeds[9][1..].to_vec()).expect("a Diff message");
        let (count, runs) = parse_diff(&msg.payload, |p| Ok(p as usize)).expect("its runs");
        assert_eq!((count, runs), (1, vec![(3, 10, &[5u8, 6][..])]));
        // The refusal seed names node 1's numbers.
        let refused = refusal(
            &[vec![1], seeds[6][4..].to_vec()],
            4096,
            Placement::Interleaved,
        );
        assert!(
            matches!(
                refused,
                Ok(Some(crate::Error::MapLimit {
                    needed: 9,
                    allowed: 4,
                    limit: 65_530,
                    ..
                }))
            ),
            "{refused:?}"
        );
    }

    /// Inputs the decoders must take without a panic: every decoder on short, long, zero,
    /// all-ones and pseudo-random bytes, and every seed with each byte changed.
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
