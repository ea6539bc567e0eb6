//! Latency histogram of `winefs bench workload`: log-linear buckets (32 per power of two, so
//! a quantile is within about 3% of the true value), one per thread, merged at the end.

/// Sub-buckets per power of two.
const SUB: u64 = 32;
/// Values below this have a bucket each.
const LINEAR: u64 = 2 * SUB;
const BUCKETS: usize = (LINEAR + (64 - 6) * SUB) as usize;

/// Counts of nanosecond values.
#[derive(Clone, Debug)]
pub(crate) struct Hist {
    counts: Vec<u64>,
    total: u64,
}

fn bucket(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let e = 63 - u64::from(v.leading_zeros()); // 6..=63
    let m = v >> (e - 5); // 32..64
    (LINEAR + (e - 6) * SUB + (m - SUB)) as usize
}

/// The smallest value in bucket `i`.
fn floor(i: usize) -> u64 {
    let i = i as u64;
    if i < LINEAR {
        return i;
    }
    let e = 6 + (i - LINEAR) / SUB;
    let m = SUB + (i - LINEAR) % SUB;
    m << (e - 5)
}

impl Hist {
    pub(crate) fn new() -> Hist {
        Hist {
            counts: vec![0; BUCKETS],
            total: 0,
        }
    }

    pub(crate) fn record(&mut self, v: u64) {
        self.counts[bucket(v)] += 1;
        self.total += 1;
    }

    pub(crate) fn merge(&mut self, o: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.total += o.total;
    }

    /// The value below which a fraction `q` of the recorded values lie (the lower edge of its
    /// bucket; 0 when empty).
    pub(crate) fn quantile(&self, q: f64) -> u64 {
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total.max(1));
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank && c > 0 {
                return floor(i);
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_tight() {
        let mut last = 0;
        for v in (0..1_000_000u64).step_by(7).chain([u64::MAX / 3, u64::MAX]) {
            let b = bucket(v);
            assert!(b >= last && b < BUCKETS, "{v}");
            last = b;
            assert!(floor(b) <= v, "{v}");
            assert!(v - floor(b) <= v / SUB, "{v} in bucket from {}", floor(b));
        }
    }

    #[test]
    fn quantiles_of_a_known_spread() {
        let mut h = Hist::new();
        for v in 1..=10_000u64 {
            h.record(v * 1000);
        }
        let mut other = Hist::new();
        other.record(50_000_000);
        h.merge(&other);
        let near = |got: u64, want: u64| (got as f64 - want as f64).abs() <= want as f64 * 0.04;
        assert!(near(h.quantile(0.5), 5_000_000), "{}", h.quantile(0.5));
        assert!(near(h.quantile(0.99), 9_900_000), "{}", h.quantile(0.99));
        assert!(near(h.quantile(1.0), 50_000_000), "{}", h.quantile(1.0));
        assert_eq!(Hist::new().quantile(0.5), 0);
    }
}
