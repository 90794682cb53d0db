/* The C API's errors: codes and messages, never a crash, from before dsm_init to after
 * dsm_finish. Every rank makes the same calls. Prints "api errors: ok". */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "dsm.h"

#define EXPECT(c)                                                                         \
    if (!(c)) {                                                                           \
        fprintf(stderr, "line %d: %s does not hold (dsm_last_error: %s)\n", __LINE__, #c, \
                dsm_last_error());                                                        \
        return 3;                                                                         \
    }

int main(void) {
    EXPECT(dsm_rank() == DSM_ESTATE);
    EXPECT(strstr(dsm_last_error(), "dsm_init") != NULL);
    EXPECT(dsm_init() == DSM_OK);
    EXPECT(dsm_init() == DSM_ESTATE);
    EXPECT(dsm_alloc(NULL, 8, 1) == NULL);
    EXPECT(strstr(dsm_last_error(), "NULL") != NULL);
    EXPECT(dsm_alloc("empty", 8, 0) == NULL);
    EXPECT(strstr(dsm_last_error(), "empty") != NULL);
    EXPECT(dsm_alloc_2d("flat", 8, 4, 0) == NULL);
    EXPECT(strstr(dsm_last_error(), "zero columns") != NULL);
    EXPECT(dsm_unlock(3) == DSM_EINVAL);
    EXPECT(dsm_lock(1ULL << 63) == DSM_EINVAL);
    EXPECT(dsm_prefetch_locks(NULL, 2) == DSM_EINVAL);
    EXPECT(strstr(dsm_last_error(), "NULL") != NULL);
    uint64_t ahead[] = {5, 1ULL << 63};
    EXPECT(dsm_prefetch_locks(ahead, 2) == DSM_EINVAL);
    EXPECT(strstr(dsm_last_error(), "reserved") != NULL);
    EXPECT(dsm_prefetch_locks(ahead, 1) == DSM_OK);
    EXPECT(dsm_prefetch_locks(NULL, 0) == DSM_OK);
    EXPECT(dsm_sem_wait(42) == DSM_EINVAL);
    EXPECT(dsm_lock(3) == DSM_OK);
    EXPECT(dsm_lock(3) == DSM_EINVAL);
    EXPECT(dsm_unlock(3) == DSM_OK);
    EXPECT(dsm_unlock_named("nobody") == DSM_EINVAL);
    EXPECT(dsm_lock_named("") == DSM_EINVAL);
    EXPECT(strstr(dsm_last_error(), "need a name") != NULL);
    long *a = dsm_alloc("a", sizeof(long), 4);
    EXPECT(a != NULL);
    a[dsm_rank() % 4] = 1;
    EXPECT(dsm_barrier() == DSM_OK);
    EXPECT(dsm_finish() == 0);
    EXPECT(dsm_barrier() == DSM_ESTATE);
    EXPECT(dsm_init() == DSM_ESTATE);
    EXPECT(strstr(dsm_last_error(), "after dsm_finish") != NULL);
    printf("api errors: ok\n");
    return 0;
}
