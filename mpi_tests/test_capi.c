/* The C API, compiled as C99: save with one layout, load with another, check every element;
 * async save with snapshot semantics; metadata queries; error codes and texts.
 * Runs at any rank count (registered at 1, 2, 4). Every rank runs every collective call and
 * counts its failed checks; the counts are summed at the end, so a failing check never makes
 * a rank skip a collective. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "h5ckpt/h5ckpt.h"

static int g_rank = 0, g_size = 1, g_failures = 0;

#define CHECK(cond, ...)                                                                         \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      ++g_failures;                                                                              \
      fprintf(stderr, "[rank %d] %s:%d: CHECK(%s) failed: ", g_rank, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                              \
      fprintf(stderr, "\n");                                                                     \
    }                                                                                            \
  } while (0)

/* A call that must succeed; prints h5ckpt_last_error() otherwise. */
#define OK(call)                                                                                           \
  do {                                                                                                     \
    int rc_ = (call);                                                                                      \
    CHECK(rc_ == H5CKPT_OK, "%s -> %d (%s): %s", #call, rc_, h5ckpt_error_name(rc_), h5ckpt_last_error()); \
  } while (0)

/* Independent expectations: the value of each global element. */
static float w_value(int64_t i, int64_t j) { return (float)(100 * i + j) + 0.5f; } /* W [7,10] f32 */
static double b_value(int64_t k) { return 0.25 * (double)k - 1.0; }                /* B [13] f64 */
static int64_t m_value(int64_t i, int64_t j, int64_t k) {                          /* M [4,3,5] i64 */
  return (i * 1000 + j * 100 + k) * 1000000007LL;
}
static float h_value(int64_t i, int64_t j) { return (float)(i * 4 + j) - 11.0f; } /* H [6,4] bf16 */
static const char kBlob[] = "h5ckpt-capi";

/* bfloat16 bits of a float that is exactly representable (small integers here). */
static uint16_t bf16_bits(float v) {
  uint32_t b;
  memcpy(&b, &v, 4);
  return (uint16_t)(b >> 16);
}

/* Even split of n into parts: [*begin, *begin + *len) of part p. */
static void split(int64_t n, int parts, int p, int64_t* begin, int64_t* len) {
  int64_t base = n / parts, extra = n % parts;
  *begin = p * base + (p < extra ? p : extra);
  *len = base + (p < extra ? 1 : 0);
}

static int rm_entry(const char* path, const struct stat* sb, int flag, struct FTW* ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

/* Saves W, B, M, H and a blob under a TP-only grid (rows, flat ranges, replicas, columns). */
static void save_tp_layout(const char* path) {
  h5ckpt_topology_t* topo = NULL;
  h5ckpt_checkpointer_t* ck = NULL;
  h5ckpt_state_t* st = NULL;
  OK(h5ckpt_topology_create(MPI_COMM_WORLD, g_size, 1, 1, &topo));
  int tp = -1, dp = -1, pp = -1;
  OK(h5ckpt_topology_coords(topo, &tp, &dp, &pp));
  CHECK(tp == g_rank && dp == 0 && pp == 0, "coords %d %d %d", tp, dp, pp);
  OK(h5ckpt_checkpointer_create(topo, 0, &ck));
  OK(h5ckpt_checkpointer_set_attribute(ck, "writer", "test_capi"));
  OK(h5ckpt_state_create(&st));

  const int64_t w_shape[2] = {7, 10}, b_shape[1] = {13}, m_shape[3] = {4, 3, 5}, h_shape[2] = {6, 4};
  int64_t r0, nr, b0, nb, c0, nc;
  split(7, g_size, tp, &r0, &nr); /* W: rows */
  float* w = malloc(sizeof(float) * (size_t)(nr * 10 + 1));
  for (int64_t i = 0; i < nr; ++i)
    for (int64_t j = 0; j < 10; ++j) w[i * 10 + j] = w_value(r0 + i, j);
  const int64_t w_off[2] = {r0, 0}, w_len[2] = {nr, 10};
  OK(h5ckpt_state_add_sharded(st, "model/w", H5CKPT_F32, 2, w_shape, w_off, w_len, w));

  split(13, g_size, tp, &b0, &nb); /* B: flat range */
  double* b = malloc(sizeof(double) * (size_t)(nb + 1));
  for (int64_t k = 0; k < nb; ++k) b[k] = b_value(b0 + k);
  OK(h5ckpt_state_add_flat(st, "model/b", H5CKPT_F64, 1, b_shape, b0, b0 + nb, b));

  int64_t m[4 * 3 * 5]; /* M: replicated on every rank (written once) */
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 5; ++k) m[(i * 3 + j) * 5 + k] = m_value(i, j, k);
  OK(h5ckpt_state_add_replicated(st, "optimizer/m", H5CKPT_I64, 3, m_shape, m));

  split(4, g_size, tp, &c0, &nc); /* H: columns, bf16 */
  uint16_t* h = malloc(sizeof(uint16_t) * (size_t)(6 * nc + 1));
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < nc; ++j) h[i * nc + j] = bf16_bits(h_value(i, c0 + j));
  const int64_t h_off[2] = {0, c0}, h_len[2] = {6, nc};
  OK(h5ckpt_state_add_sharded(st, "model/h_bf16", H5CKPT_BF16, 2, h_shape, h_off, h_len, h));

  char blob[sizeof kBlob];
  memcpy(blob, kBlob, sizeof kBlob);
  OK(h5ckpt_state_add_bytes(st, "extra/blob", blob, sizeof kBlob));
  CHECK(h5ckpt_state_size(st) == 5, "state size %zu", h5ckpt_state_size(st));

  h5ckpt_save_options_t opt;
  h5ckpt_save_options_init(&opt);
  CHECK(opt.checksums == 1 && opt.overwrite == 0 && opt.update_latest == 1 && opt.step == -1, "defaults");
  opt.step = 42;
  OK(h5ckpt_save(ck, st, path, &opt));
  /* Saving again to the same path without overwrite is refused on every rank. */
  int rc = h5ckpt_save(ck, st, path, &opt);
  CHECK(rc == H5CKPT_ALREADY_EXISTS, "second save -> %d (%s)", rc, h5ckpt_last_error());
  CHECK(strstr(h5ckpt_last_error(), "already exists") != NULL, "text: %s", h5ckpt_last_error());

  h5ckpt_state_free(st);
  h5ckpt_checkpointer_free(ck);
  h5ckpt_topology_free(topo);
  free(w);
  free(b);
  free(h);
}

