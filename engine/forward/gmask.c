/*
 * gmask.c - the grammar recogniser, token masks over the vocabulary trie,
 * and the grammar cache (gmask.h).
 */
#include "engine/forward/gmask.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- sets of stacks ----------------------------------------------------- */

static int set_reserve(hp_gset_t *s, uint32_t more)
{
    if (s->len + more <= s->cap)
        return 0;
    uint32_t cap = s->cap ? s->cap : 256;
    while (cap < s->len + more)
        cap *= 2;
    uint32_t *w = realloc(s->w, (size_t)cap * sizeof(*w));
    if (!w)
        return -1;
    s->w = w;
    s->cap = cap;
    return 0;
}

static void set_clear(hp_gset_t *s)
{
    s->len = 0;
    s->n = 0;
}

/* Adds stack st[len] (pairs) unless the set has it. 0, or -1 (no
 * memory, or the set is full: then *overflow counts it). */
static int set_add(hp_gset_t *s, const uint32_t *st, uint32_t len,
                   int *overflow)
{
    uint32_t off = 0;
    for (int i = 0; i < s->n; i++) {
        uint32_t l = s->w[off];
        /* the tops first: stacks of one set differ there mostly */
        if (l == len && (!len || s->w[off + 2 * len - 1] == st[2 * len - 2]) &&
            !memcmp(s->w + off + 1, st, 2 * len * sizeof(*st)))
            return 0;
        off += 1 + 2 * l;
    }
    if (s->n >= HP_GMATCH_STACKS) {
        (*overflow)++;
        return 0;
    }
    if (set_reserve(s, 1 + 2 * len))
        return -1;
    s->w[s->len] = len;
    memcpy(s->w + s->len + 1, st, 2 * len * sizeof(*st));
    s->len += 1 + 2 * len;
    s->n++;
    return 0;
}

/* ---- stepping ------------------------------------------------------------ */

typedef struct {
    const hp_grammar_t *g;
    hp_gset_t *out;
    uint32_t *st; /* [HP_GMATCH_DEPTH * 2] */
    int overflow;
    int nomem;
} step_t;

/* Expands the rules on top of st[len] (pairs) until every stack has a
 * terminal on top (or is empty), adding them to out. The slot it pops
 * is restored before it returns, so a caller's stack below stays. */
static void expand(step_t *x, uint32_t len, int guard)
{
    const hp_grammar_t *g = x->g;
    if (len == 0 || g->elems[x->st[2 * (len - 1)]].type != HP_G_RULE) {
        if (set_add(x->out, x->st, len, &x->overflow))
            x->nomem = 1;
        return;
    }
    if (guard > 64) {
        x->overflow++;
        return;
    }
    uint32_t pos = x->st[2 * (len - 1)], aux = x->st[2 * (len - 1) + 1];
    const hp_g_rule_t *r = &g->rules[g->elems[pos].arg];
    uint32_t base = len - 1;
    if (g->elems[pos + 1].type != HP_G_END) {
        x->st[2 * base] = pos + 1;
        x->st[2 * base + 1] = 0;
        base++;
    }
    for (uint32_t a = 0; a < r->n; a++) {
        uint32_t first = g->alts[r->first + a], l = base;
        if (g->elems[first].type != HP_G_END) {
            if (l >= HP_GMATCH_DEPTH) {
                x->overflow++;
                continue;
            }
            x->st[2 * l] = first;
            x->st[2 * l + 1] = 0;
            l++;
        }
        expand(x, l, guard + 1);
        if (base > len - 1) { /* the continuation, as it was */
            x->st[2 * (len - 1)] = pos + 1;
            x->st[2 * (len - 1) + 1] = 0;
        }
    }
    x->st[2 * (len - 1)] = pos;
    x->st[2 * (len - 1) + 1] = aux;
}

/* Hex digit. */
static int is_hex(unsigned c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') ||
           (c >= 'A' && c <= 'F');
}

/* JSON string states (aux low byte) */
enum {
    S_CHAR = 0,
    S_ESC = 1,
    S_HEX = 2,  /* 2..5: hex digits of \u to go: 4..1 */
    S_U1 = 10,  /* one continuation byte 80..BF to go */
    S_U2 = 11,  /* two, next 80..BF */
    S_U2A = 12, /* two, next A0..BF (after E0) */
    S_U2D = 13, /* two, next 80..9F (after ED) */
    S_U3 = 14,  /* three, next 80..BF */
    S_U3A = 15, /* three, next 90..BF (after F0) */
    S_U3D = 16  /* three, next 80..8F (after F4) */
};

/* One byte into a string body with bounds arg: 1 with *aux updated, 2
 * closed (the quote), 0 refused. aux: state | count << 8 (the count of
 * characters, kept only while it matters: bounded, or below the
 * minimum, so an unbounded string keeps one state). */
