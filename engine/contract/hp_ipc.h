/*
 * hp_ipc.h - the request interface between the nginx module and the
 * engine (DESIGN §7): one shared-memory segment with a slot per request,
 * plus a unix socket for wake-ups. Compiled into both sides from this one
 * source (engine/contract/hp_ipc.c); plain C11 with <stdatomic.h> and nothing
 * else, so it builds under nginx's flags and the engine's alike.
 *
 * Processes and roles
 *
 *   The engine creates the segment (POSIX shm, name from its config, e.g.
 *   /hypic-<node>), listens on a unix socket, and on every accepted
 *   connection sends an hp_ipc_hello_t carrying the segment's file
 *   descriptor (SCM_RIGHTS), the engine generation and the connection id.
 *   An nginx worker keeps one such connection per engine and maps the
 *   segment from the fd it received, so it never needs the name and two
 *   engine instances can never be confused: a restarted engine creates a
 *   fresh segment, old mappings stay valid until nginx drops them.
 *
 * The segment
 *
 *   [hp_ipc_header_t][slot 0][slot 1]...  each slot (slot_stride bytes) is
 *   [hp_ipc_slot_t][input area: input_bytes][output ring: ring_bytes].
 *   The header carries magic, version, the struct sizes (checked by the
 *   reader against its own, and _Static_assert'ed here), the generation
 *   (incremented at every engine start), the node and model names, the
 *   model fingerprint (the one hp_seg_id() takes: nginx names segments in
 *   the Redis index exactly as the engine does) and the health/load
 *   counters: health (ok, draining), running and queued requests, the
 *   cache pools' gauges, and a heartbeat that the engine's main loop
 *   writes every HP_IPC_HEARTBEAT_MS; nginx compares it with its own
 *   clock (hp_ipc_now_ms) to tell a stalled engine (SIGSTOP, a hung
 *   loop) from a slow one. The slot table is fixed: when every slot is
 *   taken nginx answers 429; nothing ever grows.
 *
 * A slot's life (the state is the low byte of slot->word; the word also
 *   holds the owner's connection id and a claim sequence, so one CAS
 *   moves state and ownership together and a stale CAS always fails):
 *
 *   FREE --nginx claim--> CLAIMED --nginx submit--> SUBMITTED
 *        --engine take--> RUNNING --engine finish--> DONE --release--> FREE
 *
 *   nginx writes the request (hp_ipc_request_t + the prompt text in the
 *   input area) while CLAIMED and never touches it again; the engine reads
 *   it after taking the slot. The engine then streams records into the
 *   slot's output ring: START (prompt accepted, prefill begins), TEXT
 *   (UTF-8 pieces of one choice, whole characters, stop strings already
 *   applied), with logprobs asked for a TOKEN per generated token before
 *   the TEXT its text starts in, an END per choice once its text is out
 *   (its finish reason), and one FINAL (finish reason, usage, TTFT, or an
 *   error code and message). A request of n choices prefills once and
 *   interleaves its choices' records, each under the choice's index.
 *   Release is one protocol for both ends: whoever is done sets `cancel`
 *   and then frees the slot if it is not RUNNING; an engine that finishes
 *   a RUNNING slot whose cancel flag is set frees it itself. So nginx
 *   releases after reading FINAL, or at any time to cancel (client gone,
 *   timeout), and the engine reclaims the slots of a connection that
 *   closed (worker crash or exit) the same way. No cross-process locks:
 *   the slot word is CAS'ed, the ring is single-producer single-consumer
 *   with acquire/release counters.
 *
 * Wake-ups: a single byte on the socket, both ways. nginx writes one after
 *   submitting, cancelling, or draining a ring the engine is waiting on
 *   (slot->waiting); the engine writes one to a connection whose slots got
 *   new records. Neither side polls: nginx has the socket in its event
 *   loop, the engine blocks in poll(2).
 */
#ifndef HP_IPC_H
#define HP_IPC_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define HP_IPC_MAGIC 0x43495048u /* "HPIC" little-endian */
#define HP_IPC_VERSION                                                         \
    8u /* 5: chat bodies; 6: choices and logprobs;                             \
          7: structured output (grammar_len); 8: the sequence pool's           \
          gauges and the device in the header */

