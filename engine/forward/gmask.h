/*
 * gmask.h - decoding under a grammar (engine/contract/hp_grammar.h): the
 * recogniser, the tokens it allows next, and the cache of compiled
 * grammars.
 *
 * The recogniser (hp_gmatch_t) is a pushdown automaton over bytes: its
 * state is a set of stacks of grammar positions (an Earley-like set, one
 * stack per way the text so far can go on; JSON grammars keep it to a
 * few). Feeding a byte steps every stack whose top is a terminal that
 * takes it and expands the rules that surface; a stack that empties means
 * the grammar may end there.
 *
 * The allowed tokens (hp_gmask_compute) come from walking the trie of the
 * tokenizer's vocabulary (hp_gmask_vocab_t, every non-special token's
 * bytes, built once per tokenizer) depth first with the recogniser's
 * state, pruning a branch at the first byte no stack takes: a token is
 * allowed when its whole byte string is. Where almost everything is
 * allowed, the 248k vocabulary is answered from classes of whole tokens
 * computed with the trie (bitsets, word at a time): in a JSON string
 * between characters, the tokens that stay in it (escapes and characters
 * split across tokens included) with at most the room its maxLength
 * leaves, and the walk goes only where a token closes the string; in
 * free text up to a terminator starting with '<' or '\n', the tokens
 * without that byte, and the walk goes only where one has it. Deeper in
 * the walk, a subtree whose every rest stays in a string (or lacks the
 * terminator's first byte) is allowed at once. The mask of a state in a
 * string or such a text is kept and given back while the state stays the
 * same (it mostly does there). Special tokens are never allowed; the
 * model's stop ids are allowed exactly where the grammar may end.
 */
#ifndef HP_GMASK_H
#define HP_GMASK_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/contract/hp_error.h"
#include "engine/contract/hp_grammar.h"
#include "engine/tokenizer/tokenizer.h"

/* ---- the recogniser ---------------------------------------------------- */

/* a set of stacks: n, then per stack its length and (pos, aux) pairs,
 * bottom first */
typedef struct {
    uint32_t *w;
    uint32_t len, cap;
    int n;
} hp_gset_t;

typedef struct {
    const hp_grammar_t *g;
    hp_gset_t set;       /* the state */
    hp_gset_t tmp, tmp2; /* scratch for steps */
    uint32_t *st;        /* scratch stack [HP_GMATCH_DEPTH * 2] */
    int overflow;        /* stacks dropped for depth or count (see below) */
} hp_gmatch_t;

/* Limits of one state: a stack deeper, or a set larger, is dropped (the
 * text it would allow is a nesting or an ambiguity no schema here
 * needs); overflow counts them. */
#define HP_GMATCH_DEPTH  256
#define HP_GMATCH_STACKS 64

/* At the grammar's start. HP_OK or HP_ENOMEM. */
int hp_gmatch_init(hp_gmatch_t *m, const hp_grammar_t *g, hp_error_t *err);
void hp_gmatch_free(hp_gmatch_t *m);
/* A copy of src's state into m (initialised on the same grammar). */
int hp_gmatch_copy(hp_gmatch_t *m, const hp_gmatch_t *src);

/* Feeds bytes[n]: 1 taken, 0 refused (the state is unchanged). */
int hp_gmatch_feed(hp_gmatch_t *m, const void *bytes, size_t n);
/* The grammar may end here. */
int hp_gmatch_may_end(const hp_gmatch_t *m);
/* It may end here and nothing else may follow. */
int hp_gmatch_must_end(const hp_gmatch_t *m);

/* ---- the vocabulary ---------------------------------------------------- */

typedef struct hp_gmask_vocab hp_gmask_vocab_t;

/* The trie of tok's tokens 0..V-1 (V: the logits' width). stop[n_stop]:
 * the model's stop ids. HP_OK or HP_ENOMEM. */
int hp_gmask_vocab_build(hp_gmask_vocab_t **out, const hp_tokenizer_t *tok,
                         int V, const int *stop, int n_stop, hp_error_t *err);
void hp_gmask_vocab_free(hp_gmask_vocab_t *v);
int hp_gmask_vocab_size(const hp_gmask_vocab_t *v);

/* Scratch of the mask computations of one decoder (not shared; zeroed
 * to start). It holds the kept mask (see above) and its state, given back
 * as it is for the same state, grammar and vocabulary (by address: free
 * the scratch before those are freed and others allocated). */
typedef struct {
    hp_gset_t *lv; /* a state per trie depth */
    int n_lv;
    uint32_t *st;
    hp_gset_t last;      /* the last mask's state */
    uint32_t *last_bits; /* [last_nw] */
    size_t last_nw;
    int last_count;
    const void *last_g, *last_v; /* NULL: none kept */
} hp_gmask_scratch_t;

void hp_gmask_scratch_free(hp_gmask_scratch_t *s);

/*
 * The tokens allowed after m's text: bit i of bits[(V + 31) / 32] set
 * for token i. Returns how many, or -1 (no memory).
 */
int hp_gmask_compute(const hp_gmask_vocab_t *v, const hp_gmatch_t *m,
                     hp_gmask_scratch_t *s, uint32_t *bits);

/* logits[i] = -inf for every token i not in bits (V wide). */
void hp_gmask_apply(const uint32_t *bits, float *logits, int V);

/* ---- the cache --------------------------------------------------------- */

/* Compiled grammars by the hash of their request, least recently used
 * first out (only those no request holds). Thread-safe. */
typedef struct hp_gcache hp_gcache_t;

typedef struct {
    uint64_t hits, misses, evictions;
    int entries;
} hp_gcache_stats_t;

/* capacity: grammars kept (0: 32). The vocabulary is built on the first
 * hp_gcache_get, from tok, V and the stop ids. */
int hp_gcache_create(hp_gcache_t **out, int capacity, const hp_tokenizer_t *tok,
                     int V, const int *stop, int n_stop, hp_error_t *err);
void hp_gcache_free(hp_gcache_t *c);

/*
 * The grammar of spec[len] under opts (hp_grammar_compile), held until
 * hp_gcache_put: *g NULL when there is nothing to constrain. *vocab: the
 * cache's vocabulary. HP_OK, HP_EBADINPUT (err says why: the field, then
 * the problem) or HP_ENOMEM.
 */
int hp_gcache_get(hp_gcache_t *c, const char *spec, size_t len,
                  const hp_grammar_opts_t *opts, const hp_grammar_t **g,
                  const hp_gmask_vocab_t **vocab, hp_error_t *err);
/* One more holder of g (from hp_gcache_get). */
void hp_gcache_hold(hp_gcache_t *c, const hp_grammar_t *g);
void hp_gcache_put(hp_gcache_t *c, const hp_grammar_t *g);
void hp_gcache_stats(hp_gcache_t *c, hp_gcache_stats_t *st);

#endif
