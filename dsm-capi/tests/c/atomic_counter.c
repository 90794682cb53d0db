/* Every rank increments one shared counter with a C11 atomic: atomic on this rank's copy
 * of the page only, so under dsm the increments race (and can be lost).
 * EXPECT: hits */
#include <stdatomic.h>
#include "kernel.h"

int main(void) {
    check(dsm_init(), "dsm_init");
    _Atomic long *hits = must(dsm_alloc("hits", sizeof(long), 1), "dsm_alloc");
    atomic_fetch_add(&hits[0], 1); // RACE
    check(dsm_barrier(), "dsm_barrier");
    return dsm_finish();
}
