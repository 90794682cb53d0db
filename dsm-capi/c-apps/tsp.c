/* tsp: travelling salesman by parallel branch and bound in C on dsm, after the design of
 * the Rust app (apps/src/tsp), written for this repository.
 *
 *   dsmcc -O2 -o tsp tsp.c && dsmrun -n 4 [--race] ./tsp [--cities N] [--seed S]
 *       [--queue CAPACITY]
 *
 * The instance: N cities at random integer points of a 1000 x 1000 square (SplitMix64 from
 * the seed, the same on every rank), rounded Euclidean distances. Tours start at city 0.
 *
 * Shared (all under locks, so the program is race-free):
 * - "queue": partial tours (path prefixes from city 0 with their lengths) and "queue_meta"
 *   (how many are queued, how many ranks hold work, the done flag), under the lock
 *   "queue". Rank 0 queues the tour of city 0 alone.
 * - "best": the shortest tour found so far (length and path), under the lock "best".
 *
 * A rank takes one tour from the queue in the same critical section that queues the
 * children of its previous one and says whether it still holds work. A tour with more than
 * N - DEPTH cities unvisited is split into its children (one more city), which go back to
 * the queue (kept by the rank that made them when the queue is full: by default it holds
 * every tour the search can queue, --queue makes it smaller); a smaller one is
 * searched depth-first in private memory, pruned against a private copy of the best
 * length, refreshed under "best" at each take and updated there when the rank finds a
 * shorter tour. Pruning uses length + the cheapest edge out of the last city and out of
 * every unvisited city, a lower bound on any completion. A rank that finds the queue
 * empty while no rank holds work sets done; everybody stops, then a barrier.
 *
 * Rank 0 checks the result against a plain sequential depth-first search over all tours
 * on private memory (pruned only by the tour length so far): the same optimal length, and
 * the shared best path must be a tour of that length. It prints a `verified:` line, or
 * exits 1. */
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "dsm.h"
#include "options.h"

#define MAX_CITIES 16
#define STR_(x) #x
#define STR(x) STR_(x) /* a macro's value as a string literal */
#define DEPTH 2 /* tours are split through the queue until they have 1 + DEPTH cities */
#define NO_TOUR INT64_MAX

typedef struct {
    int64_t len;
    int32_t cities;
    uint8_t path[MAX_CITIES];
} Tour;

typedef struct {
    int64_t queued, busy, done;
} Meta;

static int n;
static int64_t dist[MAX_CITIES][MAX_CITIES], cheapest[MAX_CITIES];

static void die(const char *what) {
    fprintf(stderr, "tsp: %s: %s\n", what, dsm_last_error());
    exit(2);
}
static void check(int rc, const char *what) {
    if (rc != DSM_OK)
        die(what);
}

static uint64_t rng_state;
static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void make_instance(uint64_t seed) {
    int64_t x[MAX_CITIES], y[MAX_CITIES];
    rng_state = seed;
    for (int i = 0; i < n; i++) {
        x[i] = (int64_t)(next_u64() % 1000);
        y[i] = (int64_t)(next_u64() % 1000);
    }
    for (int i = 0; i < n; i++) {
        cheapest[i] = NO_TOUR;
        for (int j = 0; j < n; j++) {
            double dx = (double)(x[i] - x[j]), dy = (double)(y[i] - y[j]);
            dist[i][j] = (int64_t)llround(sqrt(dx * dx + dy * dy));
            if (j != i && dist[i][j] < cheapest[i])
                cheapest[i] = dist[i][j];
        }
    }
    if (n == 1)
        cheapest[0] = 0;
}

/* --- The parallel search. --- */

static Tour *queue, *best;
static Meta *meta;
static int64_t capacity, my_best = NO_TOUR;
static long expanded, leaves, kept;

/* Records a complete tour if it beats the shared best (re-read under the lock). */
static void offer(const uint8_t *path, int64_t len) {
    check(dsm_lock_named("best"), "dsm_lock_named");
    if (len < best->len) {
        best->len = len;
        for (int i = 0; i < n; i++)
            best->path[i] = path[i];
        best->cities = n;
    }
    my_best = best->len;
    check(dsm_unlock_named("best"), "dsm_unlock_named");
}

/* Depth-first search below the prefix path[0..cities) of length len, visited mask seen. */
static void search(uint8_t *path, int cities, uint32_t seen, int64_t len) {
    int last = path[cities - 1];
    if (cities == n) {
        leaves++;
        int64_t total = len + (n > 1 ? dist[last][0] : 0);
        if (total < my_best)
            offer(path, total);
        return;
    }
    int64_t rest = cheapest[last];
    for (int c = 0; c < n; c++)
        if (!(seen >> c & 1))
            rest += cheapest[c];
    if (len + rest >= my_best)
        return;
    for (int c = 1; c < n; c++) {
        if (seen >> c & 1)
            continue;
        path[cities] = (uint8_t)c;
        search(path, cities + 1, seen | 1u << c, len + dist[last][c]);
    }
}