static int str_step(uint32_t arg, uint32_t *aux, unsigned c)
{
    unsigned st = *aux & 0xff, count = *aux >> 8;
    unsigned lo = HP_G_STR_MIN(arg), hi = HP_G_STR_MAX(arg);
    unsigned next = S_CHAR;
    if (st == S_CHAR) {
        if (c == '"')
            return count >= lo ? 2 : 0;
        if (c < 0x20 || (c >= 0x80 && c < 0xc2) || c > 0xf4)
            return 0;
        if (hi != HP_G_STR_UNBOUNDED && count >= hi)
            return 0;
        if (c == '\\')
            next = S_ESC;
        else if (c >= 0xf0)
            next = c == 0xf0 ? S_U3A : c == 0xf4 ? S_U3D : S_U3;
        else if (c >= 0xe0)
            next = c == 0xe0 ? S_U2A : c == 0xed ? S_U2D : S_U2;
        else if (c >= 0xc2)
            next = S_U1;
        if (hi != HP_G_STR_UNBOUNDED || count < lo)
            count++;
    } else if (st == S_ESC) {
        if (c == 'u')
            next = S_HEX;
        else if (!strchr("\"\\/bfnrt", (int)c) || !c)
            return 0;
    } else if (st >= S_HEX && st < S_HEX + 4) {
        if (!is_hex(c))
            return 0;
        next = st + 1 == S_HEX + 4 ? S_CHAR : st + 1;
    } else {
        unsigned lo_b = st == S_U2A ? 0xa0 : st == S_U3A ? 0x90 : 0x80;
        unsigned hi_b = st == S_U2D ? 0x9f : st == S_U3D ? 0x8f : 0xbf;
        if (c < lo_b || c > hi_b)
            return 0;
        next = st == S_U1 ? S_CHAR : (st >= S_U3) ? S_U2 : S_U1;
    }
    *aux = next | count << 8;
    return 1;
}

/* One byte into text up to term: 1 with *aux (the term's bytes matched
 * so far) updated, 2 the term completed. */
static int until_step(const char *term, uint32_t tlen, uint32_t *aux,
                      unsigned c)
{
    /* the longest prefix of term that ends the text matched so far + c */
    uint32_t j = *aux + 1;
    for (; j > 0; j--) {
        if ((unsigned char)term[j - 1] != c)
            continue;
        /* term[0..j-1) must end term[0..aux) */
        if (j - 1 <= *aux && !memcmp(term, term + *aux - (j - 1), j - 1))
            break;
    }
    if (j == tlen)
        return 2;
    *aux = j;
    return 1;
}

/* Feeds byte c to every stack of in, into x->out. */
static void step(step_t *x, const hp_gset_t *in, unsigned c)
{
    const hp_grammar_t *g = x->g;
    uint32_t off = 0;
    for (int i = 0; i < in->n; i++) {
        uint32_t len = in->w[off];
        const uint32_t *st = in->w + off + 1;
        off += 1 + 2 * len;
        if (len == 0)
            continue; /* ended: nothing may follow */
        uint32_t pos = st[2 * (len - 1)], aux = st[2 * (len - 1) + 1];
        const hp_g_elem_t *e = &g->elems[pos];
        int r = 0;
        switch (e->type) {
        case HP_G_BYTE:
            r = e->byte == c ? 2 : 0;
            break;
        case HP_G_CLASS:
            r = (g->classes[e->arg].bits[c >> 5] >> (c & 31)) & 1 ? 2 : 0;
            break;
        case HP_G_STR:
            r = str_step(e->arg, &aux, c);
            break;
        case HP_G_UNTIL:
            r = until_step(g->terms[e->arg], g->term_len[e->arg], &aux, c);
            break;
        default:
            break;
        }
        if (r == 0)
            continue;
        memcpy(x->st, st, 2 * len * sizeof(*st));
        if (r == 1) { /* the same terminal, a new state */
            x->st[2 * (len - 1) + 1] = aux;
            if (set_add(x->out, x->st, len, &x->overflow))
                x->nomem = 1;
            continue;
        }
        /* consumed: the next position of its sequence, then expand */
        uint32_t l = len - 1;
        if (g->elems[pos + 1].type != HP_G_END) {
            x->st[2 * l] = pos + 1;
            x->st[2 * l + 1] = 0;
            l++;
        }
        expand(x, l, 0);
    }
}

/* ---- the recogniser -------------------------------------------------- */

int hp_gmatch_init(hp_gmatch_t *m, const hp_grammar_t *g, hp_error_t *err)
{
    memset(m, 0, sizeof(*m));
    m->g = g;
    m->st = malloc(2 * HP_GMATCH_DEPTH * sizeof(*m->st));
    if (!m->st)
        return hp_error_set(err, HP_ENOMEM, "grammar: out of memory");
    step_t x = {.g = g, .out = &m->set, .st = m->st};
    const hp_g_rule_t *r = &g->rules[0];
    for (uint32_t a = 0; a < r->n; a++) {
        uint32_t first = g->alts[r->first + a], l = 0;
        if (g->elems[first].type != HP_G_END) {
            m->st[0] = first;
            m->st[1] = 0;
            l = 1;
        }
        expand(&x, l, 0);
    }
    m->overflow = x.overflow;
    if (x.nomem) {
        hp_gmatch_free(m);
        return hp_error_set(err, HP_ENOMEM, "grammar: out of memory");
    }
    return HP_OK;
}