/* Loads under a DP-only grid with other shards: W by reversed columns, B whole, M along dim 2,
 * H as f32 flat ranges (bf16 -> f32 conversion), the blob; checks every element. */
static void load_dp_layout(const char* path) {
  h5ckpt_topology_t* topo = NULL;
  h5ckpt_checkpointer_t* ck = NULL;
  h5ckpt_state_t* st = NULL;
  OK(h5ckpt_topology_create(MPI_COMM_WORLD, 1, g_size, 1, &topo));
  OK(h5ckpt_checkpointer_create(topo, 0, &ck));
  OK(h5ckpt_state_create(&st));
  const int part = g_size - 1 - g_rank; /* reversed: no rank reads what it wrote */

  const int64_t w_shape[2] = {7, 10}, b_shape[1] = {13}, m_shape[3] = {4, 3, 5}, h_shape[2] = {6, 4};
  int64_t c0, nc, k0, nk, f0, nf;
  split(10, g_size, part, &c0, &nc);
  float* w = malloc(sizeof(float) * (size_t)(7 * nc + 1));
  for (int64_t x = 0; x < 7 * nc; ++x) w[x] = -999.0f;
  const int64_t w_off[2] = {0, c0}, w_len[2] = {7, nc};
  OK(h5ckpt_state_add_sharded(st, "model/w", H5CKPT_F32, 2, w_shape, w_off, w_len, w));

  double b[13];
  for (int k = 0; k < 13; ++k) b[k] = -999.0;
  OK(h5ckpt_state_add_replicated(st, "model/b", H5CKPT_F64, 1, b_shape, b));

  split(5, g_size, part, &k0, &nk);
  int64_t* m = malloc(sizeof(int64_t) * (size_t)(12 * nk + 1));
  for (int64_t x = 0; x < 12 * nk; ++x) m[x] = -1;
  const int64_t m_off[3] = {0, 0, k0}, m_len[3] = {4, 3, nk};
  OK(h5ckpt_state_add_sharded(st, "optimizer/m", H5CKPT_I64, 3, m_shape, m_off, m_len, m));

  split(24, g_size, part, &f0, &nf);
  float* h = malloc(sizeof(float) * (size_t)(nf + 1));
  for (int64_t x = 0; x < nf; ++x) h[x] = -999.0f;
  OK(h5ckpt_state_add_flat(st, "model/h_bf16", H5CKPT_F32, 2, h_shape, f0, f0 + nf, h));

  char blob[sizeof kBlob];
  memset(blob, 0x55, sizeof blob);
  OK(h5ckpt_state_add_bytes(st, "extra/blob", blob, sizeof blob));

  OK(h5ckpt_load(ck, st, path, 1));

  int bad = 0;
  for (int64_t i = 0; i < 7; ++i)
    for (int64_t j = 0; j < nc; ++j)
      if (w[i * nc + j] != w_value(i, c0 + j) && bad++ < 5)
        CHECK(0, "W[%lld,%lld] = %g, want %g", (long long)i, (long long)(c0 + j), w[i * nc + j], w_value(i, c0 + j));
  for (int k = 0; k < 13; ++k)
    if (b[k] != b_value(k) && bad++ < 10) CHECK(0, "B[%d] = %g, want %g", k, b[k], b_value(k));
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < nk; ++k)
        if (m[(i * 3 + j) * nk + k] != m_value(i, j, k0 + k) && bad++ < 15)
          CHECK(0, "M[%lld,%lld,%lld] = %lld", (long long)i, (long long)j, (long long)(k0 + k),
                (long long)m[(i * 3 + j) * nk + k]);
  for (int64_t x = 0; x < nf; ++x)
    if (h[x] != h_value((f0 + x) / 4, (f0 + x) % 4) && bad++ < 20)
      CHECK(0, "H flat %lld = %g, want %g", (long long)(f0 + x), h[x], h_value((f0 + x) / 4, (f0 + x) % 4));
  CHECK(memcmp(blob, kBlob, sizeof kBlob) == 0, "blob '%.*s'", (int)sizeof blob, blob);
  CHECK(bad == 0, "%d wrong elements", bad);

  /* strict: a key the checkpoint lacks fails on every rank, naming the key */
  float extra[3] = {7, 7, 7};
  const int64_t e_shape[1] = {3};
  OK(h5ckpt_state_add_replicated(st, "model/missing", H5CKPT_F32, 1, e_shape, extra));
  int rc = h5ckpt_load(ck, st, path, 1);
  CHECK(rc == H5CKPT_NOT_FOUND, "strict load with a missing key -> %d (%s)", rc, h5ckpt_last_error());
  CHECK(strstr(h5ckpt_last_error(), "model/missing") != NULL, "text names the key: %s", h5ckpt_last_error());
  /* non-strict: loads the rest and leaves the missing key's buffer alone */
  OK(h5ckpt_load(ck, st, path, 0));
  CHECK(extra[0] == 7 && extra[1] == 7 && extra[2] == 7, "missing key's buffer untouched");

  /* strictness through the options struct */
  h5ckpt_load_options_t lo;
  h5ckpt_load_options_init(&lo);
  CHECK(lo.strictness == H5CKPT_STRICT_IGNORE_UNEXPECTED, "strictness default %d", lo.strictness);
  lo.strictness = H5CKPT_STRICT_ALLOW_MISSING;
  OK(h5ckpt_load_with_options(ck, st, path, &lo));
  CHECK(extra[0] == 7 && extra[1] == 7 && extra[2] == 7, "allow_missing: missing key's buffer untouched");
  lo.strictness = H5CKPT_STRICT_RAISE_ALL;
  rc = h5ckpt_load_with_options(ck, st, path, &lo);
  CHECK(rc == H5CKPT_NOT_FOUND, "raise_all with a missing key -> %d (%s)", rc, h5ckpt_last_error());
  CHECK(strstr(h5ckpt_last_error(), "1 key missing from the checkpoint: 'model/missing'") != NULL, "text: %s",
        h5ckpt_last_error());
  lo.strictness = 7;
  rc = h5ckpt_load_with_options(ck, st, path, &lo);
  CHECK(rc == H5CKPT_INVALID_ARGUMENT, "strictness 7 -> %d (%s)", rc, h5ckpt_last_error());
  /* model/b alone: the four other keys are unexpected, an error only with raise_all */
  h5ckpt_state_t* only_b = NULL;
  double bb[13];
  for (int k = 0; k < 13; ++k) bb[k] = -5.0;
  OK(h5ckpt_state_create(&only_b));
  OK(h5ckpt_state_add_replicated(only_b, "model/b", H5CKPT_F64, 1, b_shape, bb));
  lo.strictness = H5CKPT_STRICT_RAISE_ALL;
  rc = h5ckpt_load_with_options(ck, only_b, path, &lo);
  CHECK(rc == H5CKPT_INVALID_ARGUMENT, "raise_all with unexpected keys -> %d (%s)", rc, h5ckpt_last_error());
  CHECK(strstr(h5ckpt_last_error(),
               "4 keys in the checkpoint the state does not ask for: 'extra/blob', "
               "'model/h_bf16', 'model/w', 'optimizer/m'") != NULL,
        "text: %s", h5ckpt_last_error());
  CHECK(bb[0] == -5.0 && bb[12] == -5.0, "a failing load wrote into a buffer");
  lo.strictness = H5CKPT_STRICT_IGNORE_UNEXPECTED;
  OK(h5ckpt_load_with_options(ck, only_b, path, &lo));
  CHECK(memcmp(bb, b, sizeof bb) == 0, "model/b loaded alone equals model/b loaded with the rest");
  h5ckpt_state_free(only_b);

  h5ckpt_state_free(st);
  h5ckpt_checkpointer_free(ck);
  h5ckpt_topology_free(topo);
  free(w);
  free(m);
  free(h);
}

