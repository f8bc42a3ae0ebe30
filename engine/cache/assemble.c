/* assemble.c - the four prefill modes over the pools (assemble.h). */
#include "engine/cache/assemble.h"

#include <stdlib.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "engine/cache/segcache.h"

static const char *mode_names[] = {"full", "prefix", "naive", "pic"};

int hp_mode_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, mode_names[i]))
            return i;
    return -1;
}

const char *hp_mode_name(hp_ipc_mode_t m)
{
    return (unsigned)m < 4 ? mode_names[m] : "?";
}

/* A segment a mode caches: the lead (whole, STATE) and the PIC segments
 * (naive: whole, STATE; pic: interior tuple, only if it has an interior). */
int hp_assemble_cacheable(const hp_prompt_seg_t *s, hp_ipc_mode_t mode, int w)
{
    if (s->len == 0 || s->role == HP_SEG_QUERY)
        return 0;
    if (s->role == HP_SEG_LEAD || mode == HP_IPC_MODE_NAIVE)
        return 1;
    return s->len > 2 * w;
}

uint32_t hp_assemble_variant(const hp_prompt_seg_t *s, hp_ipc_mode_t mode,
                             int w)
{
    if (s->role == HP_SEG_LEAD)
        return HP_VAR_LEAD;
    return mode == HP_IPC_MODE_PIC ? HP_VAR_PIC(w) : HP_VAR_NAIVE;
}

size_t hp_assemble_entry_bytes(const hp_model_config_t *c,
                               const hp_prompt_seg_t *s, hp_ipc_mode_t mode,
                               int w)
{
    int pic = s->role != HP_SEG_LEAD && mode == HP_IPC_MODE_PIC;
    return hp_segc_bytes(c, pic ? HP_SEGC_PIC : HP_SEGC_STATE, s->len, w);
}

size_t hp_assemble_pool_bytes(const hp_model_config_t *c, const hp_prompt_t *p,
                              hp_ipc_mode_t mode, int w)
{
    size_t b = 0, a = HP_POOL_ALIGN;
    if (mode != HP_IPC_MODE_NAIVE && mode != HP_IPC_MODE_PIC)
        return 0;
    for (int i = 0; i < p->n_segs; i++)
        if (hp_assemble_cacheable(&p->segs[i], mode, w))
            b += (hp_assemble_entry_bytes(c, &p->segs[i], mode, w) + a - 1) /
                 a * a;
    return b;
}

/* The entry of segment s, from the pool or prefilled now and published.
 * The caller releases it. */
static hp_pool_entry_t *segment_entry(const hp_llm_t *llm, hp_cache_t *cache,
                                      hp_fwd_ws_t *ws, const hp_prompt_t *p,
                                      const hp_prompt_seg_t *s,
                                      hp_ipc_mode_t mode, int w,
                                      hp_assemble_stats_t *st, hp_error_t *err)
{
    const hp_model_t *m = &llm->model;
    int pic = s->role != HP_SEG_LEAD && mode == HP_IPC_MODE_PIC;
    uint32_t var = hp_assemble_variant(s, mode, w);
    hp_pool_entry_t *e = hp_pool_get(cache->pub, s->id, var);
    if (e) {
        st->hit_segments++;
        return e;
    }
    st->miss_segments++;
    st->miss_tokens += pic ? s->len - 2 * w : s->len;
    e = hp_pool_alloc(cache->pub, s->id, var,
                      hp_assemble_entry_bytes(&m->cfg, s, mode, w), err);
    if (!e)
        return NULL;
    int rc =
        pic ? hp_segc_build_pic(e, m, ws, p->ids + s->start, s->len, w, err)
            : hp_segc_build_state(e, m, ws, p->ids + s->start, s->len, err);
    if (rc != HP_OK) {
        hp_pool_release(cache->pub, e);
        return NULL;
    }
    hp_pool_publish(cache->pub, e);
    return e;
}

