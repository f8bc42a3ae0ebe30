/*
 * test_radix.c - the radix tree against a brute-force model (the set of
 * inserted sequences; a match is the longest common prefix with any of
 * them) under random inserts, splits, merges, leaf removals and clones,
 * with the structural invariants checked after every step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cache/radix.h"
#include "t/lib/tap.h"

#define MAXSEQ 400
#define MAXLEN 40

static unsigned long long rng_state = 0x9E3779B97F4A7C15ULL;
static unsigned rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (unsigned)(rng_state >> 11);
}

typedef struct {
    int ids[MAXSEQ][MAXLEN];
    int len[MAXSEQ];
    int n;
} model_t;

static int model_match(const model_t *m, const int *q, int n)
{
    int best = 0;
    for (int i = 0; i < m->n; i++) {
        int k = 0;
        while (k < n && k < m->len[i] && m->ids[i][k] == q[k])
            k++;
        if (k > best)
            best = k;
    }
    return best;
}

/* A sequence sharing a random prefix with an earlier one, then random
 * tokens from a small alphabet (so paths branch often). */
static int random_seq(const model_t *m, int *q)
{
    int n = 1 + rnd() % MAXLEN, k = 0;
    if (m->n > 0 && rnd() % 4) {
        int i = rnd() % m->n;
        k = rnd() % (m->len[i] + 1);
        if (k > n)
            k = n;
        memcpy(q, m->ids[i], (size_t)k * sizeof(int));
    }
    for (; k < n; k++)
        q[k] = rnd() % 4;
    return n;
}

/* Every invariant of the structure; returns the number of violations. */
static int check_tree(const hp_radix_t *t)
{
    int bad = 0, n = 0;
    size_t toks = 0;
    for (hp_radix_node_t *x = t->all; x; x = x->next_all) {
        n++;
        toks += (size_t)x->len;
        if (!x->parent || x->len <= 0 || x->depth != x->parent->depth + x->len)
            bad++;
        if (hp_radix_child(x->parent, x->tok[0]) != x)
            bad++;
        for (int i = 1; i < x->n_kids; i++)
            if (x->kids[i - 1]->tok[0] >= x->kids[i]->tok[0])
                bad++;
        for (int i = 0; i < x->n_kids; i++)
            if (x->kids[i]->parent != x)
                bad++;
    }
    for (int i = 1; i < t->root->n_kids; i++)
        if (t->root->kids[i - 1]->tok[0] >= t->root->kids[i]->tok[0])
            bad++;
    if (n != t->n_nodes || toks != t->n_tokens || t->root->depth != 0)
        bad++;
    return bad;
}

static int check_matches(const hp_radix_t *t, const model_t *m, int tries)
{
    int bad = 0, q[MAXLEN + 8];
    for (int r = 0; r < tries; r++) {
        int n = random_seq(m, q);
        hp_radix_match_t mt;
        hp_radix_match(t, q, n, &mt);
        int want = model_match(m, q, n);
        int node_ok =
            mt.node->depth <= mt.depth &&
            (mt.edge ? mt.edge->parent == mt.node && mt.depth < mt.edge->depth
                     : mt.node->depth == mt.depth);
        if (mt.depth != want || !node_ok) {
            if (bad < 3)
                tap_diag("match %d want %d", mt.depth, want);
            bad++;
        }
    }
    return bad;
}

static int count_payload;
static void *clone_payload(void *ud, const hp_radix_node_t *n)
{
    (void)ud;
    count_payload++;
    int *x = malloc(sizeof(int));
    *x = *(int *)n->data;
    return x;
}
static void free_payload(void *ud, void *d)
{
    (void)ud;
    free(d);
}