void hp_gmatch_free(hp_gmatch_t *m)
{
    free(m->set.w);
    free(m->tmp.w);
    free(m->tmp2.w);
    free(m->st);
    memset(m, 0, sizeof(*m));
}

int hp_gmatch_copy(hp_gmatch_t *m, const hp_gmatch_t *src)
{
    set_clear(&m->set);
    if (set_reserve(&m->set, src->set.len))
        return -1;
    memcpy(m->set.w, src->set.w, src->set.len * sizeof(uint32_t));
    m->set.len = src->set.len;
    m->set.n = src->set.n;
    return 0;
}

int hp_gmatch_feed(hp_gmatch_t *m, const void *bytes, size_t n)
{
    const unsigned char *c = bytes;
    hp_gset_t *from = &m->set;
    hp_gset_t *bufs[2] = {&m->tmp, &m->tmp2};
    for (size_t i = 0; i < n; i++) {
        hp_gset_t *into = bufs[i & 1];
        step_t x = {.g = m->g, .out = into, .st = m->st};
        set_clear(into);
        step(&x, from, c[i]);
        m->overflow += x.overflow;
        if (x.nomem || into->n == 0)
            return 0; /* the state is untouched */
        from = into;
    }
    if (from != &m->set) {
        hp_gset_t t = m->set;
        m->set = *from;
        *from = t;
    }
    return 1;
}

int hp_gmatch_may_end(const hp_gmatch_t *m)
{
    uint32_t off = 0;
    for (int i = 0; i < m->set.n; i++) {
        if (m->set.w[off] == 0)
            return 1;
        off += 1 + 2 * m->set.w[off];
    }
    return 0;
}

int hp_gmatch_must_end(const hp_gmatch_t *m)
{
    return m->set.n == 1 && m->set.w[0] == 0;
}

/* ---- the vocabulary trie --------------------------------------------- */

/* Inside a JSON string between characters (S_CHAR), a token's bytes
 * stay in it, close it (an unescaped quote) or are refused. */
enum {
    F_STR = 1,        /* every token's rest below stays in a string */
    F_NO_LT = 2,      /* ... is without '<' */
    F_NO_NL = 4,      /* ... is without '\n' */
    F_NOCLOSE = 8,    /* no token below closes a string */
    F_ALL_NO_LT = 16, /* no token below has '<' (F_NO_LT << 3) */
    F_ALL_NO_NL = 32  /* ... '\n' */
};

typedef struct {
    uint32_t child; /* first edge in edges[] */
    uint16_t n_child;
    uint8_t flags;
    uint8_t byte;    /* of the edge into it */
    uint32_t lo, hi; /* its subtree's tokens: order[lo..hi) */
    uint32_t n_end;  /* order[lo..lo + n_end): tokens ending here */
    uint8_t maxc;    /* the most characters a token's rest below starts in
                        a string (F_STR), 255: 255 or more */
} node_t;

/* Classes of whole tokens, as bitsets over the vocabulary: the tokens a
 * frequent state allows whatever their place in the trie, so a mask
 * there starts from a copy and walks only the rest (see base_t): those
 * that stay in a string, those without '<', without '\n'. */
enum { C_STR, C_NO_LT, C_NO_NL, N_CLASSES };

struct hp_gmask_vocab {
    int V;
    node_t *nodes;
    uint32_t n_nodes;
    uint32_t *order; /* token ids, depth-first */
    uint32_t n_order;
    int stop[16];
    int n_stop;
    int max_depth;
    uint32_t *cls[N_CLASSES]; /* [(V + 31) / 32] each */
    int n_cls[N_CLASSES];     /* tokens in each */
    /* the C_STR tokens by their count of characters: by_chars[
     * chars_at[k]..chars_at[k + 1]) have k (255: 255 or more) */
    uint32_t *by_chars;
    uint32_t chars_at[257];
};

/* Building: a plain trie with sorted child lists, then laid out depth
 * first. */
typedef struct {
    uint32_t first_child, next_sibling; /* 0: none (node 0 is the root) */
    uint32_t first_tok;                 /* tokens ending here, linked */
    uint8_t byte, flags, maxc;
} bnode_t;

/* b[from..n) fed to an unbounded string between characters: 1 it stays
 * in the string, starting *chars characters (at most 255), 2 it closes
 * it, 0 it is refused. */
static int in_str(const unsigned char *b, size_t from, size_t n, uint8_t *chars)
{
    uint32_t aux = S_CHAR;
    unsigned k = 0;
    for (size_t i = from; i < n; i++) {
        k += (aux & 0xff) == S_CHAR; /* a character, or an escape, starts */
        int r = str_step(HP_G_STR_ARG(0, HP_G_STR_UNBOUNDED), &aux, b[i]);
        if (r != 1)
            return r;
    }
    *chars = (uint8_t)(k < 255 ? k : 255);
    return 1;
}

static int tok_bytes(const hp_tokenizer_t *tok, int id, const char **b,
                     size_t *n)
{
    *b = hp_tokenizer_token_bytes(tok, id, n);
    return *b && *n > 0 && !hp_tokenizer_is_special(tok, id);
}

