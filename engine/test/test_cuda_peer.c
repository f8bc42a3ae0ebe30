/*
 * test_cuda_peer.c - the peer transport between engines whose public
 * pools live in device memory: a device node serves its entries (through
 * the host), fetches into its pool (up to the device), prefills a segment
 * for a peer on its one builder (taken at start), and does all of it
 * without allocating device memory after its start; a CPU node and a
 * device node exchange entries both ways, byte for byte. Runs on a GPU or
 * the host emulator (kernels/cuda/emu/run.sh with HK_EMU_ENGINE); SKIPs
 * where "cuda" cannot be opened.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/cache/assemble.h"
#include "engine/cache/segcache.h"
#include "engine/cluster/peer.h"
#include "engine/test/test_util.h"

#define W          3
#define SEP        "<|pic_sep|>"
#define TIMEOUT_MS 120000 /* the emulator runs a build in seconds */
#define MAX_SEG    64     /* positions of the device node's PREFILL builder */

static const char *PROMPT =
    "Lead." SEP "The capital of Zorvia is Quellam, by the sea." SEP
    "Water boils at one hundred degrees at sea level." SEP "Capital?";

typedef struct {
    const hp_llm_t *llm;
    hp_cache_t cache;
    hp_peer_server_t *srv;
    char addr[64];
} node_t;

static int node_start(node_t *nd, const hp_llm_t *llm)
{
    hp_error_t err = {0};
    memset(nd, 0, sizeof(*nd));
    nd->llm = llm;
    nd->cache.pub = hp_segc_pool_create(llm->model.be, 16u << 20, &err);
    hp_peer_server_cfg_t cfg = {.listen = "127.0.0.1:0",
                                .pub = nd->cache.pub,
                                .llm = llm,
                                .max_segment = MAX_SEG};
    nd->srv = nd->cache.pub ? hp_peer_server_start(&cfg, &err) : NULL;
    if (!nd->srv) {
        tap_diag("node on %s: %s", hp_backend_name(llm->model.be), err.msg);
        return 0;
    }
    snprintf(nd->addr, sizeof(nd->addr), "127.0.0.1:%d",
             hp_peer_server_port(nd->srv));
    return 1;
}

static void node_stop(node_t *nd)
{
    hp_peer_server_stop(nd->srv);
    hp_pool_destroy(nd->cache.pub);
}

/* Entry (key, variant) of nd's pool, header and data, in host memory
 * (NULL if absent). */
static uint8_t *entry_bytes(node_t *nd, const uint8_t key[16], uint32_t var,
                            size_t *n)
{
    hp_pool_entry_t *e = hp_pool_get(nd->cache.pub, key, var);
    if (!e)
        return NULL;
    size_t hb = sizeof(hp_segc_hdr_t);
    uint8_t *b = malloc(e->bytes);
    memcpy(b, e->meta, hb);
    hp_backend_get(nd->llm->model.be, b + hb, HP_MEM_HOST,
                   (const uint8_t *)e->data + hb, e->bytes - hb);
    *n = e->bytes;
    hp_pool_release(nd->cache.pub, e);
    return b;
}

/* Whether x and y hold the same bytes for every cacheable segment of p. */
static int same_entries(node_t *x, node_t *y, const hp_prompt_t *p)
{
    int same = 1;
    for (int i = 0; i < p->n_segs; i++) {
        const hp_prompt_seg_t *s = &p->segs[i];
        if (!hp_assemble_cacheable(s, HP_IPC_MODE_PIC, W))
            continue;
        uint32_t var = hp_assemble_variant(s, HP_IPC_MODE_PIC, W);
        size_t na = 0, nb = 0;
        uint8_t *a = entry_bytes(x, s->id, var, &na),
                *b = entry_bytes(y, s->id, var, &nb);
        same &= a && b && na == nb && !memcmp(a, b, na);
        free(a);
        free(b);
    }
    return same;
}

/* Fetches every cacheable segment of p from `from` into `to`; the count. */
static int fetch_all(node_t *to, const node_t *from, const hp_prompt_t *p)
{
    int got = 0, want = 0;
    for (int i = 0; i < p->n_segs; i++) {
        const hp_prompt_seg_t *s = &p->segs[i];
        hp_error_t err = {0};
        if (!hp_assemble_cacheable(s, HP_IPC_MODE_PIC, W))
            continue;
        want++;
        int rc = hp_peer_fetch(
            from->addr, s->id, hp_assemble_variant(s, HP_IPC_MODE_PIC, W),
            to->cache.pub, &to->llm->model, TIMEOUT_MS, NULL, &err);
        if (rc == HP_OK)
            got++;
        else
            tap_diag("fetch segment %d: %s", i, err.msg);
    }
    return got == want ? got : -1;
}

