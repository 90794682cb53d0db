/* options.h: the command-line parsing the C apps share, so that each says what it accepts
 * and every one rejects bad input the same way: a value that is not wholly a number, or is
 * out of its range, or an unknown option, is named on stderr with the program's usage, and
 * the program exits 2 (atoi would have taken "12x" for 12 and "x" for 0).
 *
 *   Options o = options_begin("tsp", "usage: tsp [--cities N] [--seed S]", argc, argv);
 *   while (options_next(&o))
 *       if (!option_int(&o, "--cities", 1, MAX_CITIES, &n) && !option_u64(&o, "--seed", &seed))
 *           options_unknown(&o);
 *
 * Header-only (static functions): the apps are single files built by dsmcc. */
#ifndef DSM_C_APPS_OPTIONS_H
#define DSM_C_APPS_OPTIONS_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *prog;  /* the program's name, prefixing its messages */
    const char *usage; /* printed after any error */
    int argc;
    char **argv;
    int at; /* the argument being looked at */
} Options;

static inline Options options_begin(const char *prog, const char *usage, int argc, char **argv) {
    Options o = {prog, usage, argc, argv, 0};
    return o;
}

/* Moves to the next argument; 0 when there is none. */
static inline int options_next(Options *o) {
    return ++o->at < o->argc;
}

/* Reports `what` about the current argument, prints the usage and exits 2. */
static inline void options_fail(const Options *o, const char *what) {
    fprintf(stderr, "%s: %s\n%s\n", o->prog, what, o->usage);
    exit(2);
}

/* The current argument is not one the program knows. */
static inline void options_unknown(const Options *o) {
    char what[256];
    snprintf(what, sizeof what, "unknown argument '%s'", o->argv[o->at]);
    options_fail(o, what);
}

/* Parses `text`, the value of `name`, as a whole integer in lo..hi, or fails. */
static inline long long options_parse_int(const Options *o, const char *name, const char *text,
                                          long long lo, long long hi) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        char what[256];
        snprintf(what, sizeof what, "%s must be an integer in %lld..%lld, not '%s'", name, lo, hi,
                 text);
        options_fail(o, what);
    }
    return v;
}

/* The value after option `name`, which is the current argument; fails when there is none. */
static inline const char *options_value(Options *o, const char *name) {
    if (o->at + 1 >= o->argc) {
        char what[256];
        snprintf(what, sizeof what, "%s needs a value", name);
        options_fail(o, what);
    }
    return o->argv[++o->at];
}

/* Whether the current argument is the flag `name` (an option without a value). */
static inline int option_flag(const Options *o, const char *name) {
    return strcmp(o->argv[o->at], name) == 0;
}

/* If the current argument is `name`: its value, an integer in lo..hi, into *out; 1. */
static inline int option_int(Options *o, const char *name, int lo, int hi, int *out) {
    if (!option_flag(o, name))
        return 0;
    *out = (int)options_parse_int(o, name, options_value(o, name), lo, hi);
    return 1;
}

/* option_int for a long. */
static inline int option_long(Options *o, const char *name, long lo, long hi, long *out) {
    if (!option_flag(o, name))
        return 0;
    *out = (long)options_parse_int(o, name, options_value(o, name), lo, hi);
    return 1;
}

/* If the current argument is `name`: its value, any unsigned 64-bit integer, into *out; 1. */
static inline int option_u64(Options *o, const char *name, uint64_t *out) {
    if (!option_flag(o, name))
        return 0;
    const char *text = options_value(o, name);
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    /* strtoull accepts "-1" as its negation: refuse a sign. */
    if (errno || end == text || *end || text[strspn(text, " \t")] == '-') {
        char what[256];
        snprintf(what, sizeof what, "%s must be an unsigned 64-bit integer, not '%s'", name, text);
        options_fail(o, what);
    }
    *out = (uint64_t)v;
    return 1;
}

/* Positional argument `index` (1-based) named `name`, an integer in lo..hi; `fallback`
 * when absent. */
static inline int option_positional(const Options *o, int index, const char *name, int lo, int hi,
                                    int fallback) {
    if (index >= o->argc)
        return fallback;
    return (int)options_parse_int(o, name, o->argv[index], lo, hi);
}

#endif
