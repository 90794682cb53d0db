/* A 2-D grid banded by rows: each rank rewrites its band, then reads its neighbour's
 * first row with no barrier between the two phases.
 * EXPECT: grid */
#include "kernel.h"

#define COLS 64

int main(void) {
    check(dsm_init(), "dsm_init");
    int rank = dsm_rank(), size = dsm_size();
    int rows = 4 * size;
    double *grid = must(dsm_alloc_2d("grid", sizeof(double), (size_t)rows, COLS), "alloc");
    double *sums = must(dsm_alloc("sums", sizeof(double), (size_t)size), "dsm_alloc");
    int first = 4 * rank, next = (4 * (rank + 1)) % rows;
    for (int r = first; r < first + 4; r++)
        for (int c = 0; c < COLS; c++)
            grid[r * COLS + c] = r + c; // RACE
    double s = 0;
    for (int c = 0; c < COLS; c++)
        s += grid[next * COLS + c]; // RACE
    sums[rank] = s;
    check(dsm_barrier(), "dsm_barrier");
    return dsm_finish();
}
