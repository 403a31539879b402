//! A lock for the owned-buffer data path's few-instruction critical sections (`inflight/ring.rs`):
//! one atomic exchange to take it and one store to release it when nobody else holds it,
//! where `std::sync::Mutex` adds poisoning checks and an out-of-line call per use.
//!
//! Only for sections that are short and bounded: no allocation and no user code, and no system
//! call on the common path. (The ring's sections drop the entries they release: the last buffer
//! of a pool deregisters its region, the last clone of an address handle destroys it, the last
//! reference to a window bind's or a `RegionRange`'s region deregisters it; those calls take no
//! lock of the ring's, so they cannot deadlock, only hold it longer.) A waiter spins briefly,
//! then yields its time slice between tries, so a holder that was preempted gets the processor
//! back.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// A value behind a spin lock. There is no poisoning: a section that panics releases the
/// lock (its guard is dropped while unwinding), so the sections must keep the value
/// consistent at every point where they can panic.
pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out at most one guard at a time (the `compare_exchange` from `false`
// to `true` succeeds for one thread until the guard's drop stores `false`), so the value is
// reached by one thread at a time, as `Mutex<T>` requires only `T: Send` to be `Sync`.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub(crate) const fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, waiting while another thread holds it.
    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        SpinGuard {
            lock: self,
            _value: PhantomData,
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if spins < 100 {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

/// Access to a [`SpinLock`]'s value; dropping it releases the lock.
pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    /// The guard gives `&mut T`: it is `Sync` only where `&mut T` is (`T: Sync`), not
    /// wherever `&SpinLock<T>` is (`T: Send`), or two threads could reach a `Cell` through
    /// one shared guard.
    _value: PhantomData<&'a mut T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // Release: what the section wrote is visible to the next thread that takes the lock.
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Four threads each add 1 a hundred thousand times through the lock, in a non-atomic
    /// read-then-write: any two sections overlapping would lose an update.
    #[test]
    fn sections_exclude_each_other() {
        let lock = Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..if cfg!(miri) { 200 } else { 100_000 } {
                        let mut guard = lock.lock();
                        let seen = *guard;
                        std::hint::black_box(&seen);
                        *guard = seen + 1;
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(*lock.lock(), if cfg!(miri) { 800 } else { 400_000 });
    }

    /// A guard over a value that is `Send` but not `Sync` is not `Sync`: the call below
    /// resolves only if `SpinGuard<Cell<u8>>` has one implementation of `NotSync<_>`, which
    /// a `Sync` guard would not (both implementations would apply).
    #[test]
    fn a_guard_is_sync_only_over_sync_values() {
        trait NotSync<Which> {
            fn check() {}
        }
        impl<T: ?Sized> NotSync<()> for T {}
        impl<T: ?Sized + Sync> NotSync<u8> for T {}
        <SpinGuard<'static, std::cell::Cell<u8>> as NotSync<_>>::check();
        // And the lock itself is `Sync` over `Send` values, as `Mutex` is.
        fn sync<T: Sync>() {}
        sync::<SpinLock<std::cell::Cell<u8>>>();
    }

    /// A section that panics releases the lock.
    #[test]
    fn a_panicking_section_releases_the_lock() {
        let lock = Arc::new(SpinLock::new(1u32));
        let other = lock.clone();
        let result = std::thread::spawn(move || {
            let _guard = other.lock();
            panic!("inside the section");
        })
        .join();
        assert!(result.is_err());
        *lock.lock() += 1;
        assert_eq!(*lock.lock(), 2);
    }
}
