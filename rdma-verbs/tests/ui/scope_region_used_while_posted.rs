// A region a receive targets stays borrowed by the scope until the scope ends, even after the
// last use of the slice: reading it later in the scope does not compile.
//
// The slice is made inside the closure, from the region the closure owns, and nothing else
// borrows the region: the only borrow still alive at the read is the one `PostScope::recv`
// ties to the scope ('scope). Without the read, this compiles (the `_ok` case).

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
        let _ = mr.as_slice(); // the scope still borrows `*mr`
    });
}

fn main() {
    let _ = read_while_posted;
}
