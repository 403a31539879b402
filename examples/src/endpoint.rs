//! What `rdma_server` and `rdma_client` share: the endpoint's queue pair as rdma-core's
//! programs make it (one request each way, one scatter entry, 16 bytes inline, every send
//! signaled), its one 16-byte message each way, from a slot ring, and the closing lines.

use std::time::{Duration, Instant};

use rdma_cm::Endpoint;
use rdma_cm::rdma_verbs::{
    CompletionQueue, QueuePair,
    cq::{WcOpcode, WcStatus, WorkCompletion},
    qp::{Init, Rc, Rts},
    slot::SlotRing,
    wr::{RecvRequest, SendRequest},
};

/// The size of the one message each way.
pub const MESSAGE: usize = 16;

/// The endpoint queue pair's queue and slots.
#[derive(Debug)]
pub struct Side {
    /// Its completion queue, for sends and receives.
    pub cq: CompletionQueue,
    /// Its two slots: the receive's and the send's.
    pub ring: SlotRing,
}

/// Makes `ep`'s queue pair through the connection manager (in INIT) and posts its one
/// receive.
pub fn side(ep: &Endpoint) -> Result<(QueuePair<Rc, Init>, Side), String> {
    let context = ep
        .context()
        .map_err(|e| format!("the endpoint's device: {e}"))?;
    let pd = context
        .alloc_pd()
        .map_err(|e| format!("ibv_alloc_pd: {e}"))?;
    let cq = context
        .create_cq(4)
        .map_err(|e| format!("ibv_create_cq: {e}"))?;
    let builder = pd
        .qp_builder::<Rc>(&cq, &cq)
        .max_send_wr(1)
        .max_recv_wr(1)
        .max_send_sge(1)
        .max_recv_sge(1)
        .max_inline_data(MESSAGE as u32)
        .sq_sig_all(true);
    let mut qp = ep
        .create_qp(builder)
        .map_err(|e| format!("rdma_create_qp: {e}"))?;
    let mut ring = qp
        .slot_ring(2, MESSAGE)
        .map_err(|e| format!("buffers: {e}"))?;
    let slot = ring.take().ok_or("no buffer")?;
    qp.post_recv_slot(&mut ring, RecvRequest::new(slot).tag(1))
        .map_err(|e| format!("rdma_post_recv: {e}"))?;
    Ok((qp, Side { cq, ring }))
}

/// Posts a send of `data` (16 bytes).
pub fn send(qp: &mut QueuePair<Rc, Rts>, side: &mut Side, data: &[u8]) -> Result<(), String> {
    let mut slot = side.ring.take().ok_or("no buffer")?;
    side.ring.fill(&mut slot, data).map_err(|e| e.to_string())?;
    qp.post_send_slot(&mut side.ring, SendRequest::send(slot).tag(2))
        .map_err(|e| format!("rdma_post_send: {e}"))
}

/// Waits for one successful completion of each opcode of `want`, in any order (one queue
/// serves both directions: a reply may complete before the send's acknowledgement); returns
/// the message a receive among them carried.
pub fn complete(
    side: &mut Side,
    want: &[WcOpcode],
    timeout: Duration,
) -> Result<Option<Vec<u8>>, String> {
    let deadline = Instant::now() + timeout;
    let mut missing = want.to_vec();
    let mut message = None;
    let mut wcs = [WorkCompletion::default(); 1];
    while !missing.is_empty() {
        let wc = match side
            .cq
            .poll(&mut wcs)
            .map_err(|e| format!("ibv_poll_cq: {e}"))?
        {
            [wc] => *wc,
            _ if Instant::now() >= deadline => {
                return Err(format!("no completion of {missing:?} in {timeout:?}"));
            }
            _ => {
                std::thread::yield_now();
                continue;
            }
        };
        let slot = side.ring.complete(&wc);
        let opcode = wc.opcode();
        let what = if wc.is_recv() {
            "rdma_get_recv_comp"
        } else {
            "rdma_get_send_comp"
        };
        if wc.status() != WcStatus::Success {
            return Err(format!("{what}: {} ({opcode:?})", wc.status()));
        }
        let Some(at) = missing.iter().position(|&w| w == opcode) else {
            return Err(format!("{what}: an unexpected {opcode:?} completion"));
        };
        missing.remove(at);
        let slot = slot.ok_or_else(|| format!("{what}: a completion of no request of ours"))?;
        if opcode == WcOpcode::Recv {
            let bytes = side.ring.bytes(&slot).map_err(|e| e.to_string())?;
            message = Some(bytes[..bytes.len().min(MESSAGE)].to_vec());
        }
        side.ring.put(slot).map_err(|e| e.to_string())?;
    }
    Ok(message)
}

/// The bytes as hex, for `-v`.
pub fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join("")
}

/// Ends as rdma-core's programs do: `PROGRAM: end 0`, or the error on stderr and
/// `PROGRAM: end -1` with a non-zero exit.
pub fn finish(program: &str, result: Result<(), String>) {
    match result {
        Ok(()) => println!("{program}: end 0"),
        Err(message) => {
            eprintln!("{program}: {message}");
            println!("{program}: end -1");
            std::process::exit(1);
        }
    }
}
