# Device buffers through the simulated device (every machine), and on a real GPU (label gpu).
h5ckpt_mpi_test_binary(test_device test_device.cpp)
target_link_libraries(test_device PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_device LABELS device RANKS 1 2 4 8 TIMEOUT 300)

if(H5CKPT_HAVE_CUDA)
  h5ckpt_mpi_test_binary(test_gpu test_gpu.cpp)
  target_link_libraries(test_gpu PRIVATE h5ckpt_test_support)
  h5ckpt_add_mpi_test(test_gpu LABELS gpu RANKS 1 2 4 TIMEOUT 300)
  foreach(n 1 2 4)
    set_tests_properties(test_gpu_np${n} PROPERTIES SKIP_REGULAR_EXPRESSION "no GPU visible")
  endforeach()
endif()