/* save_async under the DP grid (flat ranges of W + 1000), buffer clobbered right after the call
 * returns; loaded under the TP grid by rows: the snapshot values must come back. */
static void async_round_trip(const char* path) {
  h5ckpt_topology_t* dp_topo = NULL;
  h5ckpt_topology_t* tp_topo = NULL;
  h5ckpt_checkpointer_t* ck = NULL;
  h5ckpt_state_t* st = NULL;
  h5ckpt_save_handle_t* handle = NULL;
  OK(h5ckpt_topology_create(MPI_COMM_WORLD, 1, g_size, 1, &dp_topo));
  OK(h5ckpt_checkpointer_create(dp_topo, 1 << 20, &ck));
  OK(h5ckpt_state_create(&st));
  const int64_t w_shape[2] = {7, 10};
  int64_t f0, nf;
  split(70, g_size, g_rank, &f0, &nf);
  float* w = malloc(sizeof(float) * (size_t)(nf + 1));
  for (int64_t x = 0; x < nf; ++x) w[x] = w_value((f0 + x) / 10, (f0 + x) % 10) + 1000.0f;
  OK(h5ckpt_state_add_flat(st, "model/w", H5CKPT_F32, 2, w_shape, f0, f0 + nf, w));
  h5ckpt_save_options_t opt;
  h5ckpt_save_options_init(&opt);
  opt.step = 7;
  OK(h5ckpt_save_async(ck, st, path, &opt, &handle));
  for (int64_t x = 0; x < nf; ++x) w[x] = -1.0f; /* after the snapshot: must not reach the file */
  h5ckpt_state_free(st);                         /* allowed once save_async returned */
  OK(h5ckpt_save_wait(handle));
  int done = 0;
  OK(h5ckpt_save_test(handle, &done));
  CHECK(done == 1, "done after wait");
  h5ckpt_save_handle_free(handle);
  h5ckpt_checkpointer_free(ck);

  OK(h5ckpt_topology_create(MPI_COMM_WORLD, g_size, 1, 1, &tp_topo));
  OK(h5ckpt_checkpointer_create(tp_topo, 0, &ck));
  OK(h5ckpt_state_create(&st));
  int64_t r0, nr;
  split(7, g_size, g_rank, &r0, &nr);
  float* rows = malloc(sizeof(float) * (size_t)(nr * 10 + 1));
  const int64_t off[2] = {r0, 0}, len[2] = {nr, 10};
  OK(h5ckpt_state_add_sharded(st, "model/w", H5CKPT_F32, 2, w_shape, off, len, rows));
  OK(h5ckpt_load(ck, st, path, 1));
  int bad = 0;
  for (int64_t i = 0; i < nr; ++i)
    for (int64_t j = 0; j < 10; ++j)
      if (rows[i * 10 + j] != w_value(r0 + i, j) + 1000.0f) ++bad;
  CHECK(bad == 0, "%d wrong elements after the async round trip", bad);
  h5ckpt_state_free(st);
  h5ckpt_checkpointer_free(ck);
  h5ckpt_topology_free(tp_topo);
  h5ckpt_topology_free(dp_topo);
  free(w);
  free(rows);
}

