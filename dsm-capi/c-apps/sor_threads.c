/* sor_threads: the red-black SOR of sor.c with POSIX threads in one process, no dsm: the
 * baseline for ThreadSanitizer's own cost on the same kernel.
 *
 *   gcc -O2 -g -pthread -o sor_threads sor_threads.c                     # plain
 *   gcc -O2 -g -pthread -fsanitize=thread -o sor_threads sor_threads.c   # with libtsan
 *   ./sor_threads [THREADS [N [ITERS]]]
 *
 * Rows are banded across the threads as sor.c bands them across ranks, with a barrier
 * after each colour; the result is checked bitwise against a sequential run. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, pthread barriers */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "options.h"

static const double OMEGA = 1.5;
static int n, iters, threads;
static double *grid;
static pthread_barrier_t barrier;

static double initial(int i, int j) {
    if (i == 0)
        return 1.0;
    if (i == n - 1 || j == 0 || j == n - 1)
        return 0.0;
    return (double)((i * 31 + j * 17) % 97) / 97.0;
}

static void relax_row(double *g, int i, int colour) {
    double *row = g + (size_t)i * n, *up = row - n, *down = row + n;
    int j0 = ((i + 1) % 2 == colour) ? 1 : 2;
    for (int j = j0; j < n - 1; j += 2)
        row[j] = (1.0 - OMEGA) * row[j] + OMEGA * 0.25 * (up[j] + down[j] + row[j - 1] + row[j + 1]);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *worker(void *arg) {
    int k = (int)(long)arg;
    int lo = (int)((long)k * n / threads), hi = (int)((long)(k + 1) * n / threads);
    int first = lo > 1 ? lo : 1, last = hi < n - 1 ? hi : n - 1;
    for (int it = 0; it < iters; it++)
        for (int colour = 0; colour < 2; colour++) {
            for (int i = first; i < last; i++)
                relax_row(grid, i, colour);
            pthread_barrier_wait(&barrier);
        }
    return NULL;
}

int main(int argc, char **argv) {
    Options o = options_begin("sor_threads", "usage: sor_threads [THREADS >= 1 [N >= 3 [ITERS >= 0]]]",
                              argc, argv);
    if (argc > 4)
        options_fail(&o, "too many arguments");
    threads = option_positional(&o, 1, "THREADS", 1, 1024, 4);
    n = option_positional(&o, 2, "N", 3, 1 << 15, 1024);
    iters = option_positional(&o, 3, "ITERS", 0, INT_MAX, 20);
    grid = malloc(sizeof(double) * (size_t)n * n);
    double *want = malloc(sizeof(double) * (size_t)n * n);
    pthread_t *ts = malloc(sizeof(pthread_t) * (size_t)threads);
    if (!grid || !want || !ts)
        return 2;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            grid[(size_t)i * n + j] = want[(size_t)i * n + j] = initial(i, j);
    pthread_barrier_init(&barrier, NULL, (unsigned)threads);
    double t0 = now();
    for (int k = 0; k < threads; k++)
        pthread_create(&ts[k], NULL, worker, (void *)(long)k);
    for (int k = 0; k < threads; k++)
        pthread_join(ts[k], NULL);
    double parallel = now() - t0;
    for (int it = 0; it < iters; it++)
        for (int colour = 0; colour < 2; colour++)
            for (int i = 1; i < n - 1; i++)
                relax_row(want, i, colour);
    if (memcmp(grid, want, sizeof(double) * (size_t)n * n) != 0) {
        fprintf(stderr, "sor_threads: the result differs from the sequential run\n");
        return 1;
    }
    printf("verified: c sor_threads %dx%d, %d iterations, %d threads: parallel %.4f s\n", n, n,
           iters, threads, parallel);
    return 0;
}
