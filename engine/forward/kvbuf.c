/*
 * kvbuf.c - the KVBuffer block pool and per-request buffers (kvbuf.h);
 * the math is the backend's kvbuf ops (kernels/cpu/hk_kvbuf.c on the CPU).
 *
 * Invariants between calls: with no drafts pending, 0 <= len < threshold
 * (a buffer flushes when it reaches it); a call appends at most max_step
 * entries, so len never exceeds lmax = max(cap, cap_kvonly) - 1 +
 * max_step, which max_blocks covers; blocks[0 .. n_blocks) belong to the
 * buffer and to nobody else (kept across flushes, freed at close).
 * Every call that can fail takes what it needs from the free lists first
 * and puts it back on failure, so a refused call changes nothing.
 */
#include "engine/forward/kvbuf.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* ---- traffic model ------------------------------------------------------- */

static double entry_bytes(int Hk, int Hv, int dk, int dv)
{
    return (double)Hk * dk * 4.0 + (double)Hv * (dv * 4.0 + 8.0);
}

double hp_kvbuf_bytes_recurrent(int Hk, int Hv, int dk, int dv)
{
    (void)Hk;
    return (double)Hv * 2.0 * dk * dv * 4.0;
}

double hp_kvbuf_bytes_chunkwise(int Hk, int Hv, int dk, int dv, int B)
{
    double S = (double)Hv * dk * dv * 4.0, e = entry_bytes(Hk, Hv, dk, dv);
    return S * (1.0 + 2.0 / B) + e * (B + 3) / 2.0;
}

double hp_kvbuf_bytes_kvonly(int Hk, int Hv, int dk, int dv, int t)
{
    return entry_bytes(Hk, Hv, dk, dv) * (t + 1);
}

void hp_kvbuf_config_default(hp_kvbuf_config_t *c, int Hk, int Hv, int dk,
                             int dv)
{
    memset(c, 0, sizeof(*c));
    c->Hk = Hk, c->Hv = Hv, c->dk = dk, c->dv = dv;
    int best = 1;
    for (int B = 2; B <= 1024; B++)
        if (hp_kvbuf_bytes_chunkwise(Hk, Hv, dk, dv, B) <
            hp_kvbuf_bytes_chunkwise(Hk, Hv, dk, dv, best))
            best = B;
    c->cap = best;
    double avg = hp_kvbuf_bytes_chunkwise(Hk, Hv, dk, dv, best);
    int t = 1;
    while (hp_kvbuf_bytes_kvonly(Hk, Hv, dk, dv, t + 1) <= avg)
        t++;
    c->cap_kvonly = t;
    c->block_tokens = 16;
    c->max_step = 16;
    c->max_batch = 256;
}

static int cfg_lmax(const hp_kvbuf_config_t *c)
{
    int cap = c->cap > c->cap_kvonly ? c->cap : c->cap_kvonly;
    return cap - 1 + c->max_step;
}

static int cfg_threads(const hp_kvbuf_config_t *c)
{
    return c->n_threads > 0 ? c->n_threads : omp_get_max_threads();
}

static const hp_backend_t *cfg_be(const hp_kvbuf_config_t *c)
{
    return c->be ? c->be : hp_backend_cpu();
}

static size_t scratch_floats(const hp_kvbuf_config_t *c,
                             const hk_kvbuf_geom_t *g)
{
    return hp_backend_kvbuf_scratch(cfg_be(c), g, c->max_step, cfg_lmax(c),
                                    cfg_threads(c));
}

static hk_kvbuf_geom_t cfg_geom(const hp_kvbuf_config_t *c)
{
    return (hk_kvbuf_geom_t){c->Hk, c->Hv, c->dk, c->dv, c->block_tokens};
}

size_t hp_kvbuf_pool_bytes(const hp_kvbuf_config_t *c)
{
    hk_kvbuf_geom_t g = cfg_geom(c);
    return sizeof(float) *
           ((size_t)c->n_blocks * hp_backend_kvbuf_block_floats(cfg_be(c), &g) +
            (size_t)c->n_states * c->Hv * c->dk * c->dv +
            scratch_floats(c, &g));
}

/* ---- pool ---------------------------------------------------------------- */

