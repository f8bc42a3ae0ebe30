/*
 * hk_probe.cu - the in-kernel phase probes' buffer and their summary
 * (hk_cuda_probe in hk_cuda.h; the stamps are hk_probe.h's): each probed
 * launch takes the next region of one device buffer; a read copies the
 * regions back and sums each block's stamp differences by phase.
 * Process-wide state, as the GDN chunk's phase events: benches turn it on
 * around the calls they probe.
 */
#include "kernels/cuda/hk_probe.h"

#include <stdio.h>

#define HK_PROBE_LAUNCHES 64 /* launches between two reads */
#define HK_PROBE_SMS      1024

struct hk_probe_rec {
    const hk_probe_kind *k;
    size_t off, blocks;
    int per, iters;
};

static struct {
    unsigned long long *buf; /* NULL: off */
    size_t cap, used;        /* stamps */
    int nrec, dropped;
    hk_probe_rec rec[HK_PROBE_LAUNCHES];
} hk_pr;

extern "C" int hk_cuda_probe(size_t stamps)
{
    if (hk_pr.buf) {
        cudaError_t e = cudaFree(hk_pr.buf);
        memset(&hk_pr, 0, sizeof hk_pr);
        if (e != cudaSuccess)
            return hk_cuda_status(e);
    }
    if (stamps == 0)
        return HK_CUDA_OK;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, stamps * sizeof(unsigned long long));
    if (e != cudaSuccess)
        return hk_cuda_status(e);
    hk_pr.buf = (unsigned long long *)p;
    hk_pr.cap = stamps;
    return HK_CUDA_OK;
}

static int hk_probe_points(const hk_probe_kind *k, int iters)
{
    return k->nhead + iters * k->nloop + k->ntail;
}

hk_probe hk_probe_launch(const hk_probe_kind *k, size_t blocks, int iters,
                         cudaStream_t s)
{
    hk_probe p = {NULL, 0};
    if (!hk_pr.buf)
        return p;
    const int per = 2 + hk_probe_points(k, iters < 0 ? 0 : iters);
    const size_t need = blocks * (size_t)per;
    if (hk_pr.nrec == HK_PROBE_LAUNCHES || need > hk_pr.cap - hk_pr.used ||
        cudaMemsetAsync(hk_pr.buf + hk_pr.used, 0, need * sizeof(*hk_pr.buf),
                        s) != cudaSuccess) {
        hk_pr.dropped++;
        return p;
    }
    hk_pr.rec[hk_pr.nrec++] = {k, hk_pr.used, blocks, per, iters};
    p.at = hk_pr.buf + hk_pr.used;
    p.per = per;
    hk_pr.used += need;
    return p;
}

/* Point i's phase in a launch of kind k with iters iterations. */
static int hk_probe_phase(const hk_probe_kind *k, int iters, int i)
{
    if (i < k->nhead)
        return i;
    i -= k->nhead;
    if (i < iters * k->nloop)
        return k->nhead + i % k->nloop;
    return k->nhead + k->nloop + (i - iters * k->nloop);
}

/* One kernel's sums over its launches. */
struct hk_probe_sum {
    const hk_probe_kind *k;
    double *phase;     /* cycles by phase, over blocks */
    long long *points; /* the points passed, by phase */
    double span, resident_w;
    long long blocks;
};

/* A launch's window on each SM, the spans of its blocks there and their
 * count. */
struct hk_probe_sms {
    unsigned long long lo[HK_PROBE_SMS], hi[HK_PROBE_SMS];
    double busy[HK_PROBE_SMS];
    int n[HK_PROBE_SMS];
};

/* Launch r's stamps st into sum u (and its blocks' residency per SM, in
 * w's room). */
