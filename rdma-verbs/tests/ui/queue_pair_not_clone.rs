// A queue pair is the one handle that may change its state and post to it: it is not `Clone`.

use rdma_verbs::{QueuePair, qp::{Rc, Rts}};

fn require_clone<T: Clone>() {}

fn main() {
    require_clone::<QueuePair<Rc, Rts>>();
}
