# Data-loader state: walk, reshard (split/merge over DP), exactly-once, serialization.
h5ckpt_unit_test_binary(test_loader_state test_loader_state.cpp)
h5ckpt_add_unit_test(test_loader_state)