int hp_assemble_warm_next(const hp_llm_t *llm, hp_cache_t *cache,
                          hp_fwd_ws_t *ws, const hp_prompt_t *p,
                          hp_ipc_mode_t mode, int w, int *next,
                          hp_assemble_stats_t *st, hp_error_t *err)
{
    hp_assemble_stats_t local = {0};
    if (!st)
        st = &local;
    if (mode != HP_IPC_MODE_NAIVE && mode != HP_IPC_MODE_PIC)
        return 0;
    for (int i = *next; i < p->n_segs; i++) {
        const hp_prompt_seg_t *s = &p->segs[i];
        *next = i + 1;
        if (!hp_assemble_cacheable(s, mode, w) ||
            hp_pool_contains(cache->pub, s->id,
                             hp_assemble_variant(s, mode, w)))
            continue;
        hp_pool_entry_t *e =
            segment_entry(llm, cache, ws, p, s, mode, w, st, err);
        if (!e)
            return err->code ? err->code : HP_ENOMEM;
        hp_pool_release(cache->pub, e);
        return 1;
    }
    return 0;
}

int hp_assemble_warm(const hp_llm_t *llm, hp_cache_t *cache, hp_fwd_ws_t *ws,
                     const hp_prompt_t *p, hp_ipc_mode_t mode, int w,
                     hp_assemble_stats_t *st, hp_error_t *err)
{
    int rc, next = 0;
    while ((rc = hp_assemble_warm_next(llm, cache, ws, p, mode, w, &next, st,
                                       err)) == 1)
        ;
    return rc;
}

/* ---- the splice ---------------------------------------------------------- */

typedef struct {
    const hp_model_config_t *c;
    const hp_backend_t *be;
    hp_pool_entry_t **ent; /* [n_jumps] */
    int naive;
    hp_fwd_jump_mem_t jm;
} splice_t;

/* The ops read the entry where it lies (backend memory). */
void hp_assemble_compose(const hp_backend_t *be, const hp_model_config_t *c,
                         int l, float *S, float *conv, const hp_pool_entry_t *e,
                         int naive, const hp_fwd_jump_mem_t *jm)
{
    int Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    const float *S0 = hp_segc_S(c, e, l);
    if (naive) /* S <- S + S_C|0: drops T_C, the structural error */
        hp_backend_axpy(be, S, 1.0f, S0, c->state_floats);
    else /* S <- T_C S + S_C|0 (Eq. 6) */
        hp_backend_trans_compose(be, S, HK_TRANS_DENSE, hp_segc_T(c, e, l), S,
                                 S0, Hv, dk, dv, jm->scr);
    hp_segc_conv_jump(be, conv, hp_segc_conv(c, e, l), hp_segc_hdr(e)->n_int,
                      hp_cfg_conv_dim(c), c->conv_kernel);
}

static int splice_jump(void *ud, int l, int j, float *S, float *conv,
                       const float *Tc, hp_error_t *err)
{
    splice_t *sp = ud;
    (void)Tc;
    (void)err;
    hp_assemble_compose(sp->be, sp->c, l, S, conv, sp->ent[j], sp->naive,
                        &sp->jm);
    return HP_OK;
}

void hp_assemble_splice_kv(hp_seq_t *seq, const hp_pool_entry_t *e, int at,
                           int shift)
{
    const hp_model_config_t *c = &seq->model->cfg;
    const hp_segc_hdr_t *h = hp_segc_hdr(e);
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] != HP_LAYER_FULL)
            continue;
        hp_seq_kv_unpack(seq, l, at, h->n_int, hp_segc_K(c, e, l),
                         hp_segc_V(c, e, l), HP_MEM_BACKEND);
        if (shift)
            hp_backend_rope_shift(seq->be,
                                  seq->layers[l].k + (size_t)at * c->kv_row,
                                  shift, h->n_int, c->n_kv_heads, c->head_dim,
                                  c->rotary_dim, c->rope_theta);
    }
}