static void check_info(const char* ckpt, const char* root) {
  h5ckpt_info_t* info = NULL;
  OK(h5ckpt_info_open(ckpt, &info));
  CHECK(h5ckpt_info_num_tensors(info) == 5, "%zu tensors", h5ckpt_info_num_tensors(info));
  static const char* keys[5] = {"extra/blob", "model/b", "model/h_bf16", "model/w", "optimizer/m"};
  static const int dtypes[5] = {H5CKPT_U8, H5CKPT_F64, H5CKPT_BF16, H5CKPT_F32, H5CKPT_I64};
  static const int ndims[5] = {1, 1, 2, 2, 3};
  static const int64_t shapes[5][3] = {{sizeof kBlob}, {13}, {6, 4}, {7, 10}, {4, 3, 5}};
  for (size_t t = 0; t < 5 && t < h5ckpt_info_num_tensors(info); ++t) {
    const char* key = NULL;
    const int64_t* shape = NULL;
    int dtype = -1, ndim = -1;
    OK(h5ckpt_info_tensor(info, t, &key, &dtype, &ndim, &shape));
    CHECK(key && strcmp(key, keys[t]) == 0, "tensor %zu key %s", t, key ? key : "(null)");
    CHECK(dtype == dtypes[t] && ndim == ndims[t], "%s dtype %d ndim %d", keys[t], dtype, ndim);
    for (int d = 0; d < ndim && d < 3; ++d)
      CHECK(shape[d] == shapes[t][d], "%s dim %d = %lld", keys[t], d, (long long)shape[d]);
    size_t idx = 99;
    OK(h5ckpt_info_find(info, keys[t], &idx));
    CHECK(idx == t, "find %s -> %zu", keys[t], idx);
  }
  CHECK(h5ckpt_info_find(info, "model/nope", NULL) == H5CKPT_NOT_FOUND, "find of a missing key");
  CHECK(h5ckpt_info_tensor(info, 5, NULL, NULL, NULL, NULL) == H5CKPT_INVALID_ARGUMENT, "index out of range");
  CHECK(h5ckpt_info_step(info) == 42, "step %lld", (long long)h5ckpt_info_step(info));
  int tp = 0, dp = 0, pp = 0;
  OK(h5ckpt_info_topology(info, &tp, &dp, &pp));
  CHECK(tp == g_size && dp == 1 && pp == 1, "saved topology %d %d %d", tp, dp, pp);
  OK(h5ckpt_info_verify(info));
  h5ckpt_info_free(info);

  /* The root's `latest` names the async checkpoint (saved last, step 7). */
  OK(h5ckpt_info_open(root, &info));
  CHECK(h5ckpt_info_step(info) == 7, "latest step %lld", (long long)h5ckpt_info_step(info));
  h5ckpt_info_free(info);

  char missing[4200];
  snprintf(missing, sizeof missing, "%s/no-such-checkpoint", root);
  int rc = h5ckpt_info_open(missing, &info);
  CHECK(rc == H5CKPT_NOT_FOUND && info == NULL, "open of a missing checkpoint -> %d", rc);
  CHECK(strstr(h5ckpt_last_error(), "no-such-checkpoint") != NULL, "text: %s", h5ckpt_last_error());
}

