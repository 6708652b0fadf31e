# Pure load planning (requests, groups, roles, each rank's ReadItems) over every layout pair of
# the reshard test, executed on synthetic values; and the save side's WriteItems. No MPI.
h5ckpt_unit_test_binary(test_load_plan LINK h5ckpt_planner test_load_plan.cpp)
h5ckpt_add_unit_test(test_load_plan)
