# h5ckpt on a real distributed file system: a GlusterFS volume (scripts/gluster.sh, 2 bricks, one
# FUSE client per simulated node, caches at their defaults) mounted by every node of the simulated
# cluster. One CTest entry per case of tests/gluster/run_gluster_test.sh (see its header and
# docs/testing.md); each starts and stops its own volume. Exit 77 = skipped: not root, no
# /dev/fuse, GlusterFS not installed or no namespaces (scripts/setup.sh installs GlusterFS).
foreach(_case IN ITEMS resume sharded multilevel latest lock brick odirect fullbrick)
  add_test(NAME gluster_${_case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gluster/run_gluster_test.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:h5ckpt-train> $<TARGET_FILE:h5ckpt-cli>
            ${_case})
  set_tests_properties(gluster_${_case} PROPERTIES
    LABELS "gluster;cluster" SKIP_RETURN_CODE 77 TIMEOUT 420 PROCESSORS 4)
endforeach()

# The crash campaign (kill -9 of a random rank while saving every step; scripts/crash_campaign.sh)
# with its checkpoints on a volume: a few kills (about 4 minutes here).
add_test(NAME gluster_crash_campaign
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/gluster/run_gluster_campaign.sh ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
set_tests_properties(gluster_crash_campaign PROPERTIES
  LABELS "gluster;crash;slow" SKIP_RETURN_CODE 77 TIMEOUT 900 PROCESSORS 4)