int main(void)
{
    hp_radix_t t;
    hp_error_t err = {0};
    static model_t m;
    int q[MAXLEN + 8], bad_ins = 0, bad_inv = 0, bad_ret = 0;
    ok(hp_radix_init(&t, &err) == HP_OK, "init");

    for (int i = 0; i < 300; i++) {
        int n = random_seq(&m, q), created;
        hp_radix_node_t *x = hp_radix_insert(&t, q, n, &created, &err);
        if (!x || x->depth != n)
            bad_ret++;
        memcpy(m.ids[m.n], q, (size_t)n * sizeof(int));
        m.len[m.n++] = n;
        bad_inv += check_tree(&t);
        if (i % 10 == 0)
            bad_ins += check_matches(&t, &m, 20);
    }
    ok(bad_ret == 0, "insert returns the node at the sequence's depth");
    ok(bad_inv == 0, "invariants hold after 300 inserts (%d nodes)", t.n_nodes);
    ok(bad_ins == 0 && check_matches(&t, &m, 2000) == 0,
       "longest match equals brute force");

    /* node_at: splits where asked, the path reads back the sequence */
    int bad_at = 0, splits = 0;
    for (int r = 0; r < 200; r++) {
        int i = rnd() % m.n, d = rnd() % (m.len[i] + 1), sp, path[MAXLEN];
        int before = t.n_nodes;
        hp_radix_node_t *x = hp_radix_node_at(&t, m.ids[i], d, &sp, &err);
        splits += sp;
        hp_radix_path(x, path);
        if (!x || x->depth != d || memcmp(path, m.ids[i], d * sizeof(int)) ||
            t.n_nodes != before + sp)
            bad_at++;
    }
    ok(bad_at == 0 && check_tree(&t) == 0 && check_matches(&t, &m, 500) == 0,
       "node_at: right depth and path, %d splits, matches unchanged", splits);
    int sp;
    ok(hp_radix_node_at(&t, (int[]){9, 9, 9}, 3, &sp, &err) == NULL &&
           err.code == HP_EBADINPUT,
       "node_at beyond the tree is bad input");

    /* merge every single-child node: the language is unchanged */
    int merged = 0;
    for (hp_radix_node_t *x = t.all, *next; x; x = next) {
        next = x->next_all;
        if (x->n_kids == 1 && rnd() % 2) { /* the child survives */
            if (hp_radix_merge(&t, x, &err))
                merged++;
        }
    }
    ok(merged > 0 && check_tree(&t) == 0 && check_matches(&t, &m, 2000) == 0,
       "%d merges keep the invariants and every match", merged);

    /* payloads survive a clone; the clone matches like the original */
    int tag = 0;
    for (hp_radix_node_t *x = t.all; x; x = x->next_all) {
        x->data = malloc(sizeof(int));
        *(int *)x->data = tag++;
    }
    hp_radix_t c;
    count_payload = 0;
    int crc = hp_radix_clone(&c, &t, clone_payload, free_payload, NULL, &err);
    ok(crc == HP_OK && c.n_nodes == t.n_nodes && c.n_tokens == t.n_tokens &&
           count_payload == t.n_nodes && check_tree(&c) == 0,
       "clone: same size, every payload cloned (%d nodes)", c.n_nodes);
    int bad_clone = 0;
    for (int r = 0; r < 1000; r++) {
        int n = random_seq(&m, q);
        hp_radix_match_t a, b;
        hp_radix_match(&t, q, n, &a);
        hp_radix_match(&c, q, n, &b);
        if (a.depth != b.depth || a.node->depth != b.node->depth ||
            (a.node->data && *(int *)a.node->data != *(int *)b.node->data))
            bad_clone++;
    }
    ok(bad_clone == 0, "clone answers every match like the original");
    hp_radix_free(&c, free_payload, NULL);

    /* remove leaves: the model loses what lay beyond their parents */
    int removed = 0, bad_rm = 0;
    for (int r = 0; r < 150 && t.n_nodes > 0; r++) {
        hp_radix_node_t *x = t.all;
        int skip = rnd() % t.n_nodes;
        for (int k = 0; k < skip; k++)
            x = x->next_all;
        if (x->n_kids)
            continue;
        int path[MAXLEN], pd = x->parent->depth;
        hp_radix_path(x, path);
        for (int i = 0; i < m.n; i++) /* cut the strings through x */
            if (m.len[i] > pd &&
                !memcmp(m.ids[i], path, (size_t)(pd + 1) * sizeof(int)))
                m.len[i] = pd;
        free(x->data);
        hp_radix_remove(&t, x);
        removed++;
        bad_rm += check_tree(&t);
    }
    ok(removed > 10 && bad_rm == 0 && check_matches(&t, &m, 2000) == 0,
       "%d leaf removals keep the invariants and brute-force matches", removed);

    hp_radix_free(&t, free_payload, NULL);
    ok(t.root == NULL, "free leaves an empty tree");
    return tap_done();
}
