/*
 * fuzz_peer - the peer wire format (engine/cluster/peer.c) on any bytes:
 * a raw header, a payload under a header with valid checksums (so parsing
 * is reached), and an entry checked against the test model. Beyond no
 * crash: parsed pointers stay in the payload, a parsed message re-encodes
 * to one that parses the same, a flipped header bit is always refused,
 * an accepted entry has the size hp_segc_bytes gives.
 */
#include <string.h>

#include "engine/cache/segcache.h"
#include "engine/cluster/peer.h"
#include "engine/model/model_config.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static hp_model_config_t cfg;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    hp_error_t err;
    if (hp_model_config_load(&cfg, fuzz_model_dir(), &err) != HP_OK)
        return fuzz_setup_failed(err.msg);
    return 0;
}

/* Parses payload[n] as a message of type under a header made for it. */
static int parse(hp_peer_msg_t *m, int type, const uint8_t *payload, size_t n)
{
    uint8_t hdr[HP_PEER_HDR_BYTES];
    const void *parts[1] = {payload};
    hp_peer_hdr_t h;
    hp_error_t err;

    hp_peer_hdr_encode(hdr, type, parts, &n, 1);
    FUZZ_CHECK(hp_peer_hdr_decode(&h, hdr, 0, &err) == HP_OK);
    FUZZ_CHECK(h.type == type && h.length == n);

    /* any single flipped bit of the header is refused */
    for (int bit = 0; bit < 8 * HP_PEER_HDR_BYTES; bit += 7) {
        hdr[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        FUZZ_CHECK(hp_peer_hdr_decode(&h, hdr, 0, &err) != HP_OK);
        hdr[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    FUZZ_CHECK(hp_peer_hdr_decode(&h, hdr, 0, &err) == HP_OK);
    return hp_peer_msg_parse(m, &h, payload, &err);
}

static void roundtrip(const hp_peer_msg_t *m, const uint8_t *p, size_t n)
{
    uint8_t buf[32 + 4 * 4];
    size_t len = 0;
    hp_peer_msg_t again;

    switch (m->type) {
    case HP_PEER_GET_SEGMENT:
    case HP_PEER_NOT_FOUND:
        len = hp_peer_enc_key(buf, m->key, m->variant);
        break;
    case HP_PEER_SEGMENT:
        FUZZ_CHECK(m->data == p + 32 && m->bytes == n - 32);
        len = hp_peer_enc_segment(buf, m->key, m->variant, 0);
        break;
    case HP_PEER_PREFILL:
        FUZZ_CHECK(m->ids == p + 32 && 32 + 4 * (size_t)m->n_tok == n);
        if (m->n_tok > 4 || m->n_tok > INT32_MAX)
            return;
        len = hp_peer_enc_prefill(buf, m->key, m->variant, (int)m->kind,
                                  m->seam, (int)m->n_tok);
        memcpy(buf + len, m->ids, 4 * (size_t)m->n_tok);
        len += 4 * (size_t)m->n_tok;
        break;
    case HP_PEER_ERROR:
        FUZZ_CHECK(m->msg == (const char *)p + 8 && m->msg_len == n - 8);
        return;
    }
    FUZZ_CHECK(parse(&again, m->type, buf, len) == HP_OK);
    FUZZ_CHECK(memcmp(again.key, m->key, 16) == 0);
    FUZZ_CHECK(again.variant == m->variant && again.kind == m->kind &&
               again.seam == m->seam && again.n_tok == m->n_tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hp_peer_hdr_t h;
    hp_peer_msg_t m;
    hp_error_t err;

    if (size < 1)
        return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;

    switch (data[0] % 3) {
    case 0:
        /* a raw header, and the payload after it if it claims that */
        if (n < HP_PEER_HDR_BYTES)
            return 0;
        if (hp_peer_hdr_decode(&h, p, 0, &err) == HP_OK &&
            h.length == n - HP_PEER_HDR_BYTES &&
            hp_peer_msg_parse(&m, &h, p + HP_PEER_HDR_BYTES, &err) == HP_OK)
            roundtrip(&m, p + HP_PEER_HDR_BYTES, h.length);
        break;
    case 1: {
        /* a payload of any type under a valid header */
        int type = (int)(data[0] / 3 % 5) + HP_PEER_GET_SEGMENT;
        if (parse(&m, type, p, n) == HP_OK) {
            FUZZ_CHECK(m.type == type);
            roundtrip(&m, p, n);
        }
        break;
    }
    default: {
        /* an entry received for (variant), checked against the model */
        if (n < 4)
            return 0;
        uint32_t variant;
        memcpy(&variant, p, 4);
        if (hp_peer_check_entry(&cfg, variant, p + 4, n - 4, &err) == HP_OK) {
            hp_segc_hdr_t sh;
            memcpy(&sh, p + 4, sizeof(sh));
            FUZZ_CHECK(hp_segc_bytes(&cfg, (hp_segc_kind_t)sh.kind, sh.n_tok,
                                     sh.w) == n - 4);
        }
        break;
    }
    }
    return 0;
}
