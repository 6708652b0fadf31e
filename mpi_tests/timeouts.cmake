# Bounded waits (comm/deadline.h). Chunked byte collectives run as a googletest at 1-8 ranks; the
# timeouts themselves end the job with MPI_Abort, so shell drivers run them and check the exit
# code, the time to the end and the message.
h5ckpt_mpi_test_binary(test_timeouts_chunks test_timeouts_chunks.cpp)
target_link_libraries(test_timeouts_chunks PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_timeouts_chunks LABELS timeout RANKS 1 2 3 4 8 TIMEOUT 300)

add_executable(timeout_probe test_timeouts_probe.cpp)
target_link_libraries(timeout_probe PRIVATE h5ckpt_internal MPI::MPI_CXX)
target_include_directories(timeout_probe PRIVATE ${PROJECT_SOURCE_DIR}/src)

set(_timeouts_dir ${CMAKE_CURRENT_SOURCE_DIR}/timeouts)

# One rank never arrives at OP; with timeout_s=2 the others must abort within 2 + 10 s, naming the
# operation, the phase and the missing rank.
function(h5ckpt_timeout_abort_test op ranks late phase what)
  set(name test_timeouts_abort_${op}_np${ranks})
  add_test(NAME ${name}
    COMMAND ${_timeouts_dir}/expect_abort.sh 12
            "timeout in ${phase}: ${what}.* after 2\\.[0-9] s \\(timeout_s=2\\)"
            "did not arrive: ${late}[^0-9,]"
            -- ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 60
            $<TARGET_FILE:timeout_probe> wait ${op} ${late} 2)
  set_tests_properties(${name} PROPERTIES PROCESSORS ${ranks} TIMEOUT 120 LABELS "mpi;timeout"
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
endfunction()
h5ckpt_timeout_abort_test(agree 4 2 "save/write" "agreement")
h5ckpt_timeout_abort_test(agree 2 0 "save/write" "agreement")
h5ckpt_timeout_abort_test(gather 3 1 "save/commit" "gather")
h5ckpt_timeout_abort_test(scatter 3 0 "load/plan" "scatter")
h5ckpt_timeout_abort_test(bcast 4 0 "save/prepare" "broadcast")
h5ckpt_timeout_abort_test(barrier 2 1 "save_async/start" "barrier")
h5ckpt_timeout_abort_test(transport 2 1 "load/read" "transfers")
h5ckpt_timeout_abort_test(blocking 3 2 "save/write" "blocking collective")

# A rank SIGSTOPped in the write phase of a save, with H5CKPT_TIMEOUT_S=5: the job must end within
# 15 s with the message, and the checkpoint `latest` names must verify and load. Synchronous and
# asynchronous saves (the background writer's phases); "local": the same with node-local
# checkpoints persisted every save (2 simulated nodes of 2 ranks, one partner copy), where the stop
# lands in a local write, a partner copy or a persist, and the load goes through the local level.
foreach(kind save local)
  set(_env "OMPI_MCA_rmaps_base_oversubscribe=1")
  set(_labels "mpi;timeout")
  foreach(async 0 1)
    if(kind STREQUAL "local")
      set(_env "OMPI_MCA_rmaps_base_oversubscribe=1;H5CKPT_RANKS_PER_NODE=2;H5CKPT_PERSIST_EVERY=1;H5CKPT_LOCAL_DIR=${CMAKE_CURRENT_BINARY_DIR}/sigstop_local_disks${async}/node{node};SIGSTOP_PHASE_RE=save(_async|_local)?/[a-z_]+")
      set(_labels "mpi;timeout;local")
      set(_work sigstop_local_async${async})
    else()
      set(_work sigstop_async${async})
    endif()
    set(name test_timeouts_sigstop_${kind}_async${async}_np4)
    add_test(NAME ${name}
      COMMAND ${_timeouts_dir}/sigstop_save.sh $<TARGET_FILE:timeout_probe> $<TARGET_FILE:h5ckpt-cli>
              ${CMAKE_CURRENT_BINARY_DIR}/${_work} 4 1 ${async} ${MPIEXEC_EXECUTABLE} ${H5CKPT_MPIEXEC_PREFLAGS})
    set_tests_properties(${name} PROPERTIES PROCESSORS 4 TIMEOUT 240 LABELS "${_labels}" ENVIRONMENT "${_env}")
  endforeach()
endforeach()
