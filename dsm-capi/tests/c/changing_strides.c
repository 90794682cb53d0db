/* Rank 0 writes each row of two arrays through one call site, with a stride that
 * changes from row to row (one element, a sweep, a repeated first element, a step back),
 * so that the hooks' runs of that site are guessed wrong and corrected. Rank 1 then
 * reads, with nothing between, the elements rank 0 wrote of `hit` and exactly those it
 * did not write of `gaps`: a run that misses an element loses a race on `hit`, one that
 * counts an element nobody wrote makes a false one on `gaps`.
 * EXPECT: hit
 * RACES: 584 (every element rank 0 writes of `hit`: 146 in each 6 rows) */
#include <string.h>
#include "kernel.h"

#define ROWS 24
#define COLS 64

/* The columns row r writes, in order (some twice); returns how many. */
static int pattern(int r, int *cols) {
    int n = 0;
    switch (r % 6) {
    case 0: /* one element */
        cols[n++] = 5;
        break;
    case 1: /* the whole row */
        for (int c = 0; c < COLS; c++)
            cols[n++] = c;
        break;
    case 2: /* every third */
        for (int c = 1; c < COLS; c += 3)
            cols[n++] = c;
        break;
    case 3: /* the first twice, then every second */
        cols[n++] = 0;
        for (int c = 0; c < COLS; c += 2)
            cols[n++] = c;
        break;
    case 4: /* every fourth, then one step back */
        for (int c = 8; c < COLS; c += 4)
            cols[n++] = c;
        cols[n++] = 3;
        break;
    default: /* every fifth, from the end of the previous row's stride */
        for (int c = 2; c < COLS; c += 5)
            cols[n++] = c;
        break;
    }
    return n;
}

static void write_row(double *a, int r, const int *cols, int n) {
    for (int k = 0; k < n; k++)
        a[r * COLS + cols[k]] = r + k; // RACE
}

int main(void) {
    check(dsm_init(), "dsm_init");
    int rank = dsm_rank();
    double *hit = must(dsm_alloc_2d("hit", sizeof(double), ROWS, COLS), "alloc hit");
    double *gaps = must(dsm_alloc_2d("gaps", sizeof(double), ROWS, COLS), "alloc gaps");
    double *sums = must(dsm_alloc("sums", sizeof(double), (size_t)dsm_size()), "alloc sums");
    check(dsm_barrier(), "dsm_barrier");
    int cols[COLS + 1];
    if (rank == 0) {
        for (int r = 0; r < ROWS; r++)
            write_row(hit, r, cols, pattern(r, cols));
        for (int r = 0; r < ROWS; r++)
            write_row(gaps, r, cols, pattern(r, cols));
    } else if (rank == 1) {
        double s = 0;
        for (int r = 0; r < ROWS; r++) {
            char written[COLS];
            memset(written, 0, sizeof written);
            int n = pattern(r, cols);
            for (int k = 0; k < n; k++)
                written[cols[k]] = 1;
            /* Two loops: clang makes one load of an if-else's two. */
            for (int c = 0; c < COLS; c++)
                if (written[c])
                    s += hit[r * COLS + c]; // RACE
            for (int c = 0; c < COLS; c++)
                if (!written[c])
                    s += gaps[r * COLS + c];
        }
        sums[rank] = s;
    }
    check(dsm_barrier(), "dsm_barrier");
    return dsm_finish();
}
