# h5ckpt on xfs (tests/fs/run_xfs_test.sh): a loop-mounted xfs image holds the checkpoints of a
# resume in another layout, an O_DIRECT save, the commit-protocol and aggregated-write tests.
# Exit 77 = skipped: not root, no mkfs.xfs (scripts/setup.sh installs xfsprogs) or no loop mount.
if(TARGET h5ckpt-train AND TARGET test_commit_safety AND TARGET test_aggregated_write)
  add_test(NAME xfs_checkpoints
    COMMAND bash ${PROJECT_SOURCE_DIR}/tests/fs/run_xfs_test.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:h5ckpt-train>
            $<TARGET_FILE_DIR:test_commit_safety>
            ${MPIEXEC_EXECUTABLE} ${H5CKPT_MPIEXEC_PREFLAGS})
  set_tests_properties(xfs_checkpoints PROPERTIES
    LABELS "fs;mpi" SKIP_RETURN_CODE 77 TIMEOUT 400 PROCESSORS 4)
endif()