int hp_kvbuf_pool_init(hp_kvbuf_pool_t *p, const hp_kvbuf_config_t *c,
                       hp_error_t *err)
{
    memset(p, 0, sizeof(*p));
    if (c->Hk <= 0 || c->Hv <= 0 || c->Hv % c->Hk || c->dk <= 0 || c->dv <= 0 ||
        c->block_tokens <= 0 || c->cap < 1 || c->cap_kvonly < 1 ||
        c->max_step < 1 || c->max_batch < 1 || c->n_blocks < 1 ||
        c->n_states < 0 || c->n_threads < 0)
        return hp_error_set(err, HP_EBADINPUT, "kvbuf: bad pool configuration");
    p->cfg = *c;
    p->be = cfg_be(c);
    p->geom = cfg_geom(c);
    p->block_floats = hp_backend_kvbuf_block_floats(p->be, &p->geom);
    p->state_floats = (size_t)c->Hv * c->dk * c->dv;
    p->lmax = cfg_lmax(c);
    p->max_blocks = (p->lmax + c->block_tokens - 1) / c->block_tokens;
    p->nth = cfg_threads(c);

    p->arena = hp_backend_alloc(p->be, (size_t)c->n_blocks * p->block_floats *
                                           sizeof(float));
    p->free_blk = malloc((size_t)c->n_blocks * sizeof(int));
    p->states = hp_backend_alloc(p->be, (size_t)c->n_states * p->state_floats *
                                            sizeof(float));
    p->free_st = malloc(((size_t)c->n_states + 1) * sizeof(int));
    p->scratch =
        hp_backend_alloc(p->be, scratch_floats(c, &p->geom) * sizeof(float));
    p->views = malloc((size_t)c->max_batch * sizeof(*p->views));
    p->nfold = malloc((size_t)c->max_batch * sizeof(int));
    p->undo_nb = malloc((size_t)c->max_batch * sizeof(int));
    p->undo_slot = malloc((size_t)c->max_batch * sizeof(int));
    if (!p->arena || !p->free_blk || !p->states || !p->free_st || !p->scratch ||
        !p->views || !p->nfold || !p->undo_nb || !p->undo_slot) {
        hp_kvbuf_pool_free(p);
        return hp_error_set(err, HP_ENOMEM,
                            "kvbuf: cannot allocate a pool of %d blocks",
                            c->n_blocks);
    }
    /* Unused key slots of a block take part in the kernels' vector
     * lanes: zeros, never NaNs or denormals. */
    hp_backend_memset0(p->be, p->arena,
                       (size_t)c->n_blocks * p->block_floats * sizeof(float));
    /* Stacks popped from the top: block 0 is handed out first. */
    for (int i = 0; i < c->n_blocks; i++)
        p->free_blk[i] = c->n_blocks - 1 - i;
    p->n_free_blk = c->n_blocks;
    for (int i = 0; i < c->n_states; i++)
        p->free_st[i] = c->n_states - 1 - i;
    p->n_free_st = c->n_states;
    return HP_OK;
}

void hp_kvbuf_pool_free(hp_kvbuf_pool_t *p)
{
    if (p->be) {
        hp_backend_free(p->be, p->arena);
        hp_backend_free(p->be, p->states);
        hp_backend_free(p->be, p->scratch);
    }
    free(p->free_blk);
    free(p->free_st);
    free(p->views);
    free(p->nfold);
    free(p->undo_nb);
    free(p->undo_slot);
    memset(p, 0, sizeof(*p));
}

/* ---- buffers ------------------------------------------------------------- */

int hp_kvbuf_open(hp_kvbuf_pool_t *p, hp_kvbuf_t *b, float *S, float *store,
                  hp_error_t *err)
{
    memset(b, 0, sizeof(*b));
    b->blocks = malloc((size_t)p->max_blocks * sizeof(int));
    if (!b->blocks)
        return hp_error_set(err, HP_ENOMEM, "kvbuf: out of memory");
    b->S = S;
    b->store = S ? NULL : store;
    b->slot = -1;
    return HP_OK;
}

void hp_kvbuf_close(hp_kvbuf_pool_t *p, hp_kvbuf_t *b)
{
    /* Freed blocks go back in reverse, so a buffer's first block is the
     * next one handed out (warm in cache). */
    for (int i = b->n_blocks - 1; i >= 0; i--)
        p->free_blk[p->n_free_blk++] = b->blocks[i];
    if (b->slot >= 0)
        p->free_st[p->n_free_st++] = b->slot;
    free(b->blocks);
    memset(b, 0, sizeof(*b));
    b->slot = -1;
}

static float *slot_ptr(const hp_kvbuf_pool_t *p, int slot)
{
    return p->states + (size_t)slot * p->state_floats;
}

/* Takes blocks until b holds room for `entries`, and a state slot when the
 * state-less buffer may have to create its state (entries reach
 * cap_kvonly) and has no storage. Returns 0, or -1 with whatever it took
 * still attached (the caller undoes it). */
