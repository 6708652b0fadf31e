/* cluster_probe: checks that an MPI job really sees the simulated cluster of scripts/cluster.sh.
 *
 *   cluster_probe --nodes N --ranks-per-node R [--node-local DIR]
 *                 [--expect-persisted] [--lost-node NAME]
 *                 [--expect-env NAME=VALUE]... [--expect-unset NAME]...
 *                 [--wire-mib M [--wire-gbit-at-most G]]
 *
 * On every rank:
 *   1. the processor name (and gethostname, i.e. the node's UTS namespace) names the node;
 *      MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) gives one communicator per node: N distinct
 *      names, R ranks each, and the node communicator holds exactly the ranks with my name;
 *   2. inter-node transport: an allreduce over all ranks, one over the node leaders only (one rank
 *      per node, so every message crosses nodes), and a ring send of 1 MiB (rendezvous protocol)
 *      from every rank to the next, whose neighbours sit on other nodes at the ends of each node;
 *   3. node-local storage (with --node-local): before writing, the directory holds either nothing
 *      (a fresh disk), or with --expect-persisted exactly the rank-<r> files that the ranks of this
 *      node wrote in the previous job, each containing this node's name; with --lost-node NAME the
 *      node called NAME must instead see an empty directory (its disk was deleted). Then every rank
 *      writes <dir>/rank-<world rank> containing its node name and, after a barrier, the directory
 *      must hold exactly the files of the ranks on this node and none of the other nodes';
 *   4. --expect-env / --expect-unset: the environment the launcher passed to the ranks;
 *   5. --wire-mib M: rank 0 (node 1) sends M MiB to the first rank of node 2, which checks the bytes
 *      and prints the rate; with --wire-gbit-at-most G the bytes must not have crossed faster than
 *      G Gbit/s (plus 15 %): the wire of cluster.sh --wire-rate really limits the traffic.
 * A failed check prints "cluster probe: rank r (node): FAILED ..." and the job keeps going through
 * every collective; the ranks agree on the outcome with an allreduce and all exit 1 on failure.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NAME_LEN MPI_MAX_PROCESSOR_NAME
#define MAX_CHECKS 16
#define RING_BYTES (1 << 20)

static int g_rank;
static char g_name[NAME_LEN];
static int g_failed;

static void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "cluster probe: rank %d (%s): FAILED %s\n", g_rank, g_name, msg);
  fflush(stderr);
  g_failed = 1;
}

static void usage(void) {
  fprintf(stderr,
          "usage: cluster_probe --nodes N --ranks-per-node R [--node-local DIR] [--expect-persisted]\n"
          "                     [--lost-node NAME] [--expect-env NAME=VALUE]... [--expect-unset NAME]...\n"
          "                     [--wire-mib M [--wire-gbit-at-most G]]\n");
}

/* Sets seen[r] = 1 for every file rank-<r> (0 <= r < size) in dir; returns the number of entries
 * that are not such a file (counted in *other), or -1 if the directory cannot be read. */
static int list_rank_files(const char* dir, int size, char* seen, int* other) {
  DIR* d = opendir(dir);
  if (!d) return -1;
  memset(seen, 0, (size_t)size);
  *other = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char* end;
    if (!strncmp(e->d_name, "rank-", 5) && e->d_name[5] != '\0') {
      long r = strtol(e->d_name + 5, &end, 10);
      if (*end == '\0' && r >= 0 && r < size) {
        seen[r] = 1;
        continue;
      }
    }
    ++*other;
  }
  closedir(d);
  return 0;
}

/* Compares the listing of dir with the expected set (mine[r] = 1 for the ranks of this node). */
static void check_listing(const char* dir, int size, const char* mine, int expect_none, const char* when,
                          const char* names) {
  char* seen = malloc((size_t)size);
  int other = 0;
  if (list_rank_files(dir, size, seen, &other) != 0) {
    fail("%s: cannot list node-local dir %s: %s", when, dir, strerror(errno));
    free(seen);
    return;
  }
  if (other) fail("%s: %d unexpected entries in %s", when, other, dir);
  for (int r = 0; r < size; ++r) {
    int want = expect_none ? 0 : mine[r];
    if (seen[r] && !want)
      fail("%s: %s/rank-%d is visible here but rank %d is on %s%s", when, dir, r, r, names + (size_t)r * NAME_LEN,
           expect_none ? " (this node's dir should be empty)" : "");
    else if (!seen[r] && want) fail("%s: %s/rank-%d (rank %d, this node) is missing", when, dir, r, r);
  }
  free(seen);
}

/* Every rank-<r> file of this node must contain this node's name (written on this node). */
static void check_contents(const char* dir, int size, const char* mine) {
  for (int r = 0; r < size; ++r) {
    if (!mine[r]) continue;
    char path[4096], buf[NAME_LEN + 2] = {0};
    snprintf(path, sizeof path, "%s/rank-%d", dir, r);
    FILE* f = fopen(path, "r");
    if (!f) continue; /* reported by check_listing */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    if (strcmp(buf, g_name)) fail("%s holds \"%s\", expected this node's name %s", path, buf, g_name);
  }
}

