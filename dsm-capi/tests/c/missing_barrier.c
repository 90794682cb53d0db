/* Rank 0 fills an array that the other ranks read without a barrier in between.
 * EXPECT: data */
#include "kernel.h"

int main(void) {
    check(dsm_init(), "dsm_init");
    int rank = dsm_rank(), size = dsm_size();
    long *data = must(dsm_alloc("data", sizeof(long), 16), "dsm_alloc");
    long *sink = must(dsm_alloc("sink", sizeof(long), (size_t)size), "dsm_alloc");
    if (rank == 0) {
        for (int i = 0; i < 16; i++)
            data[i] = i + 1; // RACE
    } else {
        long s = 0;
        for (int i = 0; i < 16; i++)
            s += data[i]; // RACE
        sink[rank] = s;
    }
    check(dsm_barrier(), "dsm_barrier");
    return dsm_finish();
}
