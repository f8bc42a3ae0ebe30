/* peer.c - the peer wire format: encode, validate, parse (peer.h). */
#include "engine/cluster/peer.h"

#include "engine/cache/assemble.h"

#include <string.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "engine/cache/segcache.h"

/* Variant encoding of the public pool (assemble.c): low byte 1 lead, 2
 * naive (both STATE entries), 3 pic with the seam in bits 8.. */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

void hp_peer_hdr_encode(uint8_t out[HP_PEER_HDR_BYTES], int type,
                        const void *const *parts, const size_t *lens, int n)
{
    XXH3_state_t st;
    uint64_t len = 0;
    XXH3_64bits_reset(&st);
    for (int i = 0; i < n; i++) {
        XXH3_64bits_update(&st, parts[i], lens[i]);
        len += lens[i];
    }
    put32(out, HP_PEER_MAGIC);
    put16(out + 4, HP_PEER_VERSION);
    put16(out + 6, (uint16_t)type);
    put64(out + 8, len);
    put64(out + 16, XXH3_64bits_digest(&st));
    put64(out + 24, XXH3_64bits(out, 24));
}

int hp_peer_hdr_decode(hp_peer_hdr_t *h, const uint8_t in[HP_PEER_HDR_BYTES],
                       uint64_t max_payload, hp_error_t *err)
{
    h->magic = get32(in);
    h->version = get16(in + 4);
    h->type = get16(in + 6);
    h->length = get64(in + 8);
    h->payload_sum = get64(in + 16);
    h->header_sum = get64(in + 24);
    if (h->magic != HP_PEER_MAGIC)
        return hp_error_set(err, HP_EBADINPUT, "peer: bad magic %08x",
                            h->magic);
    if (h->header_sum != XXH3_64bits(in, 24))
        return hp_error_set(err, HP_EBADINPUT, "peer: header checksum");
    if (h->version != HP_PEER_VERSION)
        return hp_error_set(err, HP_EBADINPUT,
                            "peer: wire version %u, this engine speaks %d",
                            h->version, HP_PEER_VERSION);
    if (h->type < HP_PEER_GET_SEGMENT || h->type > HP_PEER_ERROR)
        return hp_error_set(err, HP_EBADINPUT, "peer: unknown type %u",
                            h->type);
    if (!max_payload)
        max_payload = HP_PEER_MAX_PAYLOAD;
    if (h->length > max_payload)
        return hp_error_set(err, HP_ETOOLARGE,
                            "peer: payload of %llu bytes over the bound %llu",
                            (unsigned long long)h->length,
                            (unsigned long long)max_payload);
    return HP_OK;
}

int hp_peer_msg_parse(hp_peer_msg_t *m, const hp_peer_hdr_t *h,
                      const uint8_t *p, hp_error_t *err)
{
    uint64_t n = h->length;
    memset(m, 0, sizeof(*m));
    m->type = h->type;
    if (XXH3_64bits(p, (size_t)n) != h->payload_sum)
        return hp_error_set(err, HP_EBADINPUT, "peer: payload checksum");
    switch (h->type) {
    case HP_PEER_GET_SEGMENT:
    case HP_PEER_NOT_FOUND:
        if (n != 24)
            break;
        memcpy(m->key, p, 16);
        m->variant = get32(p + 16);
        return HP_OK;
    case HP_PEER_SEGMENT:
        if (n < 32)
            break;
        memcpy(m->key, p, 16);
        m->variant = get32(p + 16);
        m->bytes = get64(p + 24);
        if (m->bytes != n - 32)
            break;
        m->data = p + 32;
        return HP_OK;
    case HP_PEER_PREFILL:
        if (n < 32)
            break;
        memcpy(m->key, p, 16);
        m->variant = get32(p + 16);
        m->kind = get32(p + 20);
        m->seam = (int32_t)get32(p + 24);
        m->n_tok = get32(p + 28);
        if ((n - 32) / 4 != m->n_tok || (n - 32) % 4)
            break;
        m->ids = p + 32;
        return HP_OK;
    case HP_PEER_ERROR:
        if (n < 8)
            break;
        m->code = (int32_t)get32(p);
        m->msg = (const char *)p + 8;
        m->msg_len = (size_t)(n - 8);
        return HP_OK;
    }
    return hp_error_set(err, HP_EBADINPUT,
                        "peer: malformed type %d payload of %llu bytes",
                        h->type, (unsigned long long)n);
}

size_t hp_peer_enc_key(uint8_t buf[24], const uint8_t key[16], uint32_t variant)
{
    memcpy(buf, key, 16);
    put32(buf + 16, variant);
    put32(buf + 20, 0);
    return 24;
}

size_t hp_peer_enc_segment(uint8_t buf[32], const uint8_t key[16],
                           uint32_t variant, uint64_t bytes)
{
    hp_peer_enc_key(buf, key, variant);
    put64(buf + 24, bytes);
    return 32;
}

size_t hp_peer_enc_prefill(uint8_t buf[32], const uint8_t key[16],
                           uint32_t variant, int kind, int seam, int n_tok)
{
    memcpy(buf, key, 16);
    put32(buf + 16, variant);
    put32(buf + 20, (uint32_t)kind);
    put32(buf + 24, (uint32_t)seam);
    put32(buf + 28, (uint32_t)n_tok);
    return 32;
}

int hp_peer_check_entry(const hp_model_config_t *c, uint32_t variant,
                        const void *entry, uint64_t bytes, hp_error_t *err)
{
    hp_segc_hdr_t h;
    uint32_t vk = HP_VAR_KIND(variant);
    if (bytes < sizeof(h))
        return hp_error_set(err, HP_EBADINPUT,
                            "peer: entry of %llu bytes has no header",
                            (unsigned long long)bytes);
    memcpy(&h, entry, sizeof(h));
    uint32_t want = vk == 3 ? HP_SEGC_PIC : HP_SEGC_STATE;
    if (h.magic != HP_SEGC_MAGIC || h.kind != want || vk < 1 || vk > 3)
        return hp_error_set(err, HP_EBADINPUT,
                            "peer: entry is not a %s entry (variant %#x)",
                            want == HP_SEGC_PIC ? "pic" : "state", variant);
    int ok = h.n_tok >= 0 && h.n_tok <= (1 << 24);
    if (want == HP_SEGC_PIC)
        ok = ok && h.w == HP_VAR_SEAM(variant) && h.w >= 0 &&
             h.n_int == h.n_tok - 2 * h.w && h.n_int > 0;
    else
        ok = ok && h.n_int == h.n_tok;
    if (!ok || hp_segc_bytes(c, (hp_segc_kind_t)want, h.n_tok, h.w) != bytes)
        return hp_error_set(err, HP_EBADINPUT,
                            "peer: entry of %llu bytes (%d tokens, seam %d) "
                            "does not fit this model",
                            (unsigned long long)bytes, h.n_tok, h.w);
    return HP_OK;
}
