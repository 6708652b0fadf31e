# Multi-level checkpoints end to end (scripts/e2e_multilevel.sh): the trainer on 4 nodes x 2 ranks
# saves locally every step with partner copies and persists every 4th; lost local disks, a lost
# node pair, another layout, and kill -9 of a rank in a local save, a commit and a persist must all
# end bit-identical to an uninterrupted run with every sample consumed once.
#   cluster_multilevel_levels: the namespaced cluster (private disks per node, TCP between nodes)
#   multilevel_kills: nodes cut out of this machine (H5CKPT_RANKS_PER_NODE, {node} directories)
if(TARGET h5ckpt-train)
  string(JOIN " " _ml_preflags ${H5CKPT_MPIEXEC_PREFLAGS})
  add_test(NAME cluster_multilevel_levels
    COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/e2e_multilevel.sh $<TARGET_FILE:h5ckpt-train> ${MPIEXEC_EXECUTABLE}
            ${CMAKE_CURRENT_BINARY_DIR}/e2e/multilevel_levels levels)
  set_tests_properties(cluster_multilevel_levels PROPERTIES
    PROCESSORS 8 TIMEOUT 900 LABELS "mpi;e2e;trainer;cluster;local" SKIP_RETURN_CODE 77
    ENVIRONMENT "H5CKPT_MPIEXEC_PREFLAGS=${_ml_preflags};OMPI_MCA_rmaps_base_oversubscribe=1;E2E_TIMEOUT=300")
  foreach(what levels kills moe)
    add_test(NAME multilevel_${what}_split
      COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/e2e_multilevel.sh $<TARGET_FILE:h5ckpt-train> ${MPIEXEC_EXECUTABLE}
              ${CMAKE_CURRENT_BINARY_DIR}/e2e/multilevel_${what}_split ${what})
    set_tests_properties(multilevel_${what}_split PROPERTIES
      PROCESSORS 8 TIMEOUT 600 LABELS "mpi;e2e;trainer;local"
      ENVIRONMENT "H5CKPT_MPIEXEC_PREFLAGS=${_ml_preflags};OMPI_MCA_rmaps_base_oversubscribe=1;E2E_NODES=split")
  endforeach()
endif()
