/*
 * fuzz_seg - splitting a prompt on a separator and segment ids. Beyond no
 * crash: the segments joined by the separator give the prompt back, none
 * holds the separator, roles are LEAD, PIC.., QUERY (one QUERY alone), -1
 * only past max; ids are deterministic, differ by role, hex is 32 digits.
 */
#include <string.h>

#include "engine/contract/hp_seg.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_SEGS 16

/* separators a left-to-right split meets (they do not overlap) */
static size_t count(const char *h, size_t hl, const char *n, size_t nl)
{
    size_t k = 0;
    for (size_t i = 0; nl && i + nl <= hl;) {
        if (memcmp(h + i, n, nl) == 0) {
            k++;
            i += nl;
        } else {
            i++;
        }
    }
    return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t fp[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    hp_seg_t seg[MAX_SEGS];
    uint8_t id[16], again[16], other[16];
    char hex[HP_SEG_ID_HEX_LEN + 1];

    if (size == 0)
        return 0;
    /* the first byte: the separator's length (0 .. 15), then its bytes */
    size_t sep_len = data[0] & 15;
    if (size - 1 < sep_len)
        return 0;
    const char *sep = (const char *)data + 1;
    const char *prompt = sep + sep_len;
    size_t len = size - 1 - sep_len;

    int n = hp_seg_split(seg, MAX_SEGS, prompt, len, sep, sep_len);
    if (n < 0) {
        /* more than MAX_SEGS segments: at least MAX_SEGS separators */
        FUZZ_CHECK(n == -1 && count(prompt, len, sep, sep_len) >= MAX_SEGS);
        return 0;
    }
    FUZZ_CHECK(n >= 1 && n <= MAX_SEGS);
    const char *p = prompt;
    for (int i = 0; i < n; i++) {
        hp_seg_role_t want = i == n - 1 ? HP_SEG_QUERY
                             : i == 0   ? HP_SEG_LEAD
                                        : HP_SEG_PIC;
        FUZZ_CHECK(seg[i].role == want && seg[i].data == p);
        FUZZ_CHECK(count(seg[i].data, seg[i].len, sep, sep_len) == 0);
        p += seg[i].len;
        if (i < n - 1) {
            FUZZ_CHECK(memcmp(p, sep, sep_len) == 0);
            p += sep_len;
        }

        hp_seg_id(id, fp, seg[i].role, seg[i].data, seg[i].len);
        hp_seg_id(again, fp, seg[i].role, seg[i].data, seg[i].len);
        hp_seg_id(other, fp, (hp_seg_role_t)((seg[i].role + 1) % 3),
                  seg[i].data, seg[i].len);
        FUZZ_CHECK(memcmp(id, again, 16) == 0 && memcmp(id, other, 16) != 0);
        hp_seg_id_hex(hex, id);
        FUZZ_CHECK(strlen(hex) == HP_SEG_ID_HEX_LEN &&
                   strspn(hex, "0123456789abcdef") == HP_SEG_ID_HEX_LEN);
    }
    FUZZ_CHECK(p == prompt + len);
    FUZZ_CHECK((size_t)n == count(prompt, len, sep, sep_len) + 1);
    return 0;
}