/* Flips one byte of the first occurrence of `pattern` in `file`; 1 when found. */
static int flip_pattern(const char* file, const void* pattern, size_t n) {
  FILE* f = fopen(file, "r+b");
  if (!f) return 0;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  char* bytes = malloc((size_t)size + 1);
  fseek(f, 0, SEEK_SET);
  int found = 0;
  if (fread(bytes, 1, (size_t)size, f) == (size_t)size) {
    for (long i = 0; i + (long)n <= size && !found; ++i) {
      if (memcmp(bytes + i, pattern, n) != 0) continue;
      char c = (char)(bytes[i + 5] ^ 0x40);
      fseek(f, i + 5, SEEK_SET);
      found = fwrite(&c, 1, 1, f) == 1;
    }
  }
  fclose(f);
  free(bytes);
  return found;
}

/* Checkpointer and load options reach the library: defaults, refusal of bad values, keep_last
 * retention, and verify (a flipped byte fails a verified load and passes an unverified one). */
static void options_round_trip(const char* root) {
  h5ckpt_checkpointer_options_t co;
  h5ckpt_checkpointer_options_init(&co);
  CHECK(co.timeout_s == 600 && co.keep_last == 0 && co.keep_every == 0 && co.io_threads == 0 && co.staging_bytes == 0 &&
            co.memory_bytes == 0,
        "checkpointer defaults");
  h5ckpt_load_options_t lo;
  h5ckpt_load_options_init(&lo);
  CHECK(lo.strict == 1 && lo.convert_dtype == 1 && lo.verify == 1 && lo.zero_redundancy == 1, "load defaults");
  h5ckpt_save_options_t so;
  h5ckpt_save_options_init(&so);
  CHECK(so.device_stream == NULL, "device_stream default");

  h5ckpt_topology_t* topo = NULL;
  h5ckpt_checkpointer_t* ck = NULL;
  OK(h5ckpt_topology_create(MPI_COMM_WORLD, 1, g_size, 1, &topo));
  co.keep_last = -1;
  int rc = h5ckpt_checkpointer_create_with_options(topo, &co, &ck);
  CHECK(rc == H5CKPT_INVALID_ARGUMENT && ck == NULL, "keep_last -1 refused -> %d", rc);
  co.keep_last = 1;
  co.timeout_s = 120;
  OK(h5ckpt_checkpointer_create_with_options(topo, &co, &ck));

  enum { N = 4096 };
  float* x = malloc(sizeof(float) * N);
  for (int i = 0; i < N; ++i) x[i] = 0.5f + (float)i * 0.25f;
  const int64_t shape[1] = {N};
  h5ckpt_state_t* st = NULL;
  OK(h5ckpt_state_create(&st));
  OK(h5ckpt_state_add_replicated(st, "model/x", H5CKPT_F32, 1, shape, x));
  char dir[4200], s1[4300], s2[4300], data[4400];
  snprintf(dir, sizeof dir, "%s/kept", root);
  snprintf(s1, sizeof s1, "%s/step-1", dir);
  snprintf(s2, sizeof s2, "%s/step-2", dir);
  if (g_rank == 0) mkdir(dir, 0755);
  MPI_Barrier(MPI_COMM_WORLD);
  so.step = 1;
  OK(h5ckpt_save(ck, st, s1, &so));
  so.step = 2;
  OK(h5ckpt_save(ck, st, s2, &so));
  struct stat sb;
  CHECK(stat(s1, &sb) != 0 && stat(s2, &sb) == 0, "keep_last=1 left step-1 %s", stat(s1, &sb) == 0 ? "behind" : "?");

  snprintf(data, sizeof data, "%s/data.h5", s2);
  if (g_rank == 0) CHECK(flip_pattern(data, x + 100, 64), "pattern found in %s", data);
  MPI_Barrier(MPI_COMM_WORLD);
  float* y = malloc(sizeof(float) * N);
  h5ckpt_state_t* back = NULL;
  OK(h5ckpt_state_create(&back));
  OK(h5ckpt_state_add_replicated(back, "model/x", H5CKPT_F32, 1, shape, y));
  rc = h5ckpt_load_with_options(ck, back, s2, &lo);
  CHECK(rc == H5CKPT_CORRUPT && strstr(h5ckpt_last_error(), "checksum mismatch") &&
            strstr(h5ckpt_last_error(), "model/x"),
        "verified load of a flipped byte -> %d (%s)", rc, h5ckpt_last_error());
  lo.verify = 0;
  OK(h5ckpt_load_with_options(ck, back, s2, &lo));
  int differ = 0;
  for (int i = 0; i < N; ++i) differ += y[i] != x[i];
  CHECK(differ == 1, "unverified load delivers the flipped element (%d differ)", differ);

  /* memory_bytes reaches the library: 100 bytes is refused before anything moves, 2 KiB (an
   * eighth of the tensor) streams the load and delivers every element. */
  h5ckpt_checkpointer_t* small = NULL;
  co.keep_last = 0;
  co.memory_bytes = 100;
  OK(h5ckpt_checkpointer_create_with_options(topo, &co, &small));
  rc = h5ckpt_load(small, back, s2, 1);
  CHECK(rc == H5CKPT_INVALID_ARGUMENT && strstr(h5ckpt_last_error(), "memory"), "memory_bytes 100 -> %d (%s)", rc,
        h5ckpt_last_error());
  h5ckpt_checkpointer_free(small);
  co.memory_bytes = 2048;
  OK(h5ckpt_checkpointer_create_with_options(topo, &co, &small));
  for (int i = 0; i < N; ++i) y[i] = -1.0f;
  lo.verify = 0;
  OK(h5ckpt_load_with_options(small, back, s2, &lo));
  differ = 0;
  for (int i = 0; i < N; ++i) differ += y[i] != x[i];
  CHECK(differ == 1, "budgeted load delivers every element (%d differ, 1 flipped)", differ);
  h5ckpt_checkpointer_free(small);
  h5ckpt_state_free(back);
  h5ckpt_state_free(st);
  h5ckpt_checkpointer_free(ck);
  h5ckpt_topology_free(topo);
  free(x);
  free(y);
}

