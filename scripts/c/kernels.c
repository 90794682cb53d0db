/*
 * kernels.c: C/pthreads translations of a few of dsm's labelled race kernels
 * (`race-kernel list`), so that ThreadSanitizer, Helgrind and DRD can be asked the same
 * question as `dsmrun --race race-kernel run NAME`: is the planted race found, and is a
 * race-free twin left alone?
 *
 * Usage: kernels NAME [THREADS]   (THREADS defaults to 2; `kernels list` lists the names)
 *
 * Each thread plays one dsm node (rank = thread index). Shared data is reached through
 * volatile pointers so that -O2 keeps every load and store the dsm kernel makes: the
 * detectors must see the same accesses, not what the optimiser leaves of them. The
 * program always exits 0 itself; a detector's verdict comes from its report and exit code.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K 8

static long nthreads = 2;
static pthread_barrier_t barrier;
static pthread_mutex_t lock_a = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t *per_thread_locks;

static volatile unsigned long counter;
static volatile unsigned long data[K];
static volatile unsigned long sink[1024];
static volatile unsigned long bound;
static volatile int cell[16];
static volatile double lattice[64];

/* Every thread increments one counter ten times without a lock: racy. */
static void unprotected_counter(long me)
{
    (void)me;
    for (int i = 0; i < 10; i++)
        counter = counter + 1;
}

/* The same under one mutex: race-free. */
static void locked_counter(long me)
{
    (void)me;
    for (int i = 0; i < 10; i++) {
        pthread_mutex_lock(&lock_a);
        counter = counter + 1;
        pthread_mutex_unlock(&lock_a);
    }
}

/* Thread 0 produces data[], the others consume it with no barrier in between: racy. */
static void missing_barrier(long me)
{
    if (me == 0) {
        for (int i = 0; i < K; i++)
            data[i] = (unsigned long)i + 1;
    } else {
        unsigned long s = 0;
        for (int i = 0; i < K; i++)
            s += data[i];
        sink[me] = s;
    }
}

/* The same producer/consumer with a barrier in between: race-free. */
static void with_barrier(long me)
{
    if (me == 0)
        for (int i = 0; i < K; i++)
            data[i] = (unsigned long)i + 1;
    pthread_barrier_wait(&barrier);
    if (me != 0) {
        unsigned long s = 0;
        for (int i = 0; i < K; i++)
            s += data[i];
        sink[me] = s;
    }
}

/*
 * As in TSP: a global bound is read without the lock that guards its updates, to prune
 * cheaply; a stale value costs only extra work. Racy (read/write on `bound`).
 */
static void tsp_bound(long me)
{
    if (me == 0)
        bound = (unsigned long)-1;
    pthread_barrier_wait(&barrier);
    for (unsigned long step = 0; step < 20; step++) {
        unsigned long candidate = 1000 - step * 7 - (unsigned long)me;
        if (candidate < bound) {
            pthread_mutex_lock(&lock_a);
            if (candidate < bound)
                bound = candidate;
            pthread_mutex_unlock(&lock_a);
        }
    }
    sink[me] = 1;
}

/* Threads 0 and 1 write the same element with no synchronization: racy. */
static void write_write(long me)
{
    if (me <= 1)
        cell[9] = (int)me + 1;
}

/* One variable updated under a different lock in each thread: racy. */
static void different_locks(long me)
{
    pthread_mutex_lock(&per_thread_locks[me]);
    counter = counter + 1;
    pthread_mutex_unlock(&per_thread_locks[me]);
}

/* Neighbouring doubles written by different threads (false sharing only): race-free. */
static void false_sharing(long me)
{
    for (long i = me; i < 64; i += nthreads)
        lattice[i] = (double)i;
}

struct kernel {
    const char *name;
    int racy;
    void (*run)(long me);
};

static const struct kernel kernels[] = {
    {"unprotected-counter", 1, unprotected_counter},
    {"locked-counter", 0, locked_counter},
    {"missing-barrier", 1, missing_barrier},
    {"with-barrier", 0, with_barrier},
    {"tsp-bound", 1, tsp_bound},
    {"write-write", 1, write_write},
    {"different-locks", 1, different_locks},
    {"false-sharing", 0, false_sharing},
};
#define NKERNELS (sizeof kernels / sizeof kernels[0])

static const struct kernel *chosen;

static void *thread_main(void *arg)
{
    chosen->run((long)(size_t)arg);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "list") == 0) {
        for (size_t k = 0; k < NKERNELS; k++)
            printf("%-22s %s\n", kernels[k].name, kernels[k].racy ? "race" : "no race");
        return 0;
    }
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s NAME [THREADS] | %s list\n", argv[0], argv[0]);
        return 2;
    }
    for (size_t k = 0; k < NKERNELS; k++)
        if (strcmp(argv[1], kernels[k].name) == 0)
            chosen = &kernels[k];
    if (!chosen) {
        fprintf(stderr, "kernels: no kernel named '%s' (try 'list')\n", argv[1]);
        return 2;
    }
    if (argc == 3)
        nthreads = atol(argv[2]);
    if (nthreads < 2 || nthreads > 1024) {
        fprintf(stderr, "kernels: THREADS must be in 2..1024\n");
        return 2;
    }
    pthread_barrier_init(&barrier, NULL, (unsigned)nthreads);
    per_thread_locks = malloc(sizeof(pthread_mutex_t) * (size_t)nthreads);
    pthread_t *tid = malloc(sizeof(pthread_t) * (size_t)nthreads);
    if (!per_thread_locks || !tid) {
        fprintf(stderr, "kernels: out of memory\n");
        return 1;
    }
    for (long t = 0; t < nthreads; t++)
        pthread_mutex_init(&per_thread_locks[t], NULL);
    for (long t = 0; t < nthreads; t++)
        if (pthread_create(&tid[t], NULL, thread_main, (void *)(size_t)t) != 0) {
            fprintf(stderr, "kernels: pthread_create failed\n");
            return 1;
        }
    for (long t = 0; t < nthreads; t++)
        pthread_join(tid[t], NULL);
    printf("kernel %s done on %ld threads\n", chosen->name, nthreads);
    free(tid);
    free(per_thread_locks);
    return 0;
}
