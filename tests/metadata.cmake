# Format-v1 metadata: serialization, self-checksum and validation of malformed variants
# (storage/meta_v1.h). No MPI launch.
h5ckpt_unit_test_binary(test_metadata test_metadata.cpp)
target_link_libraries(test_metadata PRIVATE nlohmann_json::nlohmann_json)
h5ckpt_add_unit_test(test_metadata)
