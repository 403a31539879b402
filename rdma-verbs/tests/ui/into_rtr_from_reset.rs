// RESET must go to INIT first: `into_rtr` exists only on a queue pair in INIT.

use rdma_verbs::{QueuePair, qp::{Reset, Ud, UdRtrAttr}};

fn skip(qp: QueuePair<Ud, Reset>) {
    let _ = qp.into_rtr(&UdRtrAttr);
}

fn main() {
    let _ = skip;
}
