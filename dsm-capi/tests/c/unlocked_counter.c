/* Every rank increments one shared counter without a lock.
 * EXPECT: counter */
#include "kernel.h"

int main(void) {
    check(dsm_init(), "dsm_init");
    unsigned *counter = must(dsm_alloc("counter", sizeof(unsigned), 1), "dsm_alloc");
    for (int k = 0; k < 3; k++)
        counter[0] += 1; // RACE
    check(dsm_barrier(), "dsm_barrier");
    return dsm_finish();
}