static void hk_probe_add(hk_probe_sum *u, const hk_probe_rec &r,
                         const unsigned long long *st, hk_probe_sms *w)
{
    unsigned long long *lo = w->lo, *hi = w->hi;
    double *busy = w->busy;
    int *nb = w->n;
    memset(busy, 0, sizeof w->busy);
    memset(nb, 0, sizeof w->n);
    long long ran = 0;
    for (size_t b = 0; b < r.blocks; b++) {
        const unsigned long long *row = st + b * (size_t)r.per;
        const unsigned sm = (unsigned)(row[0] % HK_PROBE_SMS);
        unsigned long long prev = row[1];
        bool any = false;
        for (int i = 0; i + 2 < r.per; i++) {
            const unsigned long long v = row[2 + i];
            if (v == 0)
                continue;
            const double d = v > prev ? (double)(v - prev) : 0.0;
            const int ph = hk_probe_phase(r.k, r.iters, i);
            u->phase[ph] += d;
            u->points[ph]++;
            prev = v > prev ? v : prev;
            any = true;
        }
        if (!any) /* a spare block (past the last chunk): left at once */
            continue;
        const double span = (double)(prev - row[1]);
        u->span += span;
        ran++;
        if (nb[sm] == 0 || row[1] < lo[sm])
            lo[sm] = row[1];
        if (nb[sm] == 0 || prev > hi[sm])
            hi[sm] = prev;
        busy[sm] += span;
        nb[sm]++;
    }
    /* residency: each SM's summed spans over its window, on average over
     * the SMs, weighted by the launch's blocks */
    double res = 0.0;
    int nsm = 0;
    for (int i = 0; i < HK_PROBE_SMS; i++)
        if (nb[i] > 0) {
            const double w = (double)(hi[i] - lo[i]);
            res += w > 0.0 ? busy[i] / w : 1.0;
            nsm++;
        }
    if (nsm)
        u->resident_w += res / nsm * (double)ran;
    u->blocks += ran;
}

/* Sum u as rows (its phases, then "span") into rows from *n. */
static void hk_probe_emit(const hk_probe_sum &u, hk_cuda_probe_row_t *rows,
                          int cap, int *n)
{
    const hk_probe_kind *k = u.k;
    const int np = k->nhead + k->nloop + k->ntail;
    const double nb = u.blocks > 0 ? (double)u.blocks : 1.0;
    for (int i = 0; i <= np && *n < cap; i++) {
        hk_cuda_probe_row_t *w = &rows[(*n)++];
        memset(w, 0, sizeof *w);
        snprintf(w->kernel, sizeof w->kernel, "%s", k->kernel);
        snprintf(w->phase, sizeof w->phase, "%s",
                 i < np ? k->phase[i] : "span");
        const double c = i < np ? u.phase[i] : u.span;
        w->cycles = c / nb;
        w->share = u.span > 0.0 ? c / u.span : 0.0;
        w->resident = i < np ? 0.0 : u.resident_w / nb;
        w->blocks = u.blocks;
        w->points = i < np ? u.points[i] : u.blocks;
    }
}

extern "C" int hk_cuda_probe_rows(hk_cuda_probe_row_t *rows, int cap, int *n,
                                  int *dropped)
{
    if (!n || (cap > 0 && !rows) || cap < 0)
        return HK_CUDA_EINVAL;
    *n = 0;
    if (dropped)
        *dropped = hk_pr.dropped;
    if (!hk_pr.buf)
        return HK_CUDA_EINVAL;
    const size_t used = hk_pr.used;
    const int nrec = hk_pr.nrec;
    hk_pr.used = 0;
    hk_pr.nrec = 0;
    hk_pr.dropped = 0;
    if (nrec == 0)
        return HK_CUDA_OK;
    unsigned long long *st = (unsigned long long *)malloc(used * sizeof(*st));
    hk_probe_sum *sum = (hk_probe_sum *)calloc((size_t)nrec, sizeof(*sum));
    hk_probe_sms *w = (hk_probe_sms *)malloc(sizeof(*w));
    if (!st || !sum || !w) {
        free(st);
        free(sum);
        free(w);
        return HK_CUDA_ENOMEM;
    }
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(st, hk_pr.buf, used * sizeof(*st),
                            cudaMemcpyDeviceToHost, 0);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(0);
    int rc = hk_cuda_status(e), nsum = 0;
    for (int i = 0; rc == HK_CUDA_OK && i < nrec; i++) {
        const hk_probe_rec &r = hk_pr.rec[i];
        int j = 0;
        while (j < nsum && sum[j].k != r.k)
            j++;
        if (j == nsum) {
            const hk_probe_kind *k = r.k;
            sum[j].k = k;
            const size_t np = (size_t)(k->nhead + k->nloop + k->ntail);
            sum[j].phase = (double *)calloc(np, sizeof(double));
            sum[j].points = (long long *)calloc(np, sizeof(long long));
            nsum++;
            if (!sum[j].phase || !sum[j].points) {
                rc = HK_CUDA_ENOMEM;
                break;
            }
        }
        hk_probe_add(&sum[j], r, st + r.off, w);
    }
    for (int j = 0; j < nsum; j++) {
        if (rc == HK_CUDA_OK)
            hk_probe_emit(sum[j], rows, cap, n);
        free(sum[j].phase);
        free(sum[j].points);
    }
    free(sum);
    free(w);
    free(st);
    return rc;
}
