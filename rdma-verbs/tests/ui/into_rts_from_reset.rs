// RESET cannot skip INIT and RTR: `into_rts` exists only on a queue pair in RTR.

use rdma_verbs::{QueuePair, qp::{Rc, RcRtsAttr, Reset}};

fn skip(qp: QueuePair<Rc, Reset>) {
    let _ = qp.into_rts(&RcRtsAttr::new(0));
}

fn main() {
    let _ = skip;
}
