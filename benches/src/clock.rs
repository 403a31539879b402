//! The stamp clock of the latency tests: the CPU's time-stamp counter on x86-64, as perftest's
//! `get_cycles` reads it, and [`Instant`] elsewhere.
//!
//! Why not [`Instant`] everywhere: `clock_gettime` is only as cheap as the kernel's clock
//! source lets it be. In the emulated test VM the clock source is the HPET, which the vDSO
//! cannot read, so every `Instant::now()` is a system call and an emulated device read, a few
//! microseconds that perftest's stamps do not pay and that showed up as 10–30 % of a
//! 20-microsecond ping-pong. The counter is read in one instruction; its rate is measured
//! against [`Instant`] once, outside any timed loop.

use std::time::{Duration, Instant};

/// Reads the stamp clock.
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC exists on every x86-64 processor and only reads the counter.
        unsafe { std::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::sync::OnceLock;
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Ticks of [`ticks`] per microsecond, measured over `window` against [`Instant`].
pub fn ticks_per_us(window: Duration) -> f64 {
    let (start, t0) = (Instant::now(), ticks());
    while start.elapsed() < window {
        std::hint::spin_loop();
    }
    let (elapsed, t1) = (start.elapsed(), ticks());
    t1.wrapping_sub(t0) as f64 / (elapsed.as_nanos() as f64 / 1000.0)
}

/// A deadline in ticks, checked without a system call.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(u64);

impl Deadline {
    /// `timeout` from now, at `per_us` ticks per microsecond.
    pub fn after(timeout: Duration, per_us: f64) -> Self {
        let span = (timeout.as_micros() as f64 * per_us) as u64;
        Self(ticks().saturating_add(span))
    }

    /// Whether it has passed.
    #[inline]
    pub fn passed(self) -> bool {
        ticks() >= self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_positive_and_deadlines_pass() {
        let per_us = ticks_per_us(Duration::from_millis(20));
        assert!(per_us > 0.0, "{per_us}");
        let deadline = Deadline::after(Duration::from_millis(5), per_us);
        assert!(!deadline.passed());
        std::thread::sleep(Duration::from_millis(50));
        assert!(deadline.passed());
    }
}
