// The control of `owned_read_with_imm` and `owned_write_to_ud`: immediate data on SEND and
// RDMA WRITE, a UD destination on SEND, and requests of every operation in one list.

use rdma_verbs::{AddressHandle, BufferPool, OwnedSend, OwnedSendList, PostRefused, RemoteMemory};

fn build(pool: &BufferPool, remote: RemoteMemory, ah: &AddressHandle) -> Result<(), PostRefused> {
    let take = || pool.take().expect("a buffer");
    let mut list = OwnedSendList::with_capacity(4);
    list.push(OwnedSend::send(take()).with_imm(1).to(ah, 2, 0x1111))?;
    list.push(OwnedSend::write(take(), remote).with_imm(2))?;
    list.push(OwnedSend::read(take(), remote).tag(3))?;
    list.push(OwnedSend::fetch_add(take(), remote, 1).unsignaled())?;
    Ok(())
}

fn main() {
    let _ = build;
}
