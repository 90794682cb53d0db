//! Water: an N-squared molecular dynamics of liquid water (after SPLASH-2's water-nsquared,
//! written from the physics): flexible three-site molecules in a periodic cubic box,
//! intra-molecular bond and angle forces, Lennard-Jones plus Coulomb between molecules
//! within a spherical cutoff, and a sixth-order Gear predictor-corrector. This module owns
//! the simulation state, the step shared by the parallel and the sequential code, the
//! deterministic initial state and the DSM driver; the physics is in [`model`], the
//! integrator in [`gear`].
//!
//! Shared data: "mol" (each molecule's Gear state, accessed only by its owner),
//! "positions" (the site positions, written by the owner, read by everyone), "forces"
//! (per-molecule site forces, summed by everyone under locks) and "energy" (one row of
//! global sums per step: kinetic, intra and inter potential energy, virial).
//!
//! Parallel structure. Molecules are block-partitioned over the nodes (`band`). Each step
//! has two phases, each ending with a barrier:
//! 1. forces: every node reads all positions, computes the intra-molecular forces of its
//!    own molecules and the interactions of each own molecule `i` with the next half of
//!    the molecules (`i+1 ..= i+N/2`, wrapping; each pair is computed exactly once
//!    overall), sums them privately, then adds the sums into the shared `forces` array,
//!    one block at a time under that block's lock (by default one lock per node's block
//!    of molecules, `FORCE_LOCK_BASE + block`; with [`LockMode::Molecule`] one lock per
//!    molecule, `FORCE_LOCK_BASE + molecule`), starting with its own block and going
//!    round so that nodes do not queue on the same lock. The potential energy and the
//!    virial go into the step's row of the shared `energy` array under the lock named
//!    "energy".
//! 2. update: each node corrects its own molecules with the forces, wraps them into the
//!    box, adds their kinetic energy to the step's `energy` row (same lock), predicts the
//!    next step, publishes the predicted positions and clears its molecules' forces.
//!
//! Step 0 is the start-up: three force phases (at the initial positions, which also give
//! the step's energies, and at x0 ± dt·v for the third Gear term, see [`start`]).
//!
//! With `racy` set, the force sums go into `forces` without their locks: concurrent
//! read-modify-writes of the same elements by different nodes, the write-write race the
//! race detector must report on `forces`.

pub mod gear;
pub mod model;

use dsm_core::{band, Array, Distribution, Dsm, DsmError};
use model::{Contribution, Geometry, Sites, Vec3, BOLTZMANN, MASS, UNITS_PER_KJ_MOL};
use std::ops::Range;

/// Default number of molecules (a 6 x 6 x 6 lattice).
pub const DEFAULT_MOLECULES: usize = 216;
/// Default number of time steps.
pub const DEFAULT_STEPS: usize = 5;
/// Default time step in femtoseconds: about 1/36 of the O-H stretch period (the fastest
/// motion), where the Gear integrator conserves energy well (see [`drift_bound`]).
pub const DEFAULT_DT_FS: f64 = 0.25;
/// Initial temperature (K).
pub const TEMPERATURE: f64 = 298.0;
/// Seed of the initial-state generator.
pub const SEED: u64 = 0x5741_5445_525f_3239;
/// Lock ids of the force locks start here (block or molecule index added).
pub const FORCE_LOCK_BASE: u64 = 1000;
/// Name of the lock guarding the global sums.
pub const ENERGY_LOCK: &str = "energy";

/// Largest accepted relative difference between parallel and sequential energies.
pub const MATCH_TOLERANCE: f64 = 1e-9;
/// Energy drift allowed at the default time step: a start-up part plus a part per step
/// (see [`drift_bound`]).
pub const DRIFT_START: f64 = 5e-5;
pub const DRIFT_PER_STEP: f64 = 5e-7;

/// One molecule's dynamical state: for each of the six Gear terms (position, then the
/// scaled time derivatives dt^k/k! x^(k)), the value for each site and axis.
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct Molecule {
    pub d: [Sites; gear::ORDER],
}

impl Molecule {
    /// Site positions.
    pub fn positions(&self) -> &Sites {
        &self.d[0]
    }

    fn derivs(&self, site: usize, axis: usize) -> gear::Derivs {
        std::array::from_fn(|k| self.d[k][site][axis])
    }

    fn set_derivs(&mut self, site: usize, axis: usize, r: &gear::Derivs) {
        for (k, x) in r.iter().enumerate() {
            self.d[k][site][axis] = *x;
        }
    }

    /// Velocity of a site (Å/ps).
    pub fn velocity(&self, site: usize, dt: f64) -> Vec3 {
        std::array::from_fn(|k| self.d[1][site][k] / dt)
    }
}

/// The global sums of one step (energy units).
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct Energies {
    pub kinetic: f64,
    pub potential_intra: f64,
    pub potential_inter: f64,
    /// Σ r · F over all interactions (intra and inter).
    pub virial: f64,
}

