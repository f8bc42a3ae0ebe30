/* radix.c - radix tree over token ids, structure only (radix.h). */
#include "engine/cache/radix.h"

#include <stdlib.h>
#include <string.h>

static hp_radix_node_t *node_new(hp_radix_t *t, const int *ids, int n)
{
    hp_radix_node_t *x = calloc(1, sizeof(*x));
    if (!x)
        return NULL;
    if (n > 0) {
        x->tok = malloc((size_t)n * sizeof(int));
        if (!x->tok) {
            free(x);
            return NULL;
        }
        memcpy(x->tok, ids, (size_t)n * sizeof(int));
    }
    x->len = n;
    if (t) { /* link into the list of all nodes */
        x->next_all = t->all;
        if (t->all)
            t->all->prev_all = x;
        t->all = x;
        t->n_nodes++;
        t->n_tokens += (size_t)n;
    }
    return x;
}

static void node_unlink_free(hp_radix_t *t, hp_radix_node_t *x)
{
    if (x->prev_all)
        x->prev_all->next_all = x->next_all;
    else
        t->all = x->next_all;
    if (x->next_all)
        x->next_all->prev_all = x->prev_all;
    t->n_nodes--;
    t->n_tokens -= (size_t)x->len;
    free(x->kids);
    free(x->tok);
    free(x);
}

int hp_radix_init(hp_radix_t *t, hp_error_t *err)
{
    memset(t, 0, sizeof(*t));
    t->root = node_new(NULL, NULL, 0);
    if (!t->root)
        return hp_error_set(err, HP_ENOMEM, "radix: out of memory");
    return HP_OK;
}

void hp_radix_free(hp_radix_t *t, void (*free_data)(void *ud, void *data),
                   void *ud)
{
    if (!t->root)
        return;
    hp_radix_node_t *x = t->all;
    while (x) {
        hp_radix_node_t *next = x->next_all;
        if (free_data && x->data)
            free_data(ud, x->data);
        free(x->kids);
        free(x->tok);
        free(x);
        x = next;
    }
    if (free_data && t->root->data)
        free_data(ud, t->root->data);
    free(t->root->kids);
    free(t->root);
    memset(t, 0, sizeof(*t));
}

/* Index of the child starting with tok, or -(insertion point) - 1. */
static int kid_find(const hp_radix_node_t *n, int tok)
{
    int lo = 0, hi = n->n_kids - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, v = n->kids[mid]->tok[0];
        if (v == tok)
            return mid;
        if (v < tok)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -lo - 1;
}

hp_radix_node_t *hp_radix_child(const hp_radix_node_t *n, int tok)
{
    int i = kid_find(n, tok);
    return i >= 0 ? n->kids[i] : NULL;
}

static int kid_insert(hp_radix_node_t *p, hp_radix_node_t *c)
{
    int i = kid_find(p, c->tok[0]);
    if (i >= 0)
        return HP_EBADINPUT;
    i = -i - 1;
    if (p->n_kids == p->cap_kids) {
        int cap = p->cap_kids ? 2 * p->cap_kids : 2;
        hp_radix_node_t **k = realloc(p->kids, (size_t)cap * sizeof(*k));
        if (!k)
            return HP_ENOMEM;
        p->kids = k;
        p->cap_kids = cap;
    }
    memmove(p->kids + i + 1, p->kids + i,
            (size_t)(p->n_kids - i) * sizeof(*p->kids));
    p->kids[i] = c;
    p->n_kids++;
    c->parent = p;
    return HP_OK;
}

static void kid_replace(hp_radix_node_t *p, hp_radix_node_t *old,
                        hp_radix_node_t *by)
{
    int i = kid_find(p, old->tok[0]);
    p->kids[i] = by;
    by->parent = p;
}

void hp_radix_match(const hp_radix_t *t, const int *ids, int n,
                    hp_radix_match_t *m)
{
    hp_radix_node_t *x = t->root;
    int d = 0;
    m->edge = NULL;
    while (d < n) {
        hp_radix_node_t *c = hp_radix_child(x, ids[d]);
        if (!c)
            break;
        int k = 0;
        while (k < c->len && d + k < n && c->tok[k] == ids[d + k])
            k++;
        if (k < c->len) {
            m->edge = c;
            d += k;
            break;
        }
        x = c;
        d += k;
    }
    m->node = x;
    m->depth = d;
}

hp_radix_node_t *hp_radix_split(hp_radix_t *t, hp_radix_node_t *n, int k,
                                hp_error_t *err)
{
    if (k <= 0 || k >= n->len) {
        hp_error_set(err, HP_EBADINPUT, "radix: split %d of %d", k, n->len);
        return NULL;
    }
    int *rest = malloc((size_t)(n->len - k) * sizeof(int));
    hp_radix_node_t *m = node_new(t, n->tok, k);
    hp_radix_node_t **kids = malloc(2 * sizeof(*kids));
    if (!rest || !m || !kids) {
        free(rest);
        free(kids);
        if (m)
            node_unlink_free(t, m);
        hp_error_set(err, HP_ENOMEM, "radix: out of memory");
        return NULL;
    }
    t->n_tokens -= (size_t)k; /* the k tokens moved, not added */
    memcpy(rest, n->tok + k, (size_t)(n->len - k) * sizeof(int));
    m->depth = n->depth - (n->len - k);
    kid_replace(n->parent, n, m);
    free(n->tok);
    n->tok = rest;
    n->len -= k;
    m->kids = kids;
    m->cap_kids = 2;
    m->kids[0] = n;
    m->n_kids = 1;
    n->parent = m;
    return m;
}

