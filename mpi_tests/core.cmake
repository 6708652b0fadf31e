add_library(h5ckpt_test_support STATIC support/test_model.cpp)
target_link_libraries(h5ckpt_test_support PUBLIC h5ckpt_internal MPI::MPI_CXX hdf5::hdf5)
target_include_directories(h5ckpt_test_support PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})

h5ckpt_mpi_test_binary(test_reshard test_reshard.cpp)
target_link_libraries(test_reshard PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_reshard LABELS core TIMEOUT 600)

h5ckpt_mpi_test_binary(test_errors test_errors.cpp)
target_link_libraries(test_errors PRIVATE h5ckpt_test_support)
target_include_directories(test_errors PRIVATE ${XXHASH_INCLUDE_DIR})
target_link_libraries(test_errors PRIVATE ${XXHASH_LIBRARY})
h5ckpt_add_mpi_test(test_errors LABELS core RANKS 1 2 4 TIMEOUT 300)

# Authenticated checkpoints: refused without the key, with another, tampered, forged, swapped.
h5ckpt_mpi_test_binary(test_auth test_auth.cpp)
target_link_libraries(test_auth PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_auth LABELS core RANKS 1 2 TIMEOUT 300)

h5ckpt_mpi_test_binary(test_dtypes test_dtypes.cpp)
target_link_libraries(test_dtypes PRIVATE h5ckpt_test_support hdf5::hdf5)
h5ckpt_add_mpi_test(test_dtypes LABELS core RANKS 1 2 4 8 TIMEOUT 300)
# Freshly allocated memory holds garbage (glibc's MALLOC_PERTURB_), as it may in a long-running
# job: a load that relies on fresh scratch being zero fails (PaddedVocabularyConvertsPaddingToZeros).
foreach(n 1 2 4 8)
  set_property(TEST test_dtypes_np${n} APPEND PROPERTY ENVIRONMENT "MALLOC_PERTURB_=165")
endforeach()

h5ckpt_mpi_test_binary(test_async test_async.cpp)
target_link_libraries(test_async PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_async LABELS async RANKS 1 2 4 8 TIMEOUT 300)

h5ckpt_mpi_test_binary(test_zero_redundancy test_zero_redundancy.cpp)
target_link_libraries(test_zero_redundancy PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_zero_redundancy LABELS load RANKS 1 2 4 8 TIMEOUT 300)

h5ckpt_mpi_test_binary(test_direct_io test_direct_io.cpp)
target_link_libraries(test_direct_io PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_direct_io LABELS core RANKS 1 2 3 4 TIMEOUT 300)

h5ckpt_mpi_test_binary(test_aggregated_read test_aggregated_read.cpp)
target_link_libraries(test_aggregated_read PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_aggregated_read LABELS load RANKS 1 2 3 4 8 TIMEOUT 300)

# Helper threads: pooled block checks of a load (verify_threads) and the parallel snapshot copy
# (snapshot_threads), element by element, with a flipped byte in chosen blocks.
h5ckpt_mpi_test_binary(test_helper_threads test_helper_threads.cpp)
target_link_libraries(test_helper_threads PRIVATE h5ckpt_test_support)
target_include_directories(test_helper_threads PRIVATE ${XXHASH_INCLUDE_DIR})
target_link_libraries(test_helper_threads PRIVATE ${XXHASH_LIBRARY})
h5ckpt_add_mpi_test(test_helper_threads LABELS load RANKS 1 2 4 TIMEOUT 300)

# Two-phase writes: exact bytes for any window, byte-identical files, merged runs, agreed faults.
h5ckpt_mpi_test_binary(test_aggregated_write test_aggregated_write.cpp)
target_link_libraries(test_aggregated_write PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_aggregated_write LABELS core RANKS 1 2 3 4 8 TIMEOUT 300)
