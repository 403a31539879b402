//! perftest's duration mode (`-D SECONDS`, `-f MARGIN`): instead of a fixed number of
//! iterations, a run lasts `SECONDS`; the first and last `MARGIN` seconds (a quarter of the
//! run by default, in whole seconds, as perftest rounds it) warm up and wind down, and only
//! what happens in between is measured: the number of iterations (or completions) in that
//! window and the time they took.
//!
//! perftest moves between those phases with `SIGALRM`; here each iteration's stamp (a read of
//! [`crate::clock`], which the loops take anyway) is compared with the phases' ends, so no
//! signal interrupts a loop and nothing allocates.

use std::time::Duration as Span;

use crate::clock;

/// perftest's duration flags, for the tools' command lines.
#[derive(clap::Args, Debug, Clone)]
pub struct DurationArgs {
    /// Run for this many seconds instead of a number of iterations (perftest's duration mode:
    /// one size; both sides must be given it).
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<u32>,
    /// With -D: seconds before and after the measured window (default: a quarter of the
    /// duration, rounded down).
    #[arg(short = 'f', long = "margin", requires = "duration")]
    pub margin: Option<u32>,
}

impl DurationArgs {
    /// The duration mode asked for, if any.
    ///
    /// # Errors
    ///
    /// As [`Duration::new`].
    pub fn duration(&self) -> Result<Option<Duration>, String> {
        self.duration
            .map(|seconds| Duration::new(seconds, self.margin))
            .transpose()
    }
}

/// A duration-mode run's length and margins, checked as perftest checks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Duration {
    seconds: u32,
    margin: u32,
}

impl Duration {
    /// `seconds` long, with `margin` seconds before and after the measured window (default:
    /// `seconds / 4`, rounded down).
    ///
    /// # Errors
    ///
    /// A run of 0 seconds, or one not longer than its two margins (perftest: "DURATION >
    /// 2*MARGIN").
    pub fn new(seconds: u32, margin: Option<u32>) -> Result<Self, String> {
        let margin = margin.unwrap_or(seconds / 4);
        if seconds == 0 {
            return Err("the duration must be at least 1 second".into());
        }
        if u64::from(seconds) <= 2 * u64::from(margin) {
            return Err(format!(
                "the duration ({seconds} s) must be longer than twice the margin ({margin} s)"
            ));
        }
        Ok(Self { seconds, margin })
    }

    /// The whole run.
    pub fn total(&self) -> Span {
        Span::from_secs(self.seconds.into())
    }

    /// Starts a run now: its phases in stamp-clock ticks (`per_us` per microsecond).
    pub fn start(&self, per_us: f64) -> Window {
        let ticks = |seconds: u32| (f64::from(seconds) * 1e6 * per_us) as u64;
        let now = clock::ticks();
        Window {
            sample_start: now + ticks(self.margin),
            sample_end: now + ticks(self.seconds - self.margin),
            end: now + ticks(self.seconds),
            first: None,
            after: None,
            count: 0,
        }
    }
}

/// One duration-mode run: where its phases end, and what was counted in the measured window.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    sample_start: u64,
    sample_end: u64,
    end: u64,
    /// The stamp of the first event in the window.
    first: Option<u64>,
    /// The stamp of the first event after it.
    after: Option<u64>,
    /// Events in the window.
    count: u64,
}

impl Window {
    /// Records an event (an iteration about to start, a completion) stamped `now`; `false`
    /// once the run is over (then nothing is recorded).
    #[inline]
    pub fn tick(&mut self, now: u64) -> bool {
        if now >= self.sample_end {
            if self.first.is_some() && self.after.is_none() {
                self.after = Some(now);
            }
        } else if now >= self.sample_start {
            self.first.get_or_insert(now);
            self.count += 1;
        }
        now < self.end
    }

    /// Whether the run is over.
    #[inline]
    pub fn over(&self) -> bool {
        clock::ticks() >= self.end
    }

    /// The end of the run, in ticks.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The events counted in the window and the ticks from the first of them to the first
    /// event after the window: each counted event starts one of the intervals that time
    /// covers. `None` if no event fell in the window, or none came after it.
    pub fn result(&self) -> Option<(u64, u64)> {
        let (first, after) = (self.first?, self.after?);
        (self.count > 0 && after > first).then_some((self.count, after - first))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perftest_s_margin_rules() {
        assert_eq!(
            Duration::new(5, None),
            Ok(Duration {
                seconds: 5,
                margin: 1
            })
        );
        assert_eq!(Duration::new(3, None).map(|d| d.margin), Ok(0));
        assert_eq!(Duration::new(8, Some(3)).map(|d| d.margin), Ok(3));
        assert!(
            Duration::new(6, Some(3)).is_err(),
            "6 is not longer than 2 x 3"
        );
        assert!(Duration::new(0, None).is_err());
        assert_eq!(Duration::new(4, None).unwrap().total(), Span::from_secs(4));
    }

    #[test]
    fn a_window_counts_the_events_inside_it() {
        let mut window = Window {
            sample_start: 100,
            sample_end: 200,
            end: 300,
            first: None,
            after: None,
            count: 0,
        };
        for now in [10, 50, 99] {
            assert!(window.tick(now));
        }
        assert_eq!(window.result(), None, "nothing in the window yet");
        for now in [100, 130, 160, 190] {
            assert!(window.tick(now));
        }
        assert_eq!(window.result(), None, "no event after the window yet");
        assert!(window.tick(220));
        assert!(window.tick(250));
        assert!(!window.tick(300), "the run is over");
        // Four intervals, from 100 to 220.
        assert_eq!(window.result(), Some((4, 120)));
    }

    #[test]
    fn without_margins_the_event_at_the_end_closes_the_window() {
        let mut window = Window {
            sample_start: 0,
            sample_end: 100,
            end: 100,
            first: None,
            after: None,
            count: 0,
        };
        assert!(window.tick(10));
        assert!(window.tick(60));
        assert!(!window.tick(100));
        assert_eq!(window.result(), Some((2, 90)));
    }
}
