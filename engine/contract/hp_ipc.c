/* hp_ipc.c - the shared-memory request interface (see hp_ipc.h). */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* clock_gettime, also under -std=c11 */
#endif
#include "hp_ipc.h"

#include <string.h>
#include <time.h>

#include "hp_error.h"

uint32_t hp_ipc_slot_stride(uint32_t input_bytes, uint32_t ring_bytes)
{
    uint64_t n = sizeof(hp_ipc_slot_t) + (uint64_t)input_bytes + ring_bytes;
    n = (n + 63) & ~(uint64_t)63;
    return n > UINT32_MAX ? 0 : (uint32_t)n;
}

uint64_t hp_ipc_segment_bytes(uint32_t n_slots, uint32_t input_bytes,
                              uint32_t ring_bytes)
{
    return sizeof(hp_ipc_header_t) +
           (uint64_t)n_slots * hp_ipc_slot_stride(input_bytes, ring_bytes);
}

static int pow2(uint32_t x)
{
    return x && !(x & (x - 1));
}

static void copy_name(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src ? src : "", n);
    dst[n] = '\0';
}

int hp_ipc_format(void *base, uint32_t n_slots, uint32_t input_bytes,
                  uint32_t ring_bytes, uint64_t generation, int32_t pid,
                  const char *node, const char *model)
{
    hp_ipc_header_t *h = base;

    if (n_slots == 0 || n_slots > HP_IPC_OWNER_MAX || input_bytes % 64 ||
        !pow2(ring_bytes) || ring_bytes < HP_IPC_RING_MIN ||
        hp_ipc_slot_stride(input_bytes, ring_bytes) == 0)
        return -1;
    h->magic = HP_IPC_MAGIC;
    h->version = HP_IPC_VERSION;
    h->header_bytes = sizeof(hp_ipc_header_t);
    h->slot_bytes = sizeof(hp_ipc_slot_t);
    h->generation = generation;
    h->n_slots = n_slots;
    h->input_bytes = input_bytes;
    h->ring_bytes = ring_bytes;
    h->slot_stride = hp_ipc_slot_stride(input_bytes, ring_bytes);
    h->total_bytes = hp_ipc_segment_bytes(n_slots, input_bytes, ring_bytes);
    h->engine_pid = pid;
    copy_name(h->node, sizeof(h->node), node);
    copy_name(h->model, sizeof(h->model), model);
    atomic_init(&h->running, 0);
    atomic_init(&h->queued, 0);
    atomic_init(&h->served, 0);
    atomic_init(&h->submit_seq, 0);
    atomic_init(&h->heartbeat_ms, hp_ipc_now_ms());
    for (int k = 0; k < HP_IPC_POOLS; k++) {
        atomic_init(&h->pools[k].bytes_used, 0);
        atomic_init(&h->pools[k].budget, 0);
        atomic_init(&h->pools[k].entries, 0);
        atomic_init(&h->pools[k].evictions, 0);
    }
    for (uint32_t i = 0; i < n_slots; i++) {
        hp_ipc_slot_t *s = hp_ipc_slot(h, i);
        atomic_init(&s->word, HP_IPC_WORD(0, 0, HP_IPC_FREE));
        atomic_init(&s->cancel, 0);
        atomic_init(&s->waiting, 0);
        atomic_init(&s->head, 0);
        atomic_init(&s->tail, 0);
    }
    /* last: a reader that sees OK sees a formatted segment */
    atomic_store_explicit(&h->health, HP_IPC_HEALTH_OK, memory_order_release);
    return 0;
}

const char *hp_ipc_check(const void *base, uint64_t size)
{
    const hp_ipc_header_t *h = base;

    if (size < sizeof(hp_ipc_header_t))
        return "segment smaller than its header";
    if (h->magic != HP_IPC_MAGIC)
        return "bad magic";
    if (h->version != HP_IPC_VERSION)
        return "protocol version mismatch";
    if (h->header_bytes != sizeof(hp_ipc_header_t) ||
        h->slot_bytes != sizeof(hp_ipc_slot_t))
        return "struct sizes differ (engine and module built apart)";
    if (h->n_slots == 0 || h->input_bytes % 64 || !pow2(h->ring_bytes) ||
        h->ring_bytes < HP_IPC_RING_MIN ||
        h->slot_stride != hp_ipc_slot_stride(h->input_bytes, h->ring_bytes))
        return "bad slot geometry";
    if (h->total_bytes !=
            hp_ipc_segment_bytes(h->n_slots, h->input_bytes, h->ring_bytes) ||
        h->total_bytes > size)
        return "segment smaller than its slot table";
    return NULL;
}

