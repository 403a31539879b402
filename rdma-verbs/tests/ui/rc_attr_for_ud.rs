// Attributes are per transport: a UD queue pair's INIT -> RTR takes `UdRtrAttr`, not the RC
// attributes.

use rdma_verbs::{QueuePair, ah::AddressVector, qp::{Init, RcRtrAttr, Ud}};

fn wrong_attr(qp: QueuePair<Ud, Init>) {
    let attr = RcRtrAttr::new(AddressVector::new(1), 0x11, 0);
    let _ = qp.into_rtr(&attr);
}

fn main() {
    let _ = wrong_attr;
}
