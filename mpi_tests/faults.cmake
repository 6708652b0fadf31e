# Injected storage faults (H5CKPT_FAULT) in save, async save and load; and a real full disk.
h5ckpt_mpi_test_binary(test_faults test_faults.cpp)
target_link_libraries(test_faults PRIVATE h5ckpt_test_support)
h5ckpt_add_mpi_test(test_faults LABELS faults RANKS 1 2 4 TIMEOUT 300 ARGS --gtest_filter=-*FullDisk.*)

# FullDisk.*: an 8 MiB tmpfs mounted in a private mount namespace (root only; exit 77 = skipped),
# through direct writes and through HDF5's MPI-IO path (which preallocates the file too, so a full
# disk fails before any H5Dwrite: an ENOSPC inside H5Dwrite on some ranks used to leave the
# ranks' HDF5 metadata caches disagreeing and the collective close hung).
foreach(n 1 2 4)
  foreach(variant direct mpiio)
    set(_name test_faults_full_disk_${variant}_np${n})
    add_test(NAME ${_name}
      COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/faults/full_disk.sh
              ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${H5CKPT_MPIEXEC_PREFLAGS} --timeout 110
              $<TARGET_FILE:test_faults> --gtest_filter=*FullDisk.*/${variant}*)
    set_tests_properties(${_name} PROPERTIES
      PROCESSORS ${n} TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS "mpi;faults"
      ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
  endforeach()
endforeach()

# A rank stopped (job ends by the deadline) or killed inside an aggregated write's exchange: nothing
# is committed, the last checkpoint verifies and the trainer resumes from it (faults/*.sh).
if(TARGET h5ckpt-train)
  foreach(mode stop kill)
    add_test(NAME test_faults_rank_lost_in_exchange_${mode}_np4
      COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/faults/rank_lost_in_exchange.sh $<TARGET_FILE:h5ckpt-train>
              $<TARGET_FILE:h5ckpt-cli> ${CMAKE_CURRENT_BINARY_DIR}/lost_in_exchange_${mode} ${mode} 1
              ${MPIEXEC_EXECUTABLE} ${H5CKPT_MPIEXEC_PREFLAGS})
    set_tests_properties(test_faults_rank_lost_in_exchange_${mode}_np4 PROPERTIES
      PROCESSORS 4 TIMEOUT 180 LABELS "mpi;faults;timeout")
  endforeach()
endif()