#define HP_IPC_MAX_STOP    4  /* stop strings per request (OpenAI's 4) */
#define HP_IPC_STOP_BYTES  64 /* each, at most */
#define HP_IPC_SEP_BYTES   64 /* separator, at most (no NUL needed) */
#define HP_IPC_ID_BYTES    64 /* request id, NUL-terminated */
#define HP_IPC_NAME_BYTES  64
#define HP_IPC_MODEL_BYTES 128

#define HP_IPC_MAX_CHOICES  16  /* n, choices per request */
#define HP_IPC_MAX_LOGPROBS 20  /* alternatives per token (OpenAI's 20) */
#define HP_IPC_TOKEN_BYTES  256 /* most bytes of a token in a TOKEN record */

#define HP_IPC_TEXT_MAX   2048 /* largest text in a TEXT record */
#define HP_IPC_REC_HEADER 8    /* u32 type, u32 length; records 8-aligned */
/* A reader's buffer of this size holds any record (a TOKEN of 21
 * entries of HP_IPC_TOKEN_BYTES is the largest). */
#define HP_IPC_RECORD_MAX 6144
/* Room always kept free for START and FINAL by TEXT writers. */
#define HP_IPC_RING_RESERVE 1024
#define HP_IPC_RING_MIN     (4 * HP_IPC_TEXT_MAX)

/* slot states (low 8 bits of slot->word) */
enum {
    HP_IPC_FREE = 0,
    HP_IPC_CLAIMED = 1,
    HP_IPC_SUBMITTED = 2,
    HP_IPC_RUNNING = 3,
    HP_IPC_DONE = 4
};

/* record types */
enum {
    HP_IPC_REC_START = 1,
    HP_IPC_REC_TEXT = 2, /* hp_ipc_text_t, then the text */
    HP_IPC_REC_FINAL = 3,
    HP_IPC_REC_TOKEN = 4, /* hp_ipc_token_t, then its entries */
    HP_IPC_REC_END = 5    /* hp_ipc_end_t */
};

/* prefill modes (DESIGN §4): the one enum of the module, the engine and
 * the assembler; a request asks for one, the engine reports the one it
 * ran */
typedef enum {
    HP_IPC_MODE_FULL = 0,
    HP_IPC_MODE_PREFIX = 1,
    HP_IPC_MODE_NAIVE = 2,
    HP_IPC_MODE_PIC = 3
} hp_ipc_mode_t;

enum { HP_IPC_EP_COMPLETIONS = 0, HP_IPC_EP_CHAT = 1 };

/* decode forms (DESIGN §5): asked for in a request (SERVER: the engine's
 * setting), reported in START and FINAL (KVONLY: what auto ran) */
enum {
    HP_IPC_DECODE_SERVER = 0,
    HP_IPC_DECODE_RECURRENT = 1,
    HP_IPC_DECODE_CHUNKWISE = 2,
    HP_IPC_DECODE_AUTO = 3,
    HP_IPC_DECODE_KVONLY = 4
};

/* speculative decoding asked for: the engine's setting, on, off */
enum { HP_IPC_SPEC_SERVER = 0, HP_IPC_SPEC_ON = 1, HP_IPC_SPEC_OFF = 2 };
#define HP_IPC_MAX_DRAFT 16 /* most drafted tokens per pass a request asks */

/* finish reasons in FINAL */
enum {
    HP_IPC_FINISH_LENGTH = 0, /* max_tokens (or the context) reached */
    HP_IPC_FINISH_STOP = 1,   /* stop token or stop string */
    HP_IPC_FINISH_CANCEL = 2, /* cancelled (never seen by a reader) */
    HP_IPC_FINISH_ERROR = 3   /* see status, code, message */
};

enum { HP_IPC_HEALTH_OK = 1, HP_IPC_HEALTH_DRAINING = 2 };

/* The engine's main loop writes heartbeat_ms at least this often; a
 * reader's stall threshold must be well above it. */
#define HP_IPC_HEARTBEAT_MS 250

/* The cache pools whose gauges the header carries (DESIGN §4): the
 * public one holds segments, the private one the prefix cache. */
/* The pools whose gauges the header carries: the segment tuples, the
 * prefix cache, and the sequences of the requests in flight (their linear
 * states and K/V: what vLLM calls the KV cache). */
enum {
    HP_IPC_POOL_PUBLIC = 0,
    HP_IPC_POOL_PRIVATE = 1,
    HP_IPC_POOL_SEQUENCE = 2,
    HP_IPC_POOLS = 3
};

#define HP_IPC_FLAG_IGNORE_EOS 1u
/* The input area holds the OpenAI chat request body (JSON), not a
 * prompt: the engine renders it with the model's chat template, then
 * splits the prompt on the separator as any other. */
