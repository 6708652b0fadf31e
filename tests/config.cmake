# Configuration: TOML file keys, H5CKPT_* environment variables, precedence, error messages, and
# that config/h5ckpt.toml documents every key with its default. No MPI launch.
h5ckpt_unit_test_binary(test_config test_config.cpp)
target_link_libraries(test_config PRIVATE spdlog::spdlog)
target_compile_definitions(test_config PRIVATE H5CKPT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
h5ckpt_add_unit_test(test_config)
