//! Copies in and out of memory that another agent may write at the same time: a NIC
//! (a remotely writable region), another thread, another process mapping the same pages.
//!
//! A plain copy (`copy_nonoverlapping`, a slice read) of memory another thread of execution
//! writes concurrently is a data race in Rust's memory model, whatever the bytes are used for.
//! These copies use relaxed atomic accesses instead, so a concurrent write gives unspecified
//! bytes, never undefined behaviour. [`MemoryRegion::read_at`](crate::MemoryRegion::read_at)
//! and [`write_at`](crate::MemoryRegion::write_at) use them; they are public for programs that
//! manage such memory themselves (the DSM example's page frames).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Copies `dst.len()` bytes from `src` with relaxed atomic loads: single bytes (`AtomicU8`) up
/// to the first 8-byte boundary and after the last one, aligned words (`AtomicU64`) between.
///
/// # Safety
///
/// `src..src + dst.len()` is valid for reads and writes (atomic accesses need writable memory)
/// and, while this runs, is accessed only atomically or by the device.
pub unsafe fn copy_from_shared(src: *const u8, dst: &mut [u8]) {
    let len = dst.len();
    let head = ((8 - src.addr() % 8) % 8).min(len);
    let mut i = 0;
    while i < len {
        let at = src.wrapping_add(i).cast_mut();
        if i >= head && len - i >= 8 {
            // SAFETY: inside the range and 8-byte aligned (past the head); see the contract.
            let word = unsafe { AtomicU64::from_ptr(at.cast()) }.load(Ordering::Relaxed);
            dst[i..i + 8].copy_from_slice(&word.to_ne_bytes());
            i += 8;
        } else {
            // SAFETY: inside the range; see the contract.
            dst[i] = unsafe { AtomicU8::from_ptr(at) }.load(Ordering::Relaxed);
            i += 1;
        }
    }
}

/// Copies `src` to `dst` with relaxed atomic stores, split as [`copy_from_shared`] splits loads.
///
/// # Safety
///
/// As [`copy_from_shared`], for `dst..dst + src.len()`.
pub unsafe fn copy_to_shared(src: &[u8], dst: *mut u8) {
    let len = src.len();
    let head = ((8 - dst.addr() % 8) % 8).min(len);
    let mut i = 0;
    while i < len {
        let at = dst.wrapping_add(i);
        if i >= head && len - i >= 8 {
            let mut word = [0u8; 8];
            word.copy_from_slice(&src[i..i + 8]);
            // SAFETY: inside the range and 8-byte aligned (past the head); see the contract.
            unsafe { AtomicU64::from_ptr(at.cast()) }
                .store(u64::from_ne_bytes(word), Ordering::Relaxed);
            i += 8;
        } else {
            // SAFETY: inside the range; see the contract.
            unsafe { AtomicU8::from_ptr(at) }.store(src[i], Ordering::Relaxed);
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_copies_move_every_byte_at_any_alignment() {
        // 8-byte aligned backing store, so that offsets choose the alignment.
        let mut backing = [0u64; 10];
        let base = backing.as_mut_ptr().cast::<u8>();
        for start in 0..9 {
            for len in [0, 1, 7, 8, 9, 15, 16, 17, 40, 80 - start - 1] {
                let data: Vec<u8> = (0..len).map(|i| (i * 7 + start + 1) as u8).collect();
                // SAFETY: `start + len <= 80`, inside `backing`, which only this test touches.
                unsafe {
                    std::ptr::write_bytes(base, 0xee, 80);
                    copy_to_shared(&data, base.add(start));
                }
                // SAFETY: as above; read-only view after the writes.
                let all = unsafe { std::slice::from_raw_parts(base, 80) };
                assert_eq!(&all[start..start + len], &data[..], "{start}+{len}");
                assert!(all[..start].iter().all(|&b| b == 0xee), "{start}+{len}");
                assert!(
                    all[start + len..].iter().all(|&b| b == 0xee),
                    "{start}+{len}"
                );
                let mut out = vec![0u8; len];
                // SAFETY: as above.
                unsafe { copy_from_shared(base.add(start), &mut out) };
                assert_eq!(out, data, "{start}+{len}");
            }
        }
    }
}
