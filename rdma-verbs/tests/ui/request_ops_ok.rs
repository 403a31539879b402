// The control of `request_atomic_with_imm` and `request_write_to_ud`: immediate data on SEND
// and RDMA WRITE, a UD destination on SEND, and requests of every operation in one list (and,
// erased, in one variable).

use rdma_verbs::{AddressHandle, MemoryRegion, Result, mr::RemoteMemory, wr::{SendList, SendRequest}};

fn build(mr: &MemoryRegion, remote: RemoteMemory, ah: &AddressHandle, read: bool) -> Result<()> {
    let mut list = SendList::with_capacity(8);
    list.push(SendRequest::send(mr.slice(..8)?).with_imm(1).to(ah, 2, 0x1111))?;
    list.push(SendRequest::write(mr.slice(..8)?, remote).with_imm(2).inline())?;
    list.push(SendRequest::read(mr.slice(..8)?, remote).tag(3))?;
    list.push(SendRequest::fetch_add(mr.slice(..8)?, remote, 1).unsignaled())?;
    list.push(SendRequest::send_with_invalidate(mr.slice(..8)?, 9).solicited())?;
    list.push(SendRequest::local_invalidate(9).fenced())?;
    let chosen = if read {
        SendRequest::read(mr.slice(..8)?, remote).erase()
    } else {
        SendRequest::write(mr.slice(..8)?, remote).erase()
    };
    list.push(chosen.tag(4))?;
    Ok(())
}

fn main() {
    let _ = build;
}
