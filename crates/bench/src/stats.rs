//! What the benchmarks share: summaries of repeated timings.

/// "median 1.02 s (min 0.98, max 1.10, n=3)": the median is the upper middle value (a
/// time measured, not an average of two).
pub fn stats(v: &[f64], digits: usize) -> String {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let median = s[s.len() / 2];
    format!(
        "median {median:.digits$} s (min {:.digits$}, max {:.digits$}, n={})",
        s[0],
        s[s.len() - 1],
        s.len()
    )
}

/// The median of `values` (the mean of the two middle ones for an even count; NaN for
/// none).
pub fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_prints_the_upper_median_min_max_and_count() {
        assert_eq!(
            stats(&[1.10, 0.98, 1.02], 2),
            "median 1.02 s (min 0.98, max 1.10, n=3)"
        );
        assert_eq!(
            stats(&[0.5, 0.2, 0.4, 0.3], 1),
            "median 0.4 s (min 0.2, max 0.5, n=4)"
        );
    }

    #[test]
    fn median_averages_the_middle_two_of_an_even_count() {
        assert_eq!(median([3.0, 1.0, 2.0].into_iter()), 2.0);
        assert_eq!(median([4.0, 1.0, 3.0, 2.0].into_iter()), 2.5);
        assert!(median(std::iter::empty()).is_nan());
    }
}
