/* dsm.h: the C API of dsm, a software distributed shared memory with a data-race
 * detector. A program runs as N processes (ranks) started by `dsmrun -n N ./prog`; they
 * share the arrays they allocate collectively with dsm_alloc. Compile with
 * `-fsanitize=thread -g` and link against libdsm instead of libtsan (see `dsmcc`) and
 * `dsmrun --race` reports the data races between ranks, naming both sides' source lines.
 *
 * Every function returns DSM_OK (0) or a negative error code, except where said
 * otherwise; dsm_last_error() then says what went wrong. Call the API from the thread
 * that called dsm_init. */
#ifndef DSM_H
#define DSM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DSM_OK 0
/* An argument the API does not accept (a NULL name, zero elements, ...). */
#define DSM_EINVAL (-1)
/* Called before dsm_init, after dsm_finish, or from another thread than dsm_init's. */
#define DSM_ESTATE (-2)
/* The runtime failed (the job, the network, the shared segment); see dsm_last_error. */
#define DSM_EFAIL (-3)
/* An internal error (a bug in dsm); see dsm_last_error. */
#define DSM_EBUG (-4)

/* Joins the job dsmrun started (or runs as a single rank when started alone). */
int dsm_init(void);
/* This rank (0..size-1), or a negative error code. */
int dsm_rank(void);
/* Number of ranks, or a negative error code. */
int dsm_size(void);
/* 1 when race detection is on (dsmrun --race), 0 when off, or a negative error code. */
int dsm_race_detection(void);

/* Collectively allocates `count` zeroed elements of `elem_size` bytes named `name`
 * (race reports say name[i]). Every rank makes the same allocations in the same order;
 * this is also a barrier. Returns the array's address (the same on every rank), or NULL
 * on error. */
void *dsm_alloc(const char *name, size_t elem_size, size_t count);
/* As dsm_alloc for a rows x cols row-major array, homed by bands of rows (reports say
 * name[r][c]). */
void *dsm_alloc_2d(const char *name, size_t elem_size, size_t rows, size_t cols);

/* Waits at a barrier with every rank. */
int dsm_barrier(void);
/* Acquires lock `id` (below 2^63); locks are not recursive. */
int dsm_lock(uint64_t id);
/* Releases lock `id`, held by this rank. */
int dsm_unlock(uint64_t id);
/* Says which locks this rank takes next, in order (`count` ids below 2^63): across hosts
 * their tokens are asked for ahead, so each dsm_lock finds its lock here instead of
 * waiting a round trip. A hint never changes what the program computes (a token that came
 * ahead goes on at once to a rank that asks first); a new hint replaces the last. */
int dsm_prefetch_locks(const uint64_t *ids, size_t count);
/* Acquires the lock named `name` (reports name it). */
int dsm_lock_named(const char *name);
/* Releases the lock named `name`. */
int dsm_unlock_named(const char *name);

/* Opens the counting semaphore `name` with `initial` tokens (every rank opening it must
 * give the same count); returns a handle (>= 0) or a negative error code. */
int dsm_sem_open(const char *name, unsigned initial);
/* Takes a token, waiting for one. */
int dsm_sem_wait(int sem);
/* Returns a token. */
int dsm_sem_signal(int sem);

/* dsmrun --check: takes the zero fill of the allocation starting at `array` as its initial
 * value, so reading elements nobody wrote (a counter that starts at zero) is not reported
 * as an uninitialised read. Call it right after the allocation; rank 0's call is the one
 * used. Without --check it does nothing. DSM_EINVAL if `array` is not an allocation's
 * start. */
int dsm_assume_initialised(const void *array);

/* dsmrun --check: reports rank r's writes (DSM_REGION_WRITES) or reads and writes
 * (DSM_REGION_ACCESSES) of the allocation starting at `array` outside its elements
 * first[r] .. end[r]-1, like the local part of a distributed array. `first` and `end` have
 * dsm_size() entries; rank 0's call is the one used. Without --check it does nothing. */
#define DSM_REGION_WRITES 0
#define DSM_REGION_ACCESSES 1
int dsm_declare_region(const void *array, int rule, const size_t *first, const size_t *end);

/* Leaves the job (collectively). Returns the exit status the race convention asks for
 * (non-zero on rank 0 when races were reported; `return dsm_finish();` from main), or a
 * negative error code. */
int dsm_finish(void);

/* What the last failed call on this thread went wrong with ("" if none); valid until the
 * next call. */
const char *dsm_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* DSM_H */
