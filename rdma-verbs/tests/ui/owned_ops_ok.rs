// The control of `owned_read_with_imm`, `owned_write_to_ud` and the owned posting cases:
// immediate data on SEND and RDMA WRITE, a UD destination on SEND, inline bytes and none, a
// region range, and requests of every operation in one list and posted alone.

use std::sync::Arc;

use rdma_verbs::{AddressHandle, MemoryRegion, QueuePair, mr::RemoteMemory, owned::{BufferPool, OwnedSendList, PostRefused, RegionRange}, qp::{Rc, Rts}, wr::SendRequest};

fn build(pool: &BufferPool, remote: RemoteMemory, ah: &AddressHandle) -> Result<(), PostRefused> {
    let take = || pool.take().expect("a buffer");
    let mut list = OwnedSendList::with_capacity(8);
    list.push(SendRequest::send(take()).with_imm(1).to(ah, 2, 0x1111))?;
    list.push(SendRequest::write(take(), remote).with_imm(2))?;
    list.push(SendRequest::read(take(), remote).tag(3))?;
    list.push(SendRequest::fetch_add(take(), remote, 1).unsignaled())?;
    list.push(SendRequest::send(b"inline").solicited())?;
    list.push(SendRequest::send(b"").fenced())?;
    list.push(SendRequest::local_invalidate(9))?;
    Ok(())
}

fn post(
    qp: &mut QueuePair<Rc, Rts>,
    pool: &BufferPool,
    mr: &Arc<MemoryRegion>,
    remote: RemoteMemory,
) -> Result<(), Box<dyn std::error::Error>> {
    let range = RegionRange::new(mr, ..8)?;
    qp.post_send_owned(SendRequest::write(pool.take().expect("a buffer"), remote).and_range(range))?;
    qp.post_send_owned(SendRequest::write(&[1u8, 2, 3][..], remote).erase())?;
    qp.post_send_owned(SendRequest::send_with_invalidate(pool.take().expect("a buffer"), 9))?;
    Ok(())
}

fn main() {
    let _ = (build, post);
}
