/*
 * test_backend.c - the backend seam (engine/backend/backend.h): opening
 * backends by name, support queries, and a whole model run on a backend
 * whose memory is not the host's. That backend ("hostdev") has the CPU's
 * kernels but its own memory rules: every buffer comes from its alloc,
 * the weights are copies placed in it, host data crosses only by
 * upload/download. A model run on it must give the CPU backend's logits
 * bit for bit, every op must see placed weights, and every allocation
 * and placement must be returned: what a device backend needs of the
 * model code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend/backend_impl.h"
#include "engine/test/test_backend_run.h"
#include "engine/test/test_util.h"

#define MAX_PLACED 8192
#define MAX_LIVE   65536

typedef struct {
    long live;      /* allocations not yet freed */
    long transfers; /* uploads + downloads */
    int n_placed;
    const void *placed[MAX_PLACED];
    long foreign;    /* linear calls on a weight not placed here */
    long foreign_io; /* ... whose x or y is not this backend's memory */
    struct {
        const char *p;
        size_t bytes;
    } mem[MAX_LIVE]; /* the first MAX_LIVE live allocations */
} hostdev_t;

static hostdev_t *dev(be_t b)
{
    return b->ctx;
}

static void *hd_alloc(be_t b, size_t bytes)
{
    hostdev_t *d = dev(b);
    void *p = hp_backend_cpu_iface.alloc(b, bytes);
    if (p && d->live < MAX_LIVE) {
        d->mem[d->live].p = p;
        d->mem[d->live].bytes = bytes;
    }
    d->live += p != NULL;
    return p;
}

/* Whether p points into one of the backend's allocations. */
static int mine(const hostdev_t *d, const void *p)
{
    for (long i = 0; i < d->live && i < MAX_LIVE; i++)
        if ((const char *)p >= d->mem[i].p &&
            (const char *)p < d->mem[i].p + d->mem[i].bytes)
            return 1;
    return 0;
}

static void *hd_realloc(be_t b, void *p, size_t old_bytes, size_t new_bytes)
{
    void *q = hd_alloc(b, new_bytes);
    if (!q)
        return NULL;
    if (p) {
        memcpy(q, p, old_bytes < new_bytes ? old_bytes : new_bytes);
        hp_backend_free(b, p);
    }
    return q;
}

static void hd_free(be_t b, void *p)
{
    hostdev_t *d = dev(b);
    for (long i = 0; i < d->live && i < MAX_LIVE; i++)
        if (d->mem[i].p == p) {
            long last = (d->live < MAX_LIVE ? d->live : MAX_LIVE) - 1;
            d->mem[i] = d->mem[last];
            break;
        }
    d->live--;
    free(p);
}

static void hd_upload(be_t b, void *dst, const void *src, size_t bytes)
{
    dev(b)->transfers++;
    memcpy(dst, src, bytes);
}

static int hd_place(be_t b, const void **p, size_t bytes, hp_error_t *err)
{
    hostdev_t *d = dev(b);
    void *q = hd_alloc(b, bytes);
    if (!q || d->n_placed == MAX_PLACED)
        return hp_error_set(err, HP_ENOMEM, "hostdev: no room");
    memcpy(q, *p, bytes);
    d->placed[d->n_placed++] = q;
    *p = q;
    return HP_OK;
}

static void hd_unplace(be_t b, const void *p)
{
    hostdev_t *d = dev(b);
    for (int i = 0; i < d->n_placed; i++)
        if (d->placed[i] == p) {
            d->placed[i] = d->placed[--d->n_placed];
            hd_free(b, (void *)p);
            return;
        }
}

static void hd_linear(be_t b, float *y, const float *x, const hk_weight_t *w,
                      int n, int acc)
{
    hostdev_t *d = dev(b);
    int found = 0;
    for (int i = 0; i < d->n_placed && !found; i++)
        found = d->placed[i] == w->data;
    d->foreign += !found;
    d->foreign_io += !mine(d, x) || !mine(d, y);
    hp_backend_cpu_iface.linear(b, y, x, w, n, acc);
}