hp_radix_node_t *hp_radix_add(hp_radix_t *t, hp_radix_node_t *parent,
                              const int *ids, int n, hp_error_t *err)
{
    if (n <= 0 || hp_radix_child(parent, ids[0])) {
        hp_error_set(err, HP_EBADINPUT, "radix: bad leaf");
        return NULL;
    }
    hp_radix_node_t *x = node_new(t, ids, n);
    if (!x) {
        hp_error_set(err, HP_ENOMEM, "radix: out of memory");
        return NULL;
    }
    x->depth = parent->depth + n;
    if (kid_insert(parent, x) != HP_OK) {
        node_unlink_free(t, x);
        hp_error_set(err, HP_ENOMEM, "radix: out of memory");
        return NULL;
    }
    return x;
}

hp_radix_node_t *hp_radix_merge(hp_radix_t *t, hp_radix_node_t *n,
                                hp_error_t *err)
{
    if (!n->parent || n->n_kids != 1) {
        hp_error_set(err, HP_EBADINPUT, "radix: merge needs one child");
        return NULL;
    }
    hp_radix_node_t *c = n->kids[0];
    int *tok = malloc((size_t)(n->len + c->len) * sizeof(int));
    if (!tok) {
        hp_error_set(err, HP_ENOMEM, "radix: out of memory");
        return NULL;
    }
    memcpy(tok, n->tok, (size_t)n->len * sizeof(int));
    memcpy(tok + n->len, c->tok, (size_t)c->len * sizeof(int));
    free(c->tok);
    c->tok = tok;
    c->len += n->len;
    kid_replace(n->parent, n, c);
    t->n_tokens += (size_t)n->len; /* stays counted once n is gone */
    node_unlink_free(t, n);
    return c;
}

void hp_radix_remove(hp_radix_t *t, hp_radix_node_t *n)
{
    hp_radix_node_t *p = n->parent;
    int i = kid_find(p, n->tok[0]);
    memmove(p->kids + i, p->kids + i + 1,
            (size_t)(p->n_kids - i - 1) * sizeof(*p->kids));
    p->n_kids--;
    node_unlink_free(t, n);
}

hp_radix_node_t *hp_radix_node_at(hp_radix_t *t, const int *ids, int d,
                                  int *split, hp_error_t *err)
{
    hp_radix_match_t m;
    *split = 0;
    hp_radix_match(t, ids, d, &m);
    if (m.depth < d) {
        hp_error_set(err, HP_EBADINPUT, "radix: depth %d not in tree", d);
        return NULL;
    }
    if (!m.edge)
        return m.node;
    *split = 1;
    return hp_radix_split(t, m.edge, d - m.node->depth, err);
}

hp_radix_node_t *hp_radix_insert(hp_radix_t *t, const int *ids, int n,
                                 int *created, hp_error_t *err)
{
    hp_radix_match_t m;
    hp_radix_node_t *at;
    int made = 0;
    hp_radix_match(t, ids, n, &m);
    at = m.node;
    if (m.edge) {
        at = hp_radix_split(t, m.edge, m.depth - m.node->depth, err);
        if (!at)
            goto out;
        made++;
    }
    if (m.depth < n) {
        at = hp_radix_add(t, at, ids + m.depth, n - m.depth, err);
        if (at)
            made++;
    }
out:
    if (created)
        *created = made;
    return at;
}

void hp_radix_path(const hp_radix_node_t *n, int *out)
{
    for (; n && n->parent; n = n->parent)
        memcpy(out + n->depth - n->len, n->tok, (size_t)n->len * sizeof(int));
}

int hp_radix_clone(hp_radix_t *dst, const hp_radix_t *src,
                   void *(*clone_data)(void *ud, const hp_radix_node_t *n),
                   void (*free_data)(void *ud, void *data), void *ud,
                   hp_error_t *err)
{
    int rc = hp_radix_init(dst, err);
    if (rc != HP_OK)
        return rc;
    /* iterative preorder: a stack of (source, copy) pairs */
    size_t cap = 64, top = 0;
    const hp_radix_node_t **ss = malloc(cap * sizeof(*ss));
    hp_radix_node_t **ds = malloc(cap * sizeof(*ds));
    if (!ss || !ds)
        goto nomem;
    if (src->root->data && clone_data &&
        !(dst->root->data = clone_data(ud, src->root)))
        goto nomem;
    ss[top] = src->root;
    ds[top++] = dst->root;
    while (top > 0) {
        const hp_radix_node_t *s = ss[--top];
        hp_radix_node_t *d = ds[top];
        if (s->n_kids) {
            d->kids = malloc((size_t)s->n_kids * sizeof(*d->kids));
            if (!d->kids)
                goto nomem;
            d->cap_kids = s->n_kids;
        }
        for (int i = 0; i < s->n_kids; i++) {
            const hp_radix_node_t *sc = s->kids[i];
            hp_radix_node_t *dc = node_new(dst, sc->tok, sc->len);
            if (!dc)
                goto nomem;
            dc->depth = sc->depth;
            dc->parent = d;
            d->kids[d->n_kids++] = dc;
            if (sc->data && clone_data && !(dc->data = clone_data(ud, sc)))
                goto nomem;
            if (top == cap) {
                cap *= 2;
                const hp_radix_node_t **s2 = realloc(ss, cap * sizeof(*ss));
                if (s2)
                    ss = s2;
                hp_radix_node_t **d2 = realloc(ds, cap * sizeof(*ds));
                if (d2)
                    ds = d2;
                if (!s2 || !d2)
                    goto nomem;
            }
            ss[top] = sc;
            ds[top++] = dc;
        }
    }
    free(ss);
    free(ds);
    return HP_OK;
nomem:
    free(ss);
    free(ds);
    hp_radix_free(dst, free_data, ud);
    return hp_error_set(err, HP_ENOMEM, "radix: out of memory");
}