int hp_gmask_vocab_build(hp_gmask_vocab_t **out, const hp_tokenizer_t *tok,
                         int V, const int *stop, int n_stop, hp_error_t *err)
{
    *out = NULL;
    hp_gmask_vocab_t *v = calloc(1, sizeof(*v));
    bnode_t *bn = NULL;
    uint32_t n_bn = 1, cap_bn = 1024, *next_tok = NULL, *stk = NULL;
    uint8_t *tchars = NULL; /* a C_STR token's characters */
    const uint8_t all =
        F_STR | F_NO_LT | F_NO_NL | F_NOCLOSE | F_ALL_NO_LT | F_ALL_NO_NL;
    if (!v)
        goto nomem;
    v->V = V;
    for (int i = 0; i < n_stop && v->n_stop < 16; i++)
        v->stop[v->n_stop++] = stop[i];
    bn = calloc(cap_bn, sizeof(*bn));
    next_tok = malloc((size_t)V * sizeof(*next_tok));
    tchars = calloc((size_t)V, 1);
    if (!bn || !next_tok || !tchars)
        goto nomem;
    for (int k = 0; k < N_CLASSES; k++)
        if (!(v->cls[k] = calloc((size_t)(V + 31) / 32, sizeof(uint32_t))))
            goto nomem;
    bn[0].flags = all;
    int n_tok = 0;
    for (int id = 0; id < V; id++) {
        const char *b;
        size_t n;
        next_tok[id] = 0;
        if (!tok_bytes(tok, id, &b, &n))
            continue;
        const unsigned char *u = (const unsigned char *)b;
        uint32_t at = 0;
        int lt = -1, nl = -1; /* last '<' and '\n' */
        for (size_t i = 0; i < n; i++) {
            if (u[i] == '<')
                lt = (int)i;
            if (u[i] == '\n')
                nl = (int)i;
        }
        uint32_t bit = 1u << (id & 31);
        uint8_t whole = (lt < 0 ? F_ALL_NO_LT : 0) | (nl < 0 ? F_ALL_NO_NL : 0);
        int r = in_str(u, 0, n, &tchars[id]);
        int in[N_CLASSES] = {
            [C_STR] = r == 1, [C_NO_LT] = lt < 0, [C_NO_NL] = nl < 0};
        for (int k = 0; k < N_CLASSES; k++)
            if (in[k]) {
                v->cls[k][id >> 5] |= bit;
                v->n_cls[k]++;
            }
        whole |= r == 2 ? 0 : F_NOCLOSE;
        for (size_t d = 0; d <= n; d++) {
            /* the rest of the token from depth d, seen from node `at`,
             * and the whole token */
            uint8_t rest = 0;
            uint8_t f = (in_str(u, d, n, &rest) == 1 ? F_STR : 0) |
                        ((int)d > lt ? F_NO_LT : 0) |
                        ((int)d > nl ? F_NO_NL : 0) | whole;
            bn[at].flags &= f;
            bn[at].maxc = bn[at].maxc > rest ? bn[at].maxc : rest;
            if (d == n)
                break;
            uint32_t *link = &bn[at].first_child, c;
            while ((c = *link) && bn[c].byte < u[d])
                link = &bn[c].next_sibling;
            if (!c || bn[c].byte != u[d]) {
                if (n_bn == cap_bn) {
                    bnode_t *q = realloc(bn, 2 * cap_bn * sizeof(*bn));
                    if (!q)
                        goto nomem;
                    bn = q;
                    cap_bn *= 2;
                    link = &bn[at].first_child; /* relocate the link */
                    while ((c = *link) && bn[c].byte < u[d])
                        link = &bn[c].next_sibling;
                }
                bn[n_bn] =
                    (bnode_t){.next_sibling = c, .byte = u[d], .flags = all};
                *link = n_bn;
                c = n_bn++;
            }
            at = c;
            if ((int)d + 2 > v->max_depth)
                v->max_depth = (int)d + 2;
        }
        next_tok[id] = bn[at].first_tok;
        bn[at].first_tok = (uint32_t)id + 1;
        n_tok++;
    }
    /* lay out depth first: nodes in preorder, each node's children
     * contiguous, tokens in preorder */
    v->nodes = calloc(n_bn, sizeof(*v->nodes));
    v->order = malloc((size_t)(n_tok ? n_tok : 1) * sizeof(*v->order));
    stk = malloc((size_t)n_bn * 2 * sizeof(*stk));
    if (!v->nodes || !v->order || !stk)
        goto nomem;
    /* children get their new indices when their parent is laid out:
     * BFS-like slot allocation, DFS-order tokens via an explicit stack */
    uint32_t *newid = stk + n_bn;
    newid[0] = 0;
    v->n_nodes = 1;
    /* pass 1: give every node's children contiguous indices (by a queue
     * over old ids in preorder) */
    uint32_t *queue = stk, qh = 0, qt = 0;
    queue[qt++] = 0;
    while (qh < qt) {
        uint32_t o = queue[qh++];
        node_t *nd = &v->nodes[newid[o]];
        nd->byte = bn[o].byte;
        nd->flags = bn[o].flags;
        nd->maxc = bn[o].maxc;
        nd->child = v->n_nodes;
        for (uint32_t c = bn[o].first_child; c; c = bn[c].next_sibling) {
            newid[c] = v->n_nodes++;
            queue[qt++] = c;
            nd->n_child++;
        }
    }
    /* pass 2: token ranges, depth first (recursion by an explicit stack
     * of (old id, state)) */
    {
        uint32_t sp = 0;
        uint32_t *ds = malloc((size_t)(v->max_depth + 2) * 2 * sizeof(*ds));
        if (!ds)
            goto nomem;
        ds[0] = 0;
        ds[1] = 0; /* old id, 0: enter / else next child to visit */
        sp = 1;
        while (sp) {
            uint32_t o = ds[2 * (sp - 1)], *state = &ds[2 * (sp - 1) + 1];
            node_t *nd = &v->nodes[newid[o]];
            if (*state == 0) {
                nd->lo = v->n_order;
                for (uint32_t t = bn[o].first_tok; t; t = next_tok[t - 1])
                    v->order[v->n_order++] = t - 1;
                nd->n_end = v->n_order - nd->lo;
                *state = bn[o].first_child ? bn[o].first_child : UINT32_MAX;
            }
            if (*state == UINT32_MAX) {
                nd->hi = v->n_order;
                sp--;
                continue;
            }
            uint32_t c = *state;
            *state = bn[c].next_sibling ? bn[c].next_sibling : UINT32_MAX;
            ds[2 * sp] = c;
            ds[2 * sp + 1] = 0;
            sp++;
        }
        free(ds);
    }
    /* the C_STR tokens by their characters, a counting sort */
    v->by_chars = malloc(((size_t)v->n_cls[C_STR] + 1) * sizeof(*v->by_chars));
    if (!v->by_chars)
        goto nomem;
    for (int id = 0; id < V; id++)
        if (v->cls[C_STR][id >> 5] >> (id & 31) & 1)
            v->chars_at[tchars[id] + 1]++;
    for (int k = 0; k < 256; k++)
        v->chars_at[k + 1] += v->chars_at[k];
    {
        uint32_t fill[256];
        memcpy(fill, v->chars_at, sizeof(fill));
        for (int id = 0; id < V; id++)
            if (v->cls[C_STR][id >> 5] >> (id & 31) & 1)
                v->by_chars[fill[tchars[id]]++] = (uint32_t)id;
    }
    free(tchars);
    free(stk);
    free(bn);
    free(next_tok);
    *out = v;
    return HP_OK;
nomem:
    free(tchars);
    free(stk);
    free(bn);
    free(next_tok);
    hp_gmask_vocab_free(v);
    return hp_error_set(err, HP_ENOMEM,
                        "grammar: no memory for the "
                        "vocabulary trie");
}

