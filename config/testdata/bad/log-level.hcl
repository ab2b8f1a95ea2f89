log_level = "verbose"