impl Energies {
    pub fn potential(&self) -> f64 {
        self.potential_intra + self.potential_inter
    }

    pub fn total(&self) -> f64 {
        self.kinetic + self.potential()
    }

    fn add(&mut self, o: &Energies) {
        self.kinetic += o.kinetic;
        self.potential_intra += o.potential_intra;
        self.potential_inter += o.potential_inter;
        self.virial += o.virial;
    }
}

/// How the force sums are protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LockMode {
    /// One lock per node's block of molecules (few lock operations).
    #[default]
    Block,
    /// One lock per molecule (like water-nsquared; many more lock operations).
    Molecule,
}

/// What to simulate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    /// Number of molecules, a perfect cube.
    pub molecules: usize,
    pub steps: usize,
    /// Time step (ps).
    pub dt: f64,
}

impl Params {
    /// Checks the molecule count and time step.
    pub fn new(molecules: usize, steps: usize, dt_fs: f64) -> Result<Params, String> {
        if lattice_side(molecules).is_none() {
            let below = (1..)
                .map(|k| k * k * k)
                .take_while(|&c| c < molecules)
                .last();
            let above = (1..)
                .map(|k| k * k * k)
                .find(|&c| c > molecules)
                .unwrap_or(1);
            return Err(format!(
                "the number of molecules must be a perfect cube (they start on a k x k x k \
                 lattice); {molecules} is not{}",
                match below {
                    Some(b) => format!(": try {b} or {above}"),
                    None => format!(": try {above}"),
                }
            ));
        }
        if !(dt_fs > 0.0 && dt_fs.is_finite()) {
            return Err(format!(
                "the time step must be a positive number of fs (got {dt_fs})"
            ));
        }
        Ok(Params {
            molecules,
            steps,
            dt: dt_fs * 1e-3,
        })
    }

    pub fn geometry(&self) -> Geometry {
        Geometry::for_molecules(self.molecules)
    }

    /// Degrees of freedom for the temperature: three per site, less the conserved total
    /// momentum.
    pub fn degrees_of_freedom(&self) -> f64 {
        (9 * self.molecules).saturating_sub(3).max(1) as f64
    }

    /// Temperature (K) of a kinetic energy.
    pub fn temperature(&self, kinetic: f64) -> f64 {
        2.0 * kinetic / (BOLTZMANN * self.degrees_of_freedom())
    }
}

/// Largest accepted energy drift of a run, max |E(s) - E(0)| relative to the starting
/// energy scale |K(0)| + |U(0)|: `(DRIFT_START + DRIFT_PER_STEP · steps) ·
/// max(1, (dt / 0.25 fs)⁵)`.
///
/// Why: measured at the default 0.25 fs, the drift is 3e-6 to 7e-6 on 8 to 216
/// molecules after the first steps (the start-up, whose third derivative comes from a
/// central difference, and the corrector settling), then grows by about 8e-8 per step
/// (7.5e-5 after 1000 steps, 3.3e-4 after 4000 on 216 molecules). The worst case is a
/// single molecule, whose energy is all in the stiff vibrations: 2.3e-5 at the start,
/// then 2.3e-7 per step (9.2e-4 after 4000). The bound is at least twice the worst case
/// everywhere. Both parts grow like dt^4 to dt^5 (216 molecules at 0.5 fs: 9e-5 after 5
/// steps, 2.4e-3 after 2000), hence the fifth power for longer steps; shorter steps keep
/// the default bound. A wrong force term or integrator coefficient moves the energy by
/// far more (a start without the third derivative alone gives 2e-3 after one step).
pub fn drift_bound(p: &Params) -> f64 {
    let dt_ratio = (p.dt / (DEFAULT_DT_FS * 1e-3)).max(1.0);
    (DRIFT_START + DRIFT_PER_STEP * p.steps as f64) * dt_ratio.powi(5)
}

/// `k` with `k³ = n`, if there is one (n >= 1).
pub fn lattice_side(n: usize) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let k = (n as f64).cbrt().round() as usize;
    (k.saturating_sub(1)..=k + 1).find(|&c| c * c * c == n)
}

pub use crate::SplitMix64;

fn random_rotation(rng: &mut SplitMix64) -> [Vec3; 3] {
    let (u1, u2, u3) = (rng.uniform(), rng.uniform(), rng.uniform());
    let tau = 2.0 * std::f64::consts::PI;
    let (a, b) = ((1.0 - u1).sqrt(), u1.sqrt());
    let (x, y, z, w) = (
        a * (tau * u2).sin(),
        a * (tau * u2).cos(),
        b * (tau * u3).sin(),
        b * (tau * u3).cos(),
    );
    [
        [
            1.0 - 2.0 * (y * y + z * z),
            2.0 * (x * y - z * w),
            2.0 * (x * z + y * w),
        ],
        [
            2.0 * (x * y + z * w),
            1.0 - 2.0 * (x * x + z * z),
            2.0 * (y * z - x * w),
        ],
        [
            2.0 * (x * z - y * w),
            2.0 * (y * z + x * w),
            1.0 - 2.0 * (x * x + y * y),
        ],
    ]
}

