# End-to-end resume of h5ckpt-train under another layout (scripts/e2e_resume.sh): bit-identical
# final model and optimizer state against an uninterrupted reference, exactly-once data.
if(TARGET h5ckpt-train)
  string(JOIN " " _e2e_preflags ${H5CKPT_MPIEXEC_PREFLAGS})
  find_program(H5CKPT_H5DIFF h5diff)
  if(NOT H5CKPT_H5DIFF)
    set(H5CKPT_H5DIFF none)
  endif()
  # name | layout A (to step 6) | layout B (resumes to 12) | reference layout | max ranks | extra args
  set(_e2e_cases
    "tp_change|tp1.pp2.dp2|tp2.pp2.dp2|tp1.pp1.dp1|8|"
    "pp_change|tp1.pp4.dp1|tp1.pp3.dp1|tp2.pp1.dp2|4|"
    "dp_change|tp1.pp1.dp4|tp1.pp1.dp3|tp2.pp2.dp1|4|"
    "zero_on_to_off|tp2.pp1.dp2.zero|tp2.pp1.dp2|tp1.pp1.dp2.zero|4|"
    "zero_dp3_to_dp2|tp1.pp1.dp3.zero|tp1.pp1.dp2.zero|tp1.pp1.dp1|3|"
    "world_8_to_4|tp2.pp2.dp2.zero|tp1.pp2.dp2|tp4.pp1.dp1|8|"
    "world_4_to_8|tp1.pp1.dp4.zero|tp2.pp2.dp2.zero|tp1.pp2.dp1|8|"
    "tied_f32_padded_vocab|tp2.pp2.dp1|tp4.pp1.dp2|tp1.pp1.dp1|8|--tie-embeddings,--dtype,f32,--vocab,250"
    # Mixture of experts (layers 1 and 3 MoE, 4 experts), expert and context parallelism.
    "moe_ep2_to_ep4|tp2.pp1.dp2.ep2|tp1.pp2.dp4.ep4|tp1.pp1.dp1|8|--experts,4,--moe-every,2"
    "moe_ep4_tp2_to_ep1_tp1|tp2.pp1.dp4.ep4|tp1.pp1.dp2|tp1.pp2.dp1|8|--experts,4,--moe-every,2"
    "cp2_dp2_to_cp1_dp4|tp1.pp1.dp2.cp2.zero|tp1.pp1.dp4.zero|tp2.pp1.dp1.cp2|4|--experts,4,--moe-every,2"
    "swiglu_tp2_to_tp4|tp2.pp1.dp2.ep2|tp4.pp1.dp2.ep2|tp1.pp1.dp1|8|--swiglu,--experts,4,--moe-every,2"
    "moe_zero_ep2_dp4_to_dp6|tp1.pp1.dp4.ep2.zero|tp1.pp1.dp6.ep2.zero|tp2.pp1.dp1.zero|6|--experts,4,--moe-every,2")
  foreach(_case IN LISTS _e2e_cases)
    string(REPLACE "|" ";" _f "${_case}")
    list(GET _f 0 _name)
    list(GET _f 1 _la)
    list(GET _f 2 _lb)
    list(GET _f 3 _lr)
    list(GET _f 4 _np)
    list(SUBLIST _f 5 -1 _extra)
    string(REPLACE "," ";" _extra "${_extra}")
    set(_h5diff ${H5CKPT_H5DIFF})
    if(_name MATCHES "padded_vocab")
      set(_h5diff none)  # shapes differ (250 vs 252 rows); --compare checks common rows + zero padding
    endif()
    add_test(NAME trainer_e2e_${_name}
      COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/e2e_resume.sh $<TARGET_FILE:h5ckpt-train> ${MPIEXEC_EXECUTABLE}
              ${CMAKE_CURRENT_BINARY_DIR}/e2e/${_name} ${_la} ${_lb} ${_lr} ${_extra})
    set_tests_properties(trainer_e2e_${_name} PROPERTIES
      PROCESSORS ${_np} TIMEOUT 300 LABELS "mpi;e2e;trainer"
      ENVIRONMENT "H5CKPT_MPIEXEC_PREFLAGS=${_e2e_preflags};H5DIFF=${_h5diff};OMPI_MCA_rmaps_base_oversubscribe=1")
  endforeach()

  # A crash between the commit of step 6 and the `latest` update (the window a kill hit on
  # GlusterFS in CI): the resume starts from step 3 and re-saves step 6 over the committed copy.
  add_test(NAME trainer_e2e_crash_before_latest
    COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/e2e_resume.sh $<TARGET_FILE:h5ckpt-train> ${MPIEXEC_EXECUTABLE}
            ${CMAKE_CURRENT_BINARY_DIR}/e2e/crash_before_latest tp2.pp1.dp2.zero tp1.pp1.dp2 tp2.pp1.dp1)
  set_tests_properties(trainer_e2e_crash_before_latest PROPERTIES
    PROCESSORS 4 TIMEOUT 300 LABELS "mpi;e2e;trainer"
    ENVIRONMENT "H5CKPT_MPIEXEC_PREFLAGS=${_e2e_preflags};H5DIFF=${H5CKPT_H5DIFF};E2E_CRASH_AT=latest::2;OMPI_MCA_rmaps_base_oversubscribe=1")

  # The trained numbers against the issue's formulas, recomputed independently in Python.
  find_program(H5CKPT_H5DUMP h5dump)
  find_package(Python3 COMPONENTS Interpreter)
  if(H5CKPT_H5DUMP AND Python3_Interpreter_FOUND)
    add_test(NAME trainer_formulas
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/check_trainer_formulas.py
              $<TARGET_FILE:h5ckpt-train> ${MPIEXEC_EXECUTABLE} ${CMAKE_CURRENT_BINARY_DIR}/e2e/formulas)
    set_tests_properties(trainer_formulas PROPERTIES
      PROCESSORS 8 TIMEOUT 300 LABELS "mpi;e2e;trainer"
      ENVIRONMENT "H5CKPT_MPIEXEC_PREFLAGS=${_e2e_preflags};OMPI_MCA_rmaps_base_oversubscribe=1")
  endif()

  # The MoE tensors in the file (h5py): each expert tensor once with its global shape [E, ...] and
  # the formulas' values, with and without fused SwiGLU, TP2 x CP2 x DP2 with EP2 and ZeRO.
  set(_moe_python "")
  foreach(_py IN ITEMS ${H5CKPT_TEST_PYTHON} ${Python3_EXECUTABLE} /usr/bin/python3)
    execute_process(COMMAND ${_py} -c "import h5py" RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
    if(_rc EQUAL 0)
      set(_moe_python ${_py})
      break()
    endif()
  endforeach()
  if(_moe_python)
    add_test(NAME trainer_moe_checkpoint
      COMMAND ${_moe_python} ${CMAKE_CURRENT_SOURCE_DIR}/trainer/check_moe_checkpoint.py
              $<TARGET_FILE:h5ckpt-train> ${MPIEXEC_EXECUTABLE} ${CMAKE_CURRENT_BINARY_DIR}/e2e/moe_checkpoint)
    set_tests_properties(trainer_moe_checkpoint PROPERTIES
      PROCESSORS 8 TIMEOUT 300 LABELS "mpi;e2e;trainer"
      ENVIRONMENT "H5CKPT_MPIEXEC_PREFLAGS=${_e2e_preflags};OMPI_MCA_rmaps_base_oversubscribe=1")
  else()
    message(WARNING "no python3 with h5py (apt-get install python3-h5py): trainer_moe_checkpoint not registered")
  endif()

  # Resuming with another vocabulary size is refused (only TP padding may change a shape).
  add_test(NAME trainer_refuses_other_vocab
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/trainer/refuse_other_vocab.sh $<TARGET_FILE:h5ckpt-train>
            ${MPIEXEC_EXECUTABLE} ${CMAKE_CURRENT_BINARY_DIR}/e2e/refuse_vocab)
  set_tests_properties(trainer_refuses_other_vocab PROPERTIES
    PROCESSORS 2 TIMEOUT 200 LABELS "mpi;trainer"
    ENVIRONMENT "H5CKPT_MPIEXEC_PREFLAGS=${_e2e_preflags};OMPI_MCA_rmaps_base_oversubscribe=1")

  # The same resume on the simulated cluster (scripts/cluster.sh: separate "nodes" in their own
  # namespaces, TCP between them, node-aware coordination through real node leaders). Exit 77 =
  # skipped where the cluster cannot be hosted (not root, no namespaces).
  #   4 nodes x 4 ranks TP2.PP2.DP4 + ZeRO -> 2 nodes x 4 ranks TP4.PP1.DP2 + ZeRO
  #   64 ranks: 4 nodes x 16 TP2.PP2.DP16 + ZeRO -> 4 nodes x 16 TP4.PP4.DP4, with the nodes cut
  #   out of this machine (H5CKPT_RANKS_PER_NODE): on two cores, 64 ranks polling TCP sockets
  #   between namespaced nodes take many minutes (docs/testing.md); the leaders and tree are the same.
  add_test(NAME cluster_e2e_4x4_to_2x4
    COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/e2e_resume.sh $<TARGET_FILE:h5ckpt-train> ${MPIEXEC_EXECUTABLE}
            ${CMAKE_CURRENT_BINARY_DIR}/e2e/cluster_4x4_to_2x4 tp2.pp2.dp4.zero@4x4 tp4.pp1.dp2.zero@2x4 tp1.pp1.dp1)
  set_tests_properties(cluster_e2e_4x4_to_2x4 PROPERTIES
    PROCESSORS 8 TIMEOUT 900 LABELS "mpi;e2e;trainer;cluster" SKIP_RETURN_CODE 77
    ENVIRONMENT "H5CKPT_MPIEXEC_PREFLAGS=${_e2e_preflags};H5DIFF=${H5CKPT_H5DIFF};OMPI_MCA_rmaps_base_oversubscribe=1;E2E_TIMEOUT=300")
  add_test(NAME cluster_e2e_64_ranks
    COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/e2e_resume.sh $<TARGET_FILE:h5ckpt-train> ${MPIEXEC_EXECUTABLE}
            ${CMAKE_CURRENT_BINARY_DIR}/e2e/cluster_64 tp2.pp2.dp16.zero@4x16 tp4.pp4.dp4@4x16 tp1.pp1.dp1)
  set_tests_properties(cluster_e2e_64_ranks PROPERTIES
    PROCESSORS 8 TIMEOUT 1500 LABELS "mpi;e2e;trainer;cluster;long" SKIP_RETURN_CODE 77
    ENVIRONMENT "H5CKPT_MPIEXEC_PREFLAGS=${_e2e_preflags};H5DIFF=${H5CKPT_H5DIFF};OMPI_MCA_rmaps_base_oversubscribe=1;E2E_TIMEOUT=600;E2E_SPLIT=2;E2E_STEPS=4;E2E_NODES=split")

  # Workload pieces in-process (hash, bf16, names, ZeRO vs plain step).
  h5ckpt_mpi_test_binary(test_trainer_e2e test_trainer_e2e.cpp)
  target_link_libraries(test_trainer_e2e PRIVATE h5ckpt_workload)
  h5ckpt_add_mpi_test(test_trainer_e2e RANKS 1 3 LABELS trainer TIMEOUT 120)
endif()