void hp_gmask_vocab_free(hp_gmask_vocab_t *v)
{
    if (!v)
        return;
    free(v->nodes);
    free(v->order);
    for (int k = 0; k < N_CLASSES; k++)
        free(v->cls[k]);
    free(v->by_chars);
    free(v);
}

int hp_gmask_vocab_size(const hp_gmask_vocab_t *v)
{
    return v->V;
}

void hp_gmask_scratch_free(hp_gmask_scratch_t *s)
{
    for (int i = 0; i < s->n_lv; i++)
        free(s->lv[i].w);
    free(s->lv);
    free(s->st);
    free(s->last.w);
    free(s->last_bits);
    memset(s, 0, sizeof(*s));
}

/* ---- masks ------------------------------------------------------------ */

/* Room for more characters in a string whose stack top is e (aux): -1
 * when it is not a string between characters, INT_MAX when unbounded. */
static int str_room(const hp_g_elem_t *e, uint32_t aux)
{
    if (e->type != HP_G_STR || (aux & 0xff) != S_CHAR)
        return -1;
    if (HP_G_STR_MAX(e->arg) == HP_G_STR_UNBOUNDED)
        return INT_MAX;
    return (int)HP_G_STR_MAX(e->arg) - (int)(aux >> 8);
}

/* Whether c characters (255: 255 or more) fit in room. */
static int fits(int c, int room)
{
    return room == INT_MAX || (c < 255 && c <= room);
}

/* What a state of one stack allows, answered from the vocabulary's
 * classes wherever the tokens sit in the trie: in a string between
 * characters, every C_STR token of at most `room` characters (it stays
 * in the string); in text up to a term starting with '<' or '\n' and
 * nothing of it matched, every token without that byte (`until`: F_NO_LT
 * or F_NO_NL). The rest of the string's tokens are refused but those
 * that close it, the rest of the text's hold that byte: the walk skips
 * each subtree without those (F_NOCLOSE, F_ALL_NO_*). */
typedef struct {
    int room;      /* -1: not in a string */
    uint8_t until; /* 0: not in such text */
} base_t;

typedef struct {
    const hp_gmask_vocab_t *v;
    const hp_grammar_t *g;
    hp_gmask_scratch_t *s;
    uint32_t *bits;
    base_t base;
    int count; /* bits set */
    int nomem;
} walk_t;

static void set_bit(walk_t *w, uint32_t t)
{
    uint32_t b = 1u << (t & 31);
    w->count += !(w->bits[t >> 5] & b); /* the base may have it */
    w->bits[t >> 5] |= b;
}

