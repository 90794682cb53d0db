/* Rank 0 copies a whole struct into a shared array while rank 1 reads a field of it, in
 * the same epoch (gcc instruments the copy as one write of the struct's range).
 * EXPECT: points */
#include "kernel.h"

struct point { double x, y, z, w; };

int main(void) {
    check(dsm_init(), "dsm_init");
    int rank = dsm_rank();
    struct point *points = must(dsm_alloc("points", sizeof(struct point), 8), "dsm_alloc");
    double *out = must(dsm_alloc("out", sizeof(double), 8), "dsm_alloc");
    struct point local = { 1.0 * rank, 2.0, 3.0, 4.0 };
    if (rank == 0)
        points[5] = local; // RACE
    else if (rank == 1)
        out[1] = points[5].y; // RACE
    check(dsm_barrier(), "dsm_barrier");
    return dsm_finish();
}