/* 2. Transport across nodes: an allreduce over all ranks, one over the node leaders (every message
 * crosses nodes), and a 1 MiB ring send whose neighbours sit on other nodes at each node's ends. */
static void check_transport(int size, int nodes, int node_rank, const char* names) {
  long sum = g_rank, want = (long)size * (size - 1) / 2;
  MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (sum != want) fail("allreduce of ranks gave %ld, expected %ld", sum, want);

  MPI_Comm leaders;
  MPI_Comm_split(MPI_COMM_WORLD, node_rank == 0 ? 0 : MPI_UNDEFINED, g_rank, &leaders);
  if (leaders != MPI_COMM_NULL) {
    int nl, one = 1;
    MPI_Comm_size(leaders, &nl);
    MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_INT, MPI_SUM, leaders);
    if (nl != nodes || one != nodes)
      fail("node leaders: %d in communicator, allreduce %d, expected %d", nl, one, nodes);
    MPI_Comm_free(&leaders);
  }

  unsigned char *out = malloc(RING_BYTES), *in = malloc(RING_BYTES);
  int next = (g_rank + 1) % size, prev = (g_rank + size - 1) % size;
  for (int i = 0; i < RING_BYTES; ++i) out[i] = (unsigned char)(g_rank * 31 + i);
  MPI_Sendrecv(out, RING_BYTES, MPI_BYTE, next, 7, in, RING_BYTES, MPI_BYTE, prev, 7, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  for (int i = 0; i < RING_BYTES; ++i)
    if (in[i] != (unsigned char)(prev * 31 + i)) {
      fail("ring message from rank %d (%s) corrupt at byte %d", prev, names + (size_t)prev * NAME_LEN, i);
      break;
    }
  free(out);
  free(in);
}

/* 3. The node-local directory: what it holds before this job writes (fresh, persisted from the
 * previous job, or emptied for the lost node), then every rank writes its file and the directory
 * must hold exactly this node's. */
