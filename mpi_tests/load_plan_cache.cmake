# The load plan cache: a load whose every rank's plan is cached skips the index (read, validation,
# node-shared copy); one node, and simulated nodes (H5CKPT_RANKS_PER_NODE) where each node gets a copy.
h5ckpt_mpi_test_binary(test_load_plan_cache test_load_plan_cache.cpp)
target_link_libraries(test_load_plan_cache PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_load_plan_cache LABELS core RANKS 2 4 TIMEOUT 120)
foreach(np_rpn 4_1 3_2)
  string(REPLACE "_" ";" _pr ${np_rpn})
  list(GET _pr 0 n)
  list(GET _pr 1 rpn)
  add_test(NAME test_load_plan_cache_np${n}_rpn${rpn}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 110
            $<TARGET_FILE:test_load_plan_cache>)
  set_tests_properties(test_load_plan_cache_np${n}_rpn${rpn} PROPERTIES PROCESSORS ${n} TIMEOUT 120
    LABELS "mpi;nodes" ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;H5CKPT_RANKS_PER_NODE=${rpn}")
endforeach()
