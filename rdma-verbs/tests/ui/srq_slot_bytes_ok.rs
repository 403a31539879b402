// The control of `srq_slot_bytes_while_written`: the same code compiles when the read ends
// before the write.

use rdma_verbs::slot::SrqSlotRing;

fn read_then_write(ring: &mut SrqSlotRing) {
    let mut slot = ring.take().unwrap();
    let ring: &SrqSlotRing = ring;
    let first = ring.bytes(&slot).unwrap()[0];
    let write = ring.bytes_mut(&mut slot).unwrap();
    write[0] = first;
    drop(slot);
}

fn main() {
    let _ = read_then_write;
}
