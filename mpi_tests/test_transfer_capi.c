/* The C transfer API, compiled as C99: W [9,6] f32 held in rows split over the ranks (sources) is
 * transferred into a whole copy on every rank (destinations) of another layout, checked element by
 * element; a second version with one changed element moves one block per rank; a destination key
 * no source holds fails with H5CKPT_NOT_FOUND on every rank. Every rank runs every collective call
 * and counts its failed checks; the counts are summed at the end. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

#define OK(call)                                                                                           \
  do {                                                                                                     \
    int rc_ = (call);                                                                                      \
    CHECK(rc_ == H5CKPT_OK, "%s -> %d (%s): %s", #call, rc_, h5ckpt_error_name(rc_), h5ckpt_last_error()); \
  } while (0)

#define ROWS 9
#define COLS 6
static float w_value(int64_t i, int64_t j) { return (float)(10 * i + j) - 7.5f; }

int main(int argc, char** argv) {
  int provided = 0, total = 0;
  int64_t shape[2] = {ROWS, COLS}, off[2] = {0, 0}, len[2] = {0, COLS};
  int64_t base, extra, i, j;
  float mine[ROWS * COLS], whole[ROWS * COLS], other[3];
  int64_t other_shape[1] = {3};
  h5ckpt_transfer_t* x = NULL;
  h5ckpt_state_t *src = NULL, *dst = NULL, *bad = NULL;
  h5ckpt_transfer_options_t o;
  h5ckpt_transfer_report_t rep;
  uint64_t blocks = 0, moved = 0;
  int rc;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  base = ROWS / g_size;
  extra = ROWS % g_size;
  off[0] = g_rank * base + (g_rank < extra ? g_rank : extra);
  len[0] = base + (g_rank < extra ? 1 : 0);
  for (i = 0; i < len[0]; ++i)
    for (j = 0; j < COLS; ++j) mine[i * COLS + j] = w_value(off[0] + i, j);
  for (i = 0; i < ROWS * COLS; ++i) whole[i] = -1.0f;

  OK(h5ckpt_transfer_create(MPI_COMM_WORLD, &x));
  OK(h5ckpt_state_create(&src));
  OK(h5ckpt_state_create(&dst));
  OK(h5ckpt_state_add_sharded(src, "model/w", H5CKPT_F32, 2, shape, off, len, mine));
  OK(h5ckpt_state_add_replicated(dst, "model/w", H5CKPT_F32, 2, shape, whole));
  CHECK(h5ckpt_transfer_version(x) == -1, "version before the first transfer");

  h5ckpt_transfer_options_init(&o);
  CHECK(o.delta == 1 && o.verify == 1 && o.in_place == 0 && o.strict == 1 && o.memory_bytes == 0, "defaults");
  o.version = 1;
  OK(h5ckpt_transfer_run(x, src, dst, &o, &rep));
  for (i = 0; i < ROWS; ++i)
    for (j = 0; j < COLS; ++j)
      CHECK(whole[i * COLS + j] == w_value(i, j), "element (%lld, %lld)", (long long)i, (long long)j);
  CHECK(rep.bytes_total == ROWS * COLS * 4 && rep.bytes_received == rep.bytes_total && !rep.delta, "full transfer");
  CHECK(h5ckpt_transfer_version(x) == 1, "version 1");

  /* Version 2: element (0, 0) changes on the rank holding row 0; one block moves to every rank. */
  if (off[0] == 0 && len[0] > 0) mine[0] = 1234.0f;
  o.version = 2;
  OK(h5ckpt_transfer_run(x, src, dst, &o, &rep));
  CHECK(rep.delta, "second version is a delta");
  CHECK(whole[0] == 1234.0f && whole[1] == w_value(0, 1), "changed element arrived");
  MPI_Allreduce(&rep.blocks_received, &blocks, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&rep.bytes_received, &moved, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  CHECK(blocks == (uint64_t)g_size, "one block per destination rank, got %llu", (unsigned long long)blocks);
  CHECK(moved < (uint64_t)g_size * ROWS * COLS * 4 || g_size * ROWS == ROWS, "delta moved less than all");

  /* A key no source holds: the same code on every rank, naming it. */
  OK(h5ckpt_state_create(&bad));
  OK(h5ckpt_state_add_replicated(bad, "model/absent", H5CKPT_F32, 1, other_shape, other));
  rc = h5ckpt_transfer_run(x, src, bad, NULL, NULL);
  CHECK(rc == H5CKPT_NOT_FOUND, "missing key -> %d", rc);
  CHECK(strstr(h5ckpt_last_error(), "model/absent") != NULL, "message names the key: %s", h5ckpt_last_error());
  CHECK(h5ckpt_transfer_version(x) == 2, "a failed transfer keeps version 2");

  h5ckpt_state_free(bad);
  h5ckpt_state_free(src);
  h5ckpt_state_free(dst);
  h5ckpt_transfer_free(x);
  MPI_Allreduce(&g_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) printf("%s: %d failed checks\n", total ? "FAIL" : "OK", total);
  MPI_Finalize();
  return total ? 1 : 0;
}