static int grow(hp_kvbuf_pool_t *p, hp_kvbuf_t *b, int entries)
{
    int need = (entries + p->cfg.block_tokens - 1) / p->cfg.block_tokens;
    if (need > p->max_blocks)
        return -1;
    while (b->n_blocks < need) {
        if (p->n_free_blk == 0)
            return -1;
        b->blocks[b->n_blocks++] = p->free_blk[--p->n_free_blk];
    }
    if (!b->S && !b->store && entries >= p->cfg.cap_kvonly) {
        if (p->n_free_st == 0)
            return -1;
        b->slot = p->free_st[--p->n_free_st];
        b->store = slot_ptr(p, b->slot);
    }
    return 0;
}

/* Puts back what grow() took from b since (n_blocks, slot) were saved. */
static void ungrow(hp_kvbuf_pool_t *p, hp_kvbuf_t *b, int n_blocks, int slot)
{
    while (b->n_blocks > n_blocks)
        p->free_blk[p->n_free_blk++] = b->blocks[--b->n_blocks];
    if (slot < 0 && b->slot >= 0 && !b->S) {
        p->free_st[p->n_free_st++] = b->slot;
        b->slot = -1;
        b->store = NULL;
    }
}

/* grow() for n buffers, all or nothing. */
static int grow_all(hp_kvbuf_pool_t *p, hp_kvbuf_t *const *bufs, int n, int T,
                    hp_error_t *err)
{
    for (int r = 0; r < n; r++) {
        p->undo_nb[r] = bufs[r]->n_blocks;
        p->undo_slot[r] = bufs[r]->slot;
        if (grow(p, bufs[r], bufs[r]->len + T) != 0) {
            for (int i = r; i >= 0; i--)
                ungrow(p, bufs[i], p->undo_nb[i], p->undo_slot[i]);
            return hp_error_set(err, HP_EBUSY,
                                "kvbuf: pool exhausted (%d of %d blocks "
                                "free, %d state slots free)",
                                p->n_free_blk, p->cfg.n_blocks, p->n_free_st);
        }
    }
    return HP_OK;
}

static int check_calls(const hp_kvbuf_pool_t *p, hp_kvbuf_t *const *bufs, int R,
                       int T, hp_error_t *err)
{
    if (R < 0 || R > p->cfg.max_batch || T < 1 || T > p->cfg.max_step)
        return hp_error_set(err, HP_EBADINPUT,
                            "kvbuf: batch %d x %d tokens over the pool's "
                            "limits (%d x %d)",
                            R, T, p->cfg.max_batch, p->cfg.max_step);
    for (int r = 0; r < R; r++)
        if (bufs[r]->pending)
            return hp_error_set(err, HP_EBADINPUT,
                                "kvbuf: request %d has unresolved drafts", r);
    return HP_OK;
}

int hp_kvbuf_reserve(hp_kvbuf_pool_t *p, hp_kvbuf_t *const *bufs, int n, int T,
                     hp_error_t *err)
{
    int rc = check_calls(p, bufs, n, T, err);
    return rc != HP_OK ? rc : grow_all(p, bufs, n, T, err);
}

/* Flushes every buffer of bufs[0..n) whose len reached its threshold
 * (force: every non-empty one), creating states where needed. The
 * storage was secured by grow(). */
static int flush_full(hp_kvbuf_pool_t *p, hp_kvbuf_t *const *bufs, int n,
                      int force, hp_error_t *err)
{
    int any = 0;
    for (int r = 0; r < n; r++) {
        hp_kvbuf_t *b = bufs[r];
        int full = b->len > 0 && (force || b->len >= hp_kvbuf_threshold(p, b));
        p->nfold[r] = 0;
        if (!full)
            continue;
        if (!b->S) {
            if (!b->store)
                return hp_error_set(err, HP_EINTERNAL,
                                    "kvbuf: no storage for a new state");
            b->S = b->store;
            b->store = NULL;
            hp_backend_memset0(p->be, b->S, p->state_floats * sizeof(float));
        }
        p->views[r] = (hk_kvbuf_view_t){b->S, b->blocks, b->len};
        p->nfold[r] = b->len;
        any = 1;
    }
    if (!any)
        return HP_OK;
    hp_backend_kvbuf_flush(p->be, p->arena, p->views, p->nfold, n, &p->geom,
                           p->scratch, p->nth);
    for (int r = 0; r < n; r++)
        if (p->nfold[r])
            bufs[r]->len = 0;
    return HP_OK;
}

/* Appends T tokens to each buffer (room secured) and computes outputs. */
static void run_step(hp_kvbuf_pool_t *p, hp_kvbuf_t *const *bufs, int R, int T,
                     float *o, const float *q, const float *k, const float *v,
                     const float *g, const float *beta)
{
    for (int r = 0; r < R; r++)
        p->views[r] =
            (hk_kvbuf_view_t){bufs[r]->S, bufs[r]->blocks, bufs[r]->len};
    hp_backend_kvbuf_step(p->be, o, p->arena, p->views, q, k, v, g, beta, R, T,
                          &p->geom, p->lmax, p->scratch, p->nth);
}

