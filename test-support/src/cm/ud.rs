//! The UD side of a test: a queue pair in RTS for an identifier, its queues and buffers,
//! datagrams sent and received with every byte checked.

use rdma_cm::CmId;
use rdma_cm::rdma_verbs::{
    AddressHandle, CompletionQueue, QueuePair,
    ah::GRH_LEN,
    cq::{WcOpcode, WcStatus, WorkCompletion},
    owned::BufferPool,
    qp::{Rts, Ud},
    wr::SendRequest,
};

use super::reap;
use crate::pattern;

/// The Q_Key of the UDP port space (`RDMA_UDP_QKEY`).
pub const UDP_QKEY: u32 = 0x0123_4567;
/// The datagrams each side sends in a test.
pub const MESSAGES: u8 = 8;
/// The bytes of each datagram (after the GRH a receive also holds).
pub const PAYLOAD: usize = 512;

/// One side: a UD queue pair in RTS on `id`'s device, a send and a receive queue, and buffers
/// of `PAYLOAD + GRH` bytes.
#[allow(missing_debug_implementations)]
pub struct Side {
    /// The queue pair, in RTS.
    pub qp: QueuePair<Ud, Rts>,
    /// Its send completion queue.
    pub send_cq: CompletionQueue,
    /// Its receive completion queue.
    pub recv_cq: CompletionQueue,
    /// Its buffers.
    pub pool: BufferPool,
}

impl Side {
    /// The side of `id`: a UD queue pair on its device, moved to RTS by the connection
    /// manager (`ready_ud_qp`), with its queues and buffers.
    pub fn new(id: &CmId) -> Self {
        let context = id.context().expect("the identifier's device");
        let pd = context.alloc_pd().expect("ibv_alloc_pd");
        let send_cq = context.create_cq(32).expect("ibv_create_cq");
        let recv_cq = context.create_cq(32).expect("ibv_create_cq");
        let qp = pd
            .qp_builder::<Ud>(&send_cq, &recv_cq)
            .build()
            .expect("ibv_create_qp (UD)");
        let qp = id.ready_ud_qp(qp).expect("UD queue pair to RTS");
        let pool =
            BufferPool::new(&pd, usize::from(MESSAGES) * 2, PAYLOAD + GRH_LEN).expect("buffers");
        let mut side = Self {
            qp,
            send_cq,
            recv_cq,
            pool,
        };
        for i in 0..MESSAGES {
            let buf = side.pool.take().expect("a buffer");
            side.qp
                .post_recv_buf(buf, u64::from(i))
                .expect("post a receive");
        }
        side
    }

    /// Sends `pattern(PAYLOAD, seed + i)` for each of the `MESSAGES` datagrams to `qpn` behind `ah`,
    /// with this queue pair's number as immediate data, and reaps the sends.
    pub fn send_all(&mut self, ah: &AddressHandle, qpn: u32, qkey: u32, seed: u8, what: &str) {
        let own = self.qp.qp_num();
        for i in 0..MESSAGES {
            let mut buf = self.pool.take().expect("a buffer");
            buf.fill_from(&pattern(PAYLOAD, seed.wrapping_add(i)))
                .unwrap();
            self.qp
                .post_send_owned(SendRequest::send(buf).with_imm(own).to(ah, qpn, qkey))
                .expect("post a datagram");
        }
        for i in 0..MESSAGES {
            let done = reap(&mut self.send_cq, what);
            assert_eq!(
                (done.status(), done.wc().opcode()),
                (WcStatus::Success, WcOpcode::Send),
                "{what}: send {i}: {:?}",
                done.wc()
            );
        }
    }

    /// Reaps the `MESSAGES` receives: each a `Recv` with immediate data and source queue
    /// pair `src_qp`, the GRH and then `pattern(PAYLOAD, seed + i)` in order. Returns the first
    /// completion and its GRH.
    pub fn receive_all(
        &mut self,
        src_qp: Option<u32>,
        seed: u8,
        what: &str,
    ) -> (WorkCompletion, [u8; GRH_LEN]) {
        let mut first = None;
        for i in 0..MESSAGES {
            let mut done = reap(&mut self.recv_cq, what);
            let wc = *done.wc();
            let src = src_qp.unwrap_or(wc.src_qp());
            assert_eq!(
                (wc.status(), wc.opcode(), wc.imm_data(), wc.src_qp()),
                (WcStatus::Success, WcOpcode::Recv, Some(src), src),
                "{what}: datagram {i}: {wc:?}"
            );
            assert_eq!(wc.byte_len() as usize, PAYLOAD + GRH_LEN, "{what}: {wc:?}");
            let buf = done.take_buf().expect("the receive's buffer");
            assert_eq!(
                &buf[GRH_LEN..],
                &pattern(PAYLOAD, seed.wrapping_add(i))[..],
                "{what}: datagram {i}'s bytes"
            );
            first.get_or_insert((wc, buf[..GRH_LEN].try_into().unwrap()));
        }
        first.unwrap()
    }
}
