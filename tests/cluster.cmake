# A simulated cluster on this one machine (scripts/cluster.sh: N "nodes" x R ranks, each node in
# its own UTS + mount namespace with a private node-local directory, TCP between nodes), checked
# by a plain MPI C probe on 2 x 2 and 4 x 2: node names and communicators, transport, node-local
# files private to their node, persisting across jobs, and a node that lost its disk; see
# tests/cluster/run_cluster_test.sh and docs/testing.md. Exit 77 = skipped (not root, or no
# namespaces). The probe links MPI only, not h5ckpt.
add_executable(cluster_probe ${CMAKE_CURRENT_SOURCE_DIR}/cluster/cluster_probe.c)
target_link_libraries(cluster_probe PRIVATE MPI::MPI_C)

foreach(_shape IN ITEMS "2;2" "4;2")
  list(GET _shape 0 _nodes)
  list(GET _shape 1 _rpn)
  math(EXPR _ranks "${_nodes} * ${_rpn}")
  add_test(NAME cluster_${_nodes}x${_rpn}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster/run_cluster_test.sh ${PROJECT_SOURCE_DIR}
            $<TARGET_FILE:cluster_probe> ${_nodes} ${_rpn})
  # Each cluster.sh run has --timeout 60; five runs per test.
  set_tests_properties(cluster_${_nodes}x${_rpn} PROPERTIES
    LABELS cluster SKIP_RETURN_CODE 77 TIMEOUT 300 PROCESSORS ${_ranks})
endforeach()
