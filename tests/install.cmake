# The installed package works for a downstream CMake project and for pkg-config users.
add_test(NAME install_consumer
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/consumer/check_install.sh ${PROJECT_BINARY_DIR}
          ${CMAKE_CURRENT_SOURCE_DIR}/consumer ${MPIEXEC_EXECUTABLE} ${H5CKPT_MPIEXEC_PREFLAGS})
set_tests_properties(install_consumer PROPERTIES LABELS "install" TIMEOUT 300 RUN_SERIAL TRUE)
