log_format = "logfmt"
