use rdma_verbs::{*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*};

fn main() {}

// Memory created inside the scope cannot be posted: it would be freed before the scope ends.
fn post_local_buffer(qp: &mut QueuePair<Rc, Rts>, cq: &mut CompletionQueue, pd: &ProtectionDomain) {
    let _ = qp.scope(ScopeCqs::shared(cq), |s| {
        let mut mr = pd.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        let target = mr.slice_mut(..).unwrap();
        let _ = s.recv(1, &target);
    });
}
