/* Each rank writes its own element, then, after a barrier, reads every other rank's;
 * neighbouring bytes of one page are written by different ranks in the same epoch.
 * EXPECT: none */
#include "kernel.h"

int main(void) {
    check(dsm_init(), "dsm_init");
    int rank = dsm_rank(), size = dsm_size();
    long *mine = must(dsm_alloc("mine", sizeof(long), (size_t)size), "dsm_alloc");
    char *flags = must(dsm_alloc("flags", 1, (size_t)size), "dsm_alloc");
    long *total = must(dsm_alloc("total", sizeof(long), (size_t)size), "dsm_alloc");
    mine[rank] = 10 * (rank + 1);
    flags[rank] = (char)(rank + 1);
    check(dsm_barrier(), "dsm_barrier");
    long s = 0;
    for (int r = 0; r < size; r++)
        s += mine[r] + flags[r];
    total[rank] = s;
    check(dsm_barrier(), "dsm_barrier");
    long want = 0;
    for (int r = 0; r < size; r++)
        want += 10 * (r + 1) + r + 1;
    if (total[(rank + 1) % size] != want) {
        fprintf(stderr, "rank %d: total %ld, expected %ld\n", rank, total[(rank + 1) % size], want);
        return 3;
    }
    return dsm_finish();
}
