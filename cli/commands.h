/*
 * commands.h — the subcommands; each takes argv with argv[0] = its name and
 * returns the process exit status.
 */
#ifndef FD_CLI_COMMANDS_H
#define FD_CLI_COMMANDS_H

int cmd_generate(int argc, char **argv, const char *exe_path);
int cmd_bench(int argc, char **argv);
int cmd_check(int argc, char **argv);

#endif /* FD_CLI_COMMANDS_H */
