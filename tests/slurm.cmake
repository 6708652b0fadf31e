# Slurm: a private slurmctld + three slurmd on this machine (see tests/slurm/run_slurm_test.sh).
# slurm_jobs runs the slurm/*.sbatch scripts (train, resume on another layout stopped by USR1,
# verify, bench) on a single node, after a real two-node srun on n1/n2 (two slurmd, each its own
# host name) that also runs the cluster probe across them over PMIx. slurm_two_nodes is that
# two-node check alone, needing only the probe. Exit 77 = skipped where Slurm cannot be installed
# or started; RUN_SERIAL because the nodes declare more CPUs than the machine may have.
set(_slurm_env "")
if(TARGET cluster_probe)  # tests/cluster.cmake, included before this file
  set(_slurm_env "H5CKPT_CLUSTER_PROBE=$<TARGET_FILE:cluster_probe>")
  add_test(NAME slurm_two_nodes
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/run_slurm_test.sh ${PROJECT_SOURCE_DIR})
  set_tests_properties(slurm_two_nodes PROPERTIES LABELS "slurm;cluster" SKIP_RETURN_CODE 77 TIMEOUT 300
    RUN_SERIAL TRUE ENVIRONMENT "H5CKPT_SLURM_TWO_NODES_ONLY=1;${_slurm_env}")
endif()
if(TARGET h5ckpt-train AND TARGET h5ckpt-cli)
  set(_slurm_bench "")
  if(H5CKPT_BUILD_PERF)  # perf/ is configured after tests/: name the path, the script checks it
    set(_slurm_bench ${PROJECT_BINARY_DIR}/perf/h5ckpt-bench)
  endif()
  add_test(NAME slurm_jobs
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/run_slurm_test.sh ${PROJECT_SOURCE_DIR}
            $<TARGET_FILE:h5ckpt-train> $<TARGET_FILE:h5ckpt-cli> ${_slurm_bench})
  set_tests_properties(slurm_jobs PROPERTIES LABELS slurm SKIP_RETURN_CODE 77 TIMEOUT 600 RUN_SERIAL TRUE
    ENVIRONMENT "${_slurm_env}")
endif()
