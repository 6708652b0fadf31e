# The engine's message formats (src/engine/wire.*): round trips and bounded decoders.
h5ckpt_unit_test_binary(test_wire test_wire.cpp)
h5ckpt_add_unit_test(test_wire)
