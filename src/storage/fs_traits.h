// What h5ckpt asks of the file system under a path: whether its clients cache what other clients
// changed, and whether it is reached over a network (which sets how many reads a load keeps in
// flight). Recognized by statfs's file system type.
#pragma once

#include <string>

namespace h5ckpt::storage {

/// Whether the file system holding `path` lets each client cache names and attributes for a while
/// without asking the server (FUSE: GlusterFS, BeeGFS's and CephFS's FUSE clients; NFS; SMB). There
/// a client may, for up to its timeout (1 s by default on GlusterFS), still see a name's previous
/// file or a file's previous size after another client changed it.
bool names_cached_per_client(const std::string& path);

/// Whether `path` is on a file system reached over a network: the above, Lustre, GPFS, BeeGFS and
/// the kernel CephFS client. Each read there waits for a round trip to a server.
bool network_file_system(const std::string& path);

/// How long a reader on a names_cached_per_client file system waits for its client's caches to
/// catch up with what another client committed, and how often it looks again: beyond GlusterFS's
/// default timeouts.
constexpr int kClientCacheWaitMs = 3000;
constexpr int kClientCacheStepMs = 50;

/// Reader threads of a load when CheckpointerOptions::io_threads is 0: 2 on a network file system
/// (one thread's reads leave the servers idle between round trips), 1 on a local one.
int default_io_threads(const std::string& path);

}  // namespace h5ckpt::storage
