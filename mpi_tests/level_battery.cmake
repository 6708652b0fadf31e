# The shared test battery against every storage level (shared; node-local with partner copies;
# node-local after a lost node's disk): layout pairs, an injected write error, the memory budget,
# a multi-piece item, dtype conversion. Simulated nodes (H5CKPT_RANKS_PER_NODE): 2 at 2 and 4
# ranks, 4 at 8 ranks.
h5ckpt_mpi_test_binary(test_level_battery test_level_battery.cpp)
target_link_libraries(test_level_battery PRIVATE h5ckpt_test_support)
foreach(case "2;1" "4;2" "8;2")
  list(GET case 0 n)
  list(GET case 1 rpn)
  set(_name test_level_battery_np${n})
  add_test(NAME ${_name}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 170
            $<TARGET_FILE:test_level_battery>)
  set_tests_properties(${_name} PROPERTIES PROCESSORS ${n} TIMEOUT 180 LABELS "mpi;local;battery"
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;H5CKPT_RANKS_PER_NODE=${rpn}")
endforeach()
