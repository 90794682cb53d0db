//! The physics of Water: units and constants of the flexible three-site water model, the
//! periodic box (size from the density, minimum image, spherical cutoff with a smooth
//! switch), and the intra- and inter-molecular forces. Nothing here knows about nodes.
//!
//! Units: length Å, time ps, mass amu (g/mol). The energy unit that follows is
//! 1 amu·Å²/ps² = 10 J/mol = 0.01 kJ/mol (per molecule: 1.66e-23 J); forces are in that
//! unit per Å, so acceleration = force / mass comes out in Å/ps² with no conversion.
//! Charges are in units of the elementary charge. Energies are printed in kJ/mol.
//!
//! Model: TIP3P charges, oxygen Lennard-Jones parameters and geometry (O-H 0.9572 Å,
//! H-O-H 104.52°), made flexible with harmonic bond and angle terms using the SPC/Fw force
//! constants, which keep each molecule near its rigid geometry. Sites of the same molecule
//! interact only through the bond and angle terms.

/// A point or vector in space (Å, or a force, ...).
pub type Vec3 = [f64; 3];
/// One value per site of a molecule, in the order O, H1, H2.
pub type Sites = [Vec3; 3];

/// Index of the oxygen site.
pub const O: usize = 0;
/// Indices of the hydrogen sites.
pub const H1: usize = 1;
pub const H2: usize = 2;

/// Site masses (amu).
pub const MASS: [f64; 3] = [15.9994, 1.008, 1.008];
/// Mass of one molecule (amu).
pub const MOLECULE_MASS: f64 = MASS[0] + MASS[1] + MASS[2];
/// Partial charges (e), TIP3P.
pub const CHARGE: [f64; 3] = [-0.834, 0.417, 0.417];

/// Energy units per kJ/mol.
pub const UNITS_PER_KJ_MOL: f64 = 100.0;
/// Boltzmann's constant in energy units per kelvin (R = 8.314462618 J/(mol K)).
pub const BOLTZMANN: f64 = 0.831_446_261_815_324;
/// e²/(4 π ε0) in energy units · Å (1389.35458 kJ/mol · Å).
pub const COULOMB: f64 = 138_935.457_644;
/// Oxygen-oxygen Lennard-Jones σ (Å) and ε (0.6364 kJ/mol), TIP3P.
pub const LJ_SIGMA: f64 = 3.150_61;
pub const LJ_EPSILON: f64 = 0.6364 * UNITS_PER_KJ_MOL;
/// Equilibrium O-H distance (Å) and H-O-H angle (degrees).
pub const BOND_LENGTH: f64 = 0.9572;
pub const BOND_ANGLE_DEG: f64 = 104.52;
/// Harmonic constants, energy ½ k (x - x0)²: bond 4431.53 kJ/mol/Å², angle
/// 317.5656 kJ/mol/rad² (SPC/Fw). The O-H stretch they give has a period of about 9 fs.
pub const BOND_K: f64 = 4431.53 * UNITS_PER_KJ_MOL;
pub const ANGLE_K: f64 = 317.5656 * UNITS_PER_KJ_MOL;

/// Number density of liquid water at 298 K: 0.997 g/cm³ / 18.0153 g/mol · N_A, per Å³.
pub const NUMBER_DENSITY: f64 = 0.997 / MOLECULE_MASS * 6.022_140_76e23 / 1e24;
/// The switch that brings a pair's interaction smoothly to zero starts this fraction of
/// the cutoff radius before it.
pub const SWITCH_WIDTH: f64 = 0.1;

/// The periodic cubic box and the interaction range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Geometry {
    /// Side of the box (Å).
    pub side: f64,
    /// Cutoff radius on the O-O distance (Å): pairs at or beyond it contribute nothing.
    pub cutoff: f64,
    /// Where the switching function starts to fall below 1 (Å).
    pub switch_on: f64,
}

