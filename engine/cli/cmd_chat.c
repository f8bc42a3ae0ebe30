/*
 * cmd_chat.c - `hypic-engine chat`: the prompt the model's chat template
 * makes of an OpenAI chat request, exactly as `serve` renders it (the
 * tests compare it with transformers' apply_chat_template).
 */
#include <stdio.h>
#include <stdlib.h>

#include "engine/cli/cli.h"
#include "engine/cli/options.h"
#include "engine/tokenizer/chat.h"

static const char usage_text[] =
    "usage: hypic-engine chat --model DIR (--prompt-file F | --prompt S)\n"
    "\n"
    "Prints the prompt DIR's chat template (chat_template.jinja, else\n"
    "tokenizer_config.json's chat_template, else ChatML) makes of the\n"
    "OpenAI chat request (JSON: messages, tools, tool_choice,\n"
    "chat_template_kwargs) in F or S, with no newline added. A request\n"
    "the template refuses exits 1 with its message.\n";

int hp_cmd_chat(int argc, char **argv)
{
    hp_cli_opts_t o;
    hp_error_t err = {0};
    hp_chat_t *chat = NULL;
    size_t len, n;
    char *body, *text;

    if (hp_cli_parse(&o, argc, argv, "chat") != 0)
        return 2;
    if (o.help || !o.model) {
        fputs(usage_text, o.help ? stdout : stderr);
        return o.help ? 0 : 2;
    }
    if (!(body = hp_cli_prompt(&o, "chat", &len)))
        return 2;
    int rc = hp_chat_load(&chat, o.model, &err);
    if (rc == HP_OK)
        rc = hp_chat_render(chat, body, len, &text, &n, &err);
    free(body);
    hp_chat_free(chat);
    if (rc != HP_OK) {
        fprintf(stderr, "hypic-engine chat: %s\n", err.msg);
        return 1;
    }
    fwrite(text, 1, n, stdout);
    free(text);
    return 0;
}
