// A transition consumes the queue pair: the old value cannot be used afterwards.

use rdma_verbs::{QueuePair, qp::{ConnectedInitAttr, Rc, Reset}};

fn reuse(qp: QueuePair<Rc, Reset>) {
    let _init = qp.into_init(&ConnectedInitAttr::new(1));
    let _ = qp.qp_num();
}

fn main() {
    let _ = reuse;
}