impl Geometry {
    /// The box holding `molecules` molecules at liquid density, with the cutoff at half
    /// the side (the most the minimum-image convention allows).
    pub fn for_molecules(molecules: usize) -> Geometry {
        let side = (molecules as f64 / NUMBER_DENSITY).cbrt();
        let cutoff = side / 2.0;
        Geometry {
            side,
            cutoff,
            switch_on: cutoff * (1.0 - SWITCH_WIDTH),
        }
    }

    /// The switching function S(r) and dS/dr: S = 1 inside `switch_on`, 0 from `cutoff`
    /// on, and the quintic 1 - 10x³ + 15x⁴ - 6x⁵ in between (x the fraction of the way
    /// across), which is C² so energy stays conserved when pairs cross the cutoff.
    pub fn switch(&self, r: f64) -> (f64, f64) {
        if r <= self.switch_on {
            (1.0, 0.0)
        } else if r >= self.cutoff {
            (0.0, 0.0)
        } else {
            let w = self.cutoff - self.switch_on;
            let x = (r - self.switch_on) / w;
            let s = 1.0 - x * x * x * (10.0 - 15.0 * x + 6.0 * x * x);
            let ds = -30.0 * x * x * (1.0 - x) * (1.0 - x) / w;
            (s, ds)
        }
    }
}

/// The component `d` of a separation vector brought to its nearest periodic image:
/// the result lies in [-side/2, side/2].
#[inline]
pub fn min_image(d: f64, side: f64) -> f64 {
    d - side * (d / side).round()
}

#[inline]
fn sub(a: Vec3, b: Vec3) -> Vec3 {
    [a[0] - b[0], a[1] - b[1], a[2] - b[2]]
}

#[inline]
fn dot(a: Vec3, b: Vec3) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

#[inline]
fn add_scaled(acc: &mut Vec3, s: f64, v: Vec3) {
    acc[0] += s * v[0];
    acc[1] += s * v[1];
    acc[2] += s * v[2];
}

/// Potential energy and virial contribution of one interaction.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Contribution {
    pub energy: f64,
    /// Σ r_i · F_i over the sites involved.
    pub virial: f64,
}

/// Bond and angle terms of one molecule: adds the forces to `f` and returns the energy
/// and virial. Molecules are kept whole (never split by the periodic wrap), so plain
/// differences are right here.
pub fn intra(x: &Sites, f: &mut Sites) -> Contribution {
    let u = sub(x[H1], x[O]);
    let v = sub(x[H2], x[O]);
    let mut energy = 0.0;
    let mut virial = 0.0;
    let lu = dot(u, u).sqrt();
    let lv = dot(v, v).sqrt();
    for (h, d, len) in [(H1, u, lu), (H2, v, lv)] {
        let stretch = len - BOND_LENGTH;
        energy += 0.5 * BOND_K * stretch * stretch;
        let s = -BOND_K * stretch / len;
        add_scaled(&mut f[h], s, d);
        add_scaled(&mut f[O], -s, d);
        virial += s * len * len;
    }
    let cos = (dot(u, v) / (lu * lv)).clamp(-1.0, 1.0);
    let theta = cos.acos();
    let bend = theta - BOND_ANGLE_DEG.to_radians();
    energy += 0.5 * ANGLE_K * bend * bend;
    // F = -dU/dθ · dθ/dx with dθ/dx = -(dcosθ/dx) / sinθ.
    let sin = (1.0 - cos * cos).sqrt().max(1e-12);
    let g = ANGLE_K * bend / sin;
    let mut fh1 = [0.0; 3];
    add_scaled(&mut fh1, g / (lu * lv), v);
    add_scaled(&mut fh1, -g * cos / (lu * lu), u);
    let mut fh2 = [0.0; 3];
    add_scaled(&mut fh2, g / (lu * lv), u);
    add_scaled(&mut fh2, -g * cos / (lv * lv), v);
    add_scaled(&mut f[H1], 1.0, fh1);
    add_scaled(&mut f[H2], 1.0, fh2);
    add_scaled(&mut f[O], -1.0, fh1);
    add_scaled(&mut f[O], -1.0, fh2);
    virial += dot(u, fh1) + dot(v, fh2);
    Contribution { energy, virial }
}

