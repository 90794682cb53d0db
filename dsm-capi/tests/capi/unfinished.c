/* A program that ends without dsm_finish, or finishes holding a lock.
 *   unfinished race     both ranks write c[0] in epoch 1 and c[1] in the last epoch, and
 *                       main returns 0 without dsm_finish: dsm finishes at exit, reports
 *                       both races and exits with the race status.
 *   unfinished clean    the same, each rank writing its own element: exit status 0.
 *   unfinished holding  rank 0 still holds lock 9 at dsm_finish, which rank 1 waits for:
 *                       dsm_finish fails with a message, the job ends (no hang). */
#include <dsm.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "race";
    if (dsm_init() != DSM_OK) {
        fprintf(stderr, "init: %s\n", dsm_last_error());
        return 1;
    }
    long *c = dsm_alloc("c", sizeof(long), 8);
    int rank = dsm_rank();
    if (strcmp(mode, "holding") == 0) {
        if (rank == 0)
            dsm_lock(9);
        dsm_barrier();
        if (rank == 1)
            dsm_lock(9);
        return dsm_finish();
    }
    int racy = strcmp(mode, "race") == 0;
    c[racy ? 0 : 2 + rank] = rank; /* RACE when racy */
    dsm_barrier();
    c[racy ? 1 : 4 + rank] = rank; /* RACE when racy */
    printf("rank %d returns without dsm_finish\n", rank);
    return 0;
}
