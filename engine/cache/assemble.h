/*
 * assemble.h - prefill of a segmented prompt in one of the four modes
 * (DESIGN §4), reusing what the pools hold:
 *
 *   full    no reuse: prefill every token.
 *   prefix  exact: resume from the prefix cache's deepest checkpoint at
 *           or before where the prompt leaves its radix tree (hybrid
 *           Marconi admission and eviction, prefix_cache.h), prefill the
 *           rest; the prompt's end is checkpointed for the next turn.
 *   naive   the strawman: each PIC segment's zero-start state over the
 *           whole segment added to the running state (no T_C), its K/V
 *           spliced (re-rotated), no seam; only the query is recomputed.
 *   pic     HYPIC: compose S <- T_C S + S_C|0 over each interior, splice
 *           re-rotated interior K/V, recompute the seam windows (last w of
 *           C_i ++ first w of C_i+1) and the query in one prefill.
 *
 * The leading segment is cached in full as a prefix at position 0 (naive
 * and pic). Missing segments are prefilled on their own and published
 * (the cold path); a warm-up request does the same without a query.
 */
#ifndef HP_ASSEMBLE_H
#define HP_ASSEMBLE_H

#include "engine/cache/pool.h"
#include "engine/cache/prefix_cache.h"
#include "engine/cache/prompt.h"
#include "engine/contract/hp_ipc.h" /* the modes: hp_ipc_mode_t */
#include "engine/forward/forward.h"
#include "engine/forward/seq.h"
#include "engine/model/llm.h"

#define HP_SEAM_DEFAULT 8

/* The public pool's variants: one segment id holds one entry per use.
 * Low byte: the kind; PIC entries carry their seam width above it. */
#define HP_VAR_LEAD    1u /* the leading segment, a prefix STATE entry */
#define HP_VAR_NAIVE   2u /* a whole-segment STATE entry */
#define HP_VAR_PIC(w)  (3u | ((uint32_t)(w) << 8))
#define HP_VAR_KIND(v) ((v)&0xffu)
#define HP_VAR_SEAM(v) ((int)((v) >> 8))

/* Whether `mode` at seam w caches segment s (lead and PIC segments; a
 * PIC segment needs an interior), and the variant it is cached under. */
int hp_assemble_cacheable(const hp_prompt_seg_t *s, hp_ipc_mode_t mode, int w);
uint32_t hp_assemble_variant(const hp_prompt_seg_t *s, hp_ipc_mode_t mode,
                             int w);

/* Bytes of segment s's entry in mode at seam w (a cacheable segment), and
 * the public-pool bytes all of p's cacheable segments take (the arena a
 * one-shot run on a device sizes to its prompt). */
size_t hp_assemble_entry_bytes(const hp_model_config_t *c,
                               const hp_prompt_seg_t *s, hp_ipc_mode_t mode,
                               int w);
size_t hp_assemble_pool_bytes(const hp_model_config_t *c, const hp_prompt_t *p,
                              hp_ipc_mode_t mode, int w);

/* "full" etc. to the enum; -1 if unknown. */
int hp_mode_parse(const char *s);
const char *hp_mode_name(hp_ipc_mode_t m);

typedef struct {
    hp_pool_t *pub;            /* segment tuples, keyed by segment id */
    hp_prefix_cache_t *prefix; /* `prefix` mode: radix tree, checkpoints */
} hp_cache_t;

typedef struct {
    int prompt_tokens;
    int cached_tokens;     /* tokens whose prefill a cache hit skipped */
    int recomputed_tokens; /* tokens run in the (final) prefill */
    int hit_segments;      /* cacheable segments found in a pool */
    int miss_segments;     /* cacheable segments prefilled now */
    int miss_tokens;       /* tokens those misses cover in the cache */
} hp_assemble_stats_t;

/*
 * Prefills prompt p into seq (fresh, from hp_seq_init) in `mode` with seam
 * width w, and writes the last token's logits (if logits != NULL; a prompt
 * whose every token is cached in naive mode has none: then *logits is left
 * and HP_OK returned with stats->recomputed_tokens == 0).
 * Errors: HP_EBADINPUT (seam < 0; prefix mode without cache->prefix),
 * HP_ENOMEM (pools full of entries in use), forward errors.
 */
int hp_assemble(const hp_llm_t *llm, hp_cache_t *cache, hp_fwd_ws_t *ws,
                const hp_prompt_t *p, hp_ipc_mode_t mode, int w, hp_seq_t *seq,
                float *logits, hp_assemble_stats_t *stats, hp_error_t *err);

/* Makes sure every cacheable segment of p is in the public pool for
 * `mode` (naive or pic) at seam w, prefilling each on its own: the warm
 * pass of the one-shot commands and of warm-up requests. */
int hp_assemble_warm(const hp_llm_t *llm, hp_cache_t *cache, hp_fwd_ws_t *ws,
                     const hp_prompt_t *p, hp_ipc_mode_t mode, int w,
                     hp_assemble_stats_t *stats, hp_error_t *err);

/* One unit of the warm pass, for a scheduler that interleaves work:
 * prefills the first cacheable segment of p from *next on that is missing
 * from the public pool, moves *next past it and returns 1, or returns 0
 * when none is left (negative: an error). *next starts at 0. The cursor
 * makes the pass end: a pool too small for every segment evicts one
 * segment to hold the next, and "the first one missing" would never run
 * out (hp_assemble then builds what was evicted, or fails with
 * HP_ENOMEM). */
int hp_assemble_warm_next(const hp_llm_t *llm, hp_cache_t *cache,
                          hp_fwd_ws_t *ws, const hp_prompt_t *p,
                          hp_ipc_mode_t mode, int w, int *next,
                          hp_assemble_stats_t *stats, hp_error_t *err);

/*
 * The two halves of the splice, one cached PIC (or naive) entry e of the
 * public pool at a time; hp_assemble runs them, and the benches time them
 * on their own (bench/gpu_engine.c: the per-segment fixed costs). Both
 * read the entry where it lies, in backend memory.
 *
 * compose: linear layer l's state S and conv history jump over the
 *   entry's interior: S <- T_C S + S_C|0 (naive: S + S_C|0), the conv
 *   history becomes the entry's tail. jm: the workspace's jump buffers
 *   (hp_fwd_jump_mem; the composition's scratch).
 * splice_kv: every full layer's interior K/V rows copied to positions
 *   [at, at + n_int) of seq (reserved), K re-rotated from segment-local
 *   positions by shift (K_b = R(b - a) K_a).
 */
void hp_assemble_compose(const hp_backend_t *be, const hp_model_config_t *c,
                         int l, float *S, float *conv, const hp_pool_entry_t *e,
                         int naive, const hp_fwd_jump_mem_t *jm);
void hp_assemble_splice_kv(hp_seq_t *seq, const hp_pool_entry_t *e, int at,
                           int shift);

#endif