/* Whether files a and b hold the same bytes. */
static int same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int ca = getc(fa), cb = getc(fb);
        same = ca == cb;
        if (ca == EOF || cb == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

/* ---- names and queries -------------------------------------------------- */

static void check_open(void)
{
    const hp_backend_t *b;
    hp_error_t err = {0};
    ok(hp_backend_open(&b, "cpu", &err) == HP_OK && b == hp_backend_cpu(),
       "open cpu is the CPU backend");
    ok(!strcmp(hp_backend_name(b), "cpu") && hp_backend_host_memory(b),
       "cpu: named, host memory");
    int all = 1;
    for (int op = 0; op < HP_OP_COUNT; op++)
        all &= hp_backend_supports_op(b, (hp_op_t)op, HK_W_BF16);
    ok(all, "cpu supports every op");
    ok(hp_backend_open(&b, "gpu", &err) == HP_EBADINPUT && !b &&
           strstr(err.msg, "cpu, cuda or cuda:N"),
       "an unknown device is refused: %s", err.msg);
    ok(hp_backend_open(&b, "cuda:x", &err) == HP_EBADINPUT &&
           strstr(err.msg, "device number"),
       "cuda:x is refused: %s", err.msg);
    /* test_backend is linked without backend_cuda.c */
    ok(hp_backend_open(&b, "cuda:1", &err) == HP_EUNAVAIL &&
           strstr(err.msg, "without CUDA"),
       "cuda in a program built without CUDA: %s", err.msg);
    hp_backend_close(hp_backend_cpu()); /* a no-op */

    /* a backend lacking an op says so, and a call to it does nothing */
    hp_backend_i none = hp_backend_cpu_iface;
    none.gate_mul = NULL;
    struct hp_backend nb = {.iface = &none, .name = "none", .host_memory = 1};
    float o[2] = {1, 2}, g[2] = {0, 0};
    hp_backend_gate_mul(&nb, o, g, 2);
    ok(!hp_backend_supports_op(&nb, HP_OP_GATE_MUL, 0) &&
           hp_backend_supports_op(&nb, HP_OP_SPLIT_HEADS, 0) && o[0] == 1 &&
           o[1] == 2,
       "a missing op is unsupported and not run");
}

/* ---- a whole model on the host-device backend ---------------------------- */

static void check_model(const char *root, const char *name)
{
    char dir[1024];
    hp_model_t ref, m;
    hp_error_t err = {0};
    hostdev_t *d = calloc(1, sizeof(*d));
    hp_backend_i iface = hp_backend_cpu_iface;
    iface.alloc = hd_alloc;
    iface.alloc0 = NULL; /* alloc + memset0, counted */
    iface.realloc = hd_realloc;
    iface.free = hd_free;
    iface.upload = iface.download = hd_upload;
    iface.place = hd_place;
    iface.unplace = hd_unplace;
    iface.linear = hd_linear;
    struct hp_backend hd = {.iface = &iface, .ctx = d, .name = "hostdev"};

    snprintf(dir, sizeof(dir), "%s/models/test/%s", root, name);
    if (hp_model_load(&ref, dir, &err) != HP_OK ||
        hp_model_load_on(&m, dir, &hd, &err) != HP_OK) {
        ok(0, "%s: %s", name, err.msg);
        free(d);
        return;
    }
    ref.sample_vocab = m.sample_vocab = TBR_SAMPLE_VOCAB(m.cfg.vocab_size);
    ok(m.embed.data != ref.embed.data && d->n_placed > 0,
       "%s: the weights are placed on the backend (%d tensors)", name,
       d->n_placed);
    size_t n = (size_t)TBR_ROWS * m.cfg.vocab_size;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    char fa[64], fb[64];
    snprintf(fa, sizeof(fa), "/tmp/test_backend.%d.a", (int)getpid());
    snprintf(fb, sizeof(fb), "/tmp/test_backend.%d.b", (int)getpid());
    int ra = tbr_run(&ref, a, fa, &err);
    ok(ra == HP_OK, "%s: cpu run %s", name, ra == HP_OK ? "" : err.msg);
    long t0 = d->transfers;
    int rb = tbr_run(&m, b, fb, &err);
    ok(rb == HP_OK, "%s: hostdev run %s", name, rb == HP_OK ? "" : err.msg);
    ok(ra == HP_OK && rb == HP_OK && !memcmp(a, b, n * sizeof(float)),
       "%s: the same logits bit for bit", name);
    ok(same_file(fa, fb), "%s: the same state dump (read back by download)",
       name);
    unlink(fa);
    unlink(fb);
    ok(d->foreign == 0, "%s: every projection read placed weights (%ld not)",
       name, d->foreign);
    ok(d->foreign_io == 0,
       "%s: every projection's input and output in backend memory (%ld not)",
       name, d->foreign_io);
    ok(d->transfers > t0, "%s: logits came back by download (%ld transfers)",
       name, d->transfers - t0);
    /* a step's counts whatever its batch; logprobs rows copy no row */
    tbr_check_counts(&m, name, 0);
    ok(d->live == d->n_placed,
       "%s: run freed all it allocated (%ld live, %d placed)", name, d->live,
       d->n_placed);
    hp_model_free(&m);
    ok(d->live == 0 && d->n_placed == 0,
       "%s: the model released its placed weights (%ld live)", name, d->live);
    hp_model_free(&ref);
    free(a);
    free(b);
    free(d);
}

int main(void)
{
    check_open();
    return test_each_model(check_model);
}