/// Interaction of molecules `a` and `b`: Coulomb between all nine site pairs plus
/// Lennard-Jones between the oxygens, all at the periodic image of `b` nearest to `a` by
/// O-O distance, scaled by the switch of the O-O distance. Adds the forces to `fa` and
/// `fb` (equal and opposite in total) and returns the energy and virial, or `None`
/// (touching nothing) when the oxygens are at least the cutoff apart.
pub fn inter(
    a: &Sites,
    b: &Sites,
    geo: &Geometry,
    fa: &mut Sites,
    fb: &mut Sites,
) -> Option<Contribution> {
    let mut shift = [0.0; 3];
    let mut d = [0.0; 3];
    for k in 0..3 {
        let raw = a[O][k] - b[O][k];
        d[k] = min_image(raw, geo.side);
        shift[k] = d[k] - raw;
    }
    let r2 = dot(d, d);
    if r2 >= geo.cutoff * geo.cutoff {
        return None;
    }
    let mut u = 0.0;
    let mut w = 0.0;
    let mut ga: Sites = [[0.0; 3]; 3];
    let mut gb: Sites = [[0.0; 3]; 3];
    for (sa, xa) in a.iter().enumerate() {
        for (sb, xb) in b.iter().enumerate() {
            let rab = [
                xa[0] - xb[0] + shift[0],
                xa[1] - xb[1] + shift[1],
                xa[2] - xb[2] + shift[2],
            ];
            let s2 = dot(rab, rab);
            let inv2 = 1.0 / s2;
            let mut e = COULOMB * CHARGE[sa] * CHARGE[sb] * inv2.sqrt();
            // Force on a's site = fr · rab.
            let mut fr = e * inv2;
            if sa == O && sb == O {
                let p6 = (LJ_SIGMA * LJ_SIGMA * inv2).powi(3);
                e += 4.0 * LJ_EPSILON * (p6 * p6 - p6);
                fr += 24.0 * LJ_EPSILON * (2.0 * p6 * p6 - p6) * inv2;
            }
            u += e;
            w += fr * s2;
            add_scaled(&mut ga[sa], fr, rab);
            add_scaled(&mut gb[sb], -fr, rab);
        }
    }
    let r = r2.sqrt();
    let (s, ds) = geo.switch(r);
    for k in 0..3 {
        add_scaled(&mut fa[k], s, ga[k]);
        add_scaled(&mut fb[k], s, gb[k]);
    }
    // The switch depends on the O-O distance: -U dS/dr along d on the oxygens.
    let g = -u * ds / r;
    add_scaled(&mut fa[O], g, d);
    add_scaled(&mut fb[O], -g, d);
    Some(Contribution {
        energy: s * u,
        virial: s * w + g * r2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A molecule at `o` with its hydrogens slightly off the equilibrium geometry.
    fn molecule(o: Vec3, tilt: f64) -> Sites {
        let half = (BOND_ANGLE_DEG.to_radians() + tilt) / 2.0;
        [
            o,
            [
                o[0] + 0.97 * half.sin(),
                o[1] + 0.01,
                o[2] + 0.97 * half.cos(),
            ],
            [
                o[0] - 0.95 * half.sin(),
                o[1] - 0.02,
                o[2] + 0.95 * half.cos(),
            ],
        ]
    }

    fn total(f: &Sites) -> Vec3 {
        let mut t = [0.0; 3];
        for s in f {
            add_scaled(&mut t, 1.0, *s);
        }
        t
    }

    #[test]
    fn min_image_picks_the_nearest_copy() {
        let side = 10.0;
        assert_eq!(min_image(3.0, side), 3.0);
        assert_eq!(min_image(-3.0, side), -3.0);
        assert!((min_image(7.0, side) - -3.0).abs() < 1e-12);
        assert!((min_image(-7.0, side) - 3.0).abs() < 1e-12);
        assert!((min_image(23.5, side) - 3.5).abs() < 1e-12);
        assert!((min_image(-16.0, side) - 4.0).abs() < 1e-12);
        for k in -100..=100 {
            let d = k as f64 * 0.37;
            let m = min_image(d, side);
            assert!(m.abs() <= side / 2.0 + 1e-12, "{d} -> {m}");
            let copies = (d - m) / side;
            assert!((copies - copies.round()).abs() < 1e-9, "{d} -> {m}");
        }
    }

    #[test]
    fn box_side_gives_liquid_density() {
        let g = Geometry::for_molecules(216);
        let grams_per_cm3 = 216.0 * MOLECULE_MASS / 6.022_140_76e23 / (g.side.powi(3) * 1e-24);
        assert!((grams_per_cm3 - 0.997).abs() < 1e-9, "{grams_per_cm3}");
        assert!((g.side - 18.64).abs() < 0.01, "{}", g.side);
    }

    #[test]
    fn switch_is_smooth_and_bounded() {
        let g = Geometry::for_molecules(216);
        assert_eq!(g.switch(g.switch_on), (1.0, 0.0));
        assert_eq!(g.switch(g.cutoff), (0.0, 0.0));
        let h = 1e-6;
        for k in 1..20 {
            let r = g.switch_on + (g.cutoff - g.switch_on) * k as f64 / 20.0;
            let (s, ds) = g.switch(r);
            assert!((0.0..=1.0).contains(&s));
            let num = (g.switch(r + h).0 - g.switch(r - h).0) / (2.0 * h);
            assert!((num - ds).abs() < 1e-6, "r {r}: {num} vs {ds}");
        }
    }

    #[test]
    fn equilibrium_geometry_has_no_intra_force() {
        let half = BOND_ANGLE_DEG.to_radians() / 2.0;
        let x = [
            [1.0, 2.0, 3.0],
            [
                1.0 + BOND_LENGTH * half.sin(),
                2.0,
                3.0 + BOND_LENGTH * half.cos(),
            ],
            [
                1.0 - BOND_LENGTH * half.sin(),
                2.0,
                3.0 + BOND_LENGTH * half.cos(),
            ],
        ];
        let mut f = [[0.0; 3]; 3];
        let c = intra(&x, &mut f);
        assert!(c.energy.abs() < 1e-9, "{c:?}");
        for s in f {
            for v in s {
                assert!(v.abs() < 1e-6, "{f:?}");
            }
        }
    }

    /// Central-difference gradient of `energy` with respect to every site coordinate.
    fn numeric_forces(x: &Sites, energy: impl Fn(&Sites) -> f64) -> Sites {
        let h = 1e-6;
        let mut f = [[0.0; 3]; 3];
        for s in 0..3 {
            for k in 0..3 {
                let mut p = *x;
                p[s][k] += h;
                let mut m = *x;
                m[s][k] -= h;
                f[s][k] = -(energy(&p) - energy(&m)) / (2.0 * h);
            }
        }
        f
    }

    fn assert_close(got: &Sites, want: &Sites, tol: f64) {
        for s in 0..3 {
            for k in 0..3 {
                let scale = want[s][k].abs().max(1.0);
                assert!(
                    (got[s][k] - want[s][k]).abs() <= tol * scale,
                    "site {s} axis {k}: {} vs {}",
                    got[s][k],
                    want[s][k]
                );
            }
        }
    }

    #[test]
    fn intra_forces_are_minus_the_gradient_and_sum_to_zero() {
        let x = molecule([0.3, -0.2, 0.5], 0.15);
        let mut f = [[0.0; 3]; 3];
        intra(&x, &mut f);
        let num = numeric_forces(&x, |y| intra(y, &mut [[0.0; 3]; 3]).energy);
        assert_close(&f, &num, 1e-5);
        for v in total(&f) {
            assert!(v.abs() < 1e-8, "{f:?}");
        }
    }

    #[test]
    fn inter_forces_obey_newtons_third_law_and_match_the_gradient() {
        let g = Geometry::for_molecules(216);
        // Inside the switch region too, and across the periodic boundary.
        for (offset, tilt) in [
            ([2.9, 0.3, -0.4], 0.1),
            ([0.1, 3.4, 1.2], -0.2),
            ([g.switch_on + 0.05, 0.2, 0.1], 0.0),
            ([g.side - 3.0, 0.5, -0.3], 0.3),
        ] {
            let a = molecule([1.0, 1.0, 1.0], 0.0);
            let b = molecule([1.0 + offset[0], 1.0 + offset[1], 1.0 + offset[2]], tilt);
            let mut fa = [[0.0; 3]; 3];
            let mut fb = [[0.0; 3]; 3];
            let c = inter(&a, &b, &g, &mut fa, &mut fb).expect("within the cutoff");
            let (ta, tb) = (total(&fa), total(&fb));
            for k in 0..3 {
                assert!(
                    (ta[k] + tb[k]).abs() <= 1e-9 * ta[k].abs().max(1.0),
                    "{ta:?} {tb:?}"
                );
            }
            // Swapping the roles gives the same energy and mirrored forces.
            let mut fa2 = [[0.0; 3]; 3];
            let mut fb2 = [[0.0; 3]; 3];
            let c2 = inter(&b, &a, &g, &mut fb2, &mut fa2).unwrap();
            assert!((c.energy - c2.energy).abs() <= 1e-9 * c.energy.abs().max(1.0));
            assert_close(&fa2, &fa, 1e-9);
            let energy_a = |y: &Sites| {
                inter(y, &b, &g, &mut [[0.0; 3]; 3], &mut [[0.0; 3]; 3]).map_or(0.0, |c| c.energy)
            };
            assert_close(&fa, &numeric_forces(&a, energy_a), 1e-5);
        }
    }

    #[test]
    fn pairs_beyond_the_cutoff_contribute_nothing() {
        let g = Geometry::for_molecules(27);
        // Beyond the cutoff also after the minimum image (which maps any single axis
        // back within half the side): off along a diagonal.
        let off = 0.75 * g.cutoff;
        let a = molecule([0.5, 0.5, 0.5], 0.0);
        let b = molecule([0.5 + off, 0.5 - off, 0.5], 0.0);
        let mut fa = [[0.0; 3]; 3];
        let mut fb = [[0.0; 3]; 3];
        assert!(inter(&a, &b, &g, &mut fa, &mut fb).is_none());
        assert_eq!(fa, [[0.0; 3]; 3]);
        assert_eq!(fb, [[0.0; 3]; 3]);
    }

    #[test]
    fn a_close_water_dimer_is_bound() {
        // Oxygens 2.9 Å apart with one hydrogen pointing at the other oxygen: the
        // hydrogen bond makes the energy clearly negative (TIP3P: about -26 kJ/mol at
        // the optimum, so a few to a few tens of kJ/mol here).
        let g = Geometry::for_molecules(216);
        let half = BOND_ANGLE_DEG.to_radians() / 2.0;
        let donor = [
            [0.0, 0.0, 0.0],
            [BOND_LENGTH, 0.0, 0.0],
            [
                BOND_LENGTH * (2.0 * half).cos(),
                BOND_LENGTH * (2.0 * half).sin(),
                0.0,
            ],
        ];
        let acceptor = [
            [2.9, 0.0, 0.0],
            [2.9 + 0.6, 0.0, 0.75],
            [2.9 + 0.6, 0.0, -0.75],
        ];
        let c = inter(
            &donor,
            &acceptor,
            &g,
            &mut [[0.0; 3]; 3],
            &mut [[0.0; 3]; 3],
        )
        .unwrap();
        let kj = c.energy / UNITS_PER_KJ_MOL;
        assert!((-40.0..-5.0).contains(&kj), "{kj} kJ/mol");
    }
}
