/* water: molecular dynamics of liquid water in C on dsm, a small version of the Rust
 * app's algorithm (apps/src/water.rs) written for this repository.
 *
 *   dsmcc -O2 -o water water.c && dsmrun -n 4 [--race] ./water [--molecules N]
 *       [--steps S] [--racy]
 *
 * Model: flexible three-site molecules (O, H, H) in a periodic cubic box at liquid
 * density; harmonic bond and angle terms inside a molecule; Coulomb between all site
 * pairs plus Lennard-Jones between oxygens for molecule pairs whose oxygens are within a
 * cutoff of half the box (smoothly switched off near it); a sixth-order Gear
 * predictor-corrector. Units: Angstrom, ps, amu (energy unit 0.01 kJ/mol).
 *
 * Parallel structure: molecules are block-partitioned over the ranks; each rank keeps its
 * own molecules' integrator state in private memory. Shared: "positions" (written by the
 * owner, read by all), "forces" (summed by all) and "energy" (one row of sums per step).
 * Each force phase, a rank computes the intra-molecular forces of its own molecules and
 * the interactions of each own molecule i with the molecules i+1 .. i+N/2 (wrapping, so
 * every pair once), sums them in private memory, then adds each touched molecule's sum
 * into "forces" under that molecule's lock (dsm_lock(FORCE_LOCK + j)), starting at its
 * own block so the ranks do not queue on the same locks, and its energies into "energy"
 * under the lock named "energy"; a barrier ends the phase. The update phase corrects the
 * own molecules with their forces, publishes the positions, clears the forces; barrier.
 * With --racy the force sums are added without the locks: a write-write race on
 * "forces" that `dsmrun --race` must report.
 *
 * Rank 0 then reruns the whole simulation sequentially in private memory (the same
 * functions with one rank and no dsm calls) and compares every step's energies (relative
 * 1e-9 of the step's energy scale; the order of the sums differs between the runs), and
 * checks that the total energy is conserved; it prints a `verified:` line, or exits 1. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dsm.h"
#include "options.h"

/* Physical model (TIP3P charges and Lennard-Jones, SPC/Fw bond and angle constants). */
static const double MASS[3] = {15.9994, 1.008, 1.008};
static const double CHARGE[3] = {-0.834, 0.417, 0.417};
#define KJ 100.0                  /* energy units per kJ/mol */
#define BOLTZMANN 0.831446261815324 /* energy units per K */
#define COULOMB 138935.457644     /* e^2 / (4 pi eps0), energy units * Angstrom */
#define LJ_SIGMA 3.15061
#define LJ_EPSILON (0.6364 * KJ)
#define BOND 0.9572
#define ANGLE_DEG 104.52
#define BOND_K (4431.53 * KJ)
#define ANGLE_K (317.5656 * KJ)
#define TEMPERATURE 298.0
#define DT 0.25e-3                /* ps */
#define PI 3.14159265358979323846
#define FORCE_LOCK 1000           /* lock of molecule j: FORCE_LOCK + j */
#define TOLERANCE 1e-9
#define ORDER 6                   /* Gear: position and five scaled derivatives */

typedef struct {
    double s[3][3]; /* [site][axis] */
} Sites;
typedef struct {
    Sites d[ORDER]; /* d[k] = dt^k / k! * k-th time derivative */
} Molecule;
typedef struct {
    double kinetic, intra, inter, virial;
} Energies;

/* One run's memory and place: shared arrays in the parallel run, private in the
 * sequential one (rank 0 of 1, `dsm` 0: no dsm calls). */
typedef struct {
    int n, steps, rank, size, dsm, racy;
    double side, cutoff, switch_on;
    Sites *pos, *forces;   /* n each */
    Energies *energy;      /* steps + 1 */
    int lo, hi;            /* own molecules */
    Molecule *own;         /* hi - lo, private */
    Sites *f, *own_f, *x0, *f0, *fp; /* private */
    unsigned char *touched;
    uint64_t *order;       /* n: the force locks in the order they are taken */
} Run;

static void die(const char *what) {
    fprintf(stderr, "water: %s: %s\n", what, dsm_last_error());
    exit(2);
}

static void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size);
    if (!p) {
        fprintf(stderr, "water: out of memory\n");
        exit(2);
    }
    return p;
}

