/* hp_seg.c - prompt splitting and segment ids (see hp_seg.h). */
#include "hp_seg.h"

#include <string.h>
/* the streaming state lives on the stack: needs the struct definition */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

static const char *find(const char *h, size_t hl, const char *n, size_t nl)
{
    if (nl == 0 || hl < nl)
        return NULL;
    for (const char *p = h, *end = h + hl - nl; p <= end; p++) {
        p = memchr(p, n[0], (size_t)(end - p) + 1);
        if (!p)
            return NULL;
        if (memcmp(p, n, nl) == 0)
            return p;
    }
    return NULL;
}

int hp_seg_split(hp_seg_t *out, int max, const char *prompt, size_t len,
                 const char *sep, size_t sep_len)
{
    int n = 0;
    const char *p = prompt, *end = prompt + len, *s;
    while ((s = find(p, (size_t)(end - p), sep, sep_len)) != NULL) {
        if (n >= max)
            return -1;
        out[n].data = p;
        out[n].len = (size_t)(s - p);
        out[n].role = n == 0 ? HP_SEG_LEAD : HP_SEG_PIC;
        n++;
        p = s + sep_len;
    }
    if (n >= max)
        return -1;
    out[n].data = p;
    out[n].len = (size_t)(end - p);
    out[n].role = HP_SEG_QUERY;
    return n + 1;
}

void hp_seg_id(uint8_t id[16], const uint8_t fingerprint[16],
               hp_seg_role_t role, const char *data, size_t len)
{
    XXH3_state_t st;
    unsigned char r = (unsigned char)role;
    XXH128_canonical_t canon;

    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, fingerprint, 16);
    XXH3_128bits_update(&st, &r, 1);
    XXH3_128bits_update(&st, data, len);
    XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(&st));
    memcpy(id, canon.digest, 16);
}

void hp_seg_id_hex(char out[HP_SEG_ID_HEX_LEN + 1], const uint8_t id[16])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hex[id[i] >> 4];
        out[2 * i + 1] = hex[id[i] & 15];
    }
    out[HP_SEG_ID_HEX_LEN] = '\0';
}
