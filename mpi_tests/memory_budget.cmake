# Bounded memory (memory_bytes): saves and loads under a budget smaller than one tensor.
h5ckpt_mpi_test_binary(test_memory_budget test_memory_budget.cpp)
target_link_libraries(test_memory_budget PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_memory_budget LABELS memory RANKS 1 2 4 8 TIMEOUT 600)