/* SplitMix64, so the initial state is the same on every rank. */
static uint64_t rng_state;
static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double uniform(void) { return (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
static double normal(void) {
    double u1 = 1.0 - uniform(), u2 = uniform();
    return sqrt(-2.0 * log(u1)) * cos(2.0 * PI * u2);
}

static double dot(const double *a, const double *b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }
static void add_scaled(double *acc, double s, const double *v) {
    for (int k = 0; k < 3; k++)
        acc[k] += s * v[k];
}

/* Bond and angle terms of one molecule: forces into f, energy and virial into e. */
static void intra(const Sites *x, Sites *f, Energies *e) {
    double u[3], v[3];
    for (int k = 0; k < 3; k++) {
        u[k] = x->s[1][k] - x->s[0][k];
        v[k] = x->s[2][k] - x->s[0][k];
    }
    double lu = sqrt(dot(u, u)), lv = sqrt(dot(v, v));
    const double *bond[2] = {u, v};
    const double len[2] = {lu, lv};
    for (int b = 0; b < 2; b++) {
        double stretch = len[b] - BOND, s = -BOND_K * stretch / len[b];
        e->intra += 0.5 * BOND_K * stretch * stretch;
        add_scaled(f->s[1 + b], s, bond[b]);
        add_scaled(f->s[0], -s, bond[b]);
        e->virial += s * len[b] * len[b];
    }
    double c = dot(u, v) / (lu * lv);
    c = c < -1.0 ? -1.0 : c > 1.0 ? 1.0 : c;
    double bend = acos(c) - ANGLE_DEG * PI / 180.0;
    e->intra += 0.5 * ANGLE_K * bend * bend;
    double sn = sqrt(1.0 - c * c);
    double g = ANGLE_K * bend / (sn > 1e-12 ? sn : 1e-12);
    double f1[3] = {0, 0, 0}, f2[3] = {0, 0, 0};
    add_scaled(f1, g / (lu * lv), v);
    add_scaled(f1, -g * c / (lu * lu), u);
    add_scaled(f2, g / (lu * lv), u);
    add_scaled(f2, -g * c / (lv * lv), v);
    add_scaled(f->s[1], 1.0, f1);
    add_scaled(f->s[2], 1.0, f2);
    add_scaled(f->s[0], -1.0, f1);
    add_scaled(f->s[0], -1.0, f2);
    e->virial += dot(u, f1) + dot(v, f2);
}

/* Interaction of molecules a and b at b's periodic image nearest by O-O distance: forces
 * into fa and fb, energy and virial into e; nothing when the oxygens are a cutoff apart. */
static int inter(const Run *r, const Sites *a, const Sites *b, Sites *fa, Sites *fb, Energies *e) {
    double d[3], shift[3];
    for (int k = 0; k < 3; k++) {
        double raw = a->s[0][k] - b->s[0][k];
        d[k] = raw - r->side * round(raw / r->side);
        shift[k] = d[k] - raw;
    }
    double r2 = dot(d, d);
    if (r2 >= r->cutoff * r->cutoff)
        return 0;
    double u = 0, w = 0, ga[3][3] = {{0}}, gb[3][3] = {{0}};
    for (int sa = 0; sa < 3; sa++)
        for (int sb = 0; sb < 3; sb++) {
            double rab[3];
            for (int k = 0; k < 3; k++)
                rab[k] = a->s[sa][k] - b->s[sb][k] + shift[k];
            double s2 = dot(rab, rab), inv2 = 1.0 / s2;
            double en = COULOMB * CHARGE[sa] * CHARGE[sb] * sqrt(inv2);
            double fr = en * inv2;
            if (sa == 0 && sb == 0) {
                double p2 = LJ_SIGMA * LJ_SIGMA * inv2, p6 = p2 * p2 * p2;
                en += 4.0 * LJ_EPSILON * (p6 * p6 - p6);
                fr += 24.0 * LJ_EPSILON * (2.0 * p6 * p6 - p6) * inv2;
            }
            u += en;
            w += fr * s2;
            add_scaled(ga[sa], fr, rab);
            add_scaled(gb[sb], -fr, rab);
        }
    /* Quintic switch of the O-O distance, 1 inside switch_on, 0 at the cutoff. */
    double dist = sqrt(r2), sw = 1.0, dsw = 0.0;
    if (dist > r->switch_on) {
        double width = r->cutoff - r->switch_on, t = (dist - r->switch_on) / width;
        sw = 1.0 - t * t * t * (10.0 - 15.0 * t + 6.0 * t * t);
        dsw = -30.0 * t * t * (1.0 - t) * (1.0 - t) / width;
    }
    for (int s = 0; s < 3; s++) {
        add_scaled(fa->s[s], sw, ga[s]);
        add_scaled(fb->s[s], sw, gb[s]);
    }
    double g = -u * dsw / dist;
    add_scaled(fa->s[0], g, d);
    add_scaled(fb->s[0], -g, d);
    e->inter += sw * u;
    e->virial += sw * w + g * r2;
    return 1;
}

static void lock(const Run *r, uint64_t id) {
    if (r->dsm && dsm_lock(id) != DSM_OK)
        die("dsm_lock");
}
static void unlock(const Run *r, uint64_t id) {
    if (r->dsm && dsm_unlock(id) != DSM_OK)
        die("dsm_unlock");
}
static void barrier(const Run *r) {
    if (r->dsm && dsm_barrier() != DSM_OK)
        die("dsm_barrier");
}

/* Adds e into the energy row under the energy lock. */
static void add_energy(const Run *r, int row, const Energies *e) {
    if (r->dsm && dsm_lock_named("energy") != DSM_OK)
        die("dsm_lock_named");
    Energies *dst = &r->energy[row];
    dst->kinetic += e->kinetic;
    dst->intra += e->intra;
    dst->inter += e->inter;
    dst->virial += e->virial;
    if (r->dsm && dsm_unlock_named("energy") != DSM_OK)
        die("dsm_unlock_named");
}

/* The force phase: private sums over the own molecules and their partners, added into
 * the shared forces (under the molecule locks unless racy) and, for row >= 0, the
 * potential energy into energy[row]. Then the barrier, and the own molecules' forces are
 * copied into own_f and cleared for the next phase. */
static void force_phase(Run *r, int row) {
    int n = r->n;
    Energies e = {0, 0, 0, 0};
    memset(r->f, 0, sizeof(Sites) * n);
    memset(r->touched, 0, (size_t)n);
    for (int i = r->lo; i < r->hi; i++) {
        intra(&r->pos[i], &r->f[i], &e);
        r->touched[i] = 1;
        /* Partners i+1 .. i+n/2; for even n the opposite pairs only from the first half. */
        int partners = n % 2 ? (n - 1) / 2 : i < n / 2 ? n / 2 : n / 2 - 1;
        for (int k = 1; k <= partners; k++) {
            int j = (i + k) % n;
            if (inter(r, &r->pos[i], &r->pos[j], &r->f[i], &r->f[j], &e))
                r->touched[j] = 1;
        }
    }
    if (r->dsm && !r->racy) {
        /* The locks in the order the loop below takes them, asked for ahead. */
        int count = 0;
        for (int k = 0; k < n; k++) {
            int j = (r->lo + k) % n;
            if (r->touched[j])
                r->order[count++] = FORCE_LOCK + (uint64_t)j;
        }
        if (dsm_prefetch_locks(r->order, (size_t)count) != DSM_OK)
            die("dsm_prefetch_locks");
    }
    for (int k = 0; k < n; k++) {
        int j = (r->lo + k) % n;
        if (!r->touched[j])
            continue;
        if (!r->racy)
            lock(r, FORCE_LOCK + (uint64_t)j);
        for (int s = 0; s < 3; s++)
            for (int a = 0; a < 3; a++)
                r->forces[j].s[s][a] += r->f[j].s[s][a];
        if (!r->racy)
            unlock(r, FORCE_LOCK + (uint64_t)j);
    }
    if (row >= 0 && r->hi > r->lo)
        add_energy(r, row, &e);
    barrier(r);
    for (int i = r->lo; i < r->hi; i++)
        for (int s = 0; s < 3; s++)
            for (int a = 0; a < 3; a++) {
                r->own_f[i - r->lo].s[s][a] = r->forces[i].s[s][a];
                r->forces[i].s[s][a] = 0.0;
            }
}

/* Ends an update phase: publishes the own positions, adds the kinetic energy, barrier. */
static void publish(Run *r, int row, double kinetic) {
    for (int i = r->lo; i < r->hi; i++)
        r->pos[i] = r->own[i - r->lo].d[0];
    if (row >= 0 && r->hi > r->lo) {
        Energies e = {kinetic, 0, 0, 0};
        add_energy(r, row, &e);
    }
    barrier(r);
}

static double kinetic(const Molecule *m) {
    double k = 0;
    for (int s = 0; s < 3; s++)
        for (int a = 0; a < 3; a++) {
            double v = m->d[1].s[s][a] / DT;
            k += 0.5 * MASS[s] * v * v;
        }
    return k;
}

/* Moves the sites from x0 by sign * dt * v (the start-up's force points). */
static void displace(Molecule *m, const Sites *x0, double sign) {
    for (int s = 0; s < 3; s++)
        for (int a = 0; a < 3; a++)
            m->d[0].s[s][a] = x0->s[s][a] + sign * m->d[1].s[s][a];
}

static void predict(Molecule *m) {
    for (int s = 0; s < 3; s++)
        for (int a = 0; a < 3; a++) {
            double r[ORDER];
            for (int k = 0; k < ORDER; k++)
                r[k] = m->d[k].s[s][a];
            /* The Taylor step in scaled derivatives: the Pascal triangle. */
            r[0] += r[1] + r[2] + r[3] + r[4] + r[5];
            r[1] += 2 * r[2] + 3 * r[3] + 4 * r[4] + 5 * r[5];
            r[2] += 3 * r[3] + 6 * r[4] + 10 * r[5];
            r[3] += 4 * r[4] + 10 * r[5];
            r[4] += 5 * r[5];
            for (int k = 0; k < ORDER; k++)
                m->d[k].s[s][a] = r[k];
        }
}

/* Gear's corrector for x'' = F/m, then the periodic wrap of the whole molecule by its
 * oxygen. Returns the kinetic energy. */
static double correct(const Run *r, Molecule *m, const Sites *f) {
    static const double alpha[ORDER] = {3.0 / 16, 251.0 / 360, 1.0, 11.0 / 18, 1.0 / 6, 1.0 / 60};
    for (int s = 0; s < 3; s++)
        for (int a = 0; a < 3; a++) {
            double delta = 0.5 * DT * DT * f->s[s][a] / MASS[s] - m->d[2].s[s][a];
            for (int k = 0; k < ORDER; k++)
                m->d[k].s[s][a] += alpha[k] * delta;
        }
    for (int a = 0; a < 3; a++) {
        double wrap = r->side * floor(m->d[0].s[0][a] / r->side);
        for (int s = 0; s < 3; s++)
            m->d[0].s[s][a] -= wrap;
    }
    return kinetic(m);
}

/* The starting state: oxygens at the centres of a k^3 lattice, each molecule at its
 * equilibrium geometry in a random orientation, Maxwell-Boltzmann velocities shifted to
 * zero momentum and scaled to TEMPERATURE. Fills the own molecules' first two terms. */
static void initial_state(Run *r, int k) {
    int n = r->n;
    double half = ANGLE_DEG * PI / 360.0, spacing = r->side / k;
    double body[3][3] = {{0, 0, 0}, {BOND * sin(half), 0, BOND * cos(half)}, {-BOND * sin(half), 0, BOND * cos(half)}};
    Sites *x = xcalloc((size_t)n, sizeof(Sites)), *v = xcalloc((size_t)n, sizeof(Sites));
    rng_state = 0x574154455f433131ULL;
    for (int m = 0; m < n; m++) {
        int cell[3] = {m / (k * k), (m / k) % k, m % k};
        /* A uniformly random rotation from a random unit quaternion. */
        double u1 = uniform(), u2 = uniform(), u3 = uniform();
        double qa = sqrt(1 - u1), qb = sqrt(u1);
        double qx = qa * sin(2 * PI * u2), qy = qa * cos(2 * PI * u2);
        double qz = qb * sin(2 * PI * u3), qw = qb * cos(2 * PI * u3);
        double rot[3][3] = {
            {1 - 2 * (qy * qy + qz * qz), 2 * (qx * qy - qz * qw), 2 * (qx * qz + qy * qw)},
            {2 * (qx * qy + qz * qw), 1 - 2 * (qx * qx + qz * qz), 2 * (qy * qz - qx * qw)},
            {2 * (qx * qz - qy * qw), 2 * (qy * qz + qx * qw), 1 - 2 * (qx * qx + qy * qy)},
        };
        for (int s = 0; s < 3; s++)
            for (int a = 0; a < 3; a++)
                x[m].s[s][a] = (cell[a] + 0.5) * spacing + dot(rot[a], body[s]);
    }
    double momentum[3] = {0, 0, 0}, total_mass = 0, kin = 0;
    for (int m = 0; m < n; m++)
        for (int s = 0; s < 3; s++) {
            for (int a = 0; a < 3; a++) {
                v[m].s[s][a] = sqrt(BOLTZMANN * TEMPERATURE / MASS[s]) * normal();
                momentum[a] += MASS[s] * v[m].s[s][a];
            }
            total_mass += MASS[s];
        }
    for (int m = 0; m < n; m++)
        for (int s = 0; s < 3; s++)
            for (int a = 0; a < 3; a++) {
                v[m].s[s][a] -= momentum[a] / total_mass;
                kin += 0.5 * MASS[s] * v[m].s[s][a] * v[m].s[s][a];
            }
    double dof = 9.0 * n - 3 > 1 ? 9.0 * n - 3 : 1;
    double temp = 2 * kin / (BOLTZMANN * dof), scale = temp > 0 ? sqrt(TEMPERATURE / temp) : 0;
    for (int i = r->lo; i < r->hi; i++) {
        Molecule *m = &r->own[i - r->lo];
        memset(m, 0, sizeof *m);
        for (int s = 0; s < 3; s++)
            for (int a = 0; a < 3; a++) {
                m->d[0].s[s][a] = x[i].s[s][a];
                m->d[1].s[s][a] = scale * v[i].s[s][a] * DT;
            }
    }
    free(x);
    free(v);
}

/* The whole simulation on r's memory: the start-up (forces at x0, which give step 0's
 * energies, and at x0 +- dt v for the third Gear term), then `steps` predictor-corrector
 * steps, each one force phase and one update phase. */
static void simulate(Run *r, int k) {
    int own = r->hi - r->lo;
    initial_state(r, k);
    publish(r, -1, 0);
    force_phase(r, 0);
    double kin = 0;
    for (int i = 0; i < own; i++) {
        kin += kinetic(&r->own[i]);
        r->f0[i] = r->own_f[i];
        r->x0[i] = r->own[i].d[0];
        displace(&r->own[i], &r->x0[i], 1.0);
    }
    publish(r, 0, kin);
    force_phase(r, -1);
    for (int i = 0; i < own; i++) {
        r->fp[i] = r->own_f[i];
        displace(&r->own[i], &r->x0[i], -1.0);
    }
    publish(r, -1, 0);
    force_phase(r, -1);
    for (int i = 0; i < own; i++) {
        Molecule *m = &r->own[i];
        for (int s = 0; s < 3; s++)
            for (int a = 0; a < 3; a++) {
                m->d[0].s[s][a] = r->x0[i].s[s][a];
                m->d[2].s[s][a] = 0.5 * DT * DT * r->f0[i].s[s][a] / MASS[s];
                /* dt^3/6 x''' from the central difference of the forces at x0 +- dt v. */
                m->d[3].s[s][a] = DT * DT / 12.0 * (r->fp[i].s[s][a] - r->own_f[i].s[s][a]) / MASS[s];
            }
        if (r->steps > 0)
            predict(m);
    }
    publish(r, -1, 0);
    for (int step = 1; step <= r->steps; step++) {
        force_phase(r, step);
        kin = 0;
        for (int i = 0; i < own; i++) {
            kin += correct(r, &r->own[i], &r->own_f[i]);
            if (step < r->steps)
                predict(&r->own[i]);
        }
        publish(r, step, kin);
    }
}

static void setup_private(Run *r) {
    int own = r->hi - r->lo;
    r->own = xcalloc((size_t)own, sizeof(Molecule));
    r->f = xcalloc((size_t)r->n, sizeof(Sites));
    r->touched = xcalloc((size_t)r->n, 1);
    r->order = xcalloc((size_t)r->n, sizeof(uint64_t));
    r->own_f = xcalloc((size_t)own, sizeof(Sites));
    r->x0 = xcalloc((size_t)own, sizeof(Sites));
    r->f0 = xcalloc((size_t)own, sizeof(Sites));
    r->fp = xcalloc((size_t)own, sizeof(Sites));
}

static double total(const Energies *e) { return e->kinetic + e->intra + e->inter; }
static double scale_of(const Energies *e) {
    double s = fabs(e->kinetic) + fabs(e->intra + e->inter);
    return s > 0 ? s : 1e-300;
}

/* Rank 0's check against the sequential rerun. */
static int verify(const Run *par, int k) {
    Run seq = *par;
    seq.rank = 0, seq.size = 1, seq.dsm = 0, seq.racy = 0, seq.lo = 0, seq.hi = par->n;
    seq.pos = xcalloc((size_t)par->n, sizeof(Sites));
    seq.forces = xcalloc((size_t)par->n, sizeof(Sites));
    seq.energy = xcalloc((size_t)par->steps + 1, sizeof(Energies));
    setup_private(&seq);
    simulate(&seq, k);
    double worst = 0, drift = 0;
    for (int s = 0; s <= par->steps; s++) {
        const Energies *g = &par->energy[s], *w = &seq.energy[s];
        double sc = scale_of(w);
        double diffs[3] = {g->kinetic - w->kinetic, (g->intra + g->inter) - (w->intra + w->inter),
                           total(g) - total(w)};
        for (int d = 0; d < 3; d++) {
            double rel = fabs(diffs[d]) / sc;
            if (!(rel <= worst))
                worst = isnan(rel) ? INFINITY : rel;
        }
        double dr = fabs(total(w) - total(&seq.energy[0])) / scale_of(&seq.energy[0]);
        if (!(dr <= drift))
            drift = isnan(dr) ? INFINITY : dr;
        printf("step %d: kinetic %.9f potential %.9f total %.9f kJ/mol\n", s, g->kinetic / KJ,
               (g->intra + g->inter) / KJ, total(g) / KJ);
    }
    /* The Rust app's measured bound: the start-up settles to ~1e-5, then ~1e-7 a step. */
    double drift_bound = 5e-5 + 5e-7 * par->steps;
    if (!(worst <= TOLERANCE)) {
        fprintf(stderr, "water: energies differ from the sequential run by %.3g (relative), more than %g\n",
                worst, TOLERANCE);
        return 1;
    }
    if (!(drift <= drift_bound)) {
        fprintf(stderr, "water: the total energy drifts by %.3g, more than %.3g\n", drift, drift_bound);
        return 1;
    }
    printf("verified: c water %d molecules, %d steps, %d ranks: energies match the sequential run "
           "(max relative difference %.3g), energy drift %.3g\n",
           par->n, par->steps, par->size, worst, drift);
    return 0;
}

static const char USAGE[] =
    "usage: water [--molecules N (a cube, default 27)] [--steps S (default 5)] [--racy]";

int main(int argc, char **argv) {
    Run r;
    memset(&r, 0, sizeof r);
    r.n = 27, r.steps = 5;
    Options o = options_begin("water", USAGE, argc, argv);
    while (options_next(&o)) {
        if (option_flag(&o, "--racy"))
            r.racy = 1;
        else if (!option_int(&o, "--molecules", 1, 1000000, &r.n) &&
                 !option_int(&o, "--steps", 0, INT_MAX, &r.steps))
            options_unknown(&o);
    }
    int k = (int)round(cbrt((double)r.n));
    if (k * k * k != r.n)
        options_fail(&o, "--molecules must be a cube (8, 27, 64, ...)");
    /* Number density of water at 298 K (0.997 g/cm^3) per cubic Angstrom. */
    double density = 0.997 / (MASS[0] + MASS[1] + MASS[2]) * 6.02214076e23 / 1e24;
    r.side = cbrt(r.n / density), r.cutoff = r.side / 2, r.switch_on = r.cutoff * 0.9;

    if (dsm_init() != DSM_OK)
        die("dsm_init");
    r.dsm = 1, r.rank = dsm_rank(), r.size = dsm_size();
    r.pos = dsm_alloc("positions", sizeof(Sites), (size_t)r.n);
    r.forces = dsm_alloc("forces", sizeof(Sites), (size_t)r.n);
    r.energy = dsm_alloc("energy", sizeof(Energies), (size_t)r.steps + 1);
    if (!r.pos || !r.forces || !r.energy)
        die("dsm_alloc");
    r.lo = (int)((long)r.rank * r.n / r.size), r.hi = (int)((long)(r.rank + 1) * r.n / r.size);
    setup_private(&r);
    simulate(&r, k);
    int status = r.rank == 0 ? verify(&r, k) : 0;
    int race = dsm_finish();
    if (race < 0)
        die("dsm_finish");
    return race ? race : status;
}
