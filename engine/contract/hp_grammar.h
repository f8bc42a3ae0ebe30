/*
 * hp_grammar.h - structured output: what a request's output must match
 * (OpenAI's response_format, tool_choice "required" or a named function),
 * compiled to a grammar the decoder masks tokens with
 * (engine/forward/gmask.h). Compiled by the nginx module too, to answer a
 * schema it cannot compile with a 400 before anything is queued: one
 * compiler, plain C with cJSON, which both sides link.
 *
 * The grammar
 *
 *   A set of rules over bytes, each a list of alternatives, each a
 *   sequence of elements ending in HP_G_END:
 *
 *     HP_G_BYTE   one byte (`byte`)
 *     HP_G_CLASS  one byte of the 256-bit set classes[arg]
 *     HP_G_RULE   rule `arg` (alternatives; right recursion for loops,
 *                 never left recursion)
 *     HP_G_STR    a JSON string's body and its closing quote: escapes,
 *                 well-formed UTF-8, no control bytes, between
 *                 HP_G_STR_MIN(arg) and HP_G_STR_MAX(arg) characters
 *     HP_G_UNTIL  any text up to and including the first occurrence of
 *                 terms[arg] (a tool parameter's text, a thought)
 *
 *   Rule 0 is the whole output. The recogniser (gmask.h) runs it as a
 *   pushdown automaton, a set of stacks of element positions; the last
 *   three are terminals it steps natively, with a per-stack counter.
 *
 * JSON Schema, as OpenAI's strict mode and pydantic write it
 *
 *   type (a name or a list), properties, required, additionalProperties,
 *   items, minItems/maxItems, minLength/maxLength, enum, const, anyOf,
 *   allOf of one schema, $ref to "#", "#/$defs/N" or "#/definitions/N"
 *   (recursion allowed); title, description, default, examples, $schema,
 *   $id, $comment, strict, deprecated, readOnly and writeOnly are
 *   annotations. Any other keyword is an error naming it and its path.
 *   What is generated is a subset of what the schema accepts, so the
 *   output always validates:
 *     - properties come in the schema's order, each required one, each
 *       optional one or not; no property the schema does not name
 *       (additionalProperties only shapes an object without properties:
 *       a map whose values follow it);
 *     - at most HP_GRAMMAR_WS whitespace bytes between JSON tokens, none
 *       before or after the value;
 *     - numbers: at most 15 integer digits, 15 fraction digits, 3
 *       exponent digits;
 *     - `{}`, true or a schema with no type: any JSON value.
 *   json_object is any JSON object.
 *
 * Requests (hp_grammar_compile): a JSON object with the OpenAI fields
 * that constrain the output, as a chat body carries them:
 *   response_format {type: text | json_object | json_schema{schema}},
 *   tools, tool_choice ("none", "auto", "required" or a named
 *   function), parallel_tool_calls (default true).
 * tool_choice "required" or named: the output is tool calls only, in
 * the chat template's syntax (HP_GRAMMAR_TOOLS_*), their arguments
 * following each tool's `parameters` schema; "required" with parallel
 * calls allows one or more, else exactly one. tool_choice "auto" with a
 * JSON response_format: the JSON value or tool calls. Nothing to
 * constrain: no grammar (*out NULL).
 */
#ifndef HP_GRAMMAR_H
#define HP_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#define HP_GRAMMAR_WS 8 /* whitespace bytes between JSON tokens, at most */

enum {
    HP_G_END = 0,
    HP_G_BYTE = 1,
    HP_G_CLASS = 2,
    HP_G_RULE = 3,
    HP_G_STR = 4,
    HP_G_UNTIL = 5
};

#define HP_G_STR_UNBOUNDED   0xffffu
#define HP_G_STR_ARG(lo, hi) ((uint32_t)(lo) | ((uint32_t)(hi) << 16))
#define HP_G_STR_MIN(arg)    ((arg)&0xffffu)
#define HP_G_STR_MAX(arg)    ((arg) >> 16)

typedef struct {
    uint8_t type; /* HP_G_* */
    uint8_t byte; /* HP_G_BYTE */
    uint16_t reserved;
    uint32_t arg; /* class, rule, string bounds or term */
} hp_g_elem_t;

typedef struct {
    uint32_t first; /* alts[first..first + n) */
    uint32_t n;
} hp_g_rule_t;

typedef struct {
    uint32_t bits[8];
} hp_g_class_t;

/* the tool-call syntax a chat template teaches */
enum {
    HP_GRAMMAR_TOOLS_JSON = 0, /* <tool_call>\n{"name": N, "arguments": A}\n
                                  </tool_call> (Qwen2.5, Qwen3) */
    HP_GRAMMAR_TOOLS_XML = 1   /* <tool_call>\n<function=N>\n<parameter=K>\n
                                  V\n</parameter>\n</function>\n</tool_call>
                                  (Qwen3-Coder, Qwen3.5) */
};

typedef struct {
    int tools;    /* HP_GRAMMAR_TOOLS_* */
    int thinking; /* the prompt leaves a thought open: any text up to
                     "</think>" and a blank line come first */
} hp_grammar_opts_t;

typedef struct {
    hp_g_elem_t *elems; /* alternatives, each ended by HP_G_END */
    uint32_t n_elems;
    uint32_t *alts; /* first element of each alternative */
    uint32_t n_alts;
    hp_g_rule_t *rules; /* rules[0]: the output */
    uint32_t n_rules;
    hp_g_class_t *classes;
    uint32_t n_classes;
    char **terms; /* HP_G_UNTIL's texts, NUL-terminated */
    uint32_t *term_len;
    uint32_t n_terms;
} hp_grammar_t;

/*
 * Compiles a request's constraint: spec[len] (JSON, see above) under
 * opts. 0 with *out set (NULL: nothing to constrain), or -1 with msg[cap]
 * saying why (the keyword and its path) and *param naming the request
 * field at fault ("response_format", "tools" or "tool_choice"); nothing
 * allocated then.
 */
int hp_grammar_compile(const char *spec, size_t len,
                       const hp_grammar_opts_t *opts, hp_grammar_t **out,
                       char *msg, size_t cap, const char **param);

/* The same from the request's parsed JSON (the module's). */
int hp_grammar_compile_json(const cJSON *spec, const hp_grammar_opts_t *opts,
                            hp_grammar_t **out, char *msg, size_t cap,
                            const char **param);

/* One JSON schema alone (tests, benches): 0 or -1 with msg. */
int hp_grammar_schema(const cJSON *schema, hp_grammar_t **out, char *msg,
                      size_t cap);

void hp_grammar_free(hp_grammar_t *g);

#endif