hp_ipc_slot_t *hp_ipc_slot(hp_ipc_header_t *h, uint32_t i)
{
    return (hp_ipc_slot_t *)((char *)h + sizeof(hp_ipc_header_t) +
                             (uint64_t)i * h->slot_stride);
}

uint64_t hp_ipc_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void hp_ipc_beat(hp_ipc_header_t *h, uint64_t now_ms)
{
    atomic_store_explicit(&h->heartbeat_ms, now_ms, memory_order_relaxed);
}

uint64_t hp_ipc_heartbeat_age(const hp_ipc_header_t *h, uint64_t now_ms)
{
    uint64_t beat =
        atomic_load_explicit(&h->heartbeat_ms, memory_order_relaxed);
    return now_ms > beat ? now_ms - beat : 0;
}

char *hp_ipc_input(hp_ipc_header_t *h, hp_ipc_slot_t *s)
{
    (void)h;
    return (char *)s + sizeof(hp_ipc_slot_t);
}

static unsigned char *ring_data(const hp_ipc_header_t *h, hp_ipc_slot_t *s)
{
    return (unsigned char *)s + sizeof(hp_ipc_slot_t) + h->input_bytes;
}

/* ---- slot lifecycle ------------------------------------------------- */

hp_ipc_slot_t *hp_ipc_claim(hp_ipc_header_t *h, uint32_t owner, int32_t pid,
                            uint32_t *index, uint32_t *seq)
{
    for (uint32_t i = 0; i < h->n_slots; i++) {
        hp_ipc_slot_t *s = hp_ipc_slot(h, i);
        uint64_t w = atomic_load(&s->word);
        if (HP_IPC_STATE(w) != HP_IPC_FREE)
            continue;
        uint32_t next = HP_IPC_SEQ(w) + 1;
        if (!atomic_compare_exchange_strong(
                &s->word, &w, HP_IPC_WORD(next, owner, HP_IPC_CLAIMED)))
            continue;
        /* ours alone until submit: the engine ignores CLAIMED slots */
        atomic_store_explicit(&s->cancel, 0, memory_order_relaxed);
        atomic_store_explicit(&s->waiting, 0, memory_order_relaxed);
        atomic_store_explicit(&s->head, 0, memory_order_relaxed);
        atomic_store_explicit(&s->tail, 0, memory_order_relaxed);
        s->owner_pid = pid;
        *index = i;
        *seq = next;
        return s;
    }
    return NULL;
}

int hp_ipc_submit(hp_ipc_header_t *h, hp_ipc_slot_t *s, uint32_t seq)
{
    uint64_t w = atomic_load(&s->word);
    if (HP_IPC_SEQ(w) != seq || HP_IPC_STATE(w) != HP_IPC_CLAIMED)
        return -1;
    s->ticket = atomic_fetch_add(&h->submit_seq, 1);
    /* release: the request and prompt are visible before SUBMITTED */
    return atomic_compare_exchange_strong(
               &s->word, &w,
               HP_IPC_WORD(seq, HP_IPC_OWNER(w), HP_IPC_SUBMITTED))
               ? 0
               : -1;
}

int hp_ipc_take(hp_ipc_slot_t *s, uint64_t *word)
{
    uint64_t w = atomic_load(&s->word);
    if (HP_IPC_STATE(w) != HP_IPC_SUBMITTED)
        return -1;
    uint64_t r = HP_IPC_WORD(HP_IPC_SEQ(w), HP_IPC_OWNER(w), HP_IPC_RUNNING);
    if (!atomic_compare_exchange_strong(&s->word, &w, r))
        return -1;
    *word = r;
    return 0;
}

