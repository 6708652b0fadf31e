# Live state between ranks without storage (StateTransfer): every layout pair, deltas, a block
# corrupted in flight, memory bound, load rules; and a rank stopped in a transfer.
h5ckpt_mpi_test_binary(test_transfer test_transfer.cpp)
target_link_libraries(test_transfer PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_transfer LABELS transfer RANKS 1 2 3 4 8 TIMEOUT 300)

# A rank SIGSTOPped while versions are published: the job must end within timeout (5 s) + 10 s,
# naming the transfer phase and the stopped rank (a source and a destination rank).
add_executable(transfer_probe test_transfer_probe.cpp)
target_link_libraries(transfer_probe PRIVATE h5ckpt_internal MPI::MPI_CXX)
foreach(stop 0 3)
  set(name test_transfer_sigstop_rank${stop}_np4)
  add_test(NAME ${name}
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/transfer/sigstop_transfer.sh $<TARGET_FILE:transfer_probe>
            ${CMAKE_CURRENT_BINARY_DIR}/transfer_sigstop${stop} 4 ${stop} ${MPIEXEC_EXECUTABLE} ${H5CKPT_MPIEXEC_PREFLAGS})
  set_tests_properties(${name} PROPERTIES PROCESSORS 4 TIMEOUT 120 LABELS "mpi;timeout;transfer"
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
endforeach()

# The C API of transfers, as a C99 program linked like a C trainer.
add_executable(test_transfer_capi ${CMAKE_CURRENT_SOURCE_DIR}/test_transfer_capi.c)
set_target_properties(test_transfer_capi PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
target_compile_options(test_transfer_capi PRIVATE -Wall -Wextra -pedantic-errors)
target_link_libraries(test_transfer_capi PRIVATE h5ckpt MPI::MPI_C)
h5ckpt_add_mpi_test(test_transfer_capi RANKS 1 2 4 LABELS capi transfer TIMEOUT 120)

# Device buffers in transfers: through the simulated device everywhere, and on a real GPU (label gpu).
h5ckpt_mpi_test_binary(test_transfer_device test_transfer_device.cpp)
target_link_libraries(test_transfer_device PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_transfer_device LABELS transfer device RANKS 1 2 4 TIMEOUT 300)
if(H5CKPT_HAVE_CUDA)
  h5ckpt_mpi_test_binary(test_transfer_gpu test_transfer_device.cpp)
  target_compile_definitions(test_transfer_gpu PRIVATE H5CKPT_TRANSFER_ON_GPU)
  target_link_libraries(test_transfer_gpu PRIVATE h5ckpt_test_support)
  h5ckpt_add_mpi_test(test_transfer_gpu LABELS gpu transfer RANKS 1 2 4 TIMEOUT 300)
  foreach(n 1 2 4)
    set_tests_properties(test_transfer_gpu_np${n} PROPERTIES SKIP_REGULAR_EXPRESSION "no GPU visible")
  endforeach()
endif()
