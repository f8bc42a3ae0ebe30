/*
 * radix.h - a radix tree over token ids with compressed edges. Each node
 * holds the tokens of the edge from its parent, its depth and an opaque
 * payload the tree never looks at: structure only (match, insert, split,
 * merge, remove, clone). Not thread-safe; the owner serialises access.
 */
#ifndef HP_RADIX_H
#define HP_RADIX_H

#include <stddef.h>

#include "engine/contract/hp_error.h"

typedef struct hp_radix_node hp_radix_node_t;

struct hp_radix_node {
    hp_radix_node_t *parent; /* NULL for the root */
    hp_radix_node_t **kids;  /* [n_kids], by first edge token */
    int n_kids, cap_kids;
    int *tok;                             /* [len] the edge's tokens */
    int len;                              /* 0 only for the root */
    int depth;                            /* tokens root..end of this edge */
    void *data;                           /* the owner's payload */
    hp_radix_node_t *prev_all, *next_all; /* every non-root node */
};

typedef struct {
    hp_radix_node_t *root;
    hp_radix_node_t *all; /* first of the list of non-root nodes */
    int n_nodes;          /* non-root nodes */
    size_t n_tokens;      /* edge tokens held */
} hp_radix_t;

/* Where a token sequence leaves the tree. */
typedef struct {
    hp_radix_node_t *node; /* deepest node whose whole edge matched */
    hp_radix_node_t *edge; /* its child matched in part, or NULL */
    int depth;             /* tokens matched: node->depth + the part */
} hp_radix_match_t;

/* An empty tree. Returns HP_OK or HP_ENOMEM. */
int hp_radix_init(hp_radix_t *t, hp_error_t *err);

/* Frees every node; free_data (may be NULL) is called on each non-NULL
 * payload first. */
void hp_radix_free(hp_radix_t *t, void (*free_data)(void *ud, void *data),
                   void *ud);

/* The child of n whose edge starts with tok, or NULL. */
hp_radix_node_t *hp_radix_child(const hp_radix_node_t *n, int tok);

/* Longest match of ids[0..n). Never fails. */
void hp_radix_match(const hp_radix_t *t, const int *ids, int n,
                    hp_radix_match_t *m);

/* Splits n's edge after its first k tokens (0 < k < n->len): a new node
 * takes those k tokens and becomes n's parent (payload NULL, the caller
 * fills it). Returns the new node, NULL on HP_ENOMEM (tree unchanged). */
hp_radix_node_t *hp_radix_split(hp_radix_t *t, hp_radix_node_t *n, int k,
                                hp_error_t *err);

/* A new leaf under parent with edge ids[0..n) (n > 0; no child of parent
 * may start with ids[0]). Payload NULL. NULL on HP_ENOMEM/HP_EBADINPUT. */
hp_radix_node_t *hp_radix_add(hp_radix_t *t, hp_radix_node_t *parent,
                              const int *ids, int n, hp_error_t *err);

/* n (not the root) has exactly one child c: c's edge becomes n's edge
 * followed by its own, c takes n's place and n is freed. The caller deals
 * with n's payload first. Returns c, NULL on HP_ENOMEM (tree unchanged). */
hp_radix_node_t *hp_radix_merge(hp_radix_t *t, hp_radix_node_t *n,
                                hp_error_t *err);

/* Removes the leaf n (not the root) and frees it; its payload is the
 * caller's to free before. */
void hp_radix_remove(hp_radix_t *t, hp_radix_node_t *n);

/* The node at depth d on the path of ids (d <= the match depth of ids):
 * an existing node, or one made by splitting the edge that spans d
 * (*split set to 1, the new node's payload NULL). d = 0 is the root.
 * NULL on HP_ENOMEM or HP_EBADINPUT (ids not in the tree to depth d). */
hp_radix_node_t *hp_radix_node_at(hp_radix_t *t, const int *ids, int d,
                                  int *split, hp_error_t *err);

/* Inserts ids[0..n): splits where the path leaves an edge, adds a leaf
 * for the rest. Returns the node at depth n (the root when n == 0);
 * *created (may be NULL) gets the number of new nodes. NULL on
 * HP_ENOMEM (nodes made so far stay, payloads NULL). */
hp_radix_node_t *hp_radix_insert(hp_radix_t *t, const int *ids, int n,
                                 int *created, hp_error_t *err);

/* The tokens root..n into out[n->depth]. */
void hp_radix_path(const hp_radix_node_t *n, int *out);

/* Deep copy of src's structure into dst (initialised here); each
 * payload goes through clone_data (NULL: payloads become NULL). On
 * failure (HP_ENOMEM) dst is freed with free_data and empty. */
int hp_radix_clone(hp_radix_t *dst, const hp_radix_t *src,
                   void *(*clone_data)(void *ud, const hp_radix_node_t *n),
                   void (*free_data)(void *ud, void *data), void *ud,
                   hp_error_t *err);

#endif
