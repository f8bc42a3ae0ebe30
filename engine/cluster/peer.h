/*
 * peer.h - the peer transport between engines (DESIGN §7, HYPIC §4.4): an
 * engine pulls a segment's public-pool entry from the node that holds it,
 * or asks a peer to prefill a segment for it (a remote prefill worker).
 * TCP always (peer_tcp.c); RDMA verbs only as a probe (peer_verbs.c).
 *
 * Wire format, version 1, every integer little-endian. A message is a
 * 32-byte header and a payload:
 *
 *   off  0  u32  magic "HPPR"
 *        4  u16  version (1)
 *        6  u16  type (hp_peer_type_t)
 *        8  u64  payload length (bounded by the receiver's max_payload)
 *       16  u64  XXH3-64 of the payload
 *       24  u64  XXH3-64 of header bytes [0, 24)
 *
 *   GET_SEGMENT  key[16] variant:u32 0:u32                       24 bytes
 *   NOT_FOUND    key[16] variant:u32 0:u32                       24 bytes
 *   SEGMENT      key[16] variant:u32 0:u32 bytes:u64 entry[bytes]
 *   PREFILL      key[16] variant:u32 kind:u32 seam:i32 n:u32 ids:u32[n]
 *   ERROR        code:i32 0:u32 message[length - 8] (UTF-8, no NUL)
 *
 * The header checksum is checked before the length is trusted, so a
 * corrupt length never allocates. An entry is the pool's bytes as they are
 * (segcache.h layout, f32 in host order: peers are assumed to share byte
 * order and model), its header from the entry's meta; a device's entries
 * go through host memory on either side. A received entry is checked
 * against the local model's layout before it is published. A request gets
 * exactly one reply; a connection carries one exchange after another until
 * either side closes.
 */
#ifndef HP_PEER_H
#define HP_PEER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/cache/pool.h"
#include "engine/contract/hp_error.h"
#include "engine/contract/hp_log.h"
#include "engine/model/llm.h"
#include "engine/model/model.h"

#define HP_PEER_MAGIC        0x52505048u /* "HPPR" as bytes */
#define HP_PEER_VERSION      1
#define HP_PEER_HDR_BYTES    32
#define HP_PEER_MAX_PAYLOAD  (1ull << 31) /* default receive bound */
#define HP_PEER_NOT_FOUND_RC 1            /* hp_peer_fetch: peer lacks it */

typedef enum {
    HP_PEER_GET_SEGMENT = 1,
    HP_PEER_SEGMENT = 2,
    HP_PEER_NOT_FOUND = 3,
    HP_PEER_PREFILL = 4,
    HP_PEER_ERROR = 5
} hp_peer_type_t;

/* Entry kinds a PREFILL asks for (segcache.h's hp_segc_kind_t values). */
#define HP_PEER_KIND_STATE 1
#define HP_PEER_KIND_PIC   2

typedef struct {
    uint32_t magic;
    uint16_t version, type;
    uint64_t length, payload_sum, header_sum;
} hp_peer_hdr_t;

/* A parsed message; pointers point into the payload it came from. */
typedef struct {
    int type;
    uint8_t key[16];
    uint32_t variant;
    uint32_t kind;       /* PREFILL */
    int32_t seam;        /* PREFILL */
    uint32_t n_tok;      /* PREFILL */
    const uint8_t *ids;  /* PREFILL: n_tok u32 */
    uint64_t bytes;      /* SEGMENT */
    const uint8_t *data; /* SEGMENT */
    int32_t code;        /* ERROR */
    const char *msg;     /* ERROR, msg_len bytes, not NUL-terminated */
    size_t msg_len;
} hp_peer_msg_t;

/* ---- wire format (peer.c): pure functions, no I/O ---------------------- */

/* Writes the header of a message of `type` whose payload is the
 * concatenation of parts[n] (lengths lens[n]). */
void hp_peer_hdr_encode(uint8_t out[HP_PEER_HDR_BYTES], int type,
                        const void *const *parts, const size_t *lens, int n);

/* Validates a received header: magic, header checksum, version, known
 * type, length <= max_payload (0: HP_PEER_MAX_PAYLOAD). HP_OK, HP_ETOOLARGE
 * (length over the bound), HP_EBADINPUT (everything else). */
int hp_peer_hdr_decode(hp_peer_hdr_t *h, const uint8_t in[HP_PEER_HDR_BYTES],
                       uint64_t max_payload, hp_error_t *err);

/* Checks the payload checksum and the payload's structure for h->type and
 * fills m. HP_OK or HP_EBADINPUT. */
int hp_peer_msg_parse(hp_peer_msg_t *m, const hp_peer_hdr_t *h,
                      const uint8_t *payload, hp_error_t *err);

/* Encoders: the payload (fixed part) of each request or reply into buf,
 * returning its length. SEGMENT's prefix is 32 bytes (the entry follows). */
