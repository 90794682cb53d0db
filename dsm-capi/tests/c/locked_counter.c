/* Every rank increments two shared counters, one under a numbered lock and one under a
 * named lock; rank 0 checks the totals after a barrier.
 * EXPECT: none */
#include "kernel.h"

int main(void) {
    check(dsm_init(), "dsm_init");
    int rank = dsm_rank(), size = dsm_size();
    long *counter = must(dsm_alloc("counter", sizeof(long), 2), "dsm_alloc");
    for (int k = 0; k < 3; k++) {
        check(dsm_lock(7), "dsm_lock");
        counter[0] += 1;
        check(dsm_unlock(7), "dsm_unlock");
        check(dsm_lock_named("counter"), "dsm_lock_named");
        counter[1] += 1;
        check(dsm_unlock_named("counter"), "dsm_unlock_named");
    }
    check(dsm_barrier(), "dsm_barrier");
    if (rank == 0 && (counter[0] != 3L * size || counter[1] != 3L * size)) {
        fprintf(stderr, "counters %ld, %ld, expected %ld\n", counter[0], counter[1], 3L * size);
        return 3;
    }
    return dsm_finish();
}
