# Multi-piece items (StateDict::add_pieces: fused layouts such as [gate_t; up_t]): resharding,
# format identity with ordinary shards, async saves, two-phase reads, memory budget, device items.
h5ckpt_mpi_test_binary(test_multi_piece test_multi_piece.cpp)
target_link_libraries(test_multi_piece PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_multi_piece LABELS core RANKS 1 2 4 8 TIMEOUT 300)
