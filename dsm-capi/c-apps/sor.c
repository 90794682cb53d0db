/* sor: red-black successive over-relaxation on an N x N grid, in C on dsm.
 *
 *   dsmcc -O2 -o sor sor.c && dsmrun -n 4 [--race] ./sor [N [ITERS]]
 *
 * The grid is one shared 2-D allocation banded by rows across the ranks (dsm homes 2-D
 * arrays by the same bands), with a barrier after each colour. An update of one colour
 * reads only points of the other colour, so the result is bitwise the sequential
 * computation's, whatever the number of ranks: rank 0 recomputes it sequentially in
 * private memory and compares every point. The same initial grid and update as the Rust
 * SOR (apps/src/sor.rs), so the checksums agree too. Exits 1 on a mismatch. */
/* clock_gettime is POSIX, not C11: ask for it, so that -std=c11 builds declare it. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dsm.h"
#include "options.h"

static const double OMEGA = 1.5;

static double initial(int n, int i, int j) {
    if (i == 0)
        return 1.0;
    if (i == n - 1 || j == 0 || j == n - 1)
        return 0.0;
    return (double)((i * 31 + j * 17) % 97) / 97.0;
}

/* Updates the points of `colour` in interior row i of the row-major grid g. */
static void relax_row(double *g, int n, int i, int colour) {
    double *row = g + (size_t)i * n, *up = row - n, *down = row + n;
    int j0 = ((i + 1) % 2 == colour) ? 1 : 2;
    for (int j = j0; j < n - 1; j += 2)
        row[j] = (1.0 - OMEGA) * row[j] + OMEGA * 0.25 * (up[j] + down[j] + row[j - 1] + row[j + 1]);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void fail(const char *what) {
    fprintf(stderr, "sor: %s: %s\n", what, dsm_last_error());
    exit(2);
}

/* The sequential reference, in private memory. */
static double *sequential(int n, int iters) {
    double *g = malloc(sizeof(double) * (size_t)n * n);
    if (!g)
        return NULL;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            g[(size_t)i * n + j] = initial(n, i, j);
    for (int it = 0; it < iters; it++)
        for (int colour = 0; colour < 2; colour++)
            for (int i = 1; i < n - 1; i++)
                relax_row(g, n, i, colour);
    return g;
}

/* Rank 0's check: every point bitwise equal to the reference. */
static int verify(const double *g, int n, int iters, int size, double parallel) {
    double t0 = now();
    double *want = sequential(n, iters);
    double seq = now() - t0;
    if (!want) {
        fprintf(stderr, "sor: no memory for the reference\n");
        return 2;
    }
    double checksum = 0;
    for (size_t k = 0; k < (size_t)n * n; k++) {
        if (memcmp(&g[k], &want[k], sizeof(double)) != 0) {
            fprintf(stderr, "sor: point (%zu, %zu) is %.17g, the sequential run has %.17g\n",
                    k / n, k % n, g[k], want[k]);
            free(want);
            return 1;
        }
        checksum += g[k];
    }
    free(want);
    if (!isfinite(checksum)) {
        fprintf(stderr, "sor: the result is not finite\n");
        return 1;
    }
    printf("verified: c sor %dx%d, %d iterations, %d ranks: bitwise identical to sequential "
           "(checksum %.6f); parallel %.4f s, sequential %.4f s\n",
           n, n, iters, size, checksum, parallel, seq);
    return 0;
}

int main(int argc, char **argv) {
    Options o = options_begin("sor", "usage: sor [N >= 3 [ITERS >= 0]]", argc, argv);
    if (argc > 3)
        options_fail(&o, "too many arguments");
    int n = option_positional(&o, 1, "N", 3, 1 << 15, 512);
    int iters = option_positional(&o, 2, "ITERS", 0, INT_MAX, 20);
    if (dsm_init() != DSM_OK)
        fail("dsm_init");
    int rank = dsm_rank(), size = dsm_size();
    double *g = dsm_alloc_2d("grid", sizeof(double), (size_t)n, (size_t)n);
    if (!g)
        fail("dsm_alloc_2d");
    /* This rank's band of rows, as dsm homes them. */
    int lo = (int)((long)rank * n / size), hi = (int)((long)(rank + 1) * n / size);
    for (int i = lo; i < hi; i++)
        for (int j = 0; j < n; j++)
            g[(size_t)i * n + j] = initial(n, i, j);
    if (dsm_barrier() != DSM_OK)
        fail("dsm_barrier");
    double t0 = now();
    int first = lo > 1 ? lo : 1, last = hi < n - 1 ? hi : n - 1;
    for (int it = 0; it < iters; it++)
        for (int colour = 0; colour < 2; colour++) {
            for (int i = first; i < last; i++)
                relax_row(g, n, i, colour);
            if (dsm_barrier() != DSM_OK)
                fail("dsm_barrier");
        }
    double parallel = now() - t0;
    int status = rank == 0 ? verify(g, n, iters, size, parallel) : 0;
    int race = dsm_finish();
    if (race < 0)
        fail("dsm_finish");
    return status ? status : race;
}
