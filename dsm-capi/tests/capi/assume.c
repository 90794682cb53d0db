/* dsm_assume_initialised under dsmrun --check: every rank reads a counter nobody wrote
 * (its zero fill is its initial value). `assume` declares that; `none` does not (an
 * uninitialised read per rank); `bad` passes an address that is no allocation's start. */
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
    long seen = count[0];
    dsm_barrier();
    if (dsm_rank() == 0) {
        printf("count %ld\n", seen);
    }
    return dsm_finish();
}