static void mark(walk_t *w, uint32_t lo, uint32_t hi)
{
    for (uint32_t i = lo; i < hi; i++)
        set_bit(w, w->v->order[i]);
}

/* The tops of a set's non-empty stacks, one by one. */
typedef struct {
    const hp_gset_t *s;
    uint32_t off;
    int i;
} tops_t;

/* The next top: 1 with its element and aux, or 0 past the last. */
static int next_top(tops_t *t, const hp_grammar_t *g, const hp_g_elem_t **e,
                    uint32_t *aux)
{
    while (t->i < t->s->n) {
        uint32_t len = t->s->w[t->off];
        const uint32_t *st = t->s->w + t->off + 1;
        t->off += 1 + 2 * len;
        t->i++;
        if (len) {
            *e = &g->elems[st[2 * (len - 1)]];
            *aux = st[2 * (len - 1) + 1];
            return 1;
        }
    }
    return 0;
}

/* Whether every token below node nd is allowed from set s, its rest
 * taken by one stack: a string with room for the rest's characters,
 * all plain string text, or text up to a term whose first byte the rest
 * lacks. */
static int skips(const walk_t *w, const hp_gset_t *s, const node_t *nd)
{
    const hp_grammar_t *g = w->g;
    tops_t t = {.s = s};
    const hp_g_elem_t *e;
    uint32_t aux;
    while (next_top(&t, g, &e, &aux)) {
        if ((nd->flags & F_STR) && fits(nd->maxc, str_room(e, aux)))
            return 1;
        if (e->type == HP_G_UNTIL && aux == 0) {
            char c = g->terms[e->arg][0];
            if ((c == '<' && (nd->flags & F_NO_LT)) ||
                (c == '\n' && (nd->flags & F_NO_NL)))
                return 1;
        }
    }
    return 0;
}

/* Whether the base decides every token below node nd. */
static int in_base(const base_t *b, const node_t *nd)
{
    return (b->room >= 0 && (nd->flags & F_NOCLOSE)) ||
           (b->until && (nd->flags & b->until << 3));
}

static base_t base_of(const hp_grammar_t *g, const hp_gset_t *s)
{
    base_t b = {.room = -1};
    tops_t t = {.s = s};
    const hp_g_elem_t *e;
    uint32_t aux;
    if (s->n != 1 || !next_top(&t, g, &e, &aux))
        return b;
    b.room = str_room(e, aux);
    if (e->type == HP_G_UNTIL && aux == 0) {
        char c = g->terms[e->arg][0];
        b.until = c == '<' ? F_NO_LT : c == '\n' ? F_NO_NL : 0;
    }
    return b;
}

/* bits = the base's tokens; how many. */
static int fill_base(const hp_gmask_vocab_t *v, const base_t *b, uint32_t *bits)
{
    size_t nw = (size_t)(v->V + 31) / 32;
    memset(bits, 0, nw * sizeof(*bits));
    if (b->room == INT_MAX) {
        memcpy(bits, v->cls[C_STR], nw * sizeof(*bits));
        return (int)v->chars_at[256];
    }
    if (b->room >= 0) {
        /* by_chars[0..le) have at most room characters: set those, or
         * copy the class and clear the others, whichever is fewer */
        uint32_t le = v->chars_at[(b->room < 254 ? b->room : 254) + 1];
        uint32_t all = v->chars_at[256], lo = 0, hi = le;
        if (2 * le > all) {
            memcpy(bits, v->cls[C_STR], nw * sizeof(*bits));
            lo = le;
            hi = all;
        }
        for (uint32_t i = lo; i < hi; i++)
            bits[v->by_chars[i] >> 5] ^= 1u << (v->by_chars[i] & 31);
        return (int)le;
    }
    if (b->until) {
        int k = b->until == F_NO_LT ? C_NO_LT : C_NO_NL;
        memcpy(bits, v->cls[k], nw * sizeof(*bits));
        return v->n_cls[k];
    }
    return 0;
}

/* acc = a superset of the bytes some stack of s takes next (strings and
 * texts: any), so the walk need not step the others. */
static void first_bytes(const hp_grammar_t *g, const hp_gset_t *s,
                        uint32_t acc[8])
{
    memset(acc, 0, 8 * sizeof(*acc));
    tops_t t = {.s = s};
    const hp_g_elem_t *e;
    uint32_t aux;
    while (next_top(&t, g, &e, &aux)) {
        if (e->type == HP_G_BYTE) {
            acc[e->byte >> 5] |= 1u << (e->byte & 31);
        } else if (e->type == HP_G_CLASS) {
            for (int k = 0; k < 8; k++)
                acc[k] |= g->classes[e->arg].bits[k];
        } else {
            memset(acc, 0xff, 8 * sizeof(*acc));
            return;
        }
    }
}

