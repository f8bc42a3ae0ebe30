/* cli.h - the subcommands of hypic-engine, each in cli/cmd_<name>.c. */
#ifndef HP_CLI_H
#define HP_CLI_H

int hp_cmd_tokenize(int argc, char **argv);
int hp_cmd_generate(int argc, char **argv);
int hp_cmd_logits(int argc, char **argv);
int hp_cmd_state(int argc, char **argv);
int hp_cmd_serve(int argc, char **argv);
int hp_cmd_chat(int argc, char **argv);

#endif
