/*
 * fuzz_util.h - what the libFuzzer targets share: an input handed to a
 * reader that takes a path (through a memfd, so nothing touches the disk)
 * and the check that fails a run with a message.
 */
#ifndef HP_FUZZ_UTIL_H
#define HP_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* A broken invariant: report it and abort, which libFuzzer records as a
 * crash with the input that caused it. */
#define FUZZ_CHECK(cond)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "fuzz: %s:%d: %s\n", __FILE__, __LINE__, #cond);   \
            abort();                                                           \
        }                                                                      \
    } while (0)

/* The path of a file that holds exactly data[size]; the same memfd is
 * rewritten for every input of the run. */
static inline const char *fuzz_file(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("hypic-fuzz", 0);
        FUZZ_CHECK(fd >= 0);
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    }
    FUZZ_CHECK(ftruncate(fd, 0) == 0);
    FUZZ_CHECK(size == 0 || pwrite(fd, data, size, 0) == (ssize_t)size);
    return path;
}

/* The model folder of the targets that need one: HYPIC_FUZZ_MODEL, or
 * the dense test model (the targets run from the repository root). */
static inline const char *fuzz_model_dir(void)
{
    const char *dir = getenv("HYPIC_FUZZ_MODEL");
    return dir ? dir : "models/test/qwen35-dense";
}

/* A target that cannot start: why, and what to do about it. */
static inline int fuzz_setup_failed(const char *what)
{
    fprintf(stderr,
            "fuzz: %s (%s: run from the repository root or set "
            "HYPIC_FUZZ_MODEL)\n",
            what, fuzz_model_dir());
    exit(1);
}

#endif
