// The control of `scope_region_used_while_posted`: the same code without the read compiles.

use rdma_verbs::{*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*};

fn read_while_posted(
    qp: &mut QueuePair<Rc, Rts>,
    cq: &mut CompletionQueue,
    mr: &mut MemoryRegion,
) {
    let _ = qp.scope(ScopeCqs::shared(cq), move |s| {
        let mr = mr;
        // A slice that lives for the whole scope, as `recv` requires.
        let target: &MrSliceMut<'_> = Box::leak(Box::new(mr.slice_mut(..).unwrap()));
        let _ = s.recv(1, target);
    });
}

fn main() {
    let _ = read_while_posted;
}
