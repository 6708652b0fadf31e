# The load contract (one error naming every problem, strictness modes, check_only) and a save
# that creates the directories above it.
h5ckpt_mpi_test_binary(test_load_contract test_load_contract.cpp)
target_link_libraries(test_load_contract PRIVATE h5ckpt_test_support)
target_include_directories(test_load_contract PRIVATE ${XXHASH_INCLUDE_DIR})
target_link_libraries(test_load_contract PRIVATE ${XXHASH_LIBRARY})
h5ckpt_add_mpi_test(test_load_contract LABELS core RANKS 1 2 3 4 TIMEOUT 120)