/// The starting positions and velocities of all molecules (the same on every node):
/// oxygens at the centres of a k x k x k lattice filling the box, each molecule in its
/// equilibrium geometry and a random orientation, site velocities drawn from the
/// Maxwell-Boltzmann distribution, then shifted to zero total momentum and scaled to
/// exactly [`TEMPERATURE`]. The higher Gear terms are filled in by the start-up
/// ([`start`]), which needs forces.
pub fn initial_state(p: &Params) -> Vec<Molecule> {
    let k = lattice_side(p.molecules).expect("validated molecule count");
    let geo = p.geometry();
    let spacing = geo.side / k as f64;
    let half = model::BOND_ANGLE_DEG.to_radians() / 2.0;
    let body: Sites = [
        [0.0, 0.0, 0.0],
        [
            model::BOND_LENGTH * half.sin(),
            0.0,
            model::BOND_LENGTH * half.cos(),
        ],
        [
            -model::BOND_LENGTH * half.sin(),
            0.0,
            model::BOND_LENGTH * half.cos(),
        ],
    ];
    let mut rng = SplitMix64::new(SEED);
    let mut pos: Vec<Sites> = Vec::with_capacity(p.molecules);
    for m in 0..p.molecules {
        let cell = [m / (k * k), (m / k) % k, m % k];
        let o: Vec3 = std::array::from_fn(|a| (cell[a] as f64 + 0.5) * spacing);
        let rot = random_rotation(&mut rng);
        pos.push(std::array::from_fn(|s| {
            std::array::from_fn(|a| {
                o[a] + rot[a][0] * body[s][0] + rot[a][1] * body[s][1] + rot[a][2] * body[s][2]
            })
        }));
    }
    let mut vel: Vec<Sites> = (0..p.molecules)
        .map(|_| {
            std::array::from_fn(|s| {
                let sd = (BOLTZMANN * TEMPERATURE / MASS[s]).sqrt();
                std::array::from_fn(|_| sd * rng.normal())
            })
        })
        .collect();
    let mut momentum = [0.0; 3];
    for v in &vel {
        for (s, vs) in v.iter().enumerate() {
            for a in 0..3 {
                momentum[a] += MASS[s] * vs[a];
            }
        }
    }
    let total_mass = model::MOLECULE_MASS * p.molecules as f64;
    let mut kinetic = 0.0;
    for v in &mut vel {
        for (s, vs) in v.iter_mut().enumerate() {
            for a in 0..3 {
                vs[a] -= momentum[a] / total_mass;
                kinetic += 0.5 * MASS[s] * vs[a] * vs[a];
            }
        }
    }
    let scale = if kinetic > 0.0 {
        (TEMPERATURE / p.temperature(kinetic)).sqrt()
    } else {
        0.0
    };
    pos.iter()
        .zip(&vel)
        .map(|(x, v)| {
            let mut m = Molecule::default();
            for s in 0..3 {
                for a in 0..3 {
                    m.set_derivs(s, a, &gear::start(x[s][a], scale * v[s][a], 0.0, p.dt));
                }
            }
            m
        })
        .collect()
}

/// Number of partners of molecule `i` among the `n` (the ones following it, wrapping):
/// half of the others, and for even `n` the pairs exactly opposite only from the first
/// half, so that every pair is counted once.
pub fn partners(i: usize, n: usize) -> usize {
    if n % 2 == 1 {
        (n - 1) / 2
    } else if i < n / 2 {
        n / 2
    } else {
        n / 2 - 1
    }
}

/// Forces for the molecules in `mine`: their intra-molecular terms and their interactions
/// with their partners, added into `f` (indexed by molecule; partners' entries too) and
/// flagged in `touched`. Returns the potential energies and virial (kinetic left 0).
pub fn force_pass(
    x: &[Sites],
    mine: Range<usize>,
    geo: &Geometry,
    f: &mut [Sites],
    touched: &mut [bool],
) -> Energies {
    let n = x.len();
    let mut e = Energies::default();
    for i in mine {
        let c = model::intra(&x[i], &mut f[i]);
        e.potential_intra += c.energy;
        e.virial += c.virial;
        touched[i] = true;
        let mut fi = f[i];
        for k in 1..=partners(i, n) {
            let j = (i + k) % n;
            if let Some(Contribution { energy, virial }) =
                model::inter(&x[i], &x[j], geo, &mut fi, &mut f[j])
            {
                e.potential_inter += energy;
                e.virial += virial;
                touched[j] = true;
            }
        }
        f[i] = fi;
    }
    e
}

