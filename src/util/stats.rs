//! Small statistics: mean and a 95% Student-t interval (comparisons), and the one-sided
//! two-proportion test of the sealed-split tripwire.

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

/// Welch's 95% interval of mean(b) − mean(a) for two unpaired samples (each needs two values):
/// the difference, and its interval with Welch–Satterthwaite degrees of freedom (rounded down).
pub fn welch_ci95(a: &[f64], b: &[f64]) -> Option<(f64, [f64; 2])> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let stat = |v: &[f64]| {
        let n = v.len() as f64;
        let m = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0);
        (m, var / n, n)
    };
    let (ma, sa, na) = stat(a);
    let (mb, sb, nb) = stat(b);
    let d = mb - ma;
    let se2 = sa + sb;
    if se2 <= 0.0 {
        return Some((d, [d, d]));
    }
    let df = se2 * se2 / (sa * sa / (na - 1.0) + sb * sb / (nb - 1.0));
    let half = t95((df.floor() as usize).max(1)) * se2.sqrt();
    Some((d, [d - half, d + half]))
}

/// The complementary error function (W. J. Cody's rational Chebyshev form as given in Numerical
/// Recipes, `erfcc`: fractional error below 1.2e-7 everywhere).
pub fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

/// P(Z > z) for a standard normal Z.
pub fn normal_sf(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// One-sided p-value of "proportion 1 is above proportion 2" (pooled two-proportion z-test):
/// `x1` successes of `n1` against `x2` of `n2`. 1.0 when either sample is empty or both
/// proportions are 0 or 1 (nothing to tell apart).
pub fn two_proportion_p_above(x1: u64, n1: u64, x2: u64, n2: u64) -> f64 {
    if n1 == 0 || n2 == 0 {
        return 1.0;
    }
    let (n1f, n2f) = (n1 as f64, n2 as f64);
    let (p1, p2) = (x1 as f64 / n1f, x2 as f64 / n2f);
    let pooled = (x1 + x2) as f64 / (n1f + n2f);
    let se = (pooled * (1.0 - pooled) * (1.0 / n1f + 1.0 / n2f)).sqrt();
    if se <= 0.0 || !se.is_finite() {
        return 1.0;
    }
    normal_sf((p1 - p2) / se)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welch_interval_matches_a_hand_computation() {
        // a: mean 2, var 1 (n 3); b: mean 5, var 4 (n 3): se² = 1/3 + 4/3 = 5/3,
        // df = (5/3)² / ((1/9)/2 + (16/9)/2) = 2.94 → 2, t = 4.303.
        let (d, ci) = welch_ci95(&[1.0, 2.0, 3.0], &[3.0, 5.0, 7.0]).expect("interval");
        assert!((d - 3.0).abs() < 1e-12);
        let half = 4.303 * (5.0f64 / 3.0).sqrt();
        assert!((ci[0] - (3.0 - half)).abs() < 1e-9 && (ci[1] - (3.0 + half)).abs() < 1e-9);
        assert!(welch_ci95(&[1.0], &[1.0, 2.0]).is_none());
        assert_eq!(
            welch_ci95(&[1.0, 1.0], &[2.0, 2.0]),
            Some((1.0, [1.0, 1.0]))
        );
    }

    #[test]
    fn normal_tail_matches_tables() {
        for (z, p) in [
            (0.0, 0.5),
            (1.6449, 0.05),
            (2.3263, 0.01),
            (3.0902, 0.001),
            (-1.96, 0.975),
        ] {
            assert!(
                (normal_sf(z) - p).abs() < 2e-5,
                "z {z}: {} vs {p}",
                normal_sf(z)
            );
        }
        // 60% of 500 against 50% of 500: z = 3.19, p ≈ 0.0007
        let p = two_proportion_p_above(300, 500, 250, 500);
        assert!((p - 0.000_71).abs() < 5e-5, "{p}");
        assert!(two_proportion_p_above(250, 500, 300, 500) > 0.99);
        assert_eq!(two_proportion_p_above(0, 500, 0, 500), 1.0);
        assert_eq!(two_proportion_p_above(5, 0, 0, 500), 1.0);
    }

    /// The tripwire's false-alarm rate, measured: a clean checkpoint's test and sealed scores are
    /// two binomial draws with the same success rate; at level alpha the test must fire about
    /// alpha of the time (pooled z is slightly conservative near 0 and 1). Printed for the docs.
    #[test]
    fn false_alarm_rate_is_the_level() {
        use rand::{RngExt, SeedableRng, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(13);
        // RSIM_TRIPWIRE_TRIALS=20000 for the figures in ARCHITECTURE.md (slow in debug builds).
        let trials: usize = std::env::var("RSIM_TRIPWIRE_TRIALS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3_000);
        // (0.0001, 200): the dev tripwire's default level at the examples' dev and twin sizes.
        for (alpha, n) in [(0.001, 500u64), (0.01, 500), (0.001, 200), (0.0001, 200)] {
            for rate in [0.05, 0.5, 0.9] {
                let mut draw = |n: u64| (0..n).filter(|_| rng.random_bool(rate)).count() as u64;
                let alarms = (0..trials)
                    .filter(|_| {
                        let (x1, x2) = (draw(n), draw(n));
                        two_proportion_p_above(x1, n, x2, n) < alpha
                    })
                    .count();
                let measured = alarms as f64 / trials as f64;
                eprintln!("alpha {alpha} n {n}+{n} rate {rate}: false alarms {measured:.5}");
                // within 3 binomial standard errors of alpha, or below it
                let se = (alpha * (1.0 - alpha) / trials as f64).sqrt();
                assert!(
                    measured <= alpha + 3.0 * se,
                    "alpha {alpha} rate {rate}: {measured}"
                );
            }
        }
    }

    /// The dev tripwire's power at the examples' sizes (dev 200 items, twin 200) and its default
    /// level (1e-4): for each true rate, the smallest dev inflation caught in at least 80% of
    /// simulated evaluations. Printed for the docs (`RSIM_TRIPWIRE_TRIALS=20000`); a dev split
    /// trained on outright (dev near 1.0) is caught every time.
    #[test]
    fn dev_tripwire_power_at_the_examples_sizes() {
        use rand::{RngExt, SeedableRng, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(17);
        let trials: usize = std::env::var("RSIM_TRIPWIRE_TRIALS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(400);
        let (alpha, n) = (0.0001, 200u64);
        let mut power = |rate: f64, inflated: f64| {
            let mut draw = |p: f64| (0..n).filter(|_| rng.random_bool(p)).count() as u64;
            let caught = (0..trials)
                .filter(|_| {
                    let (dev, twin) = (draw(inflated), draw(rate));
                    two_proportion_p_above(dev, n, twin, n) < alpha
                })
                .count();
            caught as f64 / trials as f64
        };
        for rate in [0.05, 0.3, 0.5, 0.8] {
            let smallest = (1..=60)
                .map(|k| f64::from(k) * 0.01)
                .find(|d| rate + d <= 1.0 && power(rate, rate + d) >= 0.8);
            eprintln!(
                "dev tripwire alpha {alpha} n {n}+{n} rate {rate}: 80% power from +{smallest:?}"
            );
            let d = smallest.expect("some inflation is caught");
            assert!(d <= 0.25, "rate {rate}: only +{d} is caught");
            assert_eq!(power(rate, 1.0), 1.0, "a dev split learned outright");
        }
    }

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
