# Multi-level checkpoints: node-local saves with partner copies on simulated nodes
# (H5CKPT_RANKS_PER_NODE), lost and damaged local disks, persists, retention, injected failures.
h5ckpt_mpi_test_binary(test_local_level test_local_level.cpp)
target_link_libraries(test_local_level PRIVATE h5ckpt_test_support)
foreach(case "1;0" "2;1" "4;1" "4;2" "8;2")
  list(GET case 0 n)
  list(GET case 1 rpn)
  set(_name test_local_level_np${n}_rpn${rpn})
  add_test(NAME ${_name}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 290
            $<TARGET_FILE:test_local_level>)
  set_tests_properties(${_name} PROPERTIES PROCESSORS ${n} TIMEOUT 300 LABELS "mpi;local"
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;H5CKPT_RANKS_PER_NODE=${rpn}")
endforeach()

# Block checksums of the local files: caught as served, moved aside, served from another copy
# or level; older manifests without block sums.
h5ckpt_mpi_test_binary(test_local_level_blocks test_local_level_blocks.cpp)
target_link_libraries(test_local_level_blocks PRIVATE h5ckpt_test_support)
foreach(case "1;0" "2;1" "4;2")
  list(GET case 0 n)
  list(GET case 1 rpn)
  set(_name test_local_level_blocks_np${n}_rpn${rpn})
  add_test(NAME ${_name}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 110
            $<TARGET_FILE:test_local_level_blocks>)
  set_tests_properties(${_name} PROPERTIES PROCESSORS ${n} TIMEOUT 120 LABELS "mpi;local"
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;H5CKPT_RANKS_PER_NODE=${rpn}")
endforeach()