/// Kinetic energy of one molecule.
pub fn kinetic(m: &Molecule, dt: f64) -> f64 {
    let mut k = 0.0;
    for (s, mass) in MASS.iter().enumerate() {
        let v = m.velocity(s, dt);
        k += 0.5 * mass * (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
    }
    k
}

/// Moves a molecule's sites from `x0` by `sign` times one step's displacement (dt·v):
/// the positions at which the start-up evaluates the forces.
pub fn displace(m: &mut Molecule, x0: &Sites, sign: f64) {
    m.d[0] = std::array::from_fn(|s| std::array::from_fn(|a| x0[s][a] + sign * m.d[1][s][a]));
}

/// The complete starting Gear state of one molecule at positions `x0`: the second term
/// from the forces `f0` there, the third (the rate of change of the acceleration) from
/// the central difference of the forces `fp` and `fm` at x0 ± dt·v, which is exact to
/// O(dt²) for forces that depend on positions only. Without it the corrector would take
/// several steps to learn that term, and the energy would jump meanwhile (by about 2e-3
/// of the energy scale at the default step, against 2e-6 with it).
pub fn start(m: &mut Molecule, x0: &Sites, f0: &Sites, fp: &Sites, fm: &Sites, dt: f64) {
    for (s, mass) in MASS.iter().enumerate() {
        for a in 0..3 {
            m.d[0][s][a] = x0[s][a];
            m.d[2][s][a] = 0.5 * dt * dt * f0[s][a] / mass;
            // d3 = dt³/6 · (F(x0 + dt v) - F(x0 - dt v)) / (2 dt m)
            m.d[3][s][a] = dt * dt / 12.0 * (fp[s][a] - fm[s][a]) / mass;
        }
    }
}

/// The corrector step of one molecule given the forces at its predicted positions, then
/// the periodic wrap (the whole molecule moves, by its oxygen, so molecules are never
/// split). Returns its kinetic energy.
pub fn correct(m: &mut Molecule, f: &Sites, geo: &Geometry, dt: f64) -> f64 {
    for (s, fs) in f.iter().enumerate() {
        for (a, fa) in fs.iter().enumerate() {
            let mut r = m.derivs(s, a);
            gear::correct(&mut r, fa / MASS[s], dt);
            m.set_derivs(s, a, &r);
        }
    }
    for a in 0..3 {
        let wrap = geo.side * (m.d[0][model::O][a] / geo.side).floor();
        if wrap != 0.0 {
            for s in 0..3 {
                m.d[0][s][a] -= wrap;
            }
        }
    }
    kinetic(m, dt)
}

/// The Gear prediction of one molecule.
pub fn predict(m: &mut Molecule) {
    for s in 0..3 {
        for a in 0..3 {
            let mut r = m.derivs(s, a);
            gear::predict(&mut r);
            m.set_derivs(s, a, &r);
        }
    }
}

/// The reference: the whole simulation on local memory, one force pass over all
/// molecules per step (plus two for the start-up). Returns the energies of steps
/// 0..=steps and the final state.
pub fn sequential(p: &Params) -> (Vec<Energies>, Vec<Molecule>) {
    simulate(p, initial_state(p))
}

/// [`sequential`] from the given initial state ([`initial_state`]), so that the
/// simulation can be timed without it, as the parallel run is timed without its setup.
/// Plain local memory, no DSM: the same force pass, corrector and predictor as the
/// parallel run.
pub fn simulate(p: &Params, mut mols: Vec<Molecule>) -> (Vec<Energies>, Vec<Molecule>) {
    let n = p.molecules;
    assert_eq!(mols.len(), n, "one state per molecule");
    let geo = p.geometry();
    let forces = |mols: &[Molecule]| {
        let x: Vec<Sites> = mols.iter().map(|m| m.d[0]).collect();
        let mut f = vec![[[0.0; 3]; 3]; n];
        let e = force_pass(&x, 0..n, &geo, &mut f, &mut vec![false; n]);
        (f, e)
    };
    let mut out = Vec::with_capacity(p.steps + 1);
    let (f0, mut e) = forces(&mols);
    e.kinetic = mols.iter().map(|m| kinetic(m, p.dt)).sum();
    out.push(e);
    let x0: Vec<Sites> = mols.iter().map(|m| m.d[0]).collect();
    mols.iter_mut()
        .zip(&x0)
        .for_each(|(m, x)| displace(m, x, 1.0));
    let (fp, _) = forces(&mols);
    mols.iter_mut()
        .zip(&x0)
        .for_each(|(m, x)| displace(m, x, -1.0));
    let (fm, _) = forces(&mols);
    for (i, m) in mols.iter_mut().enumerate() {
        start(m, &x0[i], &f0[i], &fp[i], &fm[i], p.dt);
    }
    for _ in 1..=p.steps {
        mols.iter_mut().for_each(predict);
        let (f, mut e) = forces(&mols);
        for (m, fm) in mols.iter_mut().zip(&f) {
            e.kinetic += correct(m, fm, &geo, p.dt);
        }
        out.push(e);
    }
    (out, mols)
}

/// The shared state of a parallel run.
pub struct Shared {
    /// Per-molecule Gear state ("mol"): accessed by its owner only.
    pub mol: Array<Molecule>,
    /// Site positions ("positions"), a copy of the first Gear term that the force phase
    /// reads (a sixth of the data): written by the owner, read by all.
    pub positions: Array<Sites>,
    /// Per-molecule site forces ("forces"), summed under the force locks.
    pub forces: Array<Sites>,
    /// One row of global sums per step ("energy"), summed under the energy lock.
    pub energy: Array<Energies>,
}

/// Allocates the shared arrays and writes this node's molecules' initial state
/// (collective; ends with a barrier).
pub fn setup(dsm: &mut Dsm, p: &Params) -> Result<Shared, DsmError> {
    let mol = dsm.alloc::<Molecule>("mol", p.molecules)?;
    let positions = dsm.alloc::<Sites>("positions", p.molecules)?;
    let forces = dsm.alloc::<Sites>("forces", p.molecules)?;
    let energy = dsm.alloc_with::<Energies>("energy", p.steps + 1, Distribution::OnNode(0))?;
    // All four hold f64 fields only: value traces compare them within a tolerance.
    dsm.trace_as_f64(&mol)?;
    dsm.trace_as_f64(&positions)?;
    dsm.trace_as_f64(&forces)?;
    dsm.trace_as_f64(&energy)?;
    let mine = band(p.molecules, dsm.size(), dsm.rank());
    if !mine.is_empty() {
        let init = initial_state(p);
        dsm.view(&mol).write_from(mine.start, &init[mine.clone()]);
        let x: Vec<Sites> = init[mine.clone()].iter().map(|m| m.d[0]).collect();
        dsm.view(&positions).write_from(mine.start, &x);
    }
    dsm.barrier()?;
    Ok(Shared {
        mol,
        positions,
        forces,
        energy,
    })
}

/// Options of a parallel run.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    pub locks: LockMode,
    /// Add the force sums without taking their locks (the seeded bug).
    pub racy: bool,
}