#define HP_IPC_FLAG_CHAT 2u

/* slot->word: claim sequence (32) | owner connection id (24) | state (8) */
#define HP_IPC_WORD(seq, owner, state)                                         \
    (((uint64_t)(uint32_t)(seq) << 32) |                                       \
     (((uint64_t)(owner)&0xffffffu) << 8) | (uint64_t)(state))
#define HP_IPC_STATE(w)  ((uint32_t)((w)&0xffu))
#define HP_IPC_OWNER(w)  ((uint32_t)(((w) >> 8) & 0xffffffu))
#define HP_IPC_SEQ(w)    ((uint32_t)((w) >> 32))
#define HP_IPC_OWNER_MAX 0xffffffu

/* What nginx asks for; written while the slot is CLAIMED. */
typedef struct {
    char id[HP_IPC_ID_BYTES]; /* "cmpl-..." for the engine's log */
    uint32_t endpoint;        /* HP_IPC_EP_* (informational) */
    uint32_t mode;            /* HP_IPC_MODE_* asked for */
    uint32_t max_tokens;      /* 0: prefill only (warm-up) */
    uint32_t prompt_len;      /* bytes in the input area (prompt, or
                                 the chat body: HP_IPC_FLAG_CHAT) */
    float temperature;        /* 0: greedy */
    float top_p;              /* 1: off */
    int32_t top_k;            /* 0: off */
    uint32_t seam;            /* seam width w (pic mode) */
    uint64_t seed;
    uint32_t flags;  /* HP_IPC_FLAG_* */
    uint32_t n_stop; /* stop strings used */
    uint32_t stop_len[HP_IPC_MAX_STOP];
    char stop[HP_IPC_MAX_STOP][HP_IPC_STOP_BYTES];
    uint32_t sep_len; /* 0: do not split */
    uint32_t n;       /* choices, 1..HP_IPC_MAX_CHOICES (0: one) */
    char separator[HP_IPC_SEP_BYTES];
    uint32_t decode;      /* HP_IPC_DECODE_* asked for */
    uint32_t speculative; /* HP_IPC_SPEC_* */
    uint32_t max_draft;   /* 1..HP_IPC_MAX_DRAFT; 0: the engine's */
    /* 0: no log-probabilities; else 1 + the alternatives per token
     * (0..HP_IPC_MAX_LOGPROBS): TOKEN records */
    uint32_t logprobs;
    /* structured output: 0, or the bytes after the prompt in the input
     * area holding the constraint, a JSON object of the request's
     * response_format, tools, tool_choice and parallel_tool_calls
     * (engine/contract/hp_grammar.h, which both sides compile it with) */
    uint32_t grammar_len;
    uint32_t reserved;
} hp_ipc_request_t;

/* START record: the prompt is accepted and its prefill begins. */
typedef struct {
    uint32_t prompt_tokens;
    uint32_t cached_tokens;
    uint32_t mode; /* the mode the engine runs */
    uint32_t segs_hit;
    uint32_t segs_total;
    uint32_t decode;   /* HP_IPC_DECODE_* the engine runs */
    uint64_t queue_us; /* from take to admission */
} hp_ipc_start_t;

/* FINAL record: the last one of a request. */
typedef struct {
    int32_t status;  /* 0, or an hp_status_t (engine/contract/hp_error.h) */
    uint32_t finish; /* HP_IPC_FINISH_* */
    uint32_t prompt_tokens;
    uint32_t completion_tokens;
    uint32_t cached_tokens;
    uint32_t mode;
    uint32_t segs_hit;
    uint32_t segs_total;
    uint64_t ttft_us;  /* take to first token */
    uint64_t total_us; /* take to FINAL */
    char code[32];     /* error code for the client, "" if none */
    char message[256]; /* error message, NUL-terminated */
    uint32_t decode;   /* HP_IPC_DECODE_* that ran */
    /* speculative decoding: tokens drafted, and of those accepted (they
     * are part of completion_tokens) */
    uint32_t draft_tokens;
    uint32_t accepted_tokens;
    /* of cached_tokens: pulled from peers that held them (peer fetch) */
    uint32_t fetched_tokens;
} hp_ipc_final_t;

/* TEXT record: this header, then the text of choice `choice`. */
typedef struct {
    uint32_t choice;
    uint32_t reserved;
} hp_ipc_text_t;