void hp_ipc_finish(hp_ipc_slot_t *s)
{
    uint64_t w = atomic_load(&s->word);
    if (HP_IPC_STATE(w) != HP_IPC_RUNNING)
        return;
    uint64_t d = HP_IPC_WORD(HP_IPC_SEQ(w), HP_IPC_OWNER(w), HP_IPC_DONE);
    if (!atomic_compare_exchange_strong(&s->word, &w, d))
        return;
    /*
     * Sequentially consistent on both sides: either the user sees DONE
     * when it sets cancel (and frees), or we see its cancel here (and
     * free), or both try and exactly one CAS wins.
     */
    if (atomic_load(&s->cancel))
        atomic_compare_exchange_strong(
            &s->word, &d, HP_IPC_WORD(HP_IPC_SEQ(d), 0, HP_IPC_FREE));
}

int hp_ipc_release(hp_ipc_slot_t *s, uint32_t seq)
{
    uint64_t w = atomic_load(&s->word);
    if (HP_IPC_SEQ(w) != seq)
        return -1;
    if (HP_IPC_STATE(w) == HP_IPC_FREE)
        return 1;
    atomic_store(&s->cancel, 1);
    for (;;) {
        w = atomic_load(&s->word);
        if (HP_IPC_SEQ(w) != seq || HP_IPC_STATE(w) == HP_IPC_FREE)
            return 1;
        if (HP_IPC_STATE(w) == HP_IPC_RUNNING)
            return 0;
        if (atomic_compare_exchange_strong(&s->word, &w,
                                           HP_IPC_WORD(seq, 0, HP_IPC_FREE)))
            return 1;
    }
}

/* ---- output ring ---------------------------------------------------- */

static uint32_t rec_bytes(uint32_t len)
{
    return HP_IPC_REC_HEADER + ((len + 7u) & ~7u);
}

uint32_t hp_ipc_ring_room(const hp_ipc_header_t *h, hp_ipc_slot_t *s)
{
    uint64_t head = atomic_load_explicit(&s->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&s->tail, memory_order_acquire);
    uint64_t used = head - tail;
    return used >= h->ring_bytes ? 0 : h->ring_bytes - (uint32_t)used;
}

static void ring_write(unsigned char *ring, uint32_t cap, uint64_t at,
                       const void *src, uint32_t n)
{
    uint32_t off = (uint32_t)(at & (cap - 1)), first = cap - off;
    if (first > n)
        first = n;
    memcpy(ring + off, src, first);
    memcpy(ring, (const unsigned char *)src + first, n - first);
}

static void ring_read(const unsigned char *ring, uint32_t cap, uint64_t at,
                      void *dst, uint32_t n)
{
    uint32_t off = (uint32_t)(at & (cap - 1)), first = cap - off;
    if (first > n)
        first = n;
    memcpy(dst, ring + off, first);
    memcpy((unsigned char *)dst + first, ring, n - first);
}

int hp_ipc_ring_put(const hp_ipc_header_t *h, hp_ipc_slot_t *s, uint32_t type,
                    const void *data, uint32_t len, uint32_t reserve)
{
    uint32_t need = rec_bytes(len), hdr[2] = {type, len};
    if (len > HP_IPC_RECORD_MAX ||
        (uint64_t)need + reserve > hp_ipc_ring_room(h, s))
        return -1;
    unsigned char *ring = ring_data(h, s);
    uint64_t head = atomic_load_explicit(&s->head, memory_order_relaxed);
    ring_write(ring, h->ring_bytes, head, hdr, sizeof(hdr));
    if (len)
        ring_write(ring, h->ring_bytes, head + HP_IPC_REC_HEADER, data, len);
    /* release: the bytes are visible before the new head */
    atomic_store_explicit(&s->head, head + need, memory_order_release);
    return 0;
}