/// One node's working memory for a parallel run.
struct Node<'a> {
    sh: &'a Shared,
    geo: Geometry,
    opts: RunOptions,
    n: usize,
    mine: Range<usize>,
    /// Copy of all positions, read at the start of each force phase.
    all: Vec<Sites>,
    /// Private force sums (all molecules) and which of them this node touched.
    f: Vec<Sites>,
    touched: Vec<bool>,
    /// Own molecules and their forces, in the update phase.
    own: Vec<Molecule>,
    own_f: Vec<Sites>,
}

impl Node<'_> {
    /// Force phase: private sums for own molecules and their partners, added into the
    /// shared forces; potential energy and virial into row `row` (if any). Ends with a
    /// barrier.
    fn forces(&mut self, dsm: &mut Dsm, row: Option<usize>) -> Result<(), DsmError> {
        dsm.view(&self.sh.positions).read_into(0, &mut self.all);
        self.f.fill([[0.0; 3]; 3]);
        self.touched.fill(false);
        let e = force_pass(
            &self.all,
            self.mine.clone(),
            &self.geo,
            &mut self.f,
            &mut self.touched,
        );
        add_forces(dsm, self.sh, self.n, &self.f, &self.touched, self.opts)?;
        if let (Some(row), false) = (row, self.mine.is_empty()) {
            add_energies(dsm, self.sh, row, &e)?;
        }
        dsm.barrier()
    }

    /// Update phase: `work` gets the own molecules and their forces and returns their
    /// kinetic energy; the molecules are written back, their forces cleared for the next
    /// force phase, and the kinetic energy added into row `row` (if any). Ends with a
    /// barrier.
    fn update(
        &mut self,
        dsm: &mut Dsm,
        row: Option<usize>,
        work: impl FnOnce(&mut [Molecule], &[Sites]) -> f64,
    ) -> Result<(), DsmError> {
        if !self.mine.is_empty() {
            let start = self.mine.start;
            dsm.view(&self.sh.mol).read_into(start, &mut self.own);
            dsm.view(&self.sh.forces).read_into(start, &mut self.own_f);
            let kinetic = work(&mut self.own, &self.own_f);
            dsm.view(&self.sh.mol).write_from(start, &self.own);
            let x: Vec<Sites> = self.own.iter().map(|m| m.d[0]).collect();
            dsm.view(&self.sh.positions).write_from(start, &x);
            dsm.view(&self.sh.forces)
                .fill(self.mine.clone(), [[0.0; 3]; 3]);
            if let Some(row) = row {
                let e = Energies {
                    kinetic,
                    ..Default::default()
                };
                add_energies(dsm, self.sh, row, &e)?;
            }
        }
        dsm.barrier()
    }
}

