//! One UD endpoint of the connection-manager tools (`udaddy`, `mckey`): an identifier, its
//! queue pair in RTS with receives posted, its queues and slot rings, and checked sends and
//! receives of datagrams.

use std::time::Duration;

use rdma_cm::CmId;
use rdma_cm::rdma_verbs::{
    AddressHandle, CompletionQueue, QueuePair,
    ah::GRH_LEN,
    cq::{WcOpcode, WcStatus, WorkCompletion},
    qp::{Rts, Ud},
    slot::SlotRing,
    wr::{RecvRequest, SendRequest},
};

/// One connection: its identifier, UD queue pair (RTS), queues and slot rings, and where the
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
    /// The receives' slots: the message size plus the GRH.
    pub rx: SlotRing,
    /// The sends' slots: the message size.
    pub tx: SlotRing,
    /// Where datagrams go: address handle, queue pair number and Q_Key.
    pub peer: Option<(AddressHandle, u32, u32)>,
}

/// A datagram received: its completion and its bytes, the 40-byte GRH first.
#[derive(Debug, Clone)]
pub struct Datagram {
    /// The receive's completion.
    pub wc: WorkCompletion,
    /// What arrived, GRH included.
    pub bytes: Vec<u8>,
}

impl UdNode {
    /// The queue pair and slot rings on `id`'s device, receives posted: `count` datagrams of
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
        let depth = u32::try_from(count.max(1)).map_err(|e| e.to_string())?;
        let queue = depth.checked_mul(2).ok_or("too many messages")?;
        let send_cq = context
            .create_cq(queue)
            .map_err(|e| format!("unable to create CQ: {e}"))?;
        let recv_cq = context
            .create_cq(queue)
            .map_err(|e| format!("unable to create CQ: {e}"))?;
        let qp = pd
            .qp_builder::<Ud>(&send_cq, &recv_cq)
            .max_send_wr(depth)
            .max_recv_wr(depth)
            .build()
            .map_err(|e| format!("unable to create QP: {e}"))?;
        let mut qp = id.ready_ud_qp(qp).map_err(|e| e.to_string())?;
        let allocation = |e| format!("failed message allocation: {e}");
        let mut rx = qp.slot_ring(depth, size + GRH_LEN).map_err(allocation)?;
        let tx = qp.slot_ring(depth, size.max(1)).map_err(allocation)?;
        for i in 0..count {
            let slot = rx.take().ok_or("out of buffers")?;
            qp.post_recv_slot(&mut rx, RecvRequest::new(slot).tag(i as u64))
                .map_err(|e| format!("failed to post receives: {}", e.error()))?;
        }
        Ok(Self {
            id,
            qp,
            send_cq,
            recv_cq,
            rx,
            tx,
            peer: None,
        })
    }

    /// Sends `payloads` to the peer, each with this queue pair's number as immediate data,
    /// and reaps the sends.
    pub fn send_all(&mut self, payloads: &[Vec<u8>], timeout: Duration) -> Result<(), String> {
        let (ah, qpn, qkey) = self.peer.as_ref().ok_or("no peer")?;
        let own = self.qp.qp_num();
        for (i, data) in payloads.iter().enumerate() {
            let mut slot = self.tx.take().ok_or("out of buffers")?;
            self.tx.fill(&mut slot, data).map_err(|e| e.to_string())?;
            let request = SendRequest::send(slot)
                .with_imm(own)
                .tag(i as u64)
                .to(ah, *qpn, *qkey);
            self.qp
                .post_send_slot(&mut self.tx, request)
                .map_err(|e| format!("failed to post sends: {}", e.error()))?;
        }
        for i in 0..payloads.len() {
            let wc = next(&mut self.send_cq, timeout, "send")?;
            let slot = self.tx.complete(&wc);
            expect(&wc, WcOpcode::Send, "send")?;
            let slot = slot.ok_or("a send completion of no request of ours")?;
            if slot.tag() != i as u64 {
                return Err(format!("send {i}: the completion of send {}", slot.tag()));
            }
            self.tx.put(slot).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Reaps `count` receives of `size` bytes each, checked: a `Recv` whose immediate data is
    /// its source queue pair (`from`, when known), in the order they were posted. Returns
    /// the datagrams.
    pub fn receive_all(
        &mut self,
        count: usize,
        size: usize,
        from: Option<u32>,
        timeout: Duration,
    ) -> Result<Vec<Datagram>, String> {
        let mut got = Vec::with_capacity(count);
        for i in 0..count {
            let wc = next(&mut self.recv_cq, timeout, "receive")?;
            let slot = self.rx.complete(&wc);
            expect(&wc, WcOpcode::Recv, "receive")?;
            let slot = slot.ok_or("a receive completion of no request of ours")?;
            let src = from.unwrap_or(wc.src_qp());
            if wc.imm_data() != Some(src) || wc.src_qp() != src {
                return Err(format!(
                    "datagram {i}: immediate data {:?}, source queue pair {:#x}, expected {src:#x}",
                    wc.imm_data(),
                    wc.src_qp()
                ));
            }
            if slot.len() != size + GRH_LEN || slot.tag() != i as u64 {
                return Err(format!(
                    "datagram {i}: {} bytes in receive {}, expected {} (GRH and {size})",
                    slot.len(),
                    slot.tag(),
                    size + GRH_LEN
                ));
            }
            let bytes = self.rx.bytes(&slot).map_err(|e| e.to_string())?.to_vec();
            self.rx.put(slot).map_err(|e| e.to_string())?;
            got.push(Datagram { wc, bytes });
        }
        Ok(got)
    }
}

/// The next completion of `cq` within `timeout`.
pub fn next(
    cq: &mut CompletionQueue,
    timeout: Duration,
    what: &str,
) -> Result<WorkCompletion, String> {
    let mut wcs = [WorkCompletion::default(); 1];
    match cq
        .poll_for(&mut wcs, 1, timeout)
        .map_err(|e| format!("failed polling CQ: {e}"))?
    {
        [wc] => Ok(*wc),
        _ => Err(format!("no {what} completion in {timeout:?}")),
    }
}

/// Checks that `wc` succeeded with `opcode`.
pub fn expect(wc: &WorkCompletion, opcode: WcOpcode, what: &str) -> Result<(), String> {
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