static int assemble_spliced(const hp_llm_t *llm, hp_cache_t *cache,
                            hp_fwd_ws_t *ws, const hp_prompt_t *p,
                            hp_ipc_mode_t mode, int w, hp_seq_t *seq,
                            float *logits, hp_assemble_stats_t *st,
                            hp_error_t *err)
{
    const hp_model_t *m = &llm->model;
    const hp_model_config_t *c = &m->cfg;
    int naive = mode == HP_IPC_MODE_NAIVE, rc = HP_OK, first = 0;
    int n_run = 0, n_jump = 0;
    int *ids = malloc((size_t)p->n * sizeof(int));
    int *pos = malloc((size_t)p->n * sizeof(int));
    int *after = malloc((size_t)(p->n_segs + 1) * sizeof(int));
    hp_pool_entry_t **ent = calloc((size_t)p->n_segs + 1, sizeof(*ent));
    hp_pool_entry_t *lead = NULL;
    splice_t sp = {c, m->be, ent, naive, hp_fwd_jump_mem(ws)};
    if (!ids || !pos || !after || !ent) {
        rc = hp_error_set(err, HP_ENOMEM, "assemble: out of memory");
        goto done;
    }
    if (c->n_lin > 0 && !sp.jm.s) {
        rc = hp_error_set(err, HP_EINTERNAL, "assemble: no workspace");
        goto done;
    }
    if ((rc = hp_seq_reserve(seq, p->n, err)) != HP_OK)
        goto done;

    /* the lead: a cached prefix at position 0 */
    if (p->n_segs > 0 && p->segs[0].role == HP_SEG_LEAD && p->segs[0].len > 0) {
        lead = segment_entry(llm, cache, ws, p, &p->segs[0], mode, w, st, err);
        if (!lead) {
            rc = err->code ? err->code : HP_ENOMEM;
            goto done;
        }
        if ((rc = hp_segc_load_state(seq, lead, err)) != HP_OK)
            goto done;
        if ((rc = hp_seq_reserve(seq, p->n, err)) != HP_OK)
            goto done;
        st->cached_tokens += p->segs[0].len;
        first = 1;
    }

    /* the plan: recomputed tokens in order, a jump over each interior */
    for (int i = first; i < p->n_segs; i++) {
        const hp_prompt_seg_t *s = &p->segs[i];
        int g = s->start, cut = naive ? 0 : w;
        if (!hp_assemble_cacheable(s, mode, w)) {
            for (int t = 0; t < s->len; t++, n_run++) {
                ids[n_run] = p->ids[g + t];
                pos[n_run] = g + t;
            }
            continue;
        }
        for (int t = 0; t < cut; t++, n_run++) { /* head seam */
            ids[n_run] = p->ids[g + t];
            pos[n_run] = g + t;
        }
        ent[n_jump] = segment_entry(llm, cache, ws, p, s, mode, w, st, err);
        if (!ent[n_jump]) {
            rc = err->code ? err->code : HP_ENOMEM;
            goto done;
        }
        hp_assemble_splice_kv(seq, ent[n_jump], g + cut, g);
        st->cached_tokens += s->len - 2 * cut;
        after[n_jump++] = n_run;
        for (int t = s->len - cut; t < s->len; t++, n_run++) { /* tail */
            ids[n_run] = p->ids[g + t];
            pos[n_run] = g + t;
        }
    }

    st->recomputed_tokens = n_run;
    hp_jumps_t jumps = {after, n_jump, -1, splice_jump, &sp};
    if (n_run > 0) {
        rc = hp_forward(m, seq, ws, ids, pos, n_run, &jumps,
                        logits ? HP_LOGITS_LAST : HP_LOGITS_NONE, logits, err);
    } else { /* everything cached: only the compositions remain */
        for (int l = 0; l < c->n_layers && rc == HP_OK; l++)
            for (int j = 0; j < n_jump && rc == HP_OK; j++)
                if (c->layer_kind[l] == HP_LAYER_LINEAR)
                    rc = splice_jump(&sp, l, j, seq->layers[l].S,
                                     seq->layers[l].conv, NULL, err);
    }
    if (rc == HP_OK)
        seq->n_pos = p->n;

done:
    for (int j = 0; j < n_jump; j++)
        hp_pool_release(cache->pub, ent[j]);
    if (lead)
        hp_pool_release(cache->pub, lead);
    free(ent);
    free(after);
    free(pos);
    free(ids);
    return rc;
}

