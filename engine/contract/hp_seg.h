/*
 * hp_seg.h - the segment contract shared by the nginx module and the
 * engine (DESIGN §3): splitting a prompt on the separator and naming each
 * segment by a 128-bit id. Compiled into both sides from this one source;
 * plain C with no dependency but libxxhash.
 */
#ifndef HP_SEG_H
#define HP_SEG_H

#include <stddef.h>
#include <stdint.h>

#define HP_SEG_DEFAULT_SEPARATOR "<|pic_sep|>"
#define HP_SEG_ID_HEX_LEN        32

typedef enum {
    HP_SEG_LEAD = 0, /* s0: cached as a prefix at position 0, in full */
    HP_SEG_PIC = 1,  /* s1 .. s(n-1): cached position-independently */
    HP_SEG_QUERY = 2 /* sn (or a prompt without separator): recomputed */
} hp_seg_role_t;

typedef struct {
    const char *data; /* into the prompt, not NUL-terminated */
    size_t len;
    hp_seg_role_t role;
} hp_seg_t;

/*
 * Splits prompt[len] on sep: "s0 SEP s1 ... SEP sn" gives n+1 segments
 * (s0 LEAD, s1..s(n-1) PIC, sn QUERY); a prompt without the separator is
 * one QUERY segment. Segments may be empty. Returns the number of segments,
 * or -1 if there would be more than max (nothing is then promised in out).
 */
int hp_seg_split(hp_seg_t *out, int max, const char *prompt, size_t len,
                 const char *sep, size_t sep_len);

/* id = XXH3-128(fingerprint[16] ++ role byte ++ data), big-endian bytes. */
void hp_seg_id(uint8_t id[16], const uint8_t fingerprint[16],
               hp_seg_role_t role, const char *data, size_t len);

/* 32 lowercase hex digits and a NUL. */
void hp_seg_id_hex(char out[HP_SEG_ID_HEX_LEN + 1], const uint8_t id[16]);

#endif