/*
 * TOKEN record: one generated token of choice `choice`, then 1 + n_top
 * entries (hp_ipc_token_add / hp_ipc_token_next): the token itself, then
 * the likeliest tokens by falling log-probability. Log-probabilities are
 * the model's (log-softmax of the raw logits).
 */
typedef struct {
    uint32_t choice;
    uint32_t text_offset; /* characters of the choice's text before it */
    uint32_t n_top;
    uint32_t reserved;
} hp_ipc_token_t;

/* END record: choice `choice` ended, all its text sent. */
typedef struct {
    uint32_t choice;
    uint32_t finish; /* HP_IPC_FINISH_LENGTH or _STOP */
    uint32_t completion_tokens;
    uint32_t reserved;
} hp_ipc_end_t;

/* Sent by the engine on every accepted connection, with the segment's fd
 * as SCM_RIGHTS ancillary data on the same message. */
typedef struct {
    uint32_t magic;
    uint32_t version;
    uint64_t generation;
    uint64_t shm_bytes;
    uint32_t conn_id; /* the owner id this connection claims slots with */
    int32_t engine_pid;
    char shm_name[HP_IPC_NAME_BYTES];
} hp_ipc_hello_t;

/* One pool's gauges, written by the engine after scheduler steps. */
typedef struct {
    _Atomic uint64_t bytes_used;
    _Atomic uint64_t budget;
    _Atomic uint64_t entries;   /* public: segments; private: tree nodes;
                                   sequence: sequences held */
    _Atomic uint64_t evictions; /* since the engine started (sequence:
                                   requests preempted for room) */
} hp_ipc_pool_gauges_t;

typedef struct {
    uint32_t magic;
    uint32_t version;
    uint32_t header_bytes; /* sizeof(hp_ipc_header_t) */
    uint32_t slot_bytes;   /* sizeof(hp_ipc_slot_t) */
    uint64_t generation;
    uint64_t total_bytes;
    uint32_t n_slots;
    uint32_t input_bytes; /* per slot, multiple of 64 */
    uint32_t ring_bytes;  /* per slot, power of two */
    uint32_t slot_stride;
    int32_t engine_pid;
    uint32_t reserved0;
    char node[HP_IPC_NAME_BYTES];
    char model[HP_IPC_MODEL_BYTES];
    /* written by the engine, read by anyone */
    _Atomic uint32_t health; /* HP_IPC_HEALTH_* */
    _Atomic uint32_t running;
    _Atomic uint32_t queued;
    uint32_t reserved1;
    _Atomic uint64_t served;
    /* FIFO admission: nginx takes a ticket at submit */
    _Atomic uint64_t submit_seq;
    /* XXH3-128 of config.json ++ tokenizer.json (engine/model/model.c), as
     * hp_seg_id() takes it; all zero: not published */
    uint8_t fingerprint[16];
    /* hp_ipc_now_ms() of the main loop's last turn */
    _Atomic uint64_t heartbeat_ms;
    hp_ipc_pool_gauges_t pools[HP_IPC_POOLS]; /* [HP_IPC_POOL_*] */
    /* where the model runs: the backend ("cpu", "cuda:0") and the device's
     * own name ("" for the CPU), NUL-terminated; for /metrics only */
    char device[32];
    char device_name[HP_IPC_NAME_BYTES];
    uint8_t reserved2[512 - 496];
} hp_ipc_header_t;

typedef struct {
    _Atomic uint64_t word;    /* see HP_IPC_WORD */
    _Atomic uint32_t cancel;  /* set by whoever is done with the slot */
    _Atomic uint32_t waiting; /* engine waits for ring space */
    int32_t owner_pid;        /* claimer's pid, for the dead-owner sweep */
    uint32_t reserved;
    uint64_t ticket; /* submit order */
    hp_ipc_request_t req;
    alignas(64) _Atomic uint64_t head; /* ring bytes written (engine) */
    alignas(64) _Atomic uint64_t tail; /* ring bytes read (nginx) */
} hp_ipc_slot_t;

/* The layout is the contract: any change here is a version bump. */
_Static_assert(sizeof(hp_ipc_request_t) == 480, "hp_ipc_request_t layout");
_Static_assert(offsetof(hp_ipc_request_t, flags) == 104 &&
                   offsetof(hp_ipc_request_t, n) == 388 &&
                   offsetof(hp_ipc_request_t, logprobs) == 468 &&
                   offsetof(hp_ipc_request_t, grammar_len) == 472,
               "hp_ipc_request_t layout");
