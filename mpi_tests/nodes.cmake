# The node tree (node leaders between the ranks and the coordinator): its collectives, and the
# reshard and zero-redundancy suites with simulated nodes (H5CKPT_RANKS_PER_NODE).
h5ckpt_mpi_test_binary(test_node_tree test_node_tree.cpp)
h5ckpt_add_mpi_test(test_node_tree LABELS nodes RANKS 1 2 3 4 8)
foreach(rpn 1 2 3)
  foreach(n 4 8)
    add_test(NAME test_node_tree_np${n}_rpn${rpn}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 290
              $<TARGET_FILE:test_node_tree>)
    set_tests_properties(test_node_tree_np${n}_rpn${rpn} PROPERTIES PROCESSORS ${n} TIMEOUT 300
      LABELS "mpi;nodes" ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;H5CKPT_RANKS_PER_NODE=${rpn}")
  endforeach()
endforeach()
foreach(t test_reshard test_zero_redundancy)
  add_test(NAME ${t}_np8_rpn3
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 8 ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 590 $<TARGET_FILE:${t}>)
  set_tests_properties(${t}_np8_rpn3 PROPERTIES PROCESSORS 8 TIMEOUT 600
    LABELS "mpi;nodes" ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;H5CKPT_RANKS_PER_NODE=3")
endforeach()
