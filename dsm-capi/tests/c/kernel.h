/* Shared by the labelled C race kernels: start, stop, and a helper that fails loudly.
 * Every kernel says in an `EXPECT:` comment which variables race (or `none`), and ends
 * each line whose access takes part in a race with a `RACE` comment: the test
 * (dsm-capi/tests/c_kernels.rs) checks that dsmrun --race reports exactly those
 * variables and, for every race, both sides' lines among the marked ones. */
#ifndef KERNEL_H
#define KERNEL_H
#include <stdio.h>
#include <stdlib.h>
#include "dsm.h"

static void check(int rc, const char *what) {
    if (rc < 0) {
        fprintf(stderr, "%s failed (%d): %s\n", what, rc, dsm_last_error());
        exit(2);
    }
}

static void *must(void *p, const char *what) {
    if (!p) {
        fprintf(stderr, "%s failed: %s\n", what, dsm_last_error());
        exit(2);
    }
    return p;
}
#endif