/// Runs the simulation on the shared state (the same steps as [`sequential`]).
/// `on_step` is called on rank 0 with each step's completed sums; the returned vector
/// holds them on rank 0 (empty elsewhere).
pub fn run(
    dsm: &mut Dsm,
    sh: &Shared,
    p: &Params,
    opts: RunOptions,
    mut on_step: impl FnMut(usize, &Energies),
) -> Result<Vec<Energies>, DsmError> {
    let n = p.molecules;
    let mine = band(n, dsm.size(), dsm.rank());
    let own = mine.len();
    let mut node = Node {
        sh,
        geo: p.geometry(),
        opts,
        n,
        mine,
        all: vec![[[0.0; 3]; 3]; n],
        f: vec![[[0.0; 3]; 3]; n],
        touched: vec![false; n],
        own: vec![Molecule::default(); own],
        own_f: vec![[[0.0; 3]; 3]; own],
    };
    let dt = p.dt;
    let geo = node.geo;
    let mut out = Vec::new();
    let mut report = |dsm: &mut Dsm, step: usize| {
        if dsm.rank() == 0 {
            // Complete, and nobody writes this row any more.
            let e = dsm.view(&sh.energy).get(step);
            on_step(step, &e);
            out.push(e);
        }
    };

    // Start-up: forces and energies at the start, then forces at x0 ± dt·v.
    let mut x0 = vec![[[0.0; 3]; 3]; own];
    let mut f0 = vec![[[0.0; 3]; 3]; own];
    let mut fp = vec![[[0.0; 3]; 3]; own];
    node.forces(dsm, Some(0))?;
    node.update(dsm, Some(0), |mols, f| {
        f0.copy_from_slice(f);
        let mut k = 0.0;
        for (m, x) in mols.iter_mut().zip(&mut x0) {
            k += kinetic(m, dt);
            *x = m.d[0];
            displace(m, x, 1.0);
        }
        k
    })?;
    node.forces(dsm, None)?;
    node.update(dsm, None, |mols, f| {
        fp.copy_from_slice(f);
        for (m, x) in mols.iter_mut().zip(&x0) {
            displace(m, x, -1.0);
        }
        0.0
    })?;
    node.forces(dsm, None)?;
    node.update(dsm, None, |mols, fm| {
        for (i, m) in mols.iter_mut().enumerate() {
            start(m, &x0[i], &f0[i], &fp[i], &fm[i], dt);
            if p.steps > 0 {
                predict(m);
            }
        }
        0.0
    })?;
    report(dsm, 0);

    for step in 1..=p.steps {
        node.forces(dsm, Some(step))?;
        node.update(dsm, Some(step), |mols, f| {
            let mut k = 0.0;
            for (m, fm) in mols.iter_mut().zip(f) {
                k += correct(m, fm, &geo, dt);
                if step < p.steps {
                    predict(m);
                }
            }
            k
        })?;
        report(dsm, step);
    }
    Ok(out)
}

/// Adds this node's private force sums into the shared array, block by block (or
/// molecule by molecule) under the force locks, unless `racy`.
fn add_forces(
    dsm: &mut Dsm,
    sh: &Shared,
    n: usize,
    f: &[Sites],
    touched: &[bool],
    opts: RunOptions,
) -> Result<(), DsmError> {
    let (rank, size) = (dsm.rank(), dsm.size());
    match opts.locks {
        LockMode::Block => {
            let mut buf = Vec::new();
            for t in 0..size {
                let b = (rank + t) % size;
                let r = band(n, size, b);
                if !touched[r.clone()].iter().any(|&x| x) {
                    continue;
                }
                buf.resize(r.len(), [[0.0; 3]; 3]);
                if opts.racy {
                    add_block(dsm, &sh.forces, r.start, &f[r], &mut buf);
                } else {
                    let g = dsm.lock(FORCE_LOCK_BASE + b as u64)?;
                    add_block(&g, &sh.forces, r.start, &f[r], &mut buf);
                    g.unlock()?;
                }
            }
        }
        LockMode::Molecule => {
            let start = band(n, size, rank).start;
            let order = (0..n).map(|k| (start + k) % n).filter(|&j| touched[j]);
            if !opts.racy {
                dsm.prefetch_locks(order.map(|j| FORCE_LOCK_BASE + j as u64))?;
            }
            for k in 0..n {
                let j = (start + k) % n;
                if !touched[j] {
                    continue;
                }
                if opts.racy {
                    add_block(dsm, &sh.forces, j, &f[j..=j], &mut [[[0.0; 3]; 3]]);
                } else {
                    let g = dsm.lock(FORCE_LOCK_BASE + j as u64)?;
                    add_block(&g, &sh.forces, j, &f[j..=j], &mut [[[0.0; 3]; 3]]);
                    g.unlock()?;
                }
            }
        }
    }
    Ok(())
}

