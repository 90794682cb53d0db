/* dsm_assume_initialised and dsm_declare_region under dsmrun --check: every rank reads a
 * counter nobody wrote (its zero fill is its initial value). `assume` declares that; `none`
 * does not (an uninitialised read per rank); `bad` passes an address that is no
 * allocation's start. `region` declares each rank's band of `band` and has the last rank
 * write band[0], in rank 0's band, after a barrier; `badrule` passes an unknown rule. */
#include <stdio.h>
#include <string.h>
#include "dsm.h"

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "none";
    if (dsm_init() != DSM_OK) {
        fprintf(stderr, "dsm_init: %s\n", dsm_last_error());
        return 1;
    }
    long *count = dsm_alloc("count", sizeof(long), 4);
    if (!count) {
        fprintf(stderr, "dsm_alloc: %s\n", dsm_last_error());
        return 1;
    }
    if (strcmp(mode, "assume") == 0 && dsm_assume_initialised(count) != DSM_OK) {
        fprintf(stderr, "dsm_assume_initialised: %s\n", dsm_last_error());
        return 1;
    }
    if (strcmp(mode, "bad") == 0) {
        int rc = dsm_assume_initialised(count + 1);
        printf("bad pointer: %d %s\n", rc, dsm_last_error());
    }
    if (strcmp(mode, "region") == 0 || strcmp(mode, "badrule") == 0) {
        int n = dsm_size(), me = dsm_rank();
        long *band = dsm_alloc("band", sizeof(long), 4 * (size_t)n);
        size_t first[64], end[64];
        if (!band || n > 64) {
            return 1;
        }
        for (int r = 0; r < n; r++) {
            first[r] = 4 * (size_t)r;
            end[r] = 4 * (size_t)r + 4;
        }
        int rule = strcmp(mode, "badrule") == 0 ? 7 : DSM_REGION_WRITES;
        int rc = dsm_declare_region(band, rule, first, end);
        if (rc != DSM_OK) {
            printf("declare: %d %s\n", rc, dsm_last_error());
        }
        for (int i = 0; i < 4; i++) {
            band[4 * me + i] = me;
        }
        dsm_barrier();
        if (me == n - 1) {
            band[0] = 9; /* rank 0's element, after its own write: no race */
        }
    }
    long seen = count[0];
    dsm_barrier();
    if (dsm_rank() == 0) {
        printf("count %ld\n", seen);
    }
    return dsm_finish();
}
