# Pure planner: box math, save planning (incl. a 10,000-rank simulated
# job). Metadata parsing is tested in test_metadata. No MPI launch.
h5ckpt_unit_test_binary(test_planner LINK h5ckpt_planner test_planner.cpp)
target_link_libraries(test_planner PRIVATE nlohmann_json::nlohmann_json)
h5ckpt_add_unit_test(test_planner)
