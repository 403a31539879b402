// A slice borrows its memory region: it cannot outlive it.

use rdma_verbs::{ProtectionDomain, mr::{AccessFlags, MrSlice}};

fn dangling(pd: &ProtectionDomain) -> u32 {
    let slice: MrSlice<'_>;
    {
        let mr = pd.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        slice = mr.slice(..16).unwrap();
    }
    slice.lkey()
}

fn main() {
    let _ = dangling;
}