_Static_assert(sizeof(hp_ipc_text_t) == 8 && sizeof(hp_ipc_token_t) == 16 &&
                   sizeof(hp_ipc_end_t) == 16,
               "TEXT, TOKEN and END record layouts");
_Static_assert(HP_IPC_VERSION == 8u,
               "the layouts above are version 8's: bump both together");
_Static_assert(sizeof(hp_ipc_start_t) == 32, "hp_ipc_start_t layout");
_Static_assert(sizeof(hp_ipc_final_t) == 352, "hp_ipc_final_t layout");
_Static_assert(sizeof(hp_ipc_hello_t) == 96, "hp_ipc_hello_t layout");
_Static_assert(sizeof(hp_ipc_header_t) == 512, "hp_ipc_header_t layout");
_Static_assert(offsetof(hp_ipc_header_t, health) == 248,
               "hp_ipc_header_t layout");
_Static_assert(offsetof(hp_ipc_header_t, fingerprint) == 280,
               "hp_ipc_header_t layout");
_Static_assert(offsetof(hp_ipc_header_t, heartbeat_ms) == 296 &&
                   offsetof(hp_ipc_header_t, pools) == 304 &&
                   offsetof(hp_ipc_header_t, device) == 400 &&
                   offsetof(hp_ipc_header_t, device_name) == 432,
               "hp_ipc_header_t layout");
_Static_assert(sizeof(hp_ipc_pool_gauges_t) == 32,
               "hp_ipc_pool_gauges_t layout");
_Static_assert(sizeof(hp_ipc_slot_t) == 640, "hp_ipc_slot_t layout");
_Static_assert(offsetof(hp_ipc_slot_t, req) + sizeof(hp_ipc_request_t) <=
                   offsetof(hp_ipc_slot_t, head),
               "the request stays before the ring counters");
_Static_assert(sizeof(hp_ipc_final_t) + HP_IPC_REC_HEADER <=
                   HP_IPC_RING_RESERVE / 2,
               "FINAL fits the reserve");
_Static_assert(sizeof(hp_ipc_token_t) +
                       (1 + HP_IPC_MAX_LOGPROBS) * (8 + HP_IPC_TOKEN_BYTES) <=
                   HP_IPC_RECORD_MAX,
               "the largest TOKEN fits a record");
_Static_assert(sizeof(hp_ipc_text_t) + HP_IPC_TEXT_MAX <= HP_IPC_RECORD_MAX,
               "the largest TEXT fits a record");
_Static_assert(HP_IPC_RECORD_MAX + HP_IPC_REC_HEADER + HP_IPC_RING_RESERVE <=
                   HP_IPC_RING_MIN,
               "any record fits the smallest ring");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "shared-memory atomics must be lock-free");

/* ---- layout --------------------------------------------------------- */

/* The stride of one slot and the bytes of a whole segment. */
uint32_t hp_ipc_slot_stride(uint32_t input_bytes, uint32_t ring_bytes);
uint64_t hp_ipc_segment_bytes(uint32_t n_slots, uint32_t input_bytes,
                              uint32_t ring_bytes);

/*
 * Writes a fresh header and n_slots FREE slots into base (zeroed memory of
 * hp_ipc_segment_bytes() bytes). input_bytes must be a multiple of 64,
 * ring_bytes a power of two >= HP_IPC_RING_MIN (checked: -1 otherwise).
 */
int hp_ipc_format(void *base, uint32_t n_slots, uint32_t input_bytes,
                  uint32_t ring_bytes, uint64_t generation, int32_t pid,
                  const char *node, const char *model);

/*
 * Checks a mapped segment of `size` bytes: magic, version, struct sizes,
 * geometry. Returns NULL if usable, else a static message saying why.
 */
const char *hp_ipc_check(const void *base, uint64_t size);

hp_ipc_slot_t *hp_ipc_slot(hp_ipc_header_t *h, uint32_t i);

/* ---- liveness ------------------------------------------------------- */

/* The heartbeat's clock: CLOCK_MONOTONIC in ms, one per machine, so the
 * engine and nginx read the same time. */
uint64_t hp_ipc_now_ms(void);

/* The engine's main loop: a heartbeat at now_ms. */
void hp_ipc_beat(hp_ipc_header_t *h, uint64_t now_ms);