size_t hp_peer_enc_key(uint8_t buf[24], const uint8_t key[16],
                       uint32_t variant);
size_t hp_peer_enc_segment(uint8_t buf[32], const uint8_t key[16],
                           uint32_t variant, uint64_t bytes);
size_t hp_peer_enc_prefill(uint8_t buf[32], const uint8_t key[16],
                           uint32_t variant, int kind, int seam, int n_tok);

/* Whether entry[bytes] can be published as (variant) for a model of
 * config c: a segcache header of the kind the variant implies, counts
 * that agree, and the size hp_segc_bytes gives. HP_OK or HP_EBADINPUT. */
int hp_peer_check_entry(const hp_model_config_t *c, uint32_t variant,
                        const void *entry, uint64_t bytes, hp_error_t *err);

/* ---- TCP (peer_tcp.c) -------------------------------------------------- */

typedef struct hp_peer_server hp_peer_server_t;

typedef struct {
    const char *listen;   /* "host:port" ("[::1]:0"); port 0: any free */
    hp_pool_t *pub;       /* segments are served from here */
    const hp_llm_t *llm;  /* for PREFILL (NULL: refused with ERROR) */
    uint64_t max_payload; /* largest request accepted (0: 16 MiB) */
    int io_timeout_ms;    /* a stalled connection is dropped (0: 5000) */
    int max_conns;        /* served at once; more wait (0: 16) */
    int threads;          /* OpenMP threads of a PREFILL (0: 1) */
    int max_segment;      /* on a device: the longest PREFILL (0: 4096);
                             its builder is taken at start */
    hp_log_fn log;        /* may be NULL */
    void *log_ud;
} hp_peer_server_cfg_t;

typedef struct {
    uint64_t conns;    /* accepted */
    uint64_t requests; /* well-formed requests */
    uint64_t served;   /* SEGMENT replies */
    uint64_t not_found;
    uint64_t prefills; /* PREFILLs computed */
    uint64_t rejected; /* malformed messages (connection then closed) */
} hp_peer_server_stats_t;

/* Binds, listens and starts the listener thread. HP_EBADINPUT (address),
 * HP_EIO (bind/listen: err names the address), HP_ENOMEM. */
hp_peer_server_t *hp_peer_server_start(const hp_peer_server_cfg_t *cfg,
                                       hp_error_t *err);
/* The bound port (useful after port 0). */
int hp_peer_server_port(const hp_peer_server_t *s);
void hp_peer_server_stats(hp_peer_server_t *s, hp_peer_server_stats_t *st);
/* Closes the listener and every connection, joins the threads, frees. */
void hp_peer_server_stop(hp_peer_server_t *s);

/*
 * Pulls (key, variant) from the peer at addr ("host:port") within
 * timeout_ms in all (connect, request, reply), checks it against the local
 * model m and publishes it into pool, which is in m's backend memory (a
 * device's: the payload goes up under hp_backend_lock). If out != NULL the
 * entry is returned with a reference the caller releases. Returns HP_OK,
 * HP_PEER_NOT_FOUND_RC (the peer does not hold it), HP_EUNAVAIL (refused,
 * unreachable, closed early, or the peer answered ERROR), HP_ETIMEOUT,
 * HP_EBADINPUT (a malformed or inconsistent reply: bad checksum, another
 * segment, an entry that does not fit m), HP_ENOMEM (no room in pool).
 * Nothing is published unless HP_OK. m may be NULL (no layout check, a
 * host pool: only for tests).
 */
int hp_peer_fetch(const char *addr, const uint8_t key[16], uint32_t variant,
                  hp_pool_t *pool, const hp_model_t *m, int timeout_ms,
                  hp_pool_entry_t **out, hp_error_t *err);

/*
 * Asks the peer to prefill ids[n] on their own as a segment of `kind`
 * (HP_PEER_KIND_STATE or _PIC at seam) under (key, variant): the peer
 * publishes it in its own pool and sends it back, and it is published
 * into pool here as by hp_peer_fetch. Same returns (no NOT_FOUND).
 */
int hp_peer_prefill(const char *addr, const uint8_t key[16], uint32_t variant,
                    int kind, int seam, const int *ids, int n, hp_pool_t *pool,
                    const hp_model_t *m, int timeout_ms, hp_pool_entry_t **out,
                    hp_error_t *err);

/* ---- RDMA verbs (peer_verbs.c) ----------------------------------------- */

/* Looks for RDMA devices through libibverbs (loaded at run time). Returns
 * the number found (> 0), or HP_EUNAVAIL with err saying why: built
 * without <infiniband/verbs.h>, libibverbs absent, or no devices. The
 * verbs transport itself is not implemented: this is a probe only. */
int hp_peer_verbs_probe(hp_error_t *err);

#endif