static void walk(walk_t *w, uint32_t node, int depth)
{
    const node_t *nd = &w->v->nodes[node];
    hp_gset_t *cur = &w->s->lv[depth];
    uint32_t acc[8];
    if (depth > 0)
        mark(w, nd->lo, nd->lo + nd->n_end);
    if (nd->n_child >= 8)
        first_bytes(w->g, cur, acc);
    else /* not worth it */
        memset(acc, 0xff, sizeof(acc));
    for (uint32_t k = 0; k < nd->n_child; k++) {
        uint32_t ci = nd->child + k;
        const node_t *ch = &w->v->nodes[ci];
        if (!(acc[ch->byte >> 5] >> (ch->byte & 31) & 1))
            continue; /* no stack takes it */
        if (in_base(&w->base, ch))
            continue; /* set already */
        hp_gset_t *nx = &w->s->lv[depth + 1];
        step_t x = {.g = w->g, .out = nx, .st = w->s->st};
        set_clear(nx);
        step(&x, cur, ch->byte);
        if (x.nomem)
            w->nomem = 1;
        if (nx->n == 0)
            continue;
        if (skips(w, nx, ch))
            mark(w, ch->lo, ch->hi);
        else
            walk(w, ci, depth + 1);
    }
}

static int set_copy(hp_gset_t *to, const hp_gset_t *from)
{
    set_clear(to);
    if (set_reserve(to, from->len))
        return -1;
    memcpy(to->w, from->w, from->len * sizeof(*to->w));
    to->len = from->len;
    to->n = from->n;
    return 0;
}

static int set_equal(const hp_gset_t *a, const hp_gset_t *b)
{
    return a->n == b->n && a->len == b->len &&
           !memcmp(a->w, b->w, a->len * sizeof(*a->w));
}

int hp_gmask_compute(const hp_gmask_vocab_t *v, const hp_gmatch_t *m,
                     hp_gmask_scratch_t *s, uint32_t *bits)
{
    size_t nw = (size_t)(v->V + 31) / 32;
    if (s->last_bits && s->last_g == m->g && s->last_v == v &&
        set_equal(&s->last, &m->set)) {
        memcpy(bits, s->last_bits, nw * sizeof(*bits));
        return s->last_count;
    }
    int need = v->max_depth + 2;
    if (s->n_lv < need) {
        hp_gset_t *lv = realloc(s->lv, (size_t)need * sizeof(*lv));
        if (!lv)
            return -1;
        memset(lv + s->n_lv, 0, (size_t)(need - s->n_lv) * sizeof(*lv));
        s->lv = lv;
        s->n_lv = need;
    }
    if (!s->st && !(s->st = malloc(2 * HP_GMATCH_DEPTH * sizeof(*s->st))))
        return -1;
    if (s->last_nw < nw) {
        free(s->last_bits);
        s->last_g = NULL;
        s->last_nw = 0;
        if (!(s->last_bits = malloc(nw * sizeof(*bits))))
            return -1;
        s->last_nw = nw;
    }
    walk_t w = {.v = v, .g = m->g, .s = s, .bits = bits};
    /* level 0 is the matcher's own state */
    if (set_copy(&s->lv[0], &m->set))
        return -1;
    w.base = base_of(m->g, &m->set);
    w.count = fill_base(v, &w.base, bits);
    if (skips(&w, &s->lv[0], &v->nodes[0]))
        mark(&w, v->nodes[0].lo, v->nodes[0].hi);
    else
        walk(&w, 0, 0);
    s->last_g = NULL;
    if (w.nomem)
        return -1;
    if (hp_gmatch_may_end(m))
        for (int i = 0; i < v->n_stop; i++)
            if (v->stop[i] >= 0 && v->stop[i] < v->V)
                set_bit(&w, (uint32_t)v->stop[i]);
    int count = w.count;
    /* kept for the next step where the state tends to stay: in a string
     * or a text */
    if ((w.base.room >= 0 || w.base.until) &&
        set_copy(&s->last, &m->set) == 0) {
        memcpy(s->last_bits, bits, nw * sizeof(*bits));
        s->last_count = count;
        s->last_g = m->g;
        s->last_v = v;
    }
    return count;
}

void hp_gmask_apply(const uint32_t *bits, float *logits, int V)
{
    int full = V / 32;
    for (int w = 0; w < full; w++) {
        uint32_t b = bits[w];
        float *l = logits + 32 * (size_t)w;
        if (b == 0xffffffffu)
            continue;
        if (b == 0) { /* stores alone, no loads: most words, mostly */
            for (int i = 0; i < 32; i++)
                l[i] = -INFINITY;
            continue;
        }
        /* a select over the word's 32 floats, which vectorises */
        for (int i = 0; i < 32; i++)
            l[i] = b >> i & 1 ? l[i] : -INFINITY;
    }
    for (int i = 32 * full; i < V; i++)
        if (!(bits[i >> 5] >> (i & 31) & 1))
            logits[i] = -INFINITY;
}

/* ---- the cache ------------------------------------------------------- */

typedef struct {
    uint64_t hash;
    hp_grammar_t *g;
    int holders;
    uint64_t used; /* tick of the last get */
} centry_t;

struct hp_gcache {
    pthread_mutex_t mu;
    centry_t *e;
    int n, cap;
    uint64_t tick;
    hp_gcache_stats_t st;
    const hp_tokenizer_t *tok;
    int V, stop[16], n_stop;
    hp_gmask_vocab_t *vocab;
};

