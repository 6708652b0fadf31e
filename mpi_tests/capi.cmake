# The C API test: a C99 program with its own main (no gtest), linked like a C trainer would.
add_executable(test_capi ${CMAKE_CURRENT_SOURCE_DIR}/test_capi.c)
set_target_properties(test_capi PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
# -pedantic-errors: the public C header must stay valid C99.
target_compile_options(test_capi PRIVATE -Wall -Wextra -pedantic-errors)
target_link_libraries(test_capi PRIVATE h5ckpt MPI::MPI_C)
h5ckpt_add_mpi_test(test_capi RANKS 1 2 4 LABELS capi TIMEOUT 120)
