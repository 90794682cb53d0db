/* Rank 0 writes a message and signals a semaphore; rank 1 waits on it and reads the
 * message: ordered by the semaphore, no race.
 * EXPECT: none */
#include "kernel.h"

int main(void) {
    check(dsm_init(), "dsm_init");
    int rank = dsm_rank();
    long *msg = must(dsm_alloc("msg", sizeof(long), 4), "dsm_alloc");
    long *got = must(dsm_alloc("got", sizeof(long), 1), "dsm_alloc");
    int ready = dsm_sem_open("ready", 0);
    check(ready, "dsm_sem_open");
    if (rank == 0) {
        for (int i = 0; i < 4; i++)
            msg[i] = 100 + i;
        check(dsm_sem_signal(ready), "dsm_sem_signal");
    } else if (rank == 1) {
        check(dsm_sem_wait(ready), "dsm_sem_wait");
        got[0] = msg[0] + msg[3];
        if (got[0] != 203) {
            fprintf(stderr, "got %ld, expected 203\n", got[0]);
            return 3;
        }
    }
    check(dsm_barrier(), "dsm_barrier");
    return dsm_finish();
}