/* Node-local checkpoints through the C API: a local save (the shared level untouched), one with
 * persist, resolve naming the local level, and a load delivering every element. */
static void local_level_round_trip(const char* root) {
  enum { N = 96 };
  h5ckpt_checkpointer_options_t co;
  h5ckpt_checkpointer_options_init(&co);
  CHECK(co.local_dir == NULL && co.local_replicas == 1 && co.persist_every == 0 && co.local_keep == 2,
        "local-level defaults");
  char local[4300], shared[4300], step1[4400], step2[4400], probe[4600];
  snprintf(local, sizeof local, "%s/local-node{node}", root);
  snprintf(shared, sizeof shared, "%s/local-run", root);
  snprintf(step1, sizeof step1, "%s/step-1", shared);
  snprintf(step2, sizeof step2, "%s/step-2", shared);
  if (g_rank == 0) mkdir(shared, 0755);
  MPI_Barrier(MPI_COMM_WORLD);
  co.local_dir = local;
  h5ckpt_topology_t* topo = NULL;
  h5ckpt_checkpointer_t* ck = NULL;
  OK(h5ckpt_topology_create(MPI_COMM_WORLD, 1, g_size, 1, &topo));
  OK(h5ckpt_checkpointer_create_with_options(topo, &co, &ck));
  float* x = malloc(sizeof(float) * N);
  const int64_t shape[1] = {N};
  h5ckpt_state_t* st = NULL;
  OK(h5ckpt_state_create(&st));
  OK(h5ckpt_state_add_replicated(st, "model/x", H5CKPT_F32, 1, shape, x));
  h5ckpt_save_options_t so;
  h5ckpt_save_options_init(&so);
  CHECK(so.persist == 0, "persist default");
  for (int step = 1; step <= 2; ++step) {
    for (int i = 0; i < N; ++i) x[i] = (float)(i * 3 + step);
    so.step = step;
    so.persist = step == 1;
    OK(h5ckpt_save(ck, st, step == 1 ? step1 : step2, &so));
  }
  struct stat sb;
  CHECK(stat(step1, &sb) == 0, "step 1 was persisted to %s", step1);
  CHECK(stat(step2, &sb) != 0, "step 2 stayed local");
  snprintf(probe, sizeof probe, "%s/local-node0/step-2/rank-%d.bin", root, g_rank);
  CHECK(stat(probe, &sb) == 0, "local file %s", probe);
  h5ckpt_info_t* info = NULL;
  int is_local = -1;
  OK(h5ckpt_checkpointer_resolve(ck, shared, &info, &is_local));
  CHECK(is_local == 1 && info && h5ckpt_info_step(info) == 2, "resolve -> local step 2 (%d, %lld)", is_local,
        info ? (long long)h5ckpt_info_step(info) : -1LL);
  h5ckpt_info_free(info);
  for (int i = 0; i < N; ++i) x[i] = -1.0f;
  OK(h5ckpt_load(ck, st, shared, 1));
  int differ = 0;
  for (int i = 0; i < N; ++i) differ += x[i] != (float)(i * 3 + 2);
  CHECK(differ == 0, "local load delivers every element (%d differ)", differ);
  co.local_keep = -1;
  h5ckpt_checkpointer_t* bad = NULL;
  const int rc = h5ckpt_checkpointer_create_with_options(topo, &co, &bad);
  CHECK(rc == H5CKPT_INVALID_ARGUMENT && bad == NULL, "local_keep -1 refused -> %d", rc);
  h5ckpt_state_free(st);
  h5ckpt_checkpointer_free(ck);
  h5ckpt_topology_free(topo);
  free(x);
}