/// `forces[start..start+local.len()] += local`, as one bulk read and one bulk write.
fn add_block(dsm: &Dsm, forces: &Array<Sites>, start: usize, local: &[Sites], buf: &mut [Sites]) {
    let v = dsm.view(forces);
    v.read_into(start, buf);
    for (acc, l) in buf.iter_mut().zip(local) {
        for s in 0..3 {
            for a in 0..3 {
                acc[s][a] += l[s][a];
            }
        }
    }
    v.write_from(start, buf);
}

/// Adds `e` into row `step` of the shared sums under the energy lock.
fn add_energies(dsm: &mut Dsm, sh: &Shared, step: usize, e: &Energies) -> Result<(), DsmError> {
    let g = dsm.lock_named(ENERGY_LOCK)?;
    {
        let v = g.view(&sh.energy);
        let mut row = v.get(step);
        row.add(e);
        v.set(step, row);
    }
    g.unlock()
}

/// Energies in kJ/mol, for printing.
pub fn kj(x: f64) -> f64 {
    x / UNITS_PER_KJ_MOL
}

/// One step's line of output.
pub fn step_line(p: &Params, step: usize, e: &Energies) -> String {
    format!(
        "step {step}: kinetic {:.9} kJ/mol, potential {:.9} kJ/mol (intra {:.6}, inter {:.6}), total {:.9} kJ/mol, temperature {:.3} K, virial {:.4} kJ/mol",
        kj(e.kinetic),
        kj(e.potential()),
        kj(e.potential_intra),
        kj(e.potential_inter),
        kj(e.total()),
        p.temperature(e.kinetic),
        kj(e.virial)
    )
}

/// The larger of two measures, with NaN (a broken run) counting as infinitely bad.
fn worst(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::INFINITY
    } else {
        a.max(b)
    }
}

/// Largest difference between two runs' kinetic, potential and total energies, each
/// relative to the step's energy scale |K| + |U| of `want` (the total can be near zero).
/// Infinite if the runs have different lengths or a value is NaN.
pub fn max_rel_diff(got: &[Energies], want: &[Energies]) -> f64 {
    let start = if got.len() == want.len() {
        0.0
    } else {
        f64::INFINITY
    };
    got.iter().zip(want).fold(start, |acc, (g, w)| {
        let scale = (w.kinetic.abs() + w.potential().abs()).max(f64::MIN_POSITIVE);
        [
            g.kinetic - w.kinetic,
            g.potential() - w.potential(),
            g.total() - w.total(),
        ]
        .iter()
        .fold(acc, |acc, d| worst(acc, d.abs() / scale))
    })
}