static void check_node_local(const char* local, int size, const char* mine, const char* names, int persisted,
                             const char* lost) {
  int lost_here = lost && !strcmp(lost, g_name);
  if (persisted || lost) {
    check_listing(local, size, mine, lost_here, lost_here ? "before writing (lost node)" : "before writing (persisted)",
                  names);
    if (!lost_here) check_contents(local, size, mine);
  } else {
    check_listing(local, size, mine, 1, "before writing (fresh node)", names);
  }
  MPI_Barrier(MPI_COMM_WORLD); /* everyone has listed before anyone writes */
  char path[4096];
  snprintf(path, sizeof path, "%s/rank-%d", local, g_rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("create %s: %s", path, strerror(errno));
  else {
    size_t len = strlen(g_name);
    if (write(fd, g_name, len) != (ssize_t)len || write(fd, "\n", 1) != 1 || fsync(fd) != 0)
      fail("write %s: %s", path, strerror(errno));
    close(fd);
  }
  MPI_Barrier(MPI_COMM_WORLD); /* every rank has written */
  check_listing(local, size, mine, 0, "after writing", names);
  check_contents(local, size, mine);
}

/* Rank 0 sends mib MiB in 4 MiB messages to rank `to` (another node), which checks every byte and
 * times the whole from a barrier; fails when the rate exceeds at_most_gbit (> 0) by 15 %. */
static void check_wire(int to, int mib, double at_most_gbit) {
  const int chunk = 4 << 20, count = mib / 4 > 0 ? mib / 4 : 1;
  if (g_rank != 0 && g_rank != to) return;
  unsigned char* buf = malloc((size_t)chunk);
  double t0 = 0;
  int bad = -1;
  for (int c = 0; c < count; ++c) {
    if (g_rank == 0) {
      for (int i = 0; i < chunk; ++i) buf[i] = (unsigned char)(c * 7 + i);
      MPI_Send(buf, chunk, MPI_BYTE, to, 11, MPI_COMM_WORLD);
    } else {
      if (c == 0) t0 = MPI_Wtime();
      MPI_Recv(buf, chunk, MPI_BYTE, 0, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      for (int i = 0; i < chunk && bad < 0; ++i)
        if (buf[i] != (unsigned char)(c * 7 + i)) bad = c * chunk + i;
    }
  }
  if (g_rank == to) {
    const double s = MPI_Wtime() - t0, gbit = (double)count * chunk * 8 / s / 1e9;
    printf("cluster probe: wire: %d MiB from rank 0 to rank %d (%s) in %.3f s, %.2f Gbit/s\n", count * 4, to, g_name, s,
           gbit);
    fflush(stdout);
    if (bad >= 0) fail("wire message corrupt at byte %d", bad);
    if (at_most_gbit > 0 && gbit > at_most_gbit * 1.15)
      fail("wire: %.2f Gbit/s between nodes, faster than the %.2f Gbit/s the wire should allow", gbit, at_most_gbit);
  }
  free(buf);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int size;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int namelen = 0;
  MPI_Get_processor_name(g_name, &namelen);

  int nodes = -1, rpn = -1, persisted = 0;
  const char *local = NULL, *lost = NULL;
  const char *env_set[MAX_CHECKS], *env_unset[MAX_CHECKS];
  int n_set = 0, n_unset = 0, bad_args = 0, wire_mib = 0;
  double wire_max = 0;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--nodes") && v) nodes = atoi(argv[++i]);
    else if (!strcmp(a, "--ranks-per-node") && v) rpn = atoi(argv[++i]);
    else if (!strcmp(a, "--node-local") && v) local = argv[++i];
    else if (!strcmp(a, "--lost-node") && v) lost = argv[++i];
    else if (!strcmp(a, "--expect-persisted")) persisted = 1;
    else if (!strcmp(a, "--expect-env") && v && n_set < MAX_CHECKS && strchr(v, '=')) env_set[n_set++] = argv[++i];
    else if (!strcmp(a, "--expect-unset") && v && n_unset < MAX_CHECKS) env_unset[n_unset++] = argv[++i];
    else if (!strcmp(a, "--wire-mib") && v) wire_mib = atoi(argv[++i]);
    else if (!strcmp(a, "--wire-gbit-at-most") && v) wire_max = atof(argv[++i]);
    else bad_args = 1;
  }
  if (bad_args || nodes < 1 || rpn < 1 || wire_mib < 0 || (wire_mib && nodes < 2)) {
    if (g_rank == 0) usage();
    MPI_Finalize();
    return 2;
  }

  /* 1. node identity and topology */
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) fail("gethostname: %s", strerror(errno));
  else if (strcmp(host, g_name)) fail("gethostname says %s but MPI_Get_processor_name says %s", host, g_name);
  if (size != nodes * rpn) fail("world size %d != %d nodes x %d ranks", size, nodes, rpn);

  char* names = calloc((size_t)size, NAME_LEN);
  MPI_Allgather(g_name, NAME_LEN, MPI_CHAR, names, NAME_LEN, MPI_CHAR, MPI_COMM_WORLD);
  char* mine = calloc((size_t)size, 1); /* mine[r]: rank r has my processor name */
  int distinct = 0, same = 0;
  for (int r = 0; r < size; ++r) {
    const char* nr = names + (size_t)r * NAME_LEN;
    mine[r] = strcmp(nr, g_name) == 0;
    same += mine[r];
    int first = 1;
    for (int q = 0; q < r && first; ++q) first = strcmp(nr, names + (size_t)q * NAME_LEN) != 0;
    distinct += first;
  }
  if (distinct != nodes) fail("%d distinct processor names, expected %d nodes", distinct, nodes);
  if (same != rpn) fail("%d ranks named %s, expected %d per node", same, g_name, rpn);

  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
  int node_rank, node_size;
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_size(node, &node_size);
  if (node_size != rpn) fail("node communicator has %d ranks, expected %d", node_size, rpn);
  int* members = malloc(sizeof(int) * (size_t)node_size);
  MPI_Allgather(&g_rank, 1, MPI_INT, members, 1, MPI_INT, node);
  int in_node = 0;
  for (int i = 0; i < node_size; ++i) {
    int r = members[i];
    if (r < 0 || r >= size || !mine[r])
      fail("rank %d shares my node communicator but is on %s", r,
           r >= 0 && r < size ? names + (size_t)r * NAME_LEN : "?");
    else ++in_node;
  }
  if (in_node != same) fail("node communicator holds %d of the %d ranks named %s", in_node, same, g_name);

  /* 2. transport across nodes */
  check_transport(size, nodes, node_rank, names);

  /* 3. node-local storage */
  if (local) check_node_local(local, size, mine, names, persisted, lost);

  /* 4. environment */
  for (int i = 0; i < n_set; ++i) {
    const char* eq = strchr(env_set[i], '=');
    char var[256];
    snprintf(var, sizeof var, "%.*s", (int)(eq - env_set[i]), env_set[i]);
    const char* val = getenv(var);
    if (!val || strcmp(val, eq + 1))
      fail("environment: %s is %s%s%s, expected \"%s\"", var, val ? "\"" : "unset", val ? val : "", val ? "\"" : "",
           eq + 1);
  }
  for (int i = 0; i < n_unset; ++i)
    if (getenv(env_unset[i]))
      fail("environment: %s is set (\"%s\"), expected unset", env_unset[i], getenv(env_unset[i]));

  /* 5. the wire between nodes */
  MPI_Barrier(MPI_COMM_WORLD);
  if (wire_mib) check_wire(rpn, wire_mib, wire_max);

  int any = g_failed, nfail = g_failed;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &nfail, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) {
    if (any) printf("cluster probe: FAILED on %d of %d ranks\n", nfail, size);
    else
      printf("cluster probe: PASS: %d nodes x %d ranks%s%s%s\n", nodes, rpn, local ? ", node-local " : "",
             local ? local : "",
             persisted ? " (persisted)"
             : lost    ? " (lost node)"
                       : "");
    fflush(stdout);
  }
  free(members);
  free(mine);
  free(names);
  MPI_Comm_free(&node);
  MPI_Finalize();
  return any ? 1 : 0;
}
