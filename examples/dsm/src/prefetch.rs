//! Which pages a fault fetches (docs/dsm.md, "Consistency model and protocol"), after
//! JIAJIA's `prefetch_pages` and `max_checking_pages`: the faulting page, and up to
//! `prefetch` of the `checking` pages after it that have no valid copy here and the same
//! home, as runs of consecutive pages (one request each).

/// The runs `(first page, count)` to fetch for a fault on `page` of home `home`: the first
/// run starts at `page`. `invalid(p)` says whether page `p` has no copy here, `home_of(p)`
/// is page `p`'s home (`None` past the allocations). `checking` below `prefetch` counts as
/// `prefetch`.
pub(crate) fn runs(
    page: usize,
    home: u16,
    prefetch: u16,
    checking: u16,
    invalid: impl Fn(usize) -> bool,
    home_of: impl Fn(usize) -> Option<u16>,
) -> Vec<(usize, u16)> {
    let mut runs = vec![(page, 1u16)];
    let mut wanted = prefetch;
    for next in (page + 1..).take(usize::from(checking.max(prefetch))) {
        if wanted == 0 {
            break;
        }
        match home_of(next) {
            // Past the allocations: nothing further can be fetched.
            None => break,
            Some(h) if h == home && invalid(next) => {
                wanted -= 1;
                let last = runs.last_mut().expect("never empty");
                if last.0 + usize::from(last.1) == next {
                    last.1 += 1;
                } else {
                    runs.push((next, 1));
                }
            }
            Some(_) => {}
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages 0..16: home 1 except 8..12 (home 0); `valid` pages have copies.
    fn plan(page: usize, prefetch: u16, checking: u16, valid: &[usize]) -> Vec<(usize, u16)> {
        runs(
            page,
            1,
            prefetch,
            checking,
            |p| !valid.contains(&p),
            |p| (p < 16).then_some(if (8..12).contains(&p) { 0 } else { 1 }),
        )
    }

    #[test]
    fn runs_take_invalid_pages_of_the_same_home_within_the_checked_ones() {
        // No prefetch: the page alone.
        assert_eq!(plan(2, 0, 8, &[]), [(2, 1)]);
        // Contiguous.
        assert_eq!(plan(2, 3, 3, &[]), [(2, 4)]);
        // A valid page is skipped, not a stop, when more pages are checked.
        assert_eq!(plan(2, 2, 2, &[3]), [(2, 1), (4, 1)]);
        assert_eq!(plan(2, 2, 4, &[3]), [(2, 1), (4, 2)]);
        // Another home's pages are skipped too; the checked span bounds the search.
        assert_eq!(plan(6, 4, 4, &[]), [(6, 2)]);
        assert_eq!(plan(6, 4, 8, &[]), [(6, 2), (12, 3)]);
        // The allocations' end stops it.
        assert_eq!(plan(14, 4, 8, &[]), [(14, 2)]);
        assert_eq!(plan(15, 4, 8, &[]), [(15, 1)]);
        // At most `prefetch` pages beyond the faulting one.
        assert_eq!(plan(0, 2, 8, &[1]), [(0, 1), (2, 2)]);
    }
}
