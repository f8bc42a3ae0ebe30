/* test_seg.c - the segment contract: splitting and ids (DESIGN §3). */
#include <string.h>

#include "engine/contract/hp_seg.h"
#include "t/lib/tap.h"

#define SEP "<|pic_sep|>"

static int split(const char *p, hp_seg_t *out, int max)
{
    return hp_seg_split(out, max, p, strlen(p), SEP, strlen(SEP));
}

static int seg_is(const hp_seg_t *s, const char *text, hp_seg_role_t role)
{
    return s->len == strlen(text) && !memcmp(s->data, text, s->len) &&
           s->role == role;
}

int main(void)
{
    hp_seg_t s[8];
    int n = split("sys" SEP "doc one" SEP "doc two" SEP "question?", s, 8);
    ok(n == 4, "four segments (got %d)", n);
    ok(seg_is(&s[0], "sys", HP_SEG_LEAD), "s0 is the lead");
    ok(seg_is(&s[1], "doc one", HP_SEG_PIC), "s1 is a PIC segment");
    ok(seg_is(&s[2], "doc two", HP_SEG_PIC), "s2 is a PIC segment");
    ok(seg_is(&s[3], "question?", HP_SEG_QUERY), "sn is the query");

    n = split("no separator here", s, 8);
    ok(n == 1 && seg_is(&s[0], "no separator here", HP_SEG_QUERY),
       "a prompt without separator is one query segment");

    n = split(SEP "warm me" SEP, s, 8);
    ok(n == 3 && seg_is(&s[0], "", HP_SEG_LEAD) &&
           seg_is(&s[1], "warm me", HP_SEG_PIC) &&
           seg_is(&s[2], "", HP_SEG_QUERY),
       "warm-up form SEP s SEP gives empty lead and query");

    n = split("a" SEP "b" SEP "c", s, 2);
    ok(n == -1, "more segments than room is refused");

    n = split("a<|pic_se" SEP "b", s, 8);
    ok(n == 2 && seg_is(&s[0], "a<|pic_se", HP_SEG_LEAD),
       "a partial separator is text");

    uint8_t fp1[16] = {1}, fp2[16] = {2}, a[16], b[16], c[16], d[16];
    hp_seg_id(a, fp1, HP_SEG_PIC, "doc", 3);
    hp_seg_id(b, fp1, HP_SEG_PIC, "doc", 3);
    hp_seg_id(c, fp2, HP_SEG_PIC, "doc", 3);
    hp_seg_id(d, fp1, HP_SEG_LEAD, "doc", 3);
    ok(!memcmp(a, b, 16), "same model, role and bytes: same id");
    ok(memcmp(a, c, 16) != 0, "another model fingerprint: another id");
    ok(memcmp(a, d, 16) != 0, "another role: another id");

    char hex[33];
    hp_seg_id_hex(hex, a);
    ok(strlen(hex) == 32 && strspn(hex, "0123456789abcdef") == 32,
       "id written as 32 hex digits (%s)", hex);
    return tap_done();
}