int hp_kvbuf_decode(hp_kvbuf_pool_t *p, hp_kvbuf_t *const *bufs, int R,
                    float *o, const float *q, const float *k, const float *v,
                    const float *g, const float *beta, hp_error_t *err)
{
    int rc = hp_kvbuf_reserve(p, bufs, R, 1, err);
    if (rc != HP_OK)
        return rc;
    run_step(p, bufs, R, 1, o, q, k, v, g, beta);
    for (int r = 0; r < R; r++)
        bufs[r]->len++;
    return flush_full(p, bufs, R, 0, err);
}

int hp_kvbuf_verify(hp_kvbuf_pool_t *p, hp_kvbuf_t *const *bufs, int R, int T,
                    float *o, const float *q, const float *k, const float *v,
                    const float *g, const float *beta, hp_error_t *err)
{
    int rc = hp_kvbuf_reserve(p, bufs, R, T, err);
    if (rc != HP_OK)
        return rc;
    run_step(p, bufs, R, T, o, q, k, v, g, beta);
    for (int r = 0; r < R; r++) {
        bufs[r]->len += T;
        bufs[r]->pending = T;
    }
    return HP_OK;
}

int hp_kvbuf_truncate(hp_kvbuf_pool_t *p, hp_kvbuf_t *b, int keep,
                      hp_error_t *err)
{
    if (keep < 0 || keep > b->pending)
        return hp_error_set(err, HP_EBADINPUT,
                            "kvbuf: keep %d of %d pending entries", keep,
                            b->pending);
    b->len -= b->pending - keep;
    b->pending = 0;
    int rc = flush_full(p, &b, 1, 0, err);
    /* A slot taken for a flush that did not happen goes back. */
    if (rc == HP_OK && !b->S && b->slot >= 0) {
        p->free_st[p->n_free_st++] = b->slot;
        b->slot = -1;
        b->store = NULL;
    }
    return rc;
}

int hp_kvbuf_prefill(hp_kvbuf_pool_t *p, hp_kvbuf_t *b, int T, float *o,
                     const float *q, const float *k, const float *v,
                     const float *g, const float *beta, hp_error_t *err)
{
    const hk_kvbuf_geom_t *G = &p->geom;
    for (int t0 = 0; t0 < T; t0 += p->cfg.max_step) {
        int n = T - t0 < p->cfg.max_step ? T - t0 : p->cfg.max_step;
        int rc = hp_kvbuf_verify(
            p, &b, 1, n, o + (size_t)t0 * G->Hv * G->dv,
            q + (size_t)t0 * G->Hk * G->dk, k + (size_t)t0 * G->Hk * G->dk,
            v + (size_t)t0 * G->Hv * G->dv, g + (size_t)t0 * G->Hv,
            beta + (size_t)t0 * G->Hv, err);
        if (rc == HP_OK)
            rc = hp_kvbuf_truncate(p, b, n, err);
        if (rc != HP_OK)
            return rc;
    }
    return HP_OK;
}

int hp_kvbuf_state(hp_kvbuf_pool_t *p, const hp_kvbuf_t *b, float *dst,
                   hp_error_t *err)
{
    (void)err;
    if (b->S)
        hp_backend_copy(p->be, dst, b->S, p->state_floats * sizeof(float));
    else
        hp_backend_memset0(p->be, dst, p->state_floats * sizeof(float));
    int n = b->len - b->pending;
    if (n == 0)
        return HP_OK;
    p->views[0] = (hk_kvbuf_view_t){dst, b->blocks, n};
    hp_backend_kvbuf_flush(p->be, p->arena, p->views, &n, 1, &p->geom,
                           p->scratch, p->nth);
    return HP_OK;
}

int hp_kvbuf_fold(hp_kvbuf_pool_t *p, hp_kvbuf_t *b, hp_error_t *err)
{
    if (b->pending)
        return hp_error_set(err, HP_EBADINPUT,
                            "kvbuf: fold with unresolved drafts");
    if (!b->S && !b->store) {
        if (p->n_free_st == 0)
            return hp_error_set(err, HP_EBUSY, "kvbuf: no free state slot");
        b->slot = p->free_st[--p->n_free_st];
        b->store = slot_ptr(p, b->slot);
    }
    if (b->len == 0) {
        /* an empty KV-only buffer: its state is zero, and from now on it
         * is a state the caller may update in place (the prefill path) */
        if (!b->S) {
            hp_backend_memset0(p->be, b->store,
                               p->state_floats * sizeof(float));
            b->S = b->store;
            b->store = NULL;
        }
        return HP_OK;
    }
    return flush_full(p, &b, 1, 1, err);
}