static void check_argument_errors(void) {
  h5ckpt_state_t* st = NULL;
  OK(h5ckpt_state_create(&st));
  const int64_t shape[1] = {4};
  float buf[4];
  int rc = h5ckpt_state_add_replicated(st, "model/x", 99, 1, shape, buf);
  CHECK(rc == H5CKPT_INVALID_ARGUMENT && strstr(h5ckpt_last_error(), "unknown dtype 99"), "bad dtype -> %d %s", rc,
        h5ckpt_last_error());
  rc = h5ckpt_state_add_sharded(st, NULL, H5CKPT_F32, 1, shape, shape, shape, buf);
  CHECK(rc == H5CKPT_INVALID_ARGUMENT, "NULL key -> %d", rc);
  rc = h5ckpt_state_add_sharded(st, "model/x", H5CKPT_F32, 1, shape, NULL, shape, buf);
  CHECK(rc == H5CKPT_INVALID_ARGUMENT && strstr(h5ckpt_last_error(), "model/x"), "NULL offsets -> %d", rc);
  CHECK(h5ckpt_state_size(st) == 0, "nothing added by failed calls");
  h5ckpt_state_free(st);
  h5ckpt_topology_t* topo = NULL;
  CHECK(h5ckpt_topology_create(MPI_COMM_WORLD, g_size + 1, 1, 1, &topo) != H5CKPT_OK && topo == NULL,
        "a grid larger than the world is refused");
  CHECK(strcmp(h5ckpt_error_name(H5CKPT_CORRUPT), "corrupt checkpoint") == 0 &&
            strcmp(h5ckpt_error_name(-3), "unknown") == 0,
        "error name %s", h5ckpt_error_name(H5CKPT_CORRUPT));
  CHECK(h5ckpt_dtype_size(H5CKPT_BF16) == 2 && h5ckpt_dtype_size(H5CKPT_I64) == 8 && h5ckpt_dtype_size(42) == 0,
        "dtype sizes");
  CHECK(strlen(h5ckpt_version()) > 0, "version");
  /* free functions accept NULL */
  h5ckpt_state_free(NULL);
  h5ckpt_topology_free(NULL);
  h5ckpt_checkpointer_free(NULL);
  h5ckpt_save_handle_free(NULL);
  h5ckpt_info_free(NULL);
}

/* Multi-piece items: every rank loads W whole as two row blocks in one buffer, [rows 4..6; gap;
 * rows 0..3], saves it that way (replicas written once) and loads it back as ordinary rows; bad
 * pieces fail with the key named. */
