/*
 * sor.c: red-black successive over-relaxation with POSIX threads, the shared-memory
 * counterpart of dsm's `sor` app, so that thread-level race detectors (ThreadSanitizer,
 * Helgrind, DRD) can be timed on the same algorithm as `dsmrun --race sor`.
 *
 * Same computation as the dsm app: an N x N grid of doubles with a fixed boundary (top edge
 * 1.0, other edges 0.0) and a deterministic interior pattern, omega 1.5, each iteration a red
 * phase then a black phase separated by pthread_barrier_wait, interior rows banded across T
 * threads in contiguous near-equal pieces. A red point reads only black neighbours and vice
 * versa, so the program is race-free and its result does not depend on T.
 *
 * Usage: sor N ITERS THREADS
 * Prints one line: "sor NxN, K iterations, T threads: checksum C; time S s", where S is the
 * time of the iterations alone (between two barriers), measured by thread 0, so that tool
 * start-up (valgrind's in particular) is not part of the figure.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static const double OMEGA = 1.5;

struct shared {
    long n;
    long iters;
    long threads;
    double *grid;
    pthread_barrier_t barrier;
    double seconds;
};

struct worker {
    struct shared *s;
    long id;
};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double initial(long n, long i, long j)
{
    if (i == 0)
        return 1.0;
    if (i == n - 1 || j == 0 || j == n - 1)
        return 0.0;
    return (double)((i * 31 + j * 17) % 97) / 97.0;
}

/* The k-th of `parts` near-equal contiguous pieces of 0..total, as dsm's band(). */
static void band(long total, long parts, long k, long *lo, long *hi)
{
    long base = total / parts, extra = total % parts;
    *lo = k * base + (k < extra ? k : extra);
    *hi = *lo + base + (k < extra ? 1 : 0);
}

static void *work(void *arg)
{
    struct worker *w = arg;
    struct shared *s = w->s;
    long n = s->n, lo, hi;
    double *g = s->grid;
    double t0 = 0.0;

    /* Each thread initialises the rows it will update, as each dsm node writes its band. */
    band(n, s->threads, w->id, &lo, &hi);
    for (long i = lo; i < hi; i++)
        for (long j = 0; j < n; j++)
            g[i * n + j] = initial(n, i, j);
    if (lo < 1)
        lo = 1;
    if (hi > n - 1)
        hi = n - 1;

    pthread_barrier_wait(&s->barrier);
    if (w->id == 0)
        t0 = now();
    for (long it = 0; it < s->iters; it++) {
        for (long colour = 0; colour < 2; colour++) {
            for (long i = lo; i < hi; i++) {
                /* Red points have (i + j) even: the row's first one is at column 1 or 2. */
                long j0 = ((i + 1) % 2 == colour) ? 1 : 2;
                for (long j = j0; j < n - 1; j += 2) {
                    double *p = &g[i * n + j];
                    double sum = p[-n] + p[n] + p[-1] + p[1];
                    *p = (1.0 - OMEGA) * *p + OMEGA * 0.25 * sum;
                }
            }
            pthread_barrier_wait(&s->barrier);
        }
    }
    if (w->id == 0)
        s->seconds = now() - t0;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s N ITERS THREADS\n", argv[0]);
        return 2;
    }
    struct shared s;
    s.n = atol(argv[1]);
    s.iters = atol(argv[2]);
    s.threads = atol(argv[3]);
    if (s.n < 3 || s.iters < 0 || s.threads < 1 || s.threads > 1024) {
        fprintf(stderr, "sor: need N >= 3, ITERS >= 0, 1 <= THREADS <= 1024\n");
        return 2;
    }
    s.grid = malloc(sizeof(double) * (size_t)s.n * (size_t)s.n);
    pthread_t *tid = malloc(sizeof(pthread_t) * (size_t)s.threads);
    struct worker *ws = malloc(sizeof(struct worker) * (size_t)s.threads);
    if (!s.grid || !tid || !ws) {
        fprintf(stderr, "sor: out of memory\n");
        return 1;
    }
    pthread_barrier_init(&s.barrier, NULL, (unsigned)s.threads);
    for (long t = 0; t < s.threads; t++) {
        ws[t].s = &s;
        ws[t].id = t;
        if (pthread_create(&tid[t], NULL, work, &ws[t]) != 0) {
            fprintf(stderr, "sor: pthread_create failed\n");
            return 1;
        }
    }
    for (long t = 0; t < s.threads; t++)
        pthread_join(tid[t], NULL);
    pthread_barrier_destroy(&s.barrier);

    double checksum = 0.0;
    for (long k = 0; k < s.n * s.n; k++)
        checksum += s.grid[k];
    printf("sor %ldx%ld, %ld iterations, %ld threads: checksum %.6f; time %.6f s\n", s.n, s.n,
           s.iters, s.threads, checksum, s.seconds);
    free(ws);
    free(tid);
    free(s.grid);
    return 0;
}
