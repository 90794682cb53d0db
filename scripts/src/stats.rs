//! Summary statistics of repeated measurements: median with its min–max spread, and the
//! geometric mean used for slowdown ratios (ratios multiply, so their mean is geometric).

use serde::{Deserialize, Serialize};

/// Median and spread of a set of repeated measurements.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

/// Median of the finite values; the mean of the two middle values for an even count.
pub fn median(xs: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// Median, min and max of the finite values (non-finite ones are measurement failures).
pub fn summary(xs: &[f64]) -> Option<Summary> {
    let v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    let median = median(&v)?;
    Some(Summary {
        median,
        min: v.iter().copied().fold(f64::INFINITY, f64::min),
        max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        n: v.len(),
    })
}

/// Geometric mean; `None` when empty or when a value is not positive (a ratio of 0 or
/// below means a broken measurement, and would make the mean meaningless).
pub fn geomean(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() || xs.iter().any(|&x| !(x > 0.0 && x.is_finite())) {
        return None;
    }
    Some((xs.iter().map(|x| x.ln()).sum::<f64>() / xs.len() as f64).exp())
}

/// Ratios of paired measurements (`on[i] / off[i]`), for runs made alternately so that
/// each pair saw the same machine load.
pub fn paired_ratios(off: &[f64], on: &[f64]) -> Vec<f64> {
    off.iter()
        .zip(on)
        .filter(|(a, b)| **a > 0.0 && a.is_finite() && b.is_finite())
        .map(|(a, b)| b / a)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[5.0]), Some(5.0));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN, 1.0]), Some(1.0));
    }

    #[test]
    fn summary_spread() {
        let s = summary(&[0.3, 0.1, 0.2, 0.5]).unwrap();
        assert_eq!(s.n, 4);
        assert!((s.median - 0.25).abs() < 1e-12);
        assert_eq!(s.min, 0.1);
        assert_eq!(s.max, 0.5);
        assert!(summary(&[f64::INFINITY]).is_none());
    }

    #[test]
    fn geomean_of_ratios() {
        assert!((geomean(&[2.0, 8.0]).unwrap() - 4.0).abs() < 1e-12);
        assert!((geomean(&[1.5]).unwrap() - 1.5).abs() < 1e-12);
        assert_eq!(geomean(&[]), None);
        assert_eq!(geomean(&[1.0, 0.0]), None);
        assert_eq!(geomean(&[1.0, -2.0]), None);
    }

    #[test]
    fn paired_ratios_skip_broken_pairs() {
        let r = paired_ratios(&[1.0, 0.0, 2.0], &[1.5, 1.0, 3.0]);
        assert_eq!(r, vec![1.5, 1.5]);
        // Unequal lengths: only complete pairs count.
        assert_eq!(paired_ratios(&[1.0, 2.0], &[2.0]), vec![2.0]);
    }
}
