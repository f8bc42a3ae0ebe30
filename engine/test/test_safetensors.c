/*
 * test_safetensors.c - safetensors writer/reader round trip, dtype
 * conversion against hand-computed values, and rejection of corrupted files.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/model/safetensors.h"
#include "t/lib/tap.h"

static char tmpdir[64];

static const char *tpath(const char *name)
{
    static char buf[128];
    snprintf(buf, sizeof(buf), "%s/%s", tmpdir, name);
    return buf;
}

/* Writes u64 header length + header (unpadded) + data. */
static void write_raw(const char *path, const char *hdr, const void *data,
                      size_t n)
{
    FILE *fp = fopen(path, "wb");
    uint64_t len = strlen(hdr);
    unsigned char l8[8];
    for (int i = 0; i < 8; i++)
        l8[i] = (unsigned char)(len >> (8 * i));
    if (!fp || fwrite(l8, 1, 8, fp) != 8 || fwrite(hdr, 1, len, fp) != len ||
        (n && fwrite(data, 1, n, fp) != n)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fclose(fp);
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp || (n && fwrite(p, 1, n, fp) != n)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fclose(fp);
}

static void test_round_trip(void)
{
    float a[6] = {1.5f, -2.0f, 0.0f, 3.25f, -0.0f, 1e-30f};
    float b[24], s = 42.0f;
    for (int i = 0; i < 24; i++)
        b[i] = (float)i * 0.5f - 3.0f;
    hp_st_out_t outs[4] = {
        {"model.w", 2, {2, 3}, a},
        {"x.cube", 3, {2, 3, 4}, b},
        {"scalar", 0, {0}, &s},
        {"empty", 2, {0, 5}, NULL},
    };
    hp_error_t err = {0};
    const char *p = tpath("rt.safetensors");
    int rc = hp_st_write_f32(p, outs, 4, &err);
    ok(rc == HP_OK, "write 4 tensors (%s)", err.msg);

    hp_st_file_t f;
    rc = hp_st_open(&f, p, &err);
    ok(rc == HP_OK, "read back (%s)", err.msg);
    if (rc != HP_OK)
        return;
    ok(f.n_tensors == 4, "4 tensors indexed");
    uint64_t hlen = 0;
    memcpy(&hlen, f.map, 8); /* little-endian host */
    ok(hlen % 8 == 0, "header padded to 8 bytes (%llu)",
       (unsigned long long)hlen);
    const char *h = (const char *)f.map + 8;
    uint64_t close = hlen;
    while (close > 0 && h[close - 1] == ' ')
        close--;
    ok(close > 0 && h[close - 1] == '}' && (close + 7) / 8 * 8 == hlen,
       "header = JSON + %llu spaces of padding",
       (unsigned long long)(hlen - close));

    const hp_st_tensor_t *t = hp_st_find(&f, "model.w");
    ok(t && t->dtype == HP_DT_F32 && t->ndim == 2 && t->shape[0] == 2 &&
           t->shape[1] == 3 && t->nbytes == 24,
       "model.w: F32 [2, 3]");
    ok(t && memcmp(t->data, a, sizeof(a)) == 0, "model.w bytes equal");
    t = hp_st_find(&f, "x.cube");
    ok(t && t->ndim == 3 && t->shape[2] == 4 &&
           memcmp(t->data, b, sizeof(b)) == 0,
       "x.cube [2, 3, 4] equal");
    t = hp_st_find(&f, "scalar");
    ok(t && t->ndim == 0 && t->nbytes == 4 && memcmp(t->data, &s, 4) == 0,
       "0-d scalar");
    t = hp_st_find(&f, "empty");
    ok(t && t->ndim == 2 && t->shape[0] == 0 && t->nbytes == 0, "empty [0, 5]");
    ok(hp_st_find(&f, "nope") == NULL && hp_st_find(&f, "model") == NULL,
       "absent names give NULL");
    float back[6];
    t = hp_st_find(&f, "model.w");
    if (t) {
        hp_st_to_f32(back, t->data, t->dtype, 6);
        ok(memcmp(back, a, sizeof(a)) == 0 && signbit(back[4]),
           "F32 conversion is a copy (keeps -0)");
    }
    hp_st_close(&f);
    hp_st_close(&f); /* idempotent */

    /* writer rejects duplicates and unwritable paths */
    hp_st_out_t dup[2] = {{"a", 1, {1}, a}, {"a", 1, {1}, a}};
    ok(hp_st_write_f32(tpath("dup.safetensors"), dup, 2, &err) == HP_EBADINPUT,
       "writer rejects duplicate names");
    ok(hp_st_write_f32("/nonexistent-dir/x.safetensors", outs, 1, &err) ==
           HP_EIO,
       "writer reports an unwritable path: %s", err.msg);
}

/* Independent IEEE half decoding with ldexp, for the exhaustive check. */
static double half_ref(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, -24);
    else
        v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static void test_conversions(void)
{
    /* bf16: the upper half of an f32 */
    const uint16_t bf[] = {0x3F80, 0xC000, 0x3E80, 0x4049, 0x7F80,
                           0xFF80, 0x0001, 0x8000, 0x7FC0};
    const float bf_want[] = {1.0f,      -2.0f,     0.25f, 3.140625f, INFINITY,
                             -INFINITY, 0x1p-133f, -0.0f, NAN};
    float got[16];
    hp_st_to_f32(got, bf, HP_DT_BF16, 9);
    int good = 1;
    for (int i = 0; i < 8; i++)
        good &= got[i] == bf_want[i];
    ok(good && signbit(got[7]) && isnan(got[8]),
       "bf16 -> f32: 1, -2, 0.25, 3.140625, +-inf, 2^-133, -0, nan");

    /* f16 by hand: normals, extremes, subnormals, specials */
    const uint16_t hf[] = {0x3C00, 0xC000, 0x3555, 0x7BFF, 0x0400,
                           0x0001, 0x03FF, 0x0200, 0x8001, 0x7C00,
                           0xFC00, 0x7E00, 0x8000, 0x3800, 0x4248};
    const float hf_want[] = {1.0f,      -2.0f,    0.333251953125f,    65504.0f,
                             0x1p-14f,  0x1p-24f, 1023.0f * 0x1p-24f, 0x1p-15f,
                             -0x1p-24f, INFINITY, -INFINITY,          NAN,
                             -0.0f,     0.5f,     3.140625f};
    hp_st_to_f32(got, hf, HP_DT_F16, 15);
    good = 1;
    for (int i = 0; i < 15; i++) {
        if (i == 11)
            continue;
        if (got[i] != hf_want[i]) {
            tap_diag("f16 0x%04x -> %.9g, want %.9g", hf[i], got[i],
                     hf_want[i]);
            good = 0;
        }
    }
    ok(good && isnan(got[11]) && signbit(got[12]),
       "f16 -> f32 hand values (subnormals 2^-24, 2^-15, 1023*2^-24, max "
       "65504, +-inf, nan, -0)");

    /* every one of the 65536 halves against the ldexp reference */
    uint16_t *all = malloc(65536 * sizeof(*all));
    float *conv = malloc(65536 * sizeof(*conv));
    for (int i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    hp_st_to_f32(conv, all, HP_DT_F16, 65536);
    int bad = 0;
    for (int i = 0; i < 65536; i++) {
        double r = half_ref((uint16_t)i);
        int same = isnan(r) ? isnan(conv[i])
                            : ((double)conv[i] == r &&
                               !signbit(conv[i]) == !signbit(r));
        if (!same && bad++ < 5)
            tap_diag("f16 0x%04x -> %.9g, want %.9g", i, conv[i], r);
    }
    ok(bad == 0, "all 65536 f16 values exact (%d wrong)", bad);
    free(all);
    free(conv);

    const double d[3] = {0.1, -1e300, 7.0};
    hp_st_to_f32(got, d, HP_DT_F64, 3);
    ok(got[0] == 0.1f && isinf(got[1]) && got[2] == 7.0f, "f64 -> f32");
    const int32_t i32[3] = {-5, 0, 16777216};
    hp_st_to_f32(got, i32, HP_DT_I32, 3);
    ok(got[0] == -5.0f && got[1] == 0.0f && got[2] == 16777216.0f,
       "i32 -> f32");
    const int64_t i64[2] = {-3, 1LL << 40};
    hp_st_to_f32(got, i64, HP_DT_I64, 2);
    ok(got[0] == -3.0f && got[1] == 0x1p40f, "i64 -> f32");
    const int8_t i8[3] = {-128, 0, 127};
    hp_st_to_f32(got, i8, HP_DT_I8, 3);
    ok(got[0] == -128.0f && got[1] == 0.0f && got[2] == 127.0f, "i8 -> f32");
    ok(hp_dtype_size(HP_DT_BF16) == 2 && hp_dtype_size(HP_DT_I64) == 8 &&
           hp_dtype_size(HP_DT_I8) == 1 &&
           strcmp(hp_dtype_name(HP_DT_BF16), "BF16") == 0 &&
           strcmp(hp_dtype_name(HP_DT_I8), "I8") == 0,
       "dtype sizes and names");
}

static void test_other_dtypes_and_metadata(void)
{
    /* unaligned start (2-byte tensor first), BF16 + I32 + metadata */
    unsigned char data[2 + 8 + 4];
    const uint16_t one = 0x3F80;
    const int32_t ids[2] = {7, -1};
    const float pi = 3.5f;
    memcpy(data, &one, 2);
    memcpy(data + 2, ids, 8);
    memcpy(data + 10, &pi, 4);
    write_raw(tpath("mixed.safetensors"),
              "{\"__metadata__\":{\"format\":\"pt\"},"
              "\"b\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]},"
              "\"ids\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[2,"
              "10]},"
              "\"f\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[10,14]}"
              "}",
              data, sizeof(data));
    hp_st_file_t f;
    hp_error_t err = {0};
    int rc = hp_st_open(&f, tpath("mixed.safetensors"), &err);
    ok(rc == HP_OK && f.n_tensors == 3, "metadata skipped, 3 tensors (%s)",
       err.msg);
    if (rc != HP_OK)
        return;
    const hp_st_tensor_t *t = hp_st_find(&f, "ids");
    float v[2] = {0};
    if (t)
        hp_st_to_f32(v, t->data, t->dtype, 2);
    ok(t && t->dtype == HP_DT_I32 && v[0] == 7.0f && v[1] == -1.0f,
       "I32 tensor read at an unaligned offset");
    t = hp_st_find(&f, "f");
    if (t)
        hp_st_to_f32(v, t->data, t->dtype, 1);
    ok(t && v[0] == 3.5f, "F32 scalar at an unaligned offset converts");
    hp_st_close(&f);
}

static void expect_reject(const char *what, const char *hdr, size_t data_len,
                          const char *needle)
{
    static const unsigned char zeros[64];
    const char *p = tpath("bad.safetensors");
    write_raw(p, hdr, zeros, data_len);
    hp_st_file_t f;
    hp_error_t err = {0};
    int rc = hp_st_open(&f, p, &err);
    ok(rc == HP_EMODEL && strstr(err.msg, "bad.safetensors") &&
           (!needle || strstr(err.msg, needle)),
       "rejects %s: %s", what, err.msg);
    ok(f.map == NULL && f.tensors == NULL, "  nothing left mapped");
    if (rc == HP_OK)
        hp_st_close(&f);
}

static void test_corrupt(void)
{
    hp_error_t err = {0};
    hp_st_file_t f;

    write_bytes(tpath("short.safetensors"), "abc", 3);
    ok(hp_st_open(&f, tpath("short.safetensors"), &err) == HP_EMODEL,
       "rejects a 3-byte file: %s", err.msg);
    ok(hp_st_open(&f, tpath("missing.safetensors"), &err) == HP_EIO &&
           strstr(err.msg, "missing.safetensors"),
       "missing file is HP_EIO: %s", err.msg);

    unsigned char big[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, '{'};
    write_bytes(tpath("huge.safetensors"), big, sizeof(big));
    ok(hp_st_open(&f, tpath("huge.safetensors"), &err) == HP_EMODEL &&
           strstr(err.msg, "header length"),
       "rejects a header length past the end: %s", err.msg);
    unsigned char zero[12] = {0};
    write_bytes(tpath("zero.safetensors"), zero, sizeof(zero));
    ok(hp_st_open(&f, tpath("zero.safetensors"), &err) == HP_EMODEL,
       "rejects a zero header length: %s", err.msg);

    const char *T = "\"t\":{\"dtype\":\"F32\",\"shape\":[2],";
    char h[256];
    expect_reject("invalid JSON", "{\"t\":{\"dtype\":\"F32\",", 8, "JSON");
    expect_reject("a non-object header", "[1, 2]", 0, "object");
    expect_reject("an unknown dtype",
                  "{\"t\":{\"dtype\":\"F33\",\"shape\":[2],"
                  "\"data_offsets\":[0,8]}}",
                  8, "F33");
    snprintf(h, sizeof(h), "{%s\"data_offsets\":[0,16]}}", T);
    expect_reject("offsets past the data (truncated)", h, 8, "truncated");
    snprintf(h, sizeof(h), "{%s\"data_offsets\":[0,4]}}", T);
    expect_reject("size != shape x dtype", h, 8, "needs 8");
    snprintf(h, sizeof(h), "{%s\"data_offsets\":[8,0]}}", T);
    expect_reject("begin > end", h, 8, "data_offsets");
    snprintf(h, sizeof(h), "{%s\"data_offsets\":[0]}}", T);
    expect_reject("one offset", h, 8, "data_offsets");
    snprintf(h, sizeof(h), "{%s\"data_offsets\":[-8,0]}}", T);
    expect_reject("a negative offset", h, 8, "data_offsets");
    expect_reject("a negative dim",
                  "{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],"
                  "\"data_offsets\":[0,8]}}",
                  8, "shape");
    expect_reject("a fractional dim",
                  "{\"t\":{\"dtype\":\"F32\",\"shape\":[2.5],"
                  "\"data_offsets\":[0,8]}}",
                  8, "shape");
    expect_reject("9 dims",
                  "{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,"
                  "2],\"data_offsets\":[0,8]}}",
                  8, "dims");
    expect_reject("a missing dtype",
                  "{\"t\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "t");
    expect_reject("an entry that is not an object", "{\"t\":5}", 0, "t");
    snprintf(h, sizeof(h),
             "{%s\"data_offsets\":[0,8]},%s\"data_offsets\":[0,"
             "8]}}",
             T, T);
    expect_reject("a duplicate name", h, 8, "twice");
    expect_reject("an overflowing shape",
                  "{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,"
                  "4294967296],\"data_offsets\":[0,8]}}",
                  8, "overflow");

    /* a valid file cut short: the last tensor no longer fits */
    float w[32] = {0};
    hp_st_out_t o[2] = {{"first", 1, {16}, w}, {"second.weight", 1, {16}, w}};
    hp_st_write_f32(tpath("cut.safetensors"), o, 2, &err);
    struct stat st;
    /* cut 40 of the 64 data bytes of the last tensor */
    if (stat(tpath("cut.safetensors"), &st) != 0 ||
        truncate(tpath("cut.safetensors"), st.st_size - 40) != 0)
        tap_diag("cannot truncate");
    int rc = hp_st_open(&f, tpath("cut.safetensors"), &err);
    ok(rc == HP_EMODEL && strstr(err.msg, "second.weight") &&
           strstr(err.msg, "cut.safetensors"),
       "a truncated file names the file and tensor: %s", err.msg);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/hp_st_test_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    test_round_trip();
    test_conversions();
    test_other_dtypes_and_metadata();
    test_corrupt();

    const char *names[] = {"rt",    "dup",  "mixed", "bad",
                           "short", "huge", "zero",  "cut"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char n[64];
        snprintf(n, sizeof(n), "%s.safetensors", names[i]);
        unlink(tpath(n));
    }
    rmdir(tmpdir);
    return tap_done();
}
