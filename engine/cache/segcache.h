/*
 * segcache.h - what the pools keep for a segment, and how it is made
 * (DESIGN §4, HYPIC §4.2-4.3). Two layouts in one arena block:
 *
 *   STATE  the running state after a prefill from position 0: per linear
 *          layer S [Hv,dk,dv] and conv [conv_dim,Kc-1]; per full layer K,V
 *          [n_tok,Hkv,hd]. Used for the leading segment (cached in full as
 *          a prefix), for `naive` segments (S_C|0 over the whole segment)
 *          and for the private pool (a session's state).
 *   PIC    a segment's tuple over its interior (C minus the first and last
 *          w tokens), from one prefill of the segment on its own: per
 *          linear layer T_C [Hv,dk,dk], S_C|0 [Hv,dk,dv] and the conv tail
 *          (raw conv inputs ending at the interior's end); per full layer
 *          the interior K at segment-local positions and V [n_int,Hkv,hd].
 *
 * All f32: a bf16 T_C loses ~1e-3 per composition (pic-kvbuffer-math §3).
 *
 * An entry is a pool entry (pool.h) of the model's backend memory: on a
 * device the tuples stay there, so a splice composes and copies on the
 * device and a capture never brings a tensor to the host. Its header is
 * host memory (the entry's meta); the data's first 64 bytes are the
 * header's slot in the wire format (peer.h), written where the data is
 * host memory and otherwise left: a sender takes the header from meta.
 */
#ifndef HP_SEGCACHE_H
#define HP_SEGCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/cache/pool.h"
#include "engine/contract/hp_error.h"
#include "engine/forward/forward.h"
#include "engine/forward/seq.h"
#include "engine/model/model.h"

#define HP_SEGC_MAGIC 0x48505343u /* "HPSC" */

typedef enum { HP_SEGC_STATE = 1, HP_SEGC_PIC = 2 } hp_segc_kind_t;

typedef struct {
    uint32_t magic;
    uint32_t kind;   /* hp_segc_kind_t */
    int32_t n_tok;   /* tokens of the segment (STATE: of the state) */
    int32_t w;       /* seam width (PIC) */
    int32_t n_int;   /* interior tokens (PIC: n_tok - 2w; STATE: n_tok) */
    int32_t pad[11]; /* header is 64 bytes: data stays 64-byte aligned */
} hp_segc_hdr_t;

/* Bytes of an entry of the given kind for a segment of n_tok tokens. */
size_t hp_segc_bytes(const hp_model_config_t *c, hp_segc_kind_t kind, int n_tok,
                     int w);

/* The entry's header (host memory). */
const hp_segc_hdr_t *hp_segc_hdr(const hp_pool_entry_t *e);

/* Views into an entry's data, backend memory (NULL where the layer has no
 * such tensor). */
float *hp_segc_T(const hp_model_config_t *c, const hp_pool_entry_t *e,
                 int layer);
float *hp_segc_S(const hp_model_config_t *c, const hp_pool_entry_t *e,
                 int layer);
float *hp_segc_conv(const hp_model_config_t *c, const hp_pool_entry_t *e,
                    int layer);
float *hp_segc_K(const hp_model_config_t *c, const hp_pool_entry_t *e,
                 int layer);
float *hp_segc_V(const hp_model_config_t *c, const hp_pool_entry_t *e,
                 int layer);

/* A public pool of budget bytes in be's memory: a lazily touched mapping
 * on the CPU, one device allocation now on a device. NULL with HP_ENOMEM
 * naming the budget. */
hp_pool_t *hp_segc_pool_create(const hp_backend_t *be, size_t budget,
                               hp_error_t *err);

/* An entry whose bytes arrived in host memory (a peer's payload, checked;
 * e's data, or a copy on its way to a device): the header at their front
 * becomes e's meta. */
void hp_segc_adopt(hp_pool_entry_t *e, const void *bytes);

/* STATE entry <-> sequence. capture: e must be sized for seq->n_pos
 * tokens. load: seq is reset and gets the state at positions [0, n_tok). */
void hp_segc_capture_state(hp_pool_entry_t *e, const hp_seq_t *seq);
int hp_segc_load_state(hp_seq_t *seq, const hp_pool_entry_t *e,
                       hp_error_t *err);

/* Prefills ids[n] on their own from position 0 and writes a STATE entry
 * into e (sized by hp_segc_bytes(STATE, n)). Both builds run in
 * ws->build_seq when it is set (forward.h; it needs room for n
 * positions), else in a sequence made for the build. */
int hp_segc_build_state(hp_pool_entry_t *e, const hp_model_t *m,
                        hp_fwd_ws_t *ws, const int *ids, int n,
                        hp_error_t *err);

/* Prefills ids[n] on their own from position 0 (only the first n - w
 * tokens: the last w never influence the interior) and writes the PIC
 * tuple of the interior [w, n - w) into e. T_C comes from the same chunked
 * pass (hk_gdn_chunk), and S_C|0 = S_end - T_C S_head. Needs n > 2w. */
int hp_segc_build_pic(hp_pool_entry_t *e, const hp_model_t *m, hp_fwd_ws_t *ws,
                      const int *ids, int n, int w, hp_error_t *err);

/* After jumping over n_int interior tokens, the conv history [C, Kc-1]
 * becomes the cached tail (both backend memory); an interior shorter than
 * Kc-1 keeps the front of the running history (shifted). */
void hp_segc_conv_jump(const hp_backend_t *be, float *conv, const float *tail,
                       int n_int, int C, int Kc);

#endif