/* The warm pic prefill of p on nd (every segment a hit): its logits. */
static float *assemble(node_t *nd, hp_fwd_ws_t *ws, const hp_prompt_t *p,
                       hp_assemble_stats_t *st, int *rc)
{
    const hp_llm_t *llm = nd->llm;
    hp_error_t err = {0};
    hp_seq_t seq;
    float *lg = malloc((size_t)llm->model.cfg.vocab_size * sizeof(float));
    *rc = hp_seq_init(&seq, &llm->model, &err);
    if (*rc == HP_OK)
        *rc = hp_assemble(llm, &nd->cache, ws, p, HP_IPC_MODE_PIC, W, &seq, lg,
                          st, &err);
    if (*rc == HP_OK)
        *rc = hp_backend_sync(llm->model.be, &err);
    if (*rc != HP_OK)
        tap_diag("assemble on %s: %s", hp_backend_name(llm->model.be), err.msg);
    hp_seq_free(&seq);
    return lg;
}

static void check(const char *root, const char *name, const hp_backend_t *cuda)
{
    char dir[1024];
    hp_llm_t cpu, dev;
    hp_error_t err = {0};
    snprintf(dir, sizeof(dir), "%s/models/test/%s", root, name);
    if (!ok(hp_llm_load(&cpu, dir, &err) == HP_OK &&
                hp_llm_load_on(&dev, dir, cuda, &err) == HP_OK,
            "%s loads on cpu and %s: %s", name, hp_backend_name(cuda), err.msg))
        return;
    hp_prompt_t p;
    hp_fwd_ws_t wd, wc;
    hp_fwd_plan_t plan = {16, 0, 1, 1};
    node_t A, B, C;
    int rc = hp_prompt_build(&p, &dev, PROMPT, strlen(PROMPT), SEP, &err);
    if (!ok(rc == HP_OK && hp_fwd_ws_init(&wd, &dev.model, &plan, &err) == 0 &&
                hp_fwd_ws_init(&wc, &cpu.model, &plan, &err) == 0,
            "%s: prompt and workspaces: %s", name, err.msg))
        return;
    if (!ok(node_start(&A, &dev) && node_start(&B, &dev) &&
                node_start(&C, &cpu),
            "%s: two device nodes and a CPU node listen (%s %s %s)", name,
            A.addr, B.addr, C.addr))
        return;

    /* A (device) builds; B (device) and C (CPU) fetch from it */
    rc = hp_assemble_warm(&dev, &A.cache, &wd, &p, HP_IPC_MODE_PIC, W, NULL,
                          &err);
    ok(rc == HP_OK, "%s: A captures every segment on the device: %s", name,
       rc ? err.msg : "");
    unsigned long allocs = hp_backend_device_allocs(dev.model.be);
    int nb = fetch_all(&B, &A, &p), nc = fetch_all(&C, &A, &p);
    ok(nb > 0 && nc == nb && same_entries(&A, &B, &p) &&
           same_entries(&A, &C, &p),
       "%s: device -> device and device -> CPU: %d entries each, byte for "
       "byte, headers adopted",
       name, nb);

    /* CPU -> device: C builds a segment B lacks, B fetches it */
    const hp_prompt_seg_t *d1 = &p.segs[1];
    const uint32_t vstate = HP_VAR_NAIVE;
    size_t sb1 =
        hp_assemble_entry_bytes(&cpu.model.cfg, d1, HP_IPC_MODE_NAIVE, 0);
    hp_pool_entry_t *ce = hp_pool_alloc(C.cache.pub, d1->id, vstate, sb1, &err);
    rc = ce ? hp_segc_build_state(ce, &cpu.model, &wc, p.ids + d1->start,
                                  d1->len, &err)
            : HP_ENOMEM;
    if (rc == HP_OK)
        hp_pool_publish(C.cache.pub, ce);
    hp_pool_release(C.cache.pub, ce);
    rc = hp_peer_fetch(C.addr, d1->id, vstate, B.cache.pub, &dev.model,
                       TIMEOUT_MS, NULL, &err);
    size_t n1 = 0, n2 = 0;
    uint8_t *eb = entry_bytes(&B, d1->id, vstate, &n1),
            *ec = entry_bytes(&C, d1->id, vstate, &n2);
    ok(rc == HP_OK && eb && ec && n1 == n2 && !memcmp(eb, ec, n1),
       "%s: CPU -> device: B's copy of C's state entry is C's bytes (%s)", name,
       rc ? err.msg : "");
    free(eb);
    free(ec);

    /* remote PREFILL: B has A build a state entry on A's builder; both
     * keep the same bytes, within 1e-3 of a CPU build */
    const hp_prompt_seg_t *d2 = &p.segs[2];
    rc = hp_peer_prefill(A.addr, d2->id, vstate, HP_PEER_KIND_STATE, 0,
                         p.ids + d2->start, d2->len, B.cache.pub, &dev.model,
                         TIMEOUT_MS, NULL, &err);
    unsigned long after = hp_backend_device_allocs(dev.model.be);
    hp_peer_server_stats_t ss;
    hp_peer_server_stats(A.srv, &ss);
    size_t sb2 = hp_assemble_entry_bytes(&cpu.model.cfg, d2, HP_IPC_MODE_NAIVE,
                                         0),
           na = 0, nr = 0, hb = sizeof(hp_segc_hdr_t);
    hp_pool_entry_t le = {.data = aligned_alloc(64, (sb2 + 63) / 64 * 64),
                          .bytes = sb2};
    int lr = hp_segc_build_state(&le, &cpu.model, &wc, p.ids + d2->start,
                                 d2->len, &err);
    uint8_t *ea = entry_bytes(&A, d2->id, vstate, &na),
            *er = entry_bytes(&B, d2->id, vstate, &nr);
    double mx = 1, l2 = 1;
    if (rc == HP_OK && lr == HP_OK && er && nr == sb2)
        test_rel_errs((const float *)(const void *)((uint8_t *)le.data + hb),
                      (const float *)(const void *)(er + hb), (sb2 - hb) / 4,
                      &mx, &l2);
    ok(rc == HP_OK && ss.prefills == 1 && ea && na == nr &&
           !memcmp(ea, er, nr) && mx <= 1e-3,
       "%s: remote PREFILL on the device node: built there once, kept by "
       "both, within 1e-3 of a CPU build (max %.2e) (%s)",
       name, mx, rc ? err.msg : "");
    free(ea);
    free(er);
    free(le.data);
    ok(after == allocs,
       "%s: fetching into a device pool, serving entries and a PREFILL "
       "allocate no device memory (%lu allocations before, %lu after)",
       name, allocs, after);

    /* the entries work where they landed: B's and A's warm prefills agree */
    hp_assemble_stats_t sa, sbs;
    int ra, rb;
    float *la = assemble(&A, &wd, &p, &sa, &ra),
          *lb = assemble(&B, &wd, &p, &sbs, &rb);
    ok(ra == HP_OK && rb == HP_OK && sbs.miss_segments == 0 &&
           sbs.hit_segments == nb &&
           !memcmp(la, lb, (size_t)dev.model.cfg.vocab_size * sizeof(float)),
       "%s: B's warm pic prefill on fetched entries equals A's, bitwise "
       "(%d hits)",
       name, sbs.hit_segments);
    free(la);
    free(lb);

    /* a PREFILL over the device builder's room is refused, nothing kept */
    int *big = calloc(MAX_SEG + 1, sizeof(int));
    uint8_t bkey[16] = {9, 9, 9};
    rc = hp_peer_prefill(A.addr, bkey, vstate, HP_PEER_KIND_STATE, 0, big,
                         MAX_SEG + 1, B.cache.pub, &dev.model, TIMEOUT_MS, NULL,
                         &err);
    ok(rc == HP_EUNAVAIL && strstr(err.msg, "max_segment") &&
           !hp_pool_contains(A.cache.pub, bkey, vstate) &&
           !hp_pool_contains(B.cache.pub, bkey, vstate),
       "%s: a PREFILL over max_segment: refused, nothing published (%s)", name,
       err.msg);
    free(big);

    node_stop(&A);
    node_stop(&B);
    node_stop(&C);
    hp_fwd_ws_free(&wd);
    hp_fwd_ws_free(&wc);
    hp_prompt_free(&p);
    hp_llm_free(&dev);
    hp_llm_free(&cpu);
}

int main(int argc, char **argv)
{
    static const char *const models[] = {"qwen35-dense", NULL};
    return test_cuda_models(argc, argv, check, models);
}