static void pieces_round_trip(const char* ckpt, const char* path) {
  h5ckpt_topology_t* topo = NULL;
  h5ckpt_checkpointer_t* ck = NULL;
  h5ckpt_state_t* st = NULL;
  OK(h5ckpt_topology_create(MPI_COMM_WORLD, 1, g_size, 1, &topo));
  OK(h5ckpt_checkpointer_create(topo, 0, &ck));
  OK(h5ckpt_state_create(&st));
  const int64_t w_shape[2] = {7, 10}, gap = 2;
  const int64_t offs[4] = {4, 0, 0, 0}, lens[4] = {3, 10, 4, 10};
  const uint64_t boffs[2] = {0, (uint64_t)(30 + gap) * sizeof(float)};
  float w[70 + 2];
  for (int x = 0; x < 72; ++x) w[x] = -999.0f;
  OK(h5ckpt_state_add_pieces(st, "model/w", H5CKPT_F32, 2, w_shape, 2, offs, lens, boffs, w));
  OK(h5ckpt_load(ck, st, ckpt, 1));
  int bad = 0;
  for (int x = 0; x < 72; ++x) {
    const int64_t row = x < 30 ? 4 + x / 10 : (x - 30 - gap) / 10, col = x < 30 ? x % 10 : (x - 30 - gap) % 10;
    const float want = (x >= 30 && x < 30 + gap) ? -999.0f : w_value(row, col);
    if (w[x] != want && bad++ < 5) CHECK(0, "pieces buffer[%d] = %g, want %g", x, w[x], want);
  }
  CHECK(bad == 0, "%d wrong elements in the multi-piece load", bad);
  h5ckpt_save_options_t opt;
  h5ckpt_save_options_init(&opt);
  opt.update_latest = 0; /* the directory's latest stays the step check_info expects */
  OK(h5ckpt_save(ck, st, path, &opt));
  h5ckpt_state_free(st);

  OK(h5ckpt_state_create(&st));
  float back[70];
  for (int x = 0; x < 70; ++x) back[x] = -999.0f;
  OK(h5ckpt_state_add_replicated(st, "model/w", H5CKPT_F32, 2, w_shape, back));
  OK(h5ckpt_load(ck, st, path, 1));
  bad = 0;
  for (int x = 0; x < 70; ++x)
    if (back[x] != w_value(x / 10, x % 10) && bad++ < 5) CHECK(0, "W flat %d = %g after the pieces save", x, back[x]);
  CHECK(bad == 0, "%d wrong elements after the multi-piece save", bad);
  h5ckpt_state_free(st);

  /* npieces < 1 fails at once; overlapping pieces fail the save, naming key and piece */
  OK(h5ckpt_state_create(&st));
  int rc = h5ckpt_state_add_pieces(st, "model/none", H5CKPT_F32, 2, w_shape, 0, offs, lens, boffs, w);
  CHECK(rc == H5CKPT_INVALID_ARGUMENT, "npieces 0 -> %d", rc);
  CHECK(strstr(h5ckpt_last_error(), "model/none") != NULL, "text names the key: %s", h5ckpt_last_error());
  const int64_t over_offs[4] = {0, 0, 2, 0}, over_lens[4] = {3, 10, 3, 10};
  OK(h5ckpt_state_add_pieces(st, "model/over", H5CKPT_F32, 2, w_shape, 2, over_offs, over_lens, boffs, w));
  opt.overwrite = 1;
  rc = h5ckpt_save(ck, st, path, &opt);
  CHECK(rc == H5CKPT_INVALID_ARGUMENT, "overlapping pieces -> %d (%s)", rc, h5ckpt_last_error());
  CHECK(strstr(h5ckpt_last_error(), "model/over") != NULL && strstr(h5ckpt_last_error(), "piece 1") != NULL,
        "text names the key and piece: %s", h5ckpt_last_error());
  h5ckpt_state_free(st);
  h5ckpt_checkpointer_free(ck);
  h5ckpt_topology_free(topo);
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);

  char root[4096] = {0};
  if (g_rank == 0) {
    const char* tmp = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/h5ckpt_capi_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(root)) root[0] = '\0';
  }
  MPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (!root[0]) {
    if (g_rank == 0) fprintf(stderr, "cannot create a temporary directory\n");
    MPI_Finalize();
    return 1;
  }
  char ckpt[4200], async_ckpt[4200], pieces_ckpt[4200];
  snprintf(ckpt, sizeof ckpt, "%s/step-42", root);
  snprintf(pieces_ckpt, sizeof pieces_ckpt, "%s/pieces", root);
  snprintf(async_ckpt, sizeof async_ckpt, "%s/step-7-async", root);

  check_argument_errors();
  save_tp_layout(ckpt);
  load_dp_layout(ckpt);
  async_round_trip(async_ckpt);
  pieces_round_trip(ckpt, pieces_ckpt);
  check_info(ckpt, root);
  options_round_trip(root);
  local_level_round_trip(root);

  int total = 0;
  MPI_Allreduce(&g_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) {
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    printf("test_capi: %d ranks, %s (%d failed checks)\n", g_size, total ? "FAILED" : "passed", total);
  }
  MPI_Finalize();
  return total ? 1 : 0;
}
