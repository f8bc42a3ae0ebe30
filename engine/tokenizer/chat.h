/*
 * chat.h - a checkpoint's chat template, rendered as Hugging Face renders
 * it: the Jinja source of chat_template.jinja (or tokenizer_config.json's
 * "chat_template"), run by jinja2 in an embedded CPython with the
 * environment transformers' apply_chat_template sets up (sandboxed,
 * trim_blocks/lstrip_blocks, loop controls, the {% generation %} tag,
 * raise_exception, strftime_now, a tojson that does not escape HTML).
 * A checkpoint without a template gets ChatML.
 *
 * The input is an OpenAI chat request body; what reaches the template is
 * what a transformers user passes: `messages` (developer as system, text
 * parts joined, tool-call arguments given as JSON text parsed to objects,
 * keys whose value is null dropped, reasoning under its three names),
 * `tools` (only the named one for a named tool_choice),
 * `add_generation_prompt` true, the tokenizer's special tokens and
 * `chat_template_kwargs` over them.
 *
 * Every call takes the interpreter's lock: any thread may render.
 */
#ifndef HP_CHAT_H
#define HP_CHAT_H

#include <stddef.h>

#include "engine/contract/hp_error.h"

typedef struct hp_chat hp_chat_t;

/*
 * Loads DIR's template and special tokens (tokenizer_config.json),
 * starting the interpreter the first time. Errors: HP_EMODEL (an
 * unreadable tokenizer_config.json), HP_EUNAVAIL (no Python or no
 * jinja2). A template that does not compile loads: as in transformers,
 * the requests that use it fail with the syntax error.
 */
int hp_chat_load(hp_chat_t **out, const char *dir, hp_error_t *err);

/* Where the template came from: "chat_template.jinja",
 * "tokenizer_config.json" or "ChatML (the model has none)". */
const char *hp_chat_origin(const hp_chat_t *c);

/*
 * Renders body[len] (an OpenAI chat request, JSON) into a malloc'd,
 * NUL-terminated prompt (*out, *out_len bytes). HP_EBADINPUT with the
 * template's own message when it refuses (raise_exception) or fails.
 */
int hp_chat_render(hp_chat_t *c, const char *body, size_t len, char **out,
                   size_t *out_len, hp_error_t *err);

/* Whether the template teaches tool calls in Qwen's XML syntax
 * (<function=N><parameter=K>, Qwen3-Coder and Qwen3.5) rather than JSON
 * inside <tool_call>: the syntax structured tool calls are forced in. */
int hp_chat_tool_xml(const hp_chat_t *c);

void hp_chat_free(hp_chat_t *c);

#endif
