//! What `rdma_server` and `rdma_client` share: the endpoint's queue pair as rdma-core's
//! programs make it (one request each way, one scatter entry, 16 bytes inline, every send
//! signaled), its one 16-byte message each way, and the closing lines.

use std::time::{Duration, Instant};

use rdma_cm::Endpoint;
use rdma_cm::rdma_verbs::{
    BufferPool, Completion, CompletionQueue, Init, QueuePair, Rc, Rts, SendRequest, WcOpcode,
    WcStatus,
};

/// The size of the one message each way.
pub const MESSAGE: usize = 16;

/// The endpoint queue pair's queue and buffers.
#[derive(Debug)]
pub struct Side {
    /// Its completion queue, for sends and receives.
    pub cq: CompletionQueue,
    /// Its two buffers.
    pub pool: BufferPool,
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
    let pool = BufferPool::new(&pd, 2, MESSAGE).map_err(|e| format!("buffers: {e}"))?;
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
    let buf = pool.take().ok_or("no buffer")?;
    qp.post_recv_buf(buf, 1)
        .map_err(|e| format!("rdma_post_recv: {e}"))?;
    Ok((qp, Side { cq, pool }))
}

/// Posts a send of `data` (16 bytes).
pub fn send(qp: &mut QueuePair<Rc, Rts>, side: &Side, data: &[u8]) -> Result<(), String> {
    let mut buf = side.pool.take().ok_or("no buffer")?;
    buf.fill_from(data).map_err(|e| e.to_string())?;
    qp.post_send_owned(SendRequest::send(buf).tag(2))
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
    while !missing.is_empty() {
        let mut got: Option<Completion> = None;
        side.cq
            .poll_each(1, |c| got = Some(c))
            .map_err(|e| format!("ibv_poll_cq: {e}"))?;
        let Some(mut done) = got else {
            if Instant::now() >= deadline {
                return Err(format!("no completion of {missing:?} in {timeout:?}"));
            }
            std::thread::yield_now();
            continue;
        };
        let opcode = done.wc().opcode();
        let what = if opcode == WcOpcode::Recv {
            "rdma_get_recv_comp"
        } else {
            "rdma_get_send_comp"
        };
        if done.status() != WcStatus::Success {
            return Err(format!("{what}: {} ({opcode:?})", done.status()));
        }
        let Some(at) = missing.iter().position(|&w| w == opcode) else {
            return Err(format!("{what}: an unexpected {opcode:?} completion"));
        };
        missing.remove(at);
        if opcode == WcOpcode::Recv {
            let len = done.wc().byte_len() as usize;
            let buf = done.take_buf().ok_or("a receive without its buffer")?;
            message = Some(buf[..len.min(MESSAGE)].to_vec());
        }
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
