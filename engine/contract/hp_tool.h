/*
 * hp_tool.h - tool calls in a model's output, as Qwen writes them:
 *
 *   text <tool_call>BODY</tool_call> <tool_call>BODY</tool_call> text
 *
 * where BODY is JSON, {"name": N, "arguments": {...}} (Qwen2.5, Qwen3),
 * or XML, <function=N><parameter=K>\nV\n</parameter>...</function>
 * (Qwen3-Coder, Qwen3.5). Used by the nginx module on the text the engine
 * streams (the answer's message.tool_calls, delta.tool_calls); plain C
 * with cJSON, which both sides link.
 */
#ifndef HP_TOOL_H
#define HP_TOOL_H

#include <stddef.h>

#include <cJSON.h>

#define HP_TOOL_OPEN  "<tool_call>"
#define HP_TOOL_CLOSE "</tool_call>"

/* what the scanner hands its sink */
enum {
    HP_TOOL_TEXT = 1, /* content: text outside the blocks */
    HP_TOOL_BLOCK = 2 /* a whole block's BODY, without the tags */
};

/* Returns 0, or -1 to stop the scan (that error is the scanner's). */
typedef int (*hp_tool_sink_fn)(void *ud, int kind, const char *data,
                               size_t len);

/*
 * The streaming scanner: text goes in piece by piece, as the model wrote
 * it; content and blocks come out as soon as they are certain. A tag cut
 * between pieces is held until the next one. Whitespace that only
 * separates text from a block (before <tool_call>, after </tool_call>)
 * is not content. Zero-initialise; free with hp_tool_scan_free.
 */
typedef struct {
    char *buf; /* held: a possible tag start (out), the BODY so far (in) */
    size_t len, cap;
    int in;    /* inside a block */
    int after; /* a block ended and no content came since */
} hp_tool_scan_t;

/* Feeds text[len]. 0, or -1 (no memory, or the sink stopped). */
int hp_tool_scan_feed(hp_tool_scan_t *s, const char *text, size_t len,
                      hp_tool_sink_fn sink, void *ud);

/* The end of the output: what is held goes out as content (a block that
 * never closed is text, tags included). 0, or -1. */
int hp_tool_scan_end(hp_tool_scan_t *s, hp_tool_sink_fn sink, void *ud);

void hp_tool_scan_free(hp_tool_scan_t *s);

/*
 * One block's BODY as a call: *name and *arguments (a JSON object's
 * text), malloc'd. tools: the request's OpenAI tools array, or NULL; the
 * XML form takes a parameter's type from it (a "string" parameter, or one
 * the schema does not name, stays text; any other is JSON when it parses
 * as JSON). 0, or -1 when BODY is not a well-formed call (nothing
 * allocated).
 */
int hp_tool_parse(const char *body, size_t len, const cJSON *tools, char **name,
                  char **arguments);

#endif