/* ---- prefix mode --------------------------------------------------------- */

/* The prefix cache resumes from its deepest checkpoint on the prompt's
 * path and recomputes the rest exactly. The lead's end (the system
 * prompt, shared by most requests) is checkpointed on first use, as
 * branch points are. There is no decode hook here, so the prompt's last
 * token stands for the last decoded one: a next turn that extends the
 * prompt resumes at its end. A caller that decodes can use
 * hp_prefix_cache_prefill / _finish with the output instead. */
static int assemble_prefix(const hp_llm_t *llm, hp_cache_t *cache,
                           hp_fwd_ws_t *ws, const hp_prompt_t *p, hp_seq_t *seq,
                           float *logits, hp_assemble_stats_t *st,
                           hp_error_t *err)
{
    hp_prefix_cache_req_t req;
    hp_error_t ferr = {0};
    if (!cache->prefix)
        return hp_error_set(err, HP_EBADINPUT,
                            "prefix mode needs a prefix cache");
    int lead =
        p->n_segs > 1 && p->segs[0].role == HP_SEG_LEAD ? p->segs[0].len : -1;
    int rc = hp_prefix_cache_prefill(cache->prefix, &llm->model, ws, p->ids,
                                     p->n, lead, seq, logits, &req, err);
    if (rc != HP_OK)
        return rc;
    st->cached_tokens = req.resume;
    st->recomputed_tokens = p->n - req.resume;
    for (int i = 0; i < p->n_segs; i++)
        if (p->segs[i].start + p->segs[i].len <= req.resume)
            st->hit_segments++;
    /* a full cache costs reuse only */
    hp_prefix_cache_finish(cache->prefix, &req, NULL, 0, seq, &ferr);
    return HP_OK;
}

int hp_assemble(const hp_llm_t *llm, hp_cache_t *cache, hp_fwd_ws_t *ws,
                const hp_prompt_t *p, hp_ipc_mode_t mode, int w, hp_seq_t *seq,
                float *logits, hp_assemble_stats_t *st, hp_error_t *err)
{
    hp_assemble_stats_t local;
    if (!st)
        st = &local;
    memset(st, 0, sizeof(*st));
    st->prompt_tokens = p->n;
    if (w < 0)
        return hp_error_set(err, HP_EBADINPUT, "seam width %d < 0", w);
    if (w < llm->model.cfg.conv_kernel - 1 && mode == HP_IPC_MODE_PIC && w != 0)
        return hp_error_set(err, HP_EBADINPUT,
                            "seam width %d is below conv kernel - 1 (%d); "
                            "use 0 for the naive-splice ablation",
                            w, llm->model.cfg.conv_kernel - 1);
    switch (mode) {
    case HP_IPC_MODE_FULL:
        st->recomputed_tokens = p->n;
        return hp_prefill(&llm->model, seq, ws, p->ids, p->n, 0, logits, err);
    case HP_IPC_MODE_PREFIX:
        return assemble_prefix(llm, cache, ws, p, seq, logits, st, err);
    case HP_IPC_MODE_NAIVE:
    case HP_IPC_MODE_PIC: {
        int rc =
            assemble_spliced(llm, cache, ws, p, mode, w, seq, logits, st, err);
        st->cached_tokens -= st->miss_tokens; /* computed now, not reused */
        return rc;
    }
    }
    return hp_error_set(err, HP_EBADINPUT, "unknown mode %d", (int)mode);
}
