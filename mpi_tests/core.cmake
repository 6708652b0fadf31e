add_library(h5ckpt_test_support STATIC support/test_model.cpp)
target_link_libraries(h5ckpt_test_support PUBLIC h5ckpt MPI::MPI_CXX)
target_include_directories(h5ckpt_test_support PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})

h5ckpt_mpi_test_binary(test_reshard test_reshard.cpp)
target_link_libraries(test_reshard PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_reshard LABELS core TIMEOUT 600)
