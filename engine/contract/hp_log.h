/*
 * hp_log.h - log levels and the logging callback every engine subsystem
 * takes: library code never prints, it hands lines to whoever runs it (the
 * serve command writes them to stderr with a timestamp).
 */
#ifndef HP_LOG_H
#define HP_LOG_H

enum { HP_LOG_ERROR = 0, HP_LOG_WARN = 1, HP_LOG_INFO = 2, HP_LOG_DEBUG = 3 };

typedef void (*hp_log_fn)(void *ud, int level, const char *msg);

#endif
