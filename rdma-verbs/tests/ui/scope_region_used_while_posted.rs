use rdma_verbs::*;

fn main() {}

// A region a receive targets cannot be read while the scope lives.
fn read_while_posted(
    qp: &mut QueuePair<Rc, Rts>,
    cq: &mut CompletionQueue,
    mr: &mut MemoryRegion,
) {
    let target = mr.slice_mut(..).unwrap();
    let _ = qp.scope(ScopeCqs::shared(cq), |s| {
        let _ = s.recv(1, &target);
        let _ = mr.as_slice();
    });
}