/// Largest |E(s) - E(0)| relative to the starting energy scale |K(0)| + |U(0)|
/// (infinite if a value is NaN).
pub fn energy_drift(e: &[Energies]) -> f64 {
    let Some(first) = e.first() else {
        return 0.0;
    };
    let scale = (first.kinetic.abs() + first.potential().abs()).max(f64::MIN_POSITIVE);
    e.iter().fold(0.0, |acc, x| {
        worst(acc, (x.total() - first.total()).abs() / scale)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cube_check() {
        assert_eq!(lattice_side(1), Some(1));
        assert_eq!(lattice_side(8), Some(2));
        assert_eq!(lattice_side(27), Some(3));
        assert_eq!(lattice_side(216), Some(6));
        assert_eq!(lattice_side(1_000_000), Some(100));
        for n in [0, 2, 7, 9, 26, 100, 215, 217] {
            assert_eq!(lattice_side(n), None, "{n}");
        }
        let err = Params::new(100, 5, DEFAULT_DT_FS).unwrap_err();
        assert!(
            err.contains("perfect cube") && err.contains("64 or 125"),
            "{err}"
        );
    }

    #[test]
    fn every_pair_is_computed_exactly_once() {
        for n in 1..=12 {
            let mut seen = vec![vec![0; n]; n];
            for i in 0..n {
                for k in 1..=partners(i, n) {
                    let j = (i + k) % n;
                    seen[i.min(j)][i.max(j)] += 1;
                }
            }
            for (i, row) in seen.iter().enumerate() {
                for (j, &count) in row.iter().enumerate().skip(i + 1) {
                    assert_eq!(count, 1, "n {n}: pair ({i}, {j})");
                }
            }
        }
    }

    #[test]
    fn initial_state_is_at_temperature_with_zero_momentum() {
        let p = Params::new(27, 0, DEFAULT_DT_FS).unwrap();
        let mols = initial_state(&p);
        assert_eq!(mols, initial_state(&p), "deterministic");
        let geo = p.geometry();
        let mut momentum = [0.0; 3];
        let mut kinetic = 0.0;
        for m in &mols {
            for (s, mass) in MASS.iter().enumerate() {
                let v = m.velocity(s, p.dt);
                for a in 0..3 {
                    momentum[a] += mass * v[a];
                    kinetic += 0.5 * mass * v[a] * v[a];
                }
                for a in 0..3 {
                    let x = m.positions()[model::O][a];
                    assert!((0.0..geo.side).contains(&x));
                }
            }
            // Equilibrium geometry: no intra-molecular energy.
            let c = model::intra(m.positions(), &mut [[0.0; 3]; 3]);
            assert!(c.energy.abs() < 1e-6, "{c:?}");
        }
        for a in momentum {
            assert!(a.abs() < 1e-9, "{momentum:?}");
        }
        assert!((p.temperature(kinetic) - TEMPERATURE).abs() < 1e-9);
    }

    #[test]
    fn total_force_is_zero() {
        // Newton's third law over the whole system.
        let p = Params::new(64, 0, DEFAULT_DT_FS).unwrap();
        let x: Vec<Sites> = initial_state(&p).iter().map(|m| m.d[0]).collect();
        let mut f = vec![[[0.0; 3]; 3]; 64];
        let mut touched = vec![false; 64];
        force_pass(&x, 0..64, &p.geometry(), &mut f, &mut touched);
        let mut sum = [0.0; 3];
        let mut largest: f64 = 0.0;
        for fm in &f {
            for fs in fm {
                for a in 0..3 {
                    sum[a] += fs[a];
                    largest = largest.max(fs[a].abs());
                }
            }
        }
        for s in sum {
            assert!(s.abs() < 1e-9 * largest, "{sum:?} vs {largest}");
        }
    }

    #[test]
    fn split_force_passes_add_up_to_the_whole() {
        // What the nodes compute, summed, equals one pass over everything.
        let p = Params::new(27, 0, DEFAULT_DT_FS).unwrap();
        let x: Vec<Sites> = initial_state(&p).iter().map(|m| m.d[0]).collect();
        let geo = p.geometry();
        let mut whole = vec![[[0.0; 3]; 3]; 27];
        let e = force_pass(&x, 0..27, &geo, &mut whole, &mut [false; 27]);
        let mut parts = vec![[[0.0; 3]; 3]; 27];
        let mut sum = Energies::default();
        for k in 0..4 {
            let mut f = vec![[[0.0; 3]; 3]; 27];
            sum.add(&force_pass(
                &x,
                band(27, 4, k),
                &geo,
                &mut f,
                &mut [false; 27],
            ));
            for (acc, x) in parts.iter_mut().zip(&f) {
                for s in 0..3 {
                    for a in 0..3 {
                        acc[s][a] += x[s][a];
                    }
                }
            }
        }
        assert!(max_rel_diff(&[sum], &[e]) < 1e-12);
        for (a, b) in parts.iter().zip(&whole) {
            for s in 0..3 {
                for k in 0..3 {
                    assert!((a[s][k] - b[s][k]).abs() <= 1e-9 * b[s][k].abs().max(1.0));
                }
            }
        }
    }

    #[test]
    fn sequential_run_conserves_energy() {
        let p = Params::new(27, 40, DEFAULT_DT_FS).unwrap();
        let (e, mols) = sequential(&p);
        assert_eq!(e.len(), 41);
        let drift = energy_drift(&e);
        assert!(drift < drift_bound(&p), "drift {drift}");
        assert!(drift > 0.0, "the integrator is not exact");
        // Something happens: the molecules move and trade energy.
        assert!(e[40].kinetic != e[0].kinetic);
        assert!(mols != initial_state(&p));
    }

    #[test]
    fn drift_and_difference_measures() {
        let e = |k: f64, u: f64| Energies {
            kinetic: k,
            potential_inter: u,
            ..Default::default()
        };
        assert_eq!(energy_drift(&[e(10.0, -30.0), e(11.0, -31.0)]), 0.0);
        assert!((energy_drift(&[e(10.0, -30.0), e(11.0, -30.0)]) - 0.025).abs() < 1e-15);
        assert_eq!(max_rel_diff(&[e(1.0, 2.0)], &[e(1.0, 2.0)]), 0.0);
        assert!((max_rel_diff(&[e(1.0, 2.5)], &[e(1.0, 2.0)]) - 0.5 / 3.0).abs() < 1e-15);
        assert_eq!(max_rel_diff(&[], &[e(1.0, 2.0)]), f64::INFINITY);
        assert_eq!(
            max_rel_diff(&[e(f64::NAN, 2.0)], &[e(1.0, 2.0)]),
            f64::INFINITY
        );
        assert_eq!(
            energy_drift(&[e(1.0, 2.0), e(f64::NAN, 2.0)]),
            f64::INFINITY
        );
    }
}
