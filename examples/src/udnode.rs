//! One UD endpoint of the connection-manager tools (`udaddy`, `mckey`): an identifier, its
//! queue pair in RTS with receives posted, its queues and buffers, and checked sends and
//! receives of datagrams.

use std::time::{Duration, Instant};

use rdma_cm::CmId;
use rdma_cm::rdma_verbs::{
    AddressHandle, BufferPool, Completion, CompletionQueue, GRH_LEN, QueuePair, Rts, SendRequest,
    Ud, WcOpcode, WcStatus,
};

/// One connection: its identifier, UD queue pair (RTS), queues and buffers, and where the
/// peer's datagrams go once known.
#[derive(Debug)]
pub struct UdNode {
    /// The identifier.
    pub id: CmId,
    /// Its UD queue pair.
    pub qp: QueuePair<Ud, Rts>,
    /// The send queue's completions.
    pub send_cq: CompletionQueue,
    /// The receive queue's completions.
    pub recv_cq: CompletionQueue,
    /// Buffers of the message size plus the GRH.
    pub pool: BufferPool,
    /// Where datagrams go: address handle, queue pair number and Q_Key.
    pub peer: Option<(AddressHandle, u32, u32)>,
}

impl UdNode {
    /// The queue pair and buffers on `id`'s device, receives posted: `count` datagrams of
    /// `size` bytes fit (after checking `size` against the port's active MTU).
    pub fn new(id: CmId, count: usize, size: usize) -> Result<Self, String> {
        let context = id.context().map_err(|e| e.to_string())?;
        let port = context
            .query_port(id.port_num())
            .map_err(|e| e.to_string())?;
        let mtu = port.active_mtu.bytes().unwrap_or(256) as usize;
        if count > 0 && size > mtu {
            return Err(format!(
                "message_size {size} is larger than active mtu {mtu}"
            ));
        }
        let pd = context
            .alloc_pd()
            .map_err(|e| format!("unable to allocate PD: {e}"))?;
        let depth = count.max(1);
        let queue = u32::try_from(depth * 2).map_err(|e| e.to_string())?;
        let send_cq = context
            .create_cq(queue)
            .map_err(|e| format!("unable to create CQ: {e}"))?;
        let recv_cq = context
            .create_cq(queue)
            .map_err(|e| format!("unable to create CQ: {e}"))?;
        let depth_u32 = u32::try_from(depth).map_err(|e| e.to_string())?;
        let qp = pd
            .qp_builder::<Ud>(&send_cq, &recv_cq)
            .max_send_wr(depth_u32)
            .max_recv_wr(depth_u32)
            .build()
            .map_err(|e| format!("unable to create QP: {e}"))?;
        let qp = id.ready_ud_qp(qp).map_err(|e| e.to_string())?;
        let pool = BufferPool::new(&pd, depth * 2, size + GRH_LEN)
            .map_err(|e| format!("failed message allocation: {e}"))?;
        let mut node = Self {
            id,
            qp,
            send_cq,
            recv_cq,
            pool,
            peer: None,
        };
        for i in 0..count {
            let buf = node.pool.take().ok_or("out of buffers")?;
            node.qp
                .post_recv_buf(buf, i as u64)
                .map_err(|e| format!("failed to post receives: {}", e.error()))?;
        }
        Ok(node)
    }

    /// Sends `payloads` to the peer, each with this queue pair's number as immediate data,
    /// and reaps the sends.
    pub fn send_all(&mut self, payloads: &[Vec<u8>], timeout: Duration) -> Result<(), String> {
        let (ah, qpn, qkey) = self.peer.as_ref().ok_or("no peer")?;
        let own = self.qp.qp_num();
        for data in payloads {
            let mut buf = self.pool.take().ok_or("out of buffers")?;
            buf.fill_from(data).map_err(|e| e.to_string())?;
            self.qp
                .post_send_owned(SendRequest::send(buf).with_imm(own).to(ah, *qpn, *qkey))
                .map_err(|e| format!("failed to post sends: {}", e.error()))?;
        }
        for _ in payloads {
            let done = next(&mut self.send_cq, timeout, "send")?;
            expect(&done, WcOpcode::Send, "send")?;
        }
        Ok(())
    }

    /// Reaps `count` receives of `size` bytes each, checked: a `Recv` whose immediate data is
    /// its source queue pair (`from`, when known). Returns the completions.
    pub fn receive_all(
        &mut self,
        count: usize,
        size: usize,
        from: Option<u32>,
        timeout: Duration,
    ) -> Result<Vec<Completion>, String> {
        let mut got = Vec::with_capacity(count);
        for i in 0..count {
            let done = next(&mut self.recv_cq, timeout, "receive")?;
            expect(&done, WcOpcode::Recv, "receive")?;
            let wc = done.wc();
            let src = from.unwrap_or(wc.src_qp());
            if wc.imm_data() != Some(src) || wc.src_qp() != src {
                return Err(format!(
                    "datagram {i}: immediate data {:?}, source queue pair {:#x}, expected {src:#x}",
                    wc.imm_data(),
                    wc.src_qp()
                ));
            }
            if wc.byte_len() as usize != size + GRH_LEN {
                return Err(format!(
                    "datagram {i}: {} bytes, expected {} (GRH and {size})",
                    wc.byte_len(),
                    size + GRH_LEN
                ));
            }
            got.push(done);
        }
        Ok(got)
    }
}

/// The next completion of `cq` within `timeout`.
pub fn next(cq: &mut CompletionQueue, timeout: Duration, what: &str) -> Result<Completion, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut got = None;
        cq.poll_each(1, |c| got = Some(c))
            .map_err(|e| format!("failed polling CQ: {e}"))?;
        if let Some(done) = got {
            return Ok(done);
        }
        if Instant::now() >= deadline {
            return Err(format!("no {what} completion in {timeout:?}"));
        }
        std::thread::yield_now();
    }
}

/// Checks that `done` succeeded with `opcode`.
pub fn expect(done: &Completion, opcode: WcOpcode, what: &str) -> Result<(), String> {
    let wc = done.wc();
    if wc.status() != WcStatus::Success || wc.opcode() != opcode {
        return Err(format!(
            "{what} completion: {:?} {:?} (vendor error {:#x})",
            wc.status(),
            wc.opcode(),
            wc.vendor_err()
        ));
    }
    Ok(())
}