int hp_ipc_ring_get(const hp_ipc_header_t *h, hp_ipc_slot_t *s, uint32_t *type,
                    void *buf, uint32_t cap, uint32_t *len)
{
    uint64_t tail = atomic_load_explicit(&s->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&s->head, memory_order_acquire);
    uint32_t hdr[2];

    if (head == tail)
        return 0;
    if (head - tail < HP_IPC_REC_HEADER || head - tail > h->ring_bytes ||
        (tail & 7))
        return -1;
    const unsigned char *ring = ring_data(h, s);
    ring_read(ring, h->ring_bytes, tail, hdr, sizeof(hdr));
    if (hdr[1] > cap || hdr[1] > HP_IPC_RECORD_MAX ||
        rec_bytes(hdr[1]) > head - tail)
        return -1;
    ring_read(ring, h->ring_bytes, tail + HP_IPC_REC_HEADER, buf, hdr[1]);
    *type = hdr[0];
    *len = hdr[1];
    /* release: the producer may reuse the bytes only after we copied */
    atomic_store_explicit(&s->tail, tail + rec_bytes(hdr[1]),
                          memory_order_release);
    return 1;
}

size_t hp_ipc_utf8_cut(const char *text, size_t len, size_t max)
{
    if (len <= max)
        return len;
    size_t n = max;
    /* back off continuation bytes: text[n] must start a character */
    while (n > 0 && ((unsigned char)text[n] & 0xc0) == 0x80)
        n--;
    return n ? n : max;
}

/* ---- TOKEN records ---------------------------------------------------- */

/* an entry: float logprob, u32 byte count, the bytes padded to 4 */
void hp_ipc_token_add(void *rec, uint32_t *len, float logprob,
                      const void *bytes, uint32_t n)
{
    unsigned char *p = (unsigned char *)rec + *len;
    if (n > HP_IPC_TOKEN_BYTES)
        n = HP_IPC_TOKEN_BYTES;
    memcpy(p, &logprob, 4);
    memcpy(p + 4, &n, 4);
    if (n)
        memcpy(p + 8, bytes, n);
    memset(p + 8 + n, 0, (4 - n % 4) % 4);
    *len += 8 + (n + 3) / 4 * 4;
}

int hp_ipc_token_next(const void *rec, uint32_t len, uint32_t *off,
                      float *logprob, const unsigned char **bytes, uint32_t *n)
{
    const unsigned char *p = (const unsigned char *)rec + *off;
    uint32_t k;
    if (*off >= len || len - *off < 8)
        return 0;
    memcpy(logprob, p, 4);
    memcpy(&k, p + 4, 4);
    if (k > HP_IPC_TOKEN_BYTES || (k + 3) / 4 * 4 > len - *off - 8)
        return 0;
    *bytes = p + 8;
    *n = k;
    *off += 8 + (k + 3) / 4 * 4;
    return 1;
}

/* ---- errors ---------------------------------------------------------- */

/* One row per hp_status_t from HP_EBADINPUT on, in order. */
static const hp_ipc_error_t errors[] = {
    {400, "invalid_request_error", "invalid_prompt"},          /* BADINPUT */
    {400, "invalid_request_error", "context_length_exceeded"}, /* TOOLARGE */
    {503, "engine_unavailable", "engine_out_of_memory"},       /* NOMEM */
    {500, "server_error", "engine_error"},                     /* MODEL */
    {500, "server_error", "engine_error"},                     /* IO */
    {429, "rate_limit_error", "engine_busy"},                  /* BUSY */
    {503, "engine_unavailable", "engine_unavailable"},         /* UNAVAIL */
    {504, "timeout", "timeout"},                               /* TIMEOUT */
    {500, "server_error", "engine_error"},                     /* CANCELLED */
    {500, "server_error", "engine_error"},                     /* INTERNAL */
};
_Static_assert(sizeof(errors) / sizeof(errors[0]) ==
                   HP_EINTERNAL - HP_EBADINPUT + 1,
               "a row for every hp_status_t");

const hp_ipc_error_t *hp_ipc_error(int status)
{
    static const hp_ipc_error_t other = {500, "server_error", "engine_error"};
    if (status < HP_EBADINPUT || status > HP_EINTERNAL)
        return &other;
    return &errors[status - HP_EBADINPUT];
}
