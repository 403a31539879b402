// The control of the receive cases: borrowed receives in a list, owned receives (a buffer, a
// range, both, none) posted alone and pushed to an owned list, a slot's receive posted with
// its tag.

use std::sync::Arc;

use rdma_verbs::{MemoryRegion, QueuePair, Result, owned::{BufferPool, OwnedRecvList, PostRefused, RegionRange}, qp::{Rc, Rts}, slot::{SlotRefused, SlotRing}, wr::{RecvList, RecvRequest}};

fn borrowed(mr: &MemoryRegion) -> Result<()> {
    let mut list = RecvList::with_capacity(2);
    list.push(RecvRequest::new(mr.slice(..8)?).tag(1))?;
    list.push(RecvRequest::empty().tag(2))?;
    Ok(())
}

fn owned(
    qp: &mut QueuePair<Rc, Rts>,
    pool: &BufferPool,
    shared: &Arc<MemoryRegion>,
) -> std::result::Result<(), PostRefused> {
    let range = || RegionRange::new(shared, ..8).expect("a range");
    qp.post_recv_owned(RecvRequest::new(pool.take().expect("a buffer")).and_range(range()))?;
    qp.post_recv_owned(RecvRequest::new(range()).tag(3))?;
    qp.post_recv_owned(RecvRequest::empty().tag(4))?;
    let mut list = OwnedRecvList::with_capacity(2);
    list.push_owned(RecvRequest::new(range()).tag(5))?;
    list.push(pool.take().expect("a buffer"), 6)?;
    Ok(())
}

fn slot(qp: &mut QueuePair<Rc, Rts>, ring: &mut SlotRing) -> std::result::Result<(), SlotRefused> {
    let slot = ring.take().expect("a free slot");
    qp.post_recv_slot(ring, RecvRequest::new(slot).tag(7))?;
    let unposted = RecvRequest::new(ring.take().expect("a free slot")).tag(8);
    ring.put(unposted.into_slot())
}

fn main() {
    let _ = (borrowed, owned, slot);
}
