//! The sixth-order Gear predictor-corrector for a second-order equation x'' = a(x).
//!
//! State per coordinate: the scaled derivatives r_k = dt^k / k! · x^(k), k = 0..=5. The
//! predictor is the Taylor step, which for scaled derivatives is multiplication by the
//! Pascal triangle: r_k += Σ_{j>k} C(j, k) r_j. After the force at the predicted position
//! is known, the mismatch Δ = dt²/2 · a - r_2 corrects every term: r_k += α_k Δ, with
//! Gear's coefficients for this order and a position-only force.

/// Number of scaled derivatives kept (positions and five time derivatives).
pub const ORDER: usize = 6;

/// Gear's corrector coefficients for a second-order equation with six values.
pub const ALPHA: [f64; ORDER] = [
    3.0 / 16.0,
    251.0 / 360.0,
    1.0,
    11.0 / 18.0,
    1.0 / 6.0,
    1.0 / 60.0,
];

/// One coordinate's scaled derivatives.
pub type Derivs = [f64; ORDER];

/// Advances `r` by one step with the Taylor series (binomial coefficients).
#[inline]
pub fn predict(r: &mut Derivs) {
    // Lower orders first: each uses only the not-yet-updated higher ones.
    r[0] += r[1] + r[2] + r[3] + r[4] + r[5];
    r[1] += 2.0 * r[2] + 3.0 * r[3] + 4.0 * r[4] + 5.0 * r[5];
    r[2] += 3.0 * r[3] + 6.0 * r[4] + 10.0 * r[5];
    r[3] += 4.0 * r[4] + 10.0 * r[5];
    r[4] += 5.0 * r[5];
}

/// Corrects the predicted `r` given the acceleration `acc` at the predicted position.
#[inline]
pub fn correct(r: &mut Derivs, acc: f64, dt: f64) {
    let delta = 0.5 * dt * dt * acc - r[2];
    for (x, a) in r.iter_mut().zip(ALPHA) {
        *x += a * delta;
    }
}

/// The starting state: position, velocity and the acceleration at the start; the higher
/// derivatives start at zero.
pub fn start(x: f64, v: f64, acc: f64, dt: f64) -> Derivs {
    [x, v * dt, 0.5 * dt * dt * acc, 0.0, 0.0, 0.0]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// x'' = -ω² x from x = 1, v = 0, for `steps` steps of `dt`.
    fn oscillator(omega: f64, dt: f64, steps: usize) -> Derivs {
        let mut r = start(1.0, 0.0, -omega * omega, dt);
        for _ in 0..steps {
            predict(&mut r);
            let acc = -omega * omega * r[0];
            correct(&mut r, acc, dt);
        }
        r
    }

    #[test]
    fn predictor_is_exact_for_a_quintic() {
        // x(t) = t⁵ has scaled derivatives that the Pascal step moves exactly.
        let dt = 0.1;
        let t0: f64 = 0.7;
        let scaled = |t: f64| -> Derivs {
            [
                t.powi(5),
                5.0 * t.powi(4) * dt,
                10.0 * t.powi(3) * dt * dt,
                10.0 * t.powi(2) * dt.powi(3),
                5.0 * t * dt.powi(4),
                dt.powi(5),
            ]
        };
        let mut r = scaled(t0);
        predict(&mut r);
        let want = scaled(t0 + dt);
        for k in 0..ORDER {
            assert!((r[k] - want[k]).abs() < 1e-12, "{k}: {r:?} vs {want:?}");
        }
    }

    #[test]
    fn harmonic_oscillator_follows_the_cosine() {
        let omega = 2.0;
        let dt = 0.01;
        let steps = 1000; // t = 10, more than three periods
        let r = oscillator(omega, dt, steps);
        let t = dt * steps as f64;
        let x = (omega * t).cos();
        let v = -omega * (omega * t).sin();
        assert!((r[0] - x).abs() < 1e-6, "x {} vs {x}", r[0]);
        assert!((r[1] / dt - v).abs() < 1e-5, "v {} vs {v}", r[1] / dt);
    }

    #[test]
    fn harmonic_oscillator_conserves_energy() {
        let omega = 1.0;
        let dt = 0.05;
        let energy = |r: &Derivs| 0.5 * (r[1] / dt).powi(2) + 0.5 * omega * omega * r[0] * r[0];
        let e0 = 0.5 * omega * omega;
        let mut r = start(1.0, 0.0, -omega * omega, dt);
        for step in 0..2000 {
            predict(&mut r);
            let acc = -omega * omega * r[0];
            correct(&mut r, acc, dt);
            assert!(
                (energy(&r) - e0).abs() < 1e-6 * e0,
                "step {step}: {}",
                energy(&r)
            );
        }
    }

    #[test]
    fn error_shrinks_fast_with_the_step() {
        // The global error of the corrected positions falls much faster than dt.
        let omega = 1.0;
        let t = 5.0;
        let err = |dt: f64| {
            let steps = (t / dt).round() as usize;
            (oscillator(omega, dt, steps)[0] - (omega * t).cos()).abs()
        };
        let (coarse, fine) = (err(0.1), err(0.05));
        assert!(fine < coarse / 8.0, "{coarse} -> {fine}");
    }
}
