//! Small statistics for comparisons: mean and a 95% Student-t interval.

/// Two-sided 95% critical values of Student's t for 1..=30 degrees of freedom.
const T95: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

pub fn t95(df: usize) -> f64 {
    match df {
        0 => f64::NAN,
        1..=30 => T95[df - 1],
        31..=60 => 2.000,
        61..=120 => 1.980,
        _ => 1.960,
    }
}

/// Mean and 95% interval of the mean; the interval needs at least two values.
pub fn mean_ci95(values: &[f64]) -> (Option<f64>, Option<[f64; 2]>) {
    let n = values.len();
    if n == 0 {
        return (None, None);
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (Some(mean), None);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let half = t95(n - 1) * (var / n as f64).sqrt();
    (Some(mean), Some([mean - half, mean + half]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_matches_a_hand_computation() {
        // values 1,2,3: mean 2, sd 1, se 1/sqrt(3), t(2)=4.303 → half-width 2.484
        let (m, ci) = mean_ci95(&[1.0, 2.0, 3.0]);
        assert_eq!(m, Some(2.0));
        let [lo, hi] = ci.expect("interval");
        assert!(
            (hi - 2.0 - 4.303 / 3f64.sqrt()).abs() < 1e-9
                && (2.0 - lo - 4.303 / 3f64.sqrt()).abs() < 1e-9
        );
        assert_eq!(mean_ci95(&[0.5]), (Some(0.5), None));
        assert_eq!(mean_ci95(&[]), (None, None));
    }
}
