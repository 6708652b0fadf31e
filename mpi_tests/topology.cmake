# Topology with context and expert parallelism: coordinates and communicator membership of every
# tp x cp x dp x pp x ep layout at 1..8 ranks, from sizes and from the caller's communicators.
h5ckpt_mpi_test_binary(test_topology_ep_cp test_topology_ep_cp.cpp)
h5ckpt_add_mpi_test(test_topology_ep_cp LABELS topology RANKS 1 2 3 4 5 6 7 8 TIMEOUT 300)