static void parallel(void) {
    Tour work, children[MAX_CITIES];
    int have = 0, nchildren = 0;
    for (;;) {
        check(dsm_lock_named("queue"), "dsm_lock_named");
        int pushed = 0;
        for (; pushed < nchildren && meta->queued < capacity; pushed++)
            queue[meta->queued++] = children[pushed];
        int keep = nchildren - pushed, done = 0;
        if (keep == 0) {
            meta->busy -= have;
            have = 0;
            if (meta->queued > 0) {
                work = queue[--meta->queued];
                meta->busy++;
                have = 1;
            } else if (meta->busy == 0) {
                meta->done = 1;
            }
        }
        done = (int)meta->done;
        check(dsm_unlock_named("queue"), "dsm_unlock_named");
        if (keep > 0) {
            /* The queue is full: search the children that did not fit ourselves. */
            for (int i = pushed; i < nchildren; i++) {
                Tour *t = &children[i];
                uint32_t seen = 0;
                for (int k = 0; k < t->cities; k++)
                    seen |= 1u << t->path[k];
                kept++;
                search(t->path, t->cities, seen, t->len);
            }
            nchildren = 0;
            continue;
        }
        nchildren = 0;
        if (done)
            break;
        if (!have) {
            sched_yield();
            continue;
        }
        check(dsm_lock_named("best"), "dsm_lock_named");
        my_best = best->len;
        check(dsm_unlock_named("best"), "dsm_unlock_named");
        uint32_t seen = 0;
        for (int i = 0; i < work.cities; i++)
            seen |= 1u << work.path[i];
        if (work.cities <= DEPTH && work.cities < n) {
            expanded++;
            int last = work.path[work.cities - 1];
            for (int c = 1; c < n; c++) {
                if (seen >> c & 1)
                    continue;
                Tour *t = &children[nchildren++];
                *t = work;
                t->path[t->cities++] = (uint8_t)c;
                t->len = work.len + dist[last][c];
            }
        } else {
            search(work.path, work.cities, seen, work.len);
        }
    }
}

/* --- The sequential reference: every tour, pruned by its length only. --- */

static int64_t seq_best;
static void exhaustive(int last, int cities, uint32_t seen, int64_t len) {
    if (len >= seq_best)
        return;
    if (cities == n) {
        int64_t total = len + (n > 1 ? dist[last][0] : 0);
        if (total < seq_best)
            seq_best = total;
        return;
    }
    for (int c = 1; c < n; c++)
        if (!(seen >> c & 1))
            exhaustive(c, cities + 1, seen | 1u << c, len + dist[last][c]);
}

static int verify(const Tour *got, int size, uint64_t seed) {
    seq_best = NO_TOUR;
    exhaustive(0, 1, 1, 0);
    uint32_t seen = 0;
    int64_t len = 0;
    int ok = got->cities == n && got->path[0] == 0;
    for (int i = 0; ok && i < n; i++) {
        int c = got->path[i];
        ok = c < n && !(seen >> c & 1);
        seen |= 1u << c;
        len += dist[c][got->path[(i + 1) % n]] * (n > 1);
    }
    if (!ok || len != got->len) {
        fprintf(stderr, "tsp: the shared best (length %lld) is not a tour of that length\n",
                (long long)got->len);
        return 1;
    }
    if (got->len != seq_best) {
        fprintf(stderr, "tsp: the parallel search found length %lld, the sequential search %lld\n",
                (long long)got->len, (long long)seq_best);
        return 1;
    }
    printf("verified: c tsp %d cities (seed %llu), %d ranks: optimal length %lld, the same as "
           "the sequential search; tour",
           n, (unsigned long long)seed, size, (long long)got->len);
    for (int i = 0; i < n; i++)
        printf(" %d", got->path[i]);
    printf("\n");
    return 0;
}

int main(int argc, char **argv) {
    uint64_t seed = 1;
    long queue_cap = 0;
    n = 11;
    Options o = options_begin("tsp", "usage: tsp [--cities N (1.." STR(MAX_CITIES)
                              ", default 11)] [--seed S] [--queue CAPACITY (>= 1)]",
                              argc, argv);
    while (options_next(&o))
        if (!option_int(&o, "--cities", 1, MAX_CITIES, &n) && !option_u64(&o, "--seed", &seed) &&
            !option_long(&o, "--queue", 1, LONG_MAX, &queue_cap))
            options_unknown(&o);
    make_instance(seed);
    check(dsm_init(), "dsm_init");
    int rank = dsm_rank(), size = dsm_size();
    /* Room for every tour the queue can hold: the root and all prefixes up to 1 + DEPTH. */
    capacity = 1;
    for (int64_t level = 1, d = 1; d <= DEPTH && d < n; d++)
        capacity += level *= n - d;
    if (queue_cap > 0 && queue_cap < capacity)
        capacity = queue_cap; /* a smaller queue: some children stay with their maker */
    queue = dsm_alloc("queue", sizeof(Tour), (size_t)capacity);
    meta = dsm_alloc("queue_meta", sizeof(Meta), 1);
    best = dsm_alloc("best", sizeof(Tour), 1);
    if (!queue || !meta || !best)
        die("dsm_alloc");
    if (rank == 0) {
        best->len = NO_TOUR;
        Tour root;
        memset(&root, 0, sizeof root);
        root.cities = 1;
        queue[0] = root;
        meta->queued = 1;
    }
    check(dsm_barrier(), "dsm_barrier");
    parallel();
    check(dsm_barrier(), "dsm_barrier");
    printf("rank %d: %ld tours split, %ld complete tours reached, %ld kept\n", rank, expanded,
           leaves, kept);
    int status = 0;
    if (rank == 0) {
        Tour got = *best;
        status = verify(&got, size, seed);
    }
    int race = dsm_finish();
    if (race < 0)
        die("dsm_finish");
    return race ? race : status;
}
