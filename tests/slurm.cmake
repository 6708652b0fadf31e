# Slurm: a private single-node slurmctld + slurmd runs the slurm/*.sbatch scripts (train, resume
# on another layout stopped by USR1, verify, bench). Exit 77 = skipped where Slurm cannot be
# installed or started; RUN_SERIAL because it declares 8 CPUs on whatever the machine has.
if(TARGET h5ckpt-train AND TARGET h5ckpt-cli)
  set(_slurm_bench "")
  if(H5CKPT_BUILD_PERF)  # perf/ is configured after tests/: name the path, the script checks it
    set(_slurm_bench ${PROJECT_BINARY_DIR}/perf/h5ckpt-bench)
  endif()
  add_test(NAME slurm_jobs
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/run_slurm_test.sh ${PROJECT_SOURCE_DIR}
            $<TARGET_FILE:h5ckpt-train> $<TARGET_FILE:h5ckpt-cli> ${_slurm_bench})
  set_tests_properties(slurm_jobs PROPERTIES LABELS slurm SKIP_RETURN_CODE 77 TIMEOUT 600 RUN_SERIAL TRUE)
endif()