int hp_gcache_create(hp_gcache_t **out, int capacity, const hp_tokenizer_t *tok,
                     int V, const int *stop, int n_stop, hp_error_t *err)
{
    hp_gcache_t *c = calloc(1, sizeof(*c));
    *out = NULL;
    if (!c)
        return hp_error_set(err, HP_ENOMEM, "grammar cache: out of memory");
    c->cap = capacity > 0 ? capacity : 32;
    c->e = calloc((size_t)c->cap, sizeof(*c->e));
    if (!c->e) {
        free(c);
        return hp_error_set(err, HP_ENOMEM, "grammar cache: out of memory");
    }
    c->tok = tok;
    c->V = V;
    for (int i = 0; i < n_stop && c->n_stop < 16; i++)
        c->stop[c->n_stop++] = stop[i];
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return HP_OK;
}

void hp_gcache_free(hp_gcache_t *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n; i++)
        hp_grammar_free(c->e[i].g);
    free(c->e);
    hp_gmask_vocab_free(c->vocab);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int hp_gcache_get(hp_gcache_t *c, const char *spec, size_t len,
                  const hp_grammar_opts_t *opts, const hp_grammar_t **g,
                  const hp_gmask_vocab_t **vocab, hp_error_t *err)
{
    hp_grammar_opts_t o = opts ? *opts : (hp_grammar_opts_t){0};
    XXH64_state_t *h = XXH64_createState();
    *g = NULL;
    *vocab = NULL;
    if (!h)
        return hp_error_set(err, HP_ENOMEM, "grammar cache: out of memory");
    XXH64_reset(h, 0);
    XXH64_update(h, &o, sizeof(o));
    XXH64_update(h, spec, len);
    uint64_t key = XXH64_digest(h);
    XXH64_freeState(h);

    pthread_mutex_lock(&c->mu);
    int rc = HP_OK;
    if (!c->vocab)
        rc = hp_gmask_vocab_build(&c->vocab, c->tok, c->V, c->stop, c->n_stop,
                                  err);
    for (int i = 0; rc == HP_OK && i < c->n; i++)
        if (c->e[i].hash == key) {
            c->e[i].holders++;
            c->e[i].used = ++c->tick;
            c->st.hits++;
            *g = c->e[i].g;
            *vocab = c->vocab;
            pthread_mutex_unlock(&c->mu);
            return HP_OK;
        }
    pthread_mutex_unlock(&c->mu);
    if (rc != HP_OK)
        return rc;

    /* compiled outside the lock: a big schema does not stall others */
    hp_grammar_t *ng;
    char msg[400];
    const char *param;
    if (hp_grammar_compile(spec, len, &o, &ng, msg, sizeof(msg), &param))
        return hp_error_set(err, HP_EBADINPUT, "'%s': %s", param, msg);
    if (!ng)
        return HP_OK;

    pthread_mutex_lock(&c->mu);
    c->st.misses++;
    int slot = -1;
    for (int i = 0; i < c->n; i++)
        if (c->e[i].hash == key) { /* compiled meanwhile by another */
            hp_grammar_free(ng);
            ng = c->e[i].g;
            slot = i;
            break;
        }
    if (slot < 0 && c->n == c->cap) {
        /* evict the least recently used grammar no one holds */
        for (int i = 0; i < c->n; i++)
            if (!c->e[i].holders &&
                (slot < 0 || c->e[i].used < c->e[slot].used))
                slot = i;
        if (slot >= 0) {
            hp_grammar_free(c->e[slot].g);
            c->st.evictions++;
            c->e[slot] = (centry_t){key, ng, 0, 0};
        } else { /* every one held: grow */
            centry_t *e = realloc(c->e, 2 * (size_t)c->cap * sizeof(*e));
            if (!e) {
                pthread_mutex_unlock(&c->mu);
                hp_grammar_free(ng);
                return hp_error_set(err, HP_ENOMEM,
                                    "grammar cache: out of memory");
            }
            c->e = e;
            c->cap *= 2;
        }
    }
    if (slot < 0) {
        slot = c->n++;
        c->e[slot] = (centry_t){key, ng, 0, 0};
    }
    c->e[slot].holders++;
    c->e[slot].used = ++c->tick;
    *g = ng;
    *vocab = c->vocab;
    pthread_mutex_unlock(&c->mu);
    return HP_OK;
}

static void adjust(hp_gcache_t *c, const hp_grammar_t *g, int by)
{
    if (!g)
        return;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        if (c->e[i].g == g)
            c->e[i].holders += by;
    pthread_mutex_unlock(&c->mu);
}

void hp_gcache_hold(hp_gcache_t *c, const hp_grammar_t *g)
{
    adjust(c, g, 1);
}

void hp_gcache_put(hp_gcache_t *c, const hp_grammar_t *g)
{
    adjust(c, g, -1);
}

void hp_gcache_stats(hp_gcache_t *c, hp_gcache_stats_t *st)
{
    pthread_mutex_lock(&c->mu);
    *st = c->st;
    st->entries = c->n;
    pthread_mutex_unlock(&c->mu);
}
