# `h5ckpt report`: rendering checked on a hand-written metrics file with a deliberate straggler
# (rank 2 in the write phase), as a unit test of src/tools/report_*.cpp (parsing, statistics, text
# and HTML); and, when the CLI is built, the subcommand end to end with an independent Python
# parse of the SVG (skipped, exit 77, while `report` is not registered in src/tools/main.cpp).
file(GLOB _report_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/tools/report_*.cpp)
h5ckpt_unit_test_binary(test_report test_report.cpp ${_report_sources})
target_link_libraries(test_report PRIVATE nlohmann_json::nlohmann_json)
target_compile_definitions(test_report PRIVATE H5CKPT_REPORT_FIXTURE="${CMAKE_CURRENT_SOURCE_DIR}/report/metrics.json")
h5ckpt_add_unit_test(test_report)

if(TARGET h5ckpt-cli)
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    add_test(NAME report_cli
      COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/report/check_report_cli.py
              $<TARGET_FILE:h5ckpt-cli> ${CMAKE_CURRENT_SOURCE_DIR}/report/metrics.json
              ${CMAKE_CURRENT_BINARY_DIR}/report_cli)
    set_tests_properties(report_cli PROPERTIES LABELS "cli;report" TIMEOUT 60 SKIP_RETURN_CODE 77)
  endif()
endif()