/* ms since the engine's last heartbeat, as seen at now_ms. */
uint64_t hp_ipc_heartbeat_age(const hp_ipc_header_t *h, uint64_t now_ms);
char *hp_ipc_input(hp_ipc_header_t *h, hp_ipc_slot_t *s);

/* ---- slot lifecycle ------------------------------------------------- */

/*
 * nginx: takes a FREE slot for owner (the hello's conn_id), resets its
 * flags and ring, and returns it in CLAIMED state (*index, *seq set), or
 * NULL when every slot is taken.
 */
hp_ipc_slot_t *hp_ipc_claim(hp_ipc_header_t *h, uint32_t owner, int32_t pid,
                            uint32_t *index, uint32_t *seq);

/* nginx: CLAIMED -> SUBMITTED with the next FIFO ticket. -1 if the slot
 * is no longer this claim's (the engine reclaimed it). */
int hp_ipc_submit(hp_ipc_header_t *h, hp_ipc_slot_t *s, uint32_t seq);

/* engine: SUBMITTED -> RUNNING. 0, or -1 if it was not SUBMITTED (any
 * more). *word gets the RUNNING word. */
int hp_ipc_take(hp_ipc_slot_t *s, uint64_t *word);

/* engine: RUNNING -> DONE after the last record; frees the slot if its
 * user already let go of it. */
void hp_ipc_finish(hp_ipc_slot_t *s);

/*
 * Either side, when done with the slot of claim `seq` (nginx after FINAL
 * or to cancel; the engine for a dead owner): sets cancel and frees the
 * slot unless the engine is running it (then the engine frees it when it
 * finishes). Returns 1 if the slot is free now, 0 if the engine will free
 * it, -1 if the slot is not that claim's any more (nothing done).
 */
int hp_ipc_release(hp_ipc_slot_t *s, uint32_t seq);

/* ---- output ring (engine writes, nginx reads) ---------------------- */

/* Free bytes in the ring, as the producer sees them. */
uint32_t hp_ipc_ring_room(const hp_ipc_header_t *h, hp_ipc_slot_t *s);

/*
 * Appends a record of `len` bytes (len <= HP_IPC_RECORD_MAX), leaving at
 * least `reserve` bytes free after it. 0, or -1 if there is no room (the
 * ring is unchanged).
 */
int hp_ipc_ring_put(const hp_ipc_header_t *h, hp_ipc_slot_t *s, uint32_t type,
                    const void *data, uint32_t len, uint32_t reserve);

/*
 * Takes the next record into buf[cap]. Returns 1 (*type, *len set), 0 if
 * the ring is empty, -1 if the ring is corrupt or the record does not fit
 * buf (nothing is consumed then).
 */
int hp_ipc_ring_get(const hp_ipc_header_t *h, hp_ipc_slot_t *s, uint32_t *type,
                    void *buf, uint32_t cap, uint32_t *len);

/* Largest prefix of text[0..len) of at most max bytes that ends on a
 * UTF-8 character boundary (for splitting TEXT records). */
size_t hp_ipc_utf8_cut(const char *text, size_t len, size_t max);

/* ---- TOKEN records ---------------------------------------------------- */

/* Appends an entry (a token's log-probability and its bytes, at most
 * HP_IPC_TOKEN_BYTES of them) to the TOKEN record of *len bytes at rec,
 * which must have room for it: 8 + HP_IPC_TOKEN_BYTES bytes. */
void hp_ipc_token_add(void *rec, uint32_t *len, float logprob,
                      const void *bytes, uint32_t n);

/* Reads the entry at *off (start: sizeof(hp_ipc_token_t)) of the TOKEN
 * record rec[len]: 1 with *off past it, 0 at the end or where the record
 * is malformed. *bytes points into rec. */
int hp_ipc_token_next(const void *rec, uint32_t len, uint32_t *off,
                      float *logprob, const unsigned char **bytes, uint32_t *n);

/* ---- errors ---------------------------------------------------------- */

/* What a client sees of an engine status: the one map from hp_status_t
 * (engine/contract/hp_error.h) to HTTP, read by the engine (FINAL's code)
 * and by the module (the answer's status and type). */
typedef struct {
    int http;         /* HTTP status */
    const char *type; /* OpenAI error type */
    const char *code; /* error code, as FINAL carries it */
} hp_ipc_error_t;

/* The row of `status`; HP_OK and unknown values get 500 server_error
 * "engine_error". Never NULL. */
const hp_ipc_error_t *hp_ipc_error(int status);

#endif
